"""Block devices from /proc/diskstats, read as psutil reads it: whole disks only, partitions and loop/ram devices
left out; and the usage of configured mount points (checkpoint and model-cache volumes).

Signals (per disk): ``read_bps`` / ``write_bps`` (counters, bytes), ``read_iops`` / ``write_iops`` (counters).
Per mount point: ``used_pct`` and ``free_bytes`` as they stand at the end of the window.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from agent.protocol import DiskInfo, WorkloadRef
from collectors.base import Entity, Inventory, Sample
from collectors.procfs import read_bytes

log = logging.getLogger(__name__)
_SKIP_PREFIXES = ("loop", "ram", "zram", "sr", "fd")
SECTOR_BYTES = 512  # /sys/block/*/size counts 512-byte sectors whatever the device's block size


def mount_usage(path: str) -> tuple[float, int]:
    """(% used, bytes free) of a mount point as ``psutil.disk_usage`` and df(1) give them: the blocks kept for
    root count as used, and neither as free nor in the total the percentage is taken of."""
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    free = st.f_bavail * st.f_frsize
    return (round(used / (used + free) * 100, 1) if used + free else 0.0), free


class StorageCollector:
    name = "storage"

    def __init__(
        self, sysfs_root: Path = Path("/sys"), mounts: Sequence[str] = (), procfs_root: Path = Path("/proc")
    ) -> None:
        self._sysfs = sysfs_root
        self._procfs = str(procfs_root)
        self._mounts = list(mounts)
        # statvfs on a hung network mount never returns: with mounts to read, a thread of its own.
        # /proc/diskstats alone is kernel memory: on the loop.
        self.blocking = bool(self._mounts)
        self._missing: set[str] = set()
        self._disk_names: dict[str, bool] = {}  # devices come and go rarely: ask sysfs once per name

    def _is_disk(self, name: str) -> bool:
        known = self._disk_names.get(name)
        if known is None:
            known = self._disk_names[name] = (
                not name.startswith(_SKIP_PREFIXES) and (self._sysfs / "block" / name).is_dir()
            )
        return known

    def _size(self, name: str) -> int | None:
        try:
            return int((self._sysfs / "block" / name / "size").read_text()) * SECTOR_BYTES
        except (OSError, ValueError):
            return None

    def _counters(self) -> dict[str, object]:
        return dict(self._disk_counters())

    def _disk_counters(self) -> dict[str, tuple[int, int, int, int]]:
        """(reads, writes, bytes read, bytes written) of each whole disk: /proc/diskstats read as psutil reads
        it (``disk_io_counters(perdisk=True, nowrap=False)``, whose own parsing cost more than the agent's whole
        sampling of the disks); psutil itself where the file is missing or laid out as before Linux 2.6."""
        data = read_bytes(f"{self._procfs}/diskstats")
        out: dict[str, tuple[int, int, int, int]] = {}
        for line in (data or b"").splitlines():
            fields = line.split()
            if len(fields) == 14 or len(fields) >= 18:  # a disk; 4.18 and 5.5 added fields at the end
                reads, read_sectors, writes, written_sectors = fields[3], fields[5], fields[7], fields[9]
            elif len(fields) == 7:  # a partition, in 2.6's short form
                reads, read_sectors, writes, written_sectors = fields[3:7]
            else:
                data = None
                break
            name = fields[2].decode(errors="surrogateescape")
            if self._is_disk(name):
                out[name] = (
                    int(reads),
                    int(writes),
                    int(read_sectors) * SECTOR_BYTES,
                    int(written_sectors) * SECTOR_BYTES,
                )
        if data is None:
            import psutil  # only here: its modules are 0.9 MiB of the agent's 40 MiB budget

            return {
                name: (c.read_count, c.write_count, c.read_bytes, c.write_bytes)
                for name, c in (psutil.disk_io_counters(perdisk=True, nowrap=False) or {}).items()
                if self._is_disk(name)
            }
        return out

    def _holder(self, name: str) -> str | None:
        """The md RAID or device-mapper device built on this disk or on one of its partitions (the usual layout:
        md0 on sda1 and sdb1): its I/O is counted again on that device."""
        disk = self._sysfs / "block" / name
        holders: set[str] = set()
        for directory in (disk / "holders", *disk.glob(f"{name}*/holders")):
            try:
                holders.update(p.name for p in directory.iterdir())
            except OSError:
                continue
        return min(holders)[:64] if holders else None

    def inventory(self) -> Inventory:
        disks = [
            DiskInfo(name=n, size_bytes=self._size(n), member_of=self._holder(n))
            for n in sorted(self._counters())
            if self._is_disk(n)
        ]
        return Inventory(disks=disks)

    def sample(self) -> list[Sample]:
        out = [
            Sample(
                Entity.DISK,
                name,
                counters={"read_bps": read, "write_bps": written, "read_iops": reads, "write_iops": writes},
            )
            for name, (reads, writes, read, written) in self._disk_counters().items()
        ]
        for path in self._mounts:
            try:
                used_pct, free = mount_usage(path)
            except OSError as exc:
                if path not in self._missing:
                    log.warning("mount point %s unreadable: %s", path, exc)
                    self._missing.add(path)
                continue
            self._missing.discard(path)
            out.append(Sample(Entity.MOUNT, path, latest={"used_pct": used_pct, "free_bytes": free}))
        return out

    def workloads(self) -> list[WorkloadRef]:
        return []

    def close(self) -> None:
        return None
