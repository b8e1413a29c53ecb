"""NVIDIA GPUs through NVML (nvidia-ml-py).

Signals per GPU — gauges: ``util`` and ``mem_util`` (%), ``mem_used_mib``, ``power_w``, ``temp_c``,
``sm_clock_mhz``, ``power_capped_pct`` / ``thermal_slowdown_pct`` / ``hw_slowdown_pct`` (100 while the clock
event reason holds), and on Hopper and newer ``sm_active`` / ``tensor_active`` / ``dram_active`` /
``sm_occupancy`` (GPM, %);
counters: ``pcie_tx_bps`` / ``pcie_rx_bps`` (the cumulative PCIe byte fields, read in one batched
``nvmlDeviceGetFieldValues`` call; ``nvmlDeviceGetPcieThroughput`` is avoided because it samples for ~20 ms per
call), ``nvlink_tx_bps`` / ``nvlink_rx_bps`` (cumulative NVLink KiB over the links that are up), ``xid_events``
(from an event set), ``power_violation_pct`` / ``thermal_violation_pct`` (violation time in 10 ms units);
latest values: ``last_xid``, ``ecc_uncorrected``, ``remapped_rows``, ``row_remap_pending``, ``row_remap_failure``,
``power_limit_w`` (the enforced limit, read every ``POWER_LIMIT_S``), ``lost``.

What real drivers do, and what the collector does about it (docs/agent.md has the table):

- Every NVML error is a subclass of ``NVMLError`` chosen by its code; a symbol the driver lacks is
  ``NVMLError_FunctionNotFound``, and the binding's unversioned process call turns that into
  ``NVMLLibraryMismatchError``, which is not an ``NVMLError`` at all. Both are caught everywhere.
- Process lists fall back from ``_v3`` to ``_v2``; drivers 535.43–535.86 fill a larger struct than the binding
  reads (every PID after the first is garbage), so they start at ``_v2``, and every PID is checked against
  /proc before it is attributed.
- A GPU whose handle cannot be had (no permission, lost) costs that GPU only and is reported in the birth; it is
  retried alone, and when it answers again the other GPUs keep their counters, GPM readers and event
  registration. A driver that is not loaded yet is retried; the inventory is re-read when the MIG layout or the
  NVLink links that are up change (``generation`` counts the changes so the agent re-publishes its birth).
- The binding loads libnvidia-ml once per process. When the kernel module is replaced under a running agent (a
  driver upgrade), every call returns ``LIB_RM_VERSION_MISMATCH`` and re-initialising reuses the stale library:
  the collector says so (``restart_required``) and the agent exits for systemd to start it with the new library.
  A mismatch met at the first start (new packages, old module still loaded) is waited out instead: a restart
  would load the same library.
- NVLink counters are kept per link and only links that are up are read (all 36 a Blackwell GPU can have): a
  link that fails for one tick costs that link's bytes for that tick, not a counter reset and a spike. Links are
  read again every ``RESCAN_S`` (the fabric manager may bring them up after the agent started); a link that goes
  down keeps its bytes in the total.
- MPS clients are listed by NVML's MPS process call, not by the compute process call (which lists the MPS
  server): both are read, so each client is attributed to its own workload.
- PCIe byte fields exist from R555 and wrap at the width of the value type NVML returns; older drivers on
  Hopper and newer get PCIe MiB/s from GPM instead; ``pcie_source`` in the birth says which.
- NVLink-C2C (Grace Hopper, Grace Blackwell) is read once per GPU, for the birth: every other GPU answers
  ``nvmlDeviceGetC2cModeInfoV`` with NOT_SUPPORTED, and a driver without that call is asked the C2C fields. A GPU
  with C2C links up has their payload bytes (``c2c_tx_bps`` / ``c2c_rx_bps``) in the GPM call it makes anyway.
- Utilisation is not supported on MIG instances (nor on a GPU in MIG mode): GPM samples each instance.
- ``nvmlDeviceGetUtilizationRates`` covers one sample period (1/6 s to 1 s); ``nvmlDeviceGetSamples`` returns
  every sample since the previous tick, so bursty work does not read as 0 or 100.

When NVML cannot start because there is no driver library the collector is replaced by
:class:`NullGpuCollector`; when the driver is installed but not loaded yet, the collector waits for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from agent.metrics import Family, counter, gauge
from agent.protocol import GpuFailure, WorkloadRef
from collectors.attribution import Attributor
from collectors.base import Entity, GpuInfoGuard, Inventory, Sample
from collectors.gpm import GPM_ACTIVITY, GPM_C2C, GPM_PCIE, GpmReader
from collectors.pids import NO_HOST_PIDS, PidResolver

log = logging.getLogger(__name__)

# Constants from nvml.h, kept here so a fake NVML in tests need not define them.
FI_PCIE_TX_BYTES = 197
FI_PCIE_RX_BYTES = 198
FI_NVLINK_DATA_TX_KIB = 138
FI_NVLINK_DATA_RX_KIB = 139
# NVLink-C2C, the GPU's link to its Grace CPU (nvml.h): the number of links; per link (scope), 1 while it is
# active and its speed in MB/s.
FI_C2C_LINK_COUNT = 170
FI_C2C_LINK_GET_STATUS = 171
FI_C2C_LINK_GET_MAX_BW = 172
MAX_C2C_LINKS = 64  # what a garbled count may make the agent ask for (an estimate: nvml.h sets no maximum)
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_GPU_UTILIZATION_SAMPLES = 1
EVENT_XID_CRITICAL = 0x8
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
NVLINK_MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS since Blackwell (18 on Hopper)
# Clock event ("throttle") reasons, nvml.h nvmlClocksEventReason*: those that cost a workload speed. Idle,
# application clocks, sync boost and display clocks are not counted.
CLOCKS_SW_POWER_CAP = 0x4
CLOCKS_HW_SLOWDOWN = 0x8
CLOCKS_SW_THERMAL = 0x20
CLOCKS_HW_THERMAL = 0x40
CLOCKS_HW_POWER_BRAKE = 0x80
_CLOCK_EVENTS = (
    ("power_capped_pct", CLOCKS_SW_POWER_CAP | CLOCKS_HW_POWER_BRAKE),
    ("thermal_slowdown_pct", CLOCKS_SW_THERMAL | CLOCKS_HW_THERMAL),
    ("hw_slowdown_pct", CLOCKS_HW_SLOWDOWN),
)
NVML_PERF_POLICY_POWER = 0
NVML_PERF_POLICY_THERMAL = 1
MAX_EVENTS_PER_TICK = 64
# NVML has no utilisation for a GPU in MIG mode or its instances (NOT_SUPPORTED), and GPM, which samples each
# instance, exists from Hopper: an A100 or A30 in MIG mode reports memory and processes only.
MIG_WITHOUT_GPM = "MIG mode without GPM (before Hopper): NVML reports no utilisation for the GPU or its instances"
# Errors other than TIMEOUT one tick's drain reads past before it gives up until the next tick: one GPU's error
# must not hide the events the others raised, and a fault that answers every call must not cost 64 calls a tick.
MAX_EVENT_ERRORS_PER_TICK = 4
RESCAN_S = 30.0  # how often the GPU layout (driver, MIG, failed GPUs) is checked for changes
# How often the enforced power limit is read again: an operator (nvidia-smi -pl) or the BMC may change it at any
# time, and a window (10 s by default) should carry the limit it ran under.
POWER_LIMIT_S = 10.0
REINIT_MAX_S = 600.0  # the longest wait between re-initialisations of amdsmi or HLML for a fault that persists
# nvmlValueType_t → (union member, width in bits, signed)
_VALUE = {
    0: ("dVal", 64, False),
    1: ("uiVal", 32, False),
    2: ("ulVal", 64, False),
    3: ("ullVal", 64, False),
    4: ("sllVal", 64, True),
    5: ("siVal", 32, True),
    6: ("usVal", 16, False),
}
# The struct-size mismatch: these drivers write nvmlProcessInfo entries larger than the binding's _v3 struct.
_GARBLED_V3 = ((535, 43), (535, 86))
_PROCESS_APIS = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2")
_MPS_APIS = ("nvmlDeviceGetMPSComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses_v2")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _describe(exc: BaseException) -> str:
    code = _code(exc)
    text = str(exc) or type(exc).__name__
    return f"{text} (NVML error {code})" if code is not None else text


def _larger(value: object, than: int) -> bool:
    return isinstance(value, int) and value > than


def _driver_tuple(version: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in (version or "").split(".")[:2])
    except ValueError:
        return ()


def field_value(v: Any) -> tuple[int, int]:
    """(unsigned value, width in bits) of one nvmlFieldValue_t, read through the member its type names."""
    member, width, signed = _VALUE.get(int(v.valueType), ("ullVal", 64, False))
    raw = int(getattr(v.value, member))
    if signed or raw < 0:
        raw &= (1 << width) - 1
    return raw, width


@dataclass(slots=True)
class WrappingCounter:
    """A hardware counter of a fixed width turned into a monotonic total.

    Narrow counters (32 bits and less) wrap within seconds at PCIe rates, so going backwards is a wrap; a 64-bit
    counter never wraps in practice, so going backwards is a reset (a driver reload): that step adds nothing.
    """

    last: int | None = None
    total: int = 0
    resets: int = 0

    def add(self, raw: int, width: int) -> int:
        if self.last is not None:
            if raw >= self.last:
                self.total += raw - self.last
            elif width < 64:
                self.total += raw + (1 << width) - self.last
            else:
                self.resets += 1
        self.last = raw
        return self.total


@dataclass(slots=True)
class _Device:
    index: int
    handle: Any
    uuid: str
    parent: int | None = None  # MIG instances: the physical GPU's index
    links: tuple[int, ...] = ()  # NVLink links that are up
    gpm: GpmReader | None = None
    pcie_source: str | None = None
    nvswitch: bool | None = None
    counters: dict[tuple[str, int], WrappingCounter] = field(default_factory=dict)
    samples_api: bool = True
    util_ts: int = 0  # timestamp (µs) of the newest utilisation sample read
    power_limit_w: float | None = None
    power_limit_next: float = float("-inf")  # when the limit is read again
    util_unavailable: str | None = None  # why this device reports no utilisation
    c2c_links: int | None = None  # NVLink-C2C links up, read once: 0 on every GPU without a Grace CPU
    c2c_max_bps: float | None = None


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
    blocking = True  # NVML calls block in the driver (a GPU falling off the bus): called on a thread of its own

    def __init__(
        self,
        nvml: ModuleType,
        attributor: Attributor,
        clock: Callable[[], float] = time.monotonic,
        waiting_for: str | None = None,
    ) -> None:
        """``waiting_for``: NVML did not start yet (the driver is not loaded); retry every ``RESCAN_S``."""
        self._nvml = nvml
        mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
        self._errors: tuple[type[BaseException], ...] = (nvml.NVMLError, AttributeError) + (
            (mismatch,) if isinstance(mismatch, type) else ()
        )
        self._attributor = attributor
        self._clock = clock
        self._devices: list[_Device] = []
        self._by_uuid: dict[str, int] = {}
        self._failures: dict[int, str] = {}
        self._lost: set[int] = set()
        self._xids: dict[int, int] = {}
        self._last_xid: dict[int, int] = {}
        self._events: Any = None
        self._layout: tuple[Any, ...] | None = None
        self._driver: str | None = None
        self._unavailable = waiting_for
        self._next_scan = clock() + RESCAN_S
        self._process_apis: list[str] = []
        self._mps_apis: list[str] = []
        self._process_driver: str | None = "unknown"
        self._pids = PidResolver(attributor)
        self._registered: set[str] = set()  # UUIDs of the GPUs registered with the event set
        self._worked = False  # NVML answered in this process: the library it loaded matched the driver once
        self.generation = 0  # bumped whenever the inventory changes
        self.counter_resets = 0
        self._guard = GpuInfoGuard("NVML")  # a figure the birth refuses leaves that figure unread
        self.restart_required: str | None = None  # why only a new process can read the GPUs again
        if waiting_for is None:
            self._enumerate()

    # ------------------------------------------------------------------ NVML access

    def _try(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, fn)(*args)
        except self._errors as exc:
            self._note(exc)
            return None

    def _note(self, exc: BaseException) -> None:
        """A library/driver version mismatch after NVML has worked in this process: the driver was replaced under
        it, and the binding keeps the library it loaded, so only a new process can read the GPUs again."""
        if _code(exc) != NVML_ERROR_LIB_RM_VERSION_MISMATCH or self.restart_required is not None:
            return
        if not self._worked:
            return  # a mismatch from the start: this process loaded the library on disk; waiting is all there is
        self.restart_required = (
            f"the NVIDIA driver was replaced under the running agent ({_describe(exc)}, loaded library "
            f"{self._driver or 'unknown'}): only a restart loads the new library"
        )
        self._unavailable = self.restart_required[:300]
        log.error("GPU collector: %s", self.restart_required)

    @property
    def invalid_pids(self) -> int:
        return self._pids.invalid

    # ------------------------------------------------------------------ inventory

    def _enumerate(self) -> None:
        """(Re-)read the GPU layout: a GPU that fails costs that GPU only, and a GPU read before keeps its state
        (counters, GPM buffers, event registration, utilisation timestamp)."""
        self._drain_events()  # what the event set holds is counted before any GPU is read again
        nvml = self._nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except self._errors as exc:
            self._note(exc)
            if self.restart_required is None:
                self._unavailable = f"NVML cannot count GPUs: {_describe(exc)}"
                log.warning("GPU collector: %s; retrying every %.0f s", self._unavailable, RESCAN_S)
            self._close_devices()
            self._devices, self._failures, self._layout = [], {}, None
            return
        self._worked = True
        self._unavailable = None
        self._driver = self._driver_version()
        before, self._failures = self._failures, {}
        kept = {d.uuid: d for d in self._devices}
        physical: list[_Device] = []
        for i in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
            except self._errors as exc:
                self._note(exc)
                self._failures[i] = _describe(exc)[:120]
                if before.get(i) != self._failures[i]:  # said once, not at every retry
                    log.warning("GPU %d cannot be read (%s); the other GPUs are reported", i, self._failures[i])
                continue
            if i in before:
                log.info("GPU %d answers again", i)
            uuid = _text(self._try("nvmlDeviceGetUUID", handle) or f"GPU-{i}")
            old = kept.get(uuid)
            if old is not None and old.parent is None:
                del kept[uuid]
                old.index, old.handle = i, handle
                self._read_links(old)
                physical.append(old)
                continue
            physical.append(self._physical(i, handle, uuid))
        devices = list(physical)
        for d in physical:
            devices.extend(self._mig_devices(d, count + len(devices) - len(physical), kept))
        for gone in kept.values():
            if gone.gpm is not None:
                gone.gpm.close()
        self._devices = devices
        self._by_uuid = {d.uuid: d.index for d in self._devices}
        self._register_events(physical)
        if self._driver != self._process_driver:  # what the driver offers is learnt once per driver
            self._process_driver = self._driver
            self._process_apis = self._process_chain(_PROCESS_APIS)
            self._mps_apis = self._process_chain(_MPS_APIS)
            if self._devices:
                self._device_pids(self._devices[0])  # find a missing symbol now, so the first birth can say so
        self._layout = self._current_layout()

    def _physical(self, index: int, handle: Any, uuid: str) -> _Device:
        device = _Device(index, handle, uuid)
        self._read_links(device)
        device.c2c_links, device.c2c_max_bps = self._c2c(handle)
        gpm = GpmReader.supported(self._nvml, handle)
        device.pcie_source = self._pcie_source(handle, gpm)
        if gpm:
            metrics = GPM_ACTIVITY | (GPM_PCIE if device.pcie_source == "gpm" else {})
            metrics |= GPM_C2C if device.c2c_links else {}
            device.gpm = self._gpm_reader(handle, None, metrics)
            if device.gpm is None and device.pcie_source == "gpm":
                device.pcie_source = None
        return device

    def _read_links(self, device: _Device) -> None:
        """The NVLink links up and what they lead to: read at every layout check, since the fabric manager may
        train the links after the agent started."""
        links = self._nvlink_links(device.handle)
        if links == device.links and device.nvswitch is not None:
            return
        if links != device.links and device.links:
            log.info("GPU %d: NVLink links up %d -> %d", device.index, len(device.links), len(links))
        device.links = links
        device.nvswitch = None
        if links:
            remote = self._try("nvmlDeviceGetNvLinkRemoteDeviceType", device.handle, links[0])
            device.nvswitch = None if remote is None else int(remote) == NVML_NVLINK_DEVICE_TYPE_SWITCH

    def _c2c(self, handle: Any) -> tuple[int | None, float | None]:
        """NVLink-C2C links up and their maximum bandwidth together (bytes/s; NVML gives MB/s per link). Asked once
        per GPU, when it is first read: only Grace Hopper and Grace Blackwell have the link, and every other GPU
        answers NOT_SUPPORTED, which is not worth a call per tick. (None, None) where the driver cannot say."""
        try:
            mode = self._nvml.nvmlDeviceGetC2cModeInfoV(handle)
        except self._errors as exc:  # AttributeError: a binding older than the call; FUNCTION_NOT_FOUND: a driver
            self._note(exc)
            if _code(exc) == NVML_ERROR_NOT_SUPPORTED:
                return 0, None
        else:
            if not getattr(mode, "isC2cEnabled", 0):
                return 0, None
        count = self._try("nvmlDeviceGetFieldValues", handle, [FI_C2C_LINK_COUNT])
        if count is None or int(count[0].nvmlReturn) != 0:
            return None, None
        links = min(field_value(count[0])[0], MAX_C2C_LINKS)
        if not links:
            return 0, None
        ids = [(fid, link) for link in range(links) for fid in (FI_C2C_LINK_GET_STATUS, FI_C2C_LINK_GET_MAX_BW)]
        values = self._try("nvmlDeviceGetFieldValues", handle, ids)
        if values is None:
            return None, None
        read: dict[tuple[int, int], int] = {}
        for v in values:
            if int(v.nvmlReturn) == 0:
                read[(int(v.fieldId), int(v.scopeId))] = field_value(v)[0]
        up = [link for link in range(links) if read.get((FI_C2C_LINK_GET_STATUS, link)) == 1]
        speeds = [read[(FI_C2C_LINK_GET_MAX_BW, link)] for link in up if (FI_C2C_LINK_GET_MAX_BW, link) in read]
        return len(up), sum(speeds) * 1e6 if speeds else None

    def _gpm_reader(self, handle: Any, instance: int | None, metrics: dict[int, str]) -> GpmReader | None:
        try:
            return GpmReader(self._nvml, handle, instance=instance, metrics=metrics)
        except self._errors as exc:  # sample buffers could not be allocated: no GPM for this device
            log.info("GPM unavailable (%s)", _describe(exc))
            return None

    def _driver_version(self) -> str | None:
        driver = self._try("nvmlSystemGetDriverVersion")
        return _text(driver) if driver else None

    def _process_chain(self, chain: tuple[str, str]) -> list[str]:
        apis = list(chain)
        low, high = _GARBLED_V3
        if low <= _driver_tuple(self._driver) <= high:
            apis.reverse()  # _v2 first: _v3 returns garbage PIDs on these drivers
        return apis

    def _nvlink_links(self, handle: Any) -> tuple[int, ...]:
        """The links that are up, out of every link NVML can address (a down link may sit between up ones)."""
        up = []
        for link in range(NVLINK_MAX_LINKS):
            try:
                if self._nvml.nvmlDeviceGetNvLinkState(handle, link):
                    up.append(link)
            except self._errors:
                continue
        return tuple(up)

    def _pcie_source(self, handle: Any, gpm: bool) -> str | None:
        values = self._try("nvmlDeviceGetFieldValues", handle, [FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES])
        if values is not None and all(int(v.nvmlReturn) == 0 for v in values):
            return "nvml-fields"
        return "gpm" if gpm else None

    def _mig_devices(self, parent: _Device, next_index: int, kept: dict[str, _Device]) -> list[_Device]:
        mode = self._try("nvmlDeviceGetMigMode", parent.handle)
        parent.util_unavailable = None
        if not mode or not mode[0]:
            return []
        if parent.gpm is None:
            parent.util_unavailable = MIG_WITHOUT_GPM
        out: list[_Device] = []
        for slot in range(self._try("nvmlDeviceGetMaxMigDeviceCount", parent.handle) or 0):
            mig = self._try("nvmlDeviceGetMigDeviceHandleByIndex", parent.handle, slot)
            if mig is None:
                continue  # an empty slot
            uuid = _text(self._try("nvmlDeviceGetUUID", mig) or f"MIG-{parent.index}-{slot}")
            old = kept.get(uuid)
            if old is not None and old.parent is not None:
                del kept[uuid]
                old.index, old.handle, old.parent = next_index + len(out), mig, parent.index
                out.append(old)
                continue
            device = _Device(next_index + len(out), mig, uuid, parent=parent.index)
            instance = self._try("nvmlDeviceGetGpuInstanceId", mig)
            if parent.gpm is not None and instance is not None:
                device.gpm = self._gpm_reader(parent.handle, int(instance), GPM_ACTIVITY)
            device.util_unavailable = MIG_WITHOUT_GPM if device.gpm is None else None
            device.samples_api = False
            out.append(device)
        return out

    def _current_layout(self) -> tuple[Any, ...]:
        """What, when it changes, means the inventory must be read again: driver, GPU count, MIG layout, the
        NVLink links up."""
        count = self._try("nvmlDeviceGetCount")
        migs: list[Any] = []
        for d in self._devices:
            if d.parent is None:
                mode = self._try("nvmlDeviceGetMigMode", d.handle)
                slots = self._try("nvmlDeviceGetMaxMigDeviceCount", d.handle) if mode and mode[0] else 0
                present = [
                    _text(self._try("nvmlDeviceGetUUID", h) or "")
                    for s in range(slots or 0)
                    if (h := self._try("nvmlDeviceGetMigDeviceHandleByIndex", d.handle, s)) is not None
                ]
                migs.append((d.index, bool(mode and mode[0]), tuple(present), self._nvlink_links(d.handle)))
        return (self._driver_version(), count, tuple(migs))

    def _rescan(self) -> None:
        """Retry a driver that was not loaded and GPUs that failed (alone); re-read the inventory if the layout
        changed."""
        if self.restart_required is not None:
            return
        if self._unavailable is not None and not self._devices and self._layout is None:
            try:
                self._nvml.nvmlInit()
            except self._errors as exc:
                self._note(exc)
                if self._unavailable != f"NVML unavailable: {_describe(exc)}":
                    self._unavailable = f"NVML unavailable: {_describe(exc)}"
                    log.info("GPU collector: %s; still waiting", self._unavailable)
                return
            self._enumerate()
            if self._unavailable is None:
                log.info("NVML started: %d GPU(s) found", len(self._devices))
                self.generation += 1
            return
        layout = self._current_layout()
        if self.restart_required is not None or (layout == self._layout and not self._recovered()):
            return
        before = (self._layout, dict(self._failures))
        self._enumerate()
        if (self._layout, self._failures) != before:
            log.info("GPU layout changed (GPU count, MIG, NVLink links or a GPU answering again); inventory re-read")
            self.generation += 1

    def _recovered(self) -> bool:
        """Whether a GPU that could not be opened opens now: only the failed ones are tried."""
        for i in self._failures:
            try:
                self._nvml.nvmlDeviceGetHandleByIndex(i)
            except self._errors as exc:
                self._note(exc)
                continue
            return True
        return False

    def inventory(self) -> Inventory:
        gpus = []
        for d in self._devices:
            h = d.handle
            mem = self._try("nvmlDeviceGetMemoryInfo", h)
            physical = d.parent is None
            limit = self._power_limit(h) if physical else None
            mig = self._try("nvmlDeviceGetMigMode", h) if physical else None
            name = _text(self._try("nvmlDeviceGetName", h) or "unknown")
            profile = name.rsplit(" MIG ", 1)[1] if not physical and " MIG " in name else None
            pci = self._try("nvmlDeviceGetPciInfo", h) if physical else None
            device_id = getattr(pci, "pciDeviceId", None)
            gpus.append(
                self._guard.gpu(
                    index=d.index,
                    uuid=d.uuid,
                    model=name[:96],
                    memory_mib=int(mem.total // 2**20) if mem else 0,
                    nvlink_links=len(d.links),
                    pcie_gen=self._try("nvmlDeviceGetMaxPcieLinkGeneration", h) if physical else None,
                    pcie_width=self._try("nvmlDeviceGetMaxPcieLinkWidth", h) if physical else None,
                    mig_mode=bool(mig and mig[0]),
                    parent=d.parent,
                    mig_profile=profile[:32] if profile else None,
                    power_limit_w=limit,
                    pcie_source=d.pcie_source if physical else None,
                    pci_device_id=f"0x{int(device_id):08x}" if isinstance(device_id, int) else None,
                    nvswitch=d.nvswitch,
                    util_unavailable=d.util_unavailable,
                    c2c_links=d.c2c_links if physical else None,
                    c2c_max_bps=d.c2c_max_bps if physical else None,
                )
            )
        cuda = self._try("nvmlSystemGetCudaDriverVersion") if self._unavailable is None else None
        unavailable = self._unavailable
        if unavailable is None and not gpus and self._failures:
            unavailable = "no GPU could be read; see gpu_failures"
        return Inventory(
            gpus=gpus,
            gpu_unavailable=unavailable[:300] if unavailable else None,
            driver_version=self._driver,
            cuda_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
            gpu_failures=[GpuFailure(index=i, error=e) for i, e in sorted(self._failures.items())],
            attribution_warning=self._attribution_warning(),
        )

    def _attribution_warning(self) -> str | None:
        if not self._pids.host_pids:
            return NO_HOST_PIDS
        if self._devices and not self._process_apis:
            return "the driver offers no process call NVML's binding can use: GPU workloads are not attributed"
        return None

    # ------------------------------------------------------------------ sampling

    def _register_events(self, physical: list[_Device]) -> None:
        """Register GPUs not yet registered with the event set (created once): freeing and re-creating it would
        lose the events it holds."""
        fresh = [d for d in physical if d.uuid not in self._registered]
        if not fresh:
            return
        created = self._events is None
        if created:
            self._events = self._try("nvmlEventSetCreate")
            if self._events is None:
                return
        for d in fresh:
            try:
                self._nvml.nvmlDeviceRegisterEvents(d.handle, EVENT_XID_CRITICAL, self._events)
                self._registered.add(d.uuid)
            except self._errors as exc:
                self._note(exc)  # XID events are not supported on every GPU or driver
        if created and not self._registered:
            self._try("nvmlEventSetFree", self._events)
            self._events = None

    def _counter(self, d: _Device, name: str, link: int, raw: int, width: int) -> int:
        c = d.counters.setdefault((name, link), WrappingCounter())
        before = c.resets
        total = c.add(raw, width)
        self.counter_resets += c.resets - before
        return total

    def _fields(self, d: _Device) -> dict[str, int]:
        """PCIe and per-link NVLink counters in one batched NVML call, each kept monotonic on its own."""
        ids: list[Any] = [FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES] if d.pcie_source == "nvml-fields" else []
        for link in d.links:
            ids += [(FI_NVLINK_DATA_TX_KIB, link), (FI_NVLINK_DATA_RX_KIB, link)]
        if not ids:
            return {}
        values = self._try("nvmlDeviceGetFieldValues", d.handle, ids)
        if values is None:
            return {}
        out: dict[str, int] = {}
        for v in values:
            fid = int(v.fieldId)
            if fid in (FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES):
                if int(v.nvmlReturn) == 0:
                    raw, width = field_value(v)
                    name = "pcie_tx_bps" if fid == FI_PCIE_TX_BYTES else "pcie_rx_bps"
                    out[name] = self._counter(d, name, -1, raw, width)
            elif fid in (FI_NVLINK_DATA_TX_KIB, FI_NVLINK_DATA_RX_KIB):
                name = "nvlink_tx_bps" if fid == FI_NVLINK_DATA_TX_KIB else "nvlink_rx_bps"
                if int(v.nvmlReturn) == 0:
                    raw, width = field_value(v)
                    self._counter(d, name, int(v.scopeId), raw, width)
        # Every link ever read counts: a link that fails this tick, or went down, keeps its total, so the sum never
        # goes back (its bytes show up when it answers again).
        for (name, link), c in d.counters.items():
            if link >= 0:
                out[name] = out.get(name, 0) + c.total * 1024
        return out

    def _util(self, d: _Device) -> float | None:
        """Mean GPU utilisation over every NVML sample since the previous tick (falls back to one reading)."""
        if d.samples_api and hasattr(self._nvml, "nvmlDeviceGetSamples"):
            try:
                value_type, samples = self._nvml.nvmlDeviceGetSamples(d.handle, NVML_GPU_UTILIZATION_SAMPLES, d.util_ts)
            except self._errors as exc:
                self._note(exc)
                if _code(exc) not in (NVML_ERROR_NOT_FOUND, NVML_ERROR_LIB_RM_VERSION_MISMATCH):
                    d.samples_api = False  # NOT_FOUND: no new sample since the last tick
            else:
                member = _VALUE.get(int(value_type), ("uiVal", 32, False))[0]
                points = [(int(s.timeStamp), float(getattr(s.sampleValue, member))) for s in samples]
                newest = max((ts for ts, _ in points), default=0)
                if d.util_ts == 0:  # the first read returns NVML's whole buffer: keep the last second
                    points = [(ts, v) for ts, v in points if ts > newest - 1_000_000]
                points = [(ts, v) for ts, v in points if ts > d.util_ts]
                if points:
                    d.util_ts = newest
                    return sum(v for _, v in points) / len(points)
        return None

    def _drain_events(self) -> None:
        """Count XID events since the last tick without blocking.

        Timeout 0 is a poll: NVML's reference for nvmlEventSetWait_v2 says it "returns immediately" when events
        are ready and otherwise "sleeps till event arrives but not longer than specified timeout", so nothing
        pending is NVML_ERROR_TIMEOUT at once, and waiting longer would only hold the sampling thread.
        Any other error is read past (up to MAX_EVENT_ERRORS_PER_TICK): GPU_IS_LOST comes from the set as a
        whole, so the set is made again without the GPUs that no longer answer, and the others' XIDs go on
        being counted."""
        if self._events is None:
            return
        errors = 0
        for _ in range(MAX_EVENTS_PER_TICK):
            try:
                event = self._nvml.nvmlEventSetWait_v2(self._events, 0)
            except self._errors as exc:
                self._note(exc)
                code = _code(exc)
                if code == NVML_ERROR_TIMEOUT:
                    return  # nothing pending
                errors += 1
                if errors >= MAX_EVENT_ERRORS_PER_TICK:
                    log.info("XID event set: %s, %d times this second; read again next second", _describe(exc), errors)
                    return
                if code == NVML_ERROR_GPU_IS_LOST:
                    self._events_without_lost_gpus()
                    if self._events is None:
                        return
                continue
            uuid = _text(self._try("nvmlDeviceGetUUID", event.device) or "")
            index = self._by_uuid.get(uuid)
            if index is None:
                continue
            self._xids[index] = self._xids.get(index, 0) + 1
            self._last_xid[index] = int(event.eventData)
            log.warning("GPU %d reported XID %d", index, int(event.eventData))

    def _clock_events(self, handle: Any) -> int | None:
        """The clock event reasons bitmask: nvmlDeviceGetCurrentClocksEventReasons, named ...ThrottleReasons in
        bindings before 12.535 (the older name is kept by the newer ones, deprecated)."""
        name = "nvmlDeviceGetCurrentClocksEventReasons"
        if not hasattr(self._nvml, name):
            name = "nvmlDeviceGetCurrentClocksThrottleReasons"
        reasons = self._try(name, handle)
        return int(reasons) if isinstance(reasons, int) else None

    def _violations(self, handle: Any) -> dict[str, int]:
        """Cumulative power and thermal violation time, in units of 10 ms: as a rate per second, the share of
        each second the GPU spent held below its clocks, %. Caught between samples, unlike the reasons."""
        out: dict[str, int] = {}
        for name, policy in (
            ("power_violation_pct", NVML_PERF_POLICY_POWER),
            ("thermal_violation_pct", NVML_PERF_POLICY_THERMAL),
        ):
            status = self._try("nvmlDeviceGetViolationStatus", handle, policy)
            ns = getattr(status, "violationTime", None)
            if isinstance(ns, int):
                out[name] = ns // 10_000_000
        return out

    def _events_without_lost_gpus(self) -> None:
        """A new event set with every GPU that still answers: a lost GPU registered with the set makes each wait
        fail. The GPU is registered again when it answers (``sample``)."""
        self._try("nvmlEventSetFree", self._events)
        self._events = None
        self._registered.clear()
        physical = [d for d in self._devices if d.parent is None]
        self._register_events(physical)
        unregistered = sorted(d.index for d in physical if d.uuid not in self._registered)
        log.warning("XID events: GPU(s) %s no longer answer; events are read from the others", unregistered)

    def _memory(self, index: int, handle: Any) -> tuple[Any, bool]:
        """(memory info or None, lost): a GPU that fell off the bus is logged once and reported, not fatal."""
        try:
            mem = self._nvml.nvmlDeviceGetMemoryInfo(handle)
        except self._errors as exc:
            self._note(exc)
            if _code(exc) == NVML_ERROR_GPU_IS_LOST:
                if index not in self._lost:
                    log.warning("GPU %d is lost (fallen off the bus); reporting it without samples", index)
                    self._lost.add(index)
                return None, True
            mem = None
        if index in self._lost:
            log.info("GPU %d answers again", index)
            self._lost.discard(index)
        return mem, False

    def _power_limit(self, handle: Any) -> float | None:
        """The limit the GPU enforces, W: the lowest of the management limit and any other (the BMC's, a
        power-brake); drivers without the enforced-limit call give the management limit."""
        limit = self._try("nvmlDeviceGetEnforcedPowerLimit", handle)
        if not limit:
            limit = self._try("nvmlDeviceGetPowerManagementLimit", handle)
        return limit / 1000 if limit else None

    def _health(self, d: _Device, now: float) -> dict[str, float]:
        latest: dict[str, float] = {}
        if d.index in self._last_xid:
            latest["last_xid"] = self._last_xid[d.index]
        if d.parent is None:
            if now >= d.power_limit_next:
                d.power_limit_w, d.power_limit_next = self._power_limit(d.handle), now + POWER_LIMIT_S
            if d.power_limit_w is not None:
                latest["power_limit_w"] = d.power_limit_w
            ecc = self._try(
                "nvmlDeviceGetTotalEccErrors", d.handle, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC
            )
            if ecc is not None:
                latest["ecc_uncorrected"] = int(ecc)
            rows = self._try("nvmlDeviceGetRemappedRows", d.handle)
            if rows is not None:
                # (correctable, uncorrectable, pending, failure occurred): a pending remap needs a GPU reset
                latest["remapped_rows"] = int(rows[1])
                latest["row_remap_pending"] = int(bool(rows[2]))
                latest["row_remap_failure"] = int(bool(rows[3]))
        return latest

    def sample(self) -> list[Sample]:
        now = self._clock()
        if now >= self._next_scan:
            self._next_scan = now + RESCAN_S
            self._rescan()
        self._drain_events()
        out = []
        for d in self._devices:
            h = d.handle
            was_lost = d.index in self._lost
            mem, lost = self._memory(d.index, h)
            if was_lost and not lost and d.parent is None:
                self._register_events([d])  # left out of the event set while it was lost
            if lost:
                out.append(Sample(Entity.GPU, str(d.index), latest={"lost": 1}))
                continue
            gauges: dict[str, float] = {}
            if (rates := self._try("nvmlDeviceGetUtilizationRates", h)) is not None:
                gauges["util"] = float(rates.gpu)
                gauges["mem_util"] = float(rates.memory)
            if (util := self._util(d)) is not None:
                gauges["util"] = util
            if mem is not None:
                gauges["mem_used_mib"] = mem.used / 2**20
            if d.parent is None:
                if (power := self._try("nvmlDeviceGetPowerUsage", h)) is not None:
                    gauges["power_w"] = power / 1000
                if (temp := self._try("nvmlDeviceGetTemperature", h, NVML_TEMPERATURE_GPU)) is not None:
                    gauges["temp_c"] = float(temp)
                if (clock := self._try("nvmlDeviceGetClockInfo", h, NVML_CLOCK_SM)) is not None:
                    gauges["sm_clock_mhz"] = float(clock)
                if (reasons := self._clock_events(h)) is not None:
                    for name, bits in _CLOCK_EVENTS:
                        gauges[name] = 100.0 if reasons & bits else 0.0
            if d.gpm is not None:
                gpm = d.gpm.read()
                if "gpm_util" in gpm and "util" not in gauges:  # MIG: NVML's utilisation is not supported
                    gauges["util"] = gpm["gpm_util"]
                for name in ("sm_active", "tensor_active", "dram_active", "sm_occupancy"):
                    if name in gpm:
                        gauges[name] = gpm[name]
                for name in ("pcie_tx", "pcie_rx", "c2c_tx", "c2c_rx"):
                    if f"{name}_mibps" in gpm:
                        gauges[f"{name}_bps"] = gpm[f"{name}_mibps"] * 2**20
            counters = self._fields(d) if d.parent is None else {}
            if d.parent is None:
                counters |= self._violations(h)
            counters["xid_events"] = self._xids.get(d.index, 0)
            latest = self._health(d, now)
            if d.util_unavailable is not None and "util" not in gauges:
                latest["util_unavailable"] = 1  # said, not left to read as an idle GPU
            out.append(Sample(Entity.GPU, str(d.index), gauges=gauges, counters=counters, latest=latest))
        return out

    # ------------------------------------------------------------------ attribution

    def _device_pids(self, d: _Device) -> list[tuple[object, object]]:
        """(PID, bytes it holds) of each process on one device: the compute processes (with MPS, the MPS server)
        and the MPS clients, each through the first call of its kind the driver has (unchecked; the binding gives
        None for the bytes where NVML reports them not available)."""
        return self._listed(d, self._process_apis) + self._listed(d, self._mps_apis)

    def _listed(self, d: _Device, apis: list[str]) -> list[tuple[object, object]]:
        while apis:
            api = apis[0]
            try:
                procs = getattr(self._nvml, api)(d.handle)
            except self._errors as exc:
                self._note(exc)
                code = _code(exc)
                if code is None or code == NVML_ERROR_FUNCTION_NOT_FOUND:  # no such symbol in this driver
                    apis.pop(0)
                    fallback = apis[0] if apis else "none"
                    log.info("driver lacks %s (%s); using %s", api, _describe(exc), fallback)
                    continue
                return []  # NOT_SUPPORTED and the like: this device only
            return [(getattr(p, "pid", None), getattr(p, "usedGpuMemory", None)) for p in procs]
        return []

    def workloads(self) -> list[WorkloadRef]:
        pids: list[tuple[int, list[object]]] = []
        memory: dict[tuple[int, int], object] = {}
        for d in self._devices:
            if d.index in self._lost:
                continue
            procs = self._device_pids(d)
            pids.append((d.index, [pid for pid, _ in procs]))
            for pid, used in procs:
                if isinstance(pid, int):  # listed twice: the larger figure, never the sum
                    seen = memory.get((d.index, pid))
                    memory[(d.index, pid)] = seen if isinstance(seen, int) and not _larger(used, seen) else used
        return self._pids.workloads(pids, memory)

    def metrics(self) -> list[Family]:
        """Self-metrics: what the agent cannot see on this node's GPUs."""
        failed, lost, apis = len(self._failures), len(self._lost), 1 if self._process_apis else 0
        return [
            self._guard.metric(),
            gauge("fleetfit_agent_gpu_failed", "GPUs the driver lists but the agent cannot read.", failed),
            gauge("fleetfit_agent_gpu_lost", "GPUs that stopped answering.", lost),
            counter("fleetfit_agent_gpu_invalid_pids_total", "NVML process ids not in /proc.", self.invalid_pids),
            counter("fleetfit_agent_gpu_inventory_changes_total", "GPU layout changes seen.", self.generation),
            counter("fleetfit_agent_gpu_counter_resets_total", "GPU counters that reset.", self.counter_resets),
            gauge("fleetfit_agent_gpu_process_api", "1 while a process call works.", apis),
            gauge(
                "fleetfit_agent_gpu_library_mismatch",
                "1 once the NVIDIA driver was replaced under the agent (NVML library/driver version mismatch).",
                1 if self.restart_required else 0,
            ),
        ]

    def _close_devices(self) -> None:
        for d in self._devices:
            if d.gpm is not None:
                d.gpm.close()
        if self._events is not None:
            self._drain_events()
            self._try("nvmlEventSetFree", self._events)
            self._events = None
            self._registered.clear()

    def close(self) -> None:
        self._close_devices()
        self._try("nvmlShutdown")


def open_gpu_collector(
    nvml: ModuleType | None = None,
    attributor: Attributor | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> NvmlGpuCollector | NullGpuCollector:
    """Start NVML and return a GPU collector; a null one when there is no driver library at all."""
    if nvml is None:
        try:
            import pynvml as nvml_module
        except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
            return _disabled(f"nvidia-ml-py is not installed ({exc})")
        nvml = nvml_module
    attributor = attributor or Attributor()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        if _code(exc) == NVML_ERROR_LIBRARY_NOT_FOUND:
            return _disabled(f"NVML unavailable: {_describe(exc)}")
        # The library is there but the driver is not ready (not loaded yet at boot, being upgraded, or the module
        # loaded is older than the library on disk until the node reboots): wait for it.
        reason = f"NVML unavailable: {_describe(exc)}"
        log.info("GPU collector: %s; retrying every %.0f s", reason, RESCAN_S)
        return NvmlGpuCollector(nvml, attributor, clock, waiting_for=reason)
    return NvmlGpuCollector(nvml, attributor, clock)


def _disabled(reason: str) -> NullGpuCollector:
    log.info("GPU collector disabled: %s", reason)
    return NullGpuCollector(reason)
