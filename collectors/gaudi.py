"""Intel Gaudi accelerators through habana-pyhlml (``pip install fleetfit[gaudi]``; needs libhlml.so at run time).

Signals per device — gauges: ``util`` (AIP utilisation over the past second, %), ``mem_util`` (%),
``mem_used_mib``, ``power_w``, ``temp_c`` (on the AIP). HLML has no process call: the processes using a device
are those holding its device node (``/dev/accel/accel<minor>``) open, read from /proc.

How the real binding behaves: the functions live in ``pyhlml.main``; ``hlmlInit`` loads
``/usr/lib/habanalabs/libhlml.so`` and, when it is missing, prints "Failed to load libhlml" to stdout and raises
``HLMLError`` (per-code subclasses exist only after a successful init), so initialisation runs with stdout
captured and any failure disables the collector with one log line. Names, UUIDs and versions are bytes.

A driver that is not loaded yet at start (``HLML_ERROR_DRIVER_NOT_LOADED``) is waited for: ``hlmlInit`` is tried
again every ``RESCAN_S``. A device that cannot be opened costs that device only and is tried again; when the
device count or the driver version changes, or a device stops answering, HLML is shut down and initialised again
and the inventory re-read (``generation`` counts the changes so the agent re-publishes its birth).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from agent.metrics import Family, counter, gauge
from agent.protocol import GpuFailure, WorkloadRef
from collectors.amd import import_quietly
from collectors.attribution import Attributor
from collectors.base import Entity, GpuInfoGuard, Inventory, Sample
from collectors.gpu import REINIT_MAX_S, RESCAN_S
from collectors.pids import PidResolver

log = logging.getLogger(__name__)

# How often the power limit in force is read again: hl-smi or the BMC may change it at any time, and a window
# (10 s by default) should carry the limit it ran under.
POWER_LIMIT_S = 10.0

HABANA_VENDOR_ID = 0x1DA3
HLML_TEMPERATURE_ON_AIP = 0
HLML_ERROR_DRIVER_NOT_LOADED = 9
HOLDERS_DENIED = (
    "other users' /proc/PID/fd cannot be read: their Gaudi work is not attributed; grant CAP_DAC_READ_SEARCH and "
    "CAP_SYS_PTRACE (systemd/fleetfit-agent.service.d/attribution.conf.example)"
)
# PCI device ids → the product names the catalog knows (pci.ids: 1da3:1020 Gaudi2, 1da3:1060/1063 Gaudi3).
_PRODUCTS = {0x1020: "Intel Gaudi 2", 0x1060: "Intel Gaudi 3", 0x1063: "Intel Gaudi 3"}


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _init(hlml: ModuleType) -> None:
    """``hlmlInit`` with its stdout captured: it prints when libhlml is missing."""
    with contextlib.redirect_stdout(io.StringIO()):
        hlml.hlmlInit()


def _reason(exc: BaseException) -> str:
    said = " (Driver not loaded)" if getattr(exc, "value", None) == HLML_ERROR_DRIVER_NOT_LOADED else ""
    return f"HLML unavailable: {exc}{said}"


class GaudiCollector:
    name = "gpu"
    blocking = True

    def __init__(
        self,
        hlml: ModuleType,
        attributor: Attributor,
        clock: Callable[[], float] = time.monotonic,
        waiting_for: str | None = None,
    ) -> None:
        """``waiting_for``: HLML did not start (the driver is not loaded yet); retry every ``RESCAN_S``."""
        self._hlml = hlml
        self._errors: tuple[type[BaseException], ...] = (hlml.HLMLError,)
        self._pids = PidResolver(attributor)
        self._proc = attributor.procfs_root
        self._clock = clock
        self._next_scan = clock() + RESCAN_S
        self._devices: list[tuple[int, Any]] = []
        self._failures: dict[int, str] = {}
        self._minors: dict[int, Any] = {}
        self._silent: set[int] = set()  # devices none of whose readings answered at the last sample
        self._limits: dict[int, float | None] = {}  # the power limit in force, W, per device
        self._limits_next: dict[int, float] = {}  # when it is read again
        # HLML is initialised again for a fault that persists at 30 s, 60 s, 120 s... up to REINIT_MAX_S apart
        self._reinit_delay = RESCAN_S
        self._reinit_at = 0.0
        self.inits = 1  # HLML initialisations, the first included
        self.holders_denied = 0  # processes whose descriptors the last scan was refused (EACCES: no rights)
        self._unavailable = waiting_for
        self._signature: tuple[Any, ...] = ()
        self.generation = 0  # bumped whenever the inventory changes
        self._guard = GpuInfoGuard("HLML")  # a figure the birth refuses leaves that figure unread
        if waiting_for is None:
            self._enumerate()

    def _try(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._hlml, fn)(*args)
        except self._errors:
            return None
        except AttributeError:
            return None

    def _enumerate(self) -> None:
        """Open every device HLML counts: one that cannot be opened costs that device only."""
        before = dict(self._failures)
        self._devices, self._failures = [], {}
        for i in range(int(self._hlml.hlmlDeviceGetCount())):
            try:
                self._devices.append((i, self._hlml.hlmlDeviceGetHandleByIndex(i)))
            except self._errors as exc:
                self._failures[i] = f"{exc}"[:120]
                if before.get(i) != self._failures[i]:
                    log.warning("Gaudi device %d cannot be read (%s); the others are reported", i, exc)
        self._minors = {i: self._try("hlmlDeviceGetMinorNumber", h) for i, h in self._devices}
        self._silent.clear()
        self._signature = self._current()

    def _current(self) -> tuple[Any, ...]:
        """What, when it changes, means HLML must open the devices again: their count and the driver version."""
        return (self._try("hlmlDeviceGetCount"), self._try("hlmlGetDriverVersion"))

    @property
    def devices(self) -> int:
        return len(self._devices) + len(self._failures)

    def inventory(self) -> Inventory:
        gpus = []
        for i, h in self._devices:
            mem = self._try("hlmlDeviceGetMemoryInfo", h)
            pci = self._try("hlmlDeviceGetPCIInfo", h)
            device_id = _device_id(getattr(pci, "pci_device_id", None))
            name = _PRODUCTS.get(device_id or 0) or _text(self._try("hlmlDeviceGetName", h) or "Intel Gaudi")
            limit = self._power_limit(h) or self._try("hlmlDeviceGetPowerManagementDefaultLimit", h)
            gpus.append(
                self._guard.gpu(
                    index=i,
                    uuid=_text(self._try("hlmlDeviceGetUUID", h) or f"HL-{i}")[:96],
                    model=name[:96],
                    memory_mib=int(mem.total // 2**20) if mem else 0,
                    pcie_gen=self._try("hlmlDeviceGetCurrPCIELinkGeneration", h) or None,
                    pcie_width=self._try("hlmlDeviceGetCurrPCIELinkWidth", h) or None,
                    power_limit_w=_milliwatts(limit),
                    pci_device_id=f"0x{device_id:04x}{HABANA_VENDOR_ID:04x}" if device_id else None,
                )
            )
        driver = self._try("hlmlGetDriverVersion") if self._unavailable is None else None
        return Inventory(
            gpus=gpus,
            gpu_unavailable=self._unavailable[:300] if self._unavailable else None,
            driver_version=_text(driver)[:32] if driver else None,
            gpu_failures=[GpuFailure(index=i, error=e) for i, e in sorted(self._failures.items())],
            attribution_warning=self._pids.warning() or (HOLDERS_DENIED if self.holders_denied else None),
        )

    def _reopen(self) -> None:
        """Open each device that could not be opened again, alone: HLML hands out a handle per device."""
        for i in sorted(self._failures):
            try:
                handle = self._hlml.hlmlDeviceGetHandleByIndex(i)
            except self._errors:
                continue
            del self._failures[i]
            self._devices = sorted([*self._devices, (i, handle)], key=lambda d: d[0])
            self._minors[i] = self._try("hlmlDeviceGetMinorNumber", handle)
            log.info("Gaudi device %d answers again", i)
            self.generation += 1

    def _rescan(self, now: float) -> None:
        """Start HLML where the driver was not loaded; open the devices again where they changed or failed. A
        fault that a re-initialisation did not cure (a broken device) is tried again at growing intervals, up to
        ``REINIT_MAX_S``: each one re-opens every device, and at 30 s for ever it never stops."""
        if self._unavailable is None:
            self._reopen()
            if self._current() != self._signature:
                why = "device count or driver changed"
            elif self._failures:
                why = "a device could not be opened"
            elif self._silent:
                why = "a device stopped answering"
            else:
                self._reinit_delay = RESCAN_S
                return
            if not why.startswith("device count"):  # a device at fault rather than a change: back off
                if now < self._reinit_at:
                    return
                self._reinit_at = now + self._reinit_delay
                self._reinit_delay = min(2 * self._reinit_delay, REINIT_MAX_S)
            with contextlib.suppress(*self._errors):
                self._hlml.hlmlShutdown()
        else:
            why = "the driver is loaded"
        before = (tuple(i for i, _ in self._devices), tuple(sorted(self._failures)), self._unavailable)
        try:
            self.inits += 1
            _init(self._hlml)
            self._unavailable = None
            self._enumerate()
        except self._errors as exc:
            self._unavailable = _reason(exc)
            self._devices, self._failures = [], {}
        after = (tuple(i for i, _ in self._devices), tuple(sorted(self._failures)), self._unavailable)
        if after != before:
            log.info("Gaudi devices re-read (%s): %d device(s)", why, len(self._devices))
            self.generation += 1
        elif self._unavailable is None and (self._failures or self._silent):
            log.info("Gaudi collector: HLML initialised again (%s); next try in %.0f s", why, self._reinit_delay)

    def sample(self) -> list[Sample]:
        now = self._clock()
        if now >= self._next_scan:
            self._next_scan = now + RESCAN_S
            self._rescan(now)
        out = []
        self._silent.clear()
        for i, h in self._devices:
            gauges: dict[str, float] = {}
            if (util := self._try("hlmlDeviceGetUtilizationRates", h)) is not None:
                # pyhlml releases return the aip int, a struct of aip only, or aip and memory
                aip = util if isinstance(util, int) else getattr(util, "aip", None)
                if isinstance(aip, int):
                    gauges["util"] = float(aip)
                if isinstance(memory := getattr(util, "memory", None), int):
                    gauges["mem_util"] = float(memory)
            if (mem := self._try("hlmlDeviceGetMemoryInfo", h)) is not None:
                gauges["mem_used_mib"] = mem.used / 2**20
            if (power := self._try("hlmlDeviceGetPowerUsage", h)) is not None:
                gauges["power_w"] = power / 1000
            if (temp := self._try("hlmlDeviceGetTemperature", h, HLML_TEMPERATURE_ON_AIP)) is not None:
                gauges["temp_c"] = float(temp)
            latest: dict[str, float] = {}
            if now >= self._limits_next.get(i, float("-inf")):
                self._limits[i], self._limits_next[i] = _milliwatts(self._power_limit(h)), now + POWER_LIMIT_S
            if (limit_w := self._limits.get(i)) is not None:
                latest["power_limit_w"] = limit_w
            if not gauges:
                self._silent.add(i)
            out.append(Sample(Entity.GPU, str(i), gauges=gauges, latest=latest))
        return out

    def _power_limit(self, handle: Any) -> Any:
        """The limit in force, mW; None where the binding has no call for it (pyhlml before it added one)."""
        return self._try("hlmlDeviceGetPowerManagementLimit", handle)

    def _holders(self) -> dict[int, list[object]]:
        """PIDs holding each device node open, by device index (one pass over /proc per window)."""
        by_node = {f"/dev/accel/accel{m}": i for i, m in self._minors.items() if m is not None}
        by_node |= {f"/dev/hl{m}": i for i, m in self._minors.items() if m is not None}  # drivers before 1.13
        out: dict[int, list[object]] = {}
        if not by_node:
            return out
        try:
            pids = [p for p in os.listdir(self._proc) if p.isdigit()]
        except OSError:
            return out
        denied = 0
        for pid in pids:
            fd_dir = self._proc / pid / "fd"
            try:
                fds = os.listdir(fd_dir)
            except PermissionError:  # another user's, without CAP_DAC_READ_SEARCH
                denied += 1
                continue
            except OSError:  # gone
                continue
            for fd in fds:
                try:
                    target = os.readlink(fd_dir / fd)
                except PermissionError:  # another user's, without CAP_SYS_PTRACE
                    denied += 1
                    break
                except OSError:
                    continue
                if (index := by_node.get(target)) is not None:
                    out.setdefault(index, []).append(int(pid))
                    break
        if denied and not self.holders_denied:  # said once per episode, and the birth says it from now on
            log.warning("Gaudi holders: %d process(es) refused: %s", denied, HOLDERS_DENIED)
            self.generation += 1
        elif self.holders_denied and not denied:
            self.generation += 1
        self.holders_denied = denied
        return out

    def workloads(self) -> list[WorkloadRef]:
        return self._pids.workloads(sorted(self._holders().items()))

    def metrics(self) -> list[Family]:
        return [
            self._guard.metric(),
            counter("fleetfit_agent_gpu_invalid_pids_total", "GPU process ids not in /proc.", self._pids.invalid),
            gauge("fleetfit_agent_gpu_failed", "GPUs the driver lists but the agent cannot read.", len(self._failures)),
            counter("fleetfit_agent_gpu_inventory_changes_total", "GPU layout changes seen.", self.generation),
            counter("fleetfit_agent_gpu_library_inits_total", "Initialisations of the GPU library.", self.inits),
            gauge(
                "fleetfit_agent_gpu_holders_denied",
                "Processes whose /proc/PID/fd the last Gaudi holder scan could not read (no CAP_SYS_PTRACE).",
                self.holders_denied,
            ),
        ]

    def close(self) -> None:
        self._try("hlmlShutdown")


def _milliwatts(value: Any) -> float | None:
    """W from HLML's mW; some pyhlml releases return the ctypes c_uint itself rather than its value."""
    value = getattr(value, "value", value)
    return value / 1000 if isinstance(value, int) and value > 0 else None


