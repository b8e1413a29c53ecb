"""AMD Instinct (amdsmi) and Intel Gaudi (pyhlml) collectors against stand-ins that behave like the real
bindings, their absence on a node without them, and the simulator profiles for both."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FLEETFIT
from fake_amdsmi import DRIVER_NOT_LOADED, NO_PERM, FakeAmdGpu, make_fake_amdsmi, partitions
from fake_hlml import DRIVER_NOT_LOADED as DRIVER_NOT_LOADED_HLML
from fake_hlml import FakeGaudi, make_fake_hlml
from fake_nvml import make_fake_nvml

from agent.config import AgentSettings
from agent.metrics import render
from agent.protocol import Birth, GpuInfo, Telemetry, TopicKind, WorkloadKind, decode, encode
from agent.sources import gpu_collector, simulated_gpus
from agent.window import WindowBuilder
from collectors.amd import AmdGpuCollector, open_amd_collector
from collectors.attribution import Attributor
from collectors.gaudi import GaudiCollector, open_gaudi_collector
from collectors.gpu import RESCAN_S, NullGpuCollector
from optimizer.decide.catalog import load_catalog
from optimizer.decide.inventory import inventory_check
from optimizer.decide.snapshot import from_fleet
from optimizer.ingest.fleet import Fleet, IngestLimits
from optimizer.ingest.shares import layout, pinned, tenancy, units
from optimizer.serve.config import OptimizerSettings

CATALOG = load_catalog()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _proc(root: Path, pid: int, cgroup: str, holds: str | None = None) -> None:
    d = root / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "cgroup").write_text(f"0::{cgroup}\n")
    (d / "comm").write_text("python3\n")
    (d / "stat").write_text(f"{pid} (python3) S 1 {pid} {pid} 0 -1\n")
    if holds:
        os.symlink("/dev/null", d / "fd" / "0")
        os.symlink(holds, d / "fd" / "3")


# ---------------------------------------------------------------- AMD


def _amd(gpus: list[FakeAmdGpu], root: Path) -> AmdGpuCollector:
    collector = open_amd_collector(make_fake_amdsmi(gpus), Attributor(root, node="n1"))
    assert collector is not None
    return collector


def test_amd_inventory_is_what_the_catalog_and_planner_need(tmp_path: Path) -> None:
    collector = _amd([FakeAmdGpu(), FakeAmdGpu(partition="CPX")], tmp_path)
    inv = collector.inventory()
    first, second = inv.gpus
    assert (first.model, first.memory_mib, first.nvlink_links) == ("AMD Instinct MI300X", 196_592, 7)
    assert first.pci_device_id == "0x74a11002" and first.mig_profile is None and second.mig_profile == "CPX"
    entry = CATALOG.lookup(first.model, first.pci_device_id)
    assert entry is not None and entry.key == "mi300x"
    assert inv.driver_version == "6.10.5"


def test_amd_samples_survive_na_values_and_unsupported_calls(tmp_path: Path) -> None:
    gpus = [FakeAmdGpu(), FakeAmdGpu(gfx_activity="N/A", power_w="N/A", unsupported={"metrics"})]
    full, partial = _amd(gpus, tmp_path).sample()
    assert full.gauges == {"util": 87, "mem_util": 40, "mem_used_mib": 150_000, "power_w": 640, "temp_c": 71}
    assert partial.gauges == {"mem_util": 40, "mem_used_mib": 150_000}  # what it has, nothing invented


def test_xgmi_traffic_is_rated_per_link(tmp_path: Path) -> None:
    gpu = FakeAmdGpu(xgmi_kb=[10**12] * 7 + ["N/A"])
    collector = _amd([gpu], tmp_path)
    builder = WindowBuilder("n1", "s1", 1)
    for t in range(4):
        builder.add(collector.sample(), float(t))
        gpu.xgmi_kb = [v + 1_000 if isinstance(v, int) else v for v in gpu.xgmi_kb]  # 1 MB/s per link
    (window,) = builder.close(0, 0.0, 4.0, []).gpus
    assert window.nvlink_tx_bps is not None and window.nvlink_tx_bps.mean == 7 * 1_000_000
    assert builder.counter_resets == 0


def test_amd_processes_are_checked_and_attributed(tmp_path: Path) -> None:
    _proc(tmp_path, 300, "/system.slice/slurmstepd.scope/job_9/step_0")
    collector = _amd([FakeAmdGpu(pids=[300, 31337])], tmp_path)
    (w,) = collector.workloads()
    assert (w.id, w.kind, w.gpus) == ("slurm/9", WorkloadKind.SLURM_JOB, [0])
    assert "fleetfit_agent_gpu_invalid_pids_total 1\n" in render(collector.metrics())  # 31337 is no process here


def test_amd_tenants_of_a_gpu_split_it_by_the_vram_each_holds(tmp_path: Path) -> None:
    _proc(tmp_path, 300, "/system.slice/slurmstepd.scope/job_9/step_0")
    _proc(tmp_path, 301, "/system.slice/slurmstepd.scope/job_10/step_0")
    gpu = FakeAmdGpu(pids=[300, 301], vram_bytes={300: 6 * 2**30, 301: 18 * 2**30})
    refs = _amd([gpu], tmp_path).workloads()
    assert {(w.id, tuple(w.gpu_mem_mib or ())) for w in refs} == {("slurm/9", (6144.0,)), ("slurm/10", (18432.0,))}
    birth = _birth(_amd([gpu], tmp_path).inventory().gpus)
    lay = layout(birth)
    memory = {w.id: pinned(w.gpus, w.gpu_mem_mib) for w in refs}
    assert tenancy(refs, lay, memory) == {"slurm/9": {0: 0.25}, "slurm/10": {0: 0.75}}  # not half each


@pytest.mark.parametrize("process_api", ["dicts", "handles"])
def test_an_amd_job_on_one_gpu_is_not_put_on_every_gpu_that_lists_it(tmp_path: Path, process_api: str) -> None:
    """Deliberate bug caught: keeping every process an amdsmi that lists each process under every GPU returns, 0
    bytes of VRAM or not: the one-GPU job 9 would be attributed GPUs 0 and 1, and so would job 10."""
    _proc(tmp_path, 300, "/system.slice/slurmstepd.scope/job_9/step_0")
    _proc(tmp_path, 301, "/system.slice/slurmstepd.scope/job_10/step_0")
    gpus = [FakeAmdGpu(pids=[300]), FakeAmdGpu(pids=[301])]
    smi = make_fake_amdsmi(gpus, process_api=process_api, processes_everywhere=True)
    collector = open_amd_collector(smi, Attributor(tmp_path))
    assert collector is not None
    assert {(w.id, tuple(w.gpus)) for w in collector.workloads()} == {("slurm/9", (0,)), ("slurm/10", (1,))}


def test_amd_power_is_read_when_only_the_power_cap_cannot_be(tmp_path: Path) -> None:
    # amdsmi_get_power_info fails as a whole when hwmon's power1_cap cannot be read (some VMs), power read or not
    smi = make_fake_amdsmi([FakeAmdGpu(unsupported={"power_cap"})])
    smi.amdsmi_init()  # type: ignore[attr-defined]
    (handle,) = smi.amdsmi_get_processor_handles()  # type: ignore[attr-defined]
    with pytest.raises(smi.AmdSmiLibraryException):  # type: ignore[attr-defined]
        smi.amdsmi_get_power_info(handle)  # type: ignore[attr-defined]
    (s,) = _amd([FakeAmdGpu(unsupported={"power_cap"})], tmp_path).sample()
    assert s.gauges["power_w"] == 640 and s.gauges["util"] == 87


def test_the_mi300x_virtual_function_of_cloud_instances_is_an_mi300x(tmp_path: Path) -> None:
    (g,) = _amd([FakeAmdGpu(market_name="MI300X-O", device_id=0x74B5)], tmp_path).inventory().gpus
    assert (g.model, g.pci_device_id) == ("AMD MI300X-O", "0x74b51002")
    entry = CATALOG.lookup(g.model, g.pci_device_id)
    assert entry is not None and entry.key == "mi300x"


# ---------------------------------------------------------------- AMD compute partitions


def _birth(gpus: list[GpuInfo]) -> Birth:
    return Birth(node="mi-01", site="s1", session=1, agent_version="t", hostname="h", timestamp=time.time(), gpus=gpus)


def _mi300x_cpx() -> list[FakeAmdGpu]:
    """Eight MI300X in CPX mode as amdsmi lists them: 64 devices; partition k of each busy at 10 k %."""
    busy = [10 * k for k in range(8)]
    return [p for i in range(8) for p in partitions(FakeAmdGpu(uuid=f"mi300x-{i}"), "CPX", 8, 0x05 + i, busy)]


def test_eight_mi300x_in_cpx_are_eight_gpus_of_64_partitions_to_the_optimizer(tmp_path: Path) -> None:
    collector = _amd(_mi300x_cpx(), tmp_path)
    inv = collector.inventory()
    # only the first partition of each GPU answers the partition query; every partition carries the mode
    assert len(inv.gpus) == 64 and {g.mig_profile for g in inv.gpus} == {"CPX"} and inv.gpu_failures == []
    birth = _birth(inv.gpus)
    assert layout(birth).gpus == 8
    check = inventory_check(CATALOG, OptimizerSettings().max_gpus_per_node)
    assert check(birth) is None  # the node limit (16) is of physical GPUs
    fleet = Fleet("fleetfit/v1", limits=IngestLimits(inventory=check))
    assert fleet.ingest("fleetfit/v1/s1/mi-01/birth", encode(birth)) is not None and not fleet.rejected
    (node,) = from_fleet(fleet, "s1", []).nodes
    assert (node.hardware, node.gpus, node.nvlink) == ("AMD Instinct MI300X", 8, True)
    # each partition's activity from its GPU's per-partition statistics, not the GPU's average (87 %)
    samples = collector.sample()
    assert [s.gauges.get("util") for s in samples[:8]] == [10.0 * k for k in range(8)]
    assert [s.key for s in samples if "power_w" in s.gauges] == [str(8 * i) for i in range(8)]  # once per GPU


def test_a_partition_mode_the_gpu_does_not_report_follows_from_its_partition_count(tmp_path: Path) -> None:
    gpus = [p for i in range(2) for p in partitions(FakeAmdGpu(), "QPX", 4, 0x10 + i)]
    for g in gpus:
        g.unsupported.add("partition")  # ROCm releases whose partition query fails even on the first partition
    inv = _amd(gpus, tmp_path).inventory()
    assert [g.mig_profile for g in inv.gpus] == ["QPX"] * 8 and layout(_birth(inv.gpus)).gpus == 2


def test_a_partition_change_reloads_the_driver_and_the_devices_are_listed_again(tmp_path: Path) -> None:
    clock = Clock()
    smi = make_fake_amdsmi([FakeAmdGpu(uuid=f"mi300x-{i}", bdf=f"0000:{0x05 + i:02x}:00.0") for i in range(8)])
    collector = open_amd_collector(smi, Attributor(tmp_path), clock=clock)
    assert collector is not None and len(collector.inventory().gpus) == 8
    smi.reload(_mi300x_cpx())  # type: ignore[attr-defined]  # `amd-smi set --compute-partition CPX`
    clock.now += RESCAN_S
    assert len(collector.sample()) == 64
    inv = collector.inventory()
    assert len(inv.gpus) == 64 and layout(_birth(inv.gpus)).gpus == 8 and collector.generation == 1
    clock.now += RESCAN_S
    collector.sample()
    assert collector.generation == 1 and smi.inits == 2  # type: ignore[attr-defined]  # nothing changed since


def test_an_amd_gpu_that_failed_at_start_is_read_again(tmp_path: Path) -> None:
    clock = Clock()
    gpus = [FakeAmdGpu(), FakeAmdGpu(unsupported={"asic"})]
    collector = open_amd_collector(make_fake_amdsmi(gpus), Attributor(tmp_path), clock=clock)
    assert collector is not None
    inv = collector.inventory()
    assert [g.index for g in inv.gpus] == [0] and [f.index for f in inv.gpu_failures] == [1]
    gpus[1].unsupported = set()
    clock.now += RESCAN_S
    assert [s.key for s in collector.sample()] == ["0", "1"]
    assert collector.inventory().gpu_failures == [] and collector.generation == 1


def test_an_amdgpu_driver_loaded_after_boot_is_picked_up(tmp_path: Path) -> None:
    clock = Clock()
    smi = make_fake_amdsmi([FakeAmdGpu()], init_error=DRIVER_NOT_LOADED)
    collector = open_amd_collector(smi, Attributor(tmp_path), clock=clock)
    assert collector is not None and collector.sample() == []
    assert "34" in (collector.inventory().gpu_unavailable or "")
    smi.init_error = None  # type: ignore[attr-defined]
    clock.now += RESCAN_S
    assert collector.sample()[0].gauges["util"] == 87
    assert collector.inventory().gpu_unavailable is None and collector.generation == 1


def test_amd_processes_from_an_amdsmi_that_lists_process_handles(tmp_path: Path) -> None:
    _proc(tmp_path, 300, "/system.slice/slurmstepd.scope/job_9/step_0")
    smi = make_fake_amdsmi([FakeAmdGpu(pids=[300])], process_api="handles")
    collector = open_amd_collector(smi, Attributor(tmp_path))
    assert collector is not None
    (w,) = collector.workloads()
    assert (w.id, w.gpus) == ("slurm/9", [0])


def test_amd_init_failure_disables_the_collector_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="collectors.amd"):
        assert open_amd_collector(make_fake_amdsmi([FakeAmdGpu()], init_error=NO_PERM), Attributor(tmp_path)) is None
    assert len(caplog.records) == 1 and "disabled" in caplog.records[0].getMessage()


def test_amdsmi_without_rocm_prints_and_raises_keyerror_yet_stdout_stays_clean(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What `import amdsmi` does on a node without libamd_smi.so: two lines on stdout, then KeyError.
    package = tmp_path / "amdsmi"
    package.mkdir()
    (package / "__init__.py").write_text(
        "print('Could not load libamd_smi.so')\n"
        "print('Unable to find libamd_smi.so library try installing amd-smi-lib from your package manager')\n"
        "_libraries = {}\n_libraries['libamd_smi.so'].amdsmi_free_name_value_pairs\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    with caplog.at_level(logging.INFO, logger="collectors.amd"):
        assert open_amd_collector() is None
    assert capsys.readouterr().out == ""  # `fleetfit agent --once` prints JSON on stdout: nothing else may
    (record,) = caplog.records
    assert "KeyError" in record.getMessage() and "libamd_smi.so" in record.getMessage()


# ---------------------------------------------------------------- Gaudi


def test_gaudi_inventory_samples_and_a_device_that_cannot_be_opened(tmp_path: Path) -> None:
    devices = [FakeGaudi(minor=0), FakeGaudi(minor=1, handle_error=15), FakeGaudi(minor=2, unsupported={"power"})]
    collector = open_gaudi_collector(make_fake_hlml(devices), Attributor(tmp_path))
    assert isinstance(collector, GaudiCollector)
    inv = collector.inventory()
    assert [(g.index, g.model, g.memory_mib) for g in inv.gpus] == [
        (0, "Intel Gaudi 2", 98304),
        (2, "Intel Gaudi 2", 98304),
    ]
    assert inv.gpus[0].pci_device_id == "0x10201da3" and [f.index for f in inv.gpu_failures] == [1]
    entry = CATALOG.lookup(inv.gpus[0].model, inv.gpus[0].pci_device_id)
    assert entry is not None and entry.key == "gaudi2"
    first, second = collector.sample()
    assert first.gauges["util"] == 93 and first.gauges["power_w"] == 480 and first.gauges["mem_used_mib"] == 70 * 1024
    assert "power_w" not in second.gauges and second.gauges["util"] == 93


@pytest.mark.parametrize("utilization", ["aip", "int"])
def test_older_pyhlml_utilisation_shapes_still_give_samples(tmp_path: Path, utilization: str) -> None:
    collector = open_gaudi_collector(make_fake_hlml([FakeGaudi()], utilization=utilization), Attributor(tmp_path))
    assert collector is not None
    (s,) = collector.sample()
    assert s.gauges["util"] == 93 and s.gauges["power_w"] == 480 and "mem_util" not in s.gauges


def test_gaudi_processes_are_the_holders_of_its_device_node(tmp_path: Path) -> None:
    _proc(tmp_path, 500, "/kubepods/burstable/pod0a1b2c3d-0000-4000-8000-000000000001/abc", "/dev/accel/accel1")
    _proc(tmp_path, 501, "/system.slice/other.service")  # holds nothing
    collector = open_gaudi_collector(make_fake_hlml([FakeGaudi(minor=0), FakeGaudi(minor=1)]), Attributor(tmp_path))
    assert collector is not None
    (w,) = collector.workloads()
    assert (w.id, w.gpus) == ("k8s/0a1b2c3d-0000-4000-8000-000000000001", [1])


def test_holders_the_agent_may_not_read_are_said_once_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Another user's /proc/PID/fd refused (EACCES: the kernel's answer to an agent without CAP_DAC_READ_SEARCH,
    stood in for here since the tests run as root): one warning naming the drop-in that grants the rights, a gauge,
    and the birth's attribution_warning, instead of Gaudi work left unattributed in silence.

    Deliberate bug it catches: PermissionError swallowed with the other OSErrors (the scan skipped it silently)."""
    _proc(tmp_path, 500, "/kubepods/burstable/pod0a1b2c3d-0000-4000-8000-000000000001/abc", "/dev/accel/accel1")
    _proc(tmp_path, 600, "/system.slice/slurmstepd.scope/job_7/step_0", "/dev/accel/accel0")
    listdir = os.listdir

    def refused(path: str | os.PathLike[str]) -> list[str]:
        if str(path) == str(tmp_path / "600" / "fd"):
            raise PermissionError(13, "Permission denied", str(path))
        return listdir(path)

    monkeypatch.setattr("collectors.gaudi.os.listdir", refused)
    collector = open_gaudi_collector(make_fake_hlml([FakeGaudi(minor=0), FakeGaudi(minor=1)]), Attributor(tmp_path))
    assert collector is not None
    with caplog.at_level(logging.WARNING, logger="collectors.gaudi"):
        (w,) = collector.workloads()
        collector.workloads()
    assert w.gpus == [1]  # the readable one is attributed all the same
    (record,) = caplog.records
    assert "attribution.conf.example" in record.getMessage()
    assert "fleetfit_agent_gpu_holders_denied 1\n" in render(collector.metrics())
    assert "CAP_SYS_PTRACE" in (collector.inventory().attribution_warning or "") and collector.generation == 1


