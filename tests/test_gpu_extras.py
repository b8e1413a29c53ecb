"""What a GPU's birth and windows say beyond the basics, read from stand-ins that fail as the real bindings do:
Grace Hopper's NVLink-C2C link (asked once per GPU), GPM's SM occupancy (in the GPM call already made), AMD's
memory partition mode and each compute partition's physical GPU (counted by the optimizer)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fake_amdsmi import FakeAmdGpu, make_fake_amdsmi, partitions
from fake_nvml import FakeGpu, make_fake_nvml

from agent.metrics import render
from agent.protocol import Birth, GpuInfo, WorkloadRef, encode
from agent.window import WindowBuilder
from collectors.amd import open_amd_collector
from collectors.attribution import Attributor
from collectors.gpu import RESCAN_S, NvmlGpuCollector, open_gpu_collector
from collectors.vendors import GpuVendors
from optimizer.decide.catalog import load_catalog
from optimizer.decide.inventory import inventory_check
from optimizer.ingest.fleet import Fleet, IngestLimits
from optimizer.ingest.shares import layout
from optimizer.ingest.window import read_window

CATALOG = load_catalog()
C2C_FIELDS = {170, 171, 172}  # nvml.h NVML_FI_DEV_C2C_LINK_COUNT, _GET_STATUS, _GET_MAX_BW


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _birth(gpus: list[GpuInfo], node: str = "n1") -> Birth:
    return Birth(node=node, site="s1", session=1, agent_version="t", hostname=node, timestamp=time.time(), gpus=gpus)


# ---------------------------------------------------------------- NVLink-C2C (Grace Hopper)


def _grace_hopper() -> FakeGpu:
    """A GH200 whose ten C2C links run at 45,000 MB/s each, the last one down (the figures are illustrative)."""
    return FakeGpu(name="NVIDIA GH200 480GB", pci_device_id=0x234210DE, c2c_mb_per_s=[45_000] * 10, c2c_down={9})


def test_a_grace_hopper_gpu_says_its_c2c_links_in_the_birth_and_no_gpu_is_asked_twice() -> None:
    """Deliberate bugs caught: counting and summing the speed of a C2C link that is down (10 links, 450 GB/s);
    asking for C2C in ``inventory`` or ``sample`` rather than once when the GPU is first read (an H100 answers
    NOT_SUPPORTED at every tick, every birth and every layout change)."""
    clock = Clock()
    gh200, h100 = _grace_hopper(), FakeGpu()
    nvml = make_fake_nvml([gh200, h100])
    collector = open_gpu_collector(nvml, clock=clock)
    assert isinstance(collector, NvmlGpuCollector)
    first, second = collector.inventory().gpus
    assert (first.c2c_links, first.c2c_max_bps) == (9, 9 * 45_000 * 1e6)  # 405 GB/s over the nine links up
    assert (second.c2c_links, second.c2c_max_bps) == (0, None)  # NOT_SUPPORTED: no C2C, said as such
    entry = CATALOG.lookup(first.model, first.pci_device_id)
    assert entry is not None and entry.key == "gh200"
    assert nvml.calls.count("c2c_mode") == 2  # type: ignore[attr-defined]
    nvml.calls.clear()  # type: ignore[attr-defined]
    nvml.field_ids.clear()  # type: ignore[attr-defined]
    for tick in range(3):
        collector.sample()
        collector.inventory()
        h100.down_links = {tick}  # the layout changes: the inventory is read again, the GPUs kept
        clock.now += RESCAN_S
    assert collector.generation >= 2
    assert "c2c_mode" not in nvml.calls and not C2C_FIELDS & set(nvml.field_ids)  # type: ignore[attr-defined]
    assert collector.inventory().gpus[0].c2c_links == 9


def test_c2c_is_read_from_the_fields_on_a_driver_without_the_mode_call() -> None:
    """Deliberate bug caught: taking FUNCTION_NOT_FOUND (a driver without nvmlDeviceGetC2cModeInfoV) for a GPU
    without C2C: the GH200 would be said to have none. A GPU whose fields do not answer is not known (None), not
    said to lack the link."""
    nvml = make_fake_nvml([_grace_hopper(), FakeGpu()], c2c_api=False)
    first, second = open_gpu_collector(nvml).inventory().gpus
    assert (first.c2c_links, first.c2c_max_bps) == (9, 405e9)
    assert (second.c2c_links, second.c2c_max_bps) == (None, None)


def test_c2c_traffic_comes_in_the_gpm_call_of_a_gpu_with_c2c_links_only() -> None:
    """Deliberate bugs caught: MiB/s taken for bytes/s (or MB/s: a 2**20 against 10**6 error of 5 %); asking
    GPUs without C2C for the C2C metrics (a slot of every H100's GPM call each second for nothing: the stand-in
    H100 here would answer, a real one fails the slot)."""
    gh200 = _grace_hopper()
    gh200.gpm = {2: 50.0, 102: 1000.0, 103: 3000.0}
    h100 = FakeGpu(gpm={2: 50.0, 102: 7.0, 103: 7.0})
    nvml = make_fake_nvml([gh200, h100])
    collector = open_gpu_collector(nvml)
    builder = WindowBuilder("n1", "s1", 1)
    for t in range(3):
        builder.add(collector.sample(), float(t))
    assert nvml.calls.count("gpm_metrics") == 4  # type: ignore[attr-defined]  # one per GPU a tick, after the first
    grace, other = builder.close(0, 0.0, 2.0, []).gpus
    assert grace.c2c_tx_bps is not None and grace.c2c_rx_bps is not None
    # 1000 and 3000 MiB/s, to the four significant digits a window keeps
    assert (grace.c2c_tx_bps.mean, grace.c2c_rx_bps.mean) == (1.049e9, 3.146e9)
    assert other.c2c_tx_bps is None and other.c2c_rx_bps is None and other.sm_active is not None


def test_a_driver_sentinel_in_one_field_leaves_that_field_unread_not_the_node_without_gpus() -> None:
    """NVML's unsigned fields read 0xFFFFFFFF for "not available": a GH200 whose C2C links say 4,294,967,295 MB/s
    each (43 PB/s together, over the schema's 10 TB/s) and whose power limit says 4,294,967 W. Deliberate bugs
    caught: a birth's power limit unbounded (the optimizer would divide the GPU's power by 4.3 MW);
    the collector building ``GpuInfo`` directly, so the refused figure raised out of ``inventory`` and the
    agent published a birth with no GPU at all (its last inventory, empty at start)."""
    gh200 = FakeGpu(name="NVIDIA GH200 480GB", pci_device_id=0x234210DE, c2c_mb_per_s=[0xFFFFFFFF] * 10)
    gh200.power_limit_mw = 0xFFFFFFFF
    collector = open_gpu_collector(make_fake_nvml([gh200, FakeGpu()]))
    assert isinstance(collector, NvmlGpuCollector)
    for _ in range(2):  # each birth counts again; the second says nothing new in the log
        first, second = collector.inventory().gpus
    assert (first.c2c_links, first.c2c_max_bps, first.power_limit_w) == (10, None, None)
    assert first.model == "NVIDIA GH200 480GB" and second.power_limit_w == 700.0
    text = render(collector.metrics())
    assert 'fleetfit_agent_gpu_fields_refused_total{field="c2c_max_bps"} 2' in text
    assert 'fleetfit_agent_gpu_fields_refused_total{field="power_limit_w"} 2' in text


@pytest.mark.parametrize("limit", [-700.0, 4_294_967.295])
def test_a_birth_with_a_power_limit_no_gpu_has_is_refused_and_counted(limit: float) -> None:
    """Deliberate bug caught: the birth's power limit bounded less than the window's (0 to 10 kW): a negative one
    would make the GPU's power per limit negative wherever its windows carry no limit of their own."""
    fleet = Fleet("fleetfit/v1")
    good = _birth(
        [GpuInfo(index=0, uuid="GPU-0", model="NVIDIA H100 80GB HBM3", memory_mib=81_559, power_limit_w=700.0)]
    )
    raw = json.loads(encode(good))
    raw["gpus"][0]["power_limit_w"] = limit
    assert fleet.ingest("fleetfit/v1/s1/n1/birth", json.dumps(raw).encode()) is None
    assert fleet.rejected == {"schema": 1}
    assert fleet.ingest("fleetfit/v1/s1/n1/birth", encode(good)) is not None


