"""Host CPU and memory from psutil. Signals: ``cpu_util`` (%), ``mem_used_pct`` (%)."""

from __future__ import annotations

from pathlib import Path

import psutil

from agent.protocol import WorkloadRef
from collectors.base import Entity, Inventory, Sample
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
        return float(psutil.virtual_memory().percent)
    if avail > total:
        avail = fields[b"MemFree:"]  # as psutil: a kernel bug seen in LXC containers
    return round((total - avail) / total * 100, 1)


class HostCollector:
    name = "host"

    def __init__(self, procfs_root: Path = Path("/proc")) -> None:
        self._meminfo = f"{procfs_root}/meminfo"
        psutil.cpu_percent(interval=None)  # primes the counter: the first call always returns 0.0

    def inventory(self) -> Inventory:
        return Inventory()

    def sample(self) -> list[Sample]:
        return [
            Sample(
                Entity.HOST,
                "host",
                gauges={
                    "cpu_util": psutil.cpu_percent(interval=None),
                    "mem_used_pct": memory_used_percent(read_bytes(self._meminfo)),
                },
            )
        ]

    def workloads(self) -> list[WorkloadRef]:
        return []

    def close(self) -> None:
        return None
