"""What a workload costs on a given GPU model, and whether it fits there.

Two kinds of workload cost differently:

* throughput-bound (training, batch inference) have a fixed amount of work; faster hardware finishes it
  sooner, so their cost is the price per unit of useful work: GPUs × price per GPU-hour ÷ relative throughput,
  scaled to the work they do today.
* demand-bound (online inference, interactive, idle, unknown) serve whatever load arrives; they cost the
  hardware they hold, and may move only where the projected load still fits with headroom.

How fast a target GPU runs the work comes from the workload's shape (optimizer/decide/performance.py). A serving
workload whose load or memory does not fit the same number of target GPUs is sized to the GPUs it needs there
(``grown``), and priced so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from agent.protocol import WorkloadClass
from optimizer.decide.catalog import Catalog, GpuType
from optimizer.decide.performance import relative_speed

THROUGHPUT_BOUND = frozenset({WorkloadClass.TRAINING, WorkloadClass.BATCH_INFERENCE})
MEMORY_HEADROOM = 0.9  # of the target GPU's memory a workload may fill
MAX_PROJECTED_MEAN_UTIL = 60.0
MAX_PROJECTED_P95_UTIL = 95.0


@dataclass(frozen=True, slots=True)
class Demand:
    """What the planner knows of a workload's needs."""

    workload_class: WorkloadClass
    gpus: int
    mem_mib_per_gpu: float
    mean_util: float
    p95_util: float
    share: float = 1.0  # of each of its GPUs (a MIG slice or a time-sliced share); utilisation is of whole GPUs
    shape: float | None = (
        None  # memory-bound share of its GPU time, 0-1 (optimizer/decide/performance.py); None: unknown
    )


def _scaling(catalog: Catalog, gpu: GpuType, demand: Demand) -> float:
    """Multi-GPU training without NVLink synchronises its gradients over PCIe, and keeps only part of its speed."""
    if demand.workload_class is WorkloadClass.TRAINING and demand.gpus > 1 and not gpu.nvlink:
        return catalog.defaults.pcie_training_scaling.value
    return 1.0


def speedup(catalog: Catalog, demand: Demand, current: GpuType, target: GpuType) -> float:
    """How fast one GPU of ``target`` runs this workload against one of ``current`` (< 1: slower)."""
    ratio = relative_speed(catalog, current, target, demand.shape)
    return ratio * _scaling(catalog, target, demand) / _scaling(catalog, current, demand)


def monthly_cost(catalog: Catalog, demand: Demand, current: GpuType, target: GpuType) -> float:
    """US$ per month to run the workload's current work on ``target``."""
    hourly = demand.gpus * demand.share * target.price_per_gpu_hour
    if demand.workload_class in THROUGHPUT_BOUND:
        hourly /= speedup(catalog, demand, current, target)
    return hourly * catalog.defaults.hours_per_month


def projected(catalog: Catalog, demand: Demand, current: GpuType, target: GpuType) -> tuple[float, float]:
    """(mean, p95) utilisation per GPU the workload's load would reach on ``target`` at ``demand.gpus`` GPUs
    (of its share, for a share): NVML's busy time grows as the GPU slows, at the same request rate."""
    ratio = 1 / speedup(catalog, demand, current, target) / demand.share
    return demand.mean_util * ratio, demand.p95_util * ratio


def fit_problem(catalog: Catalog, demand: Demand, current: GpuType, target: GpuType) -> str | None:
    """Why the workload cannot run on ``target`` (None when it can)."""
    target_mib = target.memory_gib * 1024 * demand.share
    if demand.mem_mib_per_gpu > MEMORY_HEADROOM * target_mib:
        need = demand.mem_mib_per_gpu / 1024
        if demand.share < 1:  # a MIG slice or a time-sliced share: it gets that share of the target's memory
            return f"needs {need:.1f} GiB; a {demand.share:.0%} share of {target.name} has {target_mib / 1024:.1f}"
        return f"needs {need:.0f} GiB per GPU, {target.name} has {target.memory_gib:.0f}"
    if demand.workload_class is WorkloadClass.TRAINING and demand.gpus > 1 and current.nvlink and not target.nvlink:
        # it may be tensor-parallel, which NVLink carries and PCIe cannot: never take NVLink away from it
        return f"{demand.gpus}-GPU training needs NVLink, which {target.name} lacks"
    if demand.workload_class in THROUGHPUT_BOUND or demand.workload_class is WorkloadClass.IDLE:
        return None
    # a share's load is measured on its whole GPU, and must fit the share
    mean, p95 = projected(catalog, demand, current, target)
    if mean > MAX_PROJECTED_MEAN_UTIL or p95 > MAX_PROJECTED_P95_UTIL:
        where = target.name if demand.gpus == 1 else f"{demand.gpus} × {target.name}"
        return f"load would reach {mean:.0f} % (p95 {p95:.0f} %) on {where}"
    return None


