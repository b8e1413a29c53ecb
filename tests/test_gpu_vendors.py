"""Which GPU libraries a node opens: the vendors on its PCI bus (fixture sysfs trees), every one of them, whatever
libraries its image carries; stand-ins fail as the real bindings do (NVML's DRIVER_NOT_LOADED where libnvidia-ml
is installed without an NVIDIA device)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest
from fake_amdsmi import FakeAmdGpu, make_fake_amdsmi
from fake_hlml import FakeGaudi, make_fake_hlml
from fake_nvml import FakeGpu, make_fake_nvml

from agent.config import AgentSettings
from agent.metrics import render
from agent.protocol import Birth
from agent.sources import gpu_collector
from collectors.attribution import Attributor
from collectors.gaudi import open_gaudi_collector
from collectors.gpu import NullGpuCollector, open_gpu_collector
from collectors.pci import accelerators
from collectors.vendors import GpuVendors

DRIVER_NOT_LOADED = 9  # nvml.h NVML_ERROR_DRIVER_NOT_LOADED: the library is there, no NVIDIA kernel module


def _bus(root: Path, *devices: tuple[str, int, int]) -> Path:
    """A /sys with these PCI functions: (address, vendor id, class code)."""
    for address, vendor, klass in devices:
        d = root / "bus" / "pci" / "devices" / address
        d.mkdir(parents=True)
        (d / "vendor").write_text(f"0x{vendor:04x}\n")
        (d / "class").write_text(f"0x{klass:06x}\n")
    return root


# What an AMD Instinct node's bus holds besides its GPUs: AMD's own CPU functions, the BMC's VGA, an AMD HDMI
# audio function (consumer cards), none of them an accelerator.
AMD_NODE = (
    ("0000:05:00.0", 0x1002, 0x038000),  # MI300X: display controller, other
    ("0000:26:00.0", 0x1002, 0x038000),
    ("0000:00:00.0", 0x1022, 0x060000),  # AMD EPYC host bridge
    ("0000:02:00.0", 0x1A03, 0x030000),  # ASPEED BMC VGA
    ("0000:05:00.1", 0x1002, 0x040300),  # HDMI audio
)


@pytest.fixture
def golden_image(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every vendor's user space installed, as a uniform image across a mixed fleet has it: NVML without an
    NVIDIA kernel module fails with DRIVER_NOT_LOADED, amdsmi finds two MI300X, HLML no Gaudi."""
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_nvml([], init_error=DRIVER_NOT_LOADED))
    monkeypatch.setitem(sys.modules, "amdsmi", make_fake_amdsmi([FakeAmdGpu(), FakeAmdGpu()]))
    monkeypatch.setitem(sys.modules, "pyhlml.main", make_fake_hlml([]))


def test_the_pci_bus_names_only_accelerators_of_supported_vendors(tmp_path: Path) -> None:
    root = _bus(tmp_path, *AMD_NODE, ("0000:c1:00.0", 0x10DE, 0x068000))  # an NVSwitch: a bridge, not a GPU
    assert accelerators(root) == {0x1002: ["0000:05:00.0", "0000:26:00.0"]}
    assert accelerators(tmp_path / "nothing") is None  # no sysfs: the caller cannot know


