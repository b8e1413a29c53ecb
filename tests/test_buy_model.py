"""The plan's purchase section: candidate nodes in the planner's own model, priced at the catalog's amortised rate."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import FLEETFIT

from agent.protocol import Plan, WorkloadClass
from optimizer.commands.buy import Addition, with_additions
from optimizer.decide.catalog import load_catalog
from optimizer.decide.costs import Demand
from optimizer.decide.snapshot import Snapshot
from optimizer.plan.model import solve
from optimizer.plan.problem import Movable, NodeSlot, Offer, Problem
from optimizer.plan.purchases import AMORTISATION_MONTHS
from optimizer.plan.recommend import PlanSettings, plan_snapshot

MONTH = 730


def _fleet(services: int, l40s_free: int = 0, gpus: int = 8) -> dict[str, Any]:
    """``services`` image-generation services of ``gpus`` H100s each, beside an L40S node a pinned job fills and
    ``l40s_free`` empty L40S nodes. Diffusion serving is compute-bound, where an L40S does 0.38 of an H100's
    work: 20 % (p95 34 %) of an H100 is 20 / 0.38 = 53 % (p95 89 %) of an L40S, inside the 60 % / 95 % limits,
    and 40,000 MiB per GPU fit 90 % of its 48 GiB (44,237 MiB). No fewer H100s carry them: half as many would
    hold 80,000 MiB each, over 90 % of 80 GiB (73,728 MiB)."""
    nodes = [{"name": f"h100-0{i}", "hardware": "h100", "gpus": 8} for i in range(1, services + 1)]
    nodes += [{"name": f"l40s-0{i}", "hardware": "l40s", "gpus": 8} for i in range(1, l40s_free + 2)]
    workloads: list[dict[str, Any]] = [
        {"id": f"image-{i}", "name": f"image-{i}", "class": "inference", "nodes": [f"h100-0{i}"], "gpus": gpus,
         "mem_mib_per_gpu": 40000, "mean_util": 20, "p95_util": 34, "shape": "compute"}
        for i in range(1, services + 1)
    ]  # fmt: skip
    workloads.append(
        {"id": "render", "name": "render", "class": "batch_inference", "nodes": ["l40s-01"], "gpus": 8,
         "mem_mib_per_gpu": 20000, "mean_util": 90, "pinned": True}
    )  # fmt: skip
    return {"schema": 1, "site": "eu-1", "nodes": nodes, "workloads": workloads}


def _plan(fleet: dict[str, Any], **settings: Any) -> Plan:
    return plan_snapshot(Snapshot.model_validate(fleet), load_catalog(), PlanSettings(**settings))


def test_moves_blocked_for_l40s_buy_l40s_nodes_that_pay_back() -> None:
    plan = _plan(_fleet(3))
    assert {b.reason for b in plan.blocked} == {"no free L40S 48GB capacity in site eu-1"}
    assert plan.purchases is not None
    (purchase,) = plan.purchases
    assert (purchase.hardware, purchase.nodes, purchase.gpus_per_node) == ("L40S 48GB", 3, 8)
    assert purchase.workloads == ["image-1", "image-2", "image-3"]
    assert purchase.monthly_cost_usd == pytest.approx(3 * 8 * 0.85 * MONTH)
    # each service frees the 8 H100s it holds
    assert purchase.monthly_savings_usd == pytest.approx(3 * 8 * 2.50 * MONTH)
    assert purchase.payback_months == pytest.approx(0.85 / 2.50 * AMORTISATION_MONTHS, abs=0.01)


def test_the_suggested_nodes_added_unblock_the_savings_claimed() -> None:
    """What a capacity team would check: plan again with the nodes bought, and the blocked moves happen."""
    fleet = _fleet(3)
    plan = _plan(fleet)
    assert plan.purchases
    catalog = load_catalog()
    additions = [
        Addition(catalog.by_key("l40s"), p.gpus_per_node, p.nodes) for p in plan.purchases if p.hardware == "L40S 48GB"
    ]
    bigger = plan_snapshot(with_additions(Snapshot.model_validate(fleet), additions), catalog, PlanSettings())
    onto_new = [r for r in bigger.recommendations if r.to_node.startswith("new-l40s-")]
    assert sorted(r.workload for r in onto_new) == plan.purchases[0].workloads
    assert bigger.blocked == [] and bigger.purchases == []
    # the plan counts the new GPUs the moves hold; the purchase counted the nodes whole
    held = sum(r.gpus_after or r.gpus for r in onto_new) * 0.85 * MONTH
    unlocked = bigger.monthly_savings_usd - plan.monthly_savings_usd + held
    assert unlocked == pytest.approx(sum(p.monthly_savings_usd for p in plan.purchases), rel=0.01)


def test_nothing_blocked_buys_nothing() -> None:
    plan = _plan(_fleet(3, l40s_free=3))
    assert len(plan.recommendations) == 3 and plan.blocked == []
    assert plan.purchases == []


def test_fleetfit_plan_buy_says_when_nothing_is_worth_buying(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps(_fleet(3, l40s_free=3)))
    run = [FLEETFIT, "plan", str(fleet)]
    assert "what to buy" not in subprocess.run(run, capture_output=True, timeout=60, check=True).stdout.decode()
    text = subprocess.run([*run, "--buy"], capture_output=True, timeout=60, check=True).stdout.decode()
    section = "what to buy: nothing; no purchase pays for itself"
    assert section in text and text.index(section) < text.index("solver:")  # in its place, before the solver's


def test_a_purchase_that_never_pays_is_not_suggested() -> None:
    # one GPU's saving a month cannot pay for eight new L40S
    plan = _plan(_fleet(1, gpus=1))
    assert [b.reason for b in plan.blocked] == ["no free L40S 48GB capacity in site eu-1"]
    assert plan.purchases == []


def test_the_model_buys_a_node_only_when_what_it_unlocks_exceeds_its_price() -> None:
    catalog = load_catalog()
    # two replicas of one compute-bound service, 4 H100s each; 4 L40S carry either (see _fleet)
    demand = Demand(WorkloadClass.INFERENCE, 4, 40000, 20, 34, shape=0.0)
    problem = Problem(
        nodes=[NodeSlot("h100-01", "h100", 8), NodeSlot("h100-02", "h100", 8)],
        fixed_usage={},
        movable=[Movable(f"image-{i}", f"h100-0{i}", demand, 20.0, "image") for i in (1, 2)],
    )
    names = ("new-l40s-001", "new-l40s-002", "new-l40s-003")

    def bought(price: float) -> list[str]:
        offer = Offer("l40s", 8, price, names, frozenset({"image-1", "image-2"}))
        solution = solve(catalog, replace(problem, offers=[offer]))
        return sorted(node for node in solution.placement.values() if node.startswith("new-"))

    # one node would hold both, but replicas of a service never share one: two nodes, the first two offered
    assert bought(8 * 0.85 * MONTH) == ["new-l40s-001", "new-l40s-002"]
    assert bought(4 * 2.50 * MONTH + 100) == []  # dearer than the four H100s either replica would free


def test_fleetfit_plan_prints_and_serialises_the_purchases(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps(_fleet(3)))
    text = subprocess.run([FLEETFIT, "plan", str(fleet)], capture_output=True, timeout=60, check=True).stdout.decode()
    assert "what to buy" in text and "3 node(s) of 8 × L40S 48GB" in text and "pays back in 12.2 months" in text
    body = json.loads(
        subprocess.run(
            [FLEETFIT, "plan", str(fleet), "--format", "json"], capture_output=True, timeout=60, check=True
        ).stdout
    )
    assert [(p["hardware"], p["nodes"]) for p in body["purchases"]] == [("L40S 48GB", 3)]
    assert Plan.model_validate(body).purchases is not None
    quick = subprocess.run([FLEETFIT, "plan", str(fleet), "--no-buy"], capture_output=True, timeout=60, check=True)
    assert "what to buy" not in quick.stdout.decode() and "no free L40S 48GB capacity" in quick.stdout.decode()


def test_the_purchase_question_stays_inside_the_plans_time_limit() -> None:
    # the live optimizer's plan has its time limit; what the solve leaves is under the phase's minimum here
    assert _plan(_fleet(3), time_limit=0.5).purchases is None
    assert _plan(_fleet(3), buy=False).purchases is None
    # fleetfit plan --buy gives it a time limit of its own
    assert _plan(_fleet(3), time_limit=0.5, buy_time_limit=5).purchases


CHAIN = {
    "schema": 1,
    "site": "eu-1",
    "nodes": [{"name": "h100-01", "hardware": "h100", "gpus": 8}, {"name": "l40s-01", "hardware": "l40s", "gpus": 8},
              {"name": "l4-01", "hardware": "l4", "gpus": 8}],
    "workloads": [
        {"id": "image", "name": "image-gen", "class": "inference", "nodes": ["h100-01"], "gpus": 8,
         "mem_mib_per_gpu": 40000, "mean_util": 20, "p95_util": 34, "shape": "compute"},
        {"id": "tts", "name": "tts-api", "class": "inference", "nodes": ["l40s-01"], "gpus": 8,
         "mem_mib_per_gpu": 10000, "mean_util": 12, "p95_util": 20, "history_hours": 1, "shape": "compute"},
        {"id": "ddp", "name": "vision-ddp", "class": "training", "nodes": ["l4-01"], "gpus": 8,
         "mem_mib_per_gpu": 10000, "mean_util": 90, "pinned": True},
    ],
}  # fmt: skip


def test_one_cheap_node_that_frees_room_for_a_chain_beats_two() -> None:
    """image-gen wants the L40S that tts-api holds, and tts-api wants an L4: one new L4 node serves both. Both
    are compute-bound: image-gen as in _fleet; tts-api on 8 L4 at 12 × 0.38 / 0.11 = 41 % (p95 20 × 0.38 / 0.11
    = 69 %), while 4 L4 would reach 83 %; an hour of history does not let it shrink in place."""
    plan = _plan(CHAIN)
    assert plan.recommendations == [] and {b.workload: b.reason for b in plan.blocked} == {
        "image": "no free L40S 48GB capacity in site eu-1",
        "tts": "no free L4 24GB capacity in site eu-1",
        "ddp": "pinned",
    }
    assert plan.purchases is not None
    (purchase,) = plan.purchases
    assert (purchase.hardware, purchase.nodes, purchase.workloads) == ("L4 24GB", 1, ["tts"])
    # tts-api frees its 8 L40S, and image-gen its 8 H100 by moving into them
    assert purchase.monthly_savings_usd == pytest.approx((8 * 0.85 + 8 * 2.50 - 8 * 0.85) * MONTH)
    catalog = load_catalog()
    bigger = with_additions(Snapshot.model_validate(CHAIN), [Addition(catalog.by_key("l4"), 8, 1)])
    after = plan_snapshot(bigger, catalog, PlanSettings())
    moves = {r.workload: (r.to_node, r.wave) for r in after.recommendations}
    assert moves == {"tts": ("new-l4-001", 1), "image": ("l40s-01", 2)}
