"""Simulated fleets: which nodes exist and what runs on them, with the ground truth of what is misplaced.

* ``demo``: a fixed, small fleet with three planted misplacements (25 %-busy inference on H100s, 4-GPU
  training on L4s without NVLink, an idle allocation on A100s) among well-placed work; from the eleventh node on,
  a speech service holding twice the L40S GPUs its daily peak needs, 8-GPU training on L40S cards and two small
  services on an H100 node that belong on L40S cards: the training's H100s are free only once they have left.
  One of each rest-of-node problem (``rest_of_node``): the H100 pretraining saving its checkpoints synchronously,
  the H100 fine-tuning (tenth node) starved by its CPU-bound data loader, the translation service's replicas
  reading 68 GB of weights from object storage, and the OCR service beside the L4 training that exchanges
  gradients over their shared PCIe.
* ``mixed``: a heterogeneous fleet in which about a fifth of the workloads are misplaced.
* ``well-placed``: a heterogeneous fleet with nothing worth moving.
* ``training-heavy`` / ``inference-heavy``: mostly one kind of work, a few misplaced.
* ``hard``: the cases that look alike — training with long data-loader stalls, online inference at peak load,
  batch inference on H100s, a continuous-batching LLM server, loader-bound training, LoRA fine-tuning — besides
  the usual.
* ``realistic``: what production fleets run (collectors/sim/workloads.py): continuous-batching LLM servers busy 85–99 %
  with flat KV-cache memory, tensor-parallel or not; loader-bound training at 20–60 % reading its input over the
  front end; LoRA fine-tuning with small saves; notebooks whose bursts are minutes apart; batch scoring reading its
  input; small online models. Nodes have md RAID checkpoint volumes and RDMA-capable front-end NICs, processes
  named ``python3`` or cut at 15 characters, and two agents in five predate schema 2 (no process facts).
* ``services``: the realistic fleet with online services that do not look like LLM chat on half of its nodes:
  compute-bound APIs (image generation, speech recognition, embeddings and reranking, vision behind Triton), small
  LLMs served as one replica per PCIe card, FP8 tensor-parallel LLM serving at moderate load
  (``service_spec``), named as the realistic fleet's are; ``names=False`` leaves only behaviour to tell them apart.

Levels, noise, checkpoint periods, diurnal phases and stalls are drawn per seed, so two seeds give two fleets.
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from agent.protocol import FindingKind
from collectors.sim.names import SCENARIOS  # offered by `fleetfit simulate`
from collectors.sim.node import SimulatedNode
from collectors.sim.profiles import PROFILES
from collectors.sim.spec import Pattern, WorkloadSpec
from collectors.sim.workloads import Background, draw_background

# Built by build_scenario for benchmarks and tests (bench/classify.py), not offered by `fleetfit simulate`.
BENCH_SCENARIOS = ("services",)
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
    kind: str = ""  # a service of SERVICE_KINDS, its parameters drawn by service_spec


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


def llm_serving(gpus: int, name: str, misplaced: bool = False) -> Job:
    return Job(Pattern.LLM_SERVING, gpus, name, "vllm", 0.9, misplaced)


def loader_bound(gpus: int, name: str, misplaced: bool = False) -> Job:
    return Job(Pattern.LOADER_BOUND_TRAINING, gpus, name, "python3", 0.9, misplaced)


def lora(gpus: int, name: str) -> Job:
    return Job(Pattern.LORA_FINE_TUNING, gpus, name, "python3")


def encode(gpus: int, name: str, misplaced: bool = False, **params: object) -> Job:
    """Batch encoding or scoring, one replica per GPU (collectors/sim/workloads.py)."""
    return Job(Pattern.EMBEDDING_BATCH, gpus, name, "python3", None, misplaced, params=params)


def offline_llm(gpus: int, name: str, misplaced: bool = False) -> Job:
    return Job(Pattern.OFFLINE_LLM_BATCH, gpus, name, "python3", 0.95, misplaced)


Layout = list[tuple[str, list[Job]]]

# The demo's first eight nodes, then well-placed filler.
_DEMO: Layout = [
    # Its checkpoints saved synchronously: a 13B model's weights and Adam state (13e9 x 16 bytes = 208 GB) at the
    # NVMe volume's 4 GB/s, 52 s every 5.5 minutes with the GPUs waiting. The periods here are not divisors of
    # the 10 minutes between the windows of the demo's replayed day, so those windows fall at every phase.
    (
        "h100",
        [
            training(
                8,
                "llm-pretrain",
                sync_save=True,
                save_bytes=208e9,
                save_write_bps=4e9,
                checkpoint_period_s=330.0,
                checkpoint_offset_s=100.0,
            )
        ],
    ),
    ("h100", [inference(8, "chat-serving", level=0.25, misplaced=True)]),
    ("h100", []),
    ("l40s", [inference(4, "embeddings-api", level=0.45)]),
    ("l40s", []),
    # Gradients exchanged once per optimizer step (accumulation over ~35 s of micro-batches) over the PCIe that
    # the OCR service's cards share: the service's requests take longer while they cross (the mixed node).
    (
        "l4",
        [
            training(4, "vision-finetune-ddp", misplaced=True, exchange_every_s=35.0, exchange_s=12.0),
            inference(4, "ocr-api", level=0.5),
        ],
    ),
    ("l4", [inference(8, "asr-api", level=0.5)]),
    ("a100", [idle(4, "forgotten-notebook-alloc")]),
]


def online(gpus: int, name: str, level: float, program: str, misplaced: bool = False, **params: object) -> Job:
    """An online inference server as production runs one (the names, ports and client counts that
    realistic_spec draws): it listens for many clients, whose small responses leave a fraction of the textbook
    north-south traffic."""
    hint = program if program in ("tritonserver", "gunicorn") else "python3"
    server = {"program": program, "listen_ports": (8000, 8001), "client_scale": 0.02, "power_intensity": 0.6}
    return Job(Pattern.INFERENCE, gpus, name, hint, level, misplaced, params=server | params)


# The demo's eleventh to thirteenth nodes (after two well-placed ones): a service that can give GPUs back (its
# daily peak and memory fit half of them); 8-GPU training on L40S cards, which belongs on H100s with NVLink; and
# two services that belong on L40S cards, whose H100 node is the one room for that training once they have left.
_DEMO_MORE: Layout = [
    ("l40s", [online(8, "tts-api", 0.1, "tritonserver", peers=24, client_scale=0.1)]),
    ("l40s", [training(8, "speech-ddp", misplaced=True)]),
    (
        "h100",
        [
            # A 34B translation model in FP16 (68 GB) read from object storage at 2 GB/s by each new replica (34 s),
            # one every 190 s as the autoscaler follows load: any few minutes of the demo see one start.
            online(
                4,
                "translate-api",
                0.08,
                "uvicorn",
                misplaced=True,
                peers=40,
                restart_s=190.0,
                restart_offset_s=60.0,
                weights_bytes=68e9,
                weights_read_bps=2e9,
            ),
            online(4, "search-api", 0.08, "gunicorn", misplaced=True, peers=40),
        ],
    ),
]
_WELL_PLACED: Layout = [
    ("l40s", [encode(8, "nightly-batch-scoring")]),
    ("h100", [training(8, "llm-sft")]),
    ("l4", [inference(8, "rerank-api", level=0.5)]),
    ("l40s", [inference(8, "image-gen-api", level=0.45)]),
    ("h200", [training(8, "moe-pretrain")]),
    ("l40s", [fine_tuning(1, "lora-finetune"), notebook(1, "research-notebook"), inference(6, "tts-api", level=0.4)]),
]
# The demo's filler: the well-placed templates, its supervised fine-tuning starved by its data loader (tokenising
# and packing on the fly in too few workers: every core busy, the GPUs waiting 55 % of each step).
_DEMO_FILLER: Layout = [
    _WELL_PLACED[0],
    ("h100", [training(8, "llm-sft", input_wait=0.55, loader_cpu_bound=True)]),
    *_WELL_PLACED[2:4],
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
    ("h100", [llm_serving(8, "llm-chat-tp8", misplaced=True)]),
    ("a100", [loader_bound(8, "loader-bound-pretrain")]),
    ("l40s", [lora(1, "lora-adapter"), llm_serving(4, "llm-tp4"), notebook(1, "notebook")]),
    ("h100", [offline_llm(8, "offline-generate-on-h100")]),
    ("a100", [encode(4, "embed-corpus"), idle(4, "held-idle")]),
]
_SPARE: Layout = [("l40s", []), ("h100", []), ("l40s", [])]  # capacity misplaced work can move to


def _layout(scenario: str, nodes: int, rng: random.Random) -> Layout:
    def pick(templates: Layout, k: int) -> Layout:
        return [templates[rng.randrange(len(templates))] for _ in range(k)]

    if scenario == "demo":
        if nodes < len(_DEMO):
            raise ValueError(f"the demo fleet needs at least {len(_DEMO)} nodes")
        filler = [_DEMO_FILLER[i % 4] for i in range(nodes - len(_DEMO))]
        return _DEMO + filler[:2] + _DEMO_MORE[: max(0, nodes - len(_DEMO) - 2)] + filler[2 + len(_DEMO_MORE) :]
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
        Pattern.LLM_SERVING: (0.9, 0.9),
        Pattern.LOADER_BOUND_TRAINING: (0.9, 0.9),
        Pattern.LORA_FINE_TUNING: (0.6, 0.95),
        Pattern.EMBEDDING_BATCH: (0.85, 0.97),
        Pattern.OFFLINE_LLM_BATCH: (0.95, 0.95),
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
        power_intensity=_INTENSITY.get(job.pattern, 0.9),
    )
    if job.pattern in (Pattern.INFERENCE, Pattern.LLM_SERVING):
        # An online service listens and its clients hold connections; drawn from the workload's own id so that
        # the scenario's other draws stay as they were.
        spec = replace(spec, listen_ports=(8000,), peers=random.Random(spec.id).randint(4, 40))
    elif job.pattern is Pattern.EMBEDDING_BATCH:
        spec = _encoding(spec, rng)
    elif job.pattern is Pattern.OFFLINE_LLM_BATCH:
        spec = _offline_generation(spec, rng)
    return replace(spec, **job.params) if job.params else spec  # type: ignore[arg-type]


def _encoding(spec: WorkloadSpec, rng: random.Random) -> WorkloadSpec:
    """Batch encoding (embeddings: a few KB of text in and a 1-4 KB vector out per document, 1,000-5,000 documents a
    second per GPU) or scoring (images of ~100 KB in, a score out, ~1,000 a second per GPU)."""
    gpus = len(spec.gpus)
    embeddings = rng.random() < 0.6
    per_gpu_in = rng.uniform(3e6, 25e6) if embeddings else rng.uniform(30e6, 150e6)
    per_gpu_out = rng.uniform(4e6, 20e6) if embeddings else rng.uniform(10e3, 200e3)
    return replace(
        spec, level=rng.uniform(0.85, 0.97), stall_rate=rng.uniform(0.002, 0.02), stall_seconds=(1.0, 4.0),
        power_intensity=rng.uniform(0.8, 0.95), tensor_share=rng.uniform(0.45, 0.65), dram_share=rng.uniform(0.3, 0.45),
        mem_fraction=rng.uniform(0.15, 0.6), input_bps=per_gpu_in * gpus, output_bps=per_gpu_out * gpus,
        input_from_disk=rng.random() < 0.3, save_to_network=rng.random() < 0.5,
    )  # fmt: skip


def _offline_generation(spec: WorkloadSpec, rng: random.Random) -> WorkloadSpec:
    """Offline LLM generation: tensor-parallel replicas as the model's size needs, chunks of prompts or one queue."""
    gpus = len(spec.gpus)
    return replace(
        spec, tp=rng.choice([d for d in (1, 2, 4, 8) if d <= gpus]), mem_fraction=rng.uniform(0.85, 0.93),
        chunk_s=rng.choice((0.0, rng.uniform(60, 900))), input_bps=rng.uniform(5e3, 60e3),
        save_to_network=rng.random() < 0.3,
    )  # fmt: skip


