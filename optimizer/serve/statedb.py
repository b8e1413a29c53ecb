"""The optimizer's state file, opened so that nothing wrong with it stops the daemon.

``fleetfit.db`` in the state directory holds recommendation states, the alert log and the showback ledger. A file
that is not a database (corrupt, truncated), or a database of something else, is moved aside and a fresh one
started; a state directory the daemon cannot write (read-only, not its own) is replaced by a private temporary
one. Either way the daemon plans and alerts as before, logs what it did, counts it and reports itself degraded
on ``/healthz``: states and the alert log then last until the next restart only.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# Columns each table must have where it exists: a table of that name without them belongs to something else.
REQUIRED_COLUMNS = {
    "recommendations": {"id", "site", "workload", "state", "first_seen", "last_seen", "changed", "body"},
    "alert_log": {"receiver", "rec_id", "site", "first_sent", "last_sent", "resolved_sent"},
    "usage": {"hour", "site", "owner", "hardware", "workload_class", "waste_kind", "gpu_hours", "held_usd"},
    "audit": {"id", "at", "action", "who", "client", "target", "workload", "result", "detail"},
    "executions": {"rec_id", "site", "at", "backend", "status", "commands", "output", "who"},
}

# Why the state file was not used as found, by reason (``fleetfit_state_problems_total``); for this process.
problems: Counter[str] = Counter()


@dataclass(frozen=True, slots=True)
class StateFile:
    path: Path  # the database to use
    problem: str | None  # why state is not kept as it should be; None when all is well


def _check(path: Path) -> str | None:
    """Why ``path`` cannot serve as the state file ("damaged: ...", "foreign: ...", "read_only: ..."), or None."""
    try:
        db = sqlite3.connect(path, timeout=10)
    except sqlite3.Error as exc:
        return f"read_only: {exc}"
    try:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for table, needed in REQUIRED_COLUMNS.items():
            if table in tables:
                columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                if not needed <= columns:
                    return f"foreign: its table {table} lacks {', '.join(sorted(needed - columns))}"
        if db.execute("PRAGMA quick_check(1)").fetchone() != ("ok",):
            return "damaged: quick_check failed"
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("BEGIN IMMEDIATE")  # takes the write lock: a read-only file or directory says so here
        db.rollback()
    except sqlite3.OperationalError as exc:
        text = str(exc)
        if "readonly" in text or "unable to open" in text or "read-only" in text:
            return f"read_only: {text}"
        if "locked" in text or "busy" in text:
            return None  # another process (`fleetfit recommendations ack`) holds it for a moment: it is sound
        return f"damaged: {text}"
    except sqlite3.DatabaseError as exc:  # "file is not a database", "database disk image is malformed"
        return f"damaged: {exc}"
    finally:
        db.close()
    return None


def _move_aside(path: Path) -> Path | None:
    """Rename ``path`` (and its WAL files) out of the way; the new name, or None when it cannot be moved."""
    target = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
    try:
        path.replace(target)
    except OSError as exc:
        log.error("cannot move %s aside: %s", path, exc.strerror or exc)
        return None
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(OSError):
            path.with_name(path.name + suffix).replace(target.with_name(target.name + suffix))
    return target


def _temporary(name: str) -> Path:
    """A private directory of this process's for a state file that will not outlive it."""
    return Path(tempfile.mkdtemp(prefix="fleetfit-state-")) / name


def open_state(state_dir: Path, name: str) -> StateFile:
    """The state file to use under ``state_dir``: the one there when it is sound, a fresh one when it was damaged
    or foreign (moved aside), or a temporary one when the directory cannot be written."""
    path = state_dir / name
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return _fallback(path, f"read_only: cannot create {state_dir}: {exc.strerror or exc}")
    why = _check(path)
    if why is None:
        return StateFile(path, None)
    reason, _, detail = why.partition(": ")
    if reason == "read_only":
        return _fallback(path, why)
    moved = _move_aside(path)
    problems[reason] += 1
    if moved is None:
        return _fallback(path, why)
    again = _check(path)
    if again is not None:
        return _fallback(path, again)
    problem = f"{path} was {reason} ({detail}): moved aside to {moved.name}, started afresh"
    log.error("state file %s", problem.removeprefix(f"{path} "))
    return StateFile(path, problem)


def _fallback(path: Path, why: str) -> StateFile:
    reason, _, detail = why.partition(": ")
    problems[reason] += 1
    temporary = _temporary(path.name)
    problem = (
        f"{path} cannot be used ({reason}: {detail}): recommendation states and the alert log are kept in "
        f"{temporary} until the optimizer stops"
    )
    log.error("state file %s", problem.removeprefix(f"{path} "))
    return StateFile(temporary, problem)
