"""Attribution where real nodes differ: Slurm on cgroup v1, static pods, nerdctl and plain containerd, and an
agent that does not share the host's PID namespace."""

from __future__ import annotations

from pathlib import Path

from agent.protocol import WorkloadKind
from collectors.attribution import Attributor, host_pid_namespace, owner_from_cgroup

HEX64 = "4f3c2b1a0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a392817161514131211100f"


def _proc(root: Path, pid: int, cgroup_lines: list[str], comm: str = "python3") -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cgroup").write_text("".join(line + "\n" for line in cgroup_lines))
    (d / "comm").write_text(f"{comm}\n")
    (d / "stat").write_text(f"{pid} ({comm}) S 1 {pid} {pid} 0 -1\n")


def test_slurm_on_cgroup_v1_is_the_job_whatever_the_line_order(tmp_path: Path) -> None:
    unmanaged_first = [
        "12:pids:/system.slice/slurmd.service",
        "11:blkio:/system.slice/slurmd.service",
        "10:memory:/slurm/uid_1000/job_48151/step_0/task_0",
        "9:devices:/slurm/uid_1000/job_48151/step_0",
        "4:cpuset:/slurm/uid_1000/job_48151/step_0",
        "1:name=systemd:/system.slice/slurmd.service",
    ]
    _proc(tmp_path, 10, unmanaged_first, "torchrun")
    _proc(tmp_path, 11, list(reversed(unmanaged_first)), "torchrun")
    a = Attributor(tmp_path, node="n1")
    for pid in (10, 11):
        owner = a.owner(pid)
        assert (owner.id, owner.kind, owner.hint) == ("slurm/48151", WorkloadKind.SLURM_JOB, "torchrun")


def test_a_static_pod_is_a_pod_not_a_container() -> None:
    uid = "6c9b3f2a1e4d5c6b7a8f9e0d1c2b3a4f"
    systemd = (
        f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice/cri-containerd-{HEX64}.scope"
    )
    cgroupfs = f"/kubepods/burstable/pod{uid}/{HEX64}"
    for path in (systemd, cgroupfs):
        found = owner_from_cgroup(path)
        assert found is not None and found[:2] == (f"k8s/{uid}", WorkloadKind.KUBERNETES_POD)


def test_nerdctl_and_plain_containerd_containers_are_containers() -> None:
    for path in (f"/system.slice/nerdctl-{HEX64}.scope", f"/default/{HEX64}", f"/nerdctl/{HEX64}"):
        found = owner_from_cgroup(path)
        assert found is not None and found[:2] == (f"container/{HEX64[:12]}", WorkloadKind.CONTAINER), path
    assert owner_from_cgroup("/default/not-a-container-id") is None


def test_the_host_pid_namespace_is_detected(tmp_path: Path) -> None:
    assert host_pid_namespace(tmp_path) is None  # no /proc/self/status: unknown, treated as the host
    (tmp_path / "self").mkdir()
    status = tmp_path / "self" / "status"
    status.write_text("Name:\tfleetfit\nNSpid:\t4242\n")
    assert host_pid_namespace(tmp_path) is True
    status.write_text("Name:\tfleetfit\nNSpid:\t4242\t7\n")
    assert host_pid_namespace(tmp_path) is False
