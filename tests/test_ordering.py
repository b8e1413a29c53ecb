"""Plans come in an order a capacity team can carry out: replaying the waves on the snapshot the plan came from
never puts more GPUs on a node than it has, and each action names the ones it waits for."""

from __future__ import annotations

import json
import random
import re
import subprocess
from pathlib import Path

import pytest
from conftest import FLEETFIT

from agent.protocol import Plan, Recommendation
from optimizer.decide.catalog import load_catalog
from optimizer.decide.snapshot import Snapshot, SnapshotNode, SnapshotWorkload
from optimizer.plan.ordering import Action, order
from optimizer.plan.recommend import PlanSettings, plan_snapshot
from optimizer.serve.alerts.notice import Item, Notice, Status
from optimizer.serve.alerts.payloads import render
from optimizer.serve.alerts.settings import Severity
from optimizer.serve.lifecycle import Lifecycle, RecState

EPS = 1e-6


def _w(
    wid: str,
    cls: str,
    node: str,
    gpus: int,
    util: float,
    mem: float,
    p95: float | None = None,
    shape: str | None = None,
) -> SnapshotWorkload:
    return SnapshotWorkload.model_validate(
        {
            "id": wid,
            "name": wid,
            "class": cls,
            "confidence": 0.95,
            "nodes": [node],
            "gpus": gpus,
            "mem_mib_per_gpu": mem,
            "mean_util": util,
            "p95_util": p95 if p95 is not None else min(100.0, util * 1.6),
            "shape": shape,
        }
    )


def _held(rec: Recommendation) -> float:
    return (rec.gpus if rec.gpus_after is None else rec.gpus_after) * (rec.gpu_share or 1.0)


def replay(snapshot: Snapshot, plan: Plan) -> list[int]:
    """Carry the plan out wave by wave; within a wave, every arrival lands before any departure frees room (the
    actions of a wave run in parallel), except that the members of a swap leave together. Returns the waves."""
    capacity = {n.name: n.gpus for n in snapshot.nodes}
    used = dict.fromkeys(capacity, 0.0)
    for w in snapshot.workloads:
        for node in w.nodes:
            used[node] += w.gpus / len(w.nodes) * w.share
    arrivals: dict[int, list[tuple[str, float, str]]] = {}
    departures: dict[int, list[tuple[str, float, str]]] = {}
    for rec in plan.recommendations:
        assert rec.wave is not None
        kept, share = _held(rec), rec.gpu_share or 1.0
        if rec.kind == "consolidate":  # it held whole GPUs before
            share = 1.0
        if rec.kind in ("move", "consolidate"):
            if rec.via_node is not None:
                assert rec.via_wave is not None and rec.via_wave < rec.wave
                arrivals.setdefault(rec.via_wave, []).append((rec.via_node, kept, rec.id))
                departures.setdefault(rec.via_wave, []).append((rec.from_node, rec.gpus * share, rec.id))
                departures.setdefault(rec.wave, []).append((rec.via_node, kept, rec.id))
            else:
                departures.setdefault(rec.wave, []).append((rec.from_node, rec.gpus * share, rec.id))
            arrivals.setdefault(rec.wave, []).append((rec.to_node, kept, rec.id))
        else:
            departures.setdefault(rec.wave, []).append((rec.from_node, rec.gpus * share - kept, rec.id))
    swapping = {rec.id for rec in plan.recommendations if rec.swap}
    by_id = {rec.id: rec for rec in plan.recommendations}
    for rec in plan.recommendations:
        lands = {rec.to_node: rec.wave} | ({rec.via_node: rec.via_wave} if rec.via_node else {})
        for before in rec.after:  # what it waits for left a node it lands on, in an earlier wave
            d = by_id[before]
            leaves = {d.from_node: d.via_wave or d.wave} | ({d.via_node: d.wave} if d.via_node else {})
            assert any(node in leaves and (leaves[node] or 0) < (wave or 0) for node, wave in lands.items()), (
                rec.workload_name,
                before,
            )
    waves = sorted(set(arrivals) | set(departures))
    for wave in waves:
        leaving = departures.get(wave, [])
        for node, gpus, rid in leaving:
            if rid in swapping:
                used[node] -= gpus
        for node, gpus, rid in arrivals.get(wave, []):
            used[node] += gpus
            assert used[node] <= capacity[node] + EPS, f"wave {wave}: {rid} overfills {node}"
        for node, gpus, rid in leaving:
            if rid not in swapping:
                used[node] -= gpus
    return waves


