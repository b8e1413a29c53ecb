"""How far ingest runs behind the windows it receives."""

from __future__ import annotations

from collections import deque


class Lag:
    """Seconds from a window's end to its ingest, over the latest ``size`` windows."""

    def __init__(self, size: int = 4096) -> None:
        self._seconds: deque[float] = deque(maxlen=size)

    def add(self, seconds: float) -> None:
        self._seconds.append(max(0.0, seconds))

    def quantiles(self) -> dict[str, float]:
        if not self._seconds:
            return {}
        ordered = sorted(self._seconds)
        return {q: ordered[min(len(ordered) - 1, int(float(q) * len(ordered)))] for q in ("0.5", "0.95", "1")}
