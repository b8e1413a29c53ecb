"""Collectors on fixture trees and a fake NVML; the psutil-backed ones on this machine."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest
from fake_nvml import FakeGpu, make_fake_nvml

from agent.protocol import NicKind, NicRole, WorkloadKind
from collectors.attribution import Attributor, owner_from_cgroup
from collectors.base import Entity
from collectors.gpu import NullGpuCollector, NvmlGpuCollector, open_gpu_collector
from collectors.host import CpuBusy, HostCollector, memory_used_percent
from collectors.nic import NetDev, NicCollector, classify_interface, role_of
from collectors.storage import StorageCollector


def _net(root: Path, name: str, arp_type: int, device: bool = False, rdma: bool = False) -> None:
    base = root / "class" / "net" / name
    base.mkdir(parents=True)
    (base / "type").write_text(f"{arp_type}\n")
    if device:
        (base / "device").mkdir()
    if rdma:
        (base / "device" / "infiniband").mkdir()


def test_interfaces_are_classified_from_sysfs(tmp_path: Path) -> None:
    _net(tmp_path, "lo", 772)
    _net(tmp_path, "ib0", 32, device=True)
    _net(tmp_path, "ens1f0", 1, device=True, rdma=True)
    _net(tmp_path, "eth0", 1, device=True)
    _net(tmp_path, "cni0", 1)
    kinds = {n: classify_interface(n, tmp_path) for n in ("lo", "ib0", "ens1f0", "eth0", "cni0")}
    assert kinds == {
        "lo": NicKind.LOOPBACK,
        "ib0": NicKind.INFINIBAND,
        "ens1f0": NicKind.ROCE,
        "eth0": NicKind.ETHERNET,
        "cni0": NicKind.VIRTUAL,
    }
    assert role_of("ib0", NicKind.INFINIBAND, []) is NicRole.EAST_WEST
    assert role_of("ens1f0", NicKind.ROCE, []) is NicRole.EAST_WEST
    assert role_of("eth0", NicKind.ETHERNET, []) is NicRole.NORTH_SOUTH
    assert role_of("fab0", NicKind.ETHERNET, ["fab*"]) is NicRole.EAST_WEST
    assert role_of("cni0", NicKind.VIRTUAL, []) is NicRole.OTHER


def test_real_nics_disks_and_host_are_sampled() -> None:
    nic, disk, host = NicCollector(), StorageCollector(), HostCollector()
    assert all(n.kind not in (NicKind.LOOPBACK, NicKind.VIRTUAL) for n in nic.inventory().nics)
    assert all(not d.name.startswith(("loop", "ram")) for d in disk.inventory().disks)
    for collector, entity, names in (
        (nic, Entity.NIC, {n.name for n in nic.inventory().nics}),
        (disk, Entity.DISK, {d.name for d in disk.inventory().disks}),
    ):
        samples = collector.sample()
        assert samples, f"this machine has a {entity.value}"
        assert all(s.entity is entity and s.key in names and s.counters for s in samples)
    (h,) = host.sample()
    assert 0 <= h.gauges["mem_used_pct"] <= 100


def test_cgroup_paths_map_to_workloads() -> None:
    pod = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_5f60_4a1b_8c2d_3e4f5a6b7c8d.slice/cri-containerd-0123456789abcdef.scope"
    assert owner_from_cgroup(pod) == (
        "k8s/1b2c3d4e-5f60-4a1b-8c2d-3e4f5a6b7c8d",
        WorkloadKind.KUBERNETES_POD,
        "pod 1b2c3d4e-5f60-4a1b-8c2d-3e4f5a6b7c8d",
    )
    slurm = owner_from_cgroup("/system.slice/slurmstepd.scope/job_48151/step_0/user/task_0")
    assert slurm is not None and slurm[:2] == ("slurm/48151", WorkloadKind.SLURM_JOB)
    docker = owner_from_cgroup("/system.slice/docker-4f3c2b1a0e9d8c7b6a5f4e3d2c1b0a9f.scope")
    assert docker is not None and docker[:2] == ("container/4f3c2b1a0e9d", WorkloadKind.CONTAINER)
    unit = owner_from_cgroup("/system.slice/vllm-serve.service")
    assert unit is not None and unit[:2] == ("systemd/vllm-serve.service", WorkloadKind.SYSTEMD_UNIT)
    assert owner_from_cgroup("/user.slice/user-1000.slice/session-3.scope") is None


def test_user_services_are_workloads_of_their_own() -> None:
    # `systemctl --user start jupyter`: the service runs under the user's systemd instance, user@1000.service
    user = "/user.slice/user-1000.slice/user@1000.service/app.slice/jupyter.service"
    assert owner_from_cgroup(user) == (
        "systemd/user@1000.service/jupyter.service",
        WorkloadKind.SYSTEMD_UNIT,
        "jupyter.service (user 1000)",
    )
    other = owner_from_cgroup("/user.slice/user-1001.slice/user@1001.service/app.slice/jupyter.service")
    assert other is not None and other[0] == "systemd/user@1001.service/jupyter.service"  # not merged across users
    templated = owner_from_cgroup("/user.slice/user-1000.slice/user@1000.service/app.slice/app-train@7.service")
    assert templated is not None and templated[0] == "systemd/user@1000.service/app-train@7.service"
    manager = owner_from_cgroup("/user.slice/user-1000.slice/user@1000.service/init.scope")
    assert manager is not None and manager[0] == "systemd/user@1000.service"


def _proc(root: Path, pid: int, cgroup: str, comm: str, pgid: int) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cgroup").write_text(f"0::{cgroup}\n")
    (d / "comm").write_text(f"{comm}\n")
    (d / "stat").write_text(f"{pid} ({comm} x) S 1 {pgid} {pgid} 0 -1\n")
    (d / "cmdline").write_text("python\0train.py\0--wandb-key=SECRET\0")


def test_attribution_reads_cgroup_and_exe_name_never_the_command_line(tmp_path: Path) -> None:
    _proc(tmp_path, 100, "/system.slice/slurmstepd.scope/job_7/step_0", "torchrun", 100)
    _proc(tmp_path, 200, "/user.slice/user-1000.slice/session-3.scope", "python3", 190)
    a = Attributor(tmp_path, node="n1")
    slurm = a.owner(100)
    assert (slurm.id, slurm.hint) == ("slurm/7", "torchrun")
    loose = a.owner(200)
    assert (loose.id, loose.kind) == ("pgid/n1/190", WorkloadKind.PROCESS_GROUP)
    assert "SECRET" not in repr(slurm) + repr(loose)


def test_no_driver_disables_the_gpu_collector_with_a_reason() -> None:
    collector = open_gpu_collector(make_fake_nvml([], init_error=12))  # 12 = LIBRARY_NOT_FOUND: no driver
    assert isinstance(collector, NullGpuCollector)
    assert "NVML unavailable" in (collector.inventory().gpu_unavailable or "")
    assert collector.sample() == []


def test_gpu_inventory_samples_and_attribution(tmp_path: Path) -> None:
    _proc(tmp_path, 4242, "/kubepods/besteffort/pod0a1b2c3d-0000-4000-8000-000000000001/abc", "vllm", 4242)
    gpus = [FakeGpu(pids=[4242]), FakeGpu(pids=[4242], unsupported={"power"})]
    collector = open_gpu_collector(make_fake_nvml(gpus), Attributor(tmp_path, node="n1"))
    assert isinstance(collector, NvmlGpuCollector)
    inv = collector.inventory()
    assert [g.model for g in inv.gpus] == ["NVIDIA H100 80GB HBM3"] * 2
    assert inv.gpus[0].nvlink_links == 18 and inv.gpus[0].memory_mib == 80 * 1024
    assert inv.driver_version == "550.54.15" and inv.cuda_version == "12.4"
    before, _ = collector.sample()
    gpus[0].pcie_tx, gpus[0].nvlink_kib_per_link = 5_000, 2
    first, second = collector.sample()
    assert first.gauges["util"] == 90 and first.gauges["power_w"] == 650
    assert first.counters["pcie_tx_bps"] - before.counters["pcie_tx_bps"] == 5_000
    # summed over links, KiB → bytes
    assert first.counters["nvlink_tx_bps"] - before.counters["nvlink_tx_bps"] == 18 * 2 * 1024
    assert "power_w" not in second.gauges and second.gauges["util"] == 90  # one field unsupported, rest kept
    (w,) = collector.workloads()
    assert w.id == "k8s/0a1b2c3d-0000-4000-8000-000000000001" and w.gpus == [0, 1] and w.hint == "vllm"


def test_a_gpu_lost_from_the_bus_is_reported_not_fatal() -> None:
    gpus = [FakeGpu(), FakeGpu()]
    collector = open_gpu_collector(make_fake_nvml(gpus))
    gpus[1].lost = True
    samples = collector.sample()
    assert samples[0].gauges["util"] == 90
    assert samples[1].gauges == {}


def test_xid_events_ecc_and_remapped_rows_reach_the_window() -> None:
    from agent.protocol import WorkloadRef
    from agent.window import WindowBuilder

    gpus = [FakeGpu(), FakeGpu(ecc_uncorrected=2, remapped_rows=1)]
    nvml = make_fake_nvml(gpus)
    collector = open_gpu_collector(nvml)
    builder = WindowBuilder("n1", "s1", 1)
    builder.add(collector.sample(), 0.0)
    nvml.xid_queue.extend([(gpus[1], 79), (gpus[1], 48)])  # type: ignore[attr-defined]
    builder.add(collector.sample(), 1.0)
    builder.add(collector.sample(), 2.0)
    refs: list[WorkloadRef] = []
    window = builder.close(0, 0.0, 2.0, refs)
    healthy, failing = window.gpus
    assert (healthy.xid_events, healthy.last_xid, healthy.ecc_uncorrected) == (0, None, 0)
    assert (failing.xid_events, failing.last_xid) == (2, 48)
    assert (failing.ecc_uncorrected, failing.remapped_rows) == (2, 1)
    # the next window starts counting afresh
    builder.add(collector.sample(), 3.0)
    assert builder.close(1, 2.0, 3.0, refs).gpus[1].xid_events == 0


def test_gpm_activity_on_hopper_and_none_where_unsupported() -> None:
    gpus = [FakeGpu(gpm={2: 71.5, 5: 44.0, 10: 30.25}), FakeGpu()]
    collector = open_gpu_collector(make_fake_nvml(gpus))
    first = collector.sample()
    assert "sm_active" not in first[0].gauges  # GPM needs two samples
    second = collector.sample()
    assert second[0].gauges["sm_active"] == 71.5
    assert second[0].gauges["tensor_active"] == 44.0
    assert second[0].gauges["dram_active"] == 30.25
    assert "sm_active" not in second[1].gauges


def test_mig_instances_are_devices_of_their_own(tmp_path: Path) -> None:
    _proc(tmp_path, 77, "/system.slice/triton.service", "tritonserver", 77)
    slice_a = FakeGpu(name="NVIDIA H100 80GB HBM3 MIG 3g.40gb", memory_total=40 * 2**30, pids=[77])
    slice_b = FakeGpu(name="NVIDIA H100 80GB HBM3 MIG 3g.40gb", memory_total=40 * 2**30)
    gpus = [FakeGpu(mig=[slice_a, None, slice_b]), FakeGpu()]
    collector = open_gpu_collector(make_fake_nvml(gpus), Attributor(tmp_path, node="n1"))
    inv = collector.inventory()
    assert [(g.index, g.parent, g.mig_profile) for g in inv.gpus] == [
        (0, None, None),
        (1, None, None),
        (2, 0, "3g.40gb"),
        (3, 0, "3g.40gb"),
    ]
    assert inv.gpus[0].mig_mode and inv.gpus[2].memory_mib == 40 * 1024
    assert [s.key for s in collector.sample()] == ["0", "1", "2", "3"]
    (w,) = collector.workloads()
    assert (w.id, w.gpus) == ("systemd/triton.service", [2])


def test_a_disk_whose_partitions_make_a_raid_is_marked_a_member(tmp_path: Path) -> None:
    # the common layout: md0 built on partitions (sda1, sdb1), so the whole disks' own holders are empty
    for disk in ("sda", "sdb", "md0", "nvme0n1"):
        (tmp_path / "block" / disk / "holders").mkdir(parents=True)
    for disk in ("sda", "sdb"):
        (tmp_path / "block" / disk / f"{disk}1" / "holders" / "md0").mkdir(parents=True)
    (tmp_path / "block" / "nvme0n1" / "nvme0n1p1" / "holders").mkdir(parents=True)  # a partition, no RAID
    storage = StorageCollector(sysfs_root=tmp_path)
    storage._counters = lambda: dict.fromkeys(("sda", "sdb", "md0", "nvme0n1"))  # type: ignore[method-assign]
    members = {d.name: d.member_of for d in storage.inventory().disks}
    assert members == {"md0": None, "nvme0n1": None, "sda": "md0", "sdb": "md0"}


def test_disk_counters_are_read_from_every_diskstats_layout(tmp_path: Path) -> None:
    for disk in ("sda", "vdb", "nvme0n1"):
        (tmp_path / "sys" / "block" / disk).mkdir(parents=True)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "diskstats").write_text(
        # 5.5+: 20 fields; reads, sectors read (x 512 bytes), writes, sectors written are fields 4, 6, 8, 10
        "   8       0 sda 100 7 2000 9 300 8 4000 9 0 5 6 0 0 0 0 0 0 0\n"
        "   8       1 sda1 90 7 1800 9 290 8 3900 9 0 5 6 0 0 0 0 0 0 0\n"  # a partition: not a disk
        "   7       0 loop0 5 0 10 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
        " 252      16 vdb 11 0 22 0 33 0 44 0 0 0 0\n"  # 2.6 to 4.17: 14 fields
        " 259       0 nvme0n1 1 2 3 4\n"  # 2.6's short form (partitions): reads, sectors read, writes, written
    )
    storage = StorageCollector(sysfs_root=tmp_path / "sys", procfs_root=tmp_path / "proc")
    got = {s.key: s.counters for s in storage.sample()}
    assert got == {
        "sda": {"read_iops": 100, "read_bps": 2000 * 512, "write_iops": 300, "write_bps": 4000 * 512},
        "vdb": {"read_iops": 11, "read_bps": 22 * 512, "write_iops": 33, "write_bps": 44 * 512},
        "nvme0n1": {"read_iops": 1, "read_bps": 2 * 512, "write_iops": 3, "write_bps": 4 * 512},
    }


def test_disk_and_memory_figures_agree_with_psutil_on_this_machine() -> None:
    """psutil's own reading of the same files, the independent check; counters only grow between the reads."""
    storage = StorageCollector()
    before = {n: c for n, c in psutil.disk_io_counters(perdisk=True, nowrap=False).items() if storage._is_disk(n)}
    mine = {s.key: s.counters for s in storage.sample()}
    after = {n: c for n, c in psutil.disk_io_counters(perdisk=True, nowrap=False).items() if storage._is_disk(n)}
    assert mine and set(mine) == set(before)
    for name, c in mine.items():
        for field, attr in (("read_bps", "read_bytes"), ("write_bps", "write_bytes"), ("read_iops", "read_count")):
            assert getattr(before[name], attr) <= c[field] <= getattr(after[name], attr)
    meminfo = Path("/proc/meminfo").read_bytes()
    assert (
        memory_used_percent(meminfo) == psutil.virtual_memory().percent
        or abs(memory_used_percent(meminfo) - psutil.virtual_memory().percent) <= 0.2
    )  # memory moves between the two reads


