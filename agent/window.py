"""Turns 1 Hz samples into telemetry windows: mean / p95 / max / std per signal, plus the per-second GPU
utilisation series the classifier uses for burstiness and cross-GPU synchronisation."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from pydantic import BaseModel

from agent.protocol import (
    FLOAT32_MAX,
    HOST_PERCENT_FIELDS,
    PERCENT_FIELDS,
    DiskWindow,
    GpuWindow,
    HostWindow,
    MountWindow,
    NicWindow,
    Stats,
    Telemetry,
    WorkloadRef,
    series,
)
from agent.rates import RateTracker
from collectors.base import Entity, Sample

# Counters reported as a count over the window rather than as a per-second rate.
_COUNT_FIELDS = frozenset({"errors", "drops", "xid_events"})
# What the receiver accepts of a gauge: a percentage within 0-100, anything else not negative. A value past these
# (amdsmi's 65535 for "not available" on older releases, a negative power reading) is a glitch, dropped like NaN.
_LIMITS = dict.fromkeys(PERCENT_FIELDS + HOST_PERCENT_FIELDS, 100.0)
_SECTIONS: dict[Entity, type[GpuWindow | NicWindow | DiskWindow | MountWindow]] = {
    Entity.GPU: GpuWindow,
    Entity.NIC: NicWindow,
    Entity.DISK: DiskWindow,
    Entity.MOUNT: MountWindow,
}


class WindowBuilder:
    """Accumulates samples for the open window; ``close`` emits it and starts the next."""

    def __init__(self, node: str, site: str, session: int) -> None:
        self.node = node
        self.site = site
        self.session = session
        self._rates = RateTracker()
        self._values: dict[tuple[Entity, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        self._counts: dict[tuple[Entity, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self._latest: dict[tuple[Entity, str], dict[str, float]] = defaultdict(dict)
        self._seen: set[tuple[Entity, str, str]] = set()
        self.samples = 0

    @property
    def counter_resets(self) -> int:
        return self._rates.resets

    def add(self, samples: Iterable[Sample], now: float) -> None:
        """Fold one tick's samples in; ``now`` is the tick's time in seconds (any steady clock)."""
        # Every second, for every signal of every entity: names are looked up once, not per value.
        seen, update, limits = self._seen, self._rates.update, _LIMITS
        all_values, latest, counts = self._values, self._latest, self._counts
        for s in samples:
            entity = (s.entity, s.key)
            values = all_values[entity]
            if s.latest:
                latest[entity].update(s.latest)
            for name, value in s.gauges.items():
                if 0.0 <= value <= limits.get(name, FLOAT32_MAX):  # a driver glitch (NaN too) must not poison it
                    values[name].append(float(value))
            for name, total in s.counters.items():
                key = (s.entity, s.key, name)
                seen.add(key)
                step = update(key, total, now)
                if step is None:
                    continue
                if name in _COUNT_FIELDS:
                    counts[entity][name] += step[0]
                else:
                    values[name].append(step[0] / step[1])
        self.samples += 1

    def close(
        self,
        seq: int,
        start: float,
        end: float,
        workloads: list[WorkloadRef],
        gpu_unavailable: str | None = None,
    ) -> Telemetry:
        try:
            return self._build(seq, start, end, workloads, gpu_unavailable)
        finally:  # a window that cannot be built costs that window only, never the ones after it
            self._rates.forget(self._seen)  # counters of entities gone during the whole window
            self._seen = set()
            self._values.clear()
            self._counts.clear()
            self._latest.clear()
            self.samples = 0

    def _build(
        self, seq: int, start: float, end: float, workloads: list[WorkloadRef], gpu_unavailable: str | None
    ) -> Telemetry:
        owner = {g: w.id for w in workloads for g in w.gpus}
        gpus: list[GpuWindow] = []
        nics: list[NicWindow] = []
        disks: list[DiskWindow] = []
        mounts: list[MountWindow] = []
        host = HostWindow()
        entities = set(self._values) | set(self._latest)
        for entity, key in sorted(entities, key=lambda ek: (ek[0], _natural(ek[1]))):
            values = self._values.get((entity, key), {})
            fields: dict[str, object] = {name: Stats.of(v) for name, v in values.items() if v}
            fields.update({name: int(v) for name, v in self._counts.get((entity, key), {}).items()})
            fields.update(self._latest.get((entity, key), {}))
            if entity is Entity.HOST:
                host = HostWindow.model_validate(_known(HostWindow, fields))
                continue
            model = _SECTIONS[entity]
            if entity is Entity.GPU:
                fields.update(index=int(key), util_series=series(values.get("util", [])), workload=owner.get(int(key)))
                if "lost" in fields:
                    fields["lost"] = bool(fields["lost"])
            elif entity is Entity.MOUNT:
                fields["path"] = key
            else:
                fields["name"] = key
            section = model.model_validate(_known(model, fields))
            if isinstance(section, GpuWindow):
                gpus.append(section)
            elif isinstance(section, NicWindow):
                nics.append(section)
            elif isinstance(section, DiskWindow):
                disks.append(section)
            else:
                mounts.append(section)
        return Telemetry(
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
            mounts=mounts,
            workloads=workloads,
        )


def _known(model: type[BaseModel], fields: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in fields.items() if k in model.model_fields}


def _natural(key: str) -> tuple[int, str]:
    return (int(key), "") if key.isdigit() else (1 << 30, key)