def test_an_amd_node_with_nvidias_library_reads_its_amd_gpus(
    tmp_path: Path, golden_image: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Deliberate bug it catches: NVML tried first and its waiting collector kept (the chain NVML, then AMD only
    without an NVIDIA library) reports 0 GPUs for ever on this node."""
    with caplog.at_level(logging.INFO, logger="agent.sources"):
        collector = gpu_collector(AgentSettings(node="n1"), sysfs_root=_bus(tmp_path, *AMD_NODE))
    inv = collector.inventory()
    assert [g.model for g in inv.gpus] == ["AMD Instinct MI300X"] * 2 and inv.gpu_unavailable is None
    assert [s.key for s in collector.sample()] == ["0", "1"]
    said = " | ".join(r.getMessage() for r in caplog.records)
    assert "accelerators on the PCI bus: AMD x2" in said and "AMD devices read through amdsmi: 2" in said


def test_without_a_readable_bus_every_library_is_tried_and_the_one_that_answers_kept(
    tmp_path: Path, golden_image: None
) -> None:
    """Deliberate bug it catches: the first library that loads (NVML, waiting for a driver that will never come)
    kept in place of the one that found GPUs."""
    collector = gpu_collector(AgentSettings(node="n1"), sysfs_root=tmp_path / "no-sysfs")
    inv = collector.inventory()
    assert len(inv.gpus) == 2 and inv.gpu_unavailable is None


def test_a_node_with_no_accelerator_on_its_bus_loads_no_library(tmp_path: Path, golden_image: None) -> None:
    collector = gpu_collector(AgentSettings(node="n1"), sysfs_root=_bus(tmp_path, *AMD_NODE[2:]))
    assert isinstance(collector, NullGpuCollector) and "PCI bus" in collector.reason


def test_nvidia_devices_whose_driver_is_not_loaded_yet_are_waited_for(tmp_path: Path, golden_image: None) -> None:
    root = _bus(tmp_path, ("0000:18:00.0", 0x10DE, 0x030200))  # an H100: 3D controller
    inv = gpu_collector(AgentSettings(node="n1"), sysfs_root=root).inventory()
    assert inv.gpus == [] and "NVML" in (inv.gpu_unavailable or "")  # at boot, before nvidia.ko: it comes later


def test_every_vendor_on_the_bus_is_read_each_device_under_one_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two NVIDIA GPUs and two Gaudis on one node: both libraries read, the Gaudis numbered after the GPUs in the
    birth, the samples and the workloads, and each vendor's self-metrics labelled with it.

    Deliberate bug it catches: the Gaudis keep their own indices 0 and 1, which the birth refuses as duplicates
    (and the samples would mix with the NVIDIA GPUs')."""
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_nvml([FakeGpu(), FakeGpu()]))
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    monkeypatch.setitem(sys.modules, "pyhlml.main", make_fake_hlml([FakeGaudi(minor=0), FakeGaudi(minor=1)]))
    root = _bus(tmp_path, ("0000:18:00.0", 0x10DE, 0x030200), ("0000:19:00.0", 0x10DE, 0x030200))
    _bus(root, ("0000:33:00.0", 0x1DA3, 0x120000), ("0000:34:00.0", 0x1DA3, 0x120000))  # Gaudi2: accelerators
    collector = gpu_collector(AgentSettings(node="n1"), sysfs_root=root)
    inv = collector.inventory()
    assert [(g.index, g.model.split()[0]) for g in inv.gpus] == [
        (0, "NVIDIA"),
        (1, "NVIDIA"),
        (2, "Intel"),
        (3, "Intel"),
    ]
    Birth(node="n1", site="s", session=1, agent_version="1", hostname="h", timestamp=1.7e9, gpus=inv.gpus)
    assert sorted(s.key for s in collector.sample()) == ["0", "1", "2", "3"]
    text = render(collector.metrics())
    assert (
        'fleetfit_agent_gpu_failed{vendor="NVIDIA"} 0' in text
        and 'fleetfit_agent_gpu_failed{vendor="Habana"} 0' in text
    )
    assert text.count("# TYPE fleetfit_agent_gpu_failed gauge") == 1


def test_a_gaudi_workload_keeps_the_index_its_device_has_in_the_birth(tmp_path: Path) -> None:
    pid = tmp_path / "500"
    (pid / "fd").mkdir(parents=True)
    (pid / "cgroup").write_text("0::/kubepods/burstable/pod0a1b2c3d-0000-4000-8000-000000000001/abc\n")
    (pid / "comm").write_text("python3\n")
    (pid / "stat").write_text("500 (python3) S 1 500 500 0 -1\n")
    os.symlink("/dev/accel/accel1", pid / "fd" / "3")
    attributor = Attributor(tmp_path, node="n1")
    nvidia = open_gpu_collector(make_fake_nvml([FakeGpu(), FakeGpu()]), attributor)
    gaudi = open_gaudi_collector(make_fake_hlml([FakeGaudi(minor=0), FakeGaudi(minor=1)]), attributor)
    assert gaudi is not None
    (w,) = GpuVendors([("NVIDIA", nvidia), ("Habana", gaudi)]).workloads()
    assert w.gpus == [3]  # the second Gaudi, after two NVIDIA GPUs
