"""From fleet state to a plan: classify every workload, let the planner move the misplaced ones, and explain
each move in words a capacity team acts on."""

from __future__ import annotations

import fnmatch
import hashlib
import time

from pydantic import BaseModel, ConfigDict, Field

from agent.protocol import Plan, Recommendation, WorkloadClass, WorkloadView
from optimizer.catalog import Catalog, GpuType
from optimizer.classify import classify
from optimizer.costs import THROUGHPUT_BOUND, demand_of
from optimizer.features import workload_features
from optimizer.findings import Subject, detect
from optimizer.fleet import Fleet
from optimizer.planner import Movable, NodeSlot, Problem, solve

COLD_START_HOURS = 30 / 3600  # a large model takes 10-30 s to load
LOST_TRAINING_HOURS = 0.5  # work lost on restart: half of an hourly checkpoint interval


class PlanSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_moves: int = Field(default=20, ge=0)
    min_confidence: float = Field(default=0.6, ge=0, le=1)
    min_monthly_savings: float = Field(default=100.0, ge=0)
    min_savings_fraction: float = Field(default=0.10, ge=0, lt=1)
    move_cost_usd: float = Field(default=20.0, ge=0, description="fixed disruption cost of any move")
    time_limit: float = Field(default=10.0, gt=0, le=600)
    pinned: list[str] = Field(default_factory=list, description="workload ids or glob patterns never moved")


Assessed = Subject


def recommendation_id(workload: str, from_node: str, to_hardware: str) -> str:
    """Stable across solves: the same move keeps its id whichever free node of that hardware it lands on."""
    return hashlib.sha256(f"{workload}|{from_node}|{to_hardware}".encode()).hexdigest()[:16]


def _reason(a: Assessed, target: GpuType) -> str:
    f, cls, hw = a.features, a.result.workload_class, a.hardware
    assert hw is not None
    if cls is WorkloadClass.IDLE:
        return (
            f"idle allocation: {f.gpus} × {hw.name} held at {f.mean_util:.0f} % — "
            f"release it or park it on {target.name}"
        )
    if cls is WorkloadClass.TRAINING and f.gpus > 1 and not hw.nvlink and target.nvlink:
        return (
            f"{f.gpus}-GPU training on {hw.name} without NVLink synchronises gradients over PCIe; "
            f"{target.name} does the same work for less"
        )
    if cls not in THROUGHPUT_BOUND and hw.nvlink and hw.rdma:
        return (
            f"{cls.value.replace('_', ' ')} at {f.mean_util:.0f} % mean utilisation holds {f.gpus} × {hw.name} "
            f"(training-class hardware: NVLink and {hw.fabric_name}); {target.name} serves the same load"
        )
    return f"{cls.value.replace('_', ' ')} runs cheaper per unit of work on {target.name} than on {hw.name}"


def _move_cost(settings: PlanSettings, a: Assessed) -> float:
    assert a.hardware is not None
    hours = LOST_TRAINING_HOURS if a.result.workload_class in THROUGHPUT_BOUND else COLD_START_HOURS
    return settings.move_cost_usd + a.features.gpus * a.hardware.price_per_gpu_hour * hours


def _pinned(settings: PlanSettings, workload: str) -> bool:
    return any(fnmatch.fnmatchcase(workload, p) for p in settings.pinned)


def build_plan(fleet: Fleet, site: str, catalog: Catalog, settings: PlanSettings, now: float | None = None) -> Plan:
    """Classify the site's workloads and plan moves for the misplaced ones."""
    assessed = [
        Assessed(f, classify(f), catalog.lookup(f.placements[0].gpu_model)) for f in workload_features(fleet, site)
    ]
    nodes = []
    for (rec_site, name), record in sorted(fleet.nodes.items()):
        if rec_site != site or record.birth is None or not record.birth.gpus:
            continue
        hw = catalog.lookup(record.birth.gpus[0].model)
        if hw is not None:
            nodes.append(NodeSlot(name=name, hardware=hw.key, gpus=len(record.birth.gpus)))
    known = {n.name for n in nodes}
    fixed: dict[str, int] = {}
    movable = []
    for a in assessed:
        f = a.features
        can_move = (
            not f.multi_node
            and a.hardware is not None
            and f.nodes[0] in known
            and a.result.workload_class is not WorkloadClass.UNKNOWN
            and a.result.confidence >= settings.min_confidence
            and not _pinned(settings, f.id)
        )
        if can_move:
            demand = demand_of(f, a.result.workload_class)
            movable.append(Movable(f.id, f.nodes[0], demand, _move_cost(settings, a)))
        else:
            for p in f.placements:
                fixed[p.node] = fixed.get(p.node, 0) + len(p.gpus)
    problem = Problem(
        nodes=nodes,
        fixed_usage=fixed,
        movable=movable,
        max_moves=settings.max_moves,
        min_monthly_savings=settings.min_monthly_savings,
        min_savings_fraction=settings.min_savings_fraction,
        time_limit_s=settings.time_limit,
    )
    solution = solve(catalog, problem)
    node_hw = {n.name: n.hardware for n in nodes}
    by_id = {a.features.id: a for a in assessed}
    recommendations = []
    for wid, target_node in sorted(solution.placement.items()):
        a = by_id[wid]
        if target_node == a.features.nodes[0] or a.hardware is None:
            continue
        target = catalog.by_key(node_hw[target_node])
        now_cost, planned = solution.monthly_cost[wid]
        recommendations.append(
            Recommendation(
                id=recommendation_id(wid, a.features.nodes[0], target.key),
                workload=wid,
                workload_name=a.features.name,
                workload_class=a.result.workload_class,
                confidence=a.result.confidence,
                gpus=a.features.gpus,
                from_node=a.features.nodes[0],
                from_hardware=a.hardware.name,
                to_node=target_node,
                to_hardware=target.name,
                monthly_savings_usd=round(now_cost - planned, 2),
                reason=_reason(a, target),
                evidence=list(a.result.evidence),
            )
        )
    recommendations.sort(key=lambda r: -r.monthly_savings_usd)
    views = [
        WorkloadView(
            id=a.features.id,
            name=a.features.name,
            workload_class=a.result.workload_class,
            confidence=a.result.confidence,
            nodes=a.features.nodes,
            hardware=a.hardware.name if a.hardware else a.features.placements[0].gpu_model,
            gpus=a.features.gpus,
            mean_util=round(a.features.mean_util, 1),
            evidence=list(a.result.evidence),
        )
        for a in assessed
    ]
    return Plan(
        site=site,
        generated_at=time.time() if now is None else now,
        solver=solution.report,
        workloads=views,
        findings=detect(catalog, assessed),
        recommendations=recommendations,
        monthly_savings_usd=round(sum(r.monthly_savings_usd for r in recommendations), 2),
    )
