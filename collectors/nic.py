"""Network interfaces from /proc/net/dev, classified through sysfs, with RDMA traffic from the InfiniBand port
counters (which is the only place RDMA bytes show up).

Signals (per interface): ``rx_bps`` / ``tx_bps`` (counters, bytes), ``errors`` and ``drops`` (counters).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from pathlib import Path

from agent.protocol import NicInfo, NicKind, NicRole, WorkloadRef
from collectors import infiniband
from collectors.base import Entity, Inventory, Sample
from collectors.procfs import read_bytes

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


# The fields of /proc/net/dev the agent sends: bytes received and sent, errors in and out, drops in and out.
_NET_DEV_FIELDS = (0, 8, 2, 10, 3, 11)
NetCounters = tuple[int, int, int, int]  # bytes received, bytes sent, errors, drops


class NetDev:
    """``psutil.net_io_counters(pernic=True)`` for the fields the agent sends, from /proc/net/dev, without the
    named tuples that made psutil's call cost several times the read. As with psutil's default (``nowrap``), a
    counter that goes back is taken to have wrapped at its last value, which is added to it from then on,
    until the interface is gone."""

    def __init__(self, procfs_root: Path = Path("/proc")) -> None:
        self._path = f"{procfs_root}/net/dev"
        self._last: dict[str, tuple[int, ...]] = {}
        self._carried: dict[str, list[int]] = {}

    def read(self) -> dict[str, NetCounters]:
        data = read_bytes(self._path)
        if data is None:  # psutil reads nothing else on Linux: its error, or what it finds
            import psutil  # only here: its modules are 0.9 MiB of the agent's 40 MiB budget

            return {
                name: (c.bytes_recv, c.bytes_sent, c.errin + c.errout, c.dropin + c.dropout)
                for name, c in psutil.net_io_counters(pernic=True).items()
            }
        raw: dict[str, tuple[int, ...]] = {}
        for line in data.splitlines()[2:]:
            colon = line.rfind(b":")
            fields = line[colon + 1 :].split()
            if colon <= 0 or len(fields) != 16:
                raise ValueError(f"not sure how to interpret line {line!r} of /proc/net/dev")
            raw[line[:colon].strip().decode(errors="surrogateescape")] = tuple(int(fields[i]) for i in _NET_DEV_FIELDS)
        out: dict[str, NetCounters] = {}
        for name, now in raw.items():
            last = self._last.get(name)
            values = now
            if last is not None:
                carried = self._carried.setdefault(name, [0] * len(now))
                for i, (value, before) in enumerate(zip(now, last, strict=True)):
                    if value < before:
                        carried[i] += before
                values = tuple(v + c for v, c in zip(now, carried, strict=True))
            out[name] = (values[0], values[1], values[2] + values[3], values[4] + values[5])
        for gone in [name for name in self._carried if name not in raw]:
            del self._carried[gone]
        self._last = raw
        return out

    def names(self) -> list[str]:
        """The interfaces the file lists, without reading their counters."""
        data = read_bytes(self._path)
        if data is None:
            import psutil  # only here, as in read()

            return list(psutil.net_io_counters(pernic=True))
        return [
            line[:colon].strip().decode(errors="surrogateescape")
            for line in data.splitlines()[2:]
            if (colon := line.rfind(b":")) > 0
        ]


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
        self._net_dev = NetDev(procfs_root)
        # An RDMA port's counters are a firmware query behind each sysfs read, which a wedged adapter can hold for
        # seconds: then the collector runs on a thread of its own. /proc/net/dev is kernel memory: on the loop.
        self.blocking = bool(self._rdma)

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
        """The interfaces of /proc/net/dev (psutil's), plus RDMA ports that have no network interface of their
        own."""
        names = set(self._net_dev.names()) | set(self._rdma)
        return sorted(n for n in names if self._wanted(n))

    def _speed(self, name: str) -> int | None:
        """The link speed in Mb/s as the driver reports it (the ethtool figure psutil's ``net_if_stats`` asks
        for); None when the link is down or the driver does not know (the kernel answers EINVAL, or -1)."""
        try:
            speed = int((self._sysfs / "class" / "net" / name / "speed").read_text())
        except (OSError, ValueError):
            return None
        return speed if speed > 0 else None

    def inventory(self) -> Inventory:
        front_end = frozenset(default_route_interfaces(self._procfs))
        nics = []
        for name in self._names():
            kind = self._kind(name)
            port = self._rdma.get(name)
            speed = port.rate_mbps if port else None
            if speed is None:
                speed = self._speed(name)
            nics.append(
                NicInfo(name=name, kind=kind, role=role_of(name, kind, self._fabric, front_end), speed_mbps=speed)
            )
        return Inventory(nics=nics)

    def sample(self) -> list[Sample]:
        out = [Sample(Entity.NIC, name, counters=infiniband.read_counters(p)) for name, p in self._rdma.items()]
        for name, (rx, tx, errors, drops) in self._net_dev.read().items():
            if name in self._rdma or not self._wanted(name):
                continue
            out.append(
                Sample(
                    Entity.NIC,
                    name,
                    counters={"rx_bps": rx, "tx_bps": tx, "errors": errors, "drops": drops},
                )
            )
        return out

    def workloads(self) -> list[WorkloadRef]:
        return []

    def close(self) -> None:
        return None
