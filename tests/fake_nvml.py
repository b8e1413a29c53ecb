"""A stand-in for the pynvml module on machines without an NVIDIA GPU: same call shapes, scripted values.

It fails the way the real nvidia-ml-py binding fails, because it raises the binding's own classes: errors are
``pynvml.NVMLError(code)``, which ``NVMLError.__new__`` turns into the per-code subclass
(``NVMLError_NoPermission``, ``NVMLError_GpuIsLost``...); a symbol the driver lacks is
``NVMLError_FunctionNotFound``; the unversioned process calls are wrapped in the binding's own
``throwOnVersionMismatch``, so a driver without ``_v3`` raises ``NVMLLibraryMismatchError``, which is *not* an
``NVMLError``. Field values are the binding's ``c_nvmlFieldValue_t`` (a real C union: reading the wrong member of
a 32-bit value returns garbage in the high bits) and utilisation samples are ``c_nvmlSample_t``.

Four behaviours of the real stack that a changed value cannot model:

* The binding loads ``libnvidia-ml.so.1`` once per process, at the first ``nvmlInit``, and keeps it for the
  process's life (``nvmlShutdown`` leaves it loaded). ``m.driver`` is the kernel module's version and
  ``m.library`` the library on disk; once the module is replaced (``m.driver`` changed after the first init, as a
  driver upgrade that reloads the module does) every call, ``nvmlInit`` included, raises
  ``NVML_ERROR_LIB_RM_VERSION_MISMATCH``. Only a new process (a new fake) loads the new library.
* XID events are queued in each event set the GPU is registered with when they happen (``m.xid_queue``);
  ``nvmlEventSetFree`` drops what its set still holds, and a freed set cannot be waited on. While a lost GPU is
  registered with a set, every wait on it fails with ``GPU_IS_LOST`` (NVML's reference lists that error for the
  wait as a whole); ``m.event_faults`` makes the next waits fail once each with other codes.
* MPS clients are listed by the MPS process calls only; the compute process calls list the MPS server.
* A call on a GPU that is slow to answer (a GPU falling off the bus, a driver in recovery) does not fail: it
  blocks, inside the C library, with the GIL released, as ctypes calls do. ``FakeGpu.delay_s`` makes every call on
  that GPU block that long (``time.sleep``); ``FakeGpu.hang`` makes it block until the event is set (a GPU that
  never answers again; a test sets it on its way out so the blocked thread ends).
"""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import pynvml

NVMLError = pynvml.NVMLError
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
UNKNOWN = pynvml.NVML_ERROR_UNKNOWN


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total: int = 80 * 2**30
    memory_used: int = 60 * 2**30
    util: int = 90
    mem_util: int = 40
    power_mw: int = 650_000
    power_limit_mw: int = 700_000  # the management limit (nvidia-smi -pl)
    # a lower limit set out of band (the BMC, a power-brake): the enforced limit is the lower of the two
    external_cap_mw: int | None = None
    nvlink_links: int = 18  # links the GPU has; state queries past them are INVALID_ARGUMENT
    down_links: set[int] = field(default_factory=set)  # links whose state is 0 and whose counters fail
    failing_links: set[int] = field(default_factory=set)  # links up but whose counter read fails this tick
    nvswitch: bool | None = True  # what the links lead to; None: the driver cannot say
    pci_device_id: int = 0x233010DE
    pcie_tx: int = 0
    pcie_rx: int = 0
    pcie_value_type: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    pcie_fields: bool = True  # fields 197/198 exist from driver R555
    nvlink_kib_per_link: int = 0
    link_kib: dict[int, int] = field(default_factory=dict)  # per-link override of nvlink_kib_per_link
    pids: list[int] = field(default_factory=list)
    mps_pids: list[int] = field(default_factory=list)  # MPS clients (the MPS server, if any, is one of ``pids``)
    # bytes each process holds (usedGpuMemory as the driver fills it; default (n + 1) GiB for the n-th process);
    # pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value where the driver has no figure (MIG without privileges)
    proc_memory: dict[int, int] = field(default_factory=dict)
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    handle_error: int | None = None  # nvmlDeviceGetHandleByIndex fails with this code
    uuid: str = ""
    ecc_uncorrected: int = 0
    remapped_rows: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    clock_events: int = 0  # nvmlClocksEventReason* bits (0x4 power cap, 0x8 HW slowdown, 0x20/0x40 thermal...)
    violation_ns: dict[int, int] = field(default_factory=dict)  # per perf policy (0 power, 1 thermal): ns held
    gpm: dict[int, float] = field(default_factory=dict)  # metric id -> value; empty: GPM unsupported
    # NVLink-C2C links to a Grace CPU (GH200, GB200): each link's speed in MB/s; empty: no C2C, as on every other
    # GPU, where nvmlDeviceGetC2cModeInfoV and the C2C fields answer NOT_SUPPORTED
    c2c_mb_per_s: list[int] = field(default_factory=list)
    c2c_down: set[int] = field(default_factory=set)  # C2C links whose status field reads 0 (inactive)
    mig: list[FakeGpu | None] = field(default_factory=list)  # MIG slots; empty: MIG off
    gpu_instance_id: int = 0
    util_samples: list[tuple[int, int]] = field(default_factory=list)  # (timestamp µs, %) in NVML's buffer
    is_mig_slice: bool = False
    delay_s: float = 0.0  # every call on this GPU blocks this long, then answers
    hang: threading.Event | None = None  # every call on this GPU blocks until this is set


