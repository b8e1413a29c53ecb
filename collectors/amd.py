"""AMD Instinct GPUs through amdsmi (``pip install fleetfit[amd]``; needs ROCm's libamd_smi.so at run time).

Signals per GPU — gauges: ``util`` (graphics activity, %), ``mem_util`` (memory-controller activity, %),
``mem_used_mib``, ``power_w``, ``temp_c`` (hotspot); counters: ``nvlink_tx_bps`` / ``nvlink_rx_bps`` from the
per-link xGMI write/read accumulators (KB) of ``amdsmi_get_gpu_metrics_info``, each link kept monotonic on its
own. PCIe bytes are not reported: amdsmi's accumulator sums bandwidth samples rather than bytes, and
``amdsmi_get_gpu_pci_throughput`` blocks for a second.

How the real binding behaves, and what this module does about it: ``import amdsmi`` without libamd_smi.so
prints two lines to stdout and raises ``KeyError`` (not ImportError), so the import runs with stdout captured and
any failure disables the collector with one log line. Every call raises ``AmdSmiLibraryException`` (with
``err_code``) or ``AmdSmiParameterException``, both ``AmdSmiException``; values a GPU does not report come back as
the string ``"N/A"``, never as an error.

Compute partitions. A GPU in a partition mode other than SPX (DPX, QPX, CPX) is listed as several devices: eight
MI300X in CPX are 64. Each partition carries its GPU's PCI address with the partition number as the PCI function
(``0000:05:00.3``), which is how they are grouped here. Only the first partition answers the partition query and
reads gpu_metrics (ROCm 6.4.1, ROCm/amdsmi#100), so the group's mode is the first partition's answer, or failing
that follows from the number of partitions; every partition of the GPU carries it in the birth (``mig_profile``),
and each partition names its GPU's first partition (``physical``), which is how the optimizer counts eight CPX
devices as one GPU. The memory partition mode (NPS1, NPS4: the NUMA domains the GPU's HBM is split into) is read
the same way, once per GPU, into the birth (``memory_partition``). The GPU's own readings (power, temperature,
memory-controller activity, xGMI bytes) are read once, from the first partition, and reported on it; each
partition's activity comes from the GPU's ``xcp_stats`` where the driver reports it (gpu_metrics 1.6+), from the
partition's own activity call otherwise.

amdsmi lists the devices once, at ``amdsmi_init``: after a driver reload (a partition change, an upgrade) its
handles point at devices that are gone. Every ``RESCAN_S`` the collector checks the partition mode, the driver
version, devices that stopped answering and devices that could not be read; on any of them it shuts amdsmi down,
initialises it again and re-reads the inventory (``generation`` counts the changes so the agent re-publishes its
birth). A driver that is not loaded yet at start (``DRIVER_NOT_LOADED``) is waited for the same way.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from agent.metrics import Family, counter, gauge
from agent.protocol import GpuFailure, WorkloadRef
from collectors.attribution import Attributor
from collectors.base import Entity, GpuInfoGuard, Inventory, Sample
from collectors.gpu import REINIT_MAX_S, RESCAN_S, WrappingCounter
from collectors.pids import PidResolver

log = logging.getLogger(__name__)

# How often the power cap is read again: amd-smi set --power-cap or the BMC may change it at any time, and a
# window (10 s by default) should carry the cap it ran under.
POWER_LIMIT_S = 10.0

AMD_VENDOR_ID = 0x1002
AMDSMI_STATUS_DRIVER_NOT_LOADED = 34
# Partition modes by the number of devices a GPU is listed as, where the GPU cannot say (AMD Instinct docs, "GPU
# partitioning": DPX halves, TPX thirds, QPX quarters; CPX is one partition per XCD, 8 on MI300X, 6 on MI300A).
_MODE_BY_COUNT = {2: "DPX", 3: "TPX", 4: "QPX", 6: "CPX", 8: "CPX"}
_WHOLE = frozenset({"", "SPX", "N/A"})
_NPS = re.compile(r"^NPS[0-9]{1,2}$")  # amdsmi's memory partition modes: NPS1, NPS2, NPS4, NPS8


def _number(value: Any) -> float | None:
    """amdsmi's values: a number, or "N/A" where the GPU does not report it."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def import_quietly(name: str) -> tuple[ModuleType | None, str]:
    """Import a vendor binding that may print to stdout and raise anything when its C library is missing."""
    import importlib

    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            return importlib.import_module(name), ""
    except Exception as exc:  # the bindings raise ImportError, KeyError, OSError... when the library is absent
        said = " ".join(captured.getvalue().split())[:120]
        return None, f"{type(exc).__name__}: {exc}" + (f" ({said})" if said else "")