# Share of the power range drawn per unit of utilisation: dense training near the limit, serving of small models
# and decode well below it (collectors/sim/workloads.py).
_INTENSITY = {Pattern.INFERENCE: 0.65, Pattern.BATCH_INFERENCE: 0.8, Pattern.INTERACTIVE: 0.85}


def _mem_fraction(pattern: Pattern, demo: bool, rng: random.Random) -> float:
    fixed = {Pattern.TRAINING: 0.9, Pattern.IDLE: 0.3, Pattern.BATCH_INFERENCE: 0.6, Pattern.LLM_SERVING: 0.9}
    if pattern in fixed:
        return fixed[pattern]
    # demo serving models leave room for a full KV cache on an L40S, so the demo reads the same every run
    return 0.35 if demo else rng.uniform(0.3, 0.5)


# Share of a realistic fleet's nodes built thin (8 CPUs per GPU, no NVMe, data over NFS: collectors/sim/profiles.py),
# an assumption: older or cheaper builds of the same GPUs bought in another round.
THIN_SHARE = 0.2


@dataclass(frozen=True, slots=True)
class ScenarioNode:
    name: str
    profile: str
    workloads: tuple[WorkloadSpec, ...]
    misplaced: frozenset[str]
    quirks: frozenset[str] = frozenset()
    schema: int = 2
    background: Background | None = None


