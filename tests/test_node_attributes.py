"""The rest of the node: CPUs, memory, local NVMe and network storage read by the agent, carried by the birth into
the fleet and the snapshot, and weighed by the planner."""

from __future__ import annotations

from pathlib import Path

import pytest

import optimizer.plan.problem as problem_module
from agent.protocol import Birth, TopicKind, decode, encode, node_topic
from agent.simulate import offline_windows
from collectors.host import HostCollector
from collectors.hostinfo import read_host_info
from collectors.sim.scenarios import ScenarioNode, build_scenario
from optimizer.decide.catalog import load_catalog
from optimizer.decide.snapshot import Snapshot, SnapshotNode, SnapshotWorkload, from_fleet
from optimizer.ingest.fleet import Fleet
from optimizer.ingest.nodeexporter import host_infos
from optimizer.ingest.promapi import Series
from optimizer.plan.model import solve
from optimizer.plan.problem import Host, Movable, Needs, NodeSlot, Problem
from optimizer.plan.recommend import PlanSettings, plan_snapshot
from optimizer.plan.rounding import Candidate, fill, pack

P = "fleetfit/v1"
DRIVE_SECTORS = 7_501_476_528  # a 3.84 TB drive: 3,840,755,982,336 bytes in 512-byte sectors


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _controller(transport: str, speed: str, width: str, namespace: str) -> dict[str, str]:
    return {
        "transport": f"{transport}\n",
        "device/current_link_speed": f"{speed}\n",
        "device/current_link_width": f"{width}\n",
        f"{namespace}/nsid": "1\n",
    }


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    proc, sys = tmp_path / "proc", tmp_path / "sys"
    _write(sys, {"devices/system/cpu/online": "0-111,112-223\n"})
    _write(proc, {"meminfo": "MemTotal:       2113657024 kB\nMemFree:        1000 kB\n"})
    nvme = {
        **{f"class/nvme/nvme0/{k}": v for k, v in _controller("pcie", "16.0 GT/s PCIe", "4", "nvme0n1").items()},
        # a multipath namespace: the controller lists its path, the block device is the head
        **{f"class/nvme/nvme1/{k}": v for k, v in _controller("pcie", "32.0 GT/s PCIe", "4", "nvme1c1n1").items()},
        # NVMe over TCP: storage on the network, not local
        **{f"class/nvme/nvme2/{k}": v for k, v in _controller("tcp", "16.0 GT/s PCIe", "4", "nvme2n1").items()},
        "block/nvme0n1/size": f"{DRIVE_SECTORS}\n",
        "block/nvme1n1/size": f"{DRIVE_SECTORS}\n",
        "block/nvme2n1/size": f"{DRIVE_SECTORS * 10}\n",
    }
    _write(sys, nvme)
    _write(
        proc,
        {
            "self/mountinfo": "\n".join(
                [
                    "22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw",
                    "40 22 0:50 / /datasets rw,relatime shared:30 - nfs4 filer:/datasets rw,vers=4.2",
                    "41 22 0:50 / /datasets rw,relatime shared:30 - nfs4 filer:/datasets rw,vers=4.2",  # bound twice
                    "42 22 0:51 / /mnt/s3\\040bucket rw,nosuid - fuse.mountpoint-s3 mountpoint-s3 rw,user_id=0",
                    "43 22 0:52 / /lustre rw - lustre 10.0.0.1@o2ib:/fs rw",
                    "44 22 0:53 / /proc/cpuinfo rw - fuse.lxcfs lxcfs rw",  # local FUSE: not network storage
                ]
            )
            + "\n"
        },
    )
    return proc, sys


