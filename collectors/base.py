"""The one small interface every telemetry source implements."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from pydantic import ValidationError

from agent.metrics import Family, labelled
from agent.protocol import DiskInfo, GpuFailure, GpuInfo, HostInfo, NicInfo, WorkloadRef

log = logging.getLogger(__name__)


class Entity(StrEnum):
    """What a sample describes; each maps onto one section of the telemetry window."""

    GPU = "gpu"
    NIC = "nic"
    DISK = "disk"
    MOUNT = "mount"
    HOST = "host"


@dataclass(slots=True)
class Sample:
    """One second of one entity.

    ``gauges`` are instantaneous values reported as they are. ``counters`` are cumulative counts, keyed by the
    window field their per-second rate becomes (``rx_bps`` holds total bytes received); the agent turns them
    into rates in one place (:mod:`agent.rates`), handling wrap and reset. ``latest`` values (error counts,
    flags) are reported as they stand at the end of the window.
    """

    entity: Entity
    key: str
    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    latest: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class Inventory:
    """A collector's share of the birth message."""

    gpus: list[GpuInfo] = field(default_factory=list)
    nics: list[NicInfo] = field(default_factory=list)
    disks: list[DiskInfo] = field(default_factory=list)
    gpu_unavailable: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    gpu_failures: list[GpuFailure] = field(default_factory=list)
    attribution_warning: str | None = None
    host: HostInfo | None = None  # CPUs, memory and storage beside the GPUs (collectors/hostinfo.py)

    def merge(self, other: Inventory) -> Inventory:
        return Inventory(
            gpus=self.gpus + other.gpus,
            nics=self.nics + other.nics,
            disks=self.disks + other.disks,
            gpu_unavailable=self.gpu_unavailable or other.gpu_unavailable,
            driver_version=self.driver_version or other.driver_version,
            cuda_version=self.cuda_version or other.cuda_version,
            gpu_failures=self.gpu_failures + other.gpu_failures,
            attribution_warning=self.attribution_warning or other.attribution_warning,
            host=self.host or other.host,
        )


class GpuInfoGuard:
    """Builds a GPU's birth entry so that one field the wire schema refuses leaves that field unread, not the GPU
    out: a vendor library may hand back a sentinel (0xFFFFFFFF for "not available" in NVML's and HLML's unsigned
    fields) or a garbled figure, and a ``GpuInfo`` that raises takes every GPU of the collector out of the birth.
    Only fields that may be None are left unread; any other refused (its index, its memory) still raises. Each
    refusal is counted by field and said once per field."""

    def __init__(self, source: str) -> None:
        self._source = source
        self.refused: dict[str, int] = {}

    def gpu(self, **fields: Any) -> GpuInfo:
        try:
            return GpuInfo(**fields)
        except ValidationError as exc:
            errors = exc.errors()
        names = {str(e["loc"][0]) for e in errors if e["loc"]}
        model = GpuInfo.model_fields
        # a field whose default is None says "not read" by being None; one with another default (0 links) would lie
        optional = {
            n for n in names if n in fields and n in model and not model[n].is_required() and model[n].default is None
        }
        if not names or names != optional:
            return GpuInfo(**fields)  # raises: a refused field the GPU cannot go without
        for name in sorted(optional):
            if name not in self.refused:
                log.warning(
                    "%s GPU %s: %s=%r is outside what the birth accepts; sent as unread",
                    self._source,
                    fields.get("index"),
                    name,
                    fields[name],
                )
            self.refused[name] = self.refused.get(name, 0) + 1
        return GpuInfo(**(fields | dict.fromkeys(optional)))

    def metric(self) -> Family:
        return labelled(
            "fleetfit_agent_gpu_fields_refused_total",
            "counter",
            "GPU inventory figures outside what the birth accepts, sent as unread, by field.",
            "field",
            self.refused,
        )


class Collector(Protocol):
    """A telemetry source. ``sample`` runs once a second.

    A collector whose calls can block (a vendor's C library, a firmware query, a network filesystem) says so with
    an attribute ``blocking = True``: the agent then calls it on a thread of its own, with a deadline, never on its
    event loop. Without it (kernel memory such as /proc/stat, simulated nodes) it is called on the loop: a thread
    handoff each second costs more CPU than such a read.
    """

    name: str

    def inventory(self) -> Inventory:
        """What this source contributes to the node's birth message."""
        ...

    def sample(self) -> list[Sample]:
        """Read every entity once."""
        ...

    def workloads(self) -> list[WorkloadRef]:
        """Workloads seen on this source's devices (GPU sources); called once per window."""
        ...

    def close(self) -> None:
        """Release handles; called once at shutdown."""
        ...
