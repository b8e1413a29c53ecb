"""What the benchmarks share: free ports, per-process CPU and memory, a throwaway Mosquitto."""

from __future__ import annotations

import os
import resource
import shutil
import socket
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid``, in nanoseconds from the scheduler (``/proc/*/schedstat``).

    utime/stime in ``/proc/pid/stat`` are sampled at the timer tick (10 ms here): a process that wakes for a
    millisecond a second is charged whole ticks or nothing, which is too coarse to compare two such processes.
    """
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def process_cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` with that of its threads that have ended (``/proc/pid/stat`` utime + stime).

    ``cpu_seconds`` adds up the threads alive when it reads: the solver's worker threads, which end with each
    solve, would go uncounted. Tick-sampled, so for runs of minutes, not for processes that barely wake.
    """
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def raise_open_files_limit() -> None:
    """One connection per simulated node, here and in the processes started from here."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def mosquitto_command(directory: Path, port: int, *extra: str) -> list[str]:
    """A quiet, anonymous, in-memory Mosquitto on loopback ``port``, its config written in ``directory``."""
    conf = directory / "mosquitto.conf"
    lines = [f"listener {port} 127.0.0.1", "allow_anonymous true", "user root", "persistence false", "log_dest none"]
    conf.write_text("\n".join([*lines, *extra]) + "\n")
    return [shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(conf)]
