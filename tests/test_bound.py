"""Every plan states an upper bound on what any plan could save, and fleet-scale plans come close to it."""

from __future__ import annotations

import random

import pytest
from test_ordering import _random_fleet, replay

from optimizer.decide.catalog import load_catalog
from optimizer.decide.snapshot import Snapshot, SnapshotNode, SnapshotWorkload
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
