"""Process facts on fixture /proc trees: the program without its arguments, a server's ports and clients, a pod's
own traffic, its own storage reads and writes, the Slurm step; and the NIC carrying the default route taken for the
front end."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from agent.protocol import NicKind, NicRole, WorkloadKind, WorkloadRef
from collectors.nic import default_route_interfaces, role_of
from collectors.workload_facts import WorkloadFacts, cgroup_io, program_of

HOST_NS, POD_NS = "net:[4026531992]", "net:[4026533001]"
TCP_HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _tcp_line(local: str, remote: str, state: str, inode: int) -> str:
    return f"   0: {local} {remote} {state} 00000000:00000000 00:00000000 00000000     0        0 {inode} 1\n"


def _proc(tmp_path: Path, pid: int, netns: str, cmdline: list[str], cgroup: str, rx: int = 0, tx: int = 0) -> Path:
    root = tmp_path / "proc"
    (root / "self" / "ns").mkdir(parents=True, exist_ok=True)
    if not (root / "self" / "ns" / "net").is_symlink():
        os.symlink(HOST_NS, root / "self" / "ns" / "net")
    (root / "sys" / "net" / "ipv4").mkdir(parents=True, exist_ok=True)
    (root / "sys" / "net" / "ipv4" / "ip_local_port_range").write_text("32768\t60999\n")
    p = root / str(pid)
    (p / "ns").mkdir(parents=True)
    (p / "net").mkdir()
    (p / "fd").mkdir()
    os.symlink(netns, p / "ns" / "net")
    (p / "cmdline").write_bytes(b"\0".join(a.encode() for a in cmdline) + b"\0")
    (p / "cgroup").write_text(cgroup)
    tcp = TCP_HEADER
    tcp += _tcp_line("00000000:1F40", "00000000:0000", "0A", 100)  # :8000 listening
    tcp += _tcp_line("00000000:6F54", "00000000:0000", "0A", 101)  # :28500
    tcp += _tcp_line("00000000:733C", "00000000:0000", "0A", 102)  # :29500, PyTorch's rendezvous default
    tcp += _tcp_line("00000000:7344", "00000000:0000", "0A", 103)  # :29508
    tcp += _tcp_line("00000000:AFC8", "00000000:0000", "0A", 104)  # :45000, ephemeral
    for i, peer in enumerate(("0A000001", "0A000002", "0A000003", "0A000003")):
        tcp += _tcp_line("0A0000FE:1F40", f"{peer}:C350", "01", 200 + i)  # clients on :8000
    (p / "net" / "tcp").write_text(tcp)
    (p / "net" / "tcp6").write_text(TCP_HEADER)
    (p / "net" / "dev").write_text(
        "Inter-|   Receive                    |  Transmit\n"
        " face |bytes packets errs drop fifo frame compressed multicast|bytes packets\n"
        f"    lo: 999999 1 0 0 0 0 0 0 999999 1 0 0 0 0 0 0\n"
        f"  eth0: {rx} 10 0 0 0 0 0 0 {tx} 10 0 0 0 0 0 0\n"
    )
    return root


def _ref(wid: str) -> WorkloadRef:
    return WorkloadRef(id=wid, kind=WorkloadKind.KUBERNETES_POD, name="w", gpus=[0], hint="python3")


def test_the_program_is_named_without_its_arguments() -> None:
    assert program_of(b"/usr/bin/python3\0-m\0vllm.entrypoints.openai.api_server\0--api-key\0s3cret\0") == (
        "vllm.entrypoints.openai.api_server"
    )
    assert program_of(b"python\0-u\0/opt/train_lora.py\0--hf-token=hf_abc\0") == "train_lora.py"
    assert program_of(b"/usr/local/bin/tritonserver\0--model-repository=/models\0") == "tritonserver"
    assert program_of(b"python3\0-mipykernel_launcher\0-f\0/tmp/kernel.json\0") == "ipykernel_launcher"
    assert program_of(b"python3\0-c\0import secrets\0") == "python3"
    assert program_of(b"") is None


def test_a_pod_server_reports_its_ports_clients_and_own_traffic(tmp_path: Path) -> None:
    cmd = ["python3", "-m", "sglang.launch_server", "--api-key", "hunter2"]
    root = _proc(tmp_path, 40, POD_NS, cmd, "0::/kubepods/pod1/cri-containerd-ab\n", rx=1_000, tx=5_000)
    now = [100.0]
    facts = WorkloadFacts(root, clock=lambda: now[0])
    first = facts.enrich([_ref("k8s/a")], {"k8s/a": [40]})[0]
    assert first.program == "sglang.launch_server"
    assert "hunter2" not in first.model_dump_json()
    # The rendezvous-free low ports; 45000 is ephemeral (NCCL's bootstrap listens there), so it is not a service.
    assert first.listen_ports == [8000, 28500, 29508]
    assert (first.inbound_connections, first.inbound_peers) == (4, 3)
    assert first.net_rx_bps is None  # first sight: no rate yet
    (root / "40" / "net" / "dev").write_text(
        "h1\nh2\n    lo: 5 1 0 0 0 0 0 0 5 1 0 0 0 0 0 0\n  eth0: 21000 10 0 0 0 0 0 0 105000 10 0 0 0 0 0 0\n"
    )
    now[0] = 110.0
    second = facts.enrich([_ref("k8s/a")], {"k8s/a": [40]})[0]
    assert (second.net_rx_bps, second.net_tx_bps) == (2_000.0, 10_000.0)


def test_a_host_process_counts_only_its_own_sockets_and_its_slurm_step(tmp_path: Path) -> None:
    cgroup = "0::/system.slice/slurmstepd.scope/job_77/step_batch/user/task_0\n"
    root = _proc(tmp_path, 50, HOST_NS, ["torchrun", "--nproc-per-node=8", "train.py"], cgroup)
    os.symlink("socket:[104]", root / "50" / "fd" / "3")  # it holds only the ephemeral listener
    os.symlink("/dev/nvidia0", root / "50" / "fd" / "4")
    ref = WorkloadFacts(root).enrich([_ref("slurm/77")], {"slurm/77": [50]})[0]
    assert ref.program == "torchrun" and ref.sched_step == "batch"
    assert ref.listen_ports == [] and ref.inbound_connections == 0
    assert ref.net_rx_bps is None  # the host's counters are the node's, not the job's


def test_an_agent_in_a_pod_of_its_own_still_tells_host_processes_from_pods(tmp_path: Path) -> None:
    # hostPID without hostNetwork: the agent's namespace is its pod's; PID 1 (the host's init) is in the host's.
    cgroup = "0::/system.slice/slurmstepd.scope/job_77/step_batch/user/task_0\n"
    root = _proc(tmp_path, 50, HOST_NS, ["torchrun", "train.py"], cgroup, rx=1_000)
    (root / "self" / "ns" / "net").unlink()
    os.symlink("net:[4026539999]", root / "self" / "ns" / "net")
    (root / "1" / "ns").mkdir(parents=True)
    os.symlink(HOST_NS, root / "1" / "ns" / "net")
    os.symlink("socket:[104]", root / "50" / "fd" / "3")
    ref = WorkloadFacts(root).enrich([_ref("slurm/77")], {"slurm/77": [50]})[0]
    assert ref.listen_ports == [] and ref.inbound_connections == 0  # not the host's :8000 and its clients


def test_a_process_on_many_gpus_does_not_crowd_out_its_workloads_server(tmp_path: Path) -> None:
    cgroup = "0::/system.slice/slurmstepd.scope/job_77/step_0\n"
    root = _proc(tmp_path, 50, HOST_NS, ["python3", "worker.py"], cgroup)
    _proc(tmp_path, 51, HOST_NS, ["python3", "worker.py"], cgroup)
    _proc(tmp_path, 60, HOST_NS, ["python3", "-m", "vllm.entrypoints.openai.api_server"], cgroup)
    os.symlink("socket:[100]", root / "60" / "fd" / "3")  # the front end listens on :8000
    # the attributor lists a PID once for each GPU it holds: two workers on eight GPUs each, then the front end
    ref = WorkloadFacts(root).enrich([_ref("slurm/77")], {"slurm/77": [50] * 8 + [51] * 8 + [60]})[0]
    assert ref.listen_ports == [8000]


def test_a_workload_whose_processes_are_gone_keeps_its_reference(tmp_path: Path) -> None:
    root = _proc(tmp_path, 60, POD_NS, ["vllm", "serve"], "")
    ref = _ref("k8s/b")
    assert WorkloadFacts(root).enrich([ref], {"k8s/b": [61]}) == [ref]


def test_the_rdma_port_with_the_default_route_is_the_front_end(tmp_path: Path) -> None:
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "route").write_text(
        "Iface\tDestination\tGateway\tFlags\n"
        "ens1f0np0\t00000000\t0100000A\t0003\n"
        "ens1f0np0\t0000000A\t00000000\t0001\n"
        "ibp1s0\t0000A8C0\t00000000\t0001\n"
    )
    front = frozenset(default_route_interfaces(tmp_path))
    assert front == {"ens1f0np0"}
    assert role_of("ens1f0np0", NicKind.ROCE, ("ib*",), front) is NicRole.NORTH_SOUTH
    assert role_of("ens2f0np0", NicKind.ROCE, ("ib*",), front) is NicRole.EAST_WEST
    assert role_of("ibp1s0", NicKind.INFINIBAND, ("ib*",), front) is NicRole.EAST_WEST


def test_a_namespaces_tcp_table_is_read_once_per_interval(tmp_path: Path) -> None:
    root = _proc(tmp_path, 70, POD_NS, ["vllm", "serve"], "")
    now = [0.0]
    facts = WorkloadFacts(root, clock=lambda: now[0], socket_interval=300.0)
    assert facts.enrich([_ref("k8s/c")], {"k8s/c": [70]})[0].listen_ports == [8000, 28500, 29508]
    (root / "70" / "net" / "tcp").write_text(TCP_HEADER + _tcp_line("00000000:0050", "00000000:0000", "0A", 9))
    now[0] = 290.0  # within the interval: the kernel is not asked to walk its tables again
    assert facts.enrich([_ref("k8s/c")], {"k8s/c": [70]})[0].listen_ports == [8000, 28500, 29508]
    now[0] = 301.0
    assert facts.enrich([_ref("k8s/c")], {"k8s/c": [70]})[0].listen_ports == [80]


def _stat(root: Path, pid: int, start: int) -> None:
    # proc(5) stat: pid (comm) state, then fields 4-21, then starttime (field 22)
    (root / str(pid) / "stat").write_text(f"{pid} (my prog) S {' '.join(['0'] * 18)} {start} 0 0\n")


def test_a_pid_given_to_a_new_process_is_read_again(tmp_path: Path) -> None:
    """Program and held sockets are cached per process: a pid reused by another program between two windows
    (a later start time in /proc/PID/stat) is not taken for the one before."""
    root = _proc(tmp_path, 70, HOST_NS, ["python3", "-m", "vllm.entrypoints.openai.api_server"], "0::/system.slice\n")
    os.symlink("socket:[100]", root / "70" / "fd" / "3")  # listens on :8000
    _stat(root, 70, 5_000)
    facts = WorkloadFacts(root, clock=lambda: 100.0)
    first = facts.enrich([_ref("w")], {"w": [70]})[0]
    assert (first.program, first.listen_ports) == ("vllm.entrypoints.openai.api_server", [8000])
    (root / "70" / "cmdline").write_bytes(b"/usr/bin/rsync\0--daemon\0")
    os.unlink(root / "70" / "fd" / "3")
    _stat(root, 70, 9_000)
    again = facts.enrich([_ref("w")], {"w": [70]})[0]
    assert (again.program, again.listen_ports) == ("rsync", [])


MB = 1_000_000
SLURM = "0::/system.slice/slurmstepd.scope/job_77/step_0\n"


def _io(root: Path, pid: int, read: int, write: int, cancelled: int = 0) -> None:
    # proc(5) /proc/PID/io, every field the kernel writes
    (root / str(pid) / "io").write_text(
        f"rchar: {read + 4096}\nwchar: {write + 512}\nsyscr: 10\nsyscw: 20\n"
        f"read_bytes: {read}\nwrite_bytes: {write}\ncancelled_write_bytes: {cancelled}\n"
    )


class _Windows:
    """One workload read window after window, 10 s apart, with a cgroupfs and a sysfs of its own beside /proc."""

    def __init__(self, root: Path, workload: str = "slurm/77") -> None:
        self.now = 0.0
        self.workload = workload
        self.facts = WorkloadFacts(
            root, clock=lambda: self.now, cgroupfs_root=root.parent / "cgroup", sysfs_root=root.parent / "sys"
        )

    def next(self, pids: list[int]) -> tuple[float | None, float | None]:
        self.now += 10.0
        ref = self.facts.enrich([_ref(self.workload)], {self.workload: pids})[0]
        return ref.disk_read_bps, ref.disk_write_bps


def _workers(tmp_path: Path, *pids: int) -> Path:
    root = tmp_path / "proc"
    for pid in pids:
        root = _proc(tmp_path, pid, HOST_NS, ["python3", "train.py"], SLURM)
    return root


def test_a_steady_writer_reports_its_own_rate_from_the_second_window(tmp_path: Path) -> None:
    """Two ranks, each reading 20 MB and writing 5 MB per 10 s window: 4 MB/s read and 1 MB/s written together.
    Caught: dividing by the time since the first reading instead of the last (the third window would halve)."""
    root = _workers(tmp_path, 50, 51)
    windows = _Windows(root)
    for pid in (50, 51):
        _io(root, pid, read=3_000 * MB, write=700 * MB)  # their whole life so far
    assert windows.next([50, 51]) == (None, None)  # a baseline, not a rate: unknown rather than zero
    for n in (1, 2):
        for pid in (50, 51):
            _io(root, pid, read=3_000 * MB + n * 20 * MB, write=700 * MB + n * 5 * MB)
        assert windows.next([50, 51]) == (4.0 * MB, 1.0 * MB)


def test_a_checkpoint_save_shows_in_its_own_window_only(tmp_path: Path) -> None:
    """A 150 MB torch.save dirties its pages within one window: 15 MB/s there, 0.1 MB/s of logs either side.
    Caught: keeping the first reading as the baseline (the save would spread into every later window)."""
    root = _workers(tmp_path, 50)
    windows = _Windows(root)
    writes = [0, 1 * MB, 152 * MB, 153 * MB]
    rates = []
    for written in writes:
        _io(root, 50, read=0, write=written)
        rates.append(windows.next([50])[1])
    assert rates == [None, 0.1 * MB, 15.1 * MB, 0.1 * MB]


def test_a_process_seen_for_the_first_time_adds_no_jump(tmp_path: Path) -> None:
    """A second rank attributed in the second window brings its whole life (80 GB written) with it: only its growth
    from then on counts. Caught: a new pid's counters taken as growth from zero (8 GB/s in one window)."""
    root = _workers(tmp_path, 50, 51)
    windows = _Windows(root)
    _io(root, 50, read=0, write=0)
    _io(root, 51, read=5_000 * MB, write=80_000 * MB)
    assert windows.next([50]) == (None, None)
    _io(root, 50, read=0, write=10 * MB)
    assert windows.next([50, 51]) == (0.0, 1.0 * MB)
    _io(root, 50, read=0, write=20 * MB)
    _io(root, 51, read=5_000 * MB, write=80_030 * MB)
    assert windows.next([50, 51]) == (0.0, 4.0 * MB)