GROWTH = (2, 4, 8)  # tensor-parallel degrees (or replicas) a service may multiply its GPU count by


def grown(catalog: Catalog, demand: Demand, current: GpuType, target: GpuType, most: int) -> Demand | None:
    """The fewest GPUs of ``target``, more than it holds now and at most ``most``, that carry a serving
    workload's load and memory (None when none does, or it is not an online service on whole GPUs).

    Its load and memory spread over the added GPUs, as replicas or a higher tensor-parallel degree do (an
    estimate: on cards without NVLink, a higher tensor-parallel degree also pays for its all-reduce over PCIe,
    so a growth there keeps only the PCIe share of the added GPUs' speed)."""
    if demand.workload_class is not WorkloadClass.INFERENCE or demand.share < 1:
        return None
    if fit_problem(catalog, demand, current, target) is None:
        return None
    for factor in GROWTH:
        gpus = demand.gpus * factor
        if gpus > most:
            return None
        wider = spread(catalog, demand, target, gpus)
        if fit_problem(catalog, wider, current, target) is None:
            return wider
    return None


def spread(catalog: Catalog, demand: Demand, target: GpuType, gpus: int) -> Demand:
    """``demand`` on ``gpus`` GPUs of ``target``: fewer carry more each; more without NVLink lose the PCIe share."""
    wider = scaled(demand, gpus)
    if gpus <= demand.gpus or target.nvlink:
        return wider
    efficiency = catalog.defaults.pcie_training_scaling.value
    return replace(wider, mean_util=wider.mean_util / efficiency, p95_util=wider.p95_util / efficiency)


def units(demand: Demand, per_gpu: int) -> int:
    """The GPU capacity ``demand`` takes, in units of 1/``per_gpu`` GPU (a share rounds up)."""
    return max(1, math.ceil(demand.gpus * demand.share * per_gpu - 1e-9))


def scaled(demand: Demand, gpus: int) -> Demand:
    """The same load and memory spread over ``gpus`` GPUs instead of ``demand.gpus``."""
    factor = demand.gpus / gpus
    return replace(
        demand,
        gpus=gpus,
        mem_mib_per_gpu=demand.mem_mib_per_gpu * factor,
        mean_util=demand.mean_util * factor,
        p95_util=demand.p95_util * factor,
    )


def right_sized(catalog: Catalog, demand: Demand, current: GpuType, target: GpuType) -> Demand | None:
    """The fewest GPUs of ``target`` that carry a serving workload's daily peak, memory included (None when not
    even its GPU count does). Only online inference is resized: training and batch jobs keep their GPUs, and a
    workload whose memory is unknown is never squeezed."""
    if fit_problem(catalog, demand, current, target) is not None:
        return None
    if demand.workload_class is not WorkloadClass.INFERENCE or demand.mem_mib_per_gpu <= 0 or demand.share < 1:
        return demand
    for gpus in range(1, demand.gpus):
        if demand.gpus % gpus == 0:  # tensor-parallel degrees divide the model's
            smaller = scaled(demand, gpus)
            if fit_problem(catalog, smaller, current, target) is None:
                return smaller
    return demand


def shared(catalog: Catalog, demand: Demand, current: GpuType, target: GpuType, step: float) -> Demand | None:
    """The smallest share of one ``target`` GPU, a multiple of ``step``, that carries a one-GPU service's daily
    peak and memory (None when only a whole GPU does, or the workload is not such a service)."""
    whole = demand.gpus == 1 and demand.share == 1
    if demand.workload_class is not WorkloadClass.INFERENCE or not whole or demand.mem_mib_per_gpu <= 0:
        return None
    for k in range(1, math.ceil(1 / step - 1e-9)):
        smaller = replace(demand, share=round(k * step, 4))
        if fit_problem(catalog, smaller, current, target) is None:
            return smaller
    return None
