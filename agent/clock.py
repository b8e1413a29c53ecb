"""Time for the agent: a monotonic schedule and wall-clock stamps, optionally running faster than real time."""

from __future__ import annotations

import asyncio
import time


class Clock:
    """``scale`` > 1 makes simulated seconds pass faster: at 10, a 10 s window closes every real second."""

    def __init__(self, scale: float = 1.0) -> None:
        if scale <= 0:
            raise ValueError("time scale must be positive")
        self.scale = scale
        self._mono0 = time.monotonic()
        self._wall0 = time.time()

    def monotonic(self) -> float:
        """Seconds on this clock since it was made; never goes back."""
        return (time.monotonic() - self._mono0) * self.scale

    def wall(self) -> float:
        """Unix time on this clock (real time when the scale is 1)."""
        if self.scale == 1.0:
            return time.time()
        return self._wall0 + self.monotonic()

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until ``monotonic()`` reaches ``deadline``."""
        delay = (deadline - self.monotonic()) / self.scale
        if delay > 0:
            await asyncio.sleep(delay)