def _error(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:120] or type(exc).__name__


@dataclass(slots=True)
class _Device:
    index: int  # amdsmi's position: what the birth and samples call the device
    handle: Any
    address: str | None  # the GPU's PCI address without the function: what its partitions share
    partition: int  # the partition number within its GPU (the PCI function); 0 for a whole GPU
    primary: int  # index of the GPU's first partition: the device its GPU-wide readings are read from
    mode: str | None = None  # the GPU's partition mode (CPX...), None for a whole GPU
    partitions: int = 1  # devices its GPU is listed as
    memory_mode: str | None = None  # the GPU's memory partition mode (NPS1, NPS4...); None where it has none
    links: int = 0  # xGMI links the GPU reports
    power_limit_w: float | None = None
    power_limit_next: float = float("-inf")  # when the power cap is read again


class AmdGpuCollector:
    name = "gpu"
    blocking = True

    def __init__(
        self,
        smi: ModuleType,
        attributor: Attributor,
        clock: Callable[[], float] = time.monotonic,
        waiting_for: str | None = None,
    ) -> None:
        """``waiting_for``: amdsmi did not start (the driver is not loaded yet); retry every ``RESCAN_S``."""
        self._smi = smi
        self._errors: tuple[type[BaseException], ...] = (smi.AmdSmiException,)
        self._pids = PidResolver(attributor)
        self._clock = clock
        self._next_scan = clock() + RESCAN_S
        self._devices: list[_Device] = []
        self._failures: dict[int, str] = {}
        self._failed: dict[int, _Device] = {}  # the devices behind _failures, each retried alone at every check
        self._silent: set[int] = set()  # devices none of whose calls answered at the last sample
        # amdsmi is initialised again for a fault that persists at 30 s, 60 s, 120 s... up to REINIT_MAX_S apart
        self._reinit_delay = RESCAN_S
        self._reinit_at = 0.0
        self.inits = 1  # amdsmi initialisations, the first included
        self._links: dict[tuple[str, str, int], WrappingCounter] = {}
        self._driver: str | None = None
        self._unavailable = waiting_for
        self._signature: tuple[Any, ...] = ()
        self.generation = 0  # bumped whenever the inventory changes
        self._guard = GpuInfoGuard("amdsmi")  # a figure the birth refuses leaves that figure unread
        if waiting_for is None:
            self._enumerate(smi.amdsmi_get_processor_handles())

    def _try(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._smi, fn)(*args)
        except self._errors:
            return None
        except AttributeError:  # an older amdsmi without this call
            return None

    @property
    def devices(self) -> int:
        return len(self._devices) + len(self._failures)

    # ------------------------------------------------------------------ inventory

    def _enumerate(self, handles: list[Any]) -> None:
        """Read the devices amdsmi lists: a device that fails costs that device only and is tried again."""
        before = dict(self._failures)
        self._devices, self._failures = [], {}
        found: list[_Device] = []
        for i, handle in enumerate(handles):
            address, partition = _address(self._try("amdsmi_get_gpu_device_bdf", handle))
            found.append(_Device(i, handle, address, partition, i))
        groups: dict[str, list[_Device]] = {}
        for d in found:
            if d.address is not None:
                groups.setdefault(d.address, []).append(d)
        for d in found:
            members = groups.get(d.address, [d]) if d.address is not None else [d]
            first = min(members, key=lambda m: m.partition)
            d.primary = first.index
            if d is first:
                mode, memory = self._mode(members), self._memory_mode(members)
                for m in members:
                    m.mode, m.memory_mode, m.partitions = mode, memory, len(members)
        self._failed = {}
        for d in found:
            if self._try("amdsmi_get_gpu_asic_info", d.handle) is None:
                self._failures[d.index] = "amdsmi_get_gpu_asic_info failed"
                self._failed[d.index] = d
                if d.index not in before:
                    log.warning("AMD GPU %d cannot be read; the others are reported, it is tried again", d.index)
                continue
            self._devices.append(d)
        primaries = {d.primary for d in found}
        links = {i: self._xgmi_links(found[i].handle) for i in primaries}
        for d in found:
            d.links = links.get(d.primary, 0)
        self._silent.clear()
        self._driver = self._driver_version()
        self._signature = self._current()

    def _mode(self, members: list[_Device]) -> str | None:
        """The partition mode of one GPU: what its first partition answers (the others cannot, ROCm/amdsmi#100),
        else any partition's answer, else what the number of its partitions means."""
        answer = None
        for m in sorted(members, key=lambda m: m.partition):
            said = self._try("amdsmi_get_gpu_compute_partition", m.handle)
            if isinstance(said, str) and said.strip().upper() not in _WHOLE:
                answer = said.strip().upper()[:32]
                break
        if answer is not None or len(members) == 1:
            return answer
        return _MODE_BY_COUNT.get(len(members))

    def _memory_mode(self, members: list[_Device]) -> str | None:
        """The memory partition mode of one GPU (NPS1: its HBM is one NUMA domain; NPS4: four, each partition
        using its own quarter), as the first partition that answers says it: like the compute mode, only the
        first partition answers on ROCm releases before the fix of ROCm/amdsmi#100. GPUs without memory
        partitions (MI210, MI250X) answer NOT_SUPPORTED; an amdsmi without the call gives None too."""
        for m in sorted(members, key=lambda m: m.partition):
            said = self._try("amdsmi_get_gpu_memory_partition", m.handle)
            if isinstance(said, str) and _NPS.match(said.strip().upper()):
                return said.strip().upper()
        return None

    def _xgmi_links(self, handle: Any) -> int:
        metrics = self._try("amdsmi_get_gpu_metrics_info", handle) or {}
        values = metrics.get("xgmi_read_data_acc")
        return len([v for v in values if _number(v) is not None]) if isinstance(values, list) else 0

    def _driver_version(self) -> str | None:
        for d in self._devices[:1]:
            info = self._try("amdsmi_get_gpu_driver_info", d.handle) or {}
            version = info.get("driver_version")
            if isinstance(version, str) and version not in ("", "N/A"):
                return version[:32]
        return None

    def _current(self) -> tuple[Any, ...]:
        """What, when it changes, means amdsmi must list the devices again: each GPU's compute and memory partition
        modes as its first partition answers now, and the driver version. Read every ``RESCAN_S``, not per tick."""
        modes = tuple(
            (
                self._try("amdsmi_get_gpu_compute_partition", d.handle),
                self._try("amdsmi_get_gpu_memory_partition", d.handle),
            )
            for d in self._devices
            if d.primary == d.index
        )
        return (modes, self._driver_version())

    def inventory(self) -> Inventory:
        gpus = []
        for d in self._devices:
            h = d.handle
            asic = self._try("amdsmi_get_gpu_asic_info", h)
            if asic is None:
                continue  # gone since the last check; the next one lists the devices again
            vram = self._try("amdsmi_get_gpu_vram_usage", h) or {}
            gpus.append(
                self._guard.gpu(
                    index=d.index,
                    uuid=str(self._try("amdsmi_get_gpu_device_uuid", h) or f"AMD-{d.index}")[:96],
                    model=_market_name(asic),
                    memory_mib=int(_number(vram.get("vram_total")) or 0),
                    nvlink_links=d.links,
                    mig_profile=d.mode,
                    power_limit_w=self._power_cap(h) if d.primary == d.index else None,
                    pci_device_id=_pci_id(asic),
                    memory_partition=d.memory_mode,
                    # the GPU a partition is part of, from its PCI address: counted rather than guessed from the
                    # mode (a mode amdsmi does not name, a partition that could not be read)
                    physical=d.primary if d.mode is not None or d.partitions > 1 else None,
                )
            )
        unavailable = self._unavailable
        if unavailable is None and not gpus and self._failures:
            unavailable = "no AMD GPU could be read; see gpu_failures"
        return Inventory(
            gpus=gpus,
            gpu_unavailable=unavailable[:300] if unavailable else None,
            driver_version=self._driver,
            gpu_failures=[GpuFailure(index=i, error=e) for i, e in sorted(self._failures.items())],
            attribution_warning=self._pids.warning(),
        )

    # ------------------------------------------------------------------ re-reading

    def _retry_failed(self) -> None:
        """Read each device that could not be read again on its own handle: no re-initialisation for one device."""
        for i, d in sorted(self._failed.items()):
            if self._try("amdsmi_get_gpu_asic_info", d.handle) is None:
                continue
            del self._failed[i], self._failures[i]
            self._devices = sorted([*self._devices, d], key=lambda x: x.index)
            log.info("AMD GPU %d answers again", i)
            self.generation += 1
            self._signature = self._current()  # its partition mode joins the others'

    def _rescan(self, now: float) -> None:
        """Start amdsmi where the driver was not loaded; list the devices again where they changed or failed. A
        fault that a re-initialisation did not cure (a broken device) is tried again at growing intervals, up to
        ``REINIT_MAX_S``: each one re-reads every device, and at 30 s for ever it never stops."""
        if self._unavailable is not None:
            try:
                self.inits += 1
                self._smi.amdsmi_init()
                handles = self._smi.amdsmi_get_processor_handles()
            except self._errors as exc:
                self._unavailable = f"amdsmi unavailable: {_error(exc)}"
                return
            self._unavailable = None
            self._enumerate(handles)
            log.info("amdsmi started: %d AMD device(s) found", self.devices)
            self.generation += 1
            return
        self._retry_failed()
        why = self._why_again()
        if why is None:
            self._reinit_delay = RESCAN_S
            return
        if not why.startswith("partition"):  # a device at fault rather than a change: back off
            if now < self._reinit_at:
                return
            self._reinit_at = now + self._reinit_delay
            self._reinit_delay = min(2 * self._reinit_delay, REINIT_MAX_S)
        before = self._layout()
        with contextlib.suppress(*self._errors):
            self._smi.amdsmi_shut_down()
        try:
            self.inits += 1
            self._smi.amdsmi_init()
            handles = self._smi.amdsmi_get_processor_handles()
        except self._errors as exc:
            self._unavailable = f"amdsmi unavailable: {_error(exc)}"
            log.warning("AMD GPU collector: %s after %s; retrying every %.0f s", self._unavailable, why, RESCAN_S)
            self._devices, self._failures, self._failed = [], {}, {}
            self.generation += 1
            return
        self._enumerate(handles)
        if self._layout() != before:
            log.info("AMD GPU layout changed (%s); inventory re-read", why)
            self.generation += 1
        elif self._why_again() is not None:
            log.info("AMD GPU collector: amdsmi initialised again (%s); next try in %.0f s", why, self._reinit_delay)

    def _why_again(self) -> str | None:
        if self._failures:
            return "a device could not be read"
        if self._silent:
            return "a device stopped answering"
        if self._current() != self._signature:
            return "partition mode or driver changed"
        return None

    def _layout(self) -> tuple[Any, ...]:
        return (
            tuple((d.index, d.address, d.partition, d.mode, d.memory_mode, d.links) for d in self._devices),
            tuple(sorted(self._failures)),
            self._driver,
            self._unavailable,
        )

    # ------------------------------------------------------------------ sampling

    def _xgmi(self, key: str, metrics: dict[str, Any]) -> dict[str, int]:
        out: dict[str, int] = {}
        for name, field in (("nvlink_tx_bps", "xgmi_write_data_acc"), ("nvlink_rx_bps", "xgmi_read_data_acc")):
            values = metrics.get(field)
            if not isinstance(values, list):
                continue
            total = 0
            for link, value in enumerate(values):
                c = self._links.get((key, name, link))
                if (raw := _number(value)) is not None:
                    c = self._links.setdefault((key, name, link), WrappingCounter())
                    c.add(int(raw), 64)
                if c is not None:
                    total += c.total
            out[name] = total * 1000  # amdsmi counts xGMI data in kB
        return out

    def sample(self) -> list[Sample]:
        now = self._clock()
        if now >= self._next_scan:
            self._next_scan = now + RESCAN_S
            self._rescan(now)
        metrics: dict[int, dict[str, Any] | None] = {}
        for d in self._devices:
            if d.primary == d.index:
                metrics[d.index] = self._try("amdsmi_get_gpu_metrics_info", d.handle)
        out = []
        self._silent.clear()
        for d in self._devices:
            gauges: dict[str, float] = {}
            counters: dict[str, int] = {}
            answered = False
            gpu = metrics.get(d.primary)
            if d.mode is not None and gpu is not None:
                busy = _partition_busy(gpu, d.partition)
                if busy is not None:
                    gauges["util"] = busy
            activity = self._try("amdsmi_get_gpu_activity", d.handle)
            if activity is not None:
                answered = True
                if "util" not in gauges and (util := _number(activity.get("gfx_activity"))) is not None:
                    gauges["util"] = util
                if (mem_util := _number(activity.get("umc_activity"))) is not None and d.primary == d.index:
                    gauges["mem_util"] = mem_util
            vram = self._try("amdsmi_get_gpu_vram_usage", d.handle)
            if vram is not None:
                answered = True
                if (used := _number(vram.get("vram_used"))) is not None:
                    gauges["mem_used_mib"] = used
            if d.primary == d.index:
                answered |= gpu is not None
                gauges |= self._board(d, gpu or {})
                counters = self._xgmi(d.address or str(d.index), gpu or {})
            latest: dict[str, float] = {}
            if d.primary == d.index:
                if now >= d.power_limit_next:
                    d.power_limit_w, d.power_limit_next = self._power_cap(d.handle), now + POWER_LIMIT_S
                if d.power_limit_w is not None:
                    latest["power_limit_w"] = d.power_limit_w
            if not answered:
                self._silent.add(d.index)
            out.append(Sample(Entity.GPU, str(d.index), gauges=gauges, counters=counters, latest=latest))
        return out

    def _power_cap(self, handle: Any) -> float | None:
        """The socket power cap in force, W (amdsmi_get_power_cap_info gives µW on bare metal, amdsmi.h)."""
        info = self._try("amdsmi_get_power_cap_info", handle)
        cap = _number(info.get("power_cap")) if isinstance(info, dict) else None
        return cap / 1e6 if cap else None

    def _board(self, d: _Device, metrics: dict[str, Any]) -> dict[str, float]:
        """Readings of the whole GPU. Power comes from gpu_metrics, as amdsmi_get_power_info's own does: that call
        fails as a whole when only the power cap cannot be read (hwmon's power1_cap, absent in some VMs)."""
        gauges: dict[str, float] = {}
        watts = _number(metrics.get("current_socket_power"))
        if watts is None:
            watts = _number(metrics.get("average_socket_power"))
        if watts is None:
            power = self._try("amdsmi_get_power_info", d.handle) or {}
            watts = _number(power.get("current_socket_power"))
            if watts is None:
                watts = _number(power.get("average_socket_power"))
        if watts is not None:
            gauges["power_w"] = watts
        if (temp := _number(metrics.get("temperature_hotspot"))) is not None:
            gauges["temp_c"] = temp
        return gauges

    # ------------------------------------------------------------------ attribution

    def workloads(self) -> list[WorkloadRef]:
        pids: list[tuple[int, list[object]]] = []
        memory: dict[tuple[int, int], object] = {}
        for d in self._devices:
            listed: list[object] = []
            for entry in self._try("amdsmi_get_gpu_process_list", d.handle) or []:
                # amdsmi before ROCm 6.2 lists process handles, each read with amdsmi_get_gpu_process_info
                info = entry if isinstance(entry, dict) else self._try("amdsmi_get_gpu_process_info", d.handle, entry)
                if not isinstance(info, dict):
                    continue
                pid = info.get("pid")
                vram = _vram(info)
                if vram == 0:
                    # some amdsmi releases list every GPU user under each GPU, with 0 bytes where it holds none:
                    # kept, a one-GPU job would be attributed to all of them
                    continue
                listed.append(pid)
                if isinstance(pid, int):
                    memory[(d.index, pid)] = vram
            pids.append((d.index, listed))
        return self._pids.workloads(pids, memory)

    def metrics(self) -> list[Family]:
        return [
            self._guard.metric(),
            counter("fleetfit_agent_gpu_invalid_pids_total", "GPU process ids not in /proc.", self._pids.invalid),
            gauge("fleetfit_agent_gpu_failed", "GPUs the driver lists but the agent cannot read.", len(self._failures)),
            counter("fleetfit_agent_gpu_inventory_changes_total", "GPU layout changes seen.", self.generation),
            counter("fleetfit_agent_gpu_library_inits_total", "Initialisations of the GPU library.", self.inits),
        ]

    def close(self) -> None:
        self._try("amdsmi_shut_down")


