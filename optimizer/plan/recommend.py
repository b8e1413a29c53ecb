"""From a fleet snapshot to a plan: let the planner move the misplaced workloads, explain each move in words a
capacity team acts on, and say why the misplacements it does not move stay where they are."""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agent.protocol import Blocked, Plan, Projection, Recommendation, WorkloadClass, WorkloadView
from optimizer.decide.catalog import Catalog, GpuType
from optimizer.decide.costs import (
    MAX_PROJECTED_MEAN_UTIL,
    MAX_PROJECTED_P95_UTIL,
    MEMORY_HEADROOM,
    THROUGHPUT_BOUND,
    Demand,
    fit_problem,
    monthly_cost,
    projected,
    speedup,
    spread,
)
from optimizer.decide.findings import NODE_GPUS, Planned, cost_on, detect, uncatalogued
from optimizer.decide.snapshot import Resolved, Snapshot, SnapshotNode, WorkloadNeeds, from_fleet, hardware_of, resolve
from optimizer.ingest.fleet import Fleet
from optimizer.ingest.shares import share_units
from optimizer.plan.interrupt import SolveStop
from optimizer.plan.model import Solution, solve
from optimizer.plan.ordering import Action, order
from optimizer.plan.problem import WORK_PER_SECOND, Host, Kept, Movable, Needs, NodeSlot, Problem
from optimizer.plan.purchases import purchases
from optimizer.plan.render import order_key

Risk = Literal["low", "medium", "high"]
COLD_START_HOURS = 30 / 3600  # a large model takes 10-30 s to load
LOST_TRAINING_HOURS = 0.5  # work lost on restart: half of an hourly checkpoint interval
SHARE_UNITS = 100  # capacity units per GPU when the snapshot has shares of GPUs (a share rounds up)


class PlanSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_moves: int = Field(default=20, ge=0)
    min_confidence: float = Field(default=0.6, ge=0, le=1)
    min_monthly_savings: float = Field(default=100.0, ge=0)
    min_savings_fraction: float = Field(default=0.10, ge=0, lt=1)
    move_cost_usd: float = Field(default=20.0, ge=0, description="fixed disruption cost of any move")
    time_limit: float = Field(default=10.0, gt=0, le=600)
    work_limit: float | None = Field(
        default=None,
        gt=0,
        le=600,
        description="CP-SAT's deterministic work limit, in its deterministic seconds (default: a tenth of time_limit)",
    )
    keep_margin_usd: float = Field(
        default=100.0, ge=0, description="a plan replaces an open action only if it saves this much more a month"
    )
    keep_margin_fraction: float = Field(
        default=0.10, ge=0, le=10, description="... or this share of the open action's monthly saving, if more"
    )
    pinned: list[str] = Field(default_factory=list, description="workload ids or glob patterns never moved")
    pools: bool = Field(default=True, description="solve identical nodes with free room as pools")
    reclaim_idle: bool = Field(default=True, description="release idle allocations instead of moving them")
    right_size: bool = Field(default=True, description="online inference may hold fewer GPUs if its peak fits")
    sharing: dict[str, float] = Field(
        default_factory=dict,
        description='hardware key → the smallest share of one GPU a one-GPU service may take there, e.g. {"l4": 0.25}',
    )

    @field_validator("sharing")
    @classmethod
    def _shares(cls, value: dict[str, float]) -> dict[str, float]:
        bad = sorted(key for key, share in value.items() if not 0.01 <= share < 1)
        if bad:
            raise ValueError(f"sharing: the smallest share must be at least 0.01 and under 1 ({', '.join(bad)})")
        return value

    history_min_hours: float = Field(
        default=24.0, ge=0, description="load history needed before an allocation is released or resized"
    )
    buy: bool = Field(default=True, description="say what buying capacity for blocked moves would return")
    buy_time_limit: float | None = Field(
        default=None, gt=0, le=600, description="seconds for that beyond time_limit (default: what time_limit leaves)"
    )


