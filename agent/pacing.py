"""How fast the agent publishes windows: a token bucket on the agent's own clock.

The optimizer limits each node by the time its windows cover, never by when they arrive (optimizer/ingest/fleet.py), so
a backlog is never refused for arriving at once. Pacing keeps a long replay from arriving as one burst all the
same: the broker, the optimizer's queue and the store take it in step with the live windows. The defaults: 300
windows at once, then 0.9 a second (a day of spool drains in about three hours beside the live windows).

The bucket is kept in the state directory, so that a restart (or a restart loop) does not hand the agent a fresh
burst each time.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

from agent.clock import Clock

log = logging.getLogger(__name__)

SAVE_EVERY_S = 1.0  # the bucket is written at most this often while windows are taken


class Pacer:
    """At most ``burst`` windows at once, ``rate`` a second sustained, on ``clock`` (simulated time included);
    with ``state``, the bucket is read from and kept in that file across restarts."""

    def __init__(self, rate: float, burst: int, clock: Clock, state: Path | None = None) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("pacing needs a positive rate and a burst of at least one")
        self.rate = rate
        self.burst = float(burst)
        self._clock = clock
        self._state = state
        self._tokens = self._restore()
        self._at = clock.monotonic()
        self._saved = float("-inf")
        self.waits = 0  # publishes that waited for a token: a replay being paced

    def _restore(self) -> float:
        """Tokens as the previous run left them, refilled for the time since; a full bucket when there is none."""
        if self._state is None:
            return self.burst
        try:
            saved = json.loads(self._state.read_text())
            tokens, wall = float(saved["tokens"]), float(saved["wall"])
        except FileNotFoundError:
            return self.burst
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("pacing state %s unreadable (%s); starting with a full burst", self._state, exc)
            return self.burst
        elapsed = max(0.0, self._clock.wall() - wall)
        return min(self.burst, max(0.0, tokens) + elapsed * self.rate)

    def save(self) -> None:
        """Keep the bucket in the state file (write and rename: a crash leaves the old one or the new one)."""
        if self._state is None:
            return
        self._refill()
        tmp = self._state.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps({"tokens": round(self._tokens, 3), "wall": self._clock.wall()}))
            os.replace(tmp, self._state)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            if self._saved != float("inf"):  # said once: a read-only or full disk paces from memory
                log.warning("cannot keep the pacing state in %s: %s", self._state, exc.strerror or exc)
            self._saved = float("inf")
            return
        self._saved = self._clock.monotonic()

    def _refill(self) -> None:
        now = self._clock.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now

    async def take(self) -> None:
        """Wait until one window may go, and count it as gone."""
        self._refill()
        if self._tokens < 1.0:
            self.waits += 1
            await self._clock.sleep_until(self._at + (1.0 - self._tokens) / self.rate)
            self._refill()
        self._tokens -= 1.0
        if self._state is not None and self._clock.monotonic() - self._saved >= SAVE_EVERY_S * self._clock.scale:
            self.save()
