"""The alert log in SQLite: what each receiver was told, so a restarted optimizer never posts twice, and since when
each site's moves have been proposed without a break, so a move is posted only once it has settled."""

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
CREATE TABLE IF NOT EXISTS alert_settling (
    site TEXT NOT NULL,
    rec_id TEXT NOT NULL,
    first_proposed REAL NOT NULL,
    last_plan REAL NOT NULL,
    plans INTEGER NOT NULL,
    PRIMARY KEY (site, rec_id)
);
"""


@dataclass(frozen=True, slots=True)
class Settling:
    """How long a move has been proposed without a break: since when, and by how many plans."""

    first_proposed: float
    plans: int


class SettlingUnsaved(sqlite3.Error):
    """The settling of a plan's moves, worked out from the log but not written back to it."""

    def __init__(self, settling: dict[str, Settling]) -> None:
        super().__init__("alert settling not written")
        self.settling = settling


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

    def proposed(self, site: str, rec_ids: list[str], generated_at: float, now: float) -> dict[str, Settling]:
        """Fold in a plan of ``site`` (made at ``generated_at``) that proposes ``rec_ids``: a move it proposes
        counts one more plan (the same plan twice counts once), a move it no longer proposes starts again from
        nothing if it comes back. Returns how long each proposed move has been proposed. When the fold cannot be
        written (a full disk), :class:`SettlingUnsaved` carries what it found all the same."""
        wanted = set(rec_ids)
        rows = self._db.execute(
            "SELECT rec_id, first_proposed, last_plan, plans FROM alert_settling WHERE site = ?", (site,)
        ).fetchall()
        known = {rec_id: (first, last, plans) for rec_id, first, last, plans in rows}
        out: dict[str, Settling] = {}
        updates = []
        for rec_id in sorted(wanted):
            first, last, plans = known.get(rec_id, (now, float("-inf"), 0))
            if generated_at > last:
                last, plans = generated_at, plans + 1
            updates.append((site, rec_id, first, last, plans))
            out[rec_id] = Settling(first, plans)
        try:
            with self._db:
                self._db.executemany(
                    "DELETE FROM alert_settling WHERE site = ? AND rec_id = ?",
                    [(site, rec_id) for rec_id in known if rec_id not in wanted],
                )
                self._db.executemany(
                    "INSERT INTO alert_settling (site, rec_id, first_proposed, last_plan, plans) "
                    "VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT(site, rec_id) DO UPDATE SET last_plan = excluded.last_plan, plans = excluded.plans",
                    updates,
                )
        except sqlite3.Error as exc:
            raise SettlingUnsaved(out) from exc
        return out

    # ------------------------------------------------------------------ handover between optimizers

    def posts(self, site: str, limit: int) -> list[tuple[str, str, Sent]]:
        """What was posted about ``site``'s moves, the latest first: (receiver, id, when)."""
        rows = self._db.execute(
            "SELECT receiver, rec_id, first_sent, last_sent, resolved_sent FROM alert_log WHERE site = ? "
            "ORDER BY MAX(last_sent, COALESCE(resolved_sent, 0)) DESC, rec_id, receiver LIMIT ?",
            (site, limit),
        ).fetchall()
        return [(receiver, rec_id, Sent(first, last, resolved)) for receiver, rec_id, first, last, resolved in rows]

    def adopt_posts(self, site: str, posts: list[tuple[str, str, Sent]]) -> int:
        """Take in what another optimizer posted about ``site``'s moves: for each receiver and move, the later
        post wins (a resolved notice, a reminder, a move posted again). Returns how many entries changed here."""
        changed = 0
        with self._db:
            for receiver, rec_id, theirs in posts:
                ours = self.sent(receiver, rec_id)
                if ours is not None and _latest(theirs) <= _latest(ours):
                    continue
                first = theirs.first_sent if ours is None else min(ours.first_sent, theirs.first_sent)
                self._db.execute(
                    "INSERT INTO alert_log (receiver, rec_id, site, first_sent, last_sent, resolved_sent) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(receiver, rec_id) DO UPDATE SET "
                    "first_sent = excluded.first_sent, last_sent = excluded.last_sent, "
                    "resolved_sent = excluded.resolved_sent",
                    (receiver, rec_id, site, first, theirs.last_sent, theirs.resolved_sent),
                )
                changed += 1
        return changed

    def settling(self, site: str, limit: int) -> dict[str, tuple[float, float, int]]:
        """How long each of ``site``'s proposed moves has been settling: id -> (first proposed, last plan, plans)."""
        rows = self._db.execute(
            "SELECT rec_id, first_proposed, last_plan, plans FROM alert_settling WHERE site = ? "
            "ORDER BY last_plan DESC, rec_id LIMIT ?",
            (site, limit),
        ).fetchall()
        return {rec_id: (first, last, plans) for rec_id, first, last, plans in rows}

    def adopt_settling(self, site: str, settling: dict[str, tuple[float, float, int]]) -> int:
        """Take in how long another optimizer saw ``site``'s moves proposed: the account of the later plan wins."""
        known = self.settling(site, 1 << 30)
        newer = [
            (site, rec_id, first, last, plans)
            for rec_id, (first, last, plans) in settling.items()
            if rec_id not in known or last > known[rec_id][1]
        ]
        with self._db:
            self._db.executemany(
                "INSERT INTO alert_settling (site, rec_id, first_proposed, last_plan, plans) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT(site, rec_id) DO UPDATE SET first_proposed = excluded.first_proposed, "
                "last_plan = excluded.last_plan, plans = excluded.plans",
                newer,
            )
        return len(newer)


def _latest(sent: Sent) -> float:
    return max(sent.last_sent, sent.resolved_sent or 0.0)