def recommendation_id(workload: str, from_node: str, to_hardware: str) -> str:
    # a right-size's target is its own hardware, a reclaim's is "reclaim": each action of a workload has its own id
    """Stable across solves: the same move keeps its id whichever free node of that hardware it lands on."""
    return hashlib.sha256(f"{workload}|{from_node}|{to_hardware}".encode()).hexdigest()[:16]


def site_scoped(site: str, rec_id: str) -> str:
    """An action's id within its site: node and workload names repeat across sites, and ids key the lifecycle."""
    return hashlib.sha256(f"{site}|{rec_id}".encode()).hexdigest()[:16]


def _label(cls: WorkloadClass) -> str:
    return cls.value.replace("_", " ")


def _reason(r: Resolved, target: GpuType) -> str:
    w, hw, cls = r.w, r.hardware, r.w.workload_class
    assert hw is not None
    if cls is WorkloadClass.IDLE:
        return (
            f"idle allocation: {w.gpus} × {hw.name} held at {w.mean_util:.0f} % — "
            f"release it or park it on {target.name}"
        )
    if cls is WorkloadClass.TRAINING and w.gpus > 1 and not hw.nvlink and target.nvlink:
        return (
            f"{w.gpus}-GPU training on {hw.name} without NVLink synchronises gradients over PCIe; "
            f"{target.name} does the same work for less"
        )
    if cls not in THROUGHPUT_BOUND and hw.nvlink and hw.rdma:
        return (
            f"{_label(cls)} at {w.mean_util:.0f} % mean utilisation holds {w.gpus} × {hw.name} "
            f"(training-class hardware: NVLink and {hw.fabric_name}); {target.name} serves the same load"
        )
    return f"{_label(cls)} runs cheaper per unit of work on {target.name} than on {hw.name}"


def _impact(catalog: Catalog, r: Resolved, target: GpuType, gpus: int | None = None) -> tuple[str, Risk]:
    """(expected performance impact, risk) of moving ``r`` to ``target`` (on ``gpus`` GPUs if resized)."""
    assert r.hardware is not None
    d = r.w.demand if gpus is None or gpus == r.w.gpus else spread(catalog, r.w.demand, target, gpus)
    ratio = speedup(catalog, d, r.hardware, target)
    risk: Risk = "high" if r.w.confidence < 0.75 else "low"
    if d.workload_class is WorkloadClass.IDLE:
        return "none: the allocation is idle", risk
    if d.workload_class in THROUGHPUT_BOUND:
        impact = f"about {ratio:.1f}× the throughput" if ratio >= 1 else f"{1 - ratio:.0%} less throughput, for less"
        return impact, "high" if risk == "high" else "medium"  # a restart from the last checkpoint
    mean, p95 = projected(catalog, d, r.hardware, target)
    measured = all(
        f.method in ("mlperf", "reference") for g in (r.hardware, target) for f in (g.perf.compute, g.perf.memory)
    )
    if (p95 > 85 or d.shape is None or not measured) and risk == "low":
        risk = "medium"  # near its limit, projected without a measured shape, or from datasheet arithmetic
    where = target.name if gpus is None or gpus == r.w.gpus else f"{gpus} × {target.name}"
    return f"utilisation about {mean:.0f} % (p95 {p95:.0f} %) on {where}", risk


