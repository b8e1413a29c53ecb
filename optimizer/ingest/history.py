"""The long view of each workload at bounded cost: full windows age out after the horizon, but every
10 minutes of a workload's load is kept as one digest for a day and an hour, enough to see a diurnal cycle and
the daily peak a placement must carry."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from optimizer.ingest.digest import WindowDigest

DIGEST_SECONDS = 600.0
# A day and an hour: a digest's end lies one period into what it covers, and a period closes at the first window
# past its ten minutes, so 144 digests span under 24 h and a day of history (``history_min_hours``) could never
# be shown.
DIGESTS_KEPT = 150


@dataclass(frozen=True, slots=True)
class Digest:
    end: float
    mean_util: float  # the workload's mean GPU utilisation over the period
    peak_p95: float  # the highest per-window p95 in the period
    mem_max_mib: float = 0.0  # the most memory any one of its GPUs held in the period


class DigestRing:
    """The last ``DIGESTS_KEPT`` digests of one workload, packed four floats each in one array: a day of them
    costs ~5 KiB instead of ~25 KiB as objects (docs/operations.md, "Memory"). Reads as a sequence of Digest."""

    __slots__ = ("_values",)
    _WIDTH = 4

    def __init__(self, digests: Iterable[Digest] = ()) -> None:
        self._values = array("d")
        for d in digests:
            self.append(d)

    def append(self, d: Digest) -> None:
        if len(self._values) >= DIGESTS_KEPT * self._WIDTH:
            del self._values[: self._WIDTH]  # the oldest goes: once per period, a copy of a few KiB
        self._values.extend((d.end, d.mean_util, d.peak_p95, d.mem_max_mib))

    def __len__(self) -> int:
        return len(self._values) // self._WIDTH

    def __getitem__(self, i: int) -> Digest:
        n = len(self)
        if not -n <= i < n:
            raise IndexError("digest index out of range")
        at = (i % n) * self._WIDTH
        return Digest(*self._values[at : at + self._WIDTH])

    def __iter__(self) -> Iterator[Digest]:
        v, w = self._values, self._WIDTH
        return (Digest(v[i], v[i + 1], v[i + 2], v[i + 3]) for i in range(0, len(v), w))

    def copy(self) -> DigestRing:
        ring = DigestRing()
        ring._values = array("d", self._values)
        return ring


@dataclass(slots=True)
class _Open:
    start: float
    total: float = 0.0
    count: int = 0
    peak: float = 0.0
    mem: float = 0.0


@dataclass(slots=True)
class History:
    """Per workload on one node: closed digests and the period being filled."""

    digests: dict[str, DigestRing] = field(default_factory=dict)
    _open: dict[str, _Open] = field(default_factory=dict)

    def add(self, window: WindowDigest) -> None:
        # The window's packed figures a column at a time (C calls, no object per GPU): this runs for every window.
        rows = window.gpu_rows
        width = int(rows[0])
        listed, means, p95s, mems = rows[1::width], rows[2::width], rows[3::width], rows[5::width]
        for ref in window.workloads:
            ids = set(ref.gpus)
            held = [k for k, index in enumerate(listed) if index in ids]  # 1.0 in {1} holds
            if not held:
                continue
            mean_of: Sequence[float] = means
            p95_of: Sequence[float] = p95s
            mem_of: Sequence[float] = mems
            if len(held) < len(listed):
                mean_of, p95_of, mem_of = [means[k] for k in held], [p95s[k] for k in held], [mems[k] for k in held]
            mean = sum(mean_of) / len(held)
            p95 = max(p95_of)
            current = self._open.get(ref.id)
            if current is None:
                current = self._open[ref.id] = _Open(window.start)
            elif window.end - current.start >= DIGEST_SECONDS:
                self._close(ref.id, current, window.start)
                current = self._open[ref.id] = _Open(window.start)
            current.total += mean
            current.count += 1
            current.peak = max(current.peak, p95)
            # an absent figure is NaN, which compares false: max() keeps what it has (0.0 at first) past it
            current.mem = max(current.mem, *mem_of)

    def _close(self, workload: str, period: _Open, end: float) -> None:
        if period.count:
            kept = self.digests.setdefault(workload, DigestRing())
            kept.append(Digest(end, period.total / period.count, period.peak, period.mem))

    def of(self, workload: str) -> list[Digest]:
        return list(self.digests.get(workload, ()))

    def retain(self, workloads: set[str]) -> None:
        """Forget every workload but ``workloads`` (those gone longer than the horizon)."""
        self.digests = {k: v for k, v in self.digests.items() if k in workloads}
        self._open = {k: v for k, v in self._open.items() if k in workloads}

    def copy(self) -> History:
        return History({k: v.copy() for k, v in self.digests.items()}, dict(self._open))
