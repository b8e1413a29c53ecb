"""NVIDIA GPUs through NVML (nvidia-ml-py).

Signals per GPU — gauges: ``util`` and ``mem_util`` (%), ``mem_used_mib``, ``power_w``, ``temp_c``,
``sm_clock_mhz``; counters: ``pcie_tx_bps`` / ``pcie_rx_bps`` (cumulative PCIe bytes), ``nvlink_tx_bps`` /
``nvlink_rx_bps`` (cumulative NVLink KiB summed over links, converted to bytes).

Every getter tolerates NVML errors on its own, so one unsupported field never drops a sample. When NVML
cannot start (no driver, no library) the collector is replaced by :class:`NullGpuCollector`, which reports why.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

from agent.protocol import GpuInfo, WorkloadKind, WorkloadRef
from collectors.attribution import Attributor
from collectors.base import Entity, Inventory, Sample

log = logging.getLogger(__name__)

# Field ids from nvml.h; kept here so a fake NVML in tests need not define them.
FI_PCIE_TX_BYTES = 197
FI_PCIE_RX_BYTES = 198
FI_NVLINK_DATA_TX_KIB = 138
FI_NVLINK_DATA_RX_KIB = 139
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVLINK_MAX_LINKS = 18
NVML_ERROR_GPU_IS_LOST = 15
_VALUE_ATTR = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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
        count = nvml.nvmlDeviceGetCount()
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._links = [self._nvlink_links(h) for h in self._handles]
        self._lost: set[int] = set()

    def _try(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, fn)(*args)
        except self._nvml.NVMLError:
            return None

    def _nvlink_links(self, handle: Any) -> int:
        up = 0
        for link in range(NVLINK_MAX_LINKS):
            state = self._try("nvmlDeviceGetNvLinkState", handle, link)
            if state is None:
                break
            up += 1 if state else 0
        return up

    def inventory(self) -> Inventory:
        gpus = []
        for i, h in enumerate(self._handles):
            mem = self._try("nvmlDeviceGetMemoryInfo", h)
            limit = self._try("nvmlDeviceGetPowerManagementLimit", h)
            mig = self._try("nvmlDeviceGetMigMode", h)
            gpus.append(
                GpuInfo(
                    index=i,
                    uuid=_text(self._try("nvmlDeviceGetUUID", h) or f"GPU-{i}"),
                    model=_text(self._try("nvmlDeviceGetName", h) or "unknown"),
                    memory_mib=int(mem.total // 2**20) if mem else 0,
                    nvlink_links=self._links[i],
                    pcie_gen=self._try("nvmlDeviceGetMaxPcieLinkGeneration", h),
                    pcie_width=self._try("nvmlDeviceGetMaxPcieLinkWidth", h),
                    mig_mode=bool(mig and mig[0]),
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
        if values is None:
            return out
        for v in values:
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

    def sample(self) -> list[Sample]:
        out = []
        for i, h in enumerate(self._handles):
            mem, lost = self._memory(i, h)
            if lost:
                out.append(Sample(Entity.GPU, str(i)))
                continue
            gauges: dict[str, float] = {}
            if (util := self._try("nvmlDeviceGetUtilizationRates", h)) is not None:
                gauges["util"] = float(util.gpu)
                gauges["mem_util"] = float(util.memory)
            if mem is not None:
                gauges["mem_used_mib"] = mem.used / 2**20
            if (power := self._try("nvmlDeviceGetPowerUsage", h)) is not None:
                gauges["power_w"] = power / 1000
            if (temp := self._try("nvmlDeviceGetTemperature", h, NVML_TEMPERATURE_GPU)) is not None:
                gauges["temp_c"] = float(temp)
            if (clock := self._try("nvmlDeviceGetClockInfo", h, NVML_CLOCK_SM)) is not None:
                gauges["sm_clock_mhz"] = float(clock)
            out.append(Sample(Entity.GPU, str(i), gauges=gauges, counters=self._fields(h, self._links[i])))
        return out

    def workloads(self) -> list[WorkloadRef]:
        owners: dict[str, tuple[WorkloadKind, str, str | None, set[int]]] = {}
        for i, h in enumerate(self._handles):
            for proc in self._try("nvmlDeviceGetComputeRunningProcesses", h) or []:
                owner = self._attributor.owner(int(proc.pid))
                entry = owners.setdefault(owner.id, (owner.kind, owner.name, owner.hint, set()))
                entry[3].add(i)
        return [
            WorkloadRef(id=wid, kind=kind, name=name, gpus=sorted(gpus), hint=hint)
            for wid, (kind, name, hint, gpus) in sorted(owners.items())
        ]

    def close(self) -> None:
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
