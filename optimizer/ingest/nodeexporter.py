"""The rest of an agentless node from node_exporter's series: logical CPUs, memory, local NVMe and network file
systems, as the host of the birth the Prometheus source builds (optimizer/ingest/promsource.py).

node_exporter names a node by its scrape target (``instance``: ``10.0.0.5:9100`` or ``gpu-17:9100``), dcgm-exporter
by its host name. ``node_uname_info`` carries both (``instance`` and ``nodename``), so it joins them; where it is
not scraped, the instance's host part is tried as the node's name.

What node_exporter cannot say is left unread: it exports no PCIe link, so no NVMe read estimate; and no raw disk
size, so the NVMe capacity is that of the file systems on NVMe devices (a drive in an md RAID, or not formatted,
is not counted; a node with NVMe devices but no file system on one has its capacity unread, not 0).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable

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
from collectors.hostinfo import NETWORK_FSTYPES, NETWORK_FUSE
from optimizer.ingest.promapi import Series

# One instant query each, at the read's end. The file system types are those the agent lists
# (collectors/hostinfo.py): NFS, Lustre, GPFS, CephFS, BeeGFS, WekaFS, SMB, and FUSE clients of object stores.
# The names hold only letters, digits and hyphens: nothing to escape but the dot (doubled: a PromQL string).
_FSTYPES = "|".join(sorted(NETWORK_FSTYPES | {f"fuse\\\\.{name}" for name in NETWORK_FUSE}))
QUERIES: dict[str, str] = {
    "names": "max by (instance, nodename) (node_uname_info)",
    "cpus": 'count by (instance) (node_cpu_seconds_total{mode="idle"})',
    "memory": "max by (instance) (node_memory_MemTotal_bytes)",
    "network": f'max by (instance, mountpoint, fstype) (node_filesystem_size_bytes{{fstype=~"{_FSTYPES}"}})',
    "nvme_fs": 'max by (instance, device) (node_filesystem_size_bytes{device=~"/dev/nvme[0-9]+n[0-9]+(p[0-9]+)?"})',
    # disks node_exporter's diskstats collector sees: NVMe namespaces or not, to tell "no NVMe" from "not read"
    "disks": "count by (instance, device) (node_disk_read_bytes_total)",
}
_NAMESPACE = re.compile(r"^nvme\d+n\d+$")


def _value(x: Series) -> float | None:
    return x.values[-1] if x.values and math.isfinite(x.values[-1]) else None


def _node_of(instance: str, names: dict[str, str], nodes: set[str]) -> str | None:
    """The node an ``instance`` is: by node_uname_info's nodename (whole, or up to its first dot), else by the
    instance's host part."""
    host = instance.rsplit(":", 1)[0] if instance.count(":") == 1 else instance
    for candidate in (names.get(instance, ""), names.get(instance, "").split(".", 1)[0], host, host.split(".", 1)[0]):
        if candidate in nodes:
            return candidate
    return None


def host_infos(answers: dict[str, list[Series]], nodes: Iterable[str]) -> tuple[dict[str, HostInfo], Counter[str]]:
    """Each node's host from the answers to ``QUERIES`` (by key), for the nodes named ``nodes``; and what was left
    out, by reason (``host_instance``: an instance that names no such node; ``host_value``: a figure out of range)."""
    wanted = set(nodes)
    skipped: Counter[str] = Counter()
    names = {x.labels.get("instance", ""): x.labels.get("nodename", "") for x in answers.get("names", [])}
    cpus: dict[str, int] = {}
    memory: dict[str, int] = {}
    mounts: dict[str, dict[str, NetworkMount]] = {}
    nvme: dict[str, int] = {}
    disks: dict[str, bool] = {}  # node -> whether any disk it lists is an NVMe namespace

    def node(x: Series) -> str | None:
        found = _node_of(x.labels.get("instance", ""), names, wanted)
        if found is None:
            skipped["host_instance"] += 1
        return found

    for x in answers.get("cpus", []):
        if (name := node(x)) is not None and (v := _value(x)) is not None:
            if 1 <= v <= MAX_CPUS:
                cpus[name] = int(v)
            else:
                skipped["host_value"] += 1
    for x in answers.get("memory", []):
        if (name := node(x)) is not None and (v := _value(x)) is not None:
            mib = int(v // 2**20)
            if 1 <= mib <= MAX_MEMORY_MIB:
                memory[name] = mib
            else:
                skipped["host_value"] += 1
    for x in answers.get("network", []):
        path, fstype = x.labels.get("mountpoint", ""), x.labels.get("fstype", "")
        if (name := node(x)) is not None and 1 <= len(path) <= MAX_MOUNT_PATH and 1 <= len(fstype) <= MAX_FSTYPE:
            listed = mounts.setdefault(name, {})
            if len(listed) < MAX_MOUNTS:
                listed.setdefault(path, NetworkMount(path=path, fstype=fstype))
    for x in answers.get("disks", []):
        if (name := node(x)) is not None:
            disks[name] = disks.get(name, False) or bool(_NAMESPACE.match(x.labels.get("device", "")))
    for x in answers.get("nvme_fs", []):
        if (name := node(x)) is not None and (v := _value(x)) is not None and v >= 0:
            nvme[name] = nvme.get(name, 0) + int(v)
    out: dict[str, HostInfo] = {}
    for name in sorted(set(cpus) | set(memory) | set(mounts) | set(disks) | set(nvme)):
        capacity: int | None = nvme.get(name)
        if capacity is None and disks.get(name) is False:
            capacity = 0  # its disks are read, and none is NVMe
        if capacity is not None and capacity > MAX_DISK_BYTES:
            skipped["host_value"] += 1
            capacity = None
        out[name] = HostInfo(
            cpu_cores=cpus.get(name),
            memory_mib=memory.get(name),
            local_nvme_bytes=capacity,
            network_mounts=list(mounts.get(name, {}).values()),
        )
    return out, skipped