def _projection(catalog: Catalog, r: Resolved, target: GpuType, gpus: int, share: float | None = None) -> Projection:
    """The load the action expects of ``r`` on ``gpus`` GPUs (or a ``share`` of one) of ``target``; a
    throughput-bound job keeps its GPUs as busy as before and changes speed instead."""
    assert r.hardware is not None
    d = r.w.demand
    after = spread(catalog, d, target, gpus) if gpus != d.gpus else d
    if share is not None:
        after = replace(after, share=share)
    speed = speedup(catalog, d, r.hardware, target)
    plain = speedup(catalog.with_corrections(()), d, r.hardware, target)
    if d.workload_class in THROUGHPUT_BOUND:
        mean, p95 = d.mean_util, d.p95_util
    else:
        mean, p95 = projected(catalog, after, r.hardware, target)
    return Projection(
        shape=d.shape,
        speed=round(speed, 4),
        catalog_speed=round(plain, 4),
        gpus_before=d.gpus * d.share,
        gpus_after=after.gpus * after.share,
        before_mean_util=round(d.mean_util, 2),
        before_p95_util=round(d.p95_util, 2),
        mean_util=round(min(mean, 10_000), 2),
        p95_util=round(min(p95, 10_000), 2),
    )


def _move_cost(settings: PlanSettings, r: Resolved) -> float:
    assert r.hardware is not None
    hours = LOST_TRAINING_HOURS if r.w.workload_class in THROUGHPUT_BOUND else COLD_START_HOURS
    return settings.move_cost_usd + r.w.gpus * r.w.share * r.hardware.price_per_gpu_hour * hours


NEAR_MISS = 2.0  # a target the workload would overrun by twice or more is no candidate, not a blocked move


def _shortfall(catalog: Catalog, d: Demand, current: GpuType, target: GpuType) -> float:
    """How far ``d`` is from fitting ``target``: its largest need over what the target allows (> 1: too much)."""
    memory = d.mem_mib_per_gpu / (MEMORY_HEADROOM * target.memory_gib * 1024 * d.share)
    if d.workload_class in THROUGHPUT_BOUND or d.workload_class is WorkloadClass.IDLE:
        return memory
    mean, p95 = projected(catalog, d, current, target)
    return max(memory, mean / MAX_PROJECTED_MEAN_UTIL, p95 / MAX_PROJECTED_P95_UTIL)


def _tightest(
    catalog: Catalog, d: Demand, current: GpuType, present: set[str], largest: dict[str, int], worth: float
) -> tuple[GpuType, float, str | None] | None:
    """Among the site's hardware that would save at least ``worth`` a month: the cheapest the workload fits
    (reason None), else the one it comes closest to fitting, with what stops it there (its load, memory or NVLink,
    on as many of those GPUs as a node holds for a service that could spread). None when no hardware in the site
    would save that much even if the workload fitted, or it would overrun every such target ``NEAR_MISS`` times."""
    now = monthly_cost(catalog, d, current, current)
    fitting: list[tuple[float, str, GpuType]] = []
    blocked: list[tuple[float, str, GpuType, str, float]] = []
    for key in sorted(present - {current.key}):
        target = catalog.by_key(key)
        most = largest.get(key, NODE_GPUS)
        cost = cost_on(catalog, d, current, target, most)
        if cost is not None:
            if now - cost >= worth:
                fitting.append((cost, key, target))
            continue
        ideal = monthly_cost(catalog, d, current, target)  # as if it fitted at its own GPU count
        if now - ideal < worth:
            continue
        spreads = d.workload_class is WorkloadClass.INFERENCE and d.share == 1 and most > d.gpus
        widest = spread(catalog, d, target, most) if spreads else d
        why = fit_problem(catalog, widest, current, target)
        short = _shortfall(catalog, widest, current, target)
        if why is not None and short < NEAR_MISS:
            if spreads:
                why += f" (all {most} GPUs of a node)"
            blocked.append((short, key, target, why, now - ideal))
    if fitting:
        cost, _, target = min(fitting)
        return target, now - cost, None
    if blocked:
        _, _, target, why, saving = min(blocked, key=lambda b: (b[0], b[1]))
        return target, saving, why
    return None


