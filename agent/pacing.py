"""How fast the agent publishes windows: a token bucket on the agent's own clock.

The optimizer holds each node to ``node_window_rate`` windows a second with a burst of ``node_window_burst``
(optimizer/fleet.py) and refuses the excess before decoding it. An agent back from a long broker outage holds
hours of windows in its spool; published as fast as the link allows, all but the first burst would be refused
and lost. Paced under the optimizer's limit, the backlog arrives whole, oldest first, and the live windows with
it. The defaults match: agent 0.9 windows/s and 300 at once against the optimizer's 1.0 and 360.
"""

from __future__ import annotations

from agent.clock import Clock


class Pacer:
    """At most ``burst`` windows at once, ``rate`` a second sustained, on ``clock`` (simulated time included)."""

    def __init__(self, rate: float, burst: int, clock: Clock) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("pacing needs a positive rate and a burst of at least one")
        self.rate = rate
        self.burst = float(burst)
        self._clock = clock
        self._tokens = self.burst
        self._at = clock.monotonic()
        self.waits = 0  # publishes that waited for a token: a replay being paced

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
