"""An order a capacity team can carry a plan out in, on the snapshot the plan came from.

Each action frees GPUs where it leaves (``release`` on ``source``) and takes GPUs where it lands (``need`` on
``target``). Waves are computed by replaying the plan: an action joins the first wave whose starting room holds
it, and what a wave frees counts only from the next one, so the actions of a wave can run in parallel, in any
order. An action that lands on a node other actions must leave first waits for them (``after``).

When no pending action fits anywhere (moves that wait on each other in a cycle), one of them is staged through
free room on a third node that can host it: one whose leaving lets another pending action land, and each action
at most once (an action staged for nothing would hop between free nodes for ever); when no such room exists, the
smallest cycle is reported as a swap carried out together (both stop, both start). The plan's final placement
fits, so the pending actions carried out together always do: ordering never drops an action.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Action:
    id: str
    source: str
    release: float  # GPUs freed on ``source``
    target: str | None = None  # None: nothing to land (reclaim, right-size)
    need: float = 0.0  # GPUs taken on ``target``


@dataclass(slots=True)
class Step:
    """Where an action stands in the order."""

    wave: int = 0
    after: list[str] = field(default_factory=list)
    via_node: str | None = None
    via_wave: int | None = None
    swap: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Ledger:
    """Per node: the room before the plan, and what landed and left, in order."""

    start: dict[str, float]
    arrived: dict[str, float] = field(default_factory=dict)
    departures: dict[str, list[tuple[str, float]]] = field(default_factory=dict)

    def land(self, node: str, need: float) -> float:
        """Record an arrival; returns how many of its GPUs had to be freed by departures."""
        self.arrived[node] = self.arrived.get(node, 0.0) + need
        return self.arrived[node] - self.start.get(node, 0.0)

    def waited_for(self, node: str, deficit: float) -> list[str]:
        """The earliest departures from ``node`` that freed ``deficit`` GPUs."""
        out, freed = [], 0.0
        for aid, released in self.departures.get(node, []):
            if freed >= deficit - EPS:
                break
            out.append(aid)
            freed += released
        return out


def order(
    actions: Iterable[Action],
    room: dict[str, float],
    can_stage: Callable[[Action, str], bool] = lambda a, n: False,
) -> dict[str, Step]:
    """Waves and dependencies for ``actions`` (in priority order) given each node's free ``room`` now."""
    pending = list(actions)
    room = dict(room)
    ledger = _Ledger(dict(room))
    steps = {a.id: Step() for a in pending}
    wave = 0
    while pending:
        wave += 1
        fits = dict(room)
        ready: list[Action] = []
        for a in pending:
            if a.target is None or a.need <= fits.get(a.target, 0.0) + EPS:
                ready.append(a)
                if a.target is not None:
                    fits[a.target] = fits.get(a.target, 0.0) - a.need
        if not ready:
            pending = _unblock(pending, room, ledger, steps, wave, can_stage)
            continue
        for a in ready:
            _carry_out(a, room, ledger, steps[a.id], wave)
        done = {a.id for a in ready}
        pending = [a for a in pending if a.id not in done]
    return steps


def _carry_out(a: Action, room: dict[str, float], ledger: _Ledger, step: Step, wave: int) -> None:
    step.wave = wave
    if a.target is not None:
        room[a.target] = room.get(a.target, 0.0) - a.need
        deficit = ledger.land(a.target, a.need)
        if deficit > EPS:
            step.after += [d for d in ledger.waited_for(a.target, deficit) if d != a.id and d not in step.after]
    room[a.source] = room.get(a.source, 0.0) + a.release
    ledger.departures.setdefault(a.source, []).append((a.id, a.release))


