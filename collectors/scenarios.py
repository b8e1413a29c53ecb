"""Simulated fleets: which nodes exist and what runs on them, with the ground truth of what is misplaced.

* ``demo``: a fixed, small fleet with three planted misplacements (25 %-busy inference on H100s, 4-GPU
  training on L4s without NVLink, an idle allocation on A100s) among well-placed work.
* ``mixed``: a heterogeneous fleet in which about a fifth of the workloads are misplaced.
* ``well-placed``: a heterogeneous fleet with nothing worth moving.
* ``training-heavy`` / ``inference-heavy``: mostly one kind of work, a few misplaced.
* ``hard``: the cases that look alike — training with long data-loader stalls, online inference at peak load,
  batch inference on H100s — besides the usual.

Levels, noise, checkpoint periods, diurnal phases and stalls are drawn per seed, so two seeds give two fleets.
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from collectors.profiles import PROFILES
from collectors.simulated import Pattern, SimulatedNode, WorkloadSpec

SCENARIOS = ("demo", "mixed", "well-placed", "training-heavy", "inference-heavy", "hard")
PEAK_PHASE = math.pi / 2  # sin() at its maximum: online inference starts at its daily peak


@dataclass(frozen=True, slots=True)
class Job:
    """A workload template; ``params`` override WorkloadSpec fields after the per-seed draws."""

    pattern: Pattern
    gpus: int
    name: str
    hint: str
    level: float | None = None  # None: drawn per seed within the pattern's range
    misplaced: bool = False
    multi_node: bool = False
    params: dict[str, object] = field(default_factory=dict)


def training(gpus: int, name: str, misplaced: bool = False, **params: object) -> Job:
    return Job(Pattern.TRAINING, gpus, name, "torchrun", None, misplaced, params=params)


def fine_tuning(gpus: int, name: str) -> Job:
    return Job(Pattern.FINE_TUNING, gpus, name, "python3")


def inference(gpus: int, name: str, level: float | None = None, misplaced: bool = False, **params: object) -> Job:
    return Job(Pattern.INFERENCE, gpus, name, "vllm", level, misplaced, params=params)


def batch(gpus: int, name: str, misplaced: bool = False) -> Job:
    return Job(Pattern.BATCH_INFERENCE, gpus, name, "python3", misplaced=misplaced)


def idle(gpus: int, name: str) -> Job:
    return Job(Pattern.IDLE, gpus, name, "python3", misplaced=True)


def notebook(gpus: int, name: str) -> Job:
    return Job(Pattern.INTERACTIVE, gpus, name, "jupyter-lab")


Layout = list[tuple[str, list[Job]]]

# The demo's first eight nodes, then well-placed filler.
_DEMO: Layout = [
    ("h100", [training(8, "llm-pretrain")]),
    ("h100", [inference(8, "chat-serving", level=0.25, misplaced=True)]),
    ("h100", []),
    ("l40s", [inference(4, "embeddings-api", level=0.45)]),
    ("l40s", []),
    ("l4", [training(4, "vision-finetune-ddp", misplaced=True), inference(4, "ocr-api", level=0.5)]),
    ("l4", [inference(8, "asr-api", level=0.5)]),
    ("a100", [idle(4, "forgotten-notebook-alloc")]),
]
_WELL_PLACED: Layout = [
    ("l40s", [batch(8, "nightly-batch-scoring")]),
    ("h100", [training(8, "llm-sft")]),
    ("l4", [inference(8, "rerank-api", level=0.5)]),
    ("l40s", [inference(8, "image-gen-api", level=0.45)]),
    ("h200", [training(8, "moe-pretrain")]),
    ("l40s", [fine_tuning(1, "lora-finetune"), notebook(1, "research-notebook"), inference(6, "tts-api", level=0.4)]),
]
_TRAINING: Layout = [("h100", [training(8, "pretrain")]), ("h200", [training(8, "pretrain-large")])]
_INFERENCE: Layout = [("l4", [inference(8, "serving", level=0.5)]), ("l40s", [inference(8, "serving", level=0.45)])]
_MISPLACED: Layout = [
    ("h100", [inference(8, "chat-serving", misplaced=True)]),
    ("l4", [training(4, "finetune-ddp", misplaced=True)]),
    ("a100", [idle(4, "idle-alloc")]),
]
_HARD: Layout = [
    ("h100", [training(8, "stalling-pretrain", stall_rate=0.01, stall_seconds=(20.0, 60.0))]),
    ("l40s", [inference(8, "peak-serving", level=0.6, burst_sigma=0.15)]),
    ("h100", [batch(8, "batch-on-h100", misplaced=True)]),
]
_SPARE: Layout = [("l40s", []), ("h100", []), ("l40s", [])]  # capacity misplaced work can move to


def _layout(scenario: str, nodes: int, rng: random.Random) -> Layout:
    def pick(templates: Layout, k: int) -> Layout:
        return [templates[rng.randrange(len(templates))] for _ in range(k)]

    if scenario == "demo":
        if nodes < len(_DEMO):
            raise ValueError(f"the demo fleet needs at least {len(_DEMO)} nodes")
        return _DEMO + [_WELL_PLACED[i % 4] for i in range(nodes - len(_DEMO))]
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
    if nodes < 1:
        raise ValueError("a fleet needs at least one node")
    if scenario == "well-placed":
        return pick(_WELL_PLACED, nodes)
    base = {
        "mixed": _WELL_PLACED,
        "training-heavy": _TRAINING + _WELL_PLACED[:1],
        "inference-heavy": _INFERENCE + _WELL_PLACED[:1],
        "hard": _WELL_PLACED,
    }[scenario]
    layout = pick(base, nodes)
    planted = _HARD if scenario == "hard" else _MISPLACED
    share = 3 if scenario == "hard" else 5  # a third of the nodes are hard cases; a fifth misplaced otherwise
    for i in rng.sample(range(nodes), k=max(1, nodes // share)):
        layout[i] = planted[rng.randrange(len(planted))]
    return layout + _SPARE[: max(1, nodes // 10)]


def _spec(job: Job, gpus: tuple[int, ...], scenario: str, rng: random.Random) -> WorkloadSpec:
    ranges = {
        Pattern.TRAINING: (0.86, 0.94),
        Pattern.FINE_TUNING: (0.78, 0.9),
        Pattern.INFERENCE: (0.15, 0.38),
        Pattern.BATCH_INFERENCE: (0.8, 0.92),
        Pattern.INTERACTIVE: (0.5, 0.5),
        Pattern.IDLE: (0.0, 0.0),
    }
    level = job.level if job.level is not None else rng.uniform(*ranges[job.pattern])
    demo = scenario == "demo"
    spec = WorkloadSpec(
        id=f"k8s/{uuid.UUID(int=rng.getrandbits(128), version=4)}",
        name=job.name,
        pattern=job.pattern,
        gpus=gpus,
        hint=job.hint,
        level=level,
        mem_fraction=_mem_fraction(job.pattern, demo, rng),
        multi_node=job.multi_node,
        checkpoint_period_s=120.0 if demo else rng.choice((300.0, 600.0, 900.0)),
        diurnal_phase=PEAK_PHASE if demo else rng.uniform(0, 2 * math.pi),
        burst_sigma=0.3 if demo else rng.uniform(0.25, 0.4),
        noise=1.5 if demo else rng.uniform(1.0, 2.5),
    )
    return replace(spec, **job.params) if job.params else spec  # type: ignore[arg-type]


def _mem_fraction(pattern: Pattern, demo: bool, rng: random.Random) -> float:
    fixed = {Pattern.TRAINING: 0.9, Pattern.IDLE: 0.3, Pattern.BATCH_INFERENCE: 0.6}
    if pattern in fixed:
        return fixed[pattern]
    # demo serving models leave room for a full KV cache on an L40S, so the demo reads the same every run
    return 0.35 if demo else rng.uniform(0.3, 0.5)


@dataclass(frozen=True, slots=True)
class ScenarioNode:
    name: str
    profile: str
    workloads: tuple[WorkloadSpec, ...]
    misplaced: frozenset[str]


def build_scenario(scenario: str, nodes: int, seed: int = 0) -> list[ScenarioNode]:
    """The nodes of ``scenario``; names and parameters are reproducible for a given seed."""
    rng = random.Random(f"{scenario}:{seed}")
    out = []
    counts: dict[str, int] = {}
    for profile, jobs in _layout(scenario, nodes, rng):
        counts[profile] = counts.get(profile, 0) + 1
        next_gpu = 0
        specs = []
        for job in jobs:
            specs.append(_spec(job, tuple(range(next_gpu, next_gpu + job.gpus)), scenario, rng))
            next_gpu += job.gpus
        misplaced = frozenset(s.id for s, j in zip(specs, jobs, strict=True) if j.misplaced)
        out.append(ScenarioNode(f"{profile}-{counts[profile]:03d}", profile, tuple(specs), misplaced))
    return out


def simulated_node(node: ScenarioNode, clock: Callable[[], float], seed: int = 0) -> SimulatedNode:
    return SimulatedNode(node.name, PROFILES[node.profile], list(node.workloads), clock, seed)
