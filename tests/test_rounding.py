"""The fill pass of fleet-scale starts: room left on cheaper hardware goes by saving per unit of capacity."""

from __future__ import annotations

from optimizer.plan.rounding import Candidate, fill

HARDWARE = {"dear-1": "dear", "cheap-1": "cheap"}


def _c(wid: str, gpus: int, saving: float, service: str | None = None) -> Candidate:
    # costs $100 a month where it runs; ``saving`` less on the cheap node, where it takes as much room
    return Candidate(wid, "dear-1", "dear", gpus, service, {"dear": (100.0, gpus), "cheap": (100.0 - saving, gpus)}, {})


def _moved(placed: dict[str, str]) -> set[str]:
    return {wid for wid, node in placed.items() if node == "cheap-1"}


def test_room_goes_to_the_most_saving_per_unit_not_the_biggest_saving() -> None:
    # 200 units free: the biggest saving (a, $30 in 150 units) would leave room for neither b nor c; b and c
    # ($25 each in 100 units) fit together and save $50
    cands = [_c("a", 150, 30.0), _c("b", 100, 25.0), _c("c", 100, 25.0)]
    home = {c.id: c.node for c in cands}
    room = {"dear-1": 400, "cheap-1": 200}
    assert _moved(fill(cands, home, room, HARDWARE, max_moves=10, move_cost={})) == {"b", "c"}
    # one move allowed: the densest, ties by id
    assert _moved(fill(cands, home, room, HARDWARE, max_moves=1, move_cost={})) == {"b"}


def test_a_move_whose_month_does_not_cover_its_one_off_cost_is_not_made() -> None:
    cands = [_c("small", 10, 4.0), _c("worth", 10, 6.0)]
    placed = fill(cands, {c.id: c.node for c in cands}, {"dear-1": 100, "cheap-1": 100}, HARDWARE, 10,
                  move_cost={"small": 5.0, "worth": 5.0})  # fmt: skip
    assert _moved(placed) == {"worth"}


def test_what_the_start_placed_keeps_its_room_and_two_replicas_never_share_a_node() -> None:
    cands = [_c("a", 150, 30.0), _c("r1", 20, 25.0, service="svc"), _c("r2", 20, 25.0, service="svc")]
    start = {"a": "cheap-1", "r1": "dear-1", "r2": "dear-1"}
    placed = fill(cands, start, {"dear-1": 400, "cheap-1": 200}, HARDWARE, 10, move_cost={})
    assert _moved(placed) == {"a", "r1"}  # 50 units left fit both replicas, but one node takes one of a service
