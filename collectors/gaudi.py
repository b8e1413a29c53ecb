"""Intel Gaudi accelerators through habana-pyhlml (``pip install fleetfit[gaudi]``; needs libhlml.so at run time).

Signals per device — gauges: ``util`` (AIP utilisation over the past second, %), ``mem_util`` (%),
``mem_used_mib``, ``power_w``, ``temp_c`` (on the AIP). HLML has no process call: the processes using a device
are those holding its device node (``/dev/accel/accel<minor>``) open, read from /proc.

How the real binding behaves: the functions live in ``pyhlml.main``; ``hlmlInit`` loads
``/usr/lib/habanalabs/libhlml.so`` and, when it is missing, prints "Failed to load libhlml" to stdout and raises
``HLMLError`` (per-code subclasses exist only after a successful init), so initialisation runs with stdout
captured and any failure disables the collector with one log line. Names, UUIDs and versions are bytes.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from types import ModuleType
from typing import Any

from agent.metrics import Family, counter
from agent.protocol import GpuFailure, GpuInfo, WorkloadRef
from collectors.amd import import_quietly
from collectors.attribution import Attributor
from collectors.base import Entity, Inventory, Sample
from collectors.pids import PidResolver

log = logging.getLogger(__name__)

HABANA_VENDOR_ID = 0x1DA3
HLML_TEMPERATURE_ON_AIP = 0
# PCI device ids → the product names the catalog knows (pci.ids: 1da3:1020 Gaudi2, 1da3:1060/1063 Gaudi3).
_PRODUCTS = {0x1020: "Intel Gaudi 2", 0x1060: "Intel Gaudi 3", 0x1063: "Intel Gaudi 3"}


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class GaudiCollector:
    name = "gpu"

    def __init__(self, hlml: ModuleType, attributor: Attributor) -> None:
        self._hlml = hlml
        self._errors: tuple[type[BaseException], ...] = (hlml.HLMLError,)
        self._pids = PidResolver(attributor)
        self._proc = attributor.procfs_root
        self._devices: list[tuple[int, Any]] = []
        self._failures: dict[int, str] = {}
        for i in range(hlml.hlmlDeviceGetCount()):
            try:
                self._devices.append((i, hlml.hlmlDeviceGetHandleByIndex(i)))
            except self._errors as exc:
                self._failures[i] = f"{exc}"[:120]
                log.warning("Gaudi device %d cannot be read (%s); the others are reported", i, exc)
        self._minors = {i: self._try("hlmlDeviceGetMinorNumber", h) for i, h in self._devices}

    def _try(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._hlml, fn)(*args)
        except self._errors:
            return None
        except AttributeError:
            return None

    def inventory(self) -> Inventory:
        gpus = []
        for i, h in self._devices:
            mem = self._try("hlmlDeviceGetMemoryInfo", h)
            pci = self._try("hlmlDeviceGetPCIInfo", h)
            device_id = _device_id(getattr(pci, "pci_device_id", None))
            name = _PRODUCTS.get(device_id or 0) or _text(self._try("hlmlDeviceGetName", h) or "Intel Gaudi")
            limit = self._try("hlmlDeviceGetPowerManagementDefaultLimit", h)
            gpus.append(
                GpuInfo(
                    index=i,
                    uuid=_text(self._try("hlmlDeviceGetUUID", h) or f"HL-{i}")[:96],
                    model=name[:96],
                    memory_mib=int(mem.total // 2**20) if mem else 0,
                    pcie_gen=self._try("hlmlDeviceGetCurrPCIELinkGeneration", h) or None,
                    pcie_width=self._try("hlmlDeviceGetCurrPCIELinkWidth", h) or None,
                    power_limit_w=limit / 1000 if limit else None,
                    pci_device_id=f"0x{device_id:04x}{HABANA_VENDOR_ID:04x}" if device_id else None,
                )
            )
        driver = self._try("hlmlGetDriverVersion")
        return Inventory(
            gpus=gpus,
            driver_version=_text(driver)[:32] if driver else None,
            gpu_failures=[GpuFailure(index=i, error=e) for i, e in sorted(self._failures.items())],
            attribution_warning=self._pids.warning(),
        )

    def sample(self) -> list[Sample]:
        out = []
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
            out.append(Sample(Entity.GPU, str(i), gauges=gauges))
        return out

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
        for pid in pids:
            fd_dir = self._proc / pid / "fd"
            try:
                fds = os.listdir(fd_dir)
            except OSError:  # gone, or not ours to read
                continue
            for fd in fds:
                try:
                    target = os.readlink(fd_dir / fd)
                except OSError:
                    continue
                if (index := by_node.get(target)) is not None:
                    out.setdefault(index, []).append(int(pid))
                    break
        return out

    def workloads(self) -> list[WorkloadRef]:
        return self._pids.workloads(sorted(self._holders().items()))

    def metrics(self) -> list[Family]:
        return [counter("fleetfit_agent_gpu_invalid_pids_total", "GPU process ids not in /proc.", self._pids.invalid)]

    def close(self) -> None:
        self._try("hlmlShutdown")


def _device_id(value: Any) -> int | None:
    """HLML's pci_device_id: the device id, possibly with the vendor id in its low 16 bits as NVML has it."""
    if not isinstance(value, int) or value <= 0:
        return None
    return value >> 16 if value & 0xFFFF == HABANA_VENDOR_ID and value > 0xFFFF else value & 0xFFFF


def open_gaudi_collector(hlml: ModuleType | None = None, attributor: Attributor | None = None) -> GaudiCollector | None:
    """A Gaudi collector, or None (with one log line) where pyhlml, libhlml or devices are absent."""
    if hlml is None:
        hlml, why = import_quietly("pyhlml.main")
        if hlml is None:
            log.info("Gaudi collector disabled: habana-pyhlml unavailable (%s)", why)
            return None
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            hlml.hlmlInit()
        collector = GaudiCollector(hlml, attributor or Attributor())
    except hlml.HLMLError as exc:
        said = " ".join(captured.getvalue().split())[:80]
        log.info("Gaudi collector disabled: %s%s", exc, f" ({said})" if said else "")
        return None
    if not collector._devices and not collector._failures:
        log.info("Gaudi collector disabled: HLML found no device")
        collector.close()
        return None
    return collector