def test_fake_tree_gives_the_node_s_host(tmp_path: Path) -> None:
    """CPUs, MemTotal, local NVMe (NVMe over TCP left out, a multipath namespace found by its head) and network
    mounts (a local FUSE left out, a bind mount once). Deliberate bugs it catches: counting every controller
    whatever its transport (capacity 11 drives), taking each link's rate uncapped (Gen5 x4: 15.75 GB/s, not 14),
    listing every fuse.* type (lxcfs as network storage)."""
    proc, sys = _tree(tmp_path)
    host = read_host_info(proc, sys)
    assert host.cpu_cores == 224
    assert host.memory_mib == 2113657024 // 1024
    assert host.local_nvme_bytes == 2 * DRIVE_SECTORS * 512
    # Gen4 x4 at 1.969 GB/s a lane, Gen5 x4 capped at the 14 GB/s per-drive estimate
    assert host.local_nvme_read_bps == pytest.approx(4 * 1.969e9 + 14e9)
    assert [(m.path, m.fstype) for m in host.network_mounts] == [
        ("/datasets", "nfs4"),
        ("/mnt/s3 bucket", "fuse.mountpoint-s3"),
        ("/lustre", "lustre"),
    ]
    assert HostCollector(proc, sys).inventory().host == host


def test_hostile_or_missing_files_leave_fields_unread(tmp_path: Path) -> None:
    """Garbage in each file gives None for that field, never a wrong number or a traceback. Deliberate bug it
    catches: a link speed that does not parse counted as 0 (the NVMe figure would read as a slow drive)."""
    proc, sys = tmp_path / "proc", tmp_path / "sys"
    _write(sys, {"devices/system/cpu/online": "0-abc\n", "block/nvme0n1/size": "lots\n"})
    _write(sys, {f"class/nvme/nvme0/{k}": v for k, v in _controller("pcie", "Unknown", "x", "nvme0n1").items()})
    _write(proc, {"meminfo": "MemTotal: many kB\n", "self/mountinfo": "\x00\xff garbage - \n - \n"})
    host = read_host_info(proc, sys)
    assert (host.cpu_cores, host.memory_mib, host.local_nvme_bytes, host.local_nvme_read_bps) == (None,) * 4
    assert host.network_mounts == []
    nothing = read_host_info(tmp_path / "none", tmp_path / "none")
    assert (nothing.cpu_cores, nothing.memory_mib, nothing.local_nvme_bytes) == (None, None, None)


def _thin(node: ScenarioNode) -> ScenarioNode:
    return ScenarioNode(node.name, node.profile, node.workloads, node.misplaced, node.quirks | {"thin_host"})


def test_birth_carries_the_host_into_the_fleet_and_the_snapshot() -> None:
    """A simulated DGX H100 and a thin H100 node: their births round-trip the wire and the snapshot carries their
    CPUs, memory, NVMe and network storage. Deliberate bug it catches: the birth built without ``host``."""
    dgx = next(n for n in build_scenario("training-heavy", 4) if n.profile == "h100")
    thin = _thin(ScenarioNode("h100-thin", "h100", (), frozenset()))
    fleet = Fleet(P)
    for node in (dgx, thin):
        birth, _ = offline_windows(node, 1, site="s1")
        again = decode(TopicKind.BIRTH, encode(birth))
        assert isinstance(again, Birth) and again.host == birth.host
        assert fleet.ingest(node_topic(P, "s1", node.name, TopicKind.BIRTH), encode(birth))
    nodes = {n.name: n for n in from_fleet(fleet, "s1", []).nodes}
    big, small = nodes[dgx.name], nodes["h100-thin"]
    # DGX H100 User Guide: 224 logical CPUs, 2 TB, 8 x 3.84 TB NVMe
    assert (big.cpu_cores, big.memory_gib, big.local_nvme_tb) == (224, 2048.0, 30.72)
    assert big.local_nvme_read_gbps == pytest.approx(8 * 4 * 1.969, abs=0.01)
    assert (small.cpu_cores, small.local_nvme_tb, small.network_storage) == (64, 0.0, True)


def _job(wid: str, node: str, cls: str = "training", pinned: bool = False, **more: object) -> SnapshotWorkload:
    return SnapshotWorkload.model_validate(
        {"id": wid, "name": wid, "class": cls, "nodes": [node], "gpus": 4, "mem_mib_per_gpu": 15_000.0,
         "mean_util": 90.0, "p95_util": 95.0, "pinned": pinned, **more}
    )  # fmt: skip


