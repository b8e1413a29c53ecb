"""Block devices from psutil: whole disks only, partitions and loop/ram devices left out; and the usage of
configured mount points (checkpoint and model-cache volumes).

Signals (per disk): ``read_bps`` / ``write_bps`` (counters, bytes), ``read_iops`` / ``write_iops`` (counters).
Per mount point: ``used_pct`` and ``free_bytes`` as they stand at the end of the window.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import psutil

from agent.protocol import DiskInfo, WorkloadRef
from collectors.base import Entity, Inventory, Sample

log = logging.getLogger(__name__)
_SKIP_PREFIXES = ("loop", "ram", "zram", "sr", "fd")
SECTOR_BYTES = 512  # /sys/block/*/size counts 512-byte sectors whatever the device's block size


class StorageCollector:
    name = "storage"

    def __init__(self, sysfs_root: Path = Path("/sys"), mounts: Sequence[str] = ()) -> None:
        self._sysfs = sysfs_root
        self._mounts = list(mounts)
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
        return dict(psutil.disk_io_counters(perdisk=True, nowrap=False) or {})

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
        out = []
        for name, c in (psutil.disk_io_counters(perdisk=True, nowrap=False) or {}).items():
            if not self._is_disk(name):
                continue
            out.append(
                Sample(
                    Entity.DISK,
                    name,
                    counters={
                        "read_bps": c.read_bytes,
                        "write_bps": c.write_bytes,
                        "read_iops": c.read_count,
                        "write_iops": c.write_count,
                    },
                )
            )
        for path in self._mounts:
            try:
                usage = psutil.disk_usage(path)
            except OSError as exc:
                if path not in self._missing:
                    log.warning("mount point %s unreadable: %s", path, exc)
                    self._missing.add(path)
                continue
            self._missing.discard(path)
            out.append(Sample(Entity.MOUNT, path, latest={"used_pct": usage.percent, "free_bytes": usage.free}))
        return out

    def workloads(self) -> list[WorkloadRef]:
        return []

    def close(self) -> None:
        return None