def test_a_gaudi_driver_loaded_after_boot_is_picked_up(tmp_path: Path) -> None:
    clock = Clock()
    hlml = make_fake_hlml([FakeGaudi(minor=0), FakeGaudi(minor=1)], init_error=DRIVER_NOT_LOADED_HLML)
    collector = open_gaudi_collector(hlml, Attributor(tmp_path), clock=clock)
    assert collector is not None and collector.sample() == []
    assert "Driver not loaded" in (collector.inventory().gpu_unavailable or "")
    hlml.init_error = None  # type: ignore[attr-defined]
    clock.now += RESCAN_S
    assert [s.key for s in collector.sample()] == ["0", "1"] and collector.generation == 1


def test_a_gaudi_that_failed_at_start_is_read_again(tmp_path: Path) -> None:
    clock = Clock()
    devices = [FakeGaudi(minor=0), FakeGaudi(minor=1, handle_error=15)]  # AIP_IS_LOST at start
    collector = open_gaudi_collector(make_fake_hlml(devices), Attributor(tmp_path), clock=clock)
    assert collector is not None and [f.index for f in collector.inventory().gpu_failures] == [1]
    devices[1].handle_error = None
    clock.now += RESCAN_S
    assert [s.key for s in collector.sample()] == ["0", "1"]
    assert collector.inventory().gpu_failures == [] and collector.generation == 1


