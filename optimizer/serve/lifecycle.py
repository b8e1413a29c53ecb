"""The recommendation lifecycle, kept in SQLite in the optimizer's state directory.

A recommendation is ``new`` when a plan first proposes it; a person ``acknowledged`` or ``dismissed`` it; it is
``applied`` once the workload is seen on the recommended hardware; it ``expired`` when plans stop proposing it
before that. Ids are stable across solves, so states survive re-planning and restarts.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import re
import sqlite3
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import ParamSpec, TypeVar

from agent.protocol import Plan, Recommendation
from optimizer.plan.ordering import waiting_on
from optimizer.plan.render import order_key
from optimizer.serve import executions, outcomes
from optimizer.serve.executions import Execution
from optimizer.serve.outcomes import Outcome

DB_NAME = "fleetfit.db"


class RecState(StrEnum):
    NEW = "new"
    ACKNOWLEDGED = "acknowledged"
    DISMISSED = "dismissed"
    APPLIED = "applied"
    EXPIRED = "expired"


OPEN = (RecState.NEW, RecState.ACKNOWLEDGED)
UNATTRIBUTED_OWNER = "(unattributed)"  # optimizer.serve.report.UNATTRIBUTED, as the ledger stores it
UNSEEN_EXPIRY_S = 3600.0  # an open move whose workload no plan has seen or classified for this long expires
# reopening takes back an acknowledgement made by mistake as well as a dismissal
CHANGEABLE = {
    RecState.ACKNOWLEDGED: OPEN,
    RecState.DISMISSED: OPEN,
    RecState.NEW: (RecState.DISMISSED, RecState.ACKNOWLEDGED),
}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS recommendations (
    id TEXT PRIMARY KEY,
    site TEXT NOT NULL,
    workload TEXT NOT NULL,
    state TEXT NOT NULL,
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL,
    changed REAL NOT NULL,
    body TEXT NOT NULL,
    decided REAL,
    decided_by TEXT
);
CREATE INDEX IF NOT EXISTS recommendations_site_state ON recommendations (site, state);
"""
# Added since the table was first shipped: when a person last decided on a move (acknowledged, dismissed, reopened)
# and on which optimizer; NULL when nobody has. A handover compares decisions, never the plan's own changes.
_ADDED_COLUMNS = (("decided", "REAL"), ("decided_by", "TEXT"))
# A person's decisions that a handover carries to the next owner of a site (applied and expired the plan decides).
DECIDABLE = (RecState.NEW, RecState.ACKNOWLEDGED, RecState.DISMISSED)


class LifecycleError(ValueError):
    pass


# A pod a scheduler moves is a new pod: a new uid, and for a Deployment's pods a new name suffix
# (``<deployment>-<replica set hash>-<5 characters>``); a StatefulSet's pod keeps its name. The name without
# those suffixes is the service a moved pod continues.
_POD_SUFFIX = re.compile(r"-(?:[bcdfghjklmnpqrstvwxz2456789]{6,10}-)?[bcdfghjklmnpqrstvwxz2456789]{5}$")


def service_of(name: str) -> str:
    """The service a workload's name belongs to: a Kubernetes pod name without its generated suffixes."""
    return _POD_SUFFIX.sub("", name)


def _successors(plan: Plan, placements: dict[str, str], rec: Recommendation) -> list[str]:
    """Workloads that may continue ``rec``'s on its target hardware after a scheduler moved it: other ids of the
    same service, on the recommended hardware."""
    if not rec.workload_name:
        return []
    wanted = service_of(rec.workload_name)
    return [
        w.id
        for w in plan.workloads
        if w.id != rec.workload and placements.get(w.id) == rec.to_hardware and service_of(w.name) == wanted
    ]


@dataclass(frozen=True, slots=True)
class Tracked:
    recommendation: Recommendation
    site: str
    state: RecState
    first_seen: float
    last_seen: float
    changed: float


