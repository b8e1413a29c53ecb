"""Making room: a workload the packing could not place goes where small tenants can move aside into slivers."""

from __future__ import annotations

import functools

import pytest
from test_ordering import replay

from agent.protocol import WorkloadClass
from optimizer.decide.catalog import load_catalog
from optimizer.decide.snapshot import Snapshot, SnapshotNode, SnapshotWorkload
from optimizer.plan import recommend
from optimizer.plan.problem import Problem
from optimizer.plan.room import Layout, make_room
from optimizer.plan.rounding import Candidate

# two cheap nodes of 200 units; the dear one has room for everything
CAPACITY = {"cheap-1": 200, "cheap-2": 200, "dear-1": 1000}
HARDWARE = {"cheap-1": "cheap", "cheap-2": "cheap", "dear-1": "dear"}


def _c(wid: str, node: str, gpus: int, saving: float = 0.0, service: str | None = None) -> Candidate:
    """Costs $100 a month where it runs; on the other hardware ``saving`` less (for a dear one) or more."""
    home = HARDWARE[node]
    other = "dear" if home == "cheap" else "cheap"
    by_type = {home: (100.0, gpus), other: (100.0 - saving if home == "dear" else 150.0, gpus)}
    return Candidate(wid, node, home, gpus, service, by_type, {})


def _layout(cands: list[Candidate], placed: dict[str, str], move_cost: float = 5.0) -> Layout:
    """Every move costs ``move_cost`` once."""
    room = dict(CAPACITY)
    where = {c.id: (placed.get(c.id, c.node), c.gpus_now) for c in cands}
    for node, gpus in where.values():
        room[node] -= gpus
    taken = {(c.service, where[c.id][0]) for c in cands if c.service and where[c.id][0] != c.node}
    return Layout({c.id: c for c in cands}, where, room, HARDWARE, taken, {c.id: move_cost for c in cands})


def _tenants() -> list[Candidate]:
    # cheap-1: 100 + 47 at home, 53 free; cheap-2: 100 + 32 at home, 68 free. No 100 fits, though 121 are free.
    return [_c("a", "cheap-1", 100), _c("t", "cheap-1", 47), _c("b", "cheap-2", 100), _c("u", "cheap-2", 32)]


def test_a_small_tenant_moves_into_a_sliver_so_a_whole_workload_fits() -> None:
    cands = [*_tenants(), _c("m", "dear-1", 100, saving=20.0)]
    layout = _layout(cands, {})
    made = make_room([(20.0, cands[-1], "cheap")], layout, moves_left=10)
    assert made == 2  # the tenant's move counts against the budget as the workload's does
    # the roomier node needs less moved aside: the 32 leaves cheap-2 for cheap-1's 53 free
    assert layout.placed["u"][0] == "cheap-1" and layout.placed["m"][0] == "cheap-2"
    assert layout.room == {"cheap-1": 21, "cheap-2": 0, "dear-1": 1000}
    assert layout.by_room["cheap"] == [(0, "cheap-2"), (21, "cheap-1")]


def test_no_eviction_whose_one_off_costs_outweigh_the_saving() -> None:
    # $9 a month saved; the workload's and its tenant's moves cost $5 each once: the first month does not pay
    cands = [*_tenants(), _c("m", "dear-1", 100, saving=9.0)]
    layout = _layout(cands, {})
    made = make_room([(9.0, cands[-1], "cheap")], layout, moves_left=10)
    assert made == 0 and layout.placed["m"][0] == "dear-1" and layout.placed["t"][0] == "cheap-1"


def test_a_tenant_already_moving_is_sent_elsewhere_before_one_at_home_moves() -> None:
    # cheap-1: 100 + 47 at home; cheap-2: 100 + "n", which the plan already moves there; 53 free on each. Either
    # 47 may move to the other node: "n" at no cost and no extra move, "t" at its one-off cost and a move.
    cands = [_c("a", "cheap-1", 100), _c("t", "cheap-1", 47), _c("b", "cheap-2", 100), _c("n", "dear-1", 47)]
    cands.append(_c("m", "dear-1", 100, saving=20.0))
    layout = _layout(cands, {"n": "cheap-2"})
    made = make_room([(20.0, cands[-1], "cheap")], layout, moves_left=1)
    assert made == 1
    assert layout.placed["n"][0] == "cheap-1" and layout.placed["t"][0] == "cheap-1"
    assert layout.placed["m"][0] == "cheap-2"


