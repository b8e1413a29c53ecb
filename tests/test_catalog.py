"""The hardware catalog against the names real fleets report: exact names and PCI ids, the data-centre GPUs in
service, capabilities a node measured, uncatalogued hardware, and snapshots naming hardware nobody knows."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from conftest import FLEETFIT

from agent.protocol import Birth, FindingKind, GpuInfo, NicInfo, NicKind, NicRole, WorkloadClass
from optimizer.decide.catalog import CatalogError, load_catalog
from optimizer.decide.snapshot import Snapshot, SnapshotNode, SnapshotWorkload, measured, node_hardware
from optimizer.plan.recommend import PlanSettings, plan_snapshot

CATALOG = load_catalog()


@pytest.mark.parametrize(
    ("reported", "key", "memory_gib"),
    [
        ("NVIDIA L40", "l40", 48),  # not an L4
        ("NVIDIA L4", "l4", 24),
        ("NVIDIA L40S", "l40s", 48),
        ("NVIDIA GH200 480GB", "gh200", 96),  # not an H200
        ("NVIDIA H200", "h200", 141),
        ("NVIDIA H100 PCIe", "h100_pcie", 80),  # not an H100 SXM with NVLink
        ("NVIDIA H100 NVL", "h100_nvl", 94),
        ("NVIDIA H100 80GB HBM3", "h100", 80),
        ("NVIDIA A100-SXM4-40GB", "a100_40gb", 40),  # not the 80 GB SXM
        ("NVIDIA A100-PCIE-40GB", "a100_pcie_40gb", 40),
        ("NVIDIA A100 80GB PCIe", "a100_pcie", 80),
        ("NVIDIA A100-SXM4-80GB", "a100", 80),
        ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "h100", 80),  # a MIG slice is its GPU's model
        ("Tesla T4", "t4", 16),
        ("Tesla V100-SXM2-32GB", "v100", 32),
        ("AMD Instinct MI300X", "mi300x", 192),
        ("AMD Instinct MI250X / MI250", "mi250x", 64),  # libdrm's amdgpu.ids spelling
        ("NVIDIA GeForce RTX 4090", "rtx4090", 24),
        ("NVIDIA RTX 6000 Ada Generation", "rtx6000_ada", 48),
        ("NVIDIA RTX A6000", "rtx_a6000", 48),
        ("AMD Instinct MI300A", "mi300a", 128),
        ("AMD Instinct MI355X", "mi355x", 288),
    ],
)
def test_reported_names_match_exactly(reported: str, key: str, memory_gib: int) -> None:
    entry = CATALOG.lookup(reported)
    assert entry is not None and (entry.key, entry.memory_gib) == (key, memory_gib)


def test_the_data_centre_gpus_in_service_are_catalogued_with_their_pci_ids() -> None:
    for name in (
        "NVIDIA B200", "NVIDIA GB200", "NVIDIA H20", "NVIDIA H800", "NVIDIA A800-SXM4-80GB", "NVIDIA L20",
        "NVIDIA A10", "NVIDIA A10G", "NVIDIA A30", "NVIDIA A40", "AMD Instinct MI210", "AMD Instinct MI250X",
        "AMD Instinct MI325X", "Intel Gaudi 2", "Intel Gaudi 3",
    ):  # fmt: skip
        assert CATALOG.lookup(name) is not None, name
    assert all(g.pci_ids for g in CATALOG.gpu)
    entry = CATALOG.lookup("GPU 0000:17:00.0", "0x26B510DE")  # the PCI id wins over an unhelpful name
    assert entry is not None and entry.key == "l40"
    assert CATALOG.lookup("NVIDIA L40G") is None  # near names are not guessed


@pytest.mark.parametrize(
    ("reported", "pci_id", "key", "memory_gib"),
    [
        ("Tesla V100-PCIE-16GB", "0x1db410de", "v100_pcie_16gb", 16),  # not the 32 GB card
        ("Tesla V100-PCIE-16GB", None, "v100_pcie_16gb", 16),
        ("AMD MI300X-O", "0x74b51002", "mi300x", 192),  # the SR-IOV function, as amdsmi up to ROCm 6.3 names it
        ("AMD MI300X-O", None, "mi300x", 192),
        ("AMD Instinct MI300X VF", None, "mi300x", 192),
        ("AMD Instinct MI250X", "0x74081002", "mi250x", 64),  # ROCm lists each of the module's two dies
    ],
)
def test_what_the_tools_report_per_device_is_what_the_entry_describes(
    reported: str, pci_id: str | None, key: str, memory_gib: int
) -> None:
    entry = CATALOG.lookup(reported, pci_id)
    assert entry is not None and (entry.key, entry.memory_gib) == (key, memory_gib)


def test_inventory_checks_know_a_gpu_by_its_pci_id_when_its_name_is_unhelpful(tmp_path: Path) -> None:
    """Deliberate bug caught: inventory checks looking the model up by name only. An MI300A (128 GB) named by its
    bus address claiming 200 GiB would pass as an unknown model (cap 512 GiB), and a node the CMDB lists as RTX
    4090s would be flagged and replanned although its PCI ids say RTX 4090."""
    from optimizer.decide.inventory import SiteInventories, inventory_check, read_inventory

    def birth(pci_id: str, memory_mib: int) -> Birth:
        gpu = GpuInfo(index=0, uuid="GPU-0", model="GPU 0000:17:00.0", memory_mib=memory_mib, pci_device_id=pci_id)
        return Birth(node="n1", site="s1", session=1, agent_version="t", hostname="n1", timestamp=1.0, gpus=[gpu])

    check = inventory_check(CATALOG, 16)
    why = check(birth("0x74a01002", 200 * 1024))
    assert why is not None and "more than its 137626" in why  # 128 GiB x 1.05 = 137,625.6 MiB
    assert check(birth("0x74a01002", 128 * 1024)) is None
    csv = tmp_path / "inventory.csv"
    csv.write_text("node,hardware,gpus\nn1,rtx4090,1\n")
    inventories = SiteInventories({"s1": read_inventory(csv, CATALOG)})
    assert inventories.reconcile("s1", birth("0x268410de", 24 * 1024))[1] is None
    assert inventories.reconcile("s1", birth("0x26b110de", 48 * 1024))[1] is not None  # an RTX 6000 Ada is not


def test_an_mi250x_die_costs_and_moves_data_as_half_its_module() -> None:
    # The datasheet's module: 128 GB, 3.2768 TB/s, 383 TFLOPS BF16; street ~$12,000 -> $1.00 an hour
    # (x 2.2 / 26 280 h). A die is half of each.
    die = CATALOG.by_key("mi250x")
    assert (die.memory_gib, die.bandwidth_tbps, die.price_per_gpu_hour) == (64, pytest.approx(1.6384), 0.5)
    assert die.datasheet.bf16_tflops == pytest.approx(383 / 2)
    full = CATALOG.by_key("v100_pcie")
    half = CATALOG.by_key("v100_pcie_16gb")
    assert half.price_per_gpu_hour < full.price_per_gpu_hour and half.memory_gib == full.memory_gib / 2


def test_a_catalog_claiming_one_name_twice_is_refused(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parent.parent / "optimizer" / "decide" / "data" / "catalog.toml").read_text()
    text = text.replace('match = ["NVIDIA L40"]', 'match = ["NVIDIA L40", "NVIDIA L4"]')
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    with pytest.raises(CatalogError, match="'l4' is claimed by both"):
        load_catalog(path)


def test_a_catalog_nested_too_deep_or_carrying_learned_corrections_is_refused(tmp_path: Path) -> None:
    """A catalog nested 20,000 deep is refused in one line naming it, and so is one carrying ``[[learned]]``
    corrections, which come from observed moves only. Deliberate bugs caught: tomllib's RecursionError let
    through; a file's ``[[learned]]`` taken as measured corrections (a thousand accepted, a factor of 4 or more
    among them)."""
    path = tmp_path / "catalog.toml"
    path.write_text("a = " + "[" * 20_000 + "]" * 20_000 + "\n")
    with pytest.raises(CatalogError, match=f"^catalog {path}: nested deeper than 64 tables and arrays$"):
        load_catalog(path)
    text = (Path(__file__).resolve().parent.parent / "optimizer" / "decide" / "data" / "catalog.toml").read_text()
    learned = '[[learned]]\nshape = "compute"\nfrom_key = "h100"\nto_key = "l4"\nfactor = 4.0\nmoves = 9\nhours = 9\n'
    path.write_text(text + "\n" + learned)
    with pytest.raises(CatalogError, match="learned from observed moves, not configured"):
        load_catalog(path)
    path.write_text(text)
    assert not load_catalog(path).learned  # the shipped catalog itself loads


def test_a_snapshot_nested_too_deep_is_refused_in_one_line(tmp_path: Path) -> None:
    """20,000 arrays deep where nodes go: one line naming the file, the CLI's data-error status (1). Deliberate bug
    caught: the file read by a recursive parser with no bound of its own (a RecursionError's traceback)."""
    path = tmp_path / "fleet.json"
    path.write_text('{"nodes":' + "[" * 20_000 + "]" * 20_000 + "}")
    result = subprocess.run([FLEETFIT, "plan", str(path)], capture_output=True, timeout=60, check=False)
    lines = result.stderr.decode().strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1
    assert lines[0].startswith(f"fleetfit: {path}: ") and "recursion limit" in lines[0]


def _birth(model: str, nvlink_links: int, nvswitch: bool | None, nics: list[NicKind]) -> Birth:
    return Birth(
        node="n1", site="s1", session=1, agent_version="x", hostname="h", timestamp=1.0,
        gpus=[GpuInfo(index=i, uuid=f"GPU-{i}", model=model, memory_mib=81920, nvlink_links=nvlink_links,
                      nvswitch=nvswitch) for i in range(8)],
        nics=[NicInfo(name=f"n{i}", kind=k, role=NicRole.EAST_WEST) for i, k in enumerate(nics)],
    )  # fmt: skip


def test_nvlink_and_fabric_come_from_what_the_node_measured() -> None:
    switched = measured(_birth("NVIDIA H100 80GB HBM3", 18, True, [NicKind.INFINIBAND]))
    assert switched == (True, "infiniband")
    bridged = measured(_birth("NVIDIA A100 80GB PCIe", 12, False, [NicKind.ETHERNET]))
    assert bridged == (False, "ethernet")  # bridged pairs are not an NVLink fabric across 8 GPUs
    links_down = measured(_birth("NVIDIA H100 80GB HBM3", 0, None, [NicKind.ROCE]))
    assert links_down == (False, "roce")
    node = SnapshotNode(name="n1", hardware="h100", gpus=8, nvlink=False, fabric="ethernet")
    hw = node_hardware(CATALOG, node)
    assert hw is not None and (hw.nvlink, hw.rdma) == (False, False)
    assert CATALOG.by_key("h100").nvlink  # the catalog itself is untouched


def test_uncatalogued_hardware_is_a_finding_and_planned_around() -> None:
    snapshot = Snapshot(
        site="s1",
        nodes=[
            SnapshotNode(name="mystery-01", hardware="NVIDIA Z900 Prototype", gpus=8),
            SnapshotNode(name="l40s-01", hardware="l40s", gpus=8),
        ],
        workloads=[
            SnapshotWorkload(
                id="k8s/a", name="chat", workload_class=WorkloadClass.INFERENCE, nodes=["mystery-01"], gpus=8,
                mean_util=20,
            ),
            SnapshotWorkload(
                id="k8s/b", name="embed", workload_class=WorkloadClass.INFERENCE, nodes=["l40s-01"], gpus=2,
                mean_util=40,
            ),
        ],
    )  # fmt: skip
    plan = plan_snapshot(snapshot, CATALOG, PlanSettings(time_limit=5))
    (finding,) = [f for f in plan.findings if f.kind is FindingKind.UNCATALOGUED_HARDWARE]
    assert finding.nodes == ["mystery-01"] and "add an entry" in finding.detail
    assert {w.id for w in plan.workloads} == {"k8s/a", "k8s/b"}  # still in the plan, not dropped
    assert all(r.to_node != "mystery-01" and r.workload != "k8s/a" for r in plan.recommendations)


def test_a_node_known_only_by_its_pci_id_is_planned_onto() -> None:
    """Training on L4s and one empty node whose name is unhelpful ("GPU 0000:17:00.0") but whose PCI id is the
    H100 SXM's (0x233010de): the job's findings and the plan read the node alike, so the job moves there, as it
    does when the node is named "h100". Deliberate bug it catches: the plan's node slots matched by name alone (the
    node left out of the plan, the job not moved)."""
    job = SnapshotWorkload(
        id="t", name="t", workload_class=WorkloadClass.TRAINING, nodes=["l4-home"], gpus=4, mem_mib_per_gpu=15_000,
        mean_util=90, p95_util=95,
    )  # fmt: skip
    nodes = [
        SnapshotNode(name="l4-home", hardware="l4", gpus=8),
        SnapshotNode(name="gpu-x", hardware="GPU 0000:17:00.0", gpus=8, pci_id="0x233010de"),
    ]
    plan = plan_snapshot(Snapshot(site="s1", nodes=nodes, workloads=[job]), CATALOG, PlanSettings(time_limit=5))
    assert [(r.workload, r.to_node, r.to_hardware) for r in plan.recommendations] == [("t", "gpu-x", "H100 80GB SXM")]


def test_a_snapshot_naming_unknown_hardware_is_refused_in_one_line(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parent.parent / "docs" / "examples" / "fleet.json"
    raw = json.loads(example.read_text())
    raw["nodes"][2]["hardware"] = "l41"
    broken = tmp_path / "fleet.json"
    broken.write_text(json.dumps(raw))
    result = subprocess.run([FLEETFIT, "plan", str(broken)], capture_output=True, timeout=60, check=False)
    assert result.returncode != 0
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "'l41'" in lines[0] and "nodes.2.hardware" in lines[0]
    raw["nodes"][2]["hardware"] = "l40"  # a catalogued model is accepted
    broken.write_text(json.dumps(raw))
    subprocess.run([FLEETFIT, "plan", str(broken)], capture_output=True, timeout=60, check=True)


def _pci_database() -> dict[str, str]:
    """'0x<device><vendor>' -> the device's name, from the PCI ID database's lines for the catalogued ids."""
    names: dict[str, str] = {}
    vendor = ""
    for line in (Path(__file__).parent / "data" / "pci.ids.excerpt").read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if not line.startswith("\t"):
            vendor = line[:4]
        else:
            names[f"0x{line[1:5]}{vendor}"] = line[5:].strip()
    return names


def test_every_catalogued_pci_id_is_the_model_the_pci_database_names_and_finds_its_entry(tmp_path: Path) -> None:
    """Every PCI id of the catalog, as each vendor's collector reports it under a name no catalog entry matches,
    finds the entry that lists it, and the PCI ID database names that model for the id. Deliberate bugs caught:
    L40S's id mistyped as 0x26b810de (the database's L40G: an L40S would go uncatalogued, an L40G taken for an
    L40S); an AMD or Habana id written in a layout other than the collectors' ("0x10021da3")."""
    from fake_amdsmi import FakeAmdGpu, make_fake_amdsmi
    from fake_hlml import FakeGaudi, make_fake_hlml
    from fake_nvml import FakeGpu, make_fake_nvml

    from collectors.amd import open_amd_collector
    from collectors.attribution import Attributor
    from collectors.gaudi import open_gaudi_collector
    from collectors.gpu import open_gpu_collector

    database = _pci_database()
    ids = {p.lower(): g for g in CATALOG.gpu for p in g.pci_ids}
    for pci_id, entry in ids.items():
        named = database.get(pci_id)
        assert named is not None, f"{entry.key}: {pci_id} is not in the PCI ID database"
        model = entry.name.split()[0].lower()  # "H100", "MI300X", "Gaudi2": the model designation
        assert re.search(rf"\b{re.escape(model)}", named.lower()), f"{entry.key}: {pci_id} is {named!r}"
    by_vendor: dict[str, list[int]] = {}
    for pci_id in ids:
        by_vendor.setdefault(pci_id[6:], []).append(int(pci_id[2:6], 16))
    nvidia = [FakeGpu(name="GPU 0000:17:00.0", pci_device_id=(d << 16) | 0x10DE) for d in by_vendor["10de"]]
    amd = [FakeAmdGpu(market_name="N/A", device_id=d) for d in by_vendor["1002"]]
    gaudi = [FakeGaudi(name=b"HL-000", device_id=d) for d in by_vendor["1da3"]]
    reported = open_gpu_collector(make_fake_nvml(nvidia)).inventory().gpus
    amd_collector = open_amd_collector(make_fake_amdsmi(amd), Attributor(tmp_path))
    gaudi_collector = open_gaudi_collector(make_fake_hlml(gaudi), Attributor(tmp_path))
    assert amd_collector is not None and gaudi_collector is not None
    reported += amd_collector.inventory().gpus + gaudi_collector.inventory().gpus
    assert len(reported) == len(ids)
    for g in reported:
        assert CATALOG.lookup("GPU 0000:17:00.0") is None and g.pci_device_id is not None
        entry = CATALOG.lookup("GPU 0000:17:00.0", g.pci_device_id)
        assert entry is not None and entry is ids[g.pci_device_id], (g.model, g.pci_device_id)
