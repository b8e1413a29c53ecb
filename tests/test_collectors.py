"""Collectors on fixture trees and a fake NVML; the psutil-backed ones on this machine."""

from __future__ import annotations

from pathlib import Path

from fake_nvml import FakeGpu, make_fake_nvml

from agent.protocol import NicKind, NicRole, WorkloadKind
from collectors.attribution import Attributor, owner_from_cgroup
from collectors.base import Entity
from collectors.gpu import NullGpuCollector, NvmlGpuCollector, open_gpu_collector
from collectors.host import HostCollector
from collectors.nic import NicCollector, classify_interface, role_of
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
    for collector, entity in ((nic, Entity.NIC), (disk, Entity.DISK), (host, Entity.HOST)):
        for sample in collector.sample():
            assert sample.entity is entity
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
    collector = open_gpu_collector(make_fake_nvml([], init_error=9))  # 9 = DRIVER_NOT_LOADED
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
    gpus[0].pcie_tx, gpus[0].nvlink_kib_per_link = 5_000, 2
    first, second = collector.sample()
    assert first.gauges["util"] == 90 and first.gauges["power_w"] == 650
    assert first.counters["pcie_tx_bps"] == 5_000
    assert first.counters["nvlink_tx_bps"] == 18 * 2 * 1024  # summed over links, KiB → bytes
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
