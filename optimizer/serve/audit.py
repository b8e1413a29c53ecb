"""The audit log: who decided what, when, from where, and what came of it.

Every acknowledge, dismiss, reopen and apply is one entry in the ``audit`` table of the optimizer's state file
(``fleetfit.db``, beside the recommendations it names). Entries are kept for ``RETENTION_DAYS`` and at most
``MAX_ENTRIES`` (the oldest go first), so a busy or hostile client can fill neither the disk nor the page.

Code that acts on a decision calls :func:`record`; the daemon and each command that decides point it at their state
file once with :func:`use`. Every entry is also logged on this module's logger, so the journal holds the trail even
where no state file is kept.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

RETENTION_DAYS = 365.0  # a year of decisions: an estimate of what a yearly access review looks back over
# about 25 MB: 245 bytes an entry measured (a pod's name, an IPv4 address, a short detail, indexes included);
# hundreds of decisions a day (an estimate of a busy fleet's) fit a year
MAX_ENTRIES = 100_000
PAGE_MAX = 500  # entries one request returns at most
_PRUNE_EVERY = 100  # entries written between two prunings (pruning reads the whole index)

# results an entry may name; callers may add their own, these are the ones the API writes
OK = "ok"
FORBIDDEN = "forbidden"  # the holder's role does not allow the action
REFUSED = "refused"  # allowed, but the state of the target did not (conflict, not found)
FAILED = "failed"  # allowed, tried, and it went wrong (a backend error, a busy database)

SCHEMA = """
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    action TEXT NOT NULL,
    who TEXT NOT NULL,
    client TEXT NOT NULL,
    target TEXT NOT NULL,
    workload TEXT,
    result TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_at ON audit (at);
CREATE INDEX IF NOT EXISTS audit_workload ON audit (workload, at);
CREATE INDEX IF NOT EXISTS audit_who ON audit (who, at);
"""

# Entries that could not be written, by reason (``fleetfit_audit_unrecorded_total``); for this process.
unrecorded: Counter[str] = Counter()


@dataclass(frozen=True, slots=True)
class Entry:
    id: int
    at: float  # Unix time
    action: str  # ack, dismiss, reopen, apply, ...
    who: str  # the token's holder ("shared-token" for the old shared token), or "local:USER" for a command
    where: str  # the client's address (a trusted proxy's X-Forwarded-For resolved), or "local" for a command
    target: str  # what was acted on: a recommendation id
    workload: str | None  # the target's workload, when known
    result: str  # ok, forbidden, refused, failed, or a backend's own word
    detail: str  # the new state, the reason for a refusal, a backend's answer

    def as_json(self) -> dict[str, object]:
        return asdict(self)


class AuditLog:
    """The ``audit`` table of one state file: one connection writes, another reads (WAL lets a page read while a
    write waits for the lock), each usable from any thread, one at a time."""

    def __init__(self, path: Path, retention_days: float = RETENTION_DAYS, max_entries: int = MAX_ENTRIES) -> None:
        self.path = path
        self.retention_s = retention_days * 86_400
        self.max_entries = max_entries
        self._db = sqlite3.connect(path, timeout=10, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()
        self._reader: sqlite3.Connection | None = None
        self._read_lock = threading.Lock()
        self._written = 0
        self.prune()

    def close(self) -> None:
        self._db.close()
        if self._reader is not None:
            self._reader.close()

    def add(
        self,
        action: str,
        who: str,
        where: str,
        target: str,
        result: str,
        detail: str = "",
        workload: str | None = None,
        now: float | None = None,
    ) -> Entry:
        """Write one entry; the target's workload is looked up among the recommendations when not given."""
        at = time.time() if now is None else now
        with self._lock, self._db:
            if workload is None:
                workload = self._workload_of(target)
            cursor = self._db.execute(
                "INSERT INTO audit (at, action, who, client, target, workload, result, detail) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (at, action, who, where, target, workload, result, detail),
            )
            self._written += 1
            entry_id = cursor.lastrowid
        if self._written % _PRUNE_EVERY == 0:
            try:
                self.prune(at)
            except sqlite3.Error as exc:  # the entry stands; pruning is tried again after the next ones
                log.warning("audit log %s not pruned: %s", self.path, exc)
        assert entry_id is not None
        return Entry(entry_id, at, action, who, where, target, workload, result, detail)

    def _workload_of(self, target: str) -> str | None:
        try:
            row = self._db.execute("SELECT workload FROM recommendations WHERE id = ?", (target,)).fetchone()
        except sqlite3.OperationalError:  # a state file without recommendations (a command's own)
            return None
        return None if row is None else str(row[0])

    def prune(self, now: float | None = None) -> int:
        """Drop entries older than the retention and past the most kept; how many went."""
        at = time.time() if now is None else now
        with self._lock, self._db:
            old = self._db.execute("DELETE FROM audit WHERE at < ?", (at - self.retention_s,)).rowcount
            over = self._db.execute(
                "DELETE FROM audit WHERE id <= (SELECT id FROM audit ORDER BY id DESC LIMIT 1 OFFSET ?)",
                (self.max_entries,),
            ).rowcount
        return old + over

    def query(
        self,
        workload: str | None = None,
        who: str | None = None,
        since: float | None = None,
        before_id: int | None = None,
        limit: int = 100,
    ) -> list[Entry]:
        """Entries matching every filter given, the latest first; ``before_id`` pages on from an earlier page's
        last id (stable while new entries arrive)."""
        clauses, args = [], []
        for clause, value in (
            ("workload = ?", workload),
            ("who = ?", who),
            ("at >= ?", since),
            ("id < ?", before_id),
        ):
            if value is not None:
                clauses.append(clause)
                args.append(value)
        where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
        with self._read_lock:
            if self._reader is None:
                self._reader = sqlite3.connect(self.path, timeout=10, check_same_thread=False)
            rows = self._reader.execute(
                "SELECT id, at, action, who, client, target, workload, result, detail FROM audit "
                f"{where}ORDER BY id DESC LIMIT ?",
                (*args, max(1, min(limit, PAGE_MAX))),
            ).fetchall()
        return [Entry(*row) for row in rows]


_current: list[AuditLog] = []  # the one log record() writes to in this process, when one is set


def use(audit_log: AuditLog | None) -> None:
    """Make ``audit_log`` the one :func:`record` writes to in this process (None: log lines only)."""
    _current[:] = [] if audit_log is None else [audit_log]


def current() -> AuditLog | None:
    """The audit log :func:`record` writes to, if any."""
    return _current[0] if _current else None


def record(
    action: str,
    who: str,
    where: str,
    target: str,
    result: str,
    detail: str = "",
    *,
    workload: str | None = None,
    now: float | None = None,
    into: AuditLog | None = None,
) -> Entry | None:
    """Record a decision or an action taken on one: ``who`` (a token's holder or local user) did ``action`` to
    ``target`` (a recommendation id) from ``where`` (a client address) with ``result``. Logged always; written to
    ``into``, else the log :func:`use` set, when there is one. Never raises: a failed write is logged and
    counted, and the action it records stands (the caller has done it). The entry, or None when not written."""
    log.info("audit: %s %s %s from %s: %s%s", who, action, target, where, result, f" ({detail})" if detail else "")
    audit_log = into or current()
    if audit_log is None:
        unrecorded["no_state_file"] += 1
        return None
    try:
        return audit_log.add(action, who, where, target, result, detail, workload, now)
    except sqlite3.Error as exc:
        unrecorded["database"] += 1
        log.error("audit entry for %s %s by %s not written: %s", action, target, who, exc)
        return None
