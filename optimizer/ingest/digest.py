"""What the optimizer keeps of a telemetry window: the few numbers features are computed from.

A decoded window is ~39 KiB of Python objects; a digest of one with 8 GPUs ~1.4 KiB, most of it one float32 array
of its GPUs' figures and per-second series. At 2,000 nodes and an hour of 10 s windows that is the difference
between gigabytes and tens of megabytes.
"""

from __future__ import annotations

import fnmatch
import math
import operator
import re
from array import array
from collections import Counter
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, NamedTuple, cast

import msgspec

from agent.protocol import FLOAT32_MAX, Birth, NicKind, NicRole, WorkloadRef
from collectors.nic import DEFAULT_FABRIC_PATTERNS
from optimizer.ingest.window import MAX, MEAN, P95, STD, Window, WindowGpu, WindowWorkload

_NONE = float("nan")  # an absent figure, in the packed arrays
HEAD = 9  # a GPU's figures before its series: index, util_mean, ..., dram_active
SERIES_AT = HEAD  # where the per-second series starts in a GpuDigest
ROW_SECONDS = HEAD  # in a row of GpuRows: how many seconds of series the row holds
ROW_SERIES_AT = HEAD + 1  # in a row of GpuRows: where the series starts


def _optional(position: int) -> property:
    def get(self: GpuDigest) -> float | None:
        value = self[position]
        return None if math.isnan(value) else value

    return property(get)


class GpuDigest(array):  # type: ignore[type-arg]
    """One GPU over one window, as one float32 array: ``[index, util_mean, util_p95, util_std, mem_max_mib,
    link_bps, power_frac, tensor_active, dram_active, *series]``, absent figures as NaN. float32 holds 7
    significant digits; the wire carries 4.

    What a window keeps is ``GpuRows``, all its GPUs in one array; a GpuDigest is one GPU of it, copied out for
    readers that want a GPU at a time (``GpuRows.views``)."""

    __slots__ = ()

    def __new__(cls, values: Iterable[float]) -> GpuDigest:
        return super().__new__(cls, "f", values)  # type: ignore[return-value]

    @classmethod
    def of(
        cls,
        index: int,
        util_mean: float,
        util_p95: float,
        util_std: float,
        series: Sequence[float],
        mem_max_mib: float | None = None,
        link_bps: float = 0.0,
        power_frac: float | None = None,
        tensor_active: float | None = None,
        dram_active: float | None = None,
    ) -> GpuDigest:
        head = (index, util_mean, util_p95, util_std, mem_max_mib, link_bps, power_frac, tensor_active, dram_active)
        return cls([_NONE if v is None else v for v in head] + list(series))

    @property
    def index(self) -> int:  # type: ignore[override]
        return int(self[0])

    if TYPE_CHECKING:
        util_mean: float
        util_p95: float
        util_std: float
        mem_max_mib: float | None
        link_bps: float  # NVLink + PCIe, both directions
        power_frac: float | None  # mean board power / its limit
        tensor_active: float | None  # GPM, %
        dram_active: float | None  # GPM, %
    else:  # read by C calls where a figure is always there
        util_mean = property(itemgetter(1))
        util_p95 = property(itemgetter(2))
        util_std = property(itemgetter(3))
        mem_max_mib = _optional(4)
        link_bps = property(itemgetter(5))
        power_frac = _optional(6)
        tensor_active = _optional(7)
        dram_active = _optional(8)

    @property
    def series(self) -> array[float]:
        """Per-second utilisation."""
        return self[SERIES_AT:]


if TYPE_CHECKING:
    _Floats = array[float]
else:
    _Floats = array  # not subscriptable at run time