def _device_id(value: Any) -> int | None:
    """HLML's pci_device_id: the device id, possibly with the vendor id in its low 16 bits as NVML has it."""
    if not isinstance(value, int) or value <= 0:
        return None
    return value >> 16 if value & 0xFFFF == HABANA_VENDOR_ID and value > 0xFFFF else value & 0xFFFF


def open_gaudi_collector(
    hlml: ModuleType | None = None,
    attributor: Attributor | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> GaudiCollector | None:
    """A Gaudi collector, or None (with one log line) where pyhlml, libhlml or devices are absent; one that waits
    where the driver is not loaded yet."""
    if hlml is None:
        hlml, why = import_quietly("pyhlml.main")
        if hlml is None:
            log.info("Gaudi collector disabled: habana-pyhlml unavailable (%s)", why)
            return None
    attributor = attributor or Attributor()
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            hlml.hlmlInit()
        collector = GaudiCollector(hlml, attributor, clock)
    except hlml.HLMLError as exc:
        if getattr(exc, "value", None) == HLML_ERROR_DRIVER_NOT_LOADED:
            reason = _reason(exc)
            log.info("Gaudi collector: %s; retrying every %.0f s", reason, RESCAN_S)
            return GaudiCollector(hlml, attributor, clock, waiting_for=reason)
        said = " ".join(captured.getvalue().split())[:80]
        log.info("Gaudi collector disabled: %s%s", exc, f" ({said})" if said else "")
        return None
    if not collector.devices:
        log.info("Gaudi collector disabled: HLML found no device")
        collector.close()
        return None
    return collector
