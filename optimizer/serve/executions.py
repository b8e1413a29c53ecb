"""What ``fleetfit apply`` ran for each action and what came of it, in the lifecycle's state file.

An execution is the scheduler's answer (applied, failed, notified), not the move itself: the recommendation stays
acknowledged until a plan sees its workload on the target hardware, which marks it applied and starts the
follow-up of its load there (optimizer/serve/outcomes.py). A failed or notified one may be tried again."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass

SCHEMA = """
CREATE TABLE IF NOT EXISTS executions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    rec_id TEXT NOT NULL,
    site TEXT NOT NULL,
    at REAL NOT NULL,
    backend TEXT NOT NULL,
    status TEXT NOT NULL,
    commands TEXT NOT NULL,
    output TEXT NOT NULL,
    who TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS executions_rec ON executions (rec_id, at);
"""


@dataclass(frozen=True, slots=True)
class Execution:
    rec_id: str
    site: str
    at: float
    backend: str
    status: str  # applied, failed, notified (optimizer.act.backend.Status)
    commands: tuple[str, ...]
    output: str
    who: str


def add(db: sqlite3.Connection, e: Execution) -> None:
    with db:
        db.execute(
            "INSERT INTO executions (rec_id, site, at, backend, status, commands, output, who) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (e.rec_id, e.site, e.at, e.backend, e.status, json.dumps(list(e.commands)), e.output, e.who),
        )


def latest(db: sqlite3.Connection, rec_ids: list[str]) -> dict[str, Execution]:
    """The last execution of each of ``rec_ids`` that has one."""
    out: dict[str, Execution] = {}
    for start in range(0, len(rec_ids), 500):
        chunk = rec_ids[start : start + 500]
        marks = ", ".join("?" for _ in chunk)
        query = (
            "SELECT rec_id, site, at, backend, status, commands, output, who FROM executions "
            f"WHERE rec_id IN ({marks}) ORDER BY at, id"
        )
        for rec_id, site, at, backend, status, commands, output, who in db.execute(query, chunk):
            try:
                listed = json.loads(commands)
            except ValueError:
                listed = []
            shown = tuple(str(c) for c in listed) if isinstance(listed, list) else ()
            out[rec_id] = Execution(rec_id, site, at, backend, status, shown, output, who)
    return out
