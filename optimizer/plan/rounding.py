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
    barred: frozenset[str] | None = None  # nodes that do not meet what it needs beside GPUs


def _best_fit(
    c: Candidate,
    gpus: int,
    nodes: Iterable[str],
    room: dict[str, int],
    already: dict[str, set[str]],
    taken: set[tuple[str, str]],
) -> str | None:
    """The node of ``nodes`` whose free GPUs ``gpus`` fill best (least left over), never a second replica of a
    service on a node another of its replicas moved to (``taken``) unless the service already ran there."""
    best = None
    for name in nodes:
        free = room[name]
        if free < gpus or (best is not None and free >= room[best]) or (c.barred and name in c.barred):
            continue
        if c.service and name not in already.get(c.service, set()) and (c.service, name) in taken:
            continue
        best = name
        if free == gpus:
            break
    return best


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
    movers.sort(key=lambda m: (-m[1].by_type[m[2]][1], -m[0], m[1].id))
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
            best = _best_fit(c, gpus, nodes_of.get(target, ()), room, already, taken)
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


def fill(
    candidates: Iterable[Candidate],
    placed: dict[str, str],
    room: dict[str, int],
    hardware: dict[str, str],
    max_moves: int,
    move_cost: dict[str, float],
) -> dict[str, str]:
    """``placed`` (workload id → node) with more moves: the room it leaves on cheaper hardware goes to the
    workloads still at home that save the most per GPU there, each onto the node it fills best.

    Both starting placements pack by total saving, biggest first, so the hardware everyone wants fills with
    large workloads and ends in slivers no whole one fits; the LP counts that room as usable. Filling by saving
    per unit of capacity is the usual knapsack heuristic, and best fit keeps the slivers small. A move is made
    only where its first month's saving covers its one-off cost (``move_cost``), as in the planner's objective."""
    room = dict(room)
    cands = {c.id: c for c in candidates}
    nodes_of: dict[str, list[str]] = {}
    for name, key in sorted(hardware.items()):
        nodes_of.setdefault(key, []).append(name)
    out = dict(placed)
    moves = 0
    taken: set[tuple[str, str]] = set()
    already: dict[str, set[str]] = {}
    for c in cands.values():
        if c.service:
            already.setdefault(c.service, set()).add(c.node)
    for c in cands.values():
        node = out[c.id]
        gpus = c.by_type[hardware[node]][1] if node != c.node else c.by_type[c.home][1]
        room[node] -= gpus
        if node != c.node:
            moves += 1
            if c.service:
                taken.add((c.service, node))
    options = []
    for c in cands.values():
        if out[c.id] != c.node:
            continue
        home_cost = c.by_type[c.home][0]
        for key, (cost, gpus) in c.by_type.items():
            net = home_cost - cost - move_cost.get(c.id, 0.0)
            if key != c.home and net > 0:
                options.append((net / gpus, net, c.id, key))
    options.sort(key=lambda o: (-o[0], -o[1], o[2], o[3]))
    for _, _, wid, key in options:
        if moves >= max_moves:
            break
        c = cands[wid]
        if out[wid] != c.node:
            continue  # placed by a better option already
        gpus = c.by_type[key][1]
        best = _best_fit(c, gpus, nodes_of.get(key, ()), room, already, taken)
        if best is None:
            continue
        room[best] -= gpus
        room[c.node] += c.by_type[c.home][1]
        out[wid] = best
        if c.service:
            taken.add((c.service, best))
        moves += 1
    return out