def _h100(name: str, cpus: int) -> SnapshotNode:
    return SnapshotNode(name=name, hardware="h100", gpus=8, cpu_cores=cpus, local_nvme_tb=30.72 if cpus > 64 else 0)


def test_a_starved_job_never_goes_to_a_node_with_too_few_cores() -> None:
    """Training that needs 16 cores per GPU, misplaced on L4s, with four thin H100 nodes (8 per GPU, pooled) and
    one DGX: it goes to the DGX, and with the DGX full it stays, saying why. Deliberate bug it catches: ``needs``
    not checked (it lands on a thin node: the pool's name sorts first)."""
    thin = [_h100(f"h100-a{i}", 64) for i in range(4)]
    home = SnapshotNode(name="l4-home", hardware="l4", gpus=8, cpu_cores=64)
    starved = _job("starved", "l4-home", needs={"cpu_cores_per_gpu": 16})
    plan = plan_snapshot(
        Snapshot(site="s1", nodes=[home, *thin, _h100("h100-z", 224)], workloads=[starved]),
        load_catalog(),
        PlanSettings(),
    )
    assert [(r.workload, r.to_node) for r in plan.recommendations] == [("starved", "h100-z")]
    full = _job("pinned", "h100-z", pinned=True, gpus=8)
    plan = plan_snapshot(
        Snapshot(site="s1", nodes=[home, *thin, _h100("h100-z", 224)], workloads=[starved, full]),
        load_catalog(),
        PlanSettings(),
    )
    assert plan.recommendations == []
    (blocked,) = plan.blocked
    assert "16 CPU cores per GPU" in blocked.reason


def test_a_starved_job_with_no_node_giving_its_cores_says_so() -> None:
    """The same job with only the thin H100 nodes (64 cores / 8 GPUs = 8 per GPU, under its 16): it stays, and the
    reason names the need no H100 node of the site meets, not a lack of room (they are empty). Deliberate bug it
    catches: the nodes' hosts not checked against its needs in ``_why_stays`` ("no free H100 capacity")."""
    thin = [_h100(f"h100-a{i}", 64) for i in range(4)]
    home = SnapshotNode(name="l4-home", hardware="l4", gpus=8, cpu_cores=64)
    starved = _job("starved", "l4-home", needs={"cpu_cores_per_gpu": 16})
    plan = plan_snapshot(Snapshot(site="s1", nodes=[home, *thin], workloads=[starved]), load_catalog(), PlanSettings())
    assert plan.recommendations == []
    (blocked,) = plan.blocked
    assert "node in site s1 known to give it 16 CPU cores per GPU" in blocked.reason


def test_the_starting_placements_respect_needs_too() -> None:
    """At fleet scale the plan may be a starting placement rather than CP-SAT's: the greedy pass, the LP's packing
    and the filling never send the job to a thin node either. Deliberate bugs it catches: the greedy's ``allowed``
    ignoring needs (the thin node is the roomiest, which the greedy takes), the packing's best fit ignoring
    ``barred`` (the thin node is the better fit: exactly the room the job needs)."""
    nodes = [
        NodeSlot("l4-home", "l4", 8, Host(8, True)),
        NodeSlot("h100-thin", "h100", 8, Host(8, False)),
        NodeSlot("h100-dgx", "h100", 8, Host(28, True)),
    ]
    job = _job("starved", "l4-home", needs={"cpu_cores_per_gpu": 16})
    problem = Problem(
        nodes=nodes,
        fixed_usage={"h100-dgx": 4},
        movable=[Movable("starved", "l4-home", job.demand, 10.0, needs=Needs(16))],  # a month's saving covers it
        exact_model_limit=0,
        bound_tolerance=1.0,  # the start is the plan
    )
    solution = solve(load_catalog(), problem)
    assert solution.report.status == "HEURISTIC"
    assert solution.placement["starved"] == "h100-dgx"
    by_type = {"l4": (2_000.0, 4), "h100": (1_000.0, 4)}
    hardware = {n.name: n.hardware for n in nodes}
    room = {"l4-home": 4, "h100-thin": 4, "h100-dgx": 6}
    c = Candidate("starved", "l4-home", "l4", 4, None, by_type, {"h100": 1.0}, frozenset({"l4-home", "h100-thin"}))
    assert pack([c], room, hardware, 5)["starved"] == ("h100-dgx", 4)
    room["l4-home"] = 8
    assert fill([c], {"starved": "l4-home"}, room, hardware, 5, {"starved": 10.0})["starved"] == "h100-dgx"