def build_scenario(scenario: str, nodes: int, seed: int = 0, names: bool = True) -> list[ScenarioNode]:
    """The nodes of ``scenario``; names and parameters are reproducible for a given seed.

    Every node sends and writes its own background (scrapes, log shipping, kubelet) whatever its GPUs do. With
    ``names`` false every process is ``python3`` with no program on its command line, so that only behaviour tells
    workloads apart."""
    rng = random.Random(f"{scenario}:{seed}")
    # Drawn apart, so that a seed's workloads are the same with and without the nodes' background.
    quiet = random.Random(f"{scenario}:{seed}:background")
    out = []
    counts: dict[str, int] = {}
    if scenario == "services":
        layout = services_layout(nodes, rng)
    elif scenario == "realistic":
        layout = realistic_layout(nodes, rng)
    else:
        layout = _layout(scenario, nodes, rng)
    for profile, jobs in layout:
        counts[profile] = counts.get(profile, 0) + 1
        next_gpu = 0
        specs = []
        for job in jobs:
            spec = _spec(job, tuple(range(next_gpu, next_gpu + job.gpus)), scenario, rng)
            spec = realistic_spec(spec, rng) if scenario in ("realistic", "hard", "services") else spec
            if job.kind:
                spec = service_spec(spec, job.kind, rng)
            specs.append(spec if names else replace(spec, hint="python3", program=None))
            next_gpu += job.gpus
        misplaced = frozenset(s.id for s, j in zip(specs, jobs, strict=True) if j.misplaced)
        quirks, schema = frozenset[str](), 2
        if scenario in ("realistic", "services"):
            quirks = frozenset(q for q, share in (("md_raid", 0.3), ("roce_frontend", 0.25)) if rng.random() < share)
            schema = 1 if rng.random() < 0.4 else 2
            if quiet.random() < 0.3:  # Slurm jobs, host-network pods: no network namespace of their own
                quirks |= {"host_network"}
        name = f"{profile}-{counts[profile]:03d}"
        # Drawn from the node's name, so that the scenario's other draws stay as they were.
        thin = random.Random(f"{scenario}:{seed}:{name}:host").random() < THIN_SHARE
        if thin and scenario in ("realistic", "services") and "md_raid" not in quirks:
            quirks |= {"thin_host"}
        out.append(ScenarioNode(name, profile, tuple(specs), misplaced, quirks, schema, draw_background(quiet)))
    return out