def _chain_snapshot() -> Snapshot:
    """image-gen wants the L40S node tts-api fills, tts-api wants the L4 node where vision-ddp holds 4 of 8 GPUs,
    and vision-ddp wants the free H100 node. Both services are compute-bound (diffusion and speech synthesis
    models), so the catalog's compute figures apply (H100 1, L40S 0.38, L4 0.11): image-gen on 8 L40S runs at
    20 / 0.38 = 53 % (p95 34 / 0.38 = 89 %), tts-api on 8 L4 at 12 × 0.38 / 0.11 = 41 % (p95 20 × 0.38 / 0.11 =
    69 %), both under the 60 % mean and 95 % p95 limits. An LLM chat service in image-gen's place would not move:
    memory-bound, an L40S does 0.28 of an H100's work, and 24 % would become 86 %."""
    return Snapshot(
        site="eu-1",
        nodes=[
            SnapshotNode(name="h100-01", hardware="h100", gpus=8),
            SnapshotNode(name="l40s-01", hardware="l40s", gpus=8),
            SnapshotNode(name="l4-01", hardware="l4", gpus=8),
            SnapshotNode(name="h100-02", hardware="h100", gpus=8),
        ],
        workloads=[
            _w("image-gen", "inference", "h100-01", 8, 20, 36_000, p95=34, shape="compute"),
            _w("tts-api", "inference", "l40s-01", 8, 12, 16_000, p95=20, shape="compute"),
            _w("vision-ddp", "training", "l4-01", 4, 85, 18_000),
        ],
    )


def test_the_chain_of_three_moves_is_ordered() -> None:
    snapshot = _chain_snapshot()
    plan = plan_snapshot(snapshot, load_catalog(), PlanSettings(right_size=False))
    by_name = {r.workload_name: r for r in plan.recommendations}
    vision, tts, image = by_name["vision-ddp"], by_name["tts-api"], by_name["image-gen"]
    assert (vision.to_node, tts.to_node, image.to_node) == ("h100-02", "l4-01", "l40s-01")
    assert (vision.wave, tts.wave, image.wave) == (1, 2, 3)
    assert (vision.after, tts.after, image.after) == ([], [vision.id], [tts.id])
    assert [r.workload_name for r in plan.recommendations] == ["vision-ddp", "tts-api", "image-gen"]
    assert image.projection is not None and tts.projection is not None
    assert (image.projection.mean_util, image.projection.p95_util) == pytest.approx((20 / 0.38, 34 / 0.38), abs=0.01)
    assert (tts.projection.mean_util, tts.projection.p95_util) == pytest.approx(
        (12 * 0.38 / 0.11, 20 * 0.38 / 0.11), abs=0.01
    )
    assert replay(snapshot, plan) == [1, 2, 3]


def test_two_moves_into_each_others_place_are_a_swap() -> None:
    snapshot = Snapshot(
        site="eu-1",
        nodes=[
            SnapshotNode(name="h100-01", hardware="h100", gpus=8),
            SnapshotNode(name="l40s-01", hardware="l40s", gpus=8),
        ],
        workloads=[
            # compute-bound serving: 8 L40S carry it at 20 / 0.38 = 53 % (p95 34 / 0.38 = 89 %)
            _w("image-gen", "inference", "h100-01", 8, 20, 36_000, p95=34, shape="compute"),
            # shape unknown: judged at the end less favourable to the H100, 1 / 0.38 = 2.6× an L40S, and
            # 1 / 0.6 more for leaving PCIe: 8 × 2.50 × 730 / 4.39 = $3,329 a month against 8 × 0.85 × 730 = $4,964
            _w("pretrain", "training", "l40s-01", 8, 90, 40_000),
        ],
    )
    plan = plan_snapshot(snapshot, load_catalog(), PlanSettings(right_size=False))
    image, train = sorted(plan.recommendations, key=lambda r: r.workload_name)
    assert (image.to_node, train.to_node) == ("l40s-01", "h100-01")
    assert image.swap == [train.id] and train.swap == [image.id] and image.wave == train.wave == 1
    replay(snapshot, plan)


