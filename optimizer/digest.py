"""What the optimizer keeps of a telemetry window: the few numbers features are computed from.

A decoded window is ~45 KiB of Python objects; a digest is a few hundred bytes. At 2,000 nodes and an hour of
10 s windows that is the difference between gigabytes and tens of megabytes.
"""

from __future__ import annotations

import fnmatch
from array import array
from dataclasses import dataclass

from agent.protocol import Birth, NicRole, Telemetry, WorkloadRef
from collectors.nic import DEFAULT_FABRIC_PATTERNS


@dataclass(frozen=True, slots=True)
class GpuDigest:
    index: int
    util_mean: float
    util_p95: float
    util_std: float
    series: array[float]  # per-second utilisation
    mem_max_mib: float | None
    link_bps: float  # NVLink + PCIe, both directions


@dataclass(frozen=True, slots=True)
class WindowDigest:
    session: int
    seq: int
    start: float
    end: float
    gpus: tuple[GpuDigest, ...]
    east_bps: float  # fabric NICs, both directions
    north_bps: float  # front-end NICs, both directions
    peak_write_bps: float  # the busiest second of the node's disks
    workloads: tuple[WorkloadRef, ...]


def _role(name: str, roles: dict[str, NicRole]) -> NicRole:
    if name in roles:
        return roles[name]
    # no birth yet: guess from the interface name, as the agent's defaults would
    fabric = any(fnmatch.fnmatchcase(name, p) for p in DEFAULT_FABRIC_PATTERNS)
    return NicRole.EAST_WEST if fabric else NicRole.NORTH_SOUTH


RefKey = tuple[str, str, str, tuple[int, ...], str | None]


def digest(window: Telemetry, birth: Birth | None, known: dict[RefKey, WorkloadRef] | None = None) -> WindowDigest:
    """``known`` interns workload references: a node reports the same workloads window after window."""
    roles = {n.name: n.role for n in birth.nics} if birth else {}
    if known is None:
        refs = tuple(window.workloads)
    else:
        refs = tuple(known.setdefault((r.id, r.kind, r.name, tuple(r.gpus), r.hint), r) for r in window.workloads)
    gpus = []
    for g in window.gpus:
        if g.util is None:
            continue
        link = sum(s.mean for s in (g.nvlink_tx_bps, g.nvlink_rx_bps, g.pcie_tx_bps, g.pcie_rx_bps) if s)
        gpus.append(
            GpuDigest(
                index=g.index,
                util_mean=g.util.mean,
                util_p95=g.util.p95,
                util_std=g.util.std,
                series=array("f", g.util_series),
                mem_max_mib=g.mem_used_mib.max if g.mem_used_mib else None,
                link_bps=link,
            )
        )
    east = north = 0.0
    for nic in window.nics:
        rate = (nic.tx_bps.mean if nic.tx_bps else 0.0) + (nic.rx_bps.mean if nic.rx_bps else 0.0)
        role = _role(nic.name, roles)
        if role is NicRole.EAST_WEST:
            east += rate
        elif role is NicRole.NORTH_SOUTH:
            north += rate
    return WindowDigest(
        session=window.session,
        seq=window.seq,
        start=window.start,
        end=window.end,
        gpus=tuple(gpus),
        east_bps=east,
        north_bps=north,
        peak_write_bps=sum(d.write_bps.max for d in window.disks if d.write_bps),
        workloads=refs,
    )