def simulated_node(node: ScenarioNode, clock: Callable[[], float], seed: int = 0) -> SimulatedNode:
    return SimulatedNode(
        node.name,
        PROFILES[node.profile],
        list(node.workloads),
        clock,
        seed,
        quirks=node.quirks,
        schema=node.schema,
        background=node.background,
    )


# ----------------------------------------------------------------------------------------- realistic fleets

_REALISTIC: Layout = [
    ("h100", [llm_serving(8, "chat-llm-tp8")]),
    ("h200", [llm_serving(8, "reasoning-llm-tp8")]),
    ("h100", [llm_serving(4, "code-llm-tp4"), llm_serving(4, "chat-llm-tp4")]),
    ("l40s", [llm_serving(2, "summarise-llm-tp2"), llm_serving(1, "small-llm"), inference(4, "vision-api")]),
    ("l4", [llm_serving(1, "embed-llm"), inference(2, "ocr-api"), inference(4, "asr-api"), idle(1, "stale-alloc")]),
    ("h100", [loader_bound(8, "loader-bound-pretrain")]),
    ("a100", [loader_bound(8, "video-model-train")]),
    ("h100", [training(8, "llm-pretrain")]),
    ("a100", [lora(1, "lora-support-bot"), lora(1, "lora-sql"), notebook(1, "notebook-ana"), encode(4, "embed-batch")]),
    ("l40s", [lora(1, "lora-tts"), notebook(1, "notebook-kim"), notebook(1, "notebook-raj"), encode(4, "score-batch")]),
    ("h100", [offline_llm(8, "offline-generate")]),
    ("a100", [idle(4, "forgotten-alloc"), inference(4, "rerank-api")]),
    ("l40s", [encode(8, "embed-corpus")]),
    ("h100", [idle(8, "held-after-crash")]),
    ("l4", [encode(8, "image-scoring")]),
    ("h200", [offline_llm(8, "synthetic-data-gen")]),
]