def test_a_cycle_is_broken_through_free_room_when_there_is_some() -> None:
    # a → b's node and b → a's node, each node full; c has room for b's workload meanwhile
    actions = [Action("a", "n1", 4, "n2", 4), Action("b", "n2", 4, "n1", 4)]
    steps = order(actions, {"n1": 0, "n2": 0, "n3": 4}, can_stage=lambda a, n: True)
    staged = [s for s in steps.values() if s.via_node]
    assert len(staged) == 1 and staged[0].via_node == "n3" and staged[0].via_wave == 1
    assert not any(s.swap for s in steps.values())
    assert sorted(s.wave for s in steps.values()) == [2, 3]  # the other move, then the staged one's last hop


def _random_fleet(seed: int) -> Snapshot:
    rng = random.Random(seed)
    kinds = [("h100", 8), ("a100", 8), ("l40s", 8), ("l4", 8), ("h200", 8), ("l40s", 4)]
    nodes, workloads = [], []
    for i in range(rng.randint(6, 14)):
        hw, gpus = rng.choice(kinds)
        name = f"{hw}-{i}"
        nodes.append(SnapshotNode(name=name, hardware=hw, gpus=gpus))
        free = gpus if rng.random() > 0.15 else 0  # a few nodes stay empty
        j = 0
        while free > 0 and rng.random() < 0.85:
            size = rng.choice([s for s in (1, 2, 4, 8) if s <= free])
            cls = rng.choice(["inference", "inference", "training", "batch_inference", "idle", "interactive"])
            util = {"training": 90, "batch_inference": 85, "idle": 0}.get(cls, rng.uniform(3, 40))
            mem = rng.uniform(4_000, 30_000)
            workloads.append(_w(f"w{i}-{j}", cls, name, size, util, mem))
            free -= size
            j += 1
    return Snapshot(site="s", nodes=nodes, workloads=workloads)


@pytest.mark.parametrize("seed", range(12))
def test_random_plans_replay_within_capacity_after_every_move(seed: int) -> None:
    snapshot = _random_fleet(seed)
    plan = plan_snapshot(snapshot, load_catalog(), PlanSettings(max_moves=50, time_limit=5))
    waves = replay(snapshot, plan)
    assert [r.wave for r in plan.recommendations] == sorted(r.wave or 0 for r in plan.recommendations)
    assert waves == sorted(waves)


def test_random_plans_use_every_kind_and_some_wait() -> None:
    """Across the random fleets above, the plans exercise reclaim, right-size and chains (cycles have their own
    tests above: which optimum CP-SAT returns decides whether a random plan has one)."""
    kinds: set[str | None] = set()
    chained = 0
    for seed in range(12):
        plan = plan_snapshot(_random_fleet(seed), load_catalog(), PlanSettings(max_moves=50, time_limit=5))
        kinds |= {r.kind for r in plan.recommendations}
        chained += sum(1 for r in plan.recommendations if r.after)
    assert {"move", "reclaim", "right_size"} <= kinds
    assert chained > 0


def test_dismissing_a_move_marks_what_waits_for_it(tmp_path: Path) -> None:
    snapshot = _chain_snapshot()
    plan = plan_snapshot(snapshot, load_catalog(), PlanSettings(right_size=False))
    by_name = {r.workload_name: r for r in plan.recommendations}
    life = Lifecycle.in_state_dir(tmp_path)
    placements = {w.id: w.nodes[0] for w in snapshot.workloads}
    life.record(plan, placements)
    life.set_state(by_name["vision-ddp"].id, RecState.DISMISSED)
    marks = {t.recommendation.workload_name: t.recommendation.blocked_by for t in life.list()}
    # tts-api waits for vision-ddp directly, image-gen through tts-api
    assert marks == {"tts-api": [by_name["vision-ddp"].id], "image-gen": [by_name["vision-ddp"].id]}
    life.record(plan, placements)  # the next plan proposes the same moves: the marks stay
    assert all(t.recommendation.blocked_by for t in life.list())
    life.set_state(by_name["vision-ddp"].id, RecState.NEW)  # reopened
    assert [t.recommendation.workload_name for t in life.list()] == ["vision-ddp", "tts-api", "image-gen"]
    assert not any(t.recommendation.blocked_by for t in life.list())


