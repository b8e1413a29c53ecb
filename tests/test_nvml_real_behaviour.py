"""The GPU collector against NVML as real drivers behave: the binding's error classes, missing symbols, a GPU
that cannot be opened, a driver loaded late, MIG changes, down NVLink links, old drivers without PCIe fields,
MIG utilisation and sub-second utilisation samples."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest
from fake_nvml import FakeGpu, make_fake_nvml

from agent.metrics import render
from agent.protocol import Birth, WorkloadKind
from agent.window import WindowBuilder
from collectors.attribution import Attributor
from collectors.base import Sample
from collectors.gpu import RESCAN_S, NullGpuCollector, NvmlGpuCollector, open_gpu_collector


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _proc(root: Path, pid: int, cgroup: str, comm: str = "python3") -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cgroup").write_text(f"0::{cgroup}\n")
    (d / "comm").write_text(f"{comm}\n")
    (d / "stat").write_text(f"{pid} ({comm}) S 1 {pid} {pid} 0 -1\n")


def _open(gpus: list[FakeGpu], root: Path, clock: Clock | None = None, **kw: object) -> NvmlGpuCollector:
    collector = open_gpu_collector(make_fake_nvml(gpus, **kw), Attributor(root, node="n1"), clock or Clock())  # type: ignore[arg-type]
    assert isinstance(collector, NvmlGpuCollector)
    return collector


def _open_nvml(nvml: object, root: Path, clock: Clock | None = None) -> NvmlGpuCollector:
    collector = open_gpu_collector(nvml, Attributor(root, node="n1"), clock or Clock())  # type: ignore[arg-type]
    assert isinstance(collector, NvmlGpuCollector)
    return collector


def _gpu_stat(samples_per_tick: list[list[Sample]], index: int, field: str) -> list[float]:
    """Per-second values of one GPU field as the agent's window builder computes them."""
    builder = WindowBuilder("n1", "s1", 1)
    for t, samples in enumerate(samples_per_tick):
        builder.add(samples, float(t))
    window = builder.close(0, 0.0, float(len(samples_per_tick)), [])
    (gpu,) = [g for g in window.gpus if g.index == index]
    stats = getattr(gpu, field)
    assert stats is not None, f"{field} missing"
    assert builder.counter_resets == 0
    return [stats.mean, stats.max]


# ---------------------------------------------------------------- process attribution


def test_binding_raises_library_mismatch_not_nvmlerror() -> None:
    # The premise of the fallback: the real binding's error for a missing _v3 is outside NVMLError.
    nvml = make_fake_nvml([FakeGpu(pids=[1])], process_api="v2")
    nvml.nvmlInit()  # type: ignore[attr-defined]
    with pytest.raises(pynvml.NVMLLibraryMismatchError):
        nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(0))  # type: ignore[attr-defined]
    assert not issubclass(pynvml.NVMLLibraryMismatchError, pynvml.NVMLError)


def test_a_driver_without_v3_falls_back_to_v2_and_attributes(tmp_path: Path) -> None:
    _proc(tmp_path, 4242, "/system.slice/vllm.service", "vllm")
    collector = _open([FakeGpu(pids=[4242])], tmp_path, process_api="v2")
    (w,) = collector.workloads()
    assert (w.id, w.gpus, w.hint) == ("systemd/vllm.service", [0], "vllm")
    nvml_calls = collector._nvml.calls  # type: ignore[attr-defined]
    before = nvml_calls.count("procs")
    (w,) = collector.workloads()
    assert nvml_calls.count("procs") == before  # the missing call is not retried every window
    assert collector.inventory().attribution_warning is None


def test_a_driver_with_no_process_call_says_so_and_keeps_sampling(tmp_path: Path) -> None:
    collector = _open([FakeGpu(pids=[4242])], tmp_path, process_api="none")
    assert "no process call" in (collector.inventory().attribution_warning or "")  # in the very first birth
    assert collector.workloads() == []
    assert collector.sample()[0].gauges["util"] == 90