def node_host(n: SnapshotNode, classes: Iterable[WorkloadClass] = ()) -> Host:
    """The rest of a snapshot node as the plan weighs it; ``classes``: of the workloads it runs now."""
    held = set(classes)
    return Host(
        cpu_cores_per_gpu=None if n.cpu_cores is None else n.cpu_cores / n.gpus,
        local_nvme=None if n.local_nvme_tb is None else n.local_nvme_tb > 0,
        training=WorkloadClass.TRAINING in held,
        serving=WorkloadClass.INFERENCE in held,
    )


def needs_of(needs: WorkloadNeeds | None) -> Needs | None:
    """A snapshot workload's needs as the plan checks them."""
    if needs is None or (needs.cpu_cores_per_gpu is None and not needs.local_nvme):
        return None
    return Needs(needs.cpu_cores_per_gpu, needs.local_nvme)


def _needs_text(needs: Needs) -> str:
    parts = [f"{needs.cpu_cores_per_gpu:g} CPU cores per GPU"] if needs.cpu_cores_per_gpu is not None else []
    return " and ".join([*parts, *(["local NVMe"] if needs.local_nvme else [])])


def _why_stays(
    catalog: Catalog,
    snapshot: Snapshot,
    present: set[str],
    largest: dict[str, int],
    settings: PlanSettings,
    r: Resolved,
    solution: Solution,
    moves: int,
    nodes: Sequence[NodeSlot],
) -> tuple[str, float] | None:
    """Why a workload that would be cheaper on other hardware of its site is not moved, and what moving it would
    save a month. Only the site's hardware is weighed: what to buy is the purchase section's question. ``nodes``:
    the site's nodes as the plan saw them (catalog key and host)."""
    if r.hardware is None or r.w.workload_class is WorkloadClass.UNKNOWN:
        return None
    d = r.w.demand
    now = monthly_cost(catalog, d, r.hardware, r.hardware)
    worth = max(settings.min_monthly_savings, settings.min_savings_fraction * now)
    found = _tightest(catalog, d, r.hardware, present, largest, worth)
    if found is None:
        return None
    target, saving, misfit = found
    if r.w.pinned:
        return "pinned", saving
    if r.multi_node:
        return "multi-node workloads are not moved automatically", saving
    if r.w.confidence < settings.min_confidence:
        return f"class uncertain (confidence {r.w.confidence:.2f} < {settings.min_confidence:.2f})", saving
    if misfit is not None:
        return misfit, saving
    if r.w.id in solution.blocked:
        return solution.blocked[r.w.id], saving
    needs = needs_of(r.w.needs)
    if needs is not None and not any(n.hardware == target.key and needs.met_by(n.host) for n in nodes):
        return f"no {target.name} node in site {snapshot.site} known to give it {_needs_text(needs)}", saving
    if settings.max_moves == 0:
        return "the plan allows no moves (max moves 0)", saving
    if moves >= settings.max_moves:
        return f"the plan's {settings.max_moves} moves went to bigger savings", saving
    if needs is not None:
        return f"no free {target.name} capacity in site {snapshot.site} on nodes giving it {_needs_text(needs)}", saving
    return f"no free {target.name} capacity in site {snapshot.site}", saving


def _action(r: Resolved, rec_id: str, **what: object) -> Recommendation:
    """An action on ``r``'s workload where it runs now; ``what`` says where it goes, what it saves and why."""
    assert r.hardware is not None
    return Recommendation.model_validate(
        {
            "id": rec_id,
            "workload": r.w.id,
            "workload_name": r.w.name,
            "workload_class": r.w.workload_class,
            "confidence": r.w.confidence,
            "gpus": r.w.gpus,
            "from_node": r.node,
            "from_hardware": r.hardware.name,
            "evidence": list(r.w.evidence),
            **what,
        }
    )


