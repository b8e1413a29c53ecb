"""A stand-in for the amdsmi package (7.x) on machines without ROCm, shaped after its Python source.

Like the real one: errors are ``AmdSmiLibraryException(err_code)`` (``AMDSMI_STATUS_NOT_SUPPORTED`` = 2,
``NO_PERM`` = 10, ``DRIVER_NOT_LOADED`` = 34...) or ``AmdSmiParameterException`` for a handle of the wrong type,
all ``AmdSmiException``; values a GPU does not report are the string "N/A"; VRAM is in MB, power in W, xGMI
data accumulators in kB, one entry per link (8), "N/A" for links the GPU lacks. ``amdsmi_get_gpu_process_list``
returns a dict per process from ROCm 6.2; before, it returned process handles that
``amdsmi_get_gpu_process_info`` turns into that dict (``process_api="handles"``).
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

NOT_SUPPORTED = 2
NO_PERM = 10
DRIVER_NOT_LOADED = 34


class AmdSmiException(Exception):
    pass


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        super().__init__(abs(err_code))
        self.err_code = abs(err_code)

    def __str__(self) -> str:
        return f"Error code:\n\t{self.err_code} | AMDSMI_STATUS_{self.err_code}"


class AmdSmiParameterException(AmdSmiException):
    pass


class amdsmi_process_handle_t:
    def __init__(self, pid: int) -> None:
        self.pid_ = pid


class amdsmi_processor_handle:
    def __init__(self, gpu: FakeAmdGpu) -> None:
        self.gpu = gpu


@dataclass
class FakeAmdGpu:
    market_name: str = "AMD Instinct MI300X"
    device_id: int = 0x74A1
    vram_total_mb: int = 196_592
    vram_used_mb: int = 150_000
    gfx_activity: int | str = 87
    umc_activity: int | str = 40
    power_w: int | str = 640
    hotspot_c: int | str = 71
    partition: str = "SPX"
    xgmi_kb: list[int | str] = field(default_factory=lambda: [0] * 7 + ["N/A"])
    pids: list[int] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)


def make_fake_amdsmi(
    gpus: list[FakeAmdGpu], init_error: int | None = None, process_api: str = "dicts"
) -> types.ModuleType:
    m = types.ModuleType("fake_amdsmi")
    m.AmdSmiException = AmdSmiException  # type: ignore[attr-defined]
    m.AmdSmiLibraryException = AmdSmiLibraryException  # type: ignore[attr-defined]
    m.AmdSmiParameterException = AmdSmiParameterException  # type: ignore[attr-defined]
    state = {"init": False}

    def gpu_of(name: str, h: Any) -> FakeAmdGpu:
        if not state["init"]:
            raise AmdSmiLibraryException(32)  # NOT_INIT
        if not isinstance(h, amdsmi_processor_handle):
            raise AmdSmiParameterException(h)
        if name in h.gpu.unsupported:
            raise AmdSmiLibraryException(NOT_SUPPORTED)
        return h.gpu

    def init(flag: int = 2) -> None:
        if init_error is not None:
            raise AmdSmiLibraryException(init_error)
        state["init"] = True

    def handles() -> list[amdsmi_processor_handle]:
        if not state["init"]:
            raise AmdSmiLibraryException(32)
        return [amdsmi_processor_handle(g) for g in gpus]

    def asic(h: Any) -> dict[str, Any]:
        g = gpu_of("asic", h)
        return {"market_name": g.market_name, "vendor_id": "0x1002", "device_id": hex(g.device_id), "rev_id": "0x00"}

    def metrics(h: Any) -> dict[str, Any]:
        g = gpu_of("metrics", h)
        return {
            "temperature_hotspot": g.hotspot_c,
            "xgmi_read_data_acc": list(g.xgmi_kb),
            "xgmi_write_data_acc": list(g.xgmi_kb),
            "pcie_bandwidth_acc": "N/A",
        }

    m.amdsmi_init = init  # type: ignore[attr-defined]
    m.amdsmi_shut_down = lambda: state.update(init=False)  # type: ignore[attr-defined]
    m.amdsmi_get_processor_handles = handles  # type: ignore[attr-defined]
    m.amdsmi_get_gpu_asic_info = asic  # type: ignore[attr-defined]
    m.amdsmi_get_gpu_device_uuid = lambda h: f"uuid-{id(gpu_of('uuid', h)) % 1000}"  # type: ignore[attr-defined]
    m.amdsmi_get_gpu_vram_usage = lambda h: {  # type: ignore[attr-defined]
        "vram_total": gpu_of("vram", h).vram_total_mb,
        "vram_used": gpu_of("vram", h).vram_used_mb,
    }
    m.amdsmi_get_gpu_activity = lambda h: {  # type: ignore[attr-defined]
        "gfx_activity": gpu_of("activity", h).gfx_activity,
        "umc_activity": gpu_of("activity", h).umc_activity,
        "mm_activity": "N/A",
    }
    m.amdsmi_get_power_info = lambda h: {  # type: ignore[attr-defined]
        "current_socket_power": gpu_of("power", h).power_w,
        "average_socket_power": "N/A",
        "power_limit": 750,
    }
    m.amdsmi_get_gpu_metrics_info = metrics  # type: ignore[attr-defined]
    m.amdsmi_get_gpu_compute_partition = lambda h: gpu_of("partition", h).partition  # type: ignore[attr-defined]
    m.amdsmi_get_gpu_driver_info = lambda h: {  # type: ignore[attr-defined]
        "driver_name": "amdgpu",
        "driver_version": "6.10.5",
        "driver_date": "2015/01/01 00:00",
    }

    def process(pid: int) -> dict[str, Any]:
        return {"name": "python3", "pid": pid, "mem": 1, "engine_usage": {"gfx": 0, "enc": 0}}

    def process_list(h: Any) -> list[Any]:
        pids = gpu_of("procs", h).pids
        return [amdsmi_process_handle_t(p) for p in pids] if process_api == "handles" else [process(p) for p in pids]

    def process_info(h: Any, p: Any) -> dict[str, Any]:
        gpu_of("procs", h)
        if not isinstance(p, amdsmi_process_handle_t):
            raise AmdSmiParameterException(p)
        return process(p.pid_)

    m.amdsmi_get_gpu_process_list = process_list  # type: ignore[attr-defined]
    if process_api == "handles":
        m.amdsmi_get_gpu_process_info = process_info  # type: ignore[attr-defined]
    return m
