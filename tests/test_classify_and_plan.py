"""Classification of simulated workloads and the CP-SAT plan built from them, without a broker."""

from __future__ import annotations

import pytest
from conftest import simulated_fleet

from agent.protocol import WorkloadClass
from collectors.sim.scenarios import build_scenario
from optimizer.commands.offline import PATTERN_CLASS
from optimizer.decide.catalog import load_catalog
from optimizer.decide.classify import classify
from optimizer.decide.costs import Demand
from optimizer.decide.features import workload_features
from optimizer.plan.model import solve
from optimizer.plan.problem import Movable, NodeSlot, Problem
from optimizer.plan.recommend import PlanSettings, build_plan


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_demo_workloads_are_classified_correctly(seed: int) -> None:
    fleet, truth = simulated_fleet("demo", 12, seed=seed)
    features = workload_features(fleet, "s1")
    assert {f.id for f in features} == set(truth)
    for f in features:
        result = classify(f)
        assert result.workload_class is PATTERN_CLASS[truth[f.id].value], (f.name, result)
        assert result.confidence >= 0.6
        assert result.evidence


def test_too_little_data_is_unknown() -> None:
    fleet, _ = simulated_fleet("demo", 8, windows=2)
    for f in workload_features(fleet, "s1"):
        result = classify(f)
        assert result.workload_class is WorkloadClass.UNKNOWN and result.confidence == 0.0


def test_plan_moves_exactly_the_planted_misplacements() -> None:
    fleet, _ = simulated_fleet("demo", 10)
    planted = {w.id for n in build_scenario("demo", 10, 1) for w in n.workloads if w.id in n.misplaced}
    plan = build_plan(fleet, "s1", load_catalog(), PlanSettings())
    # chat-serving is planted on training hardware, but the cheaper cards of the site cannot carry it: at 25 %
    # (p95 about 40 %) of eight H100s it would run at 40 / 0.38 = 105 % p95 on eight L40S (the catalog's
    # compute-bound figure, GPM measuring it compute-bound), and sixteen do not fit a node. It stays, blocked by
    # that load; every other planted misplacement moves.
    chat = next(w.id for n in build_scenario("demo", 10, 1) for w in n.workloads if w.name == "chat-serving")
    assert {r.workload for r in plan.recommendations} == planted - {chat}
    blocked = {b.workload_name: b.reason for b in plan.blocked}
    assert blocked["chat-serving"].startswith("load would reach") and "on 8 × L40S 48GB" in blocked["chat-serving"]
    assert plan.solver.status == "OPTIMAL"
    assert all(r.monthly_savings_usd > 0 for r in plan.recommendations)
    by_name = {r.workload_name: r for r in plan.recommendations}
    assert "L4 " in by_name["vision-finetune-ddp"].from_hardware
    assert "NVLink" in by_name["vision-finetune-ddp"].reason
    # the same telemetry plans the same moves with the same ids
    again = build_plan(fleet, "s1", load_catalog(), PlanSettings())
    assert [r.id for r in again.recommendations] == [r.id for r in plan.recommendations]