def test_garbled_pids_of_535_drivers_are_avoided(tmp_path: Path) -> None:
    _proc(tmp_path, 100, "/system.slice/slurmstepd.scope/job_7/step_0")
    _proc(tmp_path, 200, "/system.slice/slurmstepd.scope/job_8/step_0")
    collector = _open([FakeGpu(pids=[100, 200])], tmp_path, driver="535.54.03")
    assert [w.id for w in collector.workloads()] == ["slurm/7", "slurm/8"]
    assert collector.invalid_pids == 0


@pytest.mark.parametrize("process_api", ["v3", "v2"])
def test_mps_clients_are_attributed_to_their_own_pods(tmp_path: Path, process_api: str) -> None:
    # With MPS the compute process call lists the MPS server only; the clients come from the MPS process call.
    _proc(tmp_path, 50, "/system.slice/nvidia-mps.service", "nvidia-cuda-mps")
    _proc(tmp_path, 101, "/kubepods/burstable/pod0a1b2c3d-0000-4000-8000-00000000000a/c1")
    _proc(tmp_path, 102, "/kubepods/burstable/pod0a1b2c3d-0000-4000-8000-00000000000b/c2")
    memory = {50: 32 * 2**20, 101: 4 * 2**30, 102: 12 * 2**30}
    gpu = FakeGpu(pids=[50], mps_pids=[101, 102], proc_memory=memory)
    collector = _open([gpu], tmp_path, process_api=process_api)
    found = {w.id: (w.gpus, w.gpu_mem_mib) for w in collector.workloads()}
    assert found == {
        "k8s/0a1b2c3d-0000-4000-8000-00000000000a": ([0], [4096.0]),
        "k8s/0a1b2c3d-0000-4000-8000-00000000000b": ([0], [12288.0]),
        "systemd/nvidia-mps.service": ([0], [32.0]),
    }


def test_pids_not_in_proc_are_dropped_and_counted(tmp_path: Path) -> None:
    _proc(tmp_path, 100, "/system.slice/slurmstepd.scope/job_7/step_0")
    collector = _open([FakeGpu(pids=[100, 999, 1 << 40])], tmp_path)
    assert [w.id for w in collector.workloads()] == ["slurm/7"]
    assert collector.invalid_pids == 2
    assert "fleetfit_agent_gpu_invalid_pids_total 2" in render(collector.metrics())


def test_without_the_host_pid_namespace_pids_are_not_looked_up_in_the_wrong_proc(tmp_path: Path) -> None:
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "status").write_text("Name:\tfleetfit\nNSpid:\t9\t1\n")
    _proc(tmp_path, 4242, "/system.slice/unrelated.service")  # the container's pid 4242 is another process
    collector = _open([FakeGpu(pids=[4242])], tmp_path)
    (w,) = collector.workloads()
    assert (w.id, w.kind, w.hint) == ("pid/n1/4242", WorkloadKind.PROCESS_GROUP, None)
    assert "host PID namespace" in (collector.inventory().attribution_warning or "")


# ---------------------------------------------------------------- per-GPU failures, late driver, changes


def test_one_gpu_without_permission_costs_only_that_gpu(tmp_path: Path) -> None:
    gpus = [FakeGpu(), FakeGpu(handle_error=pynvml.NVML_ERROR_NO_PERMISSION), FakeGpu()]
    collector = _open(gpus, tmp_path)
    inv = collector.inventory()
    assert [g.index for g in inv.gpus] == [0, 2]
    ((index, error),) = [(f.index, f.error) for f in inv.gpu_failures]
    assert index == 1 and "Insufficient Permissions" in error
    assert [s.key for s in collector.sample()] == ["0", "2"]
    assert "fleetfit_agent_gpu_failed 1" in render(collector.metrics())
    birth = Birth(
        node="n1", site="s", session=1, agent_version="x", hostname="h", timestamp=1.0,
        gpus=inv.gpus, gpu_failures=inv.gpu_failures,
    )  # fmt: skip
    assert birth.gpu_failures[0].index == 1