def test_a_birth_with_an_implausible_c2c_bandwidth_is_refused_and_counted() -> None:
    fleet = Fleet("fleetfit/v1")
    good = _birth([GpuInfo(index=0, uuid="GPU-0", model="NVIDIA GH200 480GB", memory_mib=97_871, c2c_links=10)])
    raw = json.loads(encode(good))
    raw["gpus"][0]["c2c_max_bps"] = -1.0
    assert fleet.ingest("fleetfit/v1/s1/n1/birth", json.dumps(raw).encode()) is None
    assert fleet.rejected == {"schema": 1}
    assert fleet.ingest("fleetfit/v1/s1/n1/birth", encode(good)) is not None


# ---------------------------------------------------------------- GPM SM occupancy


def test_sm_occupancy_comes_in_the_gpm_call_already_made_and_reaches_the_optimizer() -> None:
    """Deliberate bugs caught: reading SM occupancy in a GPM call of its own (two nvmlGpmMetricsGet a tick per
    GPU rather than one); a GPU whose GPM lacks the metric losing its other GPM figures; the optimizer's window
    reader without the field (every window from a Hopper GPU refused as unknown)."""
    gpus = [FakeGpu(gpm={1: 80.0, 2: 71.5, 3: 38.0, 5: 44.0, 10: 30.25}), FakeGpu(gpm={2: 60.0, 5: 10.0})]
    nvml = make_fake_nvml(gpus)
    collector = open_gpu_collector(nvml)
    builder = WindowBuilder("n1", "s1", 1)
    builder.add(collector.sample(), 0.0)  # GPM needs two samples
    nvml.calls.clear()  # type: ignore[attr-defined]
    gpus[0].gpm[3] = 42.0
    builder.add(collector.sample(), 1.0)
    assert nvml.calls.count("gpm_metrics") == 2  # type: ignore[attr-defined]  # one per GPU, as before
    gpus[0].gpm[3] = 46.0
    builder.add(collector.sample(), 2.0)
    window = builder.close(0, 0.0, 2.0, [])
    hopper, older = window.gpus
    assert hopper.sm_occupancy is not None and (hopper.sm_occupancy.mean, hopper.sm_occupancy.max) == (44.0, 46.0)
    assert older.sm_occupancy is None and older.sm_active is not None and older.sm_active.mean == 60.0
    read = read_window(encode(window))
    assert read.gpus[0].sm_occupancy == (44.0, 46.0, 46.0, 2.0)