class _MetricsGet:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [types.SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(98)]


def _raise(code: int) -> NoReturn:
    raise NVMLError(code)


LIB_RM_VERSION_MISMATCH = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH


class FakeEventSet:
    """One ``nvmlEventSet_t``: the GPUs registered with it and the events it holds until they are waited for."""

    def __init__(self) -> None:
        self.gpus: list[FakeGpu] = []
        self.pending: list[tuple[FakeGpu, int]] = []
        self.freed = False


class XidQueue:
    """What the driver raises: each event goes to every live event set its GPU is registered with."""

    def __init__(self) -> None:
        self.sets: list[FakeEventSet] = []

    def append(self, event: tuple[FakeGpu, int]) -> None:
        for s in self.sets:
            if not s.freed and any(g is event[0] for g in s.gpus):
                s.pending.append(event)

    def extend(self, events: list[tuple[FakeGpu, int]]) -> None:
        for event in events:
            self.append(event)


def make_fake_nvml(
    gpus: list[FakeGpu],
    init_error: int | None = None,
    process_api: str = "v3",
    driver: str = "550.54.15",
    samples_api: bool = True,
    library: str | None = None,
    clock_events_api: str = "events",
    c2c_api: bool = True,
) -> types.ModuleType:
    """A module shaped like ``pynvml`` in a fresh process.

    ``c2c_api``: whether the driver has ``nvmlDeviceGetC2cModeInfoV`` (the binding defines it either way and
    raises ``NVMLError_FunctionNotFound`` where the driver lacks the symbol); the C2C fields answer either way.
    ``m.field_ids`` lists every field id asked for, in order.

    ``clock_events_api``: "events" (nvidia-ml-py 12.535 and newer: ``nvmlDeviceGetCurrentClocksEventReasons``
    beside the old name) or "throttle" (older bindings: ``nvmlDeviceGetCurrentClocksThrottleReasons`` only).

    ``process_api``: "v3" (R510 and newer), "v2" (older drivers, and R535 from 535.98: no ``_v3`` symbol) or
    "none"; the MPS process calls follow the same symbols. ``library``: the version of libnvidia-ml.so on disk
    (default: ``driver``; another version models packages upgraded while the old module is still loaded).
    ``m.init_error``, ``m.driver`` (the loaded kernel module), ``m.library`` and each GPU's fields may be changed
    between calls (a driver loaded after boot, a module reloaded after an upgrade, a MIG reconfiguration).
    ``m.xid_queue`` takes (gpu, xid) pairs, which the event sets holding that GPU then report.
    """
    m = types.ModuleType("fake_pynvml")
    for name in dir(pynvml):  # the error classes and constants, exactly as the binding defines them
        if name.startswith(("NVMLError", "NVML_")) or name == "NVMLLibraryMismatchError":
            setattr(m, name, getattr(pynvml, name))
    xid_queue = XidQueue()
    m.xid_queue = xid_queue  # type: ignore[attr-defined]
    m.calls: list[str] = []  # type: ignore[misc]
    m.init_error = init_error  # type: ignore[attr-defined]
    m.driver = driver  # type: ignore[attr-defined]
    m.library = library or driver  # type: ignore[attr-defined]
    m.loaded = None  # type: ignore[attr-defined]  # the library this process loaded, at its first nvmlInit
    m.initialised = False  # type: ignore[attr-defined]
    m.gpm_buffers = 0  # type: ignore[attr-defined]  # GPM sample buffers allocated, over the process's life
    m.field_ids: list[int] = []  # type: ignore[misc]
    m.event_sets: list[FakeEventSet] = xid_queue.sets  # type: ignore[misc]
    counter = iter(range(10_000))

    def mismatched() -> bool:
        return m.loaded is not None and m.loaded != m.driver  # type: ignore[attr-defined]

    def guard(name: str, gpu: FakeGpu) -> None:
        m.calls.append(name)  # type: ignore[attr-defined]
        if gpu.delay_s:
            time.sleep(gpu.delay_s)  # blocked in the driver: the GIL is released, as in the real binding's ctypes call
        if gpu.hang is not None:
            gpu.hang.wait()
        if mismatched():
            _raise(LIB_RM_VERSION_MISMATCH)
        if not m.initialised:  # type: ignore[attr-defined]
            _raise(pynvml.NVML_ERROR_UNINITIALIZED)
        if gpu.lost:
            _raise(GPU_IS_LOST)
        if name in gpu.unsupported:
            _raise(NOT_SUPPORTED)

    def nvmlInit() -> None:
        if m.init_error is not None:  # type: ignore[attr-defined]
            _raise(m.init_error)  # type: ignore[attr-defined]
        if m.loaded is None:  # type: ignore[attr-defined]  # _LoadNvmlLibrary: once per process
            m.loaded = m.library  # type: ignore[attr-defined]
        if mismatched():
            _raise(LIB_RM_VERSION_MISMATCH)
        m.initialised = True  # type: ignore[attr-defined]

    def nvmlShutdown() -> None:
        if mismatched():
            _raise(LIB_RM_VERSION_MISMATCH)
        m.initialised = False  # type: ignore[attr-defined]

    def system(name: str) -> None:
        m.calls.append(name)  # type: ignore[attr-defined]
        if mismatched():
            _raise(LIB_RM_VERSION_MISMATCH)
        if not m.initialised:  # type: ignore[attr-defined]
            _raise(pynvml.NVML_ERROR_UNINITIALIZED)

    def count() -> int:
        system("count")
        return len(gpus)

    def handle(i: int) -> FakeGpu:
        system("handle")
        if not 0 <= i < len(gpus):
            _raise(INVALID_ARGUMENT)
        if gpus[i].handle_error is not None:
            _raise(gpus[i].handle_error)  # type: ignore[arg-type]
        return gpus[i]

    def uuid(h: FakeGpu) -> str:
        guard("uuid", h)
        if not h.uuid:
            h.uuid = f"{'MIG' if h.is_mig_slice else 'GPU'}-{next(counter)}"
        return h.uuid

    def mem(h: FakeGpu) -> Any:
        guard("memory", h)
        return types.SimpleNamespace(total=h.memory_total, used=h.memory_used, free=h.memory_total - h.memory_used)

    def util(h: FakeGpu) -> Any:
        guard("util", h)
        if h.is_mig_slice or h.mig:  # NVML: not supported on a MIG slice, nor on a GPU in MIG mode
            _raise(NOT_SUPPORTED)
        return types.SimpleNamespace(gpu=h.util, memory=h.mem_util)

    def samples(h: FakeGpu, sampling_type: int, since_us: int) -> tuple[int, list[Any]]:
        guard("samples", h)
        if h.is_mig_slice or h.mig:
            _raise(NOT_SUPPORTED)
        if sampling_type != pynvml.NVML_GPU_UTILIZATION_SAMPLES:
            _raise(NOT_SUPPORTED)
        fresh = [(ts, v) for ts, v in h.util_samples if ts > since_us]
        if not fresh:
            _raise(NOT_FOUND)  # NVML: no sample newer than the timestamp
        out = []
        for ts, v in fresh:
            s = pynvml.c_nvmlSample_t()
            s.timeStamp = ts
            s.sampleValue.uiVal = v
            out.append(s)
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, out

    def nvlink_state(h: FakeGpu, link: int) -> int:
        guard("nvlink_state", h)
        if link >= h.nvlink_links:
            _raise(INVALID_ARGUMENT)
        return 0 if link in h.down_links else 1

    def remote_type(h: FakeGpu, link: int) -> int:
        guard("nvlink_remote", h)
        if h.nvswitch is None or link >= h.nvlink_links:
            _raise(NOT_SUPPORTED)
        return pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH if h.nvswitch else pynvml.NVML_NVLINK_DEVICE_TYPE_GPU

    def pci_info(h: FakeGpu) -> Any:
        guard("pci", h)
        info = pynvml.nvmlPciInfo_t()
        info.pciDeviceId = h.pci_device_id
        return info

    def _set(v: Any, value_type: int, value: int) -> None:
        v.valueType = value_type
        v.value.ullVal = 0xDEAD_0000_0000_0000  # stale high bits: reading the wrong member shows them
        member = {1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}.get(value_type, "ullVal")
        setattr(v.value, member, value)

    def fields(h: FakeGpu, ids: list[Any]) -> Any:
        guard("fields", h)
        values = (pynvml.c_nvmlFieldValue_t * len(ids))()
        for v, entry in zip(values, ids, strict=True):
            fid, scope = entry if isinstance(entry, tuple) else (entry, 0)
            v.fieldId, v.scopeId = fid, scope
            m.field_ids.append(fid)  # type: ignore[attr-defined]
            if fid in (170, 171, 172):
                links = h.c2c_mb_per_s
                if not links or h.is_mig_slice:
                    v.nvmlReturn = NOT_SUPPORTED
                elif fid == 170:
                    _set(v, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, len(links))
                elif scope >= len(links):
                    v.nvmlReturn = INVALID_ARGUMENT
                elif fid == 171:
                    _set(v, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 0 if scope in h.c2c_down else 1)
                else:
                    _set(v, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, links[scope])
            elif fid in (197, 198):
                if not h.pcie_fields or f"field{fid}" in h.unsupported:
                    v.nvmlReturn = NOT_SUPPORTED
                    continue
                _set(v, h.pcie_value_type, h.pcie_tx if fid == 197 else h.pcie_rx)
            elif fid in (138, 139):
                if scope >= h.nvlink_links:
                    v.nvmlReturn = INVALID_ARGUMENT
                elif scope in h.down_links or scope in h.failing_links:
                    v.nvmlReturn = UNKNOWN
                else:
                    _set(v, 3, h.link_kib.get(scope, h.nvlink_kib_per_link))
            else:
                v.nvmlReturn = NOT_SUPPORTED
        return values

    def _procs(h: FakeGpu, garbled: bool) -> list[Any]:
        out = []
        for n, pid in enumerate(h.pids):
            used = h.proc_memory.get(pid, (n + 1) * 2**30)
            # 535.43-535.86 fill a larger struct than the binding reads: every entry after the first is
            # shifted, so its pid field holds part of the previous entry's memory figure.
            shown = pid if n == 0 or not garbled else (n * 2**30) or 1 << 40
            # the binding's own conversion: NVML_VALUE_NOT_AVAILABLE becomes None
            reported = None if used == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value else used
            out.append(types.SimpleNamespace(pid=shown, usedGpuMemory=reported, gpuInstanceId=0, computeInstanceId=0))
        return out

    def procs_v3(h: FakeGpu) -> list[Any]:
        guard("procs", h)
        if process_api != "v3":
            _raise(FUNCTION_NOT_FOUND)
        return _procs(h, garbled=m.driver.startswith("535.") and "535.43" <= m.driver <= "535.86")  # type: ignore[attr-defined]

    def procs_v2(h: FakeGpu) -> list[Any]:
        guard("procs_v2", h)
        if process_api == "none":
            _raise(FUNCTION_NOT_FOUND)
        return _procs(h, garbled=False)

    def _mps(h: FakeGpu, garbled: bool) -> list[Any]:
        return _procs(types.SimpleNamespace(pids=h.mps_pids, proc_memory=h.proc_memory), garbled)  # type: ignore[arg-type]

    def mps_v3(h: FakeGpu) -> list[Any]:
        guard("mps", h)
        if process_api != "v3":
            _raise(FUNCTION_NOT_FOUND)
        return _mps(h, garbled=m.driver.startswith("535.") and "535.43" <= m.driver <= "535.86")  # type: ignore[attr-defined]

    def mps_v2(h: FakeGpu) -> list[Any]:
        guard("mps_v2", h)
        if process_api == "none":
            _raise(FUNCTION_NOT_FOUND)
        return _mps(h, garbled=False)

    def physical(name: str, value: Callable[[FakeGpu], Any]) -> Any:
        """A reading of the board: NVML has none for a MIG instance, nor for a lost GPU."""

        def fn(h: FakeGpu, *_: Any) -> Any:
            guard(name, h)
            if h.is_mig_slice:
                _raise(NOT_SUPPORTED)
            return value(h)

        return fn

    def name_of(h: FakeGpu) -> str:
        guard("name", h)
        return h.name

    def mig_mode(h: FakeGpu) -> tuple[int, int]:
        guard("mig_mode", h)
        return (1, 1) if h.mig else (0, 0)

    def mig_handle(h: FakeGpu, slot: int) -> FakeGpu:
        guard("mig_handle", h)
        if slot >= len(h.mig):
            _raise(INVALID_ARGUMENT)
        found = h.mig[slot]
        if found is None:
            _raise(NOT_FOUND)  # an empty slot
        assert found is not None
        found.is_mig_slice = True
        return found

    def gi_id(h: FakeGpu) -> int:
        guard("gi_id", h)
        if not h.is_mig_slice:
            _raise(INVALID_ARGUMENT)
        return h.gpu_instance_id

    def event_create() -> FakeEventSet:
        system("event_create")
        s = FakeEventSet()
        xid_queue.sets.append(s)
        return s

    def event_register(h: FakeGpu, event_types: int, s: FakeEventSet) -> None:
        guard("event_register", h)
        if s.freed:
            _raise(INVALID_ARGUMENT)
        s.gpus.append(h)

    def event_free(s: FakeEventSet) -> None:
        system("event_free")
        s.freed = True
        s.pending.clear()  # what the set still held is gone with it

    def event_wait(s: FakeEventSet, timeout_ms: int) -> Any:
        system("event_wait")
        m.wait_timeouts.append(timeout_ms)  # type: ignore[attr-defined]
        if s.freed:
            _raise(INVALID_ARGUMENT)
        if m.event_faults:  # type: ignore[attr-defined]
            _raise(m.event_faults.pop(0))  # type: ignore[attr-defined]
        if any(g.lost for g in s.gpus):  # the set as a whole fails while a lost GPU is registered with it
            _raise(GPU_IS_LOST)
        if not s.pending:
            _raise(pynvml.NVML_ERROR_TIMEOUT)
        gpu, xid = s.pending.pop(0)
        return types.SimpleNamespace(device=gpu, eventType=0x8, eventData=xid)

    def gpm_alloc() -> Any:
        system("gpm_alloc")
        m.gpm_buffers += 1  # type: ignore[attr-defined]
        return types.SimpleNamespace(gpu=None)

    def gpm_support(h: FakeGpu) -> Any:
        guard("gpm", h)
        return types.SimpleNamespace(isSupportedDevice=1 if h.gpm else 0)

    def gpm_sample_get(h: FakeGpu, sample: Any) -> Any:
        guard("gpm", h)
        sample.gpu = h
        return sample

    def gpm_mig_sample_get(h: FakeGpu, instance: int, sample: Any) -> Any:
        guard("gpm", h)
        for slice_ in h.mig:
            if slice_ is not None and slice_.gpu_instance_id == instance:
                sample.gpu = slice_
                return sample
        _raise(NOT_FOUND)

    def gpm_metrics_get(request: _MetricsGet) -> _MetricsGet:
        system("gpm_metrics")
        gpu = request.sample2.gpu
        for slot in range(request.numMetrics):
            metric = request.metrics[slot]
            if metric.metricId in gpu.gpm:
                metric.value = gpu.gpm[metric.metricId]
            else:
                metric.nvmlReturn = NOT_SUPPORTED
        return request

    def c2c_mode(h: FakeGpu) -> Any:
        if not c2c_api:  # the binding's _nvmlGetFunctionPointer, on a driver without the symbol
            m.calls.append("c2c_mode")  # type: ignore[attr-defined]
            _raise(FUNCTION_NOT_FOUND)
        guard("c2c_mode", h)
        if not h.c2c_mb_per_s or h.is_mig_slice:
            _raise(NOT_SUPPORTED)
        info = pynvml.c_nvmlC2cModeInfo_v1_t()
        info.isC2cEnabled = 1
        return info

    def driver_version() -> str:
        system("driver_version")
        return m.driver  # type: ignore[attr-defined,no-any-return]

    m.nvmlInit = nvmlInit  # type: ignore[attr-defined]
    m.nvmlShutdown = nvmlShutdown  # type: ignore[attr-defined]
    m.nvmlDeviceGetCount = count  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = handle  # type: ignore[attr-defined]
    m.nvmlDeviceGetName = name_of  # type: ignore[attr-defined]
    m.nvmlDeviceGetUUID = uuid  # type: ignore[attr-defined]
    m.nvmlDeviceGetMemoryInfo = mem  # type: ignore[attr-defined]
    m.nvmlDeviceGetUtilizationRates = util  # type: ignore[attr-defined]
    if samples_api:
        m.nvmlDeviceGetSamples = samples  # type: ignore[attr-defined]
    m.nvmlDeviceGetPowerUsage = physical("power", lambda h: h.power_mw)  # type: ignore[attr-defined]
    m.nvmlDeviceGetPowerManagementLimit = physical("power_limit", lambda h: h.power_limit_mw)  # type: ignore[attr-defined]
    m.nvmlDeviceGetEnforcedPowerLimit = physical(  # type: ignore[attr-defined]
        "enforced_limit", lambda h: min(h.power_limit_mw, h.external_cap_mw or h.power_limit_mw)
    )
    m.nvmlDeviceGetTemperature = physical("temp", lambda h: 61)  # type: ignore[attr-defined]
    m.nvmlDeviceGetClockInfo = physical("clock", lambda h: 1980)  # type: ignore[attr-defined]
    m.nvmlDeviceGetNvLinkState = nvlink_state  # type: ignore[attr-defined]
    m.nvmlDeviceGetNvLinkRemoteDeviceType = remote_type  # type: ignore[attr-defined]
    m.nvmlDeviceGetPciInfo = pci_info  # type: ignore[attr-defined]
    m.nvmlDeviceGetMaxPcieLinkGeneration = physical("pcie_gen", lambda h: 5)  # type: ignore[attr-defined]
    m.nvmlDeviceGetMaxPcieLinkWidth = physical("pcie_width", lambda h: 16)  # type: ignore[attr-defined]
    m.nvmlDeviceGetMigMode = mig_mode  # type: ignore[attr-defined]
    m.nvmlDeviceGetMaxMigDeviceCount = lambda h: guard("mig_count", h) or len(h.mig)  # type: ignore[attr-defined,func-returns-value]
    m.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle  # type: ignore[attr-defined]
    m.nvmlDeviceGetGpuInstanceId = gi_id  # type: ignore[attr-defined]
    m.nvmlEventSetCreate = event_create  # type: ignore[attr-defined]
    m.nvmlEventSetFree = event_free  # type: ignore[attr-defined]
    m.nvmlDeviceRegisterEvents = event_register  # type: ignore[attr-defined]
    m.nvmlEventSetWait_v2 = event_wait  # type: ignore[attr-defined]
    m.event_faults = []  # type: ignore[attr-defined]  # codes the next waits raise once each (an interrupt: UNKNOWN)
    m.wait_timeouts = []  # type: ignore[attr-defined]
    m.nvmlDeviceGetTotalEccErrors = physical("ecc", lambda h: h.ecc_uncorrected)  # type: ignore[attr-defined]
    m.nvmlDeviceGetRemappedRows = physical(  # type: ignore[attr-defined]
        "remapped", lambda h: (0, h.remapped_rows, int(h.remap_pending), int(h.remap_failure))
    )
    # bindings before 12.535 have only the ...ThrottleReasons name (clock_events_api="throttle")
    reasons = physical("clock_events", lambda h: h.clock_events)
    m.nvmlDeviceGetCurrentClocksThrottleReasons = reasons  # type: ignore[attr-defined]
    if clock_events_api == "events":
        m.nvmlDeviceGetCurrentClocksEventReasons = reasons  # type: ignore[attr-defined]

    def violation(h: FakeGpu, policy: int) -> Any:
        guard("violation", h)
        if h.is_mig_slice:
            _raise(NOT_SUPPORTED)
        return types.SimpleNamespace(referenceTime=0, violationTime=h.violation_ns.get(policy, 0))

    m.nvmlDeviceGetViolationStatus = violation  # type: ignore[attr-defined]
    m.nvmlGpmQueryDeviceSupport = gpm_support  # type: ignore[attr-defined]
    m.nvmlGpmSampleAlloc = gpm_alloc  # type: ignore[attr-defined]
    m.nvmlGpmSampleFree = lambda s: None  # type: ignore[attr-defined]
    m.nvmlGpmSampleGet = gpm_sample_get  # type: ignore[attr-defined]
    m.nvmlGpmMigSampleGet = gpm_mig_sample_get  # type: ignore[attr-defined]
    m.nvmlGpmMetricsGet = gpm_metrics_get  # type: ignore[attr-defined]
    m.c_nvmlGpmMetricsGet_t = _MetricsGet  # type: ignore[attr-defined]
    m.nvmlDeviceGetFieldValues = fields  # type: ignore[attr-defined]
    m.nvmlDeviceGetC2cModeInfoV = c2c_mode  # type: ignore[attr-defined]
    # The binding's unversioned call is _v3 behind throwOnVersionMismatch; reproduce exactly that wrapping.
    m.nvmlDeviceGetComputeRunningProcesses_v3 = procs_v3  # type: ignore[attr-defined]
    m.nvmlDeviceGetComputeRunningProcesses_v2 = procs_v2  # type: ignore[attr-defined]
    m.nvmlDeviceGetComputeRunningProcesses = pynvml.throwOnVersionMismatch(procs_v3)  # type: ignore[attr-defined]
    m.nvmlDeviceGetMPSComputeRunningProcesses_v3 = mps_v3  # type: ignore[attr-defined]
    m.nvmlDeviceGetMPSComputeRunningProcesses_v2 = mps_v2  # type: ignore[attr-defined]
    m.nvmlDeviceGetMPSComputeRunningProcesses = pynvml.throwOnVersionMismatch(mps_v3)  # type: ignore[attr-defined]
    m.nvmlSystemGetDriverVersion = driver_version  # type: ignore[attr-defined]
    m.nvmlSystemGetCudaDriverVersion = lambda: system("cuda") or 12040  # type: ignore[attr-defined,func-returns-value]
    return m