def test_plan_command_lists_actions_wave_by_wave_with_the_bound() -> None:
    example = Path(__file__).resolve().parent.parent / "docs" / "examples" / "chain.json"
    out = subprocess.run([FLEETFIT, "plan", str(example)], capture_output=True, timeout=60, check=True).stdout.decode()
    listed = [line.split(":")[0].split()[1:3] for line in out.splitlines() if re.match(r"^\s+\d+\. ", line)]
    assert listed[-2:] == [["move", "tts-api"], ["move", "image-gen"]]  # the chain's tail, in order
    assert {tuple(x) for x in listed[:3]} == {
        ("reclaim", "forgotten-alloc"),
        ("right-size", "rerank-api"),
        ("move", "vision-ddp"),
    }
    assert "  wave 3:" in out and "      waits for #4\n" in out
    # the header's total is the one total, by kind; the bound line says which part of it the bound is on
    total = re.search(r"saving \$([\d,]+)/month \(move \$([\d,]+), reclaim \$([\d,]+), right-size \$([\d,]+)\)", out)
    assert total, out
    whole, move, reclaim, resize = (int(g.replace(",", "")) for g in total.groups())
    assert abs(whole - (move + reclaim + resize)) <= 1  # each rounded to the dollar
    bound = re.search(r"the solver's actions \(moves and resizing\) save \$([\d,]+)/month, \d+\.\d% of the most", out)
    assert bound and abs(int(bound.group(1).replace(",", "")) - (move + resize)) <= 1
    assert f"reclaims, decided before the solve, add ${reclaim:,}" in out
    plan = Plan.model_validate_json(
        subprocess.run(
            [FLEETFIT, "plan", str(example), "--format", "json"], capture_output=True, timeout=60, check=True
        ).stdout
    )
    assert [r.wave for r in plan.recommendations] == [1, 1, 1, 2, 3]
    assert plan.solver.bound_savings_usd is not None and plan.solver.savings_usd is not None
    assert plan.solver.savings_usd <= plan.solver.bound_savings_usd + 0.01


def test_generic_webhook_lists_actions_in_order_with_kind_and_wave() -> None:
    plan = plan_snapshot(
        Snapshot.model_validate_json((Path(__file__).resolve().parent.parent / "docs/examples/chain.json").read_text()),
        load_catalog(),
        PlanSettings(),
    )
    items = [Item(r, Status.NEW, Severity.WARNING) for r in reversed(plan.recommendations)]
    body = json.loads(render("generic", Notice("eu-1", 1_700_000_000.0, items), 256_000))
    firing = body["firing"]
    assert [m["id"] for m in firing][-2:] == [r.id for r in plan.recommendations][-2:]  # the chain's tail last
    assert [m["wave"] for m in firing] == sorted(m["wave"] for m in firing)
    by_name = {m["workload_name"]: m for m in firing}
    assert by_name["forgotten-alloc"]["kind"] == "reclaim" and by_name["forgotten-alloc"]["gpus_after"] == 0
    assert by_name["rerank-api"]["kind"] == "right_size"
    assert by_name["image-gen"]["after"] == [by_name["tts-api"]["id"]]


