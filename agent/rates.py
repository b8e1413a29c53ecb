"""Per-second rates from cumulative counters: the one place counter wrap and reset are handled."""

from __future__ import annotations

from collections.abc import Hashable, Set

WRAP_32 = 2**32


class RateTracker:
    """Remembers the last value of each counter and turns the next one into a rate.

    A counter that goes backwards either wrapped at 32 bits (older drivers and kernels: the step is small once
    the wrap is added back) or was reset (a driver reload, a replaced device): a reset yields no rate for that
    second rather than a huge or negative one, and is counted in ``resets``.
    """

    def __init__(self) -> None:
        self._last: dict[Hashable, tuple[int, float]] = {}
        self.resets = 0

    def update(self, key: Hashable, value: int, now: float) -> tuple[float, float] | None:
        """Return (increase, elapsed seconds) since the previous value of ``key``, or None."""
        previous = self._last.get(key)
        self._last[key] = (value, now)
        if previous is None:
            return None
        last_value, last_time = previous
        elapsed = now - last_time
        if elapsed <= 0:
            return None
        delta = value - last_value
        if delta < 0:
            if last_value < WRAP_32 and 0 <= value + WRAP_32 - last_value < WRAP_32 // 2:
                delta = value + WRAP_32 - last_value
            else:
                self.resets += 1
                return None
        return float(delta), elapsed

    def forget(self, keep: Set[Hashable]) -> None:
        """Drop counters of entities that disappeared (an unplugged NIC)."""
        for key in [k for k in self._last if k not in keep]:
            del self._last[key]
