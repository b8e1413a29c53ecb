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


def make_fake_nvml(gpus: list[FakeGpu], init_error: int | None = None) -> types.ModuleType:
    m = types.ModuleType("fake_pynvml")
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
    m.nvmlDeviceGetUUID = lambda h: f"GPU-{gpus.index(h)}"  # type: ignore[attr-defined]
    m.nvmlDeviceGetMemoryInfo = mem  # type: ignore[attr-defined]
    m.nvmlDeviceGetUtilizationRates = util  # type: ignore[attr-defined]
    m.nvmlDeviceGetPowerUsage = simple("power", "power_mw")  # type: ignore[attr-defined]
    m.nvmlDeviceGetPowerManagementLimit = lambda h: 700_000  # type: ignore[attr-defined]
    m.nvmlDeviceGetTemperature = lambda h, sensor: 61  # type: ignore[attr-defined]
    m.nvmlDeviceGetClockInfo = lambda h, clock: 1980  # type: ignore[attr-defined]
    m.nvmlDeviceGetNvLinkState = nvlink_state  # type: ignore[attr-defined]
    m.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 5  # type: ignore[attr-defined]
    m.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16  # type: ignore[attr-defined]
    m.nvmlDeviceGetMigMode = lambda h: (0, 0)  # type: ignore[attr-defined]
    m.nvmlDeviceGetFieldValues = fields  # type: ignore[attr-defined]
    m.nvmlDeviceGetComputeRunningProcesses = procs  # type: ignore[attr-defined]
    m.nvmlSystemGetDriverVersion = lambda: "550.54.15"  # type: ignore[attr-defined]
    m.nvmlSystemGetCudaDriverVersion = lambda: 12040  # type: ignore[attr-defined]
    return m