def test_the_budget_bounds_the_tenants_moved_too() -> None:
    cands = [*_tenants(), _c("m", "dear-1", 100, saving=20.0)]
    layout = _layout(cands, {})
    made = make_room([(20.0, cands[-1], "cheap")], layout, moves_left=1)
    assert made == 0 and layout.placed["m"][0] == "dear-1"


def test_a_replica_is_not_moved_beside_another_replica_that_moved_there() -> None:
    # cheap-1: 100 + the replica "t", 53 free; cheap-2: 90 + the replica "r" the plan moves there, 50 free.
    # Only "t" moving to cheap-2 would make room (nothing else fits elsewhere), and "r" moved there already.
    cands = [
        _c("a", "cheap-1", 100),
        _c("t", "cheap-1", 47, service="svc"),
        _c("b", "cheap-2", 90),
        _c("r", "dear-1", 60, service="svc"),
        _c("m", "dear-1", 100, saving=20.0),
    ]
    layout = _layout(cands, {"r": "cheap-2"})
    made = make_room([(20.0, cands[-1], "cheap")], layout, moves_left=10)
    assert made == 0 and layout.placed["t"][0] == "cheap-1" and layout.placed["m"][0] == "dear-1"
    # another service's tenant would move
    cands[1] = _c("t", "cheap-1", 47, service="other")
    layout = _layout(cands, {"r": "cheap-2"})
    made = make_room([(20.0, cands[-1], "cheap")], layout, moves_left=10)
    assert made == 2 and layout.placed["t"][0] == "cheap-2" and layout.placed["m"][0] == "cheap-1"


def _service(wid: str, node: str, share: float, mean: float, mem_gib: float) -> SnapshotWorkload:
    return SnapshotWorkload(
        id=wid,
        name=wid,
        workload_class=WorkloadClass.INFERENCE,
        confidence=0.95,
        nodes=[node],
        gpus=1,
        mem_mib_per_gpu=mem_gib * 1024,
        mean_util=mean,
        p95_util=mean * 1.7,
        gpu_share=share if share < 1 else None,
    )


def test_a_fleet_scale_start_moves_a_tenant_aside_to_reach_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two nodes of the cheaper hardware (two GPUs each), each with a whole-GPU service and a share of one beside
    # it: 0.53 and 0.68 of a GPU free, so the whole-GPU service on the T4 fits neither. The bound pools the
    # cheaper type's 1.21 free GPUs and saves what that service's move saves; the 0.32 share moving beside the
    # other node's tenants (0.53 free) frees a whole GPU for it.
    nodes = [
        SnapshotNode(name="p-1", hardware="v100_pcie_16gb", gpus=2),
        SnapshotNode(name="p-2", hardware="v100_pcie_16gb", gpus=2),
        SnapshotNode(name="t-1", hardware="t4", gpus=2),
    ]
    workloads = [
        _service("a", "p-1", 1.0, 22.9, 9.7),
        _service("t", "p-1", 0.47, 7.1, 4.5),
        _service("b", "p-2", 1.0, 22.9, 9.7),
        _service("u", "p-2", 0.32, 7.1, 3.5),
        _service("m", "t-1", 1.0, 2.3, 11.5),
    ]
    snapshot = Snapshot(site="s", nodes=nodes, workloads=workloads)
    # as at fleet scale: no move within a hardware type offered to the model, the start the plan if near the bound
    monkeypatch.setattr(recommend, "Problem", functools.partial(Problem, exact_model_limit=0, room_model_limit=0))
    settings = recommend.PlanSettings(min_monthly_savings=10.0, move_cost_usd=5.0, max_moves=10)
    plan = recommend.plan_snapshot(snapshot, load_catalog(), settings)
    s = plan.solver
    assert s.status == "HEURISTIC" and s.bound_savings_usd is not None and s.bound_savings_usd > 0
    assert s.savings_usd == s.bound_savings_usd
    moves = {(r.workload, r.from_node, r.to_node) for r in plan.recommendations}
    assert moves == {("u", "p-2", "p-1"), ("m", "t-1", "p-2")}
    replay(snapshot, plan)  # the share leaves before the service lands
