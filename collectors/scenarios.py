"""Simulated fleets: which nodes exist and what runs on them, with the ground truth of what is misplaced.

* ``demo``: a fixed, small fleet with three planted misplacements (25 %-busy inference on H100s, 4-GPU
  training on L4s without NVLink, an idle allocation on A100s) among well-placed work.
* ``mixed``: a randomised heterogeneous fleet in which about a fifth of the workloads are misplaced.
* ``well-placed``: the same fleet with nothing worth moving.
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from collectors.profiles import PROFILES
from collectors.simulated import Pattern, SimulatedNode, WorkloadSpec

SCENARIOS = ("demo", "mixed", "well-placed")
PEAK_PHASE = math.pi / 2  # start online inference at its daily peak


@dataclass(frozen=True, slots=True)
class _Job:
    pattern: Pattern
    gpus: int
    level: float
    mem_fraction: float
    hint: str
    name: str
    misplaced: bool = False


def _training(gpus: int, name: str, misplaced: bool = False) -> _Job:
    return _Job(Pattern.TRAINING, gpus, 0.9, 0.9, "torchrun", name, misplaced)


def _inference(gpus: int, level: float, name: str, misplaced: bool = False) -> _Job:
    return _Job(Pattern.INFERENCE, gpus, level, 0.45, "vllm", name, misplaced)


def _batch(gpus: int, name: str) -> _Job:
    return _Job(Pattern.BATCH_INFERENCE, gpus, 0.85, 0.6, "python3", name)


def _idle(gpus: int, name: str, misplaced: bool = True) -> _Job:
    return _Job(Pattern.IDLE, gpus, 0.0, 0.3, "python3", name, misplaced)


# (profile, jobs) for the demo's first eight nodes, then well-placed filler.
_DEMO: list[tuple[str, list[_Job]]] = [
    ("h100", [_training(8, "llm-pretrain")]),
    ("h100", [_inference(8, 0.25, "chat-serving", misplaced=True)]),
    ("h100", []),
    ("l40s", [_inference(4, 0.45, "embeddings-api")]),
    ("l40s", []),
    ("l4", [_training(4, "vision-finetune-ddp", misplaced=True), _inference(4, 0.5, "ocr-api")]),
    ("l4", [_inference(8, 0.5, "asr-api")]),
    ("a100", [_idle(4, "forgotten-notebook-alloc")]),
]
_FILLER: list[tuple[str, list[_Job]]] = [
    ("l40s", [_batch(8, "nightly-batch-scoring")]),
    ("h100", [_training(8, "llm-sft")]),
    ("l4", [_inference(8, 0.5, "rerank-api")]),
    ("l40s", [_inference(8, 0.45, "image-gen-api")]),
]


@dataclass(frozen=True, slots=True)
class ScenarioNode:
    name: str
    profile: str
    workloads: tuple[WorkloadSpec, ...]
    misplaced: frozenset[str]


def _layout(scenario: str, nodes: int, rng: random.Random) -> list[tuple[str, list[_Job]]]:
    if scenario == "demo":
        if nodes < len(_DEMO):
            raise ValueError(f"the demo fleet needs at least {len(_DEMO)} nodes")
        return _DEMO + [_FILLER[i % len(_FILLER)] for i in range(nodes - len(_DEMO))]
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
    layout = [_FILLER[rng.randrange(len(_FILLER))] for _ in range(nodes)]
    if scenario == "mixed":
        misplaced = [
            ("h100", [_inference(8, rng.uniform(0.15, 0.3), "chat-serving", misplaced=True)]),
            ("l4", [_training(4, "finetune-ddp", misplaced=True)]),
            ("a100", [_idle(rng.choice((2, 4, 8)), "idle-alloc")]),
        ]
        for i in rng.sample(range(nodes), k=max(1, nodes // 5)):
            layout[i] = misplaced[rng.randrange(len(misplaced))]
        layout += [("l40s", []), ("h100", [])]  # spare capacity the misplaced work can move to
    return layout


def build_scenario(scenario: str, nodes: int, seed: int = 0) -> list[ScenarioNode]:
    """The nodes of ``scenario``; names and parameters are reproducible for a given seed."""
    rng = random.Random(f"{scenario}:{seed}")
    out = []
    counts: dict[str, int] = {}
    for profile, jobs in _layout(scenario, nodes, rng):
        counts[profile] = counts.get(profile, 0) + 1
        name = f"{profile}-{counts[profile]:03d}"
        specs = []
        next_gpu = 0
        for job in jobs:
            gpus = tuple(range(next_gpu, next_gpu + job.gpus))
            next_gpu += job.gpus
            specs.append(
                WorkloadSpec(
                    id=f"k8s/{uuid.UUID(int=rng.getrandbits(128), version=4)}",
                    name=job.name,
                    pattern=job.pattern,
                    gpus=gpus,
                    hint=job.hint,
                    level=job.level,
                    mem_fraction=job.mem_fraction,
                    checkpoint_period_s=120.0 if scenario == "demo" else 600.0,
                    diurnal_phase=PEAK_PHASE if scenario == "demo" else rng.uniform(0, 2 * math.pi),
                )
            )
        misplaced = frozenset(s.id for s, j in zip(specs, jobs, strict=True) if j.misplaced)
        out.append(ScenarioNode(name, profile, tuple(specs), misplaced))
    return out


def simulated_node(node: ScenarioNode, clock: Callable[[], float], seed: int = 0) -> SimulatedNode:
    return SimulatedNode(node.name, PROFILES[node.profile], list(node.workloads), clock, seed)