def test_memory_in_use_is_what_is_not_available(tmp_path: Path) -> None:
    meminfo = b"MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:    4000000 kB\nBuffers: 1 kB\n"
    assert memory_used_percent(meminfo) == 75.0  # (16 - 4) / 16
    # more available than there is (a container's distorted view): what is free counts, as psutil and free(1) do
    assert memory_used_percent(meminfo.replace(b"4000000", b"20000000")) == round(15 / 16 * 100, 1)
    (tmp_path / "meminfo").write_bytes(meminfo)
    (h,) = HostCollector(procfs_root=tmp_path).sample()
    assert h.gauges["mem_used_pct"] == 75.0


def test_cpu_busy_is_psutils_figure_from_two_readings(tmp_path: Path) -> None:
    ticks = os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice, in clock ticks; per-CPU lines follow
    stat.write_text(f"cpu  {10 * ticks} 0 {5 * ticks} {80 * ticks} {5 * ticks} 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    cpu = CpuBusy(tmp_path)
    # 1 s user (0.2 s of it a guest's, which the kernel counts in user too), 0.5 s system, 7 s idle, 0.5 s iowait
    stat.write_text(f"cpu  {11 * ticks} 0 {5.5 * ticks:.0f} {87 * ticks} {5.5 * ticks:.0f} 0 0 0 {0.2 * ticks:.0f} 0\n")
    assert cpu.percent() == round(1.5 / 9 * 100, 1)  # busy 1 + 0.5 of 9 s, the guest's 0.2 s counted once
    # iowait going back (a kernel quirk) counts as no time, as in top and psutil
    stat.write_text(f"cpu  {12 * ticks} 0 {5.5 * ticks:.0f} {88 * ticks} {5 * ticks} 0 0 0 {0.2 * ticks:.0f} 0\n")
    assert cpu.percent() == 50.0
    assert cpu.percent() == 0.0  # no time passed


def _net_dev(path: Path, rows: dict[str, tuple[int, int, int, int, int, int]]) -> None:
    """rows: name → (rx bytes, rx errs, rx drop, tx bytes, tx errs, tx drop), in /proc/net/dev's layout."""
    lines = ["Inter-|   Receive                                                |  Transmit\n",
             " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"]  # fmt: skip
    for name, (rx, rerr, rdrop, tx, terr, tdrop) in rows.items():
        lines.append(f"{name:>6}: {rx} 9 {rerr} {rdrop} 0 0 0 0 {tx} 9 {terr} {tdrop} 0 0 0 0\n")
    path.write_text("".join(lines))


def test_interface_counters_are_read_as_psutil_reads_them(tmp_path: Path) -> None:
    (tmp_path / "net").mkdir()
    dev = tmp_path / "net" / "dev"
    _net_dev(dev, {"lo": (5, 0, 0, 5, 0, 0), "eth0": (1000, 1, 2, 3000, 3, 4)})
    net = NetDev(tmp_path)
    assert net.read() == {"lo": (5, 5, 0, 0), "eth0": (1000, 3000, 4, 6)}
    # received bytes went back (a 32-bit counter wrapped, or the driver reset it): as psutil's nowrap, the
    # counter is taken to have wrapped at its last value, which is carried from then on
    _net_dev(dev, {"lo": (5, 0, 0, 5, 0, 0), "eth0": (200, 1, 2, 3500, 3, 4)})
    assert net.read()["eth0"] == (1200, 3500, 4, 6)
    _net_dev(dev, {"lo": (5, 0, 0, 5, 0, 0), "eth0": (300, 1, 2, 3600, 3, 4)})
    assert net.read()["eth0"] == (1300, 3600, 4, 6)
    # an interface gone and back starts afresh
    _net_dev(dev, {"lo": (5, 0, 0, 5, 0, 0)})
    assert set(net.read()) == {"lo"}
    _net_dev(dev, {"lo": (5, 0, 0, 5, 0, 0), "eth0": (10, 0, 0, 20, 0, 0)})
    assert net.read()["eth0"] == (10, 20, 0, 0)
    dev.write_text(dev.read_text() + "garbage: 1 2 3\n")
    with pytest.raises(ValueError, match="net/dev"):
        net.read()


def test_interface_counters_agree_with_psutil_on_this_machine() -> None:
    """psutil's own reading of the same file, the independent check; counters only grow between the reads."""
    before = psutil.net_io_counters(pernic=True)
    mine = NetDev().read()
    after = psutil.net_io_counters(pernic=True)
    assert mine and set(mine) == set(before)
    for name, (rx, tx, errors, drops) in mine.items():
        b, a = before[name], after[name]
        assert b.bytes_recv <= rx <= a.bytes_recv and b.bytes_sent <= tx <= a.bytes_sent
        assert (
            b.errin + b.errout <= errors <= a.errin + a.errout and b.dropin + b.dropout <= drops <= a.dropin + a.dropout
        )


def test_interfaces_and_their_speed_come_from_proc_net_dev_and_sysfs(tmp_path: Path) -> None:
    """The interfaces a birth lists are those of the node's /proc/net/dev (loopback and virtual ones left out),
    each with the speed its driver reports in sysfs, none where the link is down (the file unreadable) or the
    driver does not know (-1). Red when the names or speeds are taken from the machine running the test
    (psutil's view of this host, as before) instead of the collector's roots, or when -1 is passed on."""
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    for name in ("lo", "eth0", "eth1", "eth2", "veth9"):
        _net(sysfs, name, 772 if name == "lo" else 1, device=name != "veth9")
    (sysfs / "class" / "net" / "eth0" / "speed").write_text("25000\n")
    (sysfs / "class" / "net" / "eth2" / "speed").write_text("-1\n")
    (procfs / "net").mkdir(parents=True)
    (procfs / "net" / "dev").write_text(
        "Inter-|   Receive                                                |  Transmit\n"
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls\n"
        + "".join(f"{name:>6}: 10 1 0 0 0 0 0 0 20 2 0 0 0 0 0 0\n" for name in ("lo", "eth0", "eth1", "eth2", "veth9"))
    )
    nics = NicCollector(sysfs_root=sysfs, procfs_root=procfs).inventory().nics
    assert {n.name: n.speed_mbps for n in nics} == {"eth0": 25000, "eth1": None, "eth2": None}


def test_mount_usage_counts_the_blocks_kept_for_root_as_df_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """A volume of 1000 blocks with 300 free, 250 of them free to users: 700 used of the 950 a user can have,
    73.7 % (df's Use%), and 250 blocks free. Red when the root reserve counts as free (f_bfree: 70.0 %, and 50
    blocks more free than a checkpoint written by a service user can take)."""
    blocks = os.statvfs_result((4096, 4096, 1000, 300, 250, 100, 50, 50, 0, 255))
    monkeypatch.setattr(os, "statvfs", lambda path: blocks)
    storage = StorageCollector(sysfs_root=Path("/nonexistent"), mounts=["/ckpt"])
    (mount,) = [s for s in storage.sample() if s.entity is Entity.MOUNT]
    assert mount.latest == {"used_pct": 73.7, "free_bytes": 250 * 4096}


def test_mount_usage_agrees_with_psutil_on_this_machine() -> None:
    """psutil's disk_usage, the independent check, on the root file system; others write to it meanwhile."""
    (mount,) = [s for s in StorageCollector(mounts=["/"]).sample() if s.entity is Entity.MOUNT]
    usage = psutil.disk_usage("/")
    assert abs(mount.latest["used_pct"] - usage.percent) <= 0.1
    assert abs(mount.latest["free_bytes"] - usage.free) <= 256 * 2**20
