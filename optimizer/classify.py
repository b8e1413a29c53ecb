"""Workload classification: transparent rules over the features a capacity planner would look at.

Each class collects points from the signatures that support it (utilisation level and burstiness,
synchronisation across GPUs, gradient traffic over NVLink/PCIe and the fabric, checkpoint write bursts,
north-south client traffic); the process name is a small hint, never enough on its own. The winner's
confidence is its softmax share, reduced while little data has been seen. Evidence lists the signatures that
decided, in words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agent.protocol import WorkloadClass
from optimizer.features import WorkloadFeatures

MIN_WINDOWS = 3
FULL_CONFIDENCE_WINDOWS = 6

TRAINING_HINTS = frozenset({"torchrun", "deepspeed", "accelerate", "megatron", "nemo", "horovodrun", "mpirun"})
INFERENCE_HINTS = frozenset(
    {
        "vllm",
        "tritonserver",
        "text-generation-launcher",
        "tgi",
        "sglang",
        "ollama",
        "llama-server",
        "trtllm-serve",
    }
)
NOTEBOOK_HINTS = frozenset({"jupyter", "jupyter-lab", "ipykernel", "ipython"})


@dataclass(frozen=True, slots=True)
class Classification:
    workload_class: WorkloadClass
    confidence: float
    evidence: tuple[str, ...]


def _gbps(value: float) -> str:
    return f"{value / 1e9:.1f} GB/s" if value >= 1e8 else f"{value / 1e6:.0f} MB/s"


def _hint(f: WorkloadFeatures, names: frozenset[str]) -> bool:
    hint = (f.hint or "").lower()
    return bool(hint) and any(hint.startswith(n) for n in names)


def classify(f: WorkloadFeatures) -> Classification:
    """Classify one workload from its features."""
    if f.windows < MIN_WINDOWS:
        return Classification(
            WorkloadClass.UNKNOWN, 0.0, (f"only {f.windows} window(s) observed; {MIN_WINDOWS} needed",)
        )
    sufficiency = 0.5 + 0.5 * min(1.0, f.windows / FULL_CONFIDENCE_WINDOWS)
    util = f"GPUs {f.mean_util:.0f} % busy on average (p95 {f.p95_util:.0f} %)"

    if f.mean_util < 2 and f.p95_util < 10:
        held = f"{f.mem_fraction:.0%} of GPU memory held" if f.mem_fraction > 0.01 else "no GPU memory in use"
        return Classification(WorkloadClass.IDLE, round(0.95 * sufficiency, 2), (util, held))

    high = f.mean_util >= 70
    low = f.mean_util < 50
    steady = f.burstiness < 0.12
    bursty = f.burstiness >= 0.15
    multi = f.gpus > 1
    synced = multi and f.gpu_spread < 0.15
    grad = f.gpu_link_bps >= 5e9 or f.east_west_bps >= 1e9
    # Checkpoints are bursts: writes in most windows are something else, once there are enough windows to tell.
    ckpt = f.write_bursts >= 1 and (f.checkpoint_windows <= 0.5 or f.windows < FULL_CONFIDENCE_WINDOWS)
    north = f.north_south_bps >= 50e6 and f.north_south_bps > f.east_west_bps
    mostly_zero = f.zero_seconds >= 0.5

    evidence: dict[WorkloadClass, list[tuple[float, str]]] = {c: [] for c in WorkloadClass}

    def vote(c: WorkloadClass, weight: float, reason: str) -> None:
        evidence[c].append((weight, reason))

    if high:
        vote(WorkloadClass.TRAINING, 2.0, util)
        vote(WorkloadClass.BATCH_INFERENCE, 2.0, util)
    if low:
        vote(WorkloadClass.INFERENCE, 2.0, util)
    if steady:
        line = f"steady second to second (variation {f.burstiness:.0%})"
        vote(WorkloadClass.TRAINING, 1.0, line)
        vote(WorkloadClass.BATCH_INFERENCE, 1.0, line)
    if bursty:
        vote(WorkloadClass.INFERENCE, 1.5, f"bursty second to second (variation {f.burstiness:.0%})")
    if synced:
        vote(WorkloadClass.TRAINING, 1.0, f"all {f.gpus} GPUs move in lockstep (spread {f.gpu_spread:.0%})")
    if grad:
        line = (
            f"{_gbps(f.gpu_link_bps)} per GPU over NVLink/PCIe and {_gbps(f.east_west_bps)} on the fabric: "
            "gradient synchronisation"
        )
        vote(WorkloadClass.TRAINING, 2.0, line)
    elif high:
        vote(
            WorkloadClass.BATCH_INFERENCE,
            1.5,
            f"busy without gradient traffic ({_gbps(f.gpu_link_bps)} per GPU)",
        )
    if ckpt:
        vote(WorkloadClass.TRAINING, 2.5, f"checkpoint-sized write bursts in {f.write_bursts} window(s)")
    else:
        vote(WorkloadClass.INFERENCE, 0.5, "no checkpoint writes")
        if high:
            vote(WorkloadClass.BATCH_INFERENCE, 1.0, "no checkpoint writes")
    if north:
        line = f"north-south traffic {_gbps(f.north_south_bps)} per GPU (client requests and responses)"
        vote(WorkloadClass.INFERENCE, 1.0, line)
        vote(WorkloadClass.BATCH_INFERENCE, 0.5, line)
    elif high:
        vote(WorkloadClass.TRAINING, 0.5, "little north-south traffic")
    if f.mem_stability >= 0.03 and not high:
        vote(WorkloadClass.INFERENCE, 0.5, f"GPU memory follows the load (KV cache; variation {f.mem_stability:.0%})")
    elif f.mem_stability < 0.01 and high:
        vote(WorkloadClass.TRAINING, 0.25, "GPU memory flat")
        vote(WorkloadClass.BATCH_INFERENCE, 0.25, "GPU memory flat")
    if f.diurnal_ratio is not None and f.diurnal_ratio >= 4 and f.mean_util < 60:
        vote(
            WorkloadClass.INFERENCE,
            1.5,
            f"daily cycle: the busiest 10 minutes {f.diurnal_ratio:.0f}x the quietest over {f.history_hours:.0f} h",
        )
    if mostly_zero and f.p95_util >= 30:
        vote(
            WorkloadClass.INTERACTIVE,
            6.0,
            f"idle {f.zero_seconds:.0%} of seconds with bursts to {f.p95_util:.0f} %",
        )
    if _hint(f, TRAINING_HINTS):
        vote(WorkloadClass.TRAINING, 0.5, f"process {f.hint}")
    if _hint(f, INFERENCE_HINTS):
        vote(WorkloadClass.INFERENCE, 0.5, f"process {f.hint}")
        vote(WorkloadClass.BATCH_INFERENCE, 0.5, f"process {f.hint}")
    if _hint(f, NOTEBOOK_HINTS):
        vote(WorkloadClass.INTERACTIVE, 0.5, f"process {f.hint}")

    scores = {c: sum(w for w, _ in votes) for c, votes in evidence.items() if c is not WorkloadClass.IDLE}
    best = max(scores, key=lambda c: scores[c])
    if scores[best] < 2.0:
        return Classification(WorkloadClass.UNKNOWN, 0.0, (util, "no class's signature is clear"))
    total = sum(math.exp(s) for s in scores.values())
    confidence = math.exp(scores[best]) / total * sufficiency
    reasons = tuple(r for _, r in sorted(evidence[best], key=lambda wr: -wr[0]))
    return Classification(best, round(confidence, 2), reasons)
