"""What a workload's own storage figures cost the agent a window: ``WorkloadFacts.enrich`` on one 8-process Slurm
job, with each process's /proc/<pid>/io readable, with only its cgroup's io.stat (five devices: LVM on md RAID on
two NVMe drives, and a boot disk, each layer read from sysfs ``slaves``), and with neither (the baseline: the
rest of the facts, which every window pays anyway). A fixture tree, so the kernel's own cost of a read is left
out; the ratio to the baseline is what the figures in collectors/workload_facts.py quote.

    .venv/bin/python bench/workload_facts_io.py [--windows 2000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.protocol import WorkloadKind, WorkloadRef
from collectors.workload_facts import WorkloadFacts

JOB = "/system.slice/slurmstepd.scope/job_77"
PIDS = list(range(100, 108))
HOST_NS = "net:[4026531840]"
# io.stat's devices and the sysfs layers they stand on: dm-0 on md127 on nvme0n1p1 and nvme1n1p1; sda plain
DEVICES = {"253:0": ("dm-0", ["md127"]), "9:127": ("md127", ["nvme0n1p1", "nvme1n1p1"])}
DEVICES |= {"259:0": ("nvme0n1", []), "259:2": ("nvme1n1", []), "8:0": ("sda", [])}


def _tree(root: Path, proc_io: bool, io_stat: bool) -> Path:
    proc = root / "proc"
    (proc / "self" / "ns").mkdir(parents=True)
    os.symlink(HOST_NS, proc / "self" / "ns" / "net")
    for pid in PIDS:
        p = proc / str(pid)
        (p / "ns").mkdir(parents=True)
        (p / "fd").mkdir()
        os.symlink(HOST_NS, p / "ns" / "net")
        (p / "cmdline").write_bytes(b"python3\0train.py\0")
        (p / "cgroup").write_text(f"0::{JOB}/step_0/user/task_{pid}\n")
        if proc_io:
            (p / "io").write_text("read_bytes: 4096\nwrite_bytes: 8192\ncancelled_write_bytes: 0\n")
    if io_stat:
        cgroup = root / "cgroup" / JOB.lstrip("/")
        cgroup.mkdir(parents=True)
        lines = [f"{number} rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n" for number in DEVICES]
        (cgroup / "io.stat").write_text("".join(lines))
    block = root / "sys" / "devices" / "block"
    (root / "sys" / "dev" / "block").mkdir(parents=True)
    for number, (name, members) in DEVICES.items():
        (block / name / "slaves").mkdir(parents=True)
        (block / name / "dev").write_text(number + "\n")
        os.symlink(block / name, root / "sys" / "dev" / "block" / number)
        for member in members:
            os.symlink(block / member, block / name / "slaves" / member)
    for disk, part in (("nvme0n1", "nvme0n1p1"), ("nvme1n1", "nvme1n1p1")):
        (block / disk / part).mkdir()
        (block / disk / part / "partition").write_text("1\n")
        os.symlink(block / disk / part, block / part)
    return proc


def _median_us(proc: Path, windows: int, repeat: int) -> float:
    now = [0.0]
    facts = WorkloadFacts(
        proc, clock=lambda: now[0], cgroupfs_root=proc.parent / "cgroup", sysfs_root=proc.parent / "sys"
    )
    refs = [WorkloadRef(id="slurm/77", kind=WorkloadKind.SLURM_JOB, name="job", gpus=list(range(8)))]

    def window() -> None:
        now[0] += 10.0
        facts.enrich(refs, {"slurm/77": PIDS})

    window()  # first sight: baselines and the layers' cache
    runs = timeit.repeat(window, number=windows, repeat=repeat)
    return statistics.median(runs) / windows * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    cases = {"neither (baseline)": (False, False), "io.stat only": (False, True), "/proc/<pid>/io": (True, True)}
    results = {}
    for label, (proc_io, io_stat) in cases.items():
        with tempfile.TemporaryDirectory() as tmp:
            results[label] = _median_us(_tree(Path(tmp), proc_io, io_stat), args.windows, args.repeat)
    base = results["neither (baseline)"]
    print(f"{'one 8-process workload, a window':<36} {'µs (median)':>12} {'x baseline':>11}")
    for label, us in results.items():
        print(f"{label:<36} {us:>12.0f} {us / base:>11.2f}")


if __name__ == "__main__":
    main()