def test_no_libhlml_disables_gaudi_quietly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert open_gaudi_collector(make_fake_hlml([FakeGaudi()], library=False), Attributor(tmp_path)) is None
    assert capsys.readouterr().out == ""


# ---------------------------------------------------------------- node wiring and simulator


def test_a_node_without_any_vendor_library_gets_the_null_collector(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Whatever the runner has (a GPU runner has NVML): each vendor's library is made absent the way it is absent
    # on a node without it, and the PCI bus cannot be read (no sysfs), so every library is tried.
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_nvml([], init_error=12))  # LIBRARY_NOT_FOUND
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # import fails
    monkeypatch.setitem(sys.modules, "pyhlml.main", None)
    collector = gpu_collector(AgentSettings(node="n1"), sysfs_root=tmp_path)
    assert isinstance(collector, NullGpuCollector) and "NVML" in collector.reason


@pytest.mark.parametrize(
    ("spec", "mode", "devices"), [("mi300x8:cpx", "CPX", 64), ("mi300x8:inference:qpx", "QPX", 32)]
)
def test_simulated_mi300x_in_a_partition_mode_are_eight_gpus(spec: str, mode: str, devices: int) -> None:
    node = simulated_gpus(spec, "n1")
    inv = node.inventory()
    assert len(inv.gpus) == devices and {g.mig_profile for g in inv.gpus} == {mode}
    lay = layout(_birth(inv.gpus))
    assert lay.gpus == 8
    (ref,) = node.workloads()
    assert units(dict.fromkeys(ref.gpus, 1.0), lay) == 8  # the workload holds every partition: eight GPUs
    builder = WindowBuilder("n1", "s1", 1)
    for t in range(3):
        builder.add(node.sample(), float(t))
    window = builder.close(0, 0.0, 3.0, [ref])
    assert len(window.gpus) == devices and sum(g.power_w is not None for g in window.gpus) == 8