class GpuRows(_Floats):
    """Every GPU of one window in one float32 array: ``[width, *rows]``, each row ``width`` figures long: a
    GpuDigest's head (index .. dram_active), how many seconds its series holds, then the series, NaN-padded to
    the window's longest.

    A node keeps ``horizon_windows`` of these. One array per GPU cost an object header and an allocation of its
    own for each (~170 bytes a GPU at 10 s windows, half of it not figures); one per window, ~90 bytes a GPU
    (docs/operations.md, "Memory per node"). Column ``k`` of every row is ``rows[1 + k :: rows.width]``: one C call."""

    __slots__ = ()

    @classmethod
    def of(cls, gpus: Iterable[Sequence[float]]) -> GpuRows:
        """Rows of GPUs given as a GpuDigest's layout (head, then series)."""
        return _pack([[*g[:HEAD], len(g) - HEAD, *g[HEAD:]] for g in gpus])

    @property
    def width(self) -> int:
        return int(self[0])

    @property
    def gpu_count(self) -> int:
        """GPUs in the window."""
        return (len(self) - 1) // int(self[0])

    def column(self, at: int) -> array[float]:
        """Figure ``at`` of a row (``ROW_SECONDS``, or a GpuDigest's position before ``HEAD``) for every GPU."""
        return self[1 + at :: int(self[0])]

    def starts(self, ids: Container[float]) -> list[int]:
        """Where the rows of the GPUs ``ids`` start, in order (1.0 in {1} holds)."""
        width = int(self[0])
        return [1 + k * width for k, index in enumerate(self[1::width]) if index in ids]

    def view(self, k: int) -> GpuDigest:
        """GPU ``k`` of the window (its row, in order) as a GpuDigest: a copy."""
        at = 1 + k * int(self[0])
        seconds = int(self[at + ROW_SECONDS])
        return _digest(self[at : at + HEAD] + self[at + ROW_SERIES_AT : at + ROW_SERIES_AT + seconds])

    def views(self) -> tuple[GpuDigest, ...]:
        return tuple(map(self.view, range(self.gpu_count)))


_digest = cast("Callable[[array[float]], GpuDigest]", partial(array.__new__, GpuDigest, "f"))
# GpuRows of a flat list by one C call (a class's own __new__ is a Python-level call): one per window.
_block = cast(Callable[[list[float]], GpuRows], partial(array.__new__, GpuRows, "f"))


def _padded(flat: list[float], seconds: list[int]) -> GpuRows:
    """``digest``'s rows, one after the other in ``flat`` after its width, each padded to that width."""
    rows, at = [], 1
    for n in seconds:
        rows.append(flat[at : at + ROW_SERIES_AT + n])
        at += ROW_SERIES_AT + n
    return _pack(rows)


def _pack(rows: list[list[float]]) -> GpuRows:
    """Rows (head, seconds, series) into one array, shorter series padded to the longest."""
    longest = max(map(len, rows), default=ROW_SERIES_AT)
    flat: list[float] = [longest]
    for row in rows:
        flat += row
        if len(row) < longest:
            flat += [_NONE] * (longest - len(row))
    return _block(flat)


@dataclass(frozen=True, slots=True)
class Volatile:
    """The per-window numbers of a workload's process facts (schema 2); the rest of its reference is interned."""

    workload: str
    inbound_connections: int | None
    inbound_peers: int | None
    net_rx_bps: float | None
    net_tx_bps: float | None
    gpu_mem_mib: tuple[float | None, ...] | None = None  # MiB held on each GPU of its reference, in that order
    disk_read_bps: float | None = None  # its processes' own storage reads and writes (/proc/<pid>/io)
    disk_write_bps: float | None = None


class Throttle(NamedTuple):
    """What held one GPU below its clocks over a window, % of it (the reasons may overlap): the power cap or power
    brake (the clock event reason or NVML's power violation time, whichever is more), heat (reason or violation
    time), the hardware slowdown signal; and the power limit it enforced, W (NaN: not reported)."""

    gpu: int  # its index
    power_pct: float
    thermal_pct: float
    hw_slowdown_pct: float
    power_limit_w: float

    @property
    def held_pct(self) -> float:
        """The share of the window held down by any reason: at least the largest of them."""
        return max(self.power_pct, self.thermal_pct, self.hw_slowdown_pct)


class Blind(NamedTuple):
    """A GPU that reports no utilisation over a window (NVML has none for an A100 or A30 in MIG mode): what it
    does report. NaN: not reported."""

    gpu: int  # its index
    mem_max_mib: float
    link_bps: float


