"""A stand-in for the pynvml module on machines without an NVIDIA GPU: same call shapes, scripted values."""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any


class NVMLError(Exception):
    def __init__(self, value: int = 3) -> None:  # 3 = NVML_ERROR_NOT_SUPPORTED
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total: int = 80 * 2**30
    memory_used: int = 60 * 2**30
    util: int = 90
    mem_util: int = 40
    power_mw: int = 650_000
    nvlink_links: int = 18
    pcie_tx: int = 0
    pcie_rx: int = 0
    nvlink_kib_per_link: int = 0
    pids: list[int] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    uuid: str = ""
    ecc_uncorrected: int = 0
    remapped_rows: int = 0
    gpm: dict[int, float] = field(default_factory=dict)  # metric id -> value; empty: GPM unsupported
    mig: list[FakeGpu | None] = field(default_factory=list)  # MIG slots; empty: MIG off


@dataclass
class _Value:
    ullVal: int = 0


@dataclass
class _Field:
    fieldId: int
    scopeId: int
    nvmlReturn: int
    valueType: int
    value: _Value


class _MetricsGet:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [types.SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(98)]


def make_fake_nvml(gpus: list[FakeGpu], init_error: int | None = None) -> types.ModuleType:
    """``m.xid_queue`` takes (gpu, xid) pairs that the event set then reports."""
    m = types.ModuleType("fake_pynvml")
    everything = gpus + [g for gpu in gpus for g in gpu.mig if g is not None]
    for i, g in enumerate(everything):
        g.uuid = g.uuid or f"GPU-{i}"
    xid_queue: list[tuple[FakeGpu, int]] = []
    m.xid_queue = xid_queue  # type: ignore[attr-defined]
    m.NVMLError = NVMLError  # type: ignore[attr-defined]
    m.calls: list[str] = []  # type: ignore[misc]

    def guard(name: str, gpu: FakeGpu) -> None:
        m.calls.append(name)  # type: ignore[attr-defined]
        if gpu.lost:
            raise NVMLError(15)  # GPU_IS_LOST
        if name in gpu.unsupported:
            raise NVMLError(3)

    def nvmlInit() -> None:
        if init_error is not None:
            raise NVMLError(init_error)

    def handle(i: int) -> FakeGpu:
        return gpus[i]

    def mem(h: FakeGpu) -> Any:
        guard("memory", h)
        return types.SimpleNamespace(total=h.memory_total, used=h.memory_used, free=h.memory_total - h.memory_used)

    def util(h: FakeGpu) -> Any:
        guard("util", h)
        return types.SimpleNamespace(gpu=h.util, memory=h.mem_util)

    def nvlink_state(h: FakeGpu, link: int) -> int:
        if link >= h.nvlink_links:
            raise NVMLError(2)
        return 1

    def fields(h: FakeGpu, ids: list[Any]) -> list[_Field]:
        guard("fields", h)
        out = []
        for entry in ids:
            fid, scope = entry if isinstance(entry, tuple) else (entry, 0)
            value = {197: h.pcie_tx, 198: h.pcie_rx}.get(fid, h.nvlink_kib_per_link)
            ret = 3 if f"field{fid}" in h.unsupported else 0
            out.append(_Field(fid, scope, ret, 3, _Value(value)))
        return out

    def procs(h: FakeGpu) -> list[Any]:
        guard("procs", h)
        return [types.SimpleNamespace(pid=p, usedGpuMemory=1) for p in h.pids]

    def simple(name: str, attr: str, scale: float = 1) -> Any:
        def fn(h: FakeGpu, *_: Any) -> Any:
            guard(name, h)
            return getattr(h, attr) if scale == 1 else getattr(h, attr) * scale

        return fn

    m.nvmlInit = nvmlInit  # type: ignore[attr-defined]
    m.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    m.nvmlDeviceGetCount = lambda: len(gpus)  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = handle  # type: ignore[attr-defined]
    m.nvmlDeviceGetName = simple("name", "name")  # type: ignore[attr-defined]
    m.nvmlDeviceGetUUID = lambda h: h.uuid  # type: ignore[attr-defined]
    m.nvmlDeviceGetMemoryInfo = mem  # type: ignore[attr-defined]
    m.nvmlDeviceGetUtilizationRates = util  # type: ignore[attr-defined]
    m.nvmlDeviceGetPowerUsage = simple("power", "power_mw")  # type: ignore[attr-defined]
    m.nvmlDeviceGetPowerManagementLimit = lambda h: 700_000  # type: ignore[attr-defined]
    m.nvmlDeviceGetTemperature = lambda h, sensor: 61  # type: ignore[attr-defined]
    m.nvmlDeviceGetClockInfo = lambda h, clock: 1980  # type: ignore[attr-defined]
    m.nvmlDeviceGetNvLinkState = nvlink_state  # type: ignore[attr-defined]
    m.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 5  # type: ignore[attr-defined]
    m.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16  # type: ignore[attr-defined]
    m.nvmlDeviceGetMigMode = lambda h: (1, 1) if h.mig else (0, 0)  # type: ignore[attr-defined]

    def mig_handle(h: FakeGpu, slot: int) -> FakeGpu:
        found = h.mig[slot]
        if found is None:
            raise NVMLError(6)  # NOT_FOUND: an empty slot
        return found

    def event_wait(event_set: object, timeout_ms: int) -> Any:
        if not xid_queue:
            raise NVMLError(10)  # TIMEOUT
        gpu, xid = xid_queue.pop(0)
        return types.SimpleNamespace(device=gpu, eventType=0x8, eventData=xid)

    def gpm_support(h: FakeGpu) -> Any:
        guard("gpm", h)
        return types.SimpleNamespace(isSupportedDevice=1 if h.gpm else 0)

    def gpm_sample_get(h: FakeGpu, sample: Any) -> Any:
        guard("gpm", h)
        sample.gpu = h
        return sample

    def gpm_metrics_get(request: _MetricsGet) -> _MetricsGet:
        gpu = request.sample2.gpu
        for slot in range(request.numMetrics):
            metric = request.metrics[slot]
            if metric.metricId in gpu.gpm:
                metric.value = gpu.gpm[metric.metricId]
            else:
                metric.nvmlReturn = 3
        return request

    m.nvmlDeviceGetMaxMigDeviceCount = lambda h: len(h.mig)  # type: ignore[attr-defined]
    m.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle  # type: ignore[attr-defined]
    m.nvmlEventSetCreate = object  # type: ignore[attr-defined]
    m.nvmlEventSetFree = lambda s: None  # type: ignore[attr-defined]
    m.nvmlDeviceRegisterEvents = lambda h, types_, s: None  # type: ignore[attr-defined]
    m.nvmlEventSetWait_v2 = event_wait  # type: ignore[attr-defined]
    m.nvmlDeviceGetTotalEccErrors = simple("ecc", "ecc_uncorrected")  # type: ignore[attr-defined]
    m.nvmlDeviceGetRemappedRows = lambda h: (0, h.remapped_rows, 0, 0)  # type: ignore[attr-defined]
    m.nvmlGpmQueryDeviceSupport = gpm_support  # type: ignore[attr-defined]
    m.nvmlGpmSampleAlloc = lambda: types.SimpleNamespace(gpu=None)  # type: ignore[attr-defined]
    m.nvmlGpmSampleFree = lambda s: None  # type: ignore[attr-defined]
    m.nvmlGpmSampleGet = gpm_sample_get  # type: ignore[attr-defined]
    m.nvmlGpmMetricsGet = gpm_metrics_get  # type: ignore[attr-defined]
    m.c_nvmlGpmMetricsGet_t = _MetricsGet  # type: ignore[attr-defined]
    m.NVML_GPM_METRICS_GET_VERSION = 1  # type: ignore[attr-defined]
    m.nvmlDeviceGetFieldValues = fields  # type: ignore[attr-defined]
    m.nvmlDeviceGetComputeRunningProcesses = procs  # type: ignore[attr-defined]
    m.nvmlSystemGetDriverVersion = lambda: "550.54.15"  # type: ignore[attr-defined]
    m.nvmlSystemGetCudaDriverVersion = lambda: 12040  # type: ignore[attr-defined]
    return m
