"""How fast one GPU runs a workload against another, from the catalog's sourced figures and the workload's shape.

A workload's *shape* is the share of its GPU time bound by memory bandwidth (LLM decode reads every weight and
the KV cache for each token) rather than by tensor compute (vision, encoders, diffusion, dense training): a
number from 0 (compute-bound) to 1 (memory-bound), or unknown. The catalog gives each GPU's throughput at the two
ends, H100 SXM = 1 (optimizer/decide/data/catalog.toml, each figure with its source).

The model between the ends (an estimate, stated): a workload's time on a GPU is the sum of its compute-bound and
its memory-bound time, each divided by that GPU's speed at that end, so one GPU runs work of shape ``s`` at
``1 / ((1 - s) / compute + s / memory)`` the H100's rate. A roofline would take the larger of the two per
kernel; a workload is a mix of kernels, and summing their times is the usual first-order model of such a mix.

An unknown shape is priced at whichever end makes the move look worse: a target that is relatively weaker at
memory-bound work (an L40S: GDDR6 at a quarter of an H100's bandwidth) is judged as if the work were
memory-bound, so a move is never recommended on the strength of a shape nobody measured.
"""

from __future__ import annotations

from typing import Literal

from optimizer.decide.catalog import Catalog, GpuType

ShapeBucket = Literal["compute", "mixed", "memory"]


def bucket(share: float) -> ShapeBucket:
    """The coarse shape learned corrections are kept for."""
    if share < 1 / 3:
        return "compute"
    return "memory" if share > 2 / 3 else "mixed"


def speed(gpu: GpuType, share: float) -> float:
    """Throughput of one GPU of ``gpu`` for work of memory-bound share ``share``, H100 SXM = 1."""
    return 1 / ((1 - share) / gpu.perf.compute.value + share / gpu.perf.memory.value)


def relative_speed(catalog: Catalog, current: GpuType, target: GpuType, share: float | None) -> float:
    """One GPU of ``target`` against one of ``current`` for this work (< 1: slower), with what observed moves
    taught (``catalog.learned``); an unknown shape takes the end less favourable to the target."""
    if share is None:
        return min(relative_speed(catalog, current, target, 0.0), relative_speed(catalog, current, target, 1.0))
    if current.key == target.key:
        return 1.0
    ratio = speed(target, share) / speed(current, share)
    return ratio * catalog.correction(bucket(share), current.key, target.key)