def test_fleetfit_agent_simulates_mi300x_in_cpx() -> None:
    result = subprocess.run(
        [FLEETFIT, "agent", "--simulate", "mi300x8:cpx", "--once"], capture_output=True, timeout=120, check=True
    )
    window = decode(TopicKind.TELEMETRY, result.stdout)
    assert isinstance(window, Telemetry) and len(window.gpus) == 64
    assert b"8 AMD Instinct MI300X in CPX mode, listed as 64 devices" in result.stderr
    with pytest.raises(ValueError, match="AMD Instinct MI300"):
        simulated_gpus("h100x8:cpx", "n1")


@pytest.mark.parametrize(
    ("spec", "model", "key"), [("mi300x8", "AMD Instinct MI300X", "mi300x"), ("gaudi2x8", "Intel Gaudi 2", "gaudi2")]
)
def test_simulator_profiles_for_amd_and_gaudi(spec: str, model: str, key: str) -> None:
    node = simulated_gpus(spec, "n1")
    gpus = node.inventory().gpus
    assert len(gpus) == 8 and {g.model for g in gpus} == {model}
    entry = CATALOG.lookup(model)
    assert entry is not None and entry.key == key
    assert all(s.gauges.get("util", 0) > 0 for s in node.sample() if s.entity == "gpu")