def test_pinned_workloads_and_move_budget_are_honoured_and_explained() -> None:
    fleet, _ = simulated_fleet("demo", 10)
    plan = build_plan(fleet, "s1", load_catalog(), PlanSettings(max_moves=1, pinned=["*"]))
    assert plan.recommendations == []
    assert {b.workload_name: b.reason for b in plan.blocked} == {
        "chat-serving": "pinned",
        "forgotten-notebook-alloc": "pinned",
        "vision-finetune-ddp": "pinned",
    }
    plan = build_plan(fleet, "s1", load_catalog(), PlanSettings(max_moves=1))
    assert len(plan.recommendations) == 1
    # the biggest saving wins the one move: the idle A100s (4 x $2.50 - 4 x $0.85 an hour parked on L40S cards,
    # less than a day of history to release them) over the training job's
    assert plan.recommendations[0].workload_name == "forgotten-notebook-alloc"
    reasons = {b.workload_name: b.reason for b in plan.blocked}
    assert reasons["vision-finetune-ddp"] == "the plan's 1 moves went to bigger savings"
    plan = build_plan(fleet, "s1", load_catalog(), PlanSettings(max_moves=0))
    assert {b.workload_name: b.reason for b in plan.blocked}["vision-finetune-ddp"] == (
        "the plan allows no moves (max moves 0)"
    )
    assert all(b.monthly_savings_usd > 0 for b in plan.blocked)
    # releasing an idle allocation moves nothing, so the move budget does not hold it back
    plan = build_plan(fleet, "s1", load_catalog(), PlanSettings(max_moves=1, history_min_hours=0))
    assert {(r.kind, r.workload_name) for r in plan.recommendations if r.kind != "right_size"} == {
        ("reclaim", "forgotten-notebook-alloc"),
        ("move", "vision-finetune-ddp"),
    }


def test_recommendations_state_impact_and_risk() -> None:
    fleet, _ = simulated_fleet("demo", 10)
    plan = build_plan(fleet, "s1", load_catalog(), PlanSettings(history_min_hours=0))
    by_name = {r.workload_name: r for r in plan.recommendations}
    serving = by_name["chat-serving"]  # resized in place: its load on half its H100s, twice as high
    assert serving.kind == "right_size" and serving.projection is not None
    p = serving.projection
    assert p.speed == 1.0 and p.mean_util == pytest.approx(2 * p.before_mean_util, rel=1e-3)
    assert (
        serving.performance_impact
        == f"utilisation about {p.mean_util:.0f} % (p95 {p.p95_util:.0f} %) on 4 × H100 80GB SXM"
    )
    assert serving.risk in ("low", "medium")
    training = by_name["vision-finetune-ddp"]
    assert "the throughput" in training.performance_impact and training.risk == "medium"  # restarts from a checkpoint
    assert by_name["forgotten-notebook-alloc"].performance_impact.startswith("none")


def test_capacity_shortage_is_reported_as_blocked() -> None:
    fleet, _ = simulated_fleet("demo", 8)
    for key in [k for k in fleet.nodes if k[1] in ("l40s-001", "l40s-002", "h100-003", "a100-001")]:
        del fleet.nodes[key]  # the spare L40S, H100 and A100 capacity is gone, the L40S cards with it
    plan = build_plan(fleet, "s1", load_catalog(), PlanSettings())
    reasons = {b.workload_name: b.reason for b in plan.blocked}
    assert "vision-finetune-ddp" not in {r.workload_name for r in plan.recommendations}
    assert reasons["vision-finetune-ddp"] == "no free H100 80GB SXM capacity in site s1"
    assert "chat-serving" not in reasons  # the site has no cheaper hardware left that could carry it
    # A few minutes of telemetry do not show a daily peak, so nothing was resized above. Trusting them:
    # resizing in place needs no free capacity, chat-serving's peak fits half its H100s, and the training
    # job waits for those to be freed before it moves onto them.
    plan = build_plan(fleet, "s1", load_catalog(), PlanSettings(history_min_hours=0))
    by_name = {r.workload_name: r for r in plan.recommendations}
    shrink, move = by_name["chat-serving"], by_name["vision-finetune-ddp"]
    assert shrink.kind == "right_size" and shrink.gpus_after == 4 and shrink.to_node == shrink.from_node
    assert shrink.monthly_savings_usd == pytest.approx(4 * 2.50 * 730)
    assert move.kind == "move" and move.to_node == shrink.from_node
    assert move.after == [shrink.id] and (shrink.wave, move.wave) == (1, 2)
    assert [r.id for r in plan.recommendations] == [shrink.id, move.id]  # listed in the order to carry out


