"""What the rest of the node offers its GPUs, read once at start for the birth: logical CPUs online, memory,
local NVMe (capacity and an estimate of its read bandwidth) and network file systems.

Every read goes through ``procfs_root`` and ``sysfs_root``, so tests run it on fixture trees. A file that is
missing, unreadable or holds something unexpected leaves its field None (not read), never a wrong number and
never an exception: the birth goes out without it.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from agent.protocol import (
    MAX_CPUS,
    MAX_DISK_BYTES,
    MAX_FSTYPE,
    MAX_MEMORY_MIB,
    MAX_MOUNT_PATH,
    MAX_MOUNTS,
    HostInfo,
    NetworkMount,
)
from collectors.procfs import read_text
from collectors.storage import SECTOR_BYTES

log = logging.getLogger(__name__)

# Usable bytes/s per lane and direction of each PCIe link rate, after line coding (8b/10b for 2.5 and 5 GT/s,
# 128b/130b from 8 GT/s): PCI-SIG, PCI Express Base Specification 1.0-5.0, as tabulated in PCI-SIG's
# "PCI Express 6.0 Specification" FAQ (Gen3 0.985, Gen4 1.969, Gen5 3.938 GB/s per lane).
LANE_BPS = {2.5: 0.25e9, 5.0: 0.5e9, 8.0: 0.985e9, 16.0: 1.969e9, 32.0: 3.938e9}
# An estimate of the most one drive reads sequentially, whatever its link: the fastest PCIe 5.0 x4 data-centre
# drives' datasheets give 14 GB/s (Micron 9550, Kioxia CM7-R), under their link's 15.75 GB/s, and a drive on a
# wider link (x8 add-in cards) is no faster inside. The link is an upper bound; this keeps it near real drives.
DRIVE_READ_CAP_BPS = 14e9
MAX_DRIVE_LANES = 16
# File systems that read over the network, by their type in mountinfo. Kernel clients: NFS (nfs, nfs4), Lustre,
# IBM Storage Scale (gpfs), CephFS (ceph), BeeGFS, WekaFS, SMB (cifs, smb3). FUSE clients show as fuse.<name>:
# object stores (s3fs, gcsfuse, AWS mountpoint-s3, goofys, rclone, Azure blobfuse2, JuiceFS, Alluxio) and
# network file systems (ceph-fuse, glusterfs, sshfs). Other FUSE types are local (lxcfs, snapfuse, gvfsd-fuse,
# portal): listing every fuse.* would call a container's /proc overlay network storage.
NETWORK_FSTYPES = frozenset({"nfs", "nfs4", "lustre", "gpfs", "ceph", "beegfs", "wekafs", "cifs", "smb3"})
NETWORK_FUSE = frozenset(
    {"s3fs", "gcsfuse", "mountpoint-s3", "goofys", "rclone", "blobfuse2", "juicefs", "alluxio-fuse"}
    | {"ceph-fuse", "glusterfs", "sshfs"}
)

_CPU_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_NAMESPACE = re.compile(r"^nvme\d+n\d+$")
_PATH = re.compile(r"^nvme(\d+)c\d+n(\d+)$")  # one path of a multipath namespace; its block device is nvme<s>n<n>
_LINK_SPEED = re.compile(r"^(\d+(?:\.\d+)?) GT/s")
_OCTAL = re.compile(r"\\([0-7]{3})")


def cpus_online(sysfs_root: Path) -> int | None:
    """Logical CPUs online on the node, from ``devices/system/cpu/online`` ("0-223", "0-3,8-11").

    sysfs rather than ``os.sched_getaffinity``: the agent's own affinity is whatever cpuset its unit or container
    gave it, while the data loaders of the node's jobs can use every CPU online."""
    text = read_text(f"{sysfs_root}/devices/system/cpu/online")
    if text is None:
        return None
    total = 0
    for part in text.strip().split(","):
        m = _CPU_RANGE.match(part.strip())
        if m is None:
            return None
        first, last = int(m[1]), int(m[2] or m[1])
        if last < first:
            return None
        total += last - first + 1
    return total if 1 <= total <= MAX_CPUS else None


def memory_mib(procfs_root: Path) -> int | None:
    """MemTotal from ``meminfo``, in MiB."""
    for line in (read_text(f"{procfs_root}/meminfo") or "").splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == "MemTotal:" and words[2] == "kB" and words[1].isdigit():
            mib = int(words[1]) // 1024
            return mib if 1 <= mib <= MAX_MEMORY_MIB else None
    return None