def test_a_lost_gpu_at_start_is_reported_and_picked_up_when_it_returns(tmp_path: Path) -> None:
    clock = Clock()
    gpus = [FakeGpu(handle_error=pynvml.NVML_ERROR_GPU_IS_LOST), FakeGpu()]
    collector = _open(gpus, tmp_path, clock)
    assert [f.index for f in collector.inventory().gpu_failures] == [0]
    gpus[0].handle_error = None
    clock.now += RESCAN_S
    assert [s.key for s in collector.sample()] == ["0", "1"]
    assert collector.inventory().gpu_failures == [] and collector.generation == 1


def test_a_driver_loaded_after_boot_is_picked_up(tmp_path: Path) -> None:
    clock = Clock()
    nvml = make_fake_nvml([FakeGpu()], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    collector = open_gpu_collector(nvml, Attributor(tmp_path), clock)
    assert isinstance(collector, NvmlGpuCollector)
    assert "Driver Not Loaded" in (collector.inventory().gpu_unavailable or "")
    assert collector.sample() == []
    nvml.init_error = None  # type: ignore[attr-defined]
    clock.now += RESCAN_S
    assert collector.sample()[0].gauges["util"] == 90
    inv = collector.inventory()
    assert inv.gpu_unavailable is None and len(inv.gpus) == 1 and collector.generation == 1


def test_no_driver_library_disables_the_collector(tmp_path: Path) -> None:
    nvml = make_fake_nvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert isinstance(open_gpu_collector(nvml, Attributor(tmp_path)), NullGpuCollector)


def test_a_mig_reconfiguration_is_seen(tmp_path: Path) -> None:
    clock = Clock()
    gpus = [FakeGpu()]
    nvml = make_fake_nvml(gpus)
    collector = open_gpu_collector(nvml, Attributor(tmp_path), clock)
    assert isinstance(collector, NvmlGpuCollector)
    assert len(collector.inventory().gpus) == 1
    gpus[0].mig = [FakeGpu(name="NVIDIA H100 80GB HBM3 MIG 1g.10gb", memory_total=10 * 2**30)]
    clock.now += RESCAN_S
    assert [s.key for s in collector.sample()] == ["0", "1"]
    inv = collector.inventory()
    assert [(g.parent, g.mig_profile) for g in inv.gpus] == [(None, None), (0, "1g.10gb")]
    assert collector.generation == 1
    clock.now += RESCAN_S
    collector.sample()
    assert collector.generation == 1  # nothing changed: no new birth


def test_a_driver_replaced_under_the_agent_asks_for_a_restart_which_reads_the_new_driver(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gpus = [FakeGpu(), FakeGpu()]
    nvml = make_fake_nvml(gpus, driver="550.54.15")
    collector = _open_nvml(nvml, tmp_path)
    assert collector.restart_required is None and collector.sample()[0].gauges["util"] == 90
    nvml.driver = nvml.library = "560.35.03"  # type: ignore[attr-defined]  # packages upgraded, module reloaded
    with caplog.at_level("ERROR", logger="collectors.gpu"):
        collector.sample()  # within one tick: every call now fails
    assert collector.restart_required is not None and "restart" in collector.restart_required
    assert len(caplog.records) == 1 and "replaced" in caplog.records[0].getMessage()
    assert "fleetfit_agent_gpu_library_mismatch 1" in render(collector.metrics())
    assert "restart" in (collector.inventory().gpu_unavailable or "")
    with pytest.raises(pynvml.NVMLError) as raised:  # the premise: this process cannot repair itself
        nvml.nvmlInit()  # type: ignore[attr-defined]
    assert raised.value.value == pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
    # A new process loads the library on disk, which matches the module now.
    restarted = _open_nvml(make_fake_nvml(gpus, driver="560.35.03"), tmp_path)
    assert restarted.inventory().driver_version == "560.35.03" and len(restarted.inventory().gpus) == 2
    assert restarted.restart_required is None


def test_a_mismatch_from_the_start_is_waited_out_not_restarted(tmp_path: Path) -> None:
    # New packages on disk, the old module still loaded (no reboot yet): a restart would load the same library.
    clock = Clock()
    nvml = make_fake_nvml([FakeGpu()], driver="550.54.15", library="560.35.03")
    collector = _open_nvml(nvml, tmp_path, clock)
    assert collector.restart_required is None
    assert "mismatch" in (collector.inventory().gpu_unavailable or "")
    clock.now += RESCAN_S
    assert collector.sample() == [] and collector.restart_required is None
    nvml.driver = "560.35.03"  # type: ignore[attr-defined]  # the new module is loaded
    clock.now += RESCAN_S
    assert collector.sample()[0].gauges["util"] == 90
    assert collector.inventory().driver_version == "560.35.03" and collector.generation == 1


def test_a_failed_gpu_is_retried_alone_and_the_others_keep_their_state(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    healthy = FakeGpu(nvlink_links=2, gpm={2: 50.0})
    failed = FakeGpu(handle_error=pynvml.NVML_ERROR_NO_PERMISSION)
    nvml = make_fake_nvml([healthy, failed])
    collector = _open_nvml(nvml, tmp_path, clock)
    buffers, sets = nvml.gpm_buffers, len(nvml.event_sets)  # type: ignore[attr-defined]
    ticks = []
    with caplog.at_level("INFO", logger="collectors.gpu"):
        for t in range(8):
            if t in (2, 4):
                clock.now += RESCAN_S  # the failed GPU is tried again, and fails again
            if t == 6:
                failed.handle_error = None
                nvml.xid_queue.append((healthy, 79))  # type: ignore[attr-defined]  # raised just before the re-read
                clock.now += RESCAN_S
            ticks.append(collector.sample())
            healthy.pcie_tx += 1_000_000
            healthy.nvlink_kib_per_link += 10
    assert [s.key for s in ticks[-1]] == ["0", "1"] and collector.generation == 1
    # GPU 0 went through three layout checks without a counter reset, a new GPM reader or a new event set
    mean, peak = _gpu_stat(ticks, 0, "pcie_tx_bps")
    assert mean == peak == 1_000_000
    mean, peak = _gpu_stat(ticks, 0, "nvlink_tx_bps")
    assert mean == peak == 2 * 10 * 1024
    assert collector.counter_resets == 0
    assert nvml.gpm_buffers == buffers and len(nvml.event_sets) == sets  # type: ignore[attr-defined]
    # the XID raised before the re-read was counted, not freed with the event set
    assert ticks[6][0].counters["xid_events"] == 1 and ticks[6][0].latest["last_xid"] == 79
    said = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert said == [said[0]] and "GPU 1" in said[0]  # once, not at every retry


def test_nvlink_links_trained_after_the_agent_started_are_read_and_announced(tmp_path: Path) -> None:
    clock = Clock()
    gpu = FakeGpu(nvlink_links=18, down_links=set(range(18)), nvswitch=True)  # the fabric manager is not done
    collector = _open_nvml(make_fake_nvml([gpu]), tmp_path, clock)
    (before,) = collector.inventory().gpus
    assert (before.nvlink_links, before.nvswitch) == (0, None)
    gpu.down_links = set()
    clock.now += RESCAN_S
    ticks = []
    for _ in range(4):
        ticks.append(collector.sample())
        gpu.nvlink_kib_per_link += 10
    (after,) = collector.inventory().gpus
    assert (after.nvlink_links, after.nvswitch, collector.generation) == (18, True, 1)  # a new birth says so
    mean, _ = _gpu_stat(ticks, 0, "nvlink_tx_bps")
    assert mean == pytest.approx(18 * 10 * 1024, rel=1e-3)
    # a link that goes down later keeps its bytes in the total: no reset, no drop to zero
    gpu.down_links = {17}
    clock.now += RESCAN_S
    ticks = []
    for _ in range(4):
        ticks.append(collector.sample())
        gpu.nvlink_kib_per_link += 10
    mean, _ = _gpu_stat(ticks, 0, "nvlink_tx_bps")
    assert mean == pytest.approx(17 * 10 * 1024, rel=1e-3) and collector.inventory().gpus[0].nvlink_links == 17
    assert collector.counter_resets == 0 and collector.generation == 2


# ---------------------------------------------------------------- NVLink


def test_a_down_link_is_skipped_and_the_last_link_is_read(tmp_path: Path) -> None:
    gpu = FakeGpu(nvlink_links=18, down_links={3})
    collector = _open([gpu], tmp_path)
    assert collector.inventory().gpus[0].nvlink_links == 17
    ticks = []
    for _ in range(4):
        ticks.append(collector.sample())
        gpu.link_kib[17] = gpu.link_kib.get(17, 0) + 100  # only link 17 carries traffic
    mean, _ = _gpu_stat(ticks, 0, "nvlink_tx_bps")
    assert mean == 100 * 1024


def test_a_link_failing_for_one_tick_makes_no_reset_and_no_spike(tmp_path: Path) -> None:
    gpu = FakeGpu(nvlink_links=18, link_kib={link: 10**9 for link in range(18)})
    collector = _open([gpu], tmp_path)
    ticks = []
    for t in range(6):
        gpu.failing_links = {5} if t == 3 else set()
        ticks.append(collector.sample())
        for link in range(18):
            gpu.link_kib[link] += 10  # 10 KiB/s per link
    mean, peak = _gpu_stat(ticks, 0, "nvlink_tx_bps")
    assert mean == pytest.approx(18 * 10 * 1024, rel=1e-3)
    assert peak == pytest.approx(19 * 10 * 1024, rel=1e-3)  # the failed tick's bytes arrive one tick late, nothing more


def test_blackwell_gpus_report_all_36_links(tmp_path: Path) -> None:
    collector = _open([FakeGpu(name="NVIDIA B200", nvlink_links=36)], tmp_path)
    assert collector.inventory().gpus[0].nvlink_links == 36


# ---------------------------------------------------------------- PCIe


def test_pcie_fields_source_and_32_bit_wrap(tmp_path: Path) -> None:
    gpu = FakeGpu(pcie_value_type=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, pcie_tx=2**32 - 3_000_000)
    collector = _open([gpu], tmp_path)
    assert collector.inventory().gpus[0].pcie_source == "nvml-fields"
    ticks = []
    for _ in range(4):
        ticks.append(collector.sample())
        gpu.pcie_tx = (gpu.pcie_tx + 2_000_000) % 2**32
    mean, peak = _gpu_stat(ticks, 0, "pcie_tx_bps")
    assert mean == peak == 2_000_000


def test_a_64_bit_counter_going_back_is_a_reset_not_a_wrap(tmp_path: Path) -> None:
    gpu = FakeGpu(pcie_tx=2**40)
    collector = _open([gpu], tmp_path)
    ticks = []
    for t in range(4):
        ticks.append(collector.sample())
        gpu.pcie_tx = 1_000 if t == 1 else gpu.pcie_tx + 5_000  # the driver reloaded after tick 1
    _, peak = _gpu_stat(ticks, 0, "pcie_tx_bps")
    assert peak == 5_000 and collector.counter_resets == 1


def test_drivers_before_r555_on_hopper_get_pcie_from_gpm(tmp_path: Path) -> None:
    gpu = FakeGpu(pcie_fields=False, gpm={2: 50.0, 20: 300.0, 21: 120.0})
    old = FakeGpu(name="NVIDIA A100-SXM4-80GB", pcie_fields=False)
    collector = _open([gpu, old], tmp_path)
    assert [g.pcie_source for g in collector.inventory().gpus] == ["gpm", None]
    collector.sample()
    hopper, ampere = collector.sample()
    assert hopper.gauges["pcie_tx_bps"] == 300 * 2**20 and hopper.gauges["pcie_rx_bps"] == 120 * 2**20
    assert "pcie_tx_bps" not in ampere.gauges and "pcie_tx_bps" not in ampere.counters


# ---------------------------------------------------------------- MIG and utilisation


def test_mig_instances_get_utilisation_from_gpm(tmp_path: Path) -> None:
    _proc(tmp_path, 77, "/system.slice/triton.service", "tritonserver")
    busy = FakeGpu(name="NVIDIA H100 80GB HBM3 MIG 3g.40gb", gpu_instance_id=1, gpm={1: 62.5, 2: 40.0}, pids=[77])
    quiet = FakeGpu(name="NVIDIA H100 80GB HBM3 MIG 3g.40gb", gpu_instance_id=2, gpm={1: 3.0})
    parent = FakeGpu(mig=[busy, quiet], gpm={2: 20.0})
    collector = _open([parent], tmp_path)
    assert [g.mig_profile for g in collector.inventory().gpus] == [None, "3g.40gb", "3g.40gb"]
    collector.sample()
    _, first, second = collector.sample()
    assert first.gauges["util"] == 62.5 and first.gauges["sm_active"] == 40.0
    assert second.gauges["util"] == 3.0
    (w,) = collector.workloads()
    assert (w.id, w.gpus) == ("systemd/triton.service", [1])


def test_utilisation_covers_the_whole_second(tmp_path: Path) -> None:
    # A bursty job: NVML's samples alternate 0 and 100 every 1/6 s; one reading would say 100 (the last).
    gpu = FakeGpu(util=100)
    collector = _open([gpu], tmp_path)
    t = 10_000_000
    gpu.util_samples = [(t + i * 166_667, 100 * (i % 2)) for i in range(6)]
    (s,) = collector.sample()
    assert s.gauges["util"] == 50
    gpu.util_samples += [(t + 1_000_000 + i * 166_667, 100 if i == 0 else 0) for i in range(6)]
    (s,) = collector.sample()
    assert s.gauges["util"] == pytest.approx(100 / 6)
    (s,) = collector.sample()  # no new sample (NVML: NOT_FOUND): the plain reading stands in
    assert s.gauges["util"] == 100


def test_a_driver_without_samples_falls_back_to_one_reading(tmp_path: Path) -> None:
    collector = _open([FakeGpu(util=77)], tmp_path, samples_api=False)
    assert collector.sample()[0].gauges["util"] == 77


def test_a_birth_listing_only_mig_instances_is_planned_as_its_gpus(tmp_path: Path) -> None:
    from agent.protocol import GpuInfo, encode
    from optimizer.decide.snapshot import from_fleet
    from optimizer.ingest.fleet import Fleet

    slices = [
        GpuInfo(
            index=8 + i, uuid=f"MIG-{i}", model="NVIDIA H100 80GB HBM3 MIG 3g.40gb", memory_mib=40_000, parent=i // 2
        )
        for i in range(4)
    ]
    birth = Birth(node="n1", site="s1", session=1, agent_version="x", hostname="h", timestamp=1.0, gpus=slices)
    fleet = Fleet("fleetfit/v1")
    assert fleet.ingest("fleetfit/v1/s1/n1/birth", encode(birth)) is not None
    (node,) = from_fleet(fleet, "s1", []).nodes
    assert (node.hardware, node.gpus) == ("NVIDIA H100 80GB HBM3", 2)


def test_the_birth_says_what_the_nvlink_links_lead_to_and_the_pci_id(tmp_path: Path) -> None:
    sxm, bridged = FakeGpu(nvswitch=True), FakeGpu(name="NVIDIA H100 PCIe", nvswitch=False, pci_device_id=0x233110DE)
    inv = _open([sxm, bridged, FakeGpu(nvlink_links=0)], tmp_path).inventory()
    assert [g.nvswitch for g in inv.gpus] == [True, False, None]
    assert [g.pci_device_id for g in inv.gpus][:2] == ["0x233010de", "0x233110de"]


def test_gpm_buffers_that_cannot_be_allocated_cost_gpm_only(tmp_path: Path) -> None:
    nvml = make_fake_nvml([FakeGpu(gpm={2: 50.0})])

    def no_memory() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_MEMORY)

    nvml.nvmlGpmSampleAlloc = no_memory  # type: ignore[attr-defined]
    collector = open_gpu_collector(nvml, Attributor(tmp_path), Clock())
    assert isinstance(collector, NvmlGpuCollector)
    assert collector.sample()[0].gauges["util"] == 90 and "sm_active" not in collector.sample()[0].gauges
