"""A stand-in for the amdsmi package (7.x) on machines without ROCm, shaped after its Python source.

Like the real one: errors are ``AmdSmiLibraryException(err_code)`` (``AMDSMI_STATUS_NOT_SUPPORTED`` = 2,
``API_FAILED`` = 7, ``NO_PERM`` = 10, ``NOT_INIT`` = 32, ``DRIVER_NOT_LOADED`` = 34...) or
``AmdSmiParameterException`` for a handle of the wrong type, all ``AmdSmiException``; values a GPU does not report
are the string "N/A"; VRAM is in MB, power in W, xGMI data accumulators in kB, one entry per link (8), "N/A" for
links the GPU lacks; process memory in bytes. ``amdsmi_get_gpu_process_list`` returns a dict per process from ROCm
6.2; before, it returned process handles that ``amdsmi_get_gpu_process_info`` turns into that dict
(``process_api="handles"``).

Some amdsmi releases (``processes_everywhere=True``) list every process that holds any GPU under each GPU, with
0 bytes of VRAM (and of ``mem``) on the devices it does not use; a process not allowed to read others' KFD entries
gets an empty list.

What real nodes do that a plain list of GPUs does not show:

* A GPU in a compute partition mode (DPX, QPX, CPX) is several devices, one per partition, each with the GPU's
  PCI address and the partition number as the PCI function (``0000:05:00.3``). Only the first partition answers
  the partition queries (compute and memory) and reads gpu_metrics (ROCm 6.4.1, ROCm/amdsmi#100: those sysfs files
  exist on the primary partition only, and a missing file is ``NOT_SUPPORTED``); its gpu_metrics hold every partition's activity
  (``xcp_stats.gfx_busy_inst``, one list per partition, one value per XCD). :func:`partitions` builds them.
* ``amdsmi_get_power_info`` reads the socket power from gpu_metrics and the power cap from hwmon, and returns the
  cap's status for the whole call: where the cap cannot be read (``power_cap`` in ``unsupported``) the call
  raises ``API_FAILED`` although the power was read.
* amdsmi lists the devices once, at ``amdsmi_init``. After the driver is reloaded (a partition change, an
  upgrade: :func:`reload`), the handles it holds point at sysfs paths that are gone (``NOT_SUPPORTED``) until
  ``amdsmi_shut_down`` and ``amdsmi_init`` list the devices again. ``init_error`` (e.g. ``DRIVER_NOT_LOADED``)
  may be cleared later, as a driver loaded after boot.
"""

from __future__ import annotations

import types
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

NOT_SUPPORTED = 2
API_FAILED = 7
NO_PERM = 10
NOT_INIT = 32
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
    def __init__(self, gpu: FakeAmdGpu, generation: int) -> None:
        self.gpu = gpu
        self.generation = generation  # the driver load it was listed under


@dataclass
class FakeAmdGpu:
    market_name: str = "AMD Instinct MI300X"
    device_id: int = 0x74A1
    vram_total_mb: int = 196_592
    vram_used_mb: int = 150_000
    gfx_activity: int | str = 87
    umc_activity: int | str = 40
    power_w: int | str = 640
    power_cap_w: int = 750  # the socket power cap in force (amd-smi set --power-cap lowers it)
    hotspot_c: int | str = 71
    partition: str = "SPX"
    memory_partition: str = "NPS1"  # "memory_partition" in ``unsupported``: a GPU without (MI210, MI250X)
    xgmi_kb: list[int | str] = field(default_factory=lambda: [0] * 7 + ["N/A"])
    pids: list[int] = field(default_factory=list)
    vram_bytes: dict[int, int] = field(default_factory=dict)  # per pid; default (n + 1) GiB for the n-th process
    unsupported: set[str] = field(default_factory=set)
    bdf: str = ""  # "" for "0000:<index as bus>:00.0"
    partition_id: int = 0  # 0: the primary (or only) partition of its GPU
    xcp_busy: list[list[int | str]] = field(default_factory=list)  # the primary's per-partition, per-XCD activity
    uuid: str = ""


