"""Misplacement findings: what is on the wrong hardware and what it wastes per hour, whether or not the
planner can move it now (no free capacity, pinned, multi-node). Capacity teams plan purchases from these."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from agent.protocol import Finding, FindingKind, WorkloadClass
from optimizer.decide.catalog import Catalog, GpuType
from optimizer.decide.costs import Demand, fit_problem, grown, monthly_cost
from optimizer.decide.nodefit import detect as rest_of_node
from optimizer.decide.snapshot import Resolved, SnapshotNode, hardware_of

MIN_WASTE_USD_PER_HOUR = 0.05
# A workload whose GPUs were held below their clocks for a fifth of its GPU time or more (the digest's THROTTLED_PCT,
# an estimate of where the slowdown is measurable) is named, whatever its class.
MIN_THROTTLED_SHARE = 0.2
SERVING = frozenset({WorkloadClass.INFERENCE, WorkloadClass.INTERACTIVE})


NODE_GPUS = 8  # the most GPUs of one model a node is taken to hold where the site's nodes are not known


def cost_on(catalog: Catalog, demand: Demand, current: GpuType, target: GpuType, most: int = NODE_GPUS) -> float | None:
    """US$ a month for the workload's current work on ``target``: at its own GPU count, or at the count a serving
    workload needs there (at most ``most``); None when it cannot run there."""
    if fit_problem(catalog, demand, current, target) is None:
        return monthly_cost(catalog, demand, current, target)
    bigger = grown(catalog, demand, current, target, most)
    return monthly_cost(catalog, bigger, current, target) if bigger is not None else None


def cheapest_fit(
    catalog: Catalog, demand: Demand, current: GpuType, among: Collection[str] | None = None
) -> tuple[GpuType, float]:
    """The catalog GPU (of the keys ``among``, default all) where this workload's current work costs least per
    month, and that cost."""
    best, best_cost = current, monthly_cost(catalog, demand, current, current)
    for target in catalog.gpu:
        if among is not None and target.key not in among:
            continue
        cost = cost_on(catalog, demand, current, target)
        if cost is not None and cost < best_cost:
            best, best_cost = target, cost
    return best, best_cost


def _finding(
    r: Resolved, kind: FindingKind, waste: float, confidence: float, detail: str, fix: str | None = None
) -> Finding:
    assert r.hardware is not None
    return Finding(
        workload=r.w.id,
        workload_name=r.w.name,
        kind=kind,
        hardware=r.hardware.name,
        nodes=r.w.nodes,
        wasted_usd_per_hour=round(waste, 3),
        confidence=round(confidence, 2),
        detail=detail,
        fix=fix,
    )


def throttled(r: Resolved) -> Finding | None:
    """A workload whose GPUs ran held below their clocks, by what, and the GPU time paid while they did."""
    t, hw = r.w.throttling, r.hardware
    if t is None or hw is None or t.share < MIN_THROTTLED_SHARE:
        return None
    # An estimate: the GPU-hours paid while its GPUs ran slowed, not the share of speed lost (the clocks it lost are
    # not in the window).
    cost = t.share * r.w.gpus * r.w.share * hw.price_per_gpu_hour
    tdp = hw.datasheet.tdp_w
    reasons = {
        "thermal": (t.thermal, "held down by heat (thermal slowdown)"),
        "power": (
            t.power,
            f"held at a power limit of {t.power_limit_w:.0f} W, {t.power_limit_w / tdp:.0%} of its {tdp:.0f} W TDP"
            if t.power_limit_w is not None
            else f"held at a power limit below its {tdp:.0f} W TDP",
        ),
        "hw": (
            t.hw_slowdown,
            "held down by the hardware slowdown signal (HW_SLOWDOWN: the power brake, a power supply)",
        ),
    }
    worst = max(reasons, key=lambda k: reasons[k][0])
    ordered = sorted(reasons.values(), reverse=True)
    named = "; ".join(f"{what} for {share:.0%} of its GPU time" for share, what in ordered if share > 0)
    detail = f"{named}; ~${cost:.2f}/h of GPU time paid while slowed (an estimate: {t.share:.0%} of its GPUs' price)"
    return _finding(r, FindingKind.THROTTLED_GPU, cost, 1.0, detail, _THROTTLE_FIX[worst])


_THROTTLE_FIX = {
    "thermal": "check cooling and airflow: inlet temperature, fans, blanking panels, a blocked or failed heatsink "
    "(nvidia-smi -q -d TEMPERATURE,PERFORMANCE shows the slowdown)",
    "power": "check the power limit: nvidia-smi -q -d POWER shows it; raise it with nvidia-smi -pl to the default, "
    "or ask why the site's power capping (DCGM, the BMC) holds it below TDP",
    "hw": "check the node's power supplies and the power-brake signal (BMC event log, PSU status and redundancy); "
    "HW_SLOWDOWN also fires at extreme heat",
}


@dataclass(frozen=True, slots=True)
class Planned:
    """What the plan does with a workload: the hardware it puts it on, its monthly cost there, its GPUs."""

    target: GpuType
    monthly_cost: float
    gpus: float


def _compared_with(
    catalog: Catalog, r: Resolved, planned: Mapping[str, Planned], present: Collection[str] | None
) -> tuple[float, str]:
    """(monthly cost, words for it) of what a finding names: the plan's action when the plan acts on the workload;
    else the cheapest fit among the site's hardware; else the cheapest in the catalog, said to be elsewhere."""
    assert r.hardware is not None
    if r.w.id in planned:
        p = planned[r.w.id]
        if p.target.key == r.hardware.key:
            return p.monthly_cost, f"{p.gpus:g} of its {r.w.gpus} GPUs (the plan's right-size)"
        return p.monthly_cost, f"{p.target.name} (the plan's move)"
    if present is not None:
        target, cost = cheapest_fit(catalog, r.w.demand, r.hardware, among=present)
        if target.key != r.hardware.key:
            return cost, target.name
    target, cost = cheapest_fit(catalog, r.w.demand, r.hardware)
    elsewhere = " (not in this site)" if present is not None and target.key not in present else ""
    return cost, f"{target.name}{elsewhere}"