_SERVING_NAMES = (  # (comm as /proc shows it, the program a schema-2 agent reads from the command line)
    ("vllm", "vllm"),
    ("VLLM::EngineCor", "vllm"),
    ("python3", "vllm.entrypoints.openai.api_server"),
    ("pt_main_thread", "vllm"),
    ("text-generation", "text-generation-server"),
    ("sglang::schedul", "sglang.launch_server"),
    ("python3", "sglang.launch_server"),
    ("tritonserver", "tritonserver"),
    ("trtllm-serve", "trtllm-serve"),
)
_TRAINING_NAMES = (
    ("python3", "torchrun"),
    ("pt_main_thread", "train.py"),
    ("python", "pretrain_gpt.py"),
    ("python3", "deepspeed"),
    ("torchrun", "torchrun"),
)
_LORA_NAMES = (("python3", "train_lora.py"), ("python", "accelerate"), ("python3", "llamafactory-cli"))
_BATCH_NAMES = (("python3", "batch_score.py"), ("python", "embed_corpus.py"), ("pt_main_thread", "offline_generate.py"))
_ENCODING_NAMES = (  # Ray Data's GPU actors run Ray's default worker, titled after the stage
    ("python3", "embed_corpus.py"),
    ("python", "batch_score.py"),
    ("pt_main_thread", "encode.py"),
    ("ray::_MapWorker", "default_worker.py"),
    ("python3", "run.py"),
)
_OFFLINE_NAMES = (  # vllm run-batch is the serving engine's own command for a file of requests
    ("python3", "offline_generate.py"),
    ("vllm", "vllm"),
    ("VLLM::EngineCor", "generate.py"),
    ("python3", "vllm.entrypoints.openai.run_batch"),
)
RAY_WORKER_PORTS = (10002, 19999)  # Ray's default --min-worker-port / --max-worker-port
_ONLINE_NAMES = (("tritonserver", "tritonserver"), ("python3", "uvicorn"), ("gunicorn", "gunicorn"))