@dataclass(frozen=True, slots=True)
class WindowDigest:
    session: int
    seq: int
    start: float
    end: float
    gpu_rows: GpuRows
    east_bps: float  # fabric NICs, both directions
    north_bps: float  # front-end NICs, both directions
    peak_write_bps: float  # the busiest second of the node's disks (RAID and LVM members not counted twice)
    workloads: tuple[WorkloadRef, ...]
    north_rx_bps: float = 0.0  # front-end NICs, in: client requests, or input read from NFS / object storage
    north_tx_peak_bps: float = 0.0  # front-end NICs, out, the busiest second: checkpoints saved to NFS show here
    read_bps: float = 0.0  # the node's disks, mean
    volatile: tuple[Volatile, ...] = ()
    write_bps: float = 0.0  # the node's disks, mean: a batch job's results written steadily show here
    throttles: tuple[Throttle, ...] = ()  # GPUs held below their clocks at all this window (none: a healthy node)
    blind: tuple[Blind, ...] = ()  # GPUs that report no utilisation (MIG before Hopper): kept out of ``gpu_rows``
    cpu_util: float | None = None  # the host's CPUs, mean %: a data loader that holds every core shows here


_MD = re.compile(r"^(md\d+|dm-\d+)$")


def roles(birth: Birth | None) -> dict[str, NicRole]:
    """NIC roles from the birth, corrected for agents before schema 2, which took every RDMA-capable port for
    the fabric. A node always has a front end: when a birth names none, RoCE ports are the front end if the node
    also has InfiniBand (fabrics are one technology), or else those not named like a fabric port."""
    if birth is None:
        return {}
    out = {n.name: n.role for n in birth.nics}
    if any(role is NicRole.NORTH_SOUTH for role in out.values()):
        return out
    infiniband = any(n.kind is NicKind.INFINIBAND for n in birth.nics)
    for n in birth.nics:
        named_fabric = any(fnmatch.fnmatchcase(n.name, p) for p in DEFAULT_FABRIC_PATTERNS)
        if n.kind is NicKind.ROCE and (infiniband or not named_fabric):
            out[n.name] = NicRole.NORTH_SOUTH
    return out


def _role(name: str, roles: dict[str, NicRole]) -> NicRole:
    if name in roles:
        return roles[name]
    # no birth yet: guess from the interface name, as the agent's defaults would
    fabric = any(fnmatch.fnmatchcase(name, p) for p in DEFAULT_FABRIC_PATTERNS)
    return NicRole.EAST_WEST if fabric else NicRole.NORTH_SOUTH


def counted_disks(birth: Birth | None, names: list[str]) -> set[str]:
    """Disks whose I/O is the node's own: members of md RAID or device-mapper devices are counted on those.
    Agents before schema 2 do not mark members; when a window has an md or dm device, only those count."""
    members = _view(birth).members
    if not members and any(_MD.match(n) for n in names):
        return {n for n in names if _MD.match(n)}
    return {n for n in names if n not in members}


_VOLATILE = {
    "inbound_connections": None,
    "inbound_peers": None,
    "net_rx_bps": None,
    "net_tx_bps": None,
    "disk_read_bps": None,
    "disk_write_bps": None,
    "gpu_mem_mib": None,
}
# What a workload's reference is made of: every field but those that change window after window, so that a
# change to any of them (a new owner, another port, a GPU more) makes a new reference.
_made_of = attrgetter(*(name for name in WorkloadRef.model_fields if name not in _VOLATILE))
# A node's interned references, by workload id: the latest reference and what it was made of. One entry an id,
# however often a workload's fields change.
KnownRefs = dict[str, tuple[tuple[object, ...], WorkloadRef]]


def _reference(r: WindowWorkload) -> WorkloadRef:
    """What planning keeps of a workload a window reports: the protocol's model, without the figures that change
    window after window (those go into the digest's ``volatile``)."""
    return WorkloadRef.model_validate(msgspec.structs.asdict(r) | _VOLATILE)


def _intern(refs: list[WindowWorkload], known: KnownRefs | None) -> tuple[WorkloadRef, ...]:
    if known is None:
        return tuple(map(_reference, refs))
    out = []
    for r in refs:
        made_of = _made_of(r)
        entry = known.get(r.id)
        if entry is None or entry[0] != made_of:
            entry = known[r.id] = (made_of, _reference(r))
        out.append(entry[1])
    return tuple(out)


_links = attrgetter("nvlink_tx_bps", "nvlink_rx_bps", "pcie_tx_bps", "pcie_rx_bps")
_first = itemgetter(MEAN)


