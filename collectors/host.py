"""Host CPU and memory, read as psutil reads them. Signals: ``cpu_util`` (%), ``mem_used_pct`` (%)."""

from __future__ import annotations

import os
from pathlib import Path

from agent.protocol import HostInfo, WorkloadRef
from collectors.base import Entity, Inventory, Sample
from collectors.hostinfo import read_host_info
from collectors.procfs import read_bytes


def memory_used_percent(meminfo: bytes | None) -> float:
    """``psutil.virtual_memory().percent`` from /proc/meminfo's text, reading only the three lines it needs:
    psutil parses every line and computes a dozen figures the agent does not send. Where MemAvailable is missing
    or 0 (kernels before 3.14, some containers) psutil estimates it, and is asked."""
    fields: dict[bytes, int] = {}
    for line in (meminfo or b"").splitlines():
        if line.startswith((b"MemTotal:", b"MemFree:", b"MemAvailable:")):
            words = line.split()
            fields[words[0]] = int(words[1]) * 1024
    total, avail = fields.get(b"MemTotal:"), fields.get(b"MemAvailable:")
    if not total or not avail or b"MemFree:" not in fields:
        import psutil  # only here: its modules are 0.9 MiB of the agent's 40 MiB budget

        return float(psutil.virtual_memory().percent)
    if avail > total:
        avail = fields[b"MemFree:"]  # as psutil: a kernel bug seen in LXC containers
    return round((total - avail) / total * 100, 1)


class CpuBusy:
    """``psutil.cpu_percent(interval=None)`` from /proc/stat's first line: the same fields, the same arithmetic
    (negative steps taken as 0, guest time left out as it is counted in user time, idle and iowait not busy),
    without the named tuples that made psutil's call cost three times the read. psutil itself on kernels
    before 3.2, whose line lacks fields."""

    FIELDS = 10  # user nice system idle iowait irq softirq steal guest guest_nice

    def __init__(self, procfs_root: Path = Path("/proc")) -> None:
        self._stat = f"{procfs_root}/stat"
        self._ticks = os.sysconf("SC_CLK_TCK")
        self._last = self._times()
        if self._last is None:
            import psutil  # only where /proc/stat cannot be read, as in memory_used_percent

            psutil.cpu_percent(interval=None)  # primes psutil's counter: its first call always returns 0.0

    def _times(self) -> list[float] | None:
        data = read_bytes(self._stat)
        values = data.split(b"\n", 1)[0].split()[1 : self.FIELDS + 1] if data else []
        if len(values) < self.FIELDS:
            return None
        return [float(v) / self._ticks for v in values]

    def percent(self) -> float:
        """Busy time over all CPUs since the last call, in % of their time (one decimal)."""
        now = self._times() if self._last is not None else None
        if self._last is None or now is None:
            import psutil

            return float(psutil.cpu_percent(interval=None))
        deltas = [max(0, b - a) for a, b in zip(self._last, now, strict=True)]
        self._last = now
        total = sum(deltas)
        total -= deltas[8]  # guest
        total -= deltas[9]  # guest_nice
        busy = total - deltas[3] - deltas[4]  # idle, iowait
        try:
            return round(busy / total * 100, 1)
        except ZeroDivisionError:
            return 0.0


class HostCollector:
    name = "host"

    def __init__(self, procfs_root: Path = Path("/proc"), sysfs_root: Path = Path("/sys")) -> None:
        self._meminfo = f"{procfs_root}/meminfo"
        self._cpu = CpuBusy(procfs_root)
        self._procfs, self._sysfs = procfs_root, sysfs_root
        self._host: HostInfo | None = None

    def inventory(self) -> Inventory:
        if self._host is None:  # once: CPUs, memory and drives change with a reboot, which is a new birth anyway
            self._host = read_host_info(self._procfs, self._sysfs)
        return Inventory(host=self._host)

    def sample(self) -> list[Sample]:
        return [
            Sample(
                Entity.HOST,
                "host",
                gauges={
                    "cpu_util": self._cpu.percent(),
                    "mem_used_pct": memory_used_percent(read_bytes(self._meminfo)),
                },
            )
        ]

    def workloads(self) -> list[WorkloadRef]:
        return []

    def close(self) -> None:
        return None