def _reclaim(catalog: Catalog, r: Resolved) -> Recommendation:
    assert r.hardware is not None
    saving = monthly_cost(catalog, r.w.demand, r.hardware, r.hardware)
    return _action(
        r,
        recommendation_id(r.w.id, r.node, "reclaim"),
        to_node=r.node,
        to_hardware=r.hardware.name,
        monthly_savings_usd=round(saving, 2),
        reason=f"idle allocation: {r.w.gpus} × {r.hardware.name} held at {r.w.mean_util:.0f} % — release it",
        performance_impact="none: the allocation is idle; its owner loses the reservation",
        risk="high" if r.w.confidence < 0.75 else "low",
        kind="reclaim",
        gpus_after=0,
    )


def _right_size(catalog: Catalog, r: Resolved, gpus: int, saving: float) -> Recommendation:
    assert r.hardware is not None
    impact, risk = _impact(catalog, r, r.hardware, gpus)
    memory = r.w.mem_mib_per_gpu * r.w.gpus / gpus / 1024
    return _action(
        r,
        recommendation_id(r.w.id, r.node, r.hardware.key),
        to_node=r.node,
        to_hardware=r.hardware.name,
        monthly_savings_usd=round(saving, 2),
        reason=(
            f"{_label(r.w.workload_class)} at {r.w.mean_util:.0f} % (daily peak p95 "
            f"{r.w.demand.p95_util:.0f} %) on {r.w.gpus} × {r.hardware.name}: its peak fits {gpus} GPU(s), "
            f"memory included ({memory:.0f} of {MEMORY_HEADROOM * r.hardware.memory_gib:.0f} GiB usable per GPU)"
        ),
        performance_impact=impact,
        risk=risk,
        kind="right_size",
        gpus_after=gpus,
        projection=_projection(catalog, r, r.hardware, gpus),
    )


def _move(catalog: Catalog, r: Resolved, to_node: str, target: GpuType, gpus: int, saving: float) -> Recommendation:
    assert r.hardware is not None
    impact, risk = _impact(catalog, r, target, gpus)
    reason = _reason(r, target) if target.key != r.hardware.key else "makes room on its node for a move that saves more"
    if gpus < r.w.gpus:
        reason += f"; its daily peak fits {gpus} of them instead of {r.w.gpus}"
    elif gpus > r.w.gpus:
        reason += f"; its load and memory need {gpus} of them instead of {r.w.gpus}"
    same = "room" if target.key == r.hardware.key else ""  # a right-size in place has the plain id
    return _action(
        r,
        recommendation_id(r.w.id, r.node, f"{target.key}:{same}" if same else target.key),
        to_node=to_node,
        to_hardware=target.name,
        monthly_savings_usd=round(saving, 2),
        reason=reason,
        performance_impact=impact,
        risk=risk,
        kind="move",
        gpus_after=gpus if gpus != r.w.gpus else None,
        projection=_projection(catalog, r, target, gpus),
    )


def _consolidate(
    catalog: Catalog, r: Resolved, to_node: str, target: GpuType, share: float, saving: float
) -> Recommendation:
    assert r.hardware is not None
    d = r.w.demand
    ratio = 1 / speedup(catalog, d, r.hardware, target) / share
    risk: Risk = "high" if r.w.confidence < 0.75 else "medium"  # neighbours on the same GPU
    return _action(
        r,
        recommendation_id(r.w.id, r.node, f"{target.key}:shared"),
        to_node=to_node,
        to_hardware=target.name,
        monthly_savings_usd=round(saving, 2),
        reason=(
            f"{_label(r.w.workload_class)} at {d.mean_util:.0f} % (daily peak p95 {d.p95_util:.0f} %) of "
            f"{r.w.gpus} × {r.hardware.name}: {share:.2g} of a shared {target.name} carries it"
        ),
        performance_impact=(
            f"utilisation about {d.mean_util * ratio:.0f} % of its share (p95 {d.p95_util * ratio:.0f} %) on "
            f"{target.name}, beside other services"
        ),
        risk=risk,
        kind="consolidate",
        gpus_after=1 if r.w.gpus > 1 else None,
        gpu_share=share,
        projection=_projection(catalog, r, target, 1, share),
    )


