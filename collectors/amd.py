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
the string ``"N/A"``, never as an error. A GPU in a compute partition mode other than SPX (CPX, DPX...) appears
as several devices; the birth says which mode each device is in (``mig_profile``).
"""

from __future__ import annotations

import contextlib
import io
import logging
from types import ModuleType
from typing import Any

from agent.metrics import Family, counter
from agent.protocol import GpuFailure, GpuInfo, WorkloadRef
from collectors.attribution import Attributor
from collectors.base import Entity, Inventory, Sample
from collectors.gpu import WrappingCounter
from collectors.pids import PidResolver

log = logging.getLogger(__name__)

AMD_VENDOR_ID = 0x1002


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


class AmdGpuCollector:
    name = "gpu"

    def __init__(self, smi: ModuleType, attributor: Attributor) -> None:
        self._smi = smi
        self._errors: tuple[type[BaseException], ...] = (smi.AmdSmiException,)
        self._pids = PidResolver(attributor)
        self._handles: list[tuple[int, Any]] = []
        self._failures: dict[int, str] = {}
        self._links: dict[tuple[int, str, int], WrappingCounter] = {}
        for i, handle in enumerate(smi.amdsmi_get_processor_handles()):
            self._handles.append((i, handle))

    def _try(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._smi, fn)(*args)
        except self._errors:
            return None
        except AttributeError:  # an older amdsmi without this call
            return None

    def inventory(self) -> Inventory:
        gpus = []
        driver = None
        for i, h in self._handles:
            asic = self._try("amdsmi_get_gpu_asic_info", h)
            if asic is None:
                self._failures[i] = "amdsmi_get_gpu_asic_info failed"
                continue
            vram = self._try("amdsmi_get_gpu_vram_usage", h) or {}
            partition = self._try("amdsmi_get_gpu_compute_partition", h)
            metrics = self._try("amdsmi_get_gpu_metrics_info", h) or {}
            links = [v for v in metrics.get("xgmi_read_data_acc", []) if _number(v) is not None]
            info = self._try("amdsmi_get_gpu_driver_info", h) or {}
            driver = driver or (info.get("driver_version") if info.get("driver_version") != "N/A" else None)
            gpus.append(
                GpuInfo(
                    index=i,
                    uuid=str(self._try("amdsmi_get_gpu_device_uuid", h) or f"AMD-{i}")[:96],
                    model=_market_name(asic),
                    memory_mib=int(_number(vram.get("vram_total")) or 0),
                    nvlink_links=len(links),
                    mig_profile=partition[:32] if isinstance(partition, str) and partition not in ("", "SPX") else None,
                    pci_device_id=_pci_id(asic),
                )
            )
        return Inventory(
            gpus=gpus,
            driver_version=str(driver)[:32] if driver else None,
            gpu_failures=[GpuFailure(index=i, error=e) for i, e in sorted(self._failures.items())],
            attribution_warning=self._pids.warning(),
        )

    def _xgmi(self, index: int, metrics: dict[str, Any]) -> dict[str, int]:
        out: dict[str, int] = {}
        for name, key in (("nvlink_tx_bps", "xgmi_write_data_acc"), ("nvlink_rx_bps", "xgmi_read_data_acc")):
            values = metrics.get(key)
            if not isinstance(values, list):
                continue
            total = 0
            for link, value in enumerate(values):
                c = self._links.get((index, name, link))
                if (raw := _number(value)) is not None:
                    c = self._links.setdefault((index, name, link), WrappingCounter())
                    c.add(int(raw), 64)
                if c is not None:
                    total += c.total
            out[name] = total * 1000  # amdsmi counts xGMI data in kB
        return out

    def sample(self) -> list[Sample]:
        out = []
        for i, h in self._handles:
            if i in self._failures:
                continue
            gauges: dict[str, float] = {}
            activity = self._try("amdsmi_get_gpu_activity", h) or {}
            if (util := _number(activity.get("gfx_activity"))) is not None:
                gauges["util"] = util
            if (mem_util := _number(activity.get("umc_activity"))) is not None:
                gauges["mem_util"] = mem_util
            vram = self._try("amdsmi_get_gpu_vram_usage", h) or {}
            if (used := _number(vram.get("vram_used"))) is not None:
                gauges["mem_used_mib"] = used
            power = self._try("amdsmi_get_power_info", h) or {}
            watts = _number(power.get("current_socket_power"))
            if watts is None:
                watts = _number(power.get("average_socket_power"))
            if watts is not None:
                gauges["power_w"] = watts
            metrics = self._try("amdsmi_get_gpu_metrics_info", h) or {}
            if (temp := _number(metrics.get("temperature_hotspot"))) is not None:
                gauges["temp_c"] = temp
            out.append(Sample(Entity.GPU, str(i), gauges=gauges, counters=self._xgmi(i, metrics)))
        return out

    def workloads(self) -> list[WorkloadRef]:
        def pids(h: Any) -> list[object]:
            out = []
            for entry in self._try("amdsmi_get_gpu_process_list", h) or []:
                # amdsmi before ROCm 6.2 lists process handles, each read with amdsmi_get_gpu_process_info
                info = entry if isinstance(entry, dict) else self._try("amdsmi_get_gpu_process_info", h, entry)
                if isinstance(info, dict):
                    out.append(info.get("pid"))
            return out

        return self._pids.workloads((i, pids(h)) for i, h in self._handles if i not in self._failures)

    def metrics(self) -> list[Family]:
        return [counter("fleetfit_agent_gpu_invalid_pids_total", "GPU process ids not in /proc.", self._pids.invalid)]

    def close(self) -> None:
        self._try("amdsmi_shut_down")


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


def open_amd_collector(smi: ModuleType | None = None, attributor: Attributor | None = None) -> AmdGpuCollector | None:
    """An AMD collector, or None (with one log line) where amdsmi or ROCm's library or GPUs are absent."""
    if smi is None:
        smi, why = import_quietly("amdsmi")
        if smi is None:
            log.info("AMD GPU collector disabled: amdsmi unavailable (%s)", why)
            return None
    try:
        smi.amdsmi_init()
        collector = AmdGpuCollector(smi, attributor or Attributor())
    except smi.AmdSmiException as exc:
        log.info("AMD GPU collector disabled: %s", " ".join(str(exc).split())[:200])
        return None
    if not collector._handles:
        log.info("AMD GPU collector disabled: amdsmi found no GPU")
        collector.close()
        return None
    return collector
