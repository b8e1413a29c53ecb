"""Making room on the hardware the LP wants: a workload the packing could not place goes onto a node whose small
tenants move to other nodes of that hardware, into room too small for it.

The LP pools each hardware type's capacity, so it fills the cheapest type to the last unit; node by node, that
room is scattered in slivers beside small tenants, and a whole-GPU workload finds none. Moving one or two small
tenants to slivers elsewhere (an ejection chain one link deep) frees a whole block. A tenant that stays at home
moves at its one-off cost, and counts against the move budget; one the plan already moves there is only sent to
another node of the same hardware, free. The eviction is made only where the workload's saving covers its own
one-off cost and its tenants'.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

from optimizer.plan.rounding import Candidate

MAX_EVICTED = 3  # tenants moved aside for one workload: the slivers the LP counts are mostly within three
MAX_TENANTS = 6  # the smallest of a node's tenants considered for that


@dataclass(slots=True)
class Layout:
    """A placement being changed: each workload's node and what it holds there, room left on every node, the
    nodes of each hardware type ordered by room, and which (service, node) pairs received a replica."""

    cands: dict[str, Candidate]
    placed: dict[str, tuple[str, int]]
    room: dict[str, int]
    hardware: dict[str, str]
    taken: set[tuple[str, str]]
    move_cost: Mapping[str, float]  # workload id → the one-off cost of moving it
    already: dict[str, set[str]] = field(default_factory=dict)  # service → the nodes it ran on
    on: dict[str, set[str]] = field(default_factory=dict)  # node → workloads placed there
    by_room: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # hardware → (room, node), ascending
    _tenants: dict[str, list[tuple[float, int, int, str]]] = field(default_factory=dict)  # see tenants()

    def __post_init__(self) -> None:
        for c in self.cands.values():
            if c.service:
                self.already.setdefault(c.service, set()).add(c.node)
        for wid, (node, _) in self.placed.items():
            self.on.setdefault(node, set()).add(wid)
        for name, key in self.hardware.items():
            self.by_room.setdefault(key, []).append((self.room[name], name))
        for listed in self.by_room.values():
            listed.sort()

    def allowed(self, c: Candidate, node: str, sent: frozenset[tuple[str, str]] = frozenset()) -> bool:
        """Never a second replica on a node another replica moved to (or is being ``sent`` to), unless the
        service ran there already; never a node that does not meet what it needs beside GPUs."""
        if c.barred and node in c.barred:
            return False
        s = c.service
        return not (s and node not in self.already.get(s, set()) and ((s, node) in self.taken or (s, node) in sent))

    def best_fit(
        self,
        c: Candidate,
        gpus: int,
        key: str,
        skip: str,
        held: Mapping[str, int],
        sent: frozenset[tuple[str, str]] = frozenset(),
    ) -> str | None:
        """The node of hardware ``key`` (not ``skip``) that ``gpus`` fill best, ``held`` more of each taken."""
        listed = self.by_room.get(key, [])
        for i in range(bisect.bisect_left(listed, (gpus, "")), len(listed)):
            free, name = listed[i]
            if name != skip and free - held.get(name, 0) >= gpus and self.allowed(c, name, sent):
                return name
        return None

    def tenants(self, node: str) -> list[tuple[float, int, int, str]]:
        """``(one-off cost, moves, units held, id)`` of moving each workload on ``node`` elsewhere, cheapest and
        smallest first: one the plan already moves there is sent elsewhere at no cost and no extra move."""
        listed = self._tenants.get(node)
        if listed is None:
            listed = []
            for wid in self.on.get(node, ()):
                at_home = self.cands[wid].node == node
                cost = self.move_cost.get(wid, 0.0) if at_home else 0.0
                listed.append((cost, int(at_home), self.placed[wid][1], wid))
            listed.sort(key=lambda t: (t[0], t[2], t[3]))
            self._tenants[node] = listed
        return listed

    def put(self, wid: str, node: str, gpus: int) -> None:
        c = self.cands[wid]
        was, held = self.placed[wid]
        self._tenants.pop(was, None)
        self._tenants.pop(node, None)
        self._resize(was, held)
        self._resize(node, -gpus)
        self.on[was].discard(wid)
        self.on.setdefault(node, set()).add(wid)
        self.placed[wid] = (node, gpus)
        if c.service and node != c.node:
            self.taken.add((c.service, node))

    def _resize(self, node: str, delta: int) -> None:
        listed = self.by_room[self.hardware[node]]
        del listed[bisect.bisect_left(listed, (self.room[node], node))]
        self.room[node] += delta
        bisect.insort(listed, (self.room[node], node))


@dataclass(frozen=True, slots=True)
class _Eviction:
    cost: float  # one-off costs of the tenants moved from home
    moves: int  # of those
    node: str
    relocations: tuple[tuple[str, str, int], ...]  # (tenant, its new node, what it holds there)


def _evict(layout: Layout, node: str, need: int, best: float) -> _Eviction | None:
    """The cheapest set of ``node``'s tenants (cheaper than ``best``) whose departure frees ``need`` more units,
    each sent to the node of its hardware it fills best."""
    tenants = [t for t in layout.tenants(node) if t[2] < need + layout.room[node]][:MAX_TENANTS]
    if sum(t[2] for t in tenants) < need:
        return None
    found = None
    key = layout.hardware[node]
    for k in range(1, MAX_EVICTED + 1):
        for group in itertools.combinations(tenants, k):
            cost = sum(t[0] for t in group)
            if cost >= best or sum(t[2] for t in group) < need:
                continue
            held: dict[str, int] = {}
            sent: frozenset[tuple[str, str]] = frozenset()
            relocations = []
            for _, _, gpus, wid in sorted(group, key=lambda t: (-t[2], t[3])):
                tenant = layout.cands[wid]
                target = layout.best_fit(tenant, gpus, key, node, held, sent)
                if target is None:
                    break
                held[target] = held.get(target, 0) + gpus
                if tenant.service:
                    sent |= {(tenant.service, target)}
                relocations.append((wid, target, gpus))
            else:
                best = cost
                found = _Eviction(cost, sum(t[1] for t in group), node, tuple(relocations))
    return found


def make_room(pending: list[tuple[float, Candidate, str]], layout: Layout, moves_left: int) -> int:
    """Place the ``(monthly saving, workload, hardware)`` moves of ``pending`` the packing could not, by
    evicting small tenants (see the module's docstring); biggest saving first. Returns the moves made."""
    made = 0
    for saving, c, key in sorted(pending, key=lambda p: (-p[0], p[1].id)):
        gpus = c.by_type[key][1]
        worth = saving - layout.move_cost.get(c.id, 0.0)
        if worth <= 0 or made >= moves_left:
            continue
        node = layout.best_fit(c, gpus, key, c.node, {})
        eviction = None
        if node is None:
            for _, name in reversed(layout.by_room.get(key, [])):  # the roomiest first: ties go to them
                if layout.room[name] >= gpus or not layout.allowed(c, name):
                    continue
                found = _evict(layout, name, gpus - layout.room[name], eviction.cost if eviction else worth)
                if found is not None:
                    eviction = found
                    if found.cost == 0:
                        break
            if eviction is None or made + 1 + eviction.moves > moves_left:
                continue
            for wid, target, held in eviction.relocations:
                layout.put(wid, target, held)
            node = eviction.node
            made += eviction.moves
        layout.put(c.id, node, gpus)
        made += 1
    return made