def detect(
    catalog: Catalog,
    workloads: Iterable[Resolved],
    planned: Mapping[str, Planned] | None = None,
    present: Collection[str] | None = None,
) -> list[Finding]:
    """Findings for classified workloads, most wasteful first. ``planned``: what the plan does with each workload
    it acts on, named instead of any other hardware; ``present``: the site's hardware keys."""
    hours = catalog.defaults.hours_per_month
    workloads = list(workloads)
    out = rest_of_node((r.w, r.hardware) for r in workloads)  # GPUs waiting on the rest of their node
    for r in workloads:
        w, hw, cls = r.w, r.hardware, r.w.workload_class
        slowed = throttled(r)
        if slowed is not None:  # whatever its class: the GPU is slow, not the workload misplaced
            out.append(slowed)
        if hw is None or cls is WorkloadClass.UNKNOWN:
            continue
        conf = w.confidence
        now = monthly_cost(catalog, w.demand, hw, hw) / hours
        cost, better = _compared_with(catalog, r, planned or {}, present)
        saving = now - cost / hours
        if cls is WorkloadClass.IDLE:
            out.append(
                _finding(
                    r,
                    FindingKind.IDLE_ALLOCATION,
                    now,
                    conf,
                    f"{w.gpus} × {hw.name} held at {w.mean_util:.0f} % utilisation",
                )
            )
        elif w.util_unavailable is not None and cls is not WorkloadClass.TRAINING:
            continue  # what it would need elsewhere rests on a load nobody measured (MIG before Hopper)
        elif cls in SERVING and hw.nvlink and hw.rdma and saving >= MIN_WASTE_USD_PER_HOUR:
            out.append(
                _finding(
                    r,
                    FindingKind.SERVING_ON_TRAINING_HARDWARE,
                    saving,
                    conf,
                    f"{cls.value} at {w.mean_util:.0f} % holds NVLink and {hw.fabric_name} GPUs; "
                    f"{better} would serve it",
                )
            )
        elif cls is WorkloadClass.TRAINING and r.multi_node and not hw.rdma:
            waste = now * (1 - catalog.defaults.pcie_training_scaling.value)
            out.append(
                _finding(
                    r,
                    FindingKind.MULTI_NODE_WITHOUT_RDMA,
                    waste,
                    conf,
                    f"training across {len(w.nodes)} nodes without an RDMA fabric",
                )
            )
        elif cls is WorkloadClass.TRAINING and w.gpus > 1 and not hw.nvlink and saving >= MIN_WASTE_USD_PER_HOUR:
            out.append(
                _finding(
                    r,
                    FindingKind.TRAINING_WITHOUT_NVLINK,
                    saving,
                    conf,
                    f"{w.gpus}-GPU training synchronises gradients over PCIe",
                )
            )
        elif r.mem_fraction < 0.25 and w.mean_util < 30 and saving >= MIN_WASTE_USD_PER_HOUR:
            out.append(
                _finding(
                    r,
                    FindingKind.OVERSIZED_GPU_MEMORY,
                    saving,
                    conf * 0.8,
                    f"uses {r.mem_fraction:.0%} of each GPU's memory at {w.mean_util:.0f} %; {better} is enough",
                )
            )
    out.sort(key=lambda x: -x.wasted_usd_per_hour)
    return out


def uncatalogued(catalog: Catalog, nodes: Iterable[SnapshotNode]) -> list[Finding]:
    """A node whose GPU the catalog does not know: planned around (its work stays, nothing moves onto it)."""
    out = []
    for n in nodes:
        if hardware_of(catalog, n.hardware, n.pci_id) is None:
            out.append(
                Finding(
                    workload=f"node/{n.name}",
                    workload_name=n.name,
                    kind=FindingKind.UNCATALOGUED_HARDWARE,
                    hardware=n.hardware[:96],
                    nodes=[n.name],
                    wasted_usd_per_hour=0.0,
                    confidence=1.0,
                    detail=f"uncatalogued hardware: add an entry for {n.hardware!r} to the catalog; "
                    f"its {n.gpus} GPU(s) keep their work and receive none until then",
                )
            )
    return out
