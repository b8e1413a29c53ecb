"""Stable plans: the same snapshot gives the same plan (in any order, in another process), and an open action is
kept unless a different choice saves clearly more than its margin."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
from pathlib import Path

import pytest
from conftest import FLEETFIT

from agent.protocol import Plan, Recommendation
from collectors.sim.profiles import PROFILES
from collectors.sim.scenarios import build_scenario
from collectors.sim.spec import Pattern
from collectors.sim.speed import memory_share
from optimizer.commands.offline import PATTERN_CLASS
from optimizer.decide.catalog import load_catalog
from optimizer.decide.snapshot import Snapshot, SnapshotNode, SnapshotWorkload
from optimizer.plan.model import solve
from optimizer.plan.problem import Kept, Movable, NodeSlot, Problem
from optimizer.plan.recommend import PlanSettings, keep_margin, plan_snapshot

CATALOG = load_catalog()


def mixed_fleet(nodes: int, seed: int) -> Snapshot:
    """A fleet from the simulator's ``mixed`` scenario (about a fifth misplaced), as bench/plan.py builds it:
    many nodes of each type, so many moves have several equally good targets."""
    scenario = build_scenario("mixed", nodes, seed)
    out_nodes = [SnapshotNode(name=n.name, hardware=n.profile, gpus=PROFILES[n.profile].gpus) for n in scenario]
    workloads = []
    for n in scenario:
        memory = PROFILES[n.profile].memory_mib
        for w in n.workloads:
            online = w.pattern is Pattern.INFERENCE
            workloads.append(
                SnapshotWorkload(
                    id=w.id,
                    name=w.name,
                    workload_class=PATTERN_CLASS[w.pattern.value],
                    confidence=0.95,
                    nodes=[n.name],
                    gpus=len(w.gpus),
                    mem_mib_per_gpu=w.mem_fraction * memory,
                    mean_util=w.level * 100 * (0.6 if online else 1.0),
                    p95_util=min(100.0, w.level * 100 * (1.6 if online else 1.05)),
                    shape=memory_share(w),  # as the agents would measure it (GPM's DRAM against tensor activity)
                )
            )
    return Snapshot(site="lab", nodes=out_nodes, workloads=workloads)


def shuffled(snapshot: Snapshot, seed: int) -> Snapshot:
    rng = random.Random(seed)
    nodes, workloads = list(snapshot.nodes), list(snapshot.workloads)
    rng.shuffle(nodes)
    rng.shuffle(workloads)
    return snapshot.model_copy(update={"nodes": nodes, "workloads": workloads})


def actions(plan: Plan) -> list[tuple[object, ...]]:
    """What a team acts on: each action's id, kind, target, size, wave, dependencies and saving."""
    return [
        (r.id, r.kind, r.to_node, r.to_hardware, r.gpus_after, r.gpu_share, r.wave, r.after, r.via_node, r.swap,
         r.monthly_savings_usd)
        for r in plan.recommendations
    ]  # fmt: skip


# ------------------------------------------------------------------------------------------ determinism


def test_the_same_snapshot_in_any_order_gives_the_same_plan() -> None:
    snapshot = mixed_fleet(60, seed=3)
    settings = PlanSettings(time_limit=10)
    first = plan_snapshot(snapshot, CATALOG, settings)
    assert len(first.recommendations) >= 10  # enough moves with several equally good targets to tell apart
    again = plan_snapshot(snapshot, CATALOG, settings)
    reordered = plan_snapshot(shuffled(snapshot, 1), CATALOG, settings)
    reversed_ = snapshot.model_copy(update={"nodes": snapshot.nodes[::-1], "workloads": snapshot.workloads[::-1]})
    backwards = plan_snapshot(reversed_, CATALOG, settings)
    assert actions(again) == actions(first)
    assert actions(reordered) == actions(first)
    assert actions(backwards) == actions(first)
    assert [b.model_dump() for b in reordered.blocked] == [b.model_dump() for b in first.blocked]
    assert first.monthly_savings_usd == reordered.monthly_savings_usd == backwards.monthly_savings_usd


def test_the_same_snapshot_gives_the_same_plan_in_another_process(tmp_path: Path) -> None:
    """`fleetfit plan` twice, each process with its own string hashing (set and dict order of names differ) and
    the second with the snapshot listed in another order."""
    snapshot = mixed_fleet(40, seed=11)
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    one.write_text(snapshot.model_dump_json(by_alias=True))
    two.write_text(shuffled(snapshot, 2).model_dump_json(by_alias=True))
    plans = []
    for path, seed in ((one, "1"), (two, "2")):
        result = subprocess.run(
            [FLEETFIT, "plan", str(path), "--format", "json"],
            capture_output=True,
            text=True,
            timeout=120,
            env=os.environ | {"PYTHONHASHSEED": seed},
            check=True,
        )
        plans.append(Plan.model_validate(json.loads(result.stdout)))
    assert plans[0].recommendations
    assert actions(plans[0]) == actions(plans[1])