@dataclass(frozen=True, slots=True)
class _BirthView:
    roles: dict[str, NicRole]
    limits: dict[int, float | None]
    members: frozenset[str]
    devices: frozenset[int]  # the GPU indices it lists
    blind: frozenset[int] = frozenset()  # those it says report no utilisation (``GpuInfo.util_unavailable``)


_VIEWS: dict[int, tuple[Birth, _BirthView]] = {}


def _view(birth: Birth | None) -> _BirthView:
    """What windows need of a birth, worked out once per birth: a node sends one birth and thousands of windows."""
    if birth is None:
        return _BirthView({}, {}, frozenset(), frozenset())
    cached = _VIEWS.get(id(birth))
    if cached is not None and cached[0] is birth:
        return cached[1]
    if len(_VIEWS) >= 65_536:  # births replaced over a long run: start afresh rather than grow
        _VIEWS.clear()
    view = _BirthView(
        roles(birth),
        {g.index: g.power_limit_w for g in birth.gpus},
        frozenset(d.name for d in birth.disks if d.member_of),
        frozenset(g.index for g in birth.gpus),
        frozenset(g.index for g in birth.gpus if g.util_unavailable),
    )
    _VIEWS[id(birth)] = (birth, view)
    return view


def birth_devices(birth: Birth) -> frozenset[int]:
    """The GPU indices ``birth`` lists, worked out once per birth."""
    return _view(birth).devices


def digest(
    window: Window,
    birth: Birth | None,
    known: KnownRefs | None = None,
    previous: tuple[WorkloadRef, ...] = (),
) -> WindowDigest:
    """``known`` interns workload references: a node reports the same workloads window after window; ``previous``
    (the node's last digest's workloads) lends its tuple where they are the same."""
    view = _view(birth)
    nic_roles, limits = view.roles, view.limits
    flat: list[float] = [ROW_SERIES_AT]  # the rows' width, set below
    seconds = []
    blind: list[Blind] = []
    for g in window.gpus:
        util = g.util
        link = sum(map(_first, filter(None, _links(g))), 0.0)
        if util is None:
            if g.util_unavailable or g.index in view.blind:
                # said to have no utilisation (not merely missing it): its memory and links still tell what runs
                mem_used = g.mem_used_mib
                blind.append(Blind(g.index, mem_used[MAX] if mem_used is not None else _NONE, min(link, FLOAT32_MAX)))
            continue
        index, mem, power = g.index, g.mem_used_mib, g.power_w
        limit = g.power_limit_w or limits.get(index)  # the window's enforced limit, else the birth's
        series = g.util_series
        # a row of GpuRows, straight into the window's one list (no keyword matching, no boxed floats kept)
        flat += (
            index,
            util[MEAN],
            util[P95],
            util[STD],
            mem[MAX] if mem is not None else _NONE,
            link if link <= FLOAT32_MAX else FLOAT32_MAX,  # four rates at the wire's bound overflow float32
            min(power[MEAN] / limit, FLOAT32_MAX) if (power is not None and limit) else _NONE,
            _NONE if (tensor := g.tensor_active) is None else tensor[MEAN],
            _NONE if (dram := g.dram_active) is None else dram[MEAN],
            len(series),
        )
        flat += series
        seconds.append(len(series))
    if seconds:
        flat[0] = ROW_SERIES_AT + max(seconds)
    # a GPU that missed a sample has a shorter series: its row padded (seldom)
    gpu_rows = _block(flat) if min(seconds, default=0) == max(seconds, default=0) else _padded(flat, seconds)
    east = north = north_rx = north_tx_peak = 0.0
    for nic in window.nics:
        rx_bps, tx_bps = nic.rx_bps, nic.tx_bps
        rx = rx_bps[MEAN] if rx_bps else 0.0
        rate = (tx_bps[MEAN] if tx_bps else 0.0) + rx
        role = _role(nic.name, nic_roles)
        if role is NicRole.EAST_WEST:
            east += rate
        elif role is NicRole.NORTH_SOUTH:
            north += rate
            north_rx += rx
            north_tx_peak += tx_bps[MAX] if tx_bps else 0.0
    throttles = tuple(filter(None, (_throttle(g, limits) for g in window.gpus)))
    own = counted_disks(birth, [d.name for d in window.disks])
    disks = [d for d in window.disks if d.name in own]
    # What a workload pins is read only where it shares a GPU (time-slicing, MPS): kept for those windows alone.
    workloads = window.workloads
    interned = _intern(list(workloads), known)
    if len(interned) == len(previous) and all(map(operator.is_, interned, previous)):
        interned = previous  # the same references as the window before: its tuple, not one more
    volatile = []
    if len(workloads) > 1:
        listed = Counter(i for r in workloads for i in r.gpus)
        shared = {i for i, n in listed.items() if n > 1}
    else:
        shared = set()  # one workload shares a GPU with none
    for r, kept in zip(workloads, interned, strict=True):
        pinned = tuple(r.gpu_mem_mib) if r.gpu_mem_mib is not None and shared.intersection(r.gpus) else None
        io = r.disk_read_bps is not None or r.disk_write_bps is not None
        if r.net_rx_bps is not None or r.inbound_connections is not None or pinned is not None or io:
            # the interned reference's id, not the decoded window's own copy of it
            conns, peers = r.inbound_connections, r.inbound_peers
            volatile.append(
                Volatile(kept.id, conns, peers, r.net_rx_bps, r.net_tx_bps, pinned, r.disk_read_bps, r.disk_write_bps)
            )
    return WindowDigest(
        session=window.session,
        seq=window.seq,
        start=window.start,
        end=window.end,
        gpu_rows=gpu_rows,
        east_bps=east,
        north_bps=north,
        peak_write_bps=sum(d.write_bps[MAX] for d in disks if d.write_bps),
        workloads=interned,
        north_rx_bps=north_rx,
        north_tx_peak_bps=north_tx_peak,
        read_bps=sum(d.read_bps[MEAN] for d in disks if d.read_bps),
        volatile=tuple(volatile),
        write_bps=sum(d.write_bps[MEAN] for d in disks if d.write_bps),
        throttles=throttles,
        blind=tuple(blind),
        cpu_util=window.host.cpu_util[MEAN] if window.host.cpu_util is not None else None,
    )