@pytest.mark.parametrize("stats", [[50.0, 60.0, 40.0, 1.0], [150.0, 150.0, 150.0, 0.0]])
def test_an_sm_occupancy_no_agent_computes_is_refused_and_counted(stats: list[float]) -> None:
    """Deliberate bug caught: SM occupancy left out of the percentages a window's check orders and bounds (a mean
    above its max, or 150 %, would reach the classifier)."""
    builder = WindowBuilder("n1", "s1", 1)
    window = json.loads(encode(builder.close(0, 0.0, 10.0, [])))
    window["gpus"] = [{"index": 0, "sm_occupancy": stats}]
    fleet = Fleet("fleetfit/v1")
    assert fleet.ingest("fleetfit/v1/s1/n1/telemetry", json.dumps(window).encode()) is None
    assert fleet.rejected == {"schema": 1}


# ---------------------------------------------------------------- AMD memory partitions and physical GPUs


def _amd(gpus: list[FakeAmdGpu], root: Path, clock: Clock | None = None) -> tuple[object, object]:
    smi = make_fake_amdsmi(gpus)
    collector = open_amd_collector(smi, Attributor(root, node="n1"), clock=clock or Clock())
    assert collector is not None
    return smi, collector


def test_mi300x_in_cpx_and_nps4_say_their_memory_mode_and_gpu_and_the_mode_is_read_once(tmp_path: Path) -> None:
    """Deliberate bugs caught: asking only each device for its memory mode (seven of a GPU's eight CPX partitions
    answer NOT_SUPPORTED, so they would carry none); reading it per tick rather than with the inventory."""
    gpus = [p for i in range(2) for p in partitions(FakeAmdGpu(memory_partition="NPS4"), "CPX", 8, 0x05 + i)]
    gpus += [FakeAmdGpu(bdf="0000:40:00.0"), FakeAmdGpu(market_name="AMD Instinct MI210", device_id=0x740F)]
    gpus[-1].unsupported.add("memory_partition")  # no memory partitions on an MI210
    smi, collector = _amd(gpus, tmp_path)
    inv = collector.inventory()  # type: ignore[attr-defined]
    assert [g.memory_partition for g in inv.gpus] == ["NPS4"] * 16 + ["NPS1", None]
    assert [g.physical for g in inv.gpus] == [0] * 8 + [8] * 8 + [None, None]
    assert layout(_birth(inv.gpus)).gpus == 4
    reads = smi.calls["memory_partition"]  # type: ignore[attr-defined]
    for _ in range(3):
        collector.sample()  # type: ignore[attr-defined]
    assert smi.calls["memory_partition"] == reads  # type: ignore[attr-defined]