# ------------------------------------------------------------------------------------------ keeping open actions


def _service(wid: str, node: str, util: float = 3.0) -> SnapshotWorkload:
    """A one-GPU service far below what its H100 is for: any cheaper card carries it."""
    return SnapshotWorkload.model_validate(
        {
            "id": wid,
            "name": wid,
            "class": "inference",
            "confidence": 0.95,
            "nodes": [node],
            "gpus": 1,
            "mem_mib_per_gpu": 6_000,
            "mean_util": util,
            "p95_util": util * 1.3,
        }
    )


def _site(*nodes: tuple[str, str, int], workloads: list[SnapshotWorkload] | None = None) -> Snapshot:
    return Snapshot(
        site="lab",
        nodes=[SnapshotNode(name=n, hardware=hw, gpus=g) for n, hw, g in nodes],
        workloads=workloads if workloads is not None else [_service("svc", "h100-1")],
    )


def _moves(plan: Plan) -> dict[str, Recommendation]:
    return {r.workload: r for r in plan.recommendations if r.kind == "move"}


def test_equal_cost_targets_keep_the_earlier_choice() -> None:
    snapshot = _site(("h100-1", "h100", 8), ("l40s-a", "l40s", 8), ("l40s-b", "l40s", 8))
    settings = PlanSettings(pools=False)
    fresh = _moves(plan_snapshot(snapshot, CATALOG, settings))["svc"]
    assert fresh.to_hardware == CATALOG.by_key("l40s").name  # cheaper, and the only other hardware
    # an earlier plan sent it to the other, equally good node: that choice stays, and so does the action's id
    other = "l40s-b" if fresh.to_node == "l40s-a" else "l40s-a"
    earlier = fresh.model_copy(update={"to_node": other})
    for _ in range(2):
        kept = _moves(plan_snapshot(snapshot, CATALOG, settings, open_actions=[earlier]))["svc"]
        assert (kept.id, kept.to_node, kept.monthly_savings_usd) == (fresh.id, other, fresh.monthly_savings_usd)
        earlier = kept


def test_a_pooled_target_keeps_the_member_the_earlier_plan_named() -> None:
    spare = [(f"l40s-{i}", "l40s", 8) for i in range(1, 7)]
    snapshot = _site(("h100-1", "h100", 8), *spare)
    fresh = _moves(plan_snapshot(snapshot, CATALOG, PlanSettings()))["svc"]
    assert fresh.to_node == "l40s-1"  # identical idle nodes are a pool; the first member takes it
    earlier = fresh.model_copy(update={"to_node": "l40s-4"})
    kept = _moves(plan_snapshot(snapshot, CATALOG, PlanSettings(), open_actions=[earlier]))["svc"]
    assert (kept.id, kept.to_node) == (fresh.id, "l40s-4")


def _two_targets() -> tuple[Snapshot, Recommendation, Recommendation]:
    """The service with one L40S and one L4 node to go to, and its move to each, planned alone (independently)."""
    both = _site(("h100-1", "h100", 8), ("l40s-1", "l40s", 8), ("l4-1", "l4", 8))
    only_l40s = _site(("h100-1", "h100", 8), ("l40s-1", "l40s", 8))
    only_l4 = _site(("h100-1", "h100", 8), ("l4-1", "l4", 8))
    to_l40s = _moves(plan_snapshot(only_l40s, CATALOG, PlanSettings()))["svc"]
    to_l4 = _moves(plan_snapshot(only_l4, CATALOG, PlanSettings()))["svc"]
    assert to_l4.monthly_savings_usd > to_l40s.monthly_savings_usd  # the L4 is the better target
    return both, to_l40s, to_l4


def test_a_clearly_better_target_replaces_the_open_action() -> None:
    both, to_l40s, to_l4 = _two_targets()
    settings = PlanSettings()
    assert to_l4.monthly_savings_usd - to_l40s.monthly_savings_usd > keep_margin(settings, to_l40s)
    assert _moves(plan_snapshot(both, CATALOG, settings))["svc"].to_node == "l4-1"
    replaced = _moves(plan_snapshot(both, CATALOG, settings, open_actions=[to_l40s]))["svc"]
    assert (replaced.id, replaced.to_node) == (to_l4.id, "l4-1")


