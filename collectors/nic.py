"""Network interfaces from psutil, classified through sysfs, with RDMA traffic from the InfiniBand port
counters (which is the only place RDMA bytes show up).

Signals (per interface): ``rx_bps`` / ``tx_bps`` (counters, bytes), ``errors`` and ``drops`` (counters).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from pathlib import Path

import psutil

from agent.protocol import NicInfo, NicKind, NicRole, WorkloadRef
from collectors import infiniband
from collectors.base import Entity, Inventory, Sample

ARPHRD_INFINIBAND = 32
ARPHRD_LOOPBACK = 772
DEFAULT_FABRIC_PATTERNS = ("ib*", "rdma*", "roce*")


def classify_interface(name: str, sysfs_root: Path) -> NicKind:
    """Tell InfiniBand, RoCE, Ethernet, loopback and virtual interfaces apart from sysfs."""
    base = sysfs_root / "class" / "net" / name
    try:
        arp_type = int((base / "type").read_text().strip())
    except (OSError, ValueError):
        arp_type = -1
    if arp_type == ARPHRD_LOOPBACK or name == "lo":
        return NicKind.LOOPBACK
    if arp_type == ARPHRD_INFINIBAND:
        return NicKind.INFINIBAND
    if not (base / "device").exists():
        return NicKind.VIRTUAL  # bridges, veth, bonds, tunnels: no hardware behind them
    if (base / "device" / "infiniband").is_dir():
        return NicKind.ROCE
    return NicKind.ETHERNET


def default_route_interfaces(procfs_root: Path) -> set[str]:
    """Interfaces carrying an IPv4 default route: the node's front end."""
    try:
        lines = (procfs_root / "net" / "route").read_text().splitlines()[1:]
    except OSError:
        return set()
    return {f[0] for f in (line.split() for line in lines) if len(f) > 2 and f[1] == "00000000"}


def role_of(
    name: str, kind: NicKind, fabric_patterns: Sequence[str], front_end: frozenset[str] = frozenset()
) -> NicRole:
    """East-west for RDMA fabrics and names matching the fabric patterns, north-south for other NICs.

    A ConnectX Ethernet port has an RDMA device whether it is the fabric or a 100 GbE front end; the port that
    carries the default route is the front end."""
    if kind in (NicKind.LOOPBACK, NicKind.VIRTUAL):
        return NicRole.OTHER
    if name in front_end and kind is NicKind.ROCE:
        return NicRole.NORTH_SOUTH
    if kind in (NicKind.INFINIBAND, NicKind.ROCE):
        return NicRole.EAST_WEST
    if any(fnmatch.fnmatchcase(name, pattern) for pattern in fabric_patterns):
        return NicRole.EAST_WEST
    return NicRole.NORTH_SOUTH


class NicCollector:
    name = "nic"

    def __init__(
        self,
        sysfs_root: Path = Path("/sys"),
        fabric_patterns: Sequence[str] = DEFAULT_FABRIC_PATTERNS,
        include_virtual: bool = False,
        procfs_root: Path = Path("/proc"),
    ) -> None:
        self._sysfs = sysfs_root
        self._procfs = procfs_root
        self._fabric = tuple(fabric_patterns)
        self._include_virtual = include_virtual
        self._kinds: dict[str, NicKind] = {}
        self._rdma = {port.name: port for port in infiniband.discover(sysfs_root)}

    def _kind(self, name: str) -> NicKind:
        if name not in self._kinds:
            port = self._rdma.get(name)
            if port is not None:
                self._kinds[name] = NicKind.ROCE if port.link_layer == "Ethernet" else NicKind.INFINIBAND
            else:
                self._kinds[name] = classify_interface(name, self._sysfs)
        return self._kinds[name]

    def _wanted(self, name: str) -> bool:
        kind = self._kind(name)
        return kind is not NicKind.LOOPBACK and (self._include_virtual or kind is not NicKind.VIRTUAL)

    def _names(self) -> list[str]:
        """psutil's interfaces, plus RDMA ports that have no network interface of their own."""
        names = set(psutil.net_io_counters(pernic=True)) | set(self._rdma)
        return sorted(n for n in names if self._wanted(n))

    def inventory(self) -> Inventory:
        stats = psutil.net_if_stats()
        front_end = frozenset(default_route_interfaces(self._procfs))
        nics = []
        for name in self._names():
            kind = self._kind(name)
            port = self._rdma.get(name)
            speed = port.rate_mbps if port else None
            if speed is None and name in stats and stats[name].speed > 0:
                speed = stats[name].speed
            nics.append(
                NicInfo(name=name, kind=kind, role=role_of(name, kind, self._fabric, front_end), speed_mbps=speed)
            )
        return Inventory(nics=nics)

    def sample(self) -> list[Sample]:
        out = [Sample(Entity.NIC, name, counters=infiniband.read_counters(p)) for name, p in self._rdma.items()]
        for name, c in psutil.net_io_counters(pernic=True).items():
            if name in self._rdma or not self._wanted(name):
                continue
            out.append(
                Sample(
                    Entity.NIC,
                    name,
                    counters={
                        "rx_bps": c.bytes_recv,
                        "tx_bps": c.bytes_sent,
                        "errors": c.errin + c.errout,
                        "drops": c.dropin + c.dropout,
                    },
                )
            )
        return out

    def workloads(self) -> list[WorkloadRef]:
        return []

    def close(self) -> None:
        return None