def test_a_memory_partition_change_is_seen_at_the_next_check(tmp_path: Path) -> None:
    """Deliberate bug caught: the memory mode left out of what the periodic check compares: `amd-smi set
    --memory-partition NPS4` would leave the birth saying NPS1 until something else changed."""
    clock = Clock()
    gpu = FakeAmdGpu(bdf="0000:05:00.0")
    _, collector = _amd([gpu], tmp_path, clock)
    assert collector.inventory().gpus[0].memory_partition == "NPS1"  # type: ignore[attr-defined]
    gpu.memory_partition = "NPS4"
    clock.now += RESCAN_S
    collector.sample()  # type: ignore[attr-defined]
    assert collector.inventory().gpus[0].memory_partition == "NPS4"  # type: ignore[attr-defined]
    assert collector.generation == 1  # type: ignore[attr-defined]


def test_partitions_of_a_gpu_amdsmi_cannot_name_the_mode_of_are_counted_as_that_gpu(tmp_path: Path) -> None:
    """Deliberate bugs caught: a partition without a mode named (its GPU's partition query fails and one of its
    eight partitions cannot be read, so seven do not say CPX) counted as a whole GPU: the node read as 8 GPUs,
    not 2; the optimizer counting partitions by their mode's share rather than by the GPU each names."""
    gpus = [p for i in range(2) for p in partitions(FakeAmdGpu(), "CPX", 8, 0x05 + i)]
    for g in gpus:
        g.unsupported.add("partition")  # ROCm releases whose partition query fails on every partition
    gpus[12].unsupported |= {"bdf", "asic"}  # one partition of the second GPU cannot be read
    _, collector = _amd(gpus, tmp_path)
    inv = collector.inventory()  # type: ignore[attr-defined]
    assert len(inv.gpus) == 15 and [f.index for f in inv.gpu_failures] == [12]
    assert [g.mig_profile for g in inv.gpus] == ["CPX"] * 8 + [None] * 7
    assert {g.physical for g in inv.gpus} == {0, 8}
    birth = _birth(inv.gpus)
    lay = layout(birth)
    assert lay.gpus == 2
    assert [lay.devices[i].unit for i in (0, 8)] == [1 / 8, 1 / 7]  # CPX's share; else the partitions listed
    fleet = Fleet("fleetfit/v1", limits=IngestLimits(inventory=inventory_check(CATALOG, 16)))
    assert fleet.ingest("fleetfit/v1/s1/n1/birth", encode(birth)) is not None and not fleet.rejected


def test_a_second_vendors_partitions_name_their_gpu_by_its_shifted_index(tmp_path: Path) -> None:
    """Deliberate bug caught: the vendor merge shifting indices but not ``physical``: the MI300X partitions
    would name the node's NVIDIA GPUs as their own."""
    nvidia = open_gpu_collector(make_fake_nvml([FakeGpu(), FakeGpu()]))
    _, amd = _amd(partitions(FakeAmdGpu(), "QPX", 4, 0x05), tmp_path)
    merged = GpuVendors([("NVIDIA", nvidia), ("AMD", amd)])  # type: ignore[list-item]
    gpus = {g.index: g for g in merged.inventory().gpus}
    assert [g.physical for g in gpus.values()] == [None, None, 2, 2, 2, 2]
    assert all(gpus[g.physical].model == g.model for g in gpus.values() if g.physical is not None)
    assert layout(_birth(list(gpus.values()))).gpus == 3


@pytest.mark.parametrize(("devices", "named"), [(9, 0), (8, 40)])
def test_a_birth_whose_partitions_name_no_gpu_an_agent_could_see_is_refused(devices: int, named: int) -> None:
    """Deliberate bug caught: ``physical`` taken on trust: nine devices naming one GPU (no GPU has more than eight
    partitions) would count as one GPU and slip under the node's GPU limit; a name no device has would count a
    GPU that is not there."""
    gpus = [
        GpuInfo(
            index=i, uuid=f"p{i}", model="AMD Instinct MI300X", memory_mib=24_576, mig_profile="CPX", physical=named
        )
        for i in range(devices)
    ]
    raw = json.loads(encode(_birth([]))) | {"gpus": [json.loads(g.model_dump_json()) for g in gpus]}
    fleet = Fleet("fleetfit/v1")
    assert fleet.ingest("fleetfit/v1/s1/n1/birth", json.dumps(raw).encode()) is None
    assert fleet.rejected == {"schema": 1}
    raw["gpus"] = [g | {"physical": 0} for g in raw["gpus"][:8]]
    assert fleet.ingest("fleetfit/v1/s1/n1/birth", json.dumps(raw).encode()) is not None


def test_simulated_partitions_name_their_gpu() -> None:
    from agent.sources import simulated_gpus

    node = simulated_gpus("mi300x8:qpx", "n1")
    gpus = node.inventory().gpus
    assert [g.physical for g in gpus] == [4 * (i // 4) for i in range(32)]
    refs: list[WorkloadRef] = node.workloads()
    assert layout(_birth(gpus)).gpus == 8 and refs
