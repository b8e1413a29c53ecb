"""Every plan states an upper bound on what any plan could save, and fleet-scale plans come close to it."""

from __future__ import annotations

import random

import pytest
from test_ordering import _random_fleet, replay

from optimizer.decide.catalog import load_catalog
from optimizer.decide.snapshot import Snapshot, SnapshotNode, SnapshotWorkload
from optimizer.plan.bound import BoundOptions, per_type_bound
from optimizer.plan.problem import NodeSlot, Problem
from optimizer.plan.recommend import PlanSettings, plan_snapshot


@pytest.mark.parametrize("seed", range(6))
def test_no_plan_saves_more_than_the_bound(seed: int) -> None:
    catalog = load_catalog()
    snapshot = _random_fleet(seed)
    for budget in (1, 3, 50):  # the budget binds the bound as it binds the plan
        plan = plan_snapshot(snapshot, catalog, PlanSettings(max_moves=budget, time_limit=5))
        s = plan.solver
        assert s.status == "OPTIMAL" and s.savings_usd is not None and s.bound_savings_usd is not None
        assert s.savings_usd <= s.bound_savings_usd + 0.01


def _fleet(nodes: int, seed: int) -> Snapshot:
    """Five GPU types, about four workloads a node placed with no regard to cost, one node in ten empty."""
    rng = random.Random(seed)
    kinds = ["h200", "h100", "h100", "a100", "a100", "l40s", "l40s", "l4", "l4"]
    memory = {"h200": 141, "h100": 80, "a100": 80, "l40s": 48, "l4": 24}
    out_nodes, workloads = [], []
    for i in range(nodes):
        hw = rng.choice(kinds)
        out_nodes.append(SnapshotNode(name=f"{hw}-{i}", hardware=hw, gpus=8))
        free = 0 if i % 10 == 9 else 8
        j = 0
        while free > 0:
            size = rng.choice([s for s in (1, 1, 1, 2, 2, 4, 8) if s <= free])
            cls = rng.choice(["training", "inference", "inference", "batch_inference", "interactive", "idle"])
            util = {"training": 90.0, "batch_inference": 85.0, "idle": 0.0}.get(cls, rng.uniform(3, 40))
            workloads.append(
                SnapshotWorkload.model_validate(
                    {
                        "id": f"w{i}-{j}",
                        "name": f"svc-{rng.randrange(nodes)}" if cls == "inference" else f"job-{i}-{j}",
                        "class": cls,
                        "confidence": 0.95,
                        "nodes": [out_nodes[-1].name],
                        "gpus": size,
                        "mem_mib_per_gpu": rng.uniform(0.1, 0.85) * memory[hw] * 1024,
                        "mean_util": util,
                        "p95_util": min(100.0, util * 1.6),
                    }
                )
            )
            free -= size
            j += 1
    return Snapshot(site="s", nodes=out_nodes, workloads=workloads)


def test_a_fleet_scale_plan_comes_within_three_percent_of_the_bound_and_fits() -> None:
    snapshot = _fleet(320, 7)  # past the size where every node is a candidate for every workload
    assert len(snapshot.workloads) * len(snapshot.nodes) > 300_000
    plan = plan_snapshot(snapshot, load_catalog(), PlanSettings(max_moves=len(snapshot.workloads), time_limit=10))
    s = plan.solver
    assert s.savings_usd is not None and s.bound_savings_usd is not None
    assert s.bound_savings_usd > 0 and s.savings_usd >= 0.97 * s.bound_savings_usd, s
    assert s.savings_usd <= s.bound_savings_usd + 0.01
    replay(snapshot, plan)  # and it can be carried out in its order


def test_gpus_held_by_a_workload_that_stays_are_no_room_in_the_bound() -> None:
    """An L4 node of 8 GPUs, 6 held by a pinned workload, and four 1-GPU services on an H100 node, each $1,000 a
    month there and $200 on an L4 (made-up costs: the LP reads only these). Only 2 fit on the L4 node, so the best
    any plan can do is 2 x ($1,000 - $200) = $1,600 a month, and the bound is exactly that; with the pinned
    workload's GPUs counted as free it would be 4 x $800 = $3,200. Deliberate bug caught: the bound's capacity
    counted without the GPUs held by workloads that cannot move."""
    problem = Problem(
        nodes=[NodeSlot("l4-1", "l4", 8), NodeSlot("h100-1", "h100", 8)],
        fixed_usage={"l4-1": 6},
        movable=[],
        max_moves=20,
    )
    options = [BoundOptions(f"svc-{i}", "h100", 1000.0, {"h100": (1000.0, 1), "l4": (200.0, 1)}) for i in range(4)]
    bound = per_type_bound(problem, options)
    assert bound is not None
    assert bound.savings == pytest.approx(1600.0, abs=0.01)
    assert sum(f["l4"] for f in bound.fractions.values()) == pytest.approx(2.0)


def test_a_plan_beside_a_pinned_workload_reaches_the_bound() -> None:
    """The same through the planner: a pinned job holds 6 of an L4 node's 8 GPUs, and four 1-GPU services at 5 %
    on an H100 node would each be cheaper on an L4. Two can move, and the plan that moves them is the best there
    is: its bound equals its savings (a bound that ignored the pinned GPUs would promise four moves' worth).
    Deliberate bug caught: the bound's capacity counted without the GPUs held by workloads that cannot move."""
    workloads = [
        SnapshotWorkload.model_validate(
            # a batch job, not training: services moved beside training pay the mixed-node penalty
            {"id": "pinned", "class": "batch_inference", "nodes": ["l4-1"], "gpus": 6, "mean_util": 90.0, "pinned": True}
        )
    ] + [
        SnapshotWorkload.model_validate(
            {"id": f"svc-{i}", "class": "inference", "nodes": ["h100-1"], "gpus": 1, "mean_util": 5.0,
             "p95_util": 8.0, "mem_mib_per_gpu": 8000.0}
        )
        for i in range(4)
    ]  # fmt: skip
    snapshot = Snapshot(
        site="s",
        nodes=[SnapshotNode(name="l4-1", hardware="l4", gpus=8), SnapshotNode(name="h100-1", hardware="h100", gpus=8)],
        workloads=workloads,
    )
    catalog = load_catalog().with_prices({"h100": 2.0, "l4": 0.5})  # made-up prices, so the sums below hold
    plan = plan_snapshot(snapshot, catalog, PlanSettings(max_moves=20, time_limit=5))
    s = plan.solver
    assert s.status == "OPTIMAL" and s.savings_usd is not None and s.bound_savings_usd is not None
    moved = {r.workload for r in plan.recommendations}
    assert len(moved) == 2 and moved <= {f"svc-{i}" for i in range(4)}, plan.recommendations
    # each move frees an H100 for an L4: ($2.00 - $0.50) x 730 hours = $1,095 a month
    assert s.savings_usd == pytest.approx(2 * 1095.0, abs=0.01)
    assert s.bound_savings_usd == pytest.approx(2 * 1095.0, abs=0.01)
