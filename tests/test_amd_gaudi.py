"""AMD Instinct (amdsmi) and Intel Gaudi (pyhlml) collectors against stand-ins that behave like the real
bindings, their absence on a node without them, and the simulator profiles for both."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest
from fake_amdsmi import NO_PERM, FakeAmdGpu, make_fake_amdsmi
from fake_hlml import FakeGaudi, make_fake_hlml

from agent.config import AgentSettings
from agent.protocol import WorkloadKind
from agent.sources import gpu_collector, simulated_gpus
from agent.window import WindowBuilder
from collectors.amd import AmdGpuCollector, open_amd_collector
from collectors.attribution import Attributor
from collectors.gaudi import GaudiCollector, open_gaudi_collector
from collectors.gpu import NullGpuCollector
from optimizer.catalog import load_catalog

CATALOG = load_catalog()


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
    assert "fleetfit_agent_gpu_invalid_pids_total" in str(collector.metrics())


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


def test_no_libhlml_disables_gaudi_quietly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert open_gaudi_collector(make_fake_hlml([FakeGaudi()], library=False), Attributor(tmp_path)) is None
    assert capsys.readouterr().out == ""


# ---------------------------------------------------------------- node wiring and simulator


def test_a_node_without_any_vendor_library_gets_the_null_collector() -> None:
    assert isinstance(gpu_collector(AgentSettings(node="n1")), NullGpuCollector)  # this machine has none


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
