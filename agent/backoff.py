"""Jittered exponential backoff for reconnect loops."""

from __future__ import annotations

import random


class Backoff:
    """Full jitter: each delay is uniform in [0, min(cap, base * 2**attempt)], so a fleet that lost its broker
    at the same moment does not reconnect in lockstep."""

    def __init__(self, base: float = 0.5, cap: float = 30.0, rng: random.Random | None = None) -> None:
        self.base = base
        self.cap = cap
        self.attempt = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        ceiling = min(self.cap, self.base * 2**self.attempt)
        self.attempt = min(self.attempt + 1, 32)
        return self._rng.uniform(0, ceiling)

    def reset(self) -> None:
        self.attempt = 0