def _in_order(snapshot: Snapshot, node_hw: dict[str, str], recs: list[Recommendation]) -> list[Recommendation]:
    """The recommendations with their wave and what each waits for, in the order to carry them out."""
    room = {n.name: float(n.gpus) for n in snapshot.nodes}
    for w in snapshot.workloads:
        for node in w.nodes:
            room[node] -= w.gpus / len(w.nodes) * w.share
    actions = []
    for rec in sorted(recs, key=lambda x: (-x.monthly_savings_usd, x.id)):
        share = rec.gpu_share or 1.0
        before = rec.gpus * (1.0 if rec.kind == "consolidate" else share)  # consolidation held whole GPUs
        kept = (rec.gpus if rec.gpus_after is None else rec.gpus_after) * share
        if rec.kind in ("move", "consolidate"):
            actions.append(Action(rec.id, rec.from_node, before, rec.to_node, kept))
        else:
            actions.append(Action(rec.id, rec.from_node, before - kept))
    steps = order(actions, room, lambda a, n: a.target is not None and node_hw.get(n) == node_hw.get(a.target))
    placed = [
        rec.model_copy(
            update={
                "wave": steps[rec.id].wave,
                "after": steps[rec.id].after,
                "via_node": steps[rec.id].via_node,
                "via_wave": steps[rec.id].via_wave,
                "swap": steps[rec.id].swap,
            }
        )
        for rec in recs
    ]
    return sorted(placed, key=order_key)


def _planned(catalog: Catalog, recommendations: list[Recommendation], solution: Solution) -> dict[str, Planned]:
    """What the plan does with each workload it moves or resizes, for the findings to name."""
    out = {}
    for rec in recommendations:
        target = hardware_of(catalog, rec.to_hardware)
        if rec.kind == "reclaim" or target is None or rec.workload not in solution.monthly_cost:
            continue
        gpus = rec.gpus_after if rec.gpus_after is not None else rec.gpus
        out[rec.workload] = Planned(target, solution.monthly_cost[rec.workload][1], gpus * (rec.gpu_share or 1.0))
    return out


def keep_margin(settings: PlanSettings, rec: Recommendation) -> float:
    """How much more a month a new plan must save to replace the open action ``rec`` (docs/decisions.md)."""
    return max(settings.keep_margin_usd, settings.keep_margin_fraction * rec.monthly_savings_usd)


def _kept(settings: PlanSettings, movable: list[Movable], open_actions: Iterable[Recommendation]) -> dict[str, Kept]:
    """The open actions the planner should keep, by workload: those on a workload that is still where the action
    found it (a release is not the planner's to keep: it is decided before the solve)."""
    where = {w.id: w.node for w in movable}
    kept: dict[str, Kept] = {}
    for rec in sorted(open_actions, key=lambda x: (-x.monthly_savings_usd, x.id)):
        if rec.kind == "reclaim" or where.get(rec.workload) != rec.from_node or rec.workload in kept:
            continue
        kept[rec.workload] = Kept(rec.to_node, keep_margin(settings, rec))
    return kept


