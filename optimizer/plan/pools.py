"""Identical nodes as pools: the model decides how many workloads go to a pool, then each is given a concrete
node of it quickly.

Only nodes that hold no movable workload are pooled, so a member's free room is fixed for the whole solve;
members share hardware and free GPU count. Workloads' GPU counts are mostly powers of two; for such divisible
sizes, the pool's capacity is exact with one constraint per size ``s``: the GPUs of workloads of at least ``s``
GPUs fit in ``members × s × ⌊room / s⌋``. First-fit decreasing then packs them (and a workload it cannot
place, which only odd sizes can cause, stays where it is).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

POOL_PREFIX = "pool:"


@dataclass(frozen=True, slots=True)
class Pool:
    key: str
    hardware: str
    room: int  # free GPUs on each member
    members: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.members)

    def capacity_by_size(self, sizes: Iterable[int]) -> dict[int, int]:
        """For each workload size ``s``: the GPUs workloads of at least ``s`` GPUs may take in the pool."""
        return {s: self.size * s * (self.room // s) for s in sorted(set(sizes)) if s > 0}


def build_pools(
    nodes: Iterable[tuple[str, str, int]],
    hosting: set[str],
    min_members: int = 2,
    kinds: Mapping[str, str] | None = None,
) -> list[Pool]:
    """Pools of ``(name, hardware, free GPUs)`` nodes that host no movable workload (``hosting``); ``kinds``: what
    else tells nodes apart (their CPUs, NVMe and tenants, by name), so that a pool holds only nodes alike in it."""
    groups: dict[tuple[str, int, str], list[str]] = {}
    for name, hardware, room in nodes:
        if name not in hosting and room > 0:
            kind = kinds.get(name, "") if kinds else ""
            groups.setdefault((hardware, room, kind), []).append(name)
    return [
        Pool(f"{POOL_PREFIX}{hardware}:{room}" + (f":{kind}" if kind else ""), hardware, room, tuple(sorted(names)))
        for (hardware, room, kind), names in sorted(groups.items())
        if len(names) >= min_members
    ]


def assign(
    pool: Pool, workloads: list[tuple[str, int, str | None]], prefer: dict[str, str] | None = None
) -> tuple[dict[str, str], list[str]]:
    """Concrete members for ``(id, gpus, service)`` workloads the plan sent to ``pool``: first-fit decreasing,
    never two replicas of one service on a member; a workload with a member in ``prefer`` (where an earlier plan
    sent it) gets that one first, unless that leaves more unplaced than packing without preferences. Returns the
    placement and the ids that did not fit."""
    wanted = {wid: m for wid, m in (prefer or {}).items() if m in pool.members}
    placed, unplaced = _packed(pool, workloads, wanted)
    if unplaced and wanted:
        plain = _packed(pool, workloads, {})
        if len(plain[1]) < len(unplaced):
            return plain
    return placed, unplaced


def _packed(
    pool: Pool, workloads: list[tuple[str, int, str | None]], wanted: dict[str, str]
) -> tuple[dict[str, str], list[str]]:
    room = dict.fromkeys(pool.members, pool.room)
    services: dict[str, set[str]] = {m: set() for m in pool.members}
    placed: dict[str, str] = {}
    unplaced: list[str] = []

    def fits(member: str, gpus: int, service: str | None) -> bool:
        return room[member] >= gpus and (service is None or service not in services[member])

    def put(wid: str, member: str, gpus: int, service: str | None) -> None:
        room[member] -= gpus
        if service is not None:
            services[member].add(service)
        placed[wid] = member

    ordered = sorted(workloads, key=lambda w: (-w[1], w[0]))
    for wid, gpus, service in ordered:
        if wid in wanted and fits(wanted[wid], gpus, service):
            put(wid, wanted[wid], gpus, service)
    for wid, gpus, service in ordered:
        if wid in placed:
            continue
        member = next((m for m in pool.members if fits(m, gpus, service)), None)
        if member is None:
            unplaced.append(wid)
            continue
        put(wid, member, gpus, service)
    return placed, unplaced