def _address(bdf: Any) -> tuple[str | None, int]:
    """("0000:05:00", 3) from amdsmi's "0000:05:00.3": the GPU's address and the partition number."""
    if not isinstance(bdf, str) or "." not in bdf:
        return None, 0
    address, _, function = bdf.strip().lower().rpartition(".")
    try:
        return address, int(function, 16)
    except ValueError:
        return None, 0


def _partition_busy(metrics: dict[str, Any], partition: int) -> float | None:
    """One partition's graphics activity: the mean over its XCDs in gpu_metrics' per-partition statistics."""
    table = metrics.get("xcp_stats.gfx_busy_inst")
    if not isinstance(table, list) or not 0 <= partition < len(table) or not isinstance(table[partition], list):
        return None
    values = [v for v in (_number(x) for x in table[partition]) if v is not None and 0 <= v <= 100]
    return sum(values) / len(values) if values else None


def _vram(info: dict[str, Any]) -> object:
    """Bytes of VRAM a process holds: ``memory_usage.vram_mem`` (amdsmi 6.2+), else ``mem``; None if neither."""
    usage = info.get("memory_usage")
    if isinstance(usage, dict) and isinstance(usage.get("vram_mem"), int):
        return usage["vram_mem"]
    mem = info.get("mem")
    return mem if isinstance(mem, int) else None