def partitions(gpu: FakeAmdGpu, mode: str, count: int, bus: int, busy: list[int] | None = None) -> list[FakeAmdGpu]:
    """The devices one GPU in ``mode`` is, as amdsmi lists them: its PCI address with the partition number as the
    function; the primary holds the partition mode and the gpu_metrics (with ``busy``, each partition's activity,
    one XCD each for CPX), the others answer neither."""
    xcds = 8 // count
    levels = busy or [gpu.gfx_activity if isinstance(gpu.gfx_activity, int) else 0] * count
    out = []
    for p in range(count):
        out.append(
            replace(
                gpu,
                bdf=f"0000:{bus:02x}:00.{p}",
                partition_id=p,
                partition=mode if p == 0 else "",
                memory_partition=gpu.memory_partition if p == 0 else "",
                vram_total_mb=gpu.vram_total_mb // count,
                vram_used_mb=gpu.vram_used_mb // count,
                gfx_activity=gpu.gfx_activity if p == 0 else "N/A",  # the primary's is the whole GPU's
                uuid=f"{gpu.uuid or 'uuid'}-{bus}-{p}",
                xcp_busy=[[levels[i]] * xcds + ["N/A"] * (8 - xcds) for i in range(count)] + [["N/A"] * 8] * (8 - count)
                if p == 0
                else [],
                unsupported=set(gpu.unsupported)
                | ({"partition", "memory_partition", "metrics", "activity", "power"} if p else set()),
                pids=list(gpu.pids) if p == 0 else [],
            )
        )
    return out