def realistic_layout(nodes: int, rng: random.Random) -> Layout:
    if nodes < 1:
        raise ValueError("a fleet needs at least one node")
    return [_REALISTIC[rng.randrange(len(_REALISTIC))] for _ in range(nodes)] + _SPARE[: max(1, nodes // 10)]


def realistic_spec(spec: WorkloadSpec, rng: random.Random) -> WorkloadSpec:
    """Parameters of production behaviour, drawn per workload (assumptions in collectors/sim/workloads.py)."""
    pattern = spec.pattern
    if pattern is Pattern.LLM_SERVING:
        hint, program = rng.choice(_SERVING_NAMES)
        return replace(
            spec, hint=hint, program=program, listen_ports=(rng.choice((8000, 8080, 30000, 3000)),),
            peers=rng.randint(3, 40), rps_peak=rng.uniform(2, 40), request_s=rng.uniform(4, 20),
            mem_fraction=rng.uniform(0.86, 0.93), diurnal_phase=rng.uniform(0, 2 * math.pi),
        )  # fmt: skip
    if pattern in (Pattern.LOADER_BOUND_TRAINING, Pattern.TRAINING):
        hint, program = rng.choice(_TRAINING_NAMES)
        return replace(
            spec, hint=hint, program=program, step_s=rng.choice((rng.uniform(0.6, 1.8), rng.uniform(3, 12))),
            duty=rng.uniform(0.22, 0.62), input_bps=rng.uniform(0.2e9, 1.5e9), power_intensity=rng.uniform(0.8, 1.0),
            tensor_share=rng.uniform(0.45, 0.7), dram_share=rng.uniform(0.3, 0.5),
            checkpoint_period_s=rng.choice((300.0, 600.0, 900.0, 1800.0)), mem_fraction=rng.uniform(0.6, 0.92),
            save_to_network=rng.random() < 0.5,
        )  # fmt: skip
    if pattern is Pattern.LORA_FINE_TUNING:
        hint, program = rng.choice(_LORA_NAMES)
        return replace(
            spec, hint=hint, program=program, save_bytes=rng.uniform(50e6, 200e6),
            checkpoint_period_s=rng.uniform(120, 600), power_intensity=rng.uniform(0.8, 0.95),
            mem_fraction=rng.uniform(0.3, 0.7), stall_rate=0.004,
        )  # fmt: skip
    if pattern is Pattern.BATCH_INFERENCE:
        hint, program = rng.choice(_BATCH_NAMES)
        llm = rng.random() < 0.5  # offline LLM generation is memory-bound; embeddings and scoring are dense
        return replace(
            spec, hint=hint, program=program, input_bps=rng.uniform(20e6, 400e6),
            power_intensity=rng.uniform(0.45, 0.6) if llm else rng.uniform(0.75, 0.9),
            tensor_share=0.25 if llm else 0.55, dram_share=0.75 if llm else 0.4,
        )  # fmt: skip
    if pattern is Pattern.EMBEDDING_BATCH:
        hint, program = rng.choice(_ENCODING_NAMES)
        if program == "default_worker.py":
            # A Ray worker serves the cluster's own RPC (the raylet, the driver) on a port from Ray's range.
            return replace(spec, hint=hint, program=program, listen_ports=(rng.randint(*RAY_WORKER_PORTS),), peers=2)
        return replace(spec, hint=hint, program=program)
    if pattern is Pattern.OFFLINE_LLM_BATCH:
        hint, program = rng.choice(_OFFLINE_NAMES)
        return replace(spec, hint=hint, program=program)
    if pattern is Pattern.INFERENCE:
        hint, program = rng.choice(_ONLINE_NAMES)
        return replace(
            spec, hint=hint, program=program, listen_ports=(8000, 8001), peers=rng.randint(4, 60),
            client_scale=rng.choice((0.002, 0.02, 0.1, 0.5)), power_intensity=rng.uniform(0.55, 0.8),
        )  # fmt: skip
    if pattern is Pattern.INTERACTIVE:
        return replace(
            spec, hint=rng.choice(("python3", "python3", "jupyter-lab")), program="ipykernel_launcher",
            listen_ports=(8888,), peers=1, cell_rate=rng.uniform(0.003, 0.01),
        )  # fmt: skip
    # An allocation nobody uses: a crashed job's survivor, a debugging pod left on `sleep infinity`, a model loaded
    # and forgotten; whatever it holds stays held.
    hint = rng.choice(("python3", "sleep", "pt_main_thread"))
    return replace(spec, hint=hint, mem_fraction=rng.uniform(0.05, 0.9))


# ------------------------------------------------------------------------------------ online services

# Per kind (collectors/sim/workloads.py states what each rests on; every figure an estimate): GPU seconds per
# request, bytes in and out per request, the share of its GPUs busy at the daily peak, memory held (weights and
# the caching allocator's activations), power per unit of utilisation, tensor and DRAM activity per unit of it,
# and the ports its server listens on.
SERVICE_KINDS: dict[str, dict[str, tuple[float, float] | tuple[int, ...]]] = {
    # diffusers behind FastAPI or ComfyUI (8188): SDXL, 30 steps at 1024x1024; a prompt in, a PNG out
    "image": {"gpu_s": (3.0, 10.0), "in": (1e3, 4e3), "out": (1e6, 2e6), "peak": (0.3, 0.85),
              "mem": (0.2, 0.45), "power": (0.82, 0.95), "tensor": (0.5, 0.7), "dram": (0.25, 0.4),
              "ports": (8000, 8188)},
    # Whisper large behind Triton (8000 HTTP, 8001 gRPC) or a FastAPI worker: a 30 s chunk of compressed audio in
    "speech": {"gpu_s": (0.5, 2.0), "in": (0.2e6, 1e6), "out": (1e3, 4e3), "peak": (0.3, 0.85),
               "mem": (0.1, 0.3), "power": (0.75, 0.9), "tensor": (0.4, 0.6), "dram": (0.3, 0.5),
               "ports": (8000, 8001)},
    # text-embeddings-inference (80 in its container) for embeddings or reranking: dynamic batches of short texts
    "embed": {"gpu_s": (0.02, 0.08), "in": (2e3, 20e3), "out": (4e3, 30e3), "peak": (0.3, 0.85),
              "mem": (0.05, 0.25), "power": (0.78, 0.92), "tensor": (0.45, 0.65), "dram": (0.3, 0.45),
              "ports": (80, 3000)},
    # a CNN or ViT behind Triton: an image of 50-300 KB in, labels or boxes out
    "vision": {"gpu_s": (0.01, 0.05), "in": (50e3, 300e3), "out": (1e3, 5e3), "peak": (0.3, 0.85),
               "mem": (0.05, 0.2), "power": (0.8, 0.95), "tensor": (0.45, 0.65), "dram": (0.3, 0.45),
               "ports": (8000, 8001)},
}  # fmt: skip


def service(gpus: int, name: str, kind: str, misplaced: bool = False) -> Job:
    """An online service of SERVICE_KINDS, or an LLM served as ``llm-replicas`` (one engine per GPU) or
    ``llm-tp`` (one tensor-parallel engine at moderate load, FP8 weights)."""
    pattern = Pattern.LLM_SERVING if kind.startswith("llm") else Pattern.INFERENCE
    return Job(pattern, gpus, name, "python3", 0.9 if kind.startswith("llm") else None, misplaced, kind=kind)


def service_spec(spec: WorkloadSpec, kind: str, rng: random.Random) -> WorkloadSpec:
    """The service's parameters, drawn per seed after the realistic ones."""
    gpus = len(spec.gpus)
    if kind == "llm-replicas":  # an 8B model per L4 or L40S: a few requests in flight per replica
        return replace(spec, replicas=gpus, rps_peak=gpus * rng.uniform(0.1, 1.5), request_s=rng.uniform(3, 15))
    if kind == "llm-tp":  # 70B in FP8 over 4 H100s at moderate load
        return replace(spec, replicas=1, rps_peak=rng.uniform(0.1, 1.0), request_s=rng.uniform(4, 20))
    k = SERVICE_KINDS[kind]

    def draw(key: str) -> float:
        low, high = k[key]
        return rng.uniform(low, high)

    gpu_s = draw("gpu_s")
    ports = k["ports"]
    return replace(
        spec, request_gpu_s=gpu_s, rps_peak=draw("peak") / gpu_s * gpus, request_bytes=(draw("in"), draw("out")),
        mem_fraction=draw("mem"), power_intensity=draw("power"), tensor_share=draw("tensor"),
        dram_share=draw("dram"), listen_ports=(int(ports[rng.randrange(len(ports))]),), peers=rng.randint(3, 40),
        diurnal_phase=rng.uniform(0, 2 * math.pi),
    )  # fmt: skip


_SERVICES: Layout = [
    ("l40s", [service(4, "image-gen-api", "image"), service(2, "asr-api", "speech"), service(2, "embed-api", "embed")]),
    ("h100", [service(8, "image-gen-api", "image")]),
    ("l4", [service(8, "small-llm-replicas", "llm-replicas")]),
    ("l40s", [service(4, "llm-replicas", "llm-replicas"), service(4, "rerank-api", "embed")]),
    ("h100", [service(4, "llm-fp8-tp4", "llm-tp"), service(4, "chat-fp8-tp4", "llm-tp")]),
    ("l4", [service(4, "asr-api", "speech"), service(4, "vision-api", "vision")]),
    ("a100", [service(4, "vision-api", "vision"), service(2, "embed-api", "embed"), service(2, "asr-api", "speech")]),
    ("h200", [service(4, "llm-fp8-tp4", "llm-tp"), service(4, "image-gen-api", "image")]),
]


def services_layout(nodes: int, rng: random.Random) -> Layout:
    """Half the nodes online services (``_SERVICES``), half the realistic fleet."""
    if nodes < 1:
        raise ValueError("a fleet needs at least one node")
    return [
        (_SERVICES if i % 2 == 0 else _REALISTIC)[rng.randrange(len(_SERVICES if i % 2 == 0 else _REALISTIC))]
        for i in range(nodes)
    ] + _SPARE[: max(1, nodes // 10)]


def rest_of_node(node: ScenarioNode) -> dict[str, FindingKind]:
    """The rest-of-node problems planted on ``node`` (collectors/sim/workloads.py), by workload id: the ground
    truth optimizer/decide/nodefit.py is scored against (bench/nodefit.py)."""
    out: dict[str, FindingKind] = {}
    exchanging = any(w.exchange_every_s > 0 for w in node.workloads) and not PROFILES[node.profile].nvlink_links
    for w in node.workloads:
        if w.input_wait > 0 and (w.loader_cpu_bound or w.storage_read_bps > 0):
            out[w.id] = FindingKind.INPUT_STARVED_TRAINING
        elif w.sync_save and w.save_bytes > 0:
            out[w.id] = FindingKind.CHECKPOINT_STALL
        elif w.restart_s > 0 and w.weights_bytes > 0 and not w.weights_local:
            out[w.id] = FindingKind.SLOW_COLD_START
        elif exchanging and w.pattern is Pattern.INFERENCE:
            out[w.id] = FindingKind.MIXED_NODE
    return out