def _inference(
    wid: str, node: str, gpus: int, util: float, mem_mib: float = 20_000, shape: float | None = None
) -> Movable:
    demand = Demand(WorkloadClass.INFERENCE, gpus, mem_mib, util, util * 1.6, shape=shape)
    return Movable(wid, node, demand, move_cost_usd=20)


def test_planner_respects_capacity() -> None:
    catalog = load_catalog()
    nodes = [NodeSlot("h1", "h100", 8), NodeSlot("l1", "l40s", 8)]
    # compute-bound services (vision, encoders): an L40S does 0.38 of an H100's work, so 20 % (p95 32 %) of an
    # H100 is 20 / 0.38 = 53 % (p95 32 / 0.38 = 84 %) of an L40S, inside the 60 % / 95 % limits
    two = [_inference("a", "h1", 4, 20, shape=0.0), _inference("b", "h1", 4, 20, shape=0.0)]
    solution = solve(catalog, Problem(nodes, {"l1": 4}, two))
    assert sorted(solution.placement.values()).count("l1") == 1  # only four L40S GPUs are free
    solution = solve(catalog, Problem(nodes, {}, two))
    assert set(solution.placement.values()) == {"l1"}
    assert solution.report.status == "OPTIMAL" and solution.report.gap == 0


def test_planner_respects_memory_and_load_fit() -> None:
    catalog = load_catalog()
    nodes = [NodeSlot("h1", "h100", 8), NodeSlot("l4", "l4", 8)]
    big_model = _inference("a", "h1", 8, 10, mem_mib=40_000)  # 40 GiB per GPU does not fit a 24 GB L4
    busy = _inference("b", "h1", 8, 45)  # 45 % of an H100 is more than an L4 can serve
    for w in (big_model, busy):
        solution = solve(catalog, Problem(nodes, {}, [w]))
        assert solution.placement[w.id] == "h1"
        assert w.id in solution.blocked


@pytest.mark.parametrize("seed", [4, 5])
def test_a_well_placed_fleet_gets_no_recommendations(seed: int) -> None:
    fleet, _ = simulated_fleet("well-placed", 14, windows=12, seed=seed)
    plan = build_plan(fleet, "s1", load_catalog(), PlanSettings())
    assert plan.recommendations == [], [(r.workload_name, r.reason) for r in plan.recommendations]
    # A notebook that ran nothing for these two minutes does look like an idle allocation; nothing else is flagged.
    assert all(f.workload_name == "research-notebook" for f in plan.findings), plan.findings


def test_replicas_spread_and_multi_gpu_training_keeps_nvlink() -> None:
    catalog = load_catalog()
    nodes = [NodeSlot("h1", "h100", 8), NodeSlot("h2", "h100", 8), NodeSlot("l1", "l40s", 8)]
    # replicas of a compute-bound detection service: 20 / 0.38 = 53 % (p95 32 / 0.38 = 84 %) on L40S
    detector = Demand(WorkloadClass.INFERENCE, 4, 20_000, 20, 32, shape=0.0)
    replicas = [Movable(f"r{i}", f"h{i + 1}", detector, 20, service="detector") for i in range(2)]
    solution = solve(catalog, Problem(nodes, {}, replicas))
    # both would fit on the one L40S node, but two replicas of a service do not share a node they did not share
    assert sorted(solution.placement.values()).count("l1") == 1
    training = Movable("t", "h1", Demand(WorkloadClass.TRAINING, 8, 20_000, 90, 95), 20)
    cheap = [NodeSlot("h1", "h100", 8), NodeSlot("l1", "l40s", 8)]
    nearly_free = catalog.with_prices({"l40s": 0.01})  # cheaper per unit of work even without NVLink...
    solution = solve(nearly_free, Problem(cheap, {}, [training]))
    assert solution.placement["t"] == "h1"  # ...but multi-GPU training keeps its NVLink
    assert "needs NVLink" in solution.blocked["t"]