def _market_name(asic: dict[str, Any]) -> str:
    name = str(asic.get("market_name") or "").strip()
    if not name or name == "N/A":
        return f"AMD GPU {asic.get('device_id', '?')}"[:96]
    return name if name.upper().startswith("AMD") else f"AMD {name}"[:96]


def _pci_id(asic: dict[str, Any]) -> str | None:
    """amdsmi gives "0x74a1" and "0x1002"; the birth carries NVML's layout, device then vendor."""
    try:
        device = int(str(asic.get("device_id")), 16)
        vendor = int(str(asic.get("vendor_id", hex(AMD_VENDOR_ID))), 16)
    except ValueError:
        return None
    return f"0x{device:04x}{vendor:04x}"


def open_amd_collector(
    smi: ModuleType | None = None,
    attributor: Attributor | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> AmdGpuCollector | None:
    """An AMD collector, or None (with one log line) where amdsmi or ROCm's library or GPUs are absent; one that
    waits where the amdgpu driver is not loaded yet."""
    if smi is None:
        smi, why = import_quietly("amdsmi")
        if smi is None:
            log.info("AMD GPU collector disabled: amdsmi unavailable (%s)", why)
            return None
    attributor = attributor or Attributor()
    try:
        smi.amdsmi_init()
        collector = AmdGpuCollector(smi, attributor, clock)
    except smi.AmdSmiException as exc:
        if getattr(exc, "err_code", None) == AMDSMI_STATUS_DRIVER_NOT_LOADED:
            reason = f"amdsmi unavailable: {_error(exc)}"
            log.info("AMD GPU collector: %s; retrying every %.0f s", reason, RESCAN_S)
            return AmdGpuCollector(smi, attributor, clock, waiting_for=reason)
        log.info("AMD GPU collector disabled: %s", " ".join(str(exc).split())[:200])
        return None
    if not collector.devices:
        log.info("AMD GPU collector disabled: amdsmi found no GPU")
        collector.close()
        return None
    return collector
