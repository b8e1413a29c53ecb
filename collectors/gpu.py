"""NVIDIA GPUs through NVML (nvidia-ml-py).

Signals per GPU — gauges: ``util`` and ``mem_util`` (%), ``mem_used_mib``, ``power_w``, ``temp_c``,
``sm_clock_mhz``, and on Hopper and newer ``sm_active`` / ``tensor_active`` / ``dram_active`` (GPM, %);
counters: ``pcie_tx_bps`` / ``pcie_rx_bps`` (the cumulative PCIe byte fields, read in one batched
``nvmlDeviceGetFieldValues`` call; ``nvmlDeviceGetPcieThroughput`` is avoided because it samples for ~20 ms per
call), ``nvlink_tx_bps`` / ``nvlink_rx_bps`` (cumulative NVLink KiB summed over links), ``xid_events`` (from an
event set); latest values: ``last_xid``, ``ecc_uncorrected``, ``remapped_rows``, ``lost``.

MIG instances are devices of their own, indexed after the physical GPUs. Every getter tolerates NVML errors on
its own, so one unsupported field never drops a sample; a GPU that falls off the bus is reported, not fatal.
When NVML cannot start (no driver, no library) the collector is replaced by :class:`NullGpuCollector`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from agent.protocol import GpuInfo, WorkloadKind, WorkloadRef
from collectors.attribution import Attributor, OwnerReader
from collectors.base import Entity, Inventory, Sample
from collectors.gpm import GpmReader

log = logging.getLogger(__name__)

# Constants from nvml.h, kept here so a fake NVML in tests need not define them.
FI_PCIE_TX_BYTES = 197
FI_PCIE_RX_BYTES = 198
FI_NVLINK_DATA_TX_KIB = 138
FI_NVLINK_DATA_RX_KIB = 139
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
EVENT_XID_CRITICAL = 0x8
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVLINK_MAX_LINKS = 18
MAX_EVENTS_PER_TICK = 64
_VALUE_ATTR = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(slots=True)
class _Device:
    index: int
    handle: Any
    uuid: str
    parent: int | None = None  # MIG instances: the physical GPU's index
    links: int = 0
    gpm: GpmReader | None = None


class NullGpuCollector:
    """Stands in when no GPU can be read; the agent keeps running and says why in every message."""

    name = "gpu"

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def inventory(self) -> Inventory:
        return Inventory(gpu_unavailable=self.reason)

    def sample(self) -> list[Sample]:
        return []

    def workloads(self) -> list[WorkloadRef]:
        return []

    def close(self) -> None:
        return None


class NvmlGpuCollector:
    name = "gpu"

    def __init__(self, nvml: ModuleType, attributor: Attributor) -> None:
        self._nvml = nvml
        self._attributor = attributor
        self._owners = OwnerReader()
        self._devices: list[_Device] = []
        physical = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        for i, handle in enumerate(physical):
            device = _Device(i, handle, _text(self._try("nvmlDeviceGetUUID", handle) or f"GPU-{i}"))
            device.links = self._nvlink_links(handle)
            if GpmReader.supported(nvml, handle):
                device.gpm = GpmReader(nvml, handle)
            self._devices.append(device)
        for i, handle in enumerate(physical):
            self._devices.extend(self._mig_devices(i, handle, len(self._devices)))
        self._by_uuid = {d.uuid: d.index for d in self._devices}
        self._lost: set[int] = set()
        self._xids: dict[int, int] = {}
        self._last_xid: dict[int, int] = {}
        self._events = self._event_set(physical)

    def _try(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, fn)(*args)
        except self._nvml.NVMLError:
            return None
        except AttributeError:  # an older driver binding without this call
            return None

    def _nvlink_links(self, handle: Any) -> int:
        up = 0
        for link in range(NVLINK_MAX_LINKS):
            state = self._try("nvmlDeviceGetNvLinkState", handle, link)
            if state is None:
                break
            up += 1 if state else 0
        return up

    def _mig_devices(self, parent: int, handle: Any, next_index: int) -> list[_Device]:
        mode = self._try("nvmlDeviceGetMigMode", handle)
        if not mode or not mode[0]:
            return []
        out: list[_Device] = []
        for slot in range(self._try("nvmlDeviceGetMaxMigDeviceCount", handle) or 0):
            mig = self._try("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
            if mig is None:
                continue  # an empty slot
            uuid = _text(self._try("nvmlDeviceGetUUID", mig) or f"MIG-{parent}-{slot}")
            out.append(_Device(next_index + len(out), mig, uuid, parent=parent))
        return out

    def _event_set(self, physical: list[Any]) -> Any:
        events = self._try("nvmlEventSetCreate")
        if events is None:
            return None
        registered = 0
        for handle in physical:
            try:
                self._nvml.nvmlDeviceRegisterEvents(handle, EVENT_XID_CRITICAL, events)
                registered += 1
            except self._nvml.NVMLError:
                pass  # XID events are not supported on every GPU or driver
        return events if registered else None

    def inventory(self) -> Inventory:
        gpus = []
        for d in self._devices:
            h = d.handle
            mem = self._try("nvmlDeviceGetMemoryInfo", h)
            limit = self._try("nvmlDeviceGetPowerManagementLimit", h) if d.parent is None else None
            mig = self._try("nvmlDeviceGetMigMode", h) if d.parent is None else None
            name = _text(self._try("nvmlDeviceGetName", h) or "unknown")
            profile = name.rsplit(" MIG ", 1)[1] if d.parent is not None and " MIG " in name else None
            gpus.append(
                GpuInfo(
                    index=d.index,
                    uuid=d.uuid,
                    model=name,
                    memory_mib=int(mem.total // 2**20) if mem else 0,
                    nvlink_links=d.links,
                    pcie_gen=self._try("nvmlDeviceGetMaxPcieLinkGeneration", h) if d.parent is None else None,
                    pcie_width=self._try("nvmlDeviceGetMaxPcieLinkWidth", h) if d.parent is None else None,
                    mig_mode=bool(mig and mig[0]),
                    parent=d.parent,
                    mig_profile=profile,
                    power_limit_w=limit / 1000 if limit else None,
                )
            )
        driver = self._try("nvmlSystemGetDriverVersion")
        cuda = self._try("nvmlSystemGetCudaDriverVersion")
        return Inventory(
            gpus=gpus,
            driver_version=_text(driver) if driver else None,
            cuda_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
        )

    def _fields(self, handle: Any, links: int) -> dict[str, int]:
        """PCIe and NVLink cumulative counters in one batched NVML call."""
        ids: list[Any] = [FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES]
        for link in range(links):
            ids += [(FI_NVLINK_DATA_TX_KIB, link), (FI_NVLINK_DATA_RX_KIB, link)]
        values = self._try("nvmlDeviceGetFieldValues", handle, ids)
        out: dict[str, int] = {}
        for v in values or []:
            if v.nvmlReturn != 0:
                continue
            raw = int(getattr(v.value, _VALUE_ATTR.get(v.valueType, "ullVal")))
            if v.fieldId == FI_PCIE_TX_BYTES:
                out["pcie_tx_bps"] = raw
            elif v.fieldId == FI_PCIE_RX_BYTES:
                out["pcie_rx_bps"] = raw
            elif v.fieldId == FI_NVLINK_DATA_TX_KIB:
                out["nvlink_tx_bps"] = out.get("nvlink_tx_bps", 0) + raw * 1024
            elif v.fieldId == FI_NVLINK_DATA_RX_KIB:
                out["nvlink_rx_bps"] = out.get("nvlink_rx_bps", 0) + raw * 1024
        return out

    def _drain_events(self) -> None:
        """Count XID events since the last tick without blocking (timeout 0)."""
        if self._events is None:
            return
        for _ in range(MAX_EVENTS_PER_TICK):
            try:
                event = self._nvml.nvmlEventSetWait_v2(self._events, 0)
            except self._nvml.NVMLError:
                return  # NVML_ERROR_TIMEOUT: nothing pending
            uuid = _text(self._try("nvmlDeviceGetUUID", event.device) or "")
            index = self._by_uuid.get(uuid)
            if index is None:
                continue
            self._xids[index] = self._xids.get(index, 0) + 1
            self._last_xid[index] = int(event.eventData)
            log.warning("GPU %d reported XID %d", index, int(event.eventData))

    def _memory(self, index: int, handle: Any) -> tuple[Any, bool]:
        """(memory info or None, lost): a GPU that fell off the bus is logged once and reported, not fatal."""
        try:
            mem = self._nvml.nvmlDeviceGetMemoryInfo(handle)
        except self._nvml.NVMLError as exc:
            if getattr(exc, "value", None) == NVML_ERROR_GPU_IS_LOST:
                if index not in self._lost:
                    log.warning("GPU %d is lost (fallen off the bus); reporting it without samples", index)
                    self._lost.add(index)
                return None, True
            mem = None
        if index in self._lost:
            log.info("GPU %d answers again", index)
            self._lost.discard(index)
        return mem, False

    def _health(self, d: _Device) -> dict[str, float]:
        latest: dict[str, float] = {}
        if d.index in self._last_xid:
            latest["last_xid"] = self._last_xid[d.index]
        if d.parent is None:
            ecc = self._try(
                "nvmlDeviceGetTotalEccErrors", d.handle, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC
            )
            if ecc is not None:
                latest["ecc_uncorrected"] = int(ecc)
            rows = self._try("nvmlDeviceGetRemappedRows", d.handle)
            if rows is not None:
                latest["remapped_rows"] = int(rows[1])
        return latest

    def sample(self) -> list[Sample]:
        self._drain_events()
        out = []
        for d in self._devices:
            h = d.handle
            mem, lost = self._memory(d.index, h)
            if lost:
                out.append(Sample(Entity.GPU, str(d.index), latest={"lost": 1}))
                continue
            gauges: dict[str, float] = {}
            if (util := self._try("nvmlDeviceGetUtilizationRates", h)) is not None:
                gauges["util"] = float(util.gpu)
                gauges["mem_util"] = float(util.memory)
            if mem is not None:
                gauges["mem_used_mib"] = mem.used / 2**20
            if d.parent is None:
                if (power := self._try("nvmlDeviceGetPowerUsage", h)) is not None:
                    gauges["power_w"] = power / 1000
                if (temp := self._try("nvmlDeviceGetTemperature", h, NVML_TEMPERATURE_GPU)) is not None:
                    gauges["temp_c"] = float(temp)
                if (clock := self._try("nvmlDeviceGetClockInfo", h, NVML_CLOCK_SM)) is not None:
                    gauges["sm_clock_mhz"] = float(clock)
            if d.gpm is not None:
                gauges.update(d.gpm.read())
            counters = self._fields(h, d.links) if d.parent is None else {}
            counters["xid_events"] = self._xids.get(d.index, 0)
            out.append(Sample(Entity.GPU, str(d.index), gauges=gauges, counters=counters, latest=self._health(d)))
        return out

    def workloads(self) -> list[WorkloadRef]:
        owners: dict[str, tuple[WorkloadKind, str, str | None, set[int]]] = {}
        teams: dict[str, tuple[str | None, str | None]] = {}
        for d in self._devices:
            for proc in self._try("nvmlDeviceGetComputeRunningProcesses", d.handle) or []:
                owner = self._attributor.owner(int(proc.pid))
                entry = owners.setdefault(owner.id, (owner.kind, owner.name, owner.hint, set()))
                entry[3].add(d.index)
                if owner.id not in teams:
                    teams[owner.id] = self._owners.of(int(proc.pid), owner)
        return [
            WorkloadRef(
                id=wid,
                kind=kind,
                name=name,
                gpus=sorted(gpus),
                hint=hint,
                owner=teams[wid][0],
                owner_user=teams[wid][1],
            )
            for wid, (kind, name, hint, gpus) in sorted(owners.items())
        ]

    def close(self) -> None:
        for d in self._devices:
            if d.gpm is not None:
                d.gpm.close()
        if self._events is not None:
            self._try("nvmlEventSetFree", self._events)
        self._try("nvmlShutdown")


def open_gpu_collector(
    nvml: ModuleType | None = None, attributor: Attributor | None = None
) -> NvmlGpuCollector | NullGpuCollector:
    """Start NVML and return a GPU collector, or a null one that says why there is none."""
    if nvml is None:
        try:
            import pynvml as nvml_module
        except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
            return _disabled(f"nvidia-ml-py is not installed ({exc})")
        nvml = nvml_module
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return _disabled(f"NVML unavailable: {exc}")
    try:
        return NvmlGpuCollector(nvml, attributor or Attributor())
    except nvml.NVMLError as exc:
        return _disabled(f"NVML failed to enumerate GPUs: {exc}")


def _disabled(reason: str) -> NullGpuCollector:
    log.info("GPU collector disabled: %s", reason)
    return NullGpuCollector(reason)
