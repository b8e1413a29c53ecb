"""How fast the simulated world's GPUs really run work, and what a scheduler does when it moves a workload.

This table is the simulator's own, kept apart from the optimizer's catalog on purpose: the catalog is a claim
about the world, and a closed-loop run (``fleetfit simulate --apply-acknowledged``) can give the optimizer a
wrong catalog and watch whether what it observes after each move corrects it. The figures are those the shipped
catalog derives from public MLPerf results (H100 SXM = 1; optimizer/decide/data/catalog.toml names every result), as
the best available picture of the real hardware.
"""

from __future__ import annotations

from dataclasses import replace

from collectors.sim.spec import Pattern, WorkloadSpec

# profile key → (compute-bound, memory-bound) throughput of one GPU, H100 SXM = 1
WORLD: dict[str, tuple[float, float]] = {
    "h100": (1.0, 1.0),
    "h200": (1.05, 1.22),
    "a100": (0.32, 0.61),  # no MLPerf result in the rounds read: datasheet ratios
    "l40s": (0.38, 0.28),
    "l4": (0.11, 0.09),
    "mi300x": (0.83, 0.95),
    "gaudi2": (0.48, 0.36),
}
COMPUTE_ANCHOR, MEMORY_ANCHOR = 0.35, 0.80  # DRAM's share of DRAM + tensor activity at either end
DEMAND_BOUND = frozenset({Pattern.INFERENCE, Pattern.LLM_SERVING, Pattern.INTERACTIVE})


def memory_share(spec: WorkloadSpec) -> float:
    """The memory-bound share of the workload's GPU time, from the GPM activity it shows."""
    tensor, dram = (0.25, 0.75) if spec.pattern is Pattern.LLM_SERVING else (spec.tensor_share, spec.dram_share)
    share = dram / (dram + tensor) if tensor + dram > 0 else 0.0
    return min(1.0, max(0.0, (share - COMPUTE_ANCHOR) / (MEMORY_ANCHOR - COMPUTE_ANCHOR)))


def speed(profile: str, share: float) -> float:
    """One GPU of ``profile`` against one H100 SXM, for work of memory-bound share ``share``."""
    compute, memory = WORLD[profile]
    return 1 / ((1 - share) / compute + share / memory)


def moved(spec: WorkloadSpec, from_profile: str, to_profile: str, gpus: tuple[int, ...]) -> WorkloadSpec:
    """``spec`` as it runs after a scheduler moved it onto ``gpus`` of a ``to_profile`` node: a service's load
    is the same requests served at the new GPUs' speed, spread over as many GPUs as it now holds."""
    if spec.pattern not in DEMAND_BOUND:
        return replace(spec, gpus=gpus)
    share = memory_share(spec)
    factor = speed(to_profile, share) / speed(from_profile, share) * len(gpus) / len(spec.gpus)
    return replace(spec, gpus=gpus, speed=spec.speed * factor)