def test_mixed_node_penalty_decides_between_equal_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two H100 nodes with four GPUs free each, one beside a pinned online service, the other beside a batch job:
    the training moves beside the batch job, and so it does where the service is not pinned but has nowhere
    better to go. Deliberate bugs it catches: no penalty (the service's node, whose name sorts first, is taken);
    only pinned neighbours counted."""
    nodes = [
        SnapshotNode(name=n, hardware=h, gpus=8) for n, h in (("l4", "l4"), ("h100-a", "h100"), ("h100-b", "h100"))
    ]
    workloads = [
        _job("job", "l4"),
        _job("chat", "h100-a", cls="inference", pinned=True),
        _job("score", "h100-b", cls="batch_inference", pinned=True),
    ]
    snapshot = Snapshot(site="s1", nodes=nodes, workloads=workloads)
    plan = plan_snapshot(snapshot, load_catalog(), PlanSettings())
    assert [(r.workload, r.to_node) for r in plan.recommendations] == [("job", "h100-b")]
    # the service unpinned, but too busy for any other hardware of the site: it stays, and still counts
    busy = workloads[1].model_copy(update={"pinned": False})
    unpinned = snapshot.model_copy(update={"workloads": [workloads[0], busy, workloads[2]]})
    plan = plan_snapshot(unpinned, load_catalog(), PlanSettings())
    assert [(r.workload, r.to_node) for r in plan.recommendations] == [("job", "h100-b")]
    monkeypatch.setattr(problem_module, "MIXED_NODE_PENALTY", 0.0)
    plan = plan_snapshot(snapshot, load_catalog(), PlanSettings())
    assert [(r.workload, r.to_node) for r in plan.recommendations] == [("job", "h100-a")]


def test_the_greedy_start_avoids_the_mixed_node_too() -> None:
    """Where the plan is the starting placement (fleet scale), the greedy pass takes the node without online
    serving among equally roomy ones. Deliberate bug it catches: the greedy taking the first node with room (the
    service's, whose name sorts first)."""
    nodes = [
        NodeSlot("l4-home", "l4", 8),
        NodeSlot("h100-a", "h100", 8, Host(serving=True)),
        NodeSlot("h100-b", "h100", 8, Host()),
    ]
    job = _job("job", "l4-home")
    problem = Problem(
        nodes=nodes,
        fixed_usage={"h100-a": 4, "h100-b": 4},
        movable=[Movable("job", "l4-home", job.demand, 10.0)],
        exact_model_limit=0,
        bound_tolerance=1.0,
    )
    solution = solve(load_catalog(), problem)
    assert (solution.report.status, solution.placement["job"]) == ("HEURISTIC", "h100-b")


def test_a_service_that_scales_with_load_prefers_local_nvme() -> None:
    """A chat service misplaced on H100s, two equal L40S targets but for local NVMe: it goes to the one with NVMe,
    and without the flag name order decides. Deliberate bug it catches: the cold-start term left out."""
    nodes = [
        SnapshotNode(name="h100", hardware="h100", gpus=8),
        SnapshotNode(name="l40s-a", hardware="l40s", gpus=8, local_nvme_tb=0.0),
        SnapshotNode(name="l40s-b", hardware="l40s", gpus=8, local_nvme_tb=7.68),
    ]
    for scales, target in ((True, "l40s-b"), (False, "l40s-a")):
        service = _job("chat", "h100", cls="inference", mean_util=5.0, p95_util=10.0, scales_with_load=scales)
        plan = plan_snapshot(Snapshot(site="s1", nodes=nodes, workloads=[service]), load_catalog(), PlanSettings())
        assert [r.to_node for r in plan.recommendations if r.kind == "move"] == [target]


def test_node_exporter_series_give_an_agentless_node_s_host() -> None:
    """node_exporter's series joined to dcgm-exporter's node names through node_uname_info (an FQDN's first label),
    or the instance's host part where uname is not scraped; an instance naming no node and a figure out of range
    are counted, not taken. Deliberate bugs it catches: joining on the instance alone (10.0.0.5:9100 names no
    node), a node whose disks are read and none is NVMe left unread instead of 0."""
    t = [1_000.0]
    answers = {
        "names": [Series({"instance": "10.0.0.5:9100", "nodename": "gpu-17.cluster.local"}, t, [1.0])],
        "cpus": [
            Series({"instance": "10.0.0.5:9100"}, t, [224.0]),
            Series({"instance": "gpu-18:9100"}, t, [64.0]),
            Series({"instance": "stranger:9100"}, t, [8.0]),
        ],
        "memory": [
            Series({"instance": "10.0.0.5:9100"}, t, [2.0 * 2**40]),
            Series({"instance": "gpu-18:9100"}, t, [1e30]),
        ],
        "network": [Series({"instance": "10.0.0.5:9100", "mountpoint": "/datasets", "fstype": "nfs4"}, t, [1e14])],
        "disks": [
            *(Series({"instance": "10.0.0.5:9100", "device": d}, t, [1.0]) for d in ("nvme0n1", "nvme1n1", "sda")),
            Series({"instance": "gpu-18:9100", "device": "sda"}, t, [1.0]),
        ],
        "nvme_fs": [
            Series({"instance": "10.0.0.5:9100", "device": "/dev/nvme0n1p1"}, t, [3.84e12]),
            Series({"instance": "10.0.0.5:9100", "device": "/dev/nvme1n1"}, t, [3.84e12]),
        ],
    }
    hosts, skipped = host_infos(answers, ["gpu-17", "gpu-18"])
    big, small = hosts["gpu-17"], hosts["gpu-18"]
    assert (big.cpu_cores, big.memory_mib, big.local_nvme_bytes) == (224, 2 * 2**20, int(7.68e12))
    assert big.local_nvme_read_bps is None  # node_exporter exports no PCIe link
    assert [(m.path, m.fstype) for m in big.network_mounts] == [("/datasets", "nfs4")]
    assert (small.cpu_cores, small.memory_mib, small.local_nvme_bytes) == (64, None, 0)
    assert skipped == {"host_instance": 1, "host_value": 1}


def test_a_tiny_memtotal_keeps_the_node_in_the_snapshot() -> None:
    """An agent (or node_exporter) reporting MemTotal of 50 MiB, which the wire accepts (1 MiB and up): the node
    stays in the snapshot with 50 / 1024 = 0.049 GiB. Deliberate bug it catches: the figure rounded to tenths
    (0.0, which the snapshot's field refuses: the whole site's snapshot raises and the daemon plans without the
    node)."""
    fleet = Fleet(P)
    birth, _ = offline_windows(ScenarioNode("h100-tiny", "h100", (), frozenset()), 1, site="s1")
    assert birth.host is not None
    birth = birth.model_copy(update={"host": birth.host.model_copy(update={"memory_mib": 50})})
    assert fleet.ingest(node_topic(P, "s1", "h100-tiny", TopicKind.BIRTH), encode(birth))
    (node,) = from_fleet(fleet, "s1", []).nodes
    assert (node.name, node.gpus, node.memory_gib) == ("h100-tiny", 8, 0.049)
