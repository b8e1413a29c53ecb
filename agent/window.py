"""Turns 1 Hz samples into telemetry windows: mean / p95 / max / std per signal, plus the per-second GPU
utilisation series the classifier uses for burstiness and cross-GPU synchronisation."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from agent.protocol import (
    DiskWindow,
    GpuWindow,
    HostWindow,
    NicWindow,
    Stats,
    Telemetry,
    WorkloadRef,
    series,
)
from agent.rates import RateTracker
from collectors.base import Entity, Sample

# Counters reported as a count over the window rather than as a per-second rate.
_COUNT_FIELDS = frozenset({"errors", "drops"})


class WindowBuilder:
    """Accumulates samples for the open window; ``close`` emits it and starts the next."""

    def __init__(self, node: str, site: str, session: int) -> None:
        self.node = node
        self.site = site
        self.session = session
        self._rates = RateTracker()
        self._values: dict[tuple[Entity, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        self._counts: dict[tuple[Entity, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.samples = 0

    @property
    def counter_resets(self) -> int:
        return self._rates.resets

    def add(self, samples: Iterable[Sample], now: float) -> None:
        """Fold one tick's samples in; ``now`` is the tick's time in seconds (any steady clock)."""
        seen = set()
        for s in samples:
            entity = (s.entity, s.key)
            values = self._values[entity]
            for name, value in s.gauges.items():
                values[name].append(float(value))
            for name, total in s.counters.items():
                key = (s.entity, s.key, name)
                seen.add(key)
                step = self._rates.update(key, total, now)
                if step is None:
                    continue
                delta, elapsed = step
                if name in _COUNT_FIELDS:
                    self._counts[entity][name] += delta
                else:
                    values[name].append(delta / elapsed)
        self._rates.forget(seen)
        self.samples += 1

    def close(
        self,
        seq: int,
        start: float,
        end: float,
        workloads: list[WorkloadRef],
        gpu_unavailable: str | None = None,
    ) -> Telemetry:
        owner = {g: w.id for w in workloads for g in w.gpus}
        gpus: list[GpuWindow] = []
        nics: list[NicWindow] = []
        disks: list[DiskWindow] = []
        host = HostWindow()
        for (entity, key), values in sorted(self._values.items(), key=lambda kv: (kv[0][0], _natural(kv[0][1]))):
            stats = {name: Stats.of(v) for name, v in values.items() if v}
            counts = {name: int(v) for name, v in self._counts.get((entity, key), {}).items()}
            if entity is Entity.GPU:
                index = int(key)
                fields = {k: v for k, v in stats.items() if k in GpuWindow.model_fields}
                gpus.append(
                    GpuWindow(
                        index=index,
                        util_series=series(values.get("util", [])),
                        workload=owner.get(index),
                        **fields,
                    )
                )
            elif entity is Entity.NIC:
                fields = {k: v for k, v in stats.items() if k in NicWindow.model_fields}
                nics.append(NicWindow(name=key, **fields, **counts))
            elif entity is Entity.DISK:
                fields = {k: v for k, v in stats.items() if k in DiskWindow.model_fields}
                disks.append(DiskWindow(name=key, **fields))
            else:
                host = HostWindow(**{k: v for k, v in stats.items() if k in HostWindow.model_fields})
        window = Telemetry(
            node=self.node,
            site=self.site,
            session=self.session,
            seq=seq,
            start=start,
            end=end,
            samples=self.samples,
            gpus=gpus,
            gpu_unavailable=gpu_unavailable,
            nics=nics,
            disks=disks,
            host=host,
            workloads=workloads,
        )
        self._values.clear()
        self._counts.clear()
        self.samples = 0
        return window


def _natural(key: str) -> tuple[int, str]:
    return (int(key), "") if key.isdigit() else (1 << 30, key)