# An estimate: a GPU held below its clocks (power cap, power brake, heat) for a fifth of a window or more runs its
# work measurably slower than its datasheet, so what it shows is not what the hardware can do.
THROTTLED_PCT = 20.0
# A GPU held at a power limit below this share of its board's TDP runs slower than its datasheet: someone lowered
# the limit (nvidia-smi -pl, the site's power capping). At the default limit, which is the TDP, dense work
# meets the cap as designed, and the catalog's throughput was measured so (MLPerf runs at default limits); 5 %
# allows for boards whose default sits a little under the family's TDP (an estimate).
LOWERED_LIMIT = 0.95


def lowered_limit(t: Throttle, tdp_w: float | None) -> bool:
    """Whether the GPU enforced a power limit lowered below its board's TDP (``LOWERED_LIMIT``): only then does
    time at the power cap slow it below its datasheet. False where the limit or the TDP is not known."""
    return tdp_w is not None and not math.isnan(t.power_limit_w) and t.power_limit_w < LOWERED_LIMIT * tdp_w


def slowed(t: Throttle, tdp_w: float | None) -> Throttle:
    """What held the GPU below its datasheet: ``t`` with its power share dropped unless its limit was lowered.
    The one throttle rule: the features, the findings and what an applied move teaches all read it."""
    return t if lowered_limit(t, tdp_w) else t._replace(power_pct=0.0)


def _mean_of(stats: Sequence[float] | None) -> float:
    return min(stats[MEAN], 100.0) if stats is not None else 0.0


def _throttle(g: WindowGpu, limits: dict[int, float | None]) -> Throttle | None:
    """What held the GPU below its clocks, from its clock event reasons and violation time; None: nothing did."""
    power = max(_mean_of(g.power_capped_pct), _mean_of(g.power_violation_pct))
    thermal = max(_mean_of(g.thermal_slowdown_pct), _mean_of(g.thermal_violation_pct))
    hardware = _mean_of(g.hw_slowdown_pct)
    if power <= 0 and thermal <= 0 and hardware <= 0:
        return None
    limit = g.power_limit_w or limits.get(g.index)
    return Throttle(g.index, power, thermal, hardware, limit if limit else _NONE)