def make_fake_amdsmi(
    gpus: list[FakeAmdGpu],
    init_error: int | None = None,
    process_api: str = "dicts",
    processes_everywhere: bool = False,
) -> types.ModuleType:
    m = types.ModuleType("fake_amdsmi")
    m.AmdSmiException = AmdSmiException  # type: ignore[attr-defined]
    m.AmdSmiLibraryException = AmdSmiLibraryException  # type: ignore[attr-defined]
    m.AmdSmiParameterException = AmdSmiParameterException  # type: ignore[attr-defined]
    m.init_error = init_error  # type: ignore[attr-defined]
    m.driver_version = "6.10.5"  # type: ignore[attr-defined]
    m.inits = 0  # type: ignore[attr-defined]
    m.calls = Counter()  # type: ignore[attr-defined]  # calls on a device, by what they read
    state: dict[str, Any] = {"init": False, "gpus": list(gpus), "listed": [], "driver": 0, "listed_under": -1}

    def gpu_of(name: str, h: Any) -> FakeAmdGpu:
        m.calls[name] += 1  # type: ignore[attr-defined]
        if not state["init"]:
            raise AmdSmiLibraryException(NOT_INIT)
        if not isinstance(h, amdsmi_processor_handle):
            raise AmdSmiParameterException(h)
        if h.generation != state["driver"]:  # listed before the driver was reloaded: its sysfs files are gone
            raise AmdSmiLibraryException(NOT_SUPPORTED)
        if name in h.gpu.unsupported:
            raise AmdSmiLibraryException(NOT_SUPPORTED)
        return h.gpu

    def init(flag: int = 2) -> None:
        if m.init_error is not None:  # type: ignore[attr-defined]
            raise AmdSmiLibraryException(m.init_error)  # type: ignore[attr-defined]
        state["init"] = True
        state["listed"] = [amdsmi_processor_handle(g, state["driver"]) for g in state["gpus"]]
        m.inits += 1  # type: ignore[attr-defined]

    def shut_down() -> None:
        state["init"] = False

    def reload(new_gpus: list[FakeAmdGpu]) -> None:
        """The amdgpu driver reloaded with these devices; handles listed before now point at nothing."""
        state["gpus"] = list(new_gpus)
        state["driver"] += 1

    def handles() -> list[amdsmi_processor_handle]:
        if not state["init"]:
            raise AmdSmiLibraryException(NOT_INIT)
        return list(state["listed"])

    def bdf(h: Any) -> str:
        g = gpu_of("bdf", h)
        return g.bdf or f"0000:{state['gpus'].index(g) + 1:02x}:00.0"

    def asic(h: Any) -> dict[str, Any]:
        g = gpu_of("asic", h)
        return {"market_name": g.market_name, "vendor_id": "0x1002", "device_id": hex(g.device_id), "rev_id": "0x00"}

    def metrics(h: Any) -> dict[str, Any]:
        g = gpu_of("metrics", h)
        return {
            "temperature_hotspot": g.hotspot_c,
            "average_umc_activity": g.umc_activity,
            "current_socket_power": g.power_w,
            "average_socket_power": "N/A",
            "xgmi_read_data_acc": list(g.xgmi_kb),
            "xgmi_write_data_acc": list(g.xgmi_kb),
            "pcie_bandwidth_acc": "N/A",
            "xcp_stats.gfx_busy_inst": [list(x) for x in g.xcp_busy] or [["N/A"] * 8] * 8,
        }

    def power(h: Any) -> dict[str, Any]:
        g = gpu_of("power", h)
        if "power_cap" in g.unsupported:  # hwmon's power1_cap unreadable: the call fails, power read or not
            raise AmdSmiLibraryException(API_FAILED)
        return {"current_socket_power": g.power_w, "average_socket_power": "N/A", "power_limit": g.power_cap_w}

    def power_cap(h: Any) -> dict[str, Any]:
        g = gpu_of("power", h)
        if "power_cap" in g.unsupported:
            raise AmdSmiLibraryException(API_FAILED)
        uw = 10**6  # amdsmi_power_cap_info_t is in µW on bare metal (amdsmi.h)
        return {
            "power_cap": g.power_cap_w * uw,
            "default_power_cap": 750 * uw,
            "dpm_cap": 2100,
            "min_power_cap": 0,
            "max_power_cap": 750 * uw,
        }

    m.amdsmi_init = init  # type: ignore[attr-defined]
    m.amdsmi_shut_down = shut_down  # type: ignore[attr-defined]
    m.reload = reload  # type: ignore[attr-defined]
    m.amdsmi_get_processor_handles = handles  # type: ignore[attr-defined]
    m.amdsmi_get_gpu_device_bdf = bdf  # type: ignore[attr-defined]
    m.amdsmi_get_gpu_asic_info = asic  # type: ignore[attr-defined]
    m.amdsmi_get_gpu_device_uuid = lambda h: gpu_of("uuid", h).uuid or f"uuid-{bdf(h)}"  # type: ignore[attr-defined]
    m.amdsmi_get_gpu_vram_usage = lambda h: {  # type: ignore[attr-defined]
        "vram_total": gpu_of("vram", h).vram_total_mb,
        "vram_used": gpu_of("vram", h).vram_used_mb,
    }
    m.amdsmi_get_gpu_activity = lambda h: {  # type: ignore[attr-defined]
        "gfx_activity": gpu_of("activity", h).gfx_activity,
        "umc_activity": gpu_of("activity", h).umc_activity,
        "mm_activity": "N/A",
    }
    m.amdsmi_get_power_info = power  # type: ignore[attr-defined]
    m.amdsmi_get_power_cap_info = power_cap  # type: ignore[attr-defined]
    m.amdsmi_get_gpu_metrics_info = metrics  # type: ignore[attr-defined]
    m.amdsmi_get_gpu_compute_partition = lambda h: gpu_of("partition", h).partition  # type: ignore[attr-defined]
    m.amdsmi_get_gpu_memory_partition = lambda h: gpu_of("memory_partition", h).memory_partition  # type: ignore[attr-defined]
    m.amdsmi_get_gpu_driver_info = lambda h: {  # type: ignore[attr-defined]
        "driver_name": "amdgpu",
        "driver_version": m.driver_version if gpu_of("driver", h) else "",  # type: ignore[attr-defined]
        "driver_date": "2015/01/01 00:00",
    }

    def process(g: FakeAmdGpu, pid: int) -> dict[str, Any]:
        held = pid in g.pids
        vram = g.vram_bytes.get(pid, (g.pids.index(pid) + 1) * 2**30) if held else 0
        gtt = 2**20 if held else 0
        return {
            "name": "python3",
            "pid": pid,
            "mem": vram + gtt,
            "engine_usage": {"gfx": 0, "enc": 0},
            "memory_usage": {"gtt_mem": gtt, "cpu_mem": 0, "vram_mem": vram},
            "cu_occupancy": "N/A",
        }

    def listed_pids(g: FakeAmdGpu) -> list[int]:
        if not processes_everywhere:
            return list(g.pids)
        return list(dict.fromkeys(p for other in state["gpus"] for p in other.pids))

    def process_list(h: Any) -> list[Any]:
        g = gpu_of("procs", h)
        if process_api == "handles":
            return [amdsmi_process_handle_t(p) for p in listed_pids(g)]
        return [process(g, p) for p in listed_pids(g)]

    def process_info(h: Any, p: Any) -> dict[str, Any]:
        g = gpu_of("procs", h)
        if not isinstance(p, amdsmi_process_handle_t):
            raise AmdSmiParameterException(p)
        info = process(g, p.pid_)
        del info["memory_usage"], info["cu_occupancy"]  # amdsmi before ROCm 6.2: "mem" only
        return info

    m.amdsmi_get_gpu_process_list = process_list  # type: ignore[attr-defined]
    if process_api == "handles":
        m.amdsmi_get_gpu_process_info = process_info  # type: ignore[attr-defined]
    return m