def test_shares_of_gpus_pack_onto_one_gpu_and_replay_within_capacity() -> None:
    nodes = [SnapshotNode(name="h100-01", hardware="h100", gpus=8), SnapshotNode(name="l4-01", hardware="l4", gpus=8)]
    # Embedding and OCR models are compute-bound: an L4 does 0.11 of an H100's work. An embedding service at 1.5 %
    # of its H100 (p95 2.4 %) would hold 1.5 / 0.11 / 0.25 = 55 % of a quarter L4 (p95 2.4 / 0.11 / 0.25 = 87 %);
    # the OCR slice at 0.9 % (p95 1.44 %) 0.9 / 0.11 × 7 = 57 % of a seventh (p95 1.44 / 0.11 × 7 = 92 %), and its
    # 3,000 MiB fit 90 % of a seventh of 24 GiB (3,160 MiB): room is all it lacks.
    shared = [
        _w(f"embed-{i}", "inference", "h100-01", 1, 1.5, 4_000, shape="compute").model_copy(update={"gpu_share": 0.25})
        for i in range(4)
    ]
    sliced = _w("ocr", "inference", "h100-01", 1, 0.9, 3_000, shape="compute").model_copy(
        update={"mig_profile": "1g.10gb"}
    )
    full = [_w(f"l4-job-{i}", "batch_inference", "l4-01", 1, 85, 10_000) for i in range(7)]  # one L4 left
    snapshot = Snapshot(site="s", nodes=nodes, workloads=[*shared, sliced, *full])
    plan = plan_snapshot(snapshot, load_catalog(), PlanSettings())
    moved = {r.workload_name: r for r in plan.recommendations if r.to_node == "l4-01"}
    # four quarter-GPU services fill the one free L4; the 1/7 MIG slice no longer fits beside them
    assert sorted(moved) == [f"embed-{i}" for i in range(4)]
    assert all(r.gpu_share == 0.25 for r in moved.values())
    assert moved["embed-0"].monthly_savings_usd == pytest.approx(0.25 * (2.50 - 0.35) * 730, abs=0.01)
    # it would save (2.50 - 0.35) × 730 / 7 = $224 a month there, over the $100 minimum
    assert {b.workload_name: b.reason for b in plan.blocked} == {"ocr": "no free L4 24GB capacity in site s"}
    replay(snapshot, plan)
    with pytest.raises(ValueError, match="needs gpus 1"):
        SnapshotWorkload.model_validate({**shared[0].model_dump(by_alias=True), "gpus": 2})


def test_small_services_consolidate_onto_shared_gpus_only_where_allowed() -> None:
    nodes = [SnapshotNode(name="h100-01", hardware="h100", gpus=8), SnapshotNode(name="l4-01", hardware="l4", gpus=8)]
    # small encoder APIs (compute-bound: an L4 does 0.11 of an H100's work) at 1.5 % of an H100, p95 2.4 %: a
    # quarter of an L4 carries each at 1.5 / 0.11 / 0.25 = 55 % (p95 2.4 / 0.11 / 0.25 = 87 %)
    services = [_w(f"api-{i}", "inference", "h100-01", 1, 1.5, 4_000, shape="compute") for i in range(3)]
    full = [_w(f"l4-job-{i}", "batch_inference", "l4-01", 1, 85, 10_000) for i in range(7)]  # one L4 left
    snapshot = Snapshot(site="s", nodes=nodes, workloads=[*services, *full])
    plan = plan_snapshot(snapshot, load_catalog(), PlanSettings())
    assert [r.workload_name for r in plan.recommendations if r.to_node == "l4-01"] in (["api-0"], ["api-1"], ["api-2"])
    plan = plan_snapshot(snapshot, load_catalog(), PlanSettings(sharing={"l4": 0.25}))
    shared = [r for r in plan.recommendations if r.kind == "consolidate"]
    assert sorted(r.workload_name for r in shared) == ["api-0", "api-1", "api-2"]
    assert all(r.to_node == "l4-01" and r.gpu_share == 0.25 for r in shared)  # three quarters of the free L4
    assert shared[0].monthly_savings_usd == pytest.approx((2.50 - 0.25 * 0.35) * 730, abs=0.01)
    assert "of a shared L4" in shared[0].reason and shared[0].risk == "medium"
    replay(snapshot, plan)
    with pytest.raises(ValueError, match="smallest share"):
        PlanSettings(sharing={"l4": 0.0})


def test_a_move_staged_for_nothing_does_not_hop_between_free_nodes() -> None:
    """x waits for a, which is in a cycle with b; the free room (n3) is too small for a or b. Staging x there
    frees nothing anyone waits for, so the cycle is a swap and x follows it."""
    actions = [Action("a", "n1", 4, "n2", 4), Action("b", "n2", 4, "n1", 4), Action("x", "n5", 1, "n1", 1)]
    steps = order(actions, {"n1": 0, "n2": 0, "n3": 2, "n5": 0}, can_stage=lambda a, n: True)
    assert steps["a"].swap == ["b"] and steps["b"].swap == ["a"]
    assert steps["x"].via_node is None and steps["x"].wave > steps["a"].wave