def test_a_pid_given_to_another_process_starts_over(tmp_path: Path) -> None:
    """Pid 50 exits and a new process (a later start in /proc/PID/stat) gets it, with higher counters than the
    old one had. Caught: comparing counters without the start (40 GB of another process's life in one window)."""
    root = _workers(tmp_path, 50, 51)
    _stat(root, 50, 5_000)
    _stat(root, 51, 5_000)
    windows = _Windows(root)
    _io(root, 50, read=0, write=10_000 * MB)
    _io(root, 51, read=0, write=0)
    windows.next([50, 51])
    _stat(root, 50, 9_000)
    _io(root, 50, read=0, write=50_000 * MB)
    _io(root, 51, read=0, write=20 * MB)
    assert windows.next([50, 51]) == (0.0, 2.0 * MB)
    _io(root, 50, read=0, write=50_010 * MB)  # the new process's own growth counts from here
    _io(root, 51, read=0, write=30 * MB)
    assert windows.next([50, 51]) == (0.0, 2.0 * MB)


def test_counters_that_went_down_are_a_new_process(tmp_path: Path) -> None:
    """Without a start time to read (no stat), lower counters on a pid mean another process holds it: no rate from
    it that window, then its own growth. Caught: dropping the check (a negative read rate reaches the wire)."""
    root = _workers(tmp_path, 50)
    windows = _Windows(root)
    _io(root, 50, read=900 * MB, write=10_000 * MB)
    windows.next([50])
    _io(root, 50, read=1 * MB, write=2 * MB)
    assert windows.next([50]) == (None, None)
    _io(root, 50, read=11 * MB, write=7 * MB)
    assert windows.next([50]) == (1.0 * MB, 0.5 * MB)


