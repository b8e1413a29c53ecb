"""The alert log in SQLite: what each receiver was told, so a restarted optimizer never posts twice."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS alert_log (
    receiver TEXT NOT NULL,
    rec_id TEXT NOT NULL,
    site TEXT NOT NULL,
    first_sent REAL NOT NULL,
    last_sent REAL NOT NULL,
    resolved_sent REAL,
    PRIMARY KEY (receiver, rec_id)
);
"""


@dataclass(frozen=True, slots=True)
class Sent:
    first_sent: float
    last_sent: float
    resolved_sent: float | None


class Journal:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, timeout=10)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def sent(self, receiver: str, rec_id: str) -> Sent | None:
        row = self._db.execute(
            "SELECT first_sent, last_sent, resolved_sent FROM alert_log WHERE receiver = ? AND rec_id = ?",
            (receiver, rec_id),
        ).fetchone()
        return Sent(*row) if row else None

    def mark_firing(self, receiver: str, site: str, rec_ids: list[str], now: float) -> None:
        with self._db:
            self._db.executemany(
                "INSERT INTO alert_log (receiver, rec_id, site, first_sent, last_sent) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT(receiver, rec_id) DO UPDATE SET last_sent = excluded.last_sent, resolved_sent = NULL",
                [(receiver, rec_id, site, now, now) for rec_id in rec_ids],
            )

    def mark_resolved(self, receiver: str, rec_ids: list[str], now: float) -> None:
        with self._db:
            self._db.executemany(
                "UPDATE alert_log SET resolved_sent = ? WHERE receiver = ? AND rec_id = ?",
                [(now, receiver, rec_id) for rec_id in rec_ids],
            )