def link_estimate(gts: float, lanes: int) -> float | None:
    """An estimate of what a drive on a PCIe link of ``gts`` GT/s and ``lanes`` lanes reads, bytes/s: the link's
    rate, capped at ``DRIVE_READ_CAP_BPS``; None for a rate not in ``LANE_BPS`` or a width out of range."""
    per_lane = LANE_BPS.get(gts)
    if per_lane is None or not 1 <= lanes <= MAX_DRIVE_LANES:
        return None
    return min(per_lane * lanes, DRIVE_READ_CAP_BPS)


def link_read_bps(device: Path) -> float | None:
    """An estimate of one NVMe controller's sequential read, bytes/s: its PCIe link's rate (``current_link_speed``
    × ``current_link_width``) capped at ``DRIVE_READ_CAP_BPS``; None where the link cannot be read."""
    speed = read_text(f"{device}/current_link_speed")
    width = read_text(f"{device}/current_link_width")
    m = _LINK_SPEED.match((speed or "").strip())
    lanes = (width or "").strip()
    if m is None or not lanes.isdigit():
        return None
    return link_estimate(float(m[1]), int(lanes))


def _namespaces(controller: Path) -> set[str]:
    """The block devices of a controller's namespaces (one for all paths of a multipath namespace)."""
    names = set()
    for child in controller.iterdir():
        if _NAMESPACE.match(child.name):
            names.add(child.name)
        elif m := _PATH.match(child.name):
            names.add(f"nvme{m[1]}n{m[2]}")
    return names


def local_nvme(sysfs_root: Path) -> tuple[int | None, float | None]:
    """(bytes, read bytes/s estimate) of the NVMe drives on this node's own PCIe bus: controllers whose transport
    is ``pcie``, so NVMe over fabrics (tcp, rdma, fc), which is network storage, is left out. (0, 0.0) where
    sysfs is readable and lists no NVMe; the bandwidth None where any local controller's link is unreadable (a
    sum over some of them would read as the node's)."""
    classes = sysfs_root / "class"
    if not classes.is_dir():
        return None, None
    controllers = classes / "nvme"
    total = 0
    read_bps: float | None = 0.0
    seen: set[str] = set()
    try:
        listed = sorted(controllers.iterdir()) if controllers.is_dir() else []
        for controller in listed:
            transport = (read_text(f"{controller}/transport") or "").strip()
            if transport != "pcie":
                continue
            bps = link_read_bps(controller / "device")
            read_bps = None if bps is None or read_bps is None else read_bps + bps
            for name in sorted(_namespaces(controller) - seen):
                seen.add(name)
                size = (read_text(f"{sysfs_root}/block/{name}/size") or "").strip()
                if not size.isdigit():
                    return None, read_bps
                total += int(size) * SECTOR_BYTES
    except OSError as exc:
        log.info("NVMe drives not read under %s: %s", sysfs_root, exc)
        return None, None
    return (total if total <= MAX_DISK_BYTES else None), read_bps


def network_mounts(procfs_root: Path) -> list[NetworkMount] | None:
    """Network file systems mounted in the agent's mount namespace, from ``self/mountinfo``: the host's own where
    the agent runs as a systemd unit, as packaged. None where mountinfo cannot be read."""
    text = read_text(f"{procfs_root}/self/mountinfo")
    if text is None:
        return None
    out: dict[str, NetworkMount] = {}
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, after = head.split(), tail.split()
        if not sep or len(fields) < 5 or not after:
            continue
        fstype = after[0]
        kind, _, sub = fstype.partition(".")
        if not (fstype in NETWORK_FSTYPES or (kind == "fuse" and sub in NETWORK_FUSE)):
            continue
        path = _OCTAL.sub(lambda m: chr(int(m[1], 8)), fields[4])  # mountinfo escapes space, tab, newline, \
        if 1 <= len(path) <= MAX_MOUNT_PATH and len(fstype) <= MAX_FSTYPE and path not in out and len(out) < MAX_MOUNTS:
            out[path] = NetworkMount(path=path, fstype=fstype)
    return list(out.values())


def read_host_info(procfs_root: Path = Path("/proc"), sysfs_root: Path = Path("/sys")) -> HostInfo:
    """The node's host, every field read on its own: one that cannot be read is None, the others stand."""
    nvme_bytes, nvme_bps = local_nvme(sysfs_root)
    mounts = network_mounts(procfs_root)
    return HostInfo(
        cpu_cores=cpus_online(sysfs_root),
        memory_mib=memory_mib(procfs_root),
        local_nvme_bytes=nvme_bytes,
        local_nvme_read_bps=nvme_bps,
        network_mounts=mounts or [],
    )