def test_io_that_cannot_be_read_leaves_the_fields_out_and_the_agent_going(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ptrace access (EACCES: an agent without CAP_SYS_PTRACE), no file (a kernel without task IO accounting), a
    field garbled or missing: that process is left out, and with none left the fields are absent, not zero.
    Caught: an unreadable process counted as zeros (0 B/s reported as measured) or a garbled count raising."""
    root = _workers(tmp_path, 50, 51, 52, 53, 54)
    real_open = os.open

    def denied(path: str, flags: int, *args: int) -> int:
        if path == f"{root}/50/io":
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr("collectors.procfs.os.open", denied)
    _io(root, 50, read=0, write=0)  # there, but denied
    windows = _Windows(root)
    for _ in range(2):  # 51 has no io file at all
        ref = windows.facts.enrich([_ref("slurm/77")], {"slurm/77": [50, 51]})[0]
        windows.now += 10.0
        assert (ref.disk_read_bps, ref.disk_write_bps) == (None, None)
        assert ref.program == "train.py"  # the other facts are still read
    (root / "52" / "io").write_text("read_bytes: 12abc\nwrite_bytes: 5\ncancelled_write_bytes: 0\n")
    (root / "53" / "io").write_text("read_bytes: 0\nwrite_bytes: 5\n")  # cancelled_write_bytes missing
    _io(root, 54, read=0, write=0)
    assert windows.next([50, 51, 52, 53, 54]) == (None, None)
    (root / "52" / "io").write_text("read_bytes: -4\nwrite_bytes: 10000000\ncancelled_write_bytes: 0\n")
    (root / "53" / "io").write_text("read_bytes: 0\nwrite_bytes: 10000000\n")
    _io(root, 54, read=0, write=3 * MB)
    assert windows.next([50, 51, 52, 53, 54]) == (0.0, 0.3 * MB)  # 54 alone


def test_truncated_writes_are_taken_off(tmp_path: Path) -> None:
    """A job writes 100 MB and deletes 60 MB of it before writeback (cancelled_write_bytes, proc(5)): 4 MB/s. A
    window where it deletes more than it wrote (another process's file) reads 0, never negative.
    Caught: writes not less the cancelled bytes (10 MB/s), or the difference not floored at zero (-5 MB/s)."""
    root = _workers(tmp_path, 50)
    windows = _Windows(root)
    _io(root, 50, read=0, write=0)
    windows.next([50])
    _io(root, 50, read=0, write=100 * MB, cancelled=60 * MB)
    assert windows.next([50]) == (0.0, 4.0 * MB)
    _io(root, 50, read=0, write=110 * MB, cancelled=120 * MB)
    assert windows.next([50]) == (0.0, 0.0)


JOB = "/system.slice/slurmstepd.scope/job_77"


def _io_stat(tmp_path: Path, devices: dict[str, tuple[int, int]], cgroup: str = JOB) -> None:
    """The cgroup's io.stat as the kernel writes it (cgroup-v2.rst), one line per device."""
    directory = tmp_path / "cgroup" / cgroup.lstrip("/")
    directory.mkdir(parents=True, exist_ok=True)
    lines = [
        f"{dev} rbytes={r} wbytes={w} rios={r // 131072} wios={w // 131072} dbytes=0 dios=0\n"
        for dev, (r, w) in devices.items()
    ]
    (directory / "io.stat").write_text("".join(lines))


def _denied(monkeypatch: pytest.MonkeyPatch, root: Path, *pids: int) -> None:
    """Another user's /proc/PID/io to an agent without the attribution drop-in: EACCES."""
    real_open = os.open
    refused = {f"{root}/{pid}/io" for pid in pids}

    def refusing(path: str, flags: int, *args: int) -> int:
        if path in refused:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr("collectors.procfs.os.open", refusing)


def _job_worker(tmp_path: Path, pid: int = 50) -> Path:
    # a rank in its task's cgroup, two levels below the job's
    root = _proc(tmp_path, pid, HOST_NS, ["python3", "train.py"], f"0::{JOB}/step_0/user/task_0\n")
    _io(root, pid, read=0, write=0)  # there, but refused below
    return root


def test_without_access_to_proc_io_the_jobs_io_stat_gives_its_rates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/proc/50/io refused: the job's cgroup (the shallowest on the rank's path that names slurm/77, since io.stat
    counts every step and task below it) reads 20 MB and writes 5 MB per window over two disks: 2 and 0.5 MB/s.
    Its first window is a baseline. Caught: no fallback (both absent), the rank's own task cgroup read instead of
    the job's (no io.stat there: absent), or the first reading taken as a window's growth (400 MB/s read)."""
    root = _job_worker(tmp_path)
    _denied(monkeypatch, root, 50)
    windows = _Windows(root)
    _io_stat(tmp_path, {"259:0": (4_000 * MB, 900 * MB), "8:0": (0, 100 * MB)})  # its life so far
    assert windows.next([50]) == (None, None)
    _io_stat(tmp_path, {"259:0": (4_020 * MB, 903 * MB), "8:0": (0, 102 * MB)})
    assert windows.next([50]) == (2.0 * MB, 0.5 * MB)


def test_a_save_flushed_in_one_window_shows_there_and_a_new_cgroup_starts_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 120 MB torch.save reaches the disk when writeback flushes it (io.stat counts at the block layer): 12 MB/s in
    that window, 0.1 MB/s of logs either side. The job's cgroup then goes (the job ended; no io.stat) and a cgroup
    under the same path comes with more bytes than the old one had, and later one whose counters went down: each
    is a baseline, not a jump. Caught: the first reading kept as the baseline (the save spread over every later
    window), a cgroup gone not forgotten (125 MB/s), or counters that fell read as growth (a negative rate)."""
    root = _job_worker(tmp_path)
    _denied(monkeypatch, root, 50)
    windows = _Windows(root)
    rates = []
    for written in (0, 1 * MB, 121 * MB, 122 * MB):
        _io_stat(tmp_path, {"259:0": (0, written)})
        rates.append(windows.next([50])[1])
    assert rates == [None, 0.1 * MB, 12.0 * MB, 0.1 * MB]
    stat = tmp_path / "cgroup" / JOB.lstrip("/") / "io.stat"
    stat.rename(stat.parent / "away")
    assert windows.next([50]) == (None, None)
    (stat.parent / "away").rename(stat)  # the same inode: only forgetting the old cgroup tells them apart
    _io_stat(tmp_path, {"259:0": (0, 2_622 * MB)})
    assert windows.next([50]) == (None, None)
    _io_stat(tmp_path, {"259:0": (0, 2_632 * MB)})
    assert windows.next([50]) == (0.0, 1.0 * MB)
    _io_stat(tmp_path, {"259:0": (0, 5 * MB)})
    assert windows.next([50]) == (None, None)


def test_a_cgroup_made_again_under_the_same_path_is_a_baseline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A systemd unit restarted between two windows has a new cgroup under the same path (another inode), whose
    counters may already pass the old one's: a baseline. Caught: comparing counters alone (50 MB/s of the old
    cgroup's life in one window)."""
    unit = "/system.slice/trainer.service"
    root = _proc(tmp_path, 50, HOST_NS, ["python3", "train.py"], f"0::{unit}\n")
    _denied(monkeypatch, root, 50)
    windows = _Windows(root, "systemd/trainer.service")
    _io_stat(tmp_path, {"259:0": (0, 100 * MB)}, unit)
    windows.next([50])
    stat = tmp_path / "cgroup" / unit.lstrip("/") / "io.stat"
    (stat.parent / "new").write_text(f"259:0 rbytes=0 wbytes={600 * MB}\n")
    os.replace(stat.parent / "new", stat)  # made while the old existed: another inode
    assert windows.next([50]) == (None, None)
    _io_stat(tmp_path, {"259:0": (0, 610 * MB)}, unit)
    assert windows.next([50]) == (0.0, 1.0 * MB)


def _block(sysfs: Path, name: str, number: str, *parts: tuple[str, str]) -> Path:
    """A disk or volume in sysfs (/sys/devices/.../block/NAME with its dev, partitions and slaves), linked from
    /sys/dev/block/MAJ:MIN as the kernel links it."""
    disk = sysfs / "devices" / "block" / name
    (disk / "slaves").mkdir(parents=True)
    (disk / "dev").write_text(number + "\n")
    for part, part_number in parts:
        (disk / part).mkdir()
        (disk / part / "dev").write_text(part_number + "\n")
        (disk / part / "partition").write_text("1\n")
    (sysfs / "dev" / "block").mkdir(parents=True, exist_ok=True)
    os.symlink(disk, sysfs / "dev" / "block" / number)
    return disk


def test_a_stacked_volume_is_counted_once_not_again_on_its_layers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DGX's /raid: LVM (dm-0, 253:0) on md127 (9:127) on the first partitions of two NVMe drives. The cgroup is
    charged on each layer: a 40 MB write shows on dm-0, md127, and 20 MB on each drive; 10 MB more went to the plain
    boot disk (8:0). That is 5 MB/s written, not 13. Caught: summing every device listed (13 MB/s), or a member
    partition not taken to its drive, which io.stat lists instead (the drives counted again: 9 MB/s)."""
    sysfs = tmp_path / "sys"
    nvme0 = _block(sysfs, "nvme0n1", "259:0", ("nvme0n1p1", "259:1"))
    nvme1 = _block(sysfs, "nvme1n1", "259:2", ("nvme1n1p1", "259:3"))
    md = _block(sysfs, "md127", "9:127")
    os.symlink(nvme0 / "nvme0n1p1", md / "slaves" / "nvme0n1p1")
    os.symlink(nvme1 / "nvme1n1p1", md / "slaves" / "nvme1n1p1")
    dm = _block(sysfs, "dm-0", "253:0")
    os.symlink(md, dm / "slaves" / "md127")
    _block(sysfs, "sda", "8:0", ("sda1", "8:1"))
    root = _job_worker(tmp_path)
    _denied(monkeypatch, root, 50)
    windows = _Windows(root)
    for step in (0, 1):
        _io_stat(
            tmp_path,
            {
                "253:0": (0, step * 40 * MB),
                "9:127": (0, step * 40 * MB),
                "259:0": (0, step * 20 * MB),
                "259:2": (0, step * 20 * MB),
                "8:0": (0, step * 10 * MB),
            },
        )
        rates = windows.next([50])
    assert rates == (0.0, 5.0 * MB)


def test_an_io_stat_garbled_or_missing_leaves_the_fields_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No io.stat (cgroup v1, or no io controller on the job's cgroup), or a line that is not the kernel's: both
    fields absent, the other facts still there. A device listed bare (no I/O yet) is zeros, not garbled.
    Caught: a garbled count read as zero (0 B/s reported as measured) or raising, or a bare line rejected."""
    assert cgroup_io(b"8:0 rbytes=1 wbytes=2 rios=1 wios=1 dbytes=0 dios=0\n8:16 use_delay=0 delay_nsec=0\n9:0\n") == {
        "8:0": (1, 2),
        "8:16": (0, 0),
        "9:0": (0, 0),
    }
    root = _job_worker(tmp_path)
    _denied(monkeypatch, root, 50)
    windows = _Windows(root)
    for _ in range(2):
        ref = windows.facts.enrich([_ref("slurm/77")], {"slurm/77": [50]})[0]
        windows.now += 10.0
        assert (ref.disk_read_bps, ref.disk_write_bps, ref.program) == (None, None, "train.py")
    for garbled in ("259:0 rbytes=12abc wbytes=0\n", "nvme0n1 rbytes=0 wbytes=0\n", "259:0 rbytes=5\n", "259:0 x\n"):
        _io_stat(tmp_path, {"259:0": (0, 0)})
        windows.next([50])
        (tmp_path / "cgroup" / JOB.lstrip("/") / "io.stat").write_text(garbled)
        assert windows.next([50]) == (None, None), garbled


def test_a_count_longer_than_the_kernels_64_bits_is_garbled_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel's I/O counters are u64, 20 digits at most. A longer number in /proc/PID/io or io.stat (a garbled
    file) is no reading: that workload's storage fields are absent and its other facts, and the other workloads',
    still come. Deliberate bug caught: any run of digits taken as a count (a 400-digit one overflows the rate's
    float, a 5,000-digit one passes Python's int limit: either raises out of enrich() and the window loses every
    workload's facts)."""
    root = _workers(tmp_path, 50)
    windows = _Windows(root)
    _io(root, 50, read=0, write=0)
    windows.next([50])
    for digits in (400, 5_000):
        (root / "50" / "io").write_text(f"read_bytes: {'9' * digits}\nwrite_bytes: 0\ncancelled_write_bytes: 0\n")
        windows.now += 10.0
        ref = windows.facts.enrich([_ref("slurm/77")], {"slurm/77": [50]})[0]
        assert (ref.disk_read_bps, ref.disk_write_bps, ref.program) == (None, None, "train.py"), digits
    _io(root, 50, read=10 * MB, write=0)
    windows.next([50])
    _io(root, 50, read=20 * MB, write=0)
    assert windows.next([50]) == (1.0 * MB, 0.0)  # the next sane file is read again from a fresh baseline

    cgroup_root = tmp_path / "job"
    job = _job_worker(cgroup_root)
    _denied(monkeypatch, job, 50)
    windows = _Windows(job)
    _io_stat(cgroup_root, {"259:0": (0, 0)})
    windows.next([50])
    _io_stat(cgroup_root, {"259:0": (0, 10**400)})
    windows.now += 10.0
    ref = windows.facts.enrich([_ref("slurm/77")], {"slurm/77": [50]})[0]
    assert (ref.disk_read_bps, ref.disk_write_bps, ref.program) == (None, None, "train.py")
    assert cgroup_io(b"8:0 rbytes=18446744073709551615 wbytes=0\n") == {"8:0": (2**64 - 1, 0)}  # u64's largest


def test_a_cgroup_that_is_not_the_workloads_own_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process group in a login session's scope shares it with the user's other programs, and a process outside
    the agent's cgroup namespace shows /.. in its path: neither cgroup's io.stat is taken for the workload's.
    Caught: reading the main process's cgroup whatever it names (10 MB/s of the session's copies)."""
    session = "/user.slice/user-1000.slice/session-3.scope"
    root = _proc(tmp_path, 50, HOST_NS, ["python3", "train.py"], f"0::{session}\n")
    # relative to the agent's own cgroup; joined to the cgroupfs root it would reach another cgroup's io.stat
    _proc(tmp_path, 60, HOST_NS, ["python3", "train.py"], "0::/../cgroup/system.slice/docker-0123456789abcdef.scope\n")
    _denied(monkeypatch, root, 50, 60)
    windows = _Windows(root, "pgid/n1/50")
    outside = _Windows(root, "container/0123456789ab")
    for written in (0, 100 * MB):
        _io_stat(tmp_path, {"259:0": (0, written)}, session)
        _io_stat(tmp_path, {"259:0": (0, written)}, "/system.slice/docker-0123456789abcdef.scope")
        assert windows.next([50]) == (None, None)
        assert outside.next([60]) == (None, None)


def test_proc_io_is_preferred_where_it_can_be_read(tmp_path: Path) -> None:
    """Both readable (the agent runs with the attribution drop-in): the process's own counters, which count a save
    when it is made, win over the cgroup's 5 MB/s. Caught: io.stat read first (5 MB/s), or summed in (6 MB/s)."""
    root = _job_worker(tmp_path)
    windows = _Windows(root)
    for step in (0, 1):
        _io(root, 50, read=0, write=step * 10 * MB)
        _io_stat(tmp_path, {"259:0": (0, step * 50 * MB)})
        rates = windows.next([50])
    assert rates == (0.0, 1.0 * MB)
