"""Making room: a workload the packing could not place goes where small tenants can move aside into slivers."""

from __future__ import annotations

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