def plan_snapshot(
    snapshot: Snapshot,
    catalog: Catalog,
    settings: PlanSettings,
    now: float | None = None,
    stop: SolveStop | None = None,
    open_actions: Iterable[Recommendation] = (),
) -> Plan:
    """Plan moves for a snapshot (live or offline); ``stop`` cuts its solves short from another thread.
    ``open_actions``: actions earlier plans proposed that are still open (new or acknowledged); each is kept
    unless a different choice saves clearly more (``keep_margin``)."""
    started = time.perf_counter()
    # The same snapshot in any order is the same problem, and gives the same plan.
    snapshot = snapshot.model_copy(
        update={
            "nodes": sorted(snapshot.nodes, key=lambda n: n.name),
            "workloads": sorted(snapshot.workloads, key=lambda w: w.id),
        }
    )
    resolved = resolve(catalog, snapshot)
    # capacity in hundredths of a GPU when some workloads hold a share of one (finer where MIG sevenths or
    # partitions' eighths need it to count exactly), else in whole GPUs
    fractions = [w.share for w in snapshot.workloads if w.share < 1]
    per_gpu = share_units(fractions, SHARE_UNITS) if settings.sharing or fractions else 1
    nodes = []
    for n in snapshot.nodes:
        hw = hardware_of(catalog, n.hardware, n.pci_id)  # as its workloads were resolved: by PCI id where named
        if hw is not None:
            nodes.append(NodeSlot(name=n.name, hardware=hw.key, gpus=n.gpus * per_gpu))
    known = {n.name for n in nodes}
    staying: dict[str, set[WorkloadClass]] = {}  # node -> classes of the workloads that cannot move
    fixed: dict[str, int] = {}
    movable = []
    recommendations = []
    for r in resolved:
        can_move = (
            not r.multi_node
            and r.hardware is not None
            and r.node in known
            and r.w.workload_class is not WorkloadClass.UNKNOWN
            and r.w.confidence >= settings.min_confidence
            and not r.w.pinned
        )
        hours = r.w.history_hours
        a_day = hours is None or hours >= settings.history_min_hours  # idle or quiet all day, not a lull
        if can_move and a_day and settings.reclaim_idle and r.w.workload_class is WorkloadClass.IDLE:
            reclaim = _reclaim(catalog, r)
            if reclaim.monthly_savings_usd >= settings.min_monthly_savings:
                recommendations.append(reclaim)  # its GPUs are free for the rest of the plan
                continue
        if can_move:
            service = r.w.name if r.w.workload_class is WorkloadClass.INFERENCE and r.w.name else None
            needs, scales = needs_of(r.w.needs), r.w.scales_with_load
            movable.append(Movable(r.w.id, r.node, r.w.demand, _move_cost(settings, r), service, a_day, needs, scales))
        else:
            for node in r.w.nodes:
                held = math.ceil(r.w.gpus // len(r.w.nodes) * r.w.share * per_gpu - 1e-9)
                fixed[node] = fixed.get(node, 0) + held
                staying.setdefault(node, set()).add(r.w.workload_class)
    # A node's neighbours for the mixed-node penalty: those that cannot move here; the planner adds the movable
    # ones that have nowhere better to go (optimizer/plan/model.py).
    by_name = {n.name: n for n in snapshot.nodes}
    nodes = [replace(slot, host=node_host(by_name[slot.name], staying.get(slot.name, ()))) for slot in nodes]
    problem = Problem(
        nodes=nodes,
        fixed_usage=fixed,
        movable=movable,
        max_moves=settings.max_moves,
        min_monthly_savings=settings.min_monthly_savings,
        min_savings_fraction=settings.min_savings_fraction,
        time_limit_s=settings.time_limit,
        pools=settings.pools,
        right_size=settings.right_size,
        units=per_gpu,
        sharing=settings.sharing,
        stop=stop,
        kept=_kept(settings, movable, open_actions),
        work_limit=settings.work_limit,
    )
    solution = solve(catalog, problem)
    bought = None
    if settings.buy:
        # within the plan's time limit, less the share the solve keeps for building the plan; its work limit as
        # the plan's own solve, or in proportion to the time limit of its own
        left = settings.time_limit * (1 - problem.post_solve_share) - (time.perf_counter() - started)
        work = problem.work if settings.buy_time_limit is None else WORK_PER_SECOND * settings.buy_time_limit
        bought = purchases(catalog, problem, solution, settings.buy_time_limit or left, work=work)
    node_hw = {n.name: n.hardware for n in nodes}
    for r in resolved:
        target_node = solution.placement.get(r.w.id)
        if target_node is None or r.hardware is None:
            continue
        cost_now, planned = solution.monthly_cost.get(r.w.id, (0.0, 0.0))
        held = solution.gpus.get(r.w.id, r.w.gpus * per_gpu)
        if r.w.share == 1 and held % per_gpu:  # now a share of one GPU, shared with other services
            target = catalog.by_key(node_hw[target_node])
            share = held / per_gpu
            recommendations.append(_consolidate(catalog, r, target_node, target, share, cost_now - planned))
            continue
        # shares move as they are; whole GPUs are counted in multiples of per_gpu units
        gpus = r.w.gpus if r.w.share < 1 else held // per_gpu
        if target_node != r.node:
            target = catalog.by_key(node_hw[target_node])
            recommendations.append(_move(catalog, r, target_node, target, gpus, cost_now - planned))
        elif gpus < r.w.gpus:
            recommendations.append(_right_size(catalog, r, gpus, cost_now - planned))
    shares = {r.w.id: r.w.share for r in resolved if r.w.share < 1}
    recommendations = [
        x if x.kind == "consolidate" else x.model_copy(update={"gpu_share": shares.get(x.workload)})
        for x in recommendations
    ]
    recommendations = [x.model_copy(update={"id": site_scoped(snapshot.site, x.id)}) for x in recommendations]
    recommendations = _in_order(snapshot, node_hw, recommendations)
    moved = {x.workload for x in recommendations}
    moves = sum(1 for x in recommendations if x.kind in ("move", "consolidate") and x.to_node != x.from_node)
    present = {n.hardware for n in nodes}  # catalog keys of the hardware this site has
    largest: dict[str, int] = {}
    for slot in nodes:
        largest[slot.hardware] = max(largest.get(slot.hardware, 0), slot.gpus // per_gpu)
    blocked = []
    for r in resolved:
        if r.w.id in moved:
            continue
        why = _why_stays(catalog, snapshot, present, largest, settings, r, solution, moves, nodes)
        if why is not None and r.hardware is not None:
            blocked.append(
                Blocked(
                    workload=r.w.id,
                    workload_name=r.w.name,
                    node=r.node,
                    hardware=r.hardware.name,
                    reason=why[0],
                    monthly_savings_usd=round(why[1], 2),
                )
            )
    blocked.sort(key=lambda b: (-b.monthly_savings_usd, b.workload))
    views = [
        WorkloadView(
            id=r.w.id,
            name=r.w.name,
            workload_class=r.w.workload_class,
            confidence=r.w.confidence,
            nodes=r.w.nodes,
            hardware=r.hardware.name if r.hardware else next(n.hardware for n in snapshot.nodes if n.name == r.node),
            gpus=r.w.gpus,
            mean_util=round(r.w.mean_util, 1),
            evidence=list(r.w.evidence),
        )
        for r in resolved
    ]
    report = solution.report
    if solution.bound is not None:
        solved = sum(now - planned for now, planned in solution.monthly_cost.values())
        report = report.model_copy(
            update={
                "savings_usd": round(solved, 2),
                "bound_savings_usd": solution.bound.savings,
                "bound_method": solution.bound.method,
            }
        )
    return Plan(
        site=snapshot.site,
        generated_at=time.time() if now is None else now,
        solver=report,
        workloads=views,
        findings=detect(catalog, resolved, _planned(catalog, recommendations, solution), present)
        + uncatalogued(catalog, snapshot.nodes),
        recommendations=recommendations,
        blocked=blocked,
        monthly_savings_usd=round(sum(x.monthly_savings_usd for x in recommendations), 2),
        purchases=bought,
    )


def build_plan(
    fleet: Fleet,
    site: str,
    catalog: Catalog,
    settings: PlanSettings,
    now: float | None = None,
    open_actions: Iterable[Recommendation] = (),
) -> Plan:
    """Classify the site's workloads from telemetry and plan moves for the misplaced ones."""
    return plan_snapshot(from_fleet(fleet, site, settings.pinned), catalog, settings, now, open_actions=open_actions)