class Lifecycle:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # the daemon opens it on the event loop's thread and uses it from its writer thread (Offloaded)
        self._db = sqlite3.connect(path, timeout=10, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")  # the CLI reads while the daemon writes
        self._db.executescript(_SCHEMA)
        self._add_columns()
        self._db.executescript(outcomes.SCHEMA)
        self._db.executescript(executions.SCHEMA)
        self.problem: str | None = None  # why states are not kept where they belong (optimizer.serve.statedb)

    def _add_columns(self) -> None:
        have = {row[1] for row in self._db.execute("PRAGMA table_info(recommendations)")}
        for name, kind in _ADDED_COLUMNS:
            if name in have:
                continue
            try:
                with self._db:
                    self._db.execute(f"ALTER TABLE recommendations ADD COLUMN {name} {kind}")
            except sqlite3.OperationalError as exc:  # another connection added it first
                if "duplicate column" not in str(exc):
                    raise

    @classmethod
    def in_state_dir(cls, state_dir: Path, repair: bool = False) -> Lifecycle:
        """The lifecycle in ``state_dir``. With ``repair`` (the daemon), a damaged or foreign file is moved aside
        and an unwritable directory replaced, so that the daemon starts whatever it finds (``problem`` says)."""
        if not repair:
            return cls(state_dir / DB_NAME)
        from optimizer.serve.statedb import open_state

        opened = open_state(state_dir, DB_NAME)
        lifecycle = cls(opened.path)
        lifecycle.problem = opened.problem
        return lifecycle

    def close(self) -> None:
        self._db.close()

    def record(
        self, plan: Plan, placements: dict[str, str], now: float | None = None
    ) -> list[tuple[Recommendation, RecState]]:
        """Fold a plan in. ``placements`` maps each workload seen and classified to the hardware it runs on now;
        an open move of a workload missing from it stays open for ``UNSEEN_EXPIRY_S``.

        Returns the open moves this plan resolved: applied (the workload is on the recommended hardware) or
        expired (no longer proposed)."""
        now = time.time() if now is None else now
        resolved: list[tuple[Recommendation, RecState]] = []
        proposed = {r.id: r for r in plan.recommendations}
        with self._db:
            for r in plan.recommendations:
                self._db.execute(
                    "INSERT INTO recommendations (id, site, workload, state, first_seen, last_seen, changed, body) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT(id) DO UPDATE SET last_seen = excluded.last_seen, body = excluded.body, "
                    "state = CASE WHEN recommendations.state IN ('expired', 'applied') THEN 'new' "
                    "ELSE recommendations.state END, "
                    "decided = CASE WHEN recommendations.state IN ('expired', 'applied') THEN NULL "
                    "ELSE recommendations.decided END",
                    (r.id, plan.site, r.workload, RecState.NEW, now, now, now, r.model_dump_json()),
                )
            rows = self._db.execute(
                "SELECT id, workload, body, last_seen FROM recommendations WHERE site = ? AND state IN (?, ?)",
                (plan.site, *OPEN),
            ).fetchall()
            for rec_id, workload, body, last_seen in rows:
                if rec_id in proposed:
                    continue
                rec = Recommendation.model_validate_json(body)
                here = workload in placements
                successors = [] if here or rec.kind == "reclaim" else _successors(plan, placements, rec)
                if not here and not successors and now - last_seen < UNSEEN_EXPIRY_S:
                    # Not withdrawn, only not seen (a restart, a silent node, a class not yet known): kept open.
                    continue
                if rec.kind == "reclaim":  # released: the workload is gone
                    done = not here
                else:
                    done = bool(successors) or placements.get(workload) == rec.to_hardware
                new_state = RecState.APPLIED if done else RecState.EXPIRED
                self._db.execute(
                    "UPDATE recommendations SET state = ?, changed = ? WHERE id = ?", (new_state, now, rec_id)
                )
                if done and len(successors) <= 1:  # several replicas there: which one continues it is unknown
                    follow = successors[0] if successors else None
                    outcomes.begin(self._db, plan.site, rec, now, follow)  # its load on the new hardware
                resolved.append((rec, new_state))
            self._mark_waiting(plan.site)
        return resolved

    def _mark_waiting(self, site: str) -> list[str]:
        """Mark each open recommendation of ``site`` with the dismissed ones it waits for (``blocked_by``);
        returns the ids whose mark changed. Call inside a transaction."""
        rows = self._db.execute(
            "SELECT id, state, body FROM recommendations WHERE site = ? AND state IN (?, ?, ?)",
            (site, *OPEN, RecState.DISMISSED),
        ).fetchall()
        recs = {rec_id: Recommendation.model_validate_json(body) for rec_id, _, body in rows}
        dismissed = {rec_id for rec_id, state, _ in rows if state == RecState.DISMISSED}
        marks = waiting_on({i: [*r.after, *r.swap] for i, r in recs.items()}, dismissed)
        changed = []
        for rec_id, state, _ in rows:
            rec = recs[rec_id]
            if state != RecState.DISMISSED and rec.blocked_by != marks[rec_id]:
                body = rec.model_copy(update={"blocked_by": marks[rec_id]}).model_dump_json()
                self._db.execute("UPDATE recommendations SET body = ? WHERE id = ?", (body, rec_id))
                changed.append(rec_id)
        return changed

    def states(self, rec_ids: Iterable[str]) -> dict[str, RecState]:
        """The current state of each of ``rec_ids`` that is tracked."""
        ids = list(rec_ids)
        out: dict[str, RecState] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            query = f"SELECT id, state FROM recommendations WHERE id IN ({', '.join('?' for _ in chunk)})"
            out.update((rec_id, RecState(state)) for rec_id, state in self._db.execute(query, chunk))
        return out

    def set_state(self, rec_id: str, state: RecState, now: float | None = None) -> Tracked:
        """A person's decision: acknowledge or dismiss, or reopen (a dismissed or acknowledged one back to new)."""
        current = self.get(rec_id)
        if current is None:
            raise LifecycleError(f"no recommendation {rec_id}")
        allowed = CHANGEABLE.get(state, ())
        if current.state not in allowed and current.state != state:
            raise LifecycleError(f"recommendation {rec_id} is {current.state}; it cannot become {state}")
        at = time.time() if now is None else now
        with self._db:
            self._db.execute(
                "UPDATE recommendations SET state = ?, changed = ?, decided = ?, decided_by = NULL WHERE id = ?",
                (state, at, at, rec_id),
            )
            self._mark_waiting(current.site)  # what waits for a dismissed action cannot go ahead as planned
        updated = self.get(rec_id)
        assert updated is not None
        return updated

    def decisions(self, site: str, limit: int) -> builtins.list[tuple[str, RecState, float, str | None]]:
        """People's decisions on the site's moves still open or dismissed, the latest first: (id, state, when, on
        which optimizer; None: this one). An acknowledged or dismissed move from before decisions were dated counts
        as decided when it last changed."""
        rows = self._db.execute(
            "SELECT id, state, COALESCE(decided, changed), decided_by FROM recommendations "
            "WHERE site = ? AND (state IN (?, ?) OR (state = ? AND decided IS NOT NULL)) "
            "ORDER BY COALESCE(decided, changed) DESC, id LIMIT ?",
            (site, RecState.ACKNOWLEDGED, RecState.DISMISSED, RecState.NEW, limit),
        ).fetchall()
        return [(rec_id, RecState(state), at, by) for rec_id, state, at, by in rows]

    def adopt(self, site: str, decisions: Iterable[tuple[str, RecState, float, str]]) -> builtins.list[str]:
        """Take in decisions made on another optimizer (``(id, state, when, where)``): for each move of ``site``
        known here and still open or dismissed, the later decision wins, this one's or the other's. A move not
        known here yet is left alone (the caller offers the decisions again with the next plan). Returns the ids
        whose state changed."""
        changed = []
        with self._db:
            for rec_id, state, at, by in decisions:
                if state not in DECIDABLE:
                    continue
                row = self._db.execute(
                    "SELECT state, decided, changed FROM recommendations WHERE id = ? AND site = ?", (rec_id, site)
                ).fetchone()
                if row is None or RecState(row[0]) not in DECIDABLE:
                    continue
                here = row[1] if row[1] is not None else row[2] if row[0] != RecState.NEW else None
                if here is not None and at <= here:
                    continue
                self._db.execute(
                    "UPDATE recommendations SET state = ?, changed = ?, decided = ?, decided_by = ? WHERE id = ?",
                    (state, at, at, by, rec_id),
                )
                if row[0] != state:
                    changed.append(rec_id)
            if changed:
                self._mark_waiting(site)
        return changed

    def bodies(self, rec_ids: Iterable[str]) -> dict[str, Recommendation]:
        """The last planned form of each of ``rec_ids`` that is tracked."""
        ids = builtins.list(rec_ids)
        out: dict[str, Recommendation] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            query = f"SELECT id, body FROM recommendations WHERE id IN ({', '.join('?' for _ in chunk)})"
            out.update((i, Recommendation.model_validate_json(body)) for i, body in self._db.execute(query, chunk))
        return out

    def get(self, rec_id: str) -> Tracked | None:
        rows = list(self._select("WHERE id = ?", (rec_id,)))
        return rows[0] if rows else None

    def list(self, site: str | None = None, states: Iterable[RecState] = OPEN) -> list[Tracked]:
        """Recommendations in ``states`` (the open ones by default), per site in the order to carry them out
        (wave by wave), biggest saving first within a wave."""
        clauses, args = [], []
        if site:
            clauses.append("site = ?")
            args.append(site)
        wanted = list(states)
        if wanted:
            clauses.append(f"state IN ({', '.join('?' for _ in wanted)})")
            args += [s.value for s in wanted]
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        return sorted(self._select(where, tuple(args)), key=lambda t: (t.site, *order_key(t.recommendation)))

    def of_workload(self, workload: str, site: str | None = None) -> tuple[Tracked, ...]:
        """Every move ever proposed for ``workload`` (in ``site``, when given), in any state, newest first, with the
        applied move that made it (a rescheduled pod continues the one a move was proposed for)."""
        mine = "(workload = ? OR id IN (SELECT id FROM outcomes WHERE workload = ?))"
        where, args = (
            (f"WHERE {mine} AND site = ?", (workload, workload, site)) if site else (f"WHERE {mine}", (workload,) * 2)
        )
        return tuple(sorted(self._select(where, args), key=lambda t: -t.first_seen))

    def kept_owners(self, rec_ids: Iterable[str]) -> dict[str, tuple[str | None, str | None]]:
        """For each of ``rec_ids``: the workload that continued it once applied (a rescheduled pod has a new id; None
        when none was followed), and the owner the showback ledger last charged it under (that workload's, else the
        one the move was proposed for; None when neither was charged). A move applied is no longer where its first
        workload ran, so that workload's live owner is gone; these say whose it was."""
        ids = builtins.list(rec_ids)
        kept = self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'workload_owners'")
        charged = kept.fetchone() is not None  # the ledger made it (a state directory without showback has none)
        out: dict[str, tuple[str | None, str | None]] = {}
        owner = "COALESCE(f.owner, o.owner)" if charged else "NULL"
        joins = (
            "LEFT JOIN workload_owners f ON f.site = r.site AND f.workload = c.workload AND f.owner != ? "
            "LEFT JOIN workload_owners o ON o.site = r.site AND o.workload = r.workload AND o.owner != ? "
            if charged
            else ""
        )
        for start in range(0, len(ids), 400):
            chunk = ids[start : start + 400]
            query = (
                f"SELECT r.id, c.workload, {owner} FROM recommendations r LEFT JOIN outcomes c ON c.id = r.id "
                f"{joins}WHERE r.id IN ({', '.join('?' for _ in chunk)})"
            )
            args = [UNATTRIBUTED_OWNER] * 2 if charged else []
            for rec_id, follow, kept_owner in self._db.execute(query, [*args, *chunk]):
                out[rec_id] = (follow, kept_owner)
        return out

    def add_execution(self, execution: Execution) -> None:
        """Keep what ``fleetfit apply`` ran for an action and the scheduler's answer."""
        executions.add(self._db, execution)

    def executions_of(self, rec_ids: Iterable[str]) -> dict[str, Execution]:
        """The last execution of each of ``rec_ids`` that has one."""
        return executions.latest(self._db, builtins.list(rec_ids))

    def outcomes(self, site: str | None = None, now: float | None = None) -> builtins.list[Outcome]:
        """Applied actions and what was observed after them (those of the last day, if ``now`` is given)."""
        return outcomes.following(self._db, site, now)

    def outcomes_of(self, rec_ids: Iterable[str]) -> dict[str, Outcome]:
        return outcomes.of_ids(self._db, list(rec_ids))

    def save_outcomes(self, observed: builtins.list[Outcome], now: float | None = None) -> None:
        outcomes.save(self._db, observed, time.time() if now is None else now)

    def _select(self, where: str, args: tuple[object, ...]) -> Iterable[Tracked]:
        query = f"SELECT site, state, first_seen, last_seen, changed, body FROM recommendations {where}"
        for site, state, first, last, changed, body in self._db.execute(query, args):
            yield Tracked(Recommendation.model_validate(json.loads(body)), site, RecState(state), first, last, changed)


P = ParamSpec("P")
T = TypeVar("T")


class Offloaded:
    """The daemon's lifecycle, off the event loop.

    SQLite blocks while another process (``fleetfit recommendations ack``, a backup) holds the write lock, for
    up to the connection's timeout. Writes run on one thread with the daemon's connection, in order; reads run
    on another with their own connection, which WAL lets read while a write waits. The loop itself (ingest,
    ``/healthz``, the console) never waits on the database.
    """

    def __init__(self, lifecycle: Lifecycle) -> None:
        self.lifecycle = lifecycle
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="fleetfit-db-write")
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="fleetfit-db-read")
        self._read_db: Lifecycle | None = None  # opened and used on the reader thread only

    async def write(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` (a method of ``self.lifecycle``) on the writer thread."""
        return await asyncio.get_running_loop().run_in_executor(self._writer, partial(fn, *args, **kwargs))

    async def read(self, fn: Callable[[Lifecycle], T]) -> T:
        """Run ``fn`` with the reader thread's own connection."""
        return await asyncio.get_running_loop().run_in_executor(self._reader, self._with_reader, fn)

    def _with_reader(self, fn: Callable[[Lifecycle], T]) -> T:
        if self._read_db is None:
            self._read_db = Lifecycle(self.lifecycle.path)
        return fn(self._read_db)

    def close(self) -> None:
        """Finish queued work and close the reader's connection (the daemon's stays with its owner)."""
        self._writer.shutdown(wait=True)
        if self._read_db is not None:
            self._reader.submit(self._read_db.close).result()
        self._reader.shutdown(wait=True)
