"""A placement from the bound's linear programme: each workload goes to the hardware type the LP gives most of
it, then onto a concrete node of that type, best fit first.

The LP pools each type's GPUs, so its solution is nearly integral and close to the best plan whenever packing
is not the binding constraint; packing it onto nodes loses little. The result is a complete, feasible
placement: CP-SAT's starting point on large fleets (where its own search barely starts before the time limit),
and the plan itself if CP-SAT returns nothing better.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Candidate:
    """One movable workload as the packing sees it."""

    id: str
    node: str  # where it runs now
    home: str  # its hardware
    gpus_now: int
    service: str | None
    by_type: dict[str, tuple[float, int]]  # hardware → (monthly cost, GPUs there); its own hardware included
    fractions: dict[str, float]  # hardware → the LP's share of it there


def pack(
    candidates: Iterable[Candidate],
    room: dict[str, int],
    hardware: dict[str, str],
    max_moves: int,
) -> dict[str, tuple[str, int]]:
    """Workload id → (node, GPUs held), within ``room`` (free GPUs of each node with every candidate at home)."""
    room = dict(room)
    nodes_of: dict[str, list[str]] = {}
    for name, key in hardware.items():
        nodes_of.setdefault(key, []).append(name)
    placed: dict[str, tuple[str, int]] = {}
    movers: list[tuple[float, Candidate, str]] = []
    for c in candidates:
        target = max(c.fractions, key=lambda k: (c.fractions[k], k == c.home), default=c.home)
        home_gpus = c.by_type[c.home][1]
        placed[c.id] = (c.node, home_gpus)  # until it has somewhere better to go
        room[c.node] += c.gpus_now - home_gpus  # resized in place: frees GPUs now
        if target != c.home and target in c.by_type:
            saving = c.by_type[c.home][0] - c.by_type[target][0]
            movers.append((saving, c, target))
    movers.sort(key=lambda m: (-m[0], -m[1].by_type[m[2]][1], m[1].id))
    already: dict[str, set[str]] = {}
    for c in (m[1] for m in movers):
        if c.service:
            already.setdefault(c.service, set()).add(c.node)
    taken: set[tuple[str, str]] = set()
    moves = 0
    pending = movers[:max_moves]
    progress = True
    while pending and progress:  # a departure may open room for one that did not fit in an earlier pass
        progress = False
        left = []
        for saving, c, target in pending:
            gpus = c.by_type[target][1]
            best = None
            for name in nodes_of.get(target, ()):
                free = room[name]
                if free < gpus or (best is not None and free >= room[best]):
                    continue
                if c.service and name not in already.get(c.service, set()) and (c.service, name) in taken:
                    continue
                best = name
                if free == gpus:
                    break
            if best is None or moves >= max_moves:
                left.append((saving, c, target))
                continue
            room[best] -= gpus
            room[c.node] += placed[c.id][1]
            placed[c.id] = (best, gpus)
            if c.service:
                taken.add((c.service, best))
            moves += 1
            progress = True
        pending = left
    return placed