def _unblock(
    pending: list[Action],
    room: dict[str, float],
    ledger: _Ledger,
    steps: dict[str, Step],
    wave: int,
    can_stage: Callable[[Action, str], bool],
) -> list[Action]:
    """Break a deadlock in ``wave``: stage one action through free room, or carry out a swap."""
    roomiest = sorted(((free, n) for n, free in room.items() if free > EPS), key=lambda fn: (-fn[0], fn[1]))
    for a in sorted(pending, key=lambda x: (x.need, x.id)):
        if steps[a.id].via_node is not None or not _frees_a_landing(a, pending, room):
            continue
        spot = next(
            (n for free, n in roomiest if free < a.need - EPS or (n not in (a.source, a.target) and can_stage(a, n))),
            None,
        )
        if spot is not None and room[spot] < a.need - EPS:
            spot = None
        if spot is not None:
            hop = Action(a.id, a.source, a.release, spot, a.need)
            _carry_out(hop, room, ledger, steps[a.id], wave)
            steps[a.id].via_node, steps[a.id].via_wave = spot, wave
            rest = Action(a.id, spot, a.need, a.target, a.need)
            return [rest if x.id == a.id else x for x in pending]
    group = _cycle(pending, room) or pending
    ids = [a.id for a in group]
    # carried out together: every member's departure counts for every member's arrival
    for a in group:
        room[a.source] = room.get(a.source, 0.0) + a.release
        ledger.departures.setdefault(a.source, []).append((a.id, a.release))
    for a in group:
        step = steps[a.id]
        step.wave = wave
        step.swap = [i for i in ids if i != a.id]
        if a.target is not None:
            room[a.target] = room.get(a.target, 0.0) - a.need
            deficit = ledger.land(a.target, a.need)
            if deficit > EPS:
                waits = ledger.waited_for(a.target, deficit)
                step.after += [d for d in waits if d not in ids and d not in step.after]
    done = set(ids)
    return [a for a in pending if a.id not in done]


def _frees_a_landing(a: Action, pending: list[Action], room: dict[str, float]) -> bool:
    """Whether ``a`` leaving its node lets another pending action land there."""
    freed = room.get(a.source, 0.0) + a.release
    return any(b.target == a.source and b.id != a.id and b.need <= freed + EPS for b in pending)


def _cycle(pending: list[Action], room: dict[str, float]) -> list[Action] | None:
    """The shortest cycle of actions each landing where the next leaves that fits when carried out together."""
    leaving: dict[str, list[Action]] = {}
    for a in pending:
        leaving.setdefault(a.source, []).append(a)
    best: list[Action] | None = None
    for first in pending:
        paths, seen = [[first]], {first.id}  # breadth first, back to ``first``'s source
        while paths and (best is None or len(paths[0]) < len(best)):
            grown: list[list[Action]] = []
            for path in paths:
                last = path[-1]
                if last.target is None:
                    continue
                if last.target == first.source and _fits_together(path, room):
                    best = path
                    break
                for nxt in leaving.get(last.target, []):
                    if nxt.id not in seen:
                        seen.add(nxt.id)
                        grown.append([*path, nxt])
            else:
                paths = grown
                continue
            break
    return best


def _fits_together(group: list[Action], room: dict[str, float]) -> bool:
    after = dict(room)
    for a in group:
        after[a.source] = after.get(a.source, 0.0) + a.release
        if a.target is not None:
            after[a.target] = after.get(a.target, 0.0) - a.need
    return all(v >= -EPS for v in after.values())


def waiting_on(after: dict[str, list[str]], dismissed: set[str]) -> dict[str, list[str]]:
    """For each action (id → the ids it waits for or swaps with), the dismissed ones it waits for, directly or
    through others: such an action cannot be carried out as planned."""
    out: dict[str, list[str]] = {}
    for start, direct in after.items():
        found: set[str] = set()
        seen, stack = {start}, list(direct)
        while stack:
            rid = stack.pop()
            if rid in seen:
                continue
            seen.add(rid)
            if rid in dismissed:
                found.add(rid)
            stack += after.get(rid, [])
        out[start] = sorted(found)
    return out