@pytest.mark.parametrize(("delta", "target"), [(-1.0, "l4-1"), (+1.0, "l40s-1")])
def test_the_open_action_stays_unless_the_alternative_saves_more_than_its_margin(delta: float, target: str) -> None:
    both, to_l40s, to_l4 = _two_targets()
    better_by = to_l4.monthly_savings_usd - to_l40s.monthly_savings_usd
    settings = PlanSettings(keep_margin_usd=better_by + delta, keep_margin_fraction=0.0)
    plan = plan_snapshot(both, CATALOG, settings, open_actions=[to_l40s])
    assert _moves(plan)["svc"].to_node == target


def test_an_open_action_that_no_longer_qualifies_is_withdrawn() -> None:
    snapshot = _site(("h100-1", "h100", 8), ("l40s-1", "l40s", 8))
    earlier = _moves(plan_snapshot(snapshot, CATALOG, PlanSettings()))["svc"]
    # the service got busy: the L40S no longer carries its peak, whatever an earlier plan said
    busy = _site(("h100-1", "h100", 8), ("l40s-1", "l40s", 8), workloads=[_service("svc", "h100-1", util=70.0)])
    plan = plan_snapshot(busy, CATALOG, PlanSettings(keep_margin_usd=1e6), open_actions=[earlier])
    assert "svc" not in _moves(plan)


def test_an_open_action_loses_the_move_budget_only_to_a_clearly_bigger_saving() -> None:
    nodes = [("h100-1", "h100", 8), ("h100-2", "h100", 8), ("l40s-1", "l40s", 8)]
    small = _service("small", "h100-1", util=3.0)
    # the same service twice over: two GPUs, so moving it saves about twice as much
    big = _service("big", "h100-2", util=3.0).model_copy(update={"gpus": 2})
    snapshot = _site(*nodes, workloads=[small, big])
    settings = PlanSettings(max_moves=1, right_size=False)
    alone = _site(*nodes, workloads=[small])
    open_small = _moves(plan_snapshot(alone, CATALOG, settings))["small"]
    fresh = _moves(plan_snapshot(snapshot, CATALOG, settings))
    assert list(fresh) == ["big"]  # the bigger saving takes the one move
    gain = fresh["big"].monthly_savings_usd - open_small.monthly_savings_usd
    assert gain > 0
    kept = plan_snapshot(
        snapshot, CATALOG, settings.model_copy(update={"keep_margin_usd": gain + 1}), open_actions=[open_small]
    )
    assert list(_moves(kept)) == ["small"]
    replaced = plan_snapshot(
        snapshot, CATALOG, settings.model_copy(update={"keep_margin_usd": gain - 1}), open_actions=[open_small]
    )
    assert list(_moves(replaced)) == ["big"]


def test_the_planner_never_makes_a_plan_infeasible_to_keep_an_action() -> None:
    """An open action whose node has since filled up is a preference the planner cannot honour: the plan is
    still feasible and sends the workload elsewhere or nowhere."""
    nodes = [NodeSlot("h100-1", "h100", 8), NodeSlot("l40s-1", "l40s", 8), NodeSlot("l40s-2", "l40s", 8)]
    snapshot = _site(("h100-1", "h100", 8), ("l40s-1", "l40s", 8))
    demand = snapshot.workloads[0].demand
    movable = [Movable("svc", "h100-1", demand, 20.0)]
    kept = {"svc": Kept("l40s-1", 1e6)}
    solution = solve(CATALOG, Problem(nodes, {"l40s-1": 8}, movable, kept=kept, pools=False))
    # another node of the action's hardware: the same action, landing where there is room
    assert solution.placement["svc"] == "l40s-2"


async def test_a_live_optimizer_without_new_telemetry_makes_the_same_plan_every_round(tmp_path: Path) -> None:
    """The fleet stops sending: each later round plans from the same telemetry, its open actions in the
    lifecycle, and proposes the same actions in the same waves."""
    from conftest import simulated_fleet

    from optimizer.serve.config import OptimizerConfig, OptimizerSettings
    from optimizer.serve.lifecycle import Lifecycle
    from optimizer.serve.service import Optimizer

    fleet, _ = simulated_fleet("mixed", 24, windows=8, seed=4, site="s")
    config = OptimizerConfig(optimizer=OptimizerSettings(state_dir=tmp_path))
    optimizer = Optimizer(config, CATALOG, lifecycle=Lifecycle.in_state_dir(tmp_path))
    optimizer.fleet = fleet
    rounds = [actions((await optimizer.plan_once())[0]) for _ in range(3)]
    assert optimizer.tracker is not None
    await asyncio.to_thread(optimizer.tracker.close)
    assert len(rounds[0]) >= 3
    assert rounds[1] == rounds[0] and rounds[2] == rounds[0]
