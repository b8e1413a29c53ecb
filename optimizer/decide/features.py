"""Workload features from telemetry windows: the signals the classifier and the planner reason about.

A workload is what the agents attributed GPUs to; the same workload id seen on several nodes is one workload
(multi-node training). Node-level traffic (NICs, disks) is shared among a node's workloads by how it follows
their load, after the node's own traffic is taken off.

Every node sends and writes things of its own whatever its GPUs do: metrics scraped every 15-30 s (node_exporter,
dcgm-exporter, kubelet's cAdvisor), logs shipped (fluent-bit, vector, promtail), kubelet's status updates and
watches, NFS keepalives, journald flushing to disk: typically 0.3-1 MB/s out and a tenth of that in, steady. Left
in, it reads as a trickle of client traffic on every workload, so an allocation nobody uses looks like a service at
its quietest hour. The baseline taken off is, in order of preference, the node's median in windows where none of
its GPUs did anything (its own measurement), or the busiest of the site's nodes that run no workload (an upper
bound of what ordinary nodes send), or, with neither, nothing (``front_baseline_bps`` is then None and traffic
shared among workloads is the node's, not theirs alone).

Utilisation and memory features are of what the workload holds: a MIG instance's utilisation is of the instance
(GPM samples each instance on its own), and a GPU shared by several workloads (time-slicing, MPS) reads the
same utilisation for each of them, since NVML measures the GPU, not a process. How much of a GPU a workload
holds (``Placement.held``, from optimizer/ingest/shares.py) turns them into whole-GPU figures for the planner.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from agent.protocol import GpuInfo
from optimizer.decide.catalog import load_catalog
from optimizer.ingest.digest import (
    ROW_SECONDS,
    ROW_SERIES_AT,
    THROTTLED_PCT,
    Blind,
    Throttle,
    WindowDigest,
    lowered_limit,
)
from optimizer.ingest.fleet import Fleet
from optimizer.ingest.history import DIGEST_SECONDS, Digest
from optimizer.ingest.shares import SHARE_FLOOR, Layout, layout, pinned, tenancy, units

CHECKPOINT_BURST_BPS = 30e6  # a write second above this (and well above the node's usual) is a save
NETWORK_SAVE_BPS = 100e6  # the same out of the front end, where responses also come and go
# Where its processes' own writes are known (schema 2, /proc/<pid>/io), a save is a window in which it wrote at least
# this many bytes (the floor above, 30 MB, written within the window: a LoRA adapter is 50-200 MB) and several times
# its usual window. /proc/<pid>/io counts written bytes as the process dirties the page cache, so a save shows in the
# window it is made in; a cgroup's io.stat (the agent's fallback) counts them as writeback flushes them.
OWN_SAVE_BYTES = 30e6
# Own counts are read only from windows this short (an agent's are 10 s): a save lasts seconds to a minute, and in a
# window minutes long (the Prometheus import's, 5 minutes) it is averaged in and reads as steady writing, so such
# windows' own counts are left out, and with them the evidence they would give either way.
OWN_IO_WINDOW_S = 60.0
# /proc/<pid>/io counts a save when its pages are dirtied; the node's disks show it when writeback flushes them, up to
# vm.dirty_expire_centisecs (3000) plus one dirty_writeback_centisecs wake-up (500) later: the kernel's defaults
# (Documentation/admin-guide/sysctl/vm.rst). A disk burst that late after a workload's own save is that save.
WRITEBACK_S = 35.0
QUIET_UTIL = 1.0  # a window in which no GPU of the node reached this in any second did no GPU work
QUIET_WINDOWS = 3  # quiet windows needed before their traffic is taken for the node's own
PERIOD_SECONDS = 720  # the most recent seconds of per-second load a step period is looked for in
# Seconds between a window's samples past which its series is no per-second load (points read from Prometheus):
# an agent's are 1 s apart, 2 s when it is late; a training step lasts 0.2-10 s.
SPARSE_SPACING = 5.0
# Windows on GPUs held down (THROTTLED_PCT or more of a window) are left out of a workload's load figures while
# this many others remain on the node, as many as the classifier needs (optimizer/decide/classify.py
# MIN_WINDOWS): load on a slowed GPU reads higher than the work needs, and would make it look as if it needed
# faster or more GPUs. With fewer, every window is kept and ``throttled_load`` says so.
MIN_CLEAN_WINDOWS = 3
UTIL_UNAVAILABLE = "the GPU reports no utilisation"  # where its birth does not say why


@dataclass(frozen=True, slots=True)
class Placement:
    node: str
    gpu_model: str
    gpu_memory_mib: int
    gpus: tuple[int, ...]
    held: float = 0.0  # GPUs' worth it holds here: MIG slices, partitions and shared GPUs count their share
    profile: str | None = None  # the MIG profile of its one device, when it holds that instance alone


@dataclass(slots=True)
class WorkloadFeatures:
    id: str
    name: str
    hint: str | None
    placements: list[Placement]
    windows: int = 0
    mean_util: float = 0.0
    p95_util: float = 0.0  # p95 over the horizon of the per-second load (mean across the workload's GPUs)
    burstiness: float = 0.0  # coefficient of variation of per-second utilisation within windows
    gpu_spread: float = 0.0  # mean spread across the workload's GPUs, relative to their level
    zero_seconds: float = 0.0  # share of seconds at (near) 0 % utilisation
    mem_used_mib: float = 0.0  # peak per-GPU memory in use
    mem_fraction: float = 0.0  # of the GPU's memory
    mem_stability: float = 0.0  # cv of memory in use across windows
    gpu_link_bps: float = 0.0  # NVLink + PCIe bytes/s per GPU (gradient synchronisation)
    east_west_bps: float = 0.0  # fabric NIC bytes/s per GPU of the workload
    north_south_bps: float = 0.0  # front-end NIC bytes/s per GPU of the workload
    checkpoint_windows: float = 0.0  # share of windows with a checkpoint-sized write burst
    write_bursts: int = 0
    history_hours: float = 0.0  # how far back the 10-minute digests reach
    daily_peak_p95: float = 0.0  # the highest p95 of any 10-minute period in the last day
    diurnal_ratio: float | None = None  # busiest / quietest 10-minute mean, given 12 h or more of digests
    busy_cv: float = 0.0  # variation of per-second utilisation over the seconds the GPUs did anything
    busy_level: float = 0.0  # mean utilisation over those seconds
    busy_seconds: int = 0
    node_front_bps: float = 0.0  # the front-end traffic of its nodes, per GPU of those nodes: what could be its
    period_s: int | None = None  # the step period, where per-second load repeats (autocorrelation peak)
    period_strength: float = 0.0  # that peak's autocorrelation
    intensity: float | None = None  # board power per unit of utilisation, 0-1: dense matmuls near 1
    tensor_share: float | None = None  # GPM tensor-pipe activity / utilisation
    dram_share: float | None = None  # GPM DRAM bandwidth / utilisation
    shape_tensor: float | None = None  # the same two over every window with work (>= 5 %), for the shape
    shape_dram: float | None = None
    ingress_bps: float = 0.0  # front-end bytes in per GPU (requests, or input from NFS / object storage)
    egress_bps: float = 0.0  # front-end bytes out per GPU
    disk_read_bps: float = 0.0  # node disk reads per GPU of the workload
    program: str | None = None  # schema 2: what the command line runs
    listen_ports: tuple[int, ...] = ()
    inbound_connections: int | None = None  # the most seen in a window
    inbound_peers: int | None = None
    own_network: bool = False  # ingress/egress are the workload's own network namespace, not a share of the node
    sched_step: str | None = None
    held_mem_mib: float = 0.0  # peak memory it holds in all (its part of shared GPUs), across its devices
    # The node's own front-end traffic (both directions) per GPU of the node, taken off before traffic is shared
    # among its workloads; None where it could not be told (no quiet window, no node without workloads).
    front_baseline_bps: float | None = None
    baseline_from: str | None = None  # "node": its own quiet windows; "site": nodes without workloads; None
    node_share: float = 1.0  # its share of the GPU work done on its nodes: node-level I/O is its own near 1
    write_bps: float = 0.0  # disk writes per GPU, beyond the node's own: results written steadily
    own_writes: bool = False  # write_bps is its processes' own (schema 2, most of its windows), not a share of the node
    # Save bursts on its node while it and others computed hard and steadily, each counted 1/N among the N such jobs:
    # one of them saved, and which one node-level disks cannot tell.
    shared_bursts: float = 0.0
    lockstep: float | None = None  # correlation of its GPUs' second-to-second load; None with one GPU or idle
    # Runs of work between idle seconds, per GPU, where every window was sampled each second: how often work
    # starts (distinct seconds a minute at which one of its GPUs goes from idle to busy), how long a run lasts,
    # and how regular the idle gaps between runs are (their coefficient of variation: ~1 for requests arriving
    # at random, ~0 for a step loop). None where the series are sparse or too few gaps were seen.
    per_second: bool = True  # every window's series was sampled each second (an agent's), not a scrape apart
    starts_per_min: float | None = None
    run_s: float | None = None
    gap_cv: float | None = None
    # Its GPU time held below its clocks, 0-1 of its GPUs' windows (the reasons may overlap): by a power limit
    # lowered below the board's TDP (LOWERED_LIMIT), by heat, by the hardware slowdown signal (the power brake), and
    # by any of them (at least the largest).
    throttled_share: float = 0.0
    throttle_power: float = 0.0
    throttle_thermal: float = 0.0
    throttle_hw: float = 0.0
    power_limit_w: float | None = None  # the lowest lowered power limit it ran under, W
    throttled_left_out: int = 0  # windows on GPUs held down, left out of its load figures
    throttled_load: bool = False  # its load figures are of windows held down: there were too few others
    # Why none of its windows had utilisation (an A100 or A30 in MIG mode): its load figures are then 0 and unknown.
    util_unavailable: str | None = None

    @property
    def gpus(self) -> int:
        return sum(len(p.gpus) for p in self.placements)

    @property
    def allotment(self) -> tuple[int, float, str | None]:
        """(GPUs the planner counts, the share of each it holds, MIG profile): whole GPUs are (n, 1, None); a
        MIG instance, a compute partition or a shared GPU is (1, share, profile)."""
        if len(self.placements) == 1:
            p = self.placements[0]
            if p.profile is not None or 0 < p.held < 1 - 1e-9:
                return 1, min(1.0, max(SHARE_FLOOR, p.held)), p.profile
        gpus = sum(max(1, math.ceil(p.held - 1e-9)) if p.held else len(p.gpus) for p in self.placements)
        return max(gpus, 1), 1.0, None

    @property
    def held(self) -> float:
        """GPUs' worth it holds in all."""
        return sum(p.held if p.held else len(p.gpus) for p in self.placements)

    @property
    def nodes(self) -> list[str]:
        return [p.node for p in self.placements]

    @property
    def multi_node(self) -> bool:
        return len(self.placements) > 1


def _mean(values: Iterable[float]) -> float:
    items = list(values)
    return statistics.fmean(items) if items else 0.0


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def _daily(digests: list[Digest]) -> tuple[float, float, float | None]:
    """(hours covered, daily peak p95, busiest/quietest ratio given 12 h or more)."""
    if not digests:
        return 0.0, 0.0, None
    hours = (max(d.end for d in digests) - min(d.end for d in digests)) / 3600
    ratio = None
    if hours >= 12:
        quiet = min(d.mean_util for d in digests)
        ratio = max(d.mean_util for d in digests) / max(quiet, 0.5)
    return hours, max(d.peak_p95 for d in digests), ratio


def _p95(values: Sequence[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[-1]


def _cv(values: Sequence[float]) -> float:
    """Coefficient of variation (population). In floats with exact sums: ``statistics.pstdev`` works in
    fractions, ~200 µs for a window's ten seconds, and runs for every GPU of every window at every plan."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = math.fsum(values) / n
    if mean <= 1e-9:
        return 0.0
    return math.sqrt(math.fsum([(v - mean) * (v - mean) for v in values]) / n) / mean


def _doubles() -> array[float]:
    return array("d")


def _singles() -> array[float]:
    return array("f")


_DTYPES = {"d": np.float64, "f": np.float32}


def _extend(into: array[float], values: np.ndarray) -> None:
    """``values`` appended to ``into`` as they are: float64 to an array of doubles, or float32-exact figures (a
    GPU's series, as the digest packs them) to one of singles."""
    into.frombytes(np.ascontiguousarray(values, dtype=_DTYPES[into.typecode]).tobytes())


def _keep_recent(centred: array[float]) -> None:
    """Only the last ``PERIOD_SECONDS`` are read (``step_period``): older seconds go, in batches."""
    if len(centred) > 2 * PERIOD_SECONDS:
        del centred[:-PERIOD_SECONDS]


@dataclass(slots=True)
class _Acc:
    """A workload's figures as its windows are folded. Every workload's are held until the last node is folded,
    so figures per second (hundreds per window) are packed arrays, not lists of float objects: ~8 bytes a figure
    instead of ~32, 4 for a GPU's own series (float32 as the digest keeps it)."""

    name: str = ""
    hint: str | None = None
    placements: dict[str, Placement] = field(default_factory=dict)
    util_means: list[float] = field(default_factory=list)
    util_p95: list[float] = field(default_factory=list)
    load: array[float] = field(default_factory=_doubles)  # per second: the mean across its GPUs
    cvs: array[float] = field(default_factory=_doubles)  # per GPU and window
    spreads: array[float] = field(default_factory=_doubles)  # per second, across its GPUs
    idle_seconds: int = 0  # seconds of its GPUs' series under 2 %
    seconds: int = 0  # seconds of its GPUs' series in all
    mem: array[float] = field(default_factory=_doubles)  # per GPU and window
    links: array[float] = field(default_factory=_doubles)  # per GPU and window
    east: list[float] = field(default_factory=list)
    north: list[float] = field(default_factory=list)
    ckpt: list[float] = field(default_factory=list)
    windows: int = 0
    busy: array[float] = field(default_factory=_doubles)  # per-second load while anything ran
    # per-second load less its window's mean: the last PERIOD_SECONDS at least
    centred: array[float] = field(default_factory=_doubles)
    intensity: list[float] = field(default_factory=list)
    node_front: list[float] = field(default_factory=list)
    tensor: list[float] = field(default_factory=list)
    dram: list[float] = field(default_factory=list)
    gpm: list[tuple[float, float]] = field(default_factory=list)  # (tensor, dram) per unit of utilisation
    ingress: list[float] = field(default_factory=list)
    egress: list[float] = field(default_factory=list)
    reads: list[float] = field(default_factory=list)
    own_net: bool = False
    program: str | None = None
    listen: tuple[int, ...] = ()
    connections: int | None = None
    peers: int | None = None
    step: str | None = None
    held_mem: list[float] = field(default_factory=list)
    writes: list[float] = field(default_factory=list)
    own_reads: list[float] = field(default_factory=list)  # its processes' own, in windows where they were read
    own_writes: list[float] = field(default_factory=list)
    shared_bursts: float = 0.0
    baseline: list[float] = field(default_factory=list)  # its nodes' own front-end traffic per GPU, where known
    baseline_from: set[str | None] = field(default_factory=set)
    shares: list[float] = field(default_factory=list)  # its part of its node's GPU work, per window
    per_gpu: dict[int, array[float]] = field(default_factory=dict)  # per-second load of each GPU, on its first node
    first_node: str | None = None
    sparse: bool = False  # a window's series was read points a scrape apart, not each second
    gpu_windows: int = 0  # its GPUs' windows, throttled or not
    throttle: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])  # power, heat, hardware, any: %
    lowered_limit: float | None = None
    left_out: int = 0
    throttled_load: bool = False
    held_spans: list[tuple[float, float]] = field(default_factory=list)  # (start, end) of windows held down
    blind_windows: int = 0
    blind_reason: str | None = None


def _profile(devices: Layout, index: int) -> str | None:
    device = devices.devices.get(index)
    return device.profile if device is not None else None


def _pinned(window: WindowDigest) -> dict[str, dict[int, float | None]]:
    """Workload → device → MiB its processes pin, as the agents report it (schema 2, ``gpu_mem_mib``)."""
    refs = {r.id: r for r in window.workloads}
    return {
        v.workload: pinned(refs[v.workload].gpus, v.gpu_mem_mib)
        for v in window.volatile
        if v.gpu_mem_mib is not None and v.workload in refs
    }


def _held_memory(
    window: WindowDigest, own: dict[int, float | None], gpus: tuple[int, ...], parts: dict[int, float]
) -> float:
    """Memory the workload holds on its devices this window: what its processes pin where the agent reports it
    (NVML's per-process figure), else its part of each device's memory in use."""
    total = 0.0
    rows = window.gpu_rows
    held = [(int(rows[at]), rows[at + 4]) for at in rows.starts(gpus)]
    held += [(b.gpu, b.mem_max_mib) for b in window.blind if b.gpu in gpus]
    for index, mem in held:
        mine = own.get(index)
        total += mine if mine is not None else (0.0 if math.isnan(mem) else mem) * parts.get(index, 1.0)
    return total


@cache
def _tdp(model: str, pci_id: str | None) -> float | None:
    """The board's TDP from the built-in catalog (its datasheet figure), W; None for a GPU it does not list."""
    entry = load_catalog().lookup(model, pci_id)
    return entry.datasheet.tdp_w if entry is not None else None


def _board_tdp(gpu_info: Mapping[int, GpuInfo], index: int) -> float | None:
    """The TDP of the board a device is on (a MIG instance's parent: power is the board's)."""
    info = gpu_info.get(index)
    if info is not None and info.parent is not None:
        info = gpu_info.get(info.parent, info)
    return _tdp(info.model, info.pci_device_id) if info is not None else None


def _held_down(
    acc: _Acc, throttles: Sequence[Throttle], gpus: tuple[int, ...], gpu_info: Mapping[int, GpuInfo]
) -> bool:
    """Add what held the workload's GPUs below their clocks this window; whether any was held THROTTLED_PCT or
    more. A power cap counts only under a limit lowered below the board's TDP (LOWERED_LIMIT)."""
    down = False
    by_gpu = {t.gpu: t for t in throttles}
    for g in gpus:
        t = by_gpu.get(g)
        info = gpu_info.get(g)
        if t is None and info is not None and info.parent is not None:
            t = by_gpu.get(info.parent)  # a MIG instance runs on its GPU's clocks: what holds the GPU holds it
        if t is None:
            continue
        tdp = _board_tdp(gpu_info, t.gpu)
        lowered = lowered_limit(t, tdp)  # the one rule (optimizer/ingest/digest.py)
        power = t.power_pct if lowered else 0.0
        held = max(power, t.thermal_pct, t.hw_slowdown_pct)
        for k, value in enumerate((power, t.thermal_pct, t.hw_slowdown_pct, held)):
            acc.throttle[k] += value
        if lowered and power > 0:
            acc.lowered_limit = min(acc.lowered_limit or math.inf, t.power_limit_w)
        down = down or held >= THROTTLED_PCT
    return down


def _fold_blind(acc: _Acc, blind: list[Blind], east: float, north: float, ckpt: bool) -> None:
    """A window of devices without utilisation: what they report (memory, links) and the node's traffic."""
    acc.windows += 1
    acc.blind_windows += 1
    acc.mem.extend([b.mem_max_mib for b in blind if not math.isnan(b.mem_max_mib)])
    acc.links.extend([b.link_bps for b in blind])
    acc.east.append(east)
    acc.north.append(north)
    acc.ckpt.append(1.0 if ckpt else 0.0)


def _dense(window: WindowDigest, seconds: int) -> bool:
    """Whether a window's series is per-second load a step period can be read from: an agent samples every second;
    points read from Prometheus lie a scrape interval apart (15-60 s), longer than any training step, where the
    autocorrelation of the samples is that of aliases, not of the step (optimizer/ingest/dcgm.py)."""
    return seconds > 0 and (window.end - window.start) / seconds <= SPARSE_SPACING


def _fold_window(
    acc: _Acc, window: WindowDigest, gpu_ids: set[int], east: float, north: float, ckpt: bool, node: str
) -> None:
    # Windows that cannot be folded as arrays (``_fold_run``): each of the workload's GPUs copied out of the
    # window's rows once, its series sliced once, with C-level calls where they suffice.
    rows = window.gpu_rows
    gpus = [rows.view(k) for k, index in enumerate(rows.column(0)) if index in gpu_ids]  # 1.0 in {1} holds
    if not gpus:
        return
    acc.windows += 1
    util = math.fsum([g.util_mean for g in gpus]) / len(gpus)
    acc.util_means.append(util)
    acc.util_p95.append(max([g.util_p95 for g in gpus]))
    all_series = [g.series for g in gpus]
    acc.cvs.extend([_cv(s) for s in all_series if len(s) > 1])
    series = [s for s in all_series if len(s)]
    if series:
        seconds = min(map(len, series))
        acc.first_node = acc.first_node or node
        if node == acc.first_node and len(series) == len(gpus) > 1:
            for g, s in zip(gpus, all_series, strict=True):
                acc.per_gpu.setdefault(g.index, _singles()).extend(s[:seconds])
        if len(series) == 1:
            levels = series[0][:seconds].tolist()
        else:
            levels = []
            width = len(series)
            for column in zip(*series, strict=False):  # seconds: the shortest series
                level = math.fsum(column) / width
                levels.append(level)
                acc.spreads.append((max(column) - min(column)) / max(level, 5.0))
        acc.load.extend(levels)
        acc.busy.extend([v for v in levels if v >= 5])
        if _dense(window, seconds):
            centre = math.fsum(levels) / len(levels) if levels else 0.0
            acc.centred.extend([v - centre for v in levels])
            _keep_recent(acc.centred)
        else:
            acc.sparse = True
    if util >= 5:
        # GPM's activities are shares of time, like utilisation: their ratio holds at any load with work in it
        pairs = [(g.tensor_active, g.dram_active) for g in gpus]
        known = [(t, d) for t, d in pairs if t is not None and d is not None]
        if known:
            acc.gpm.append((_mean(t for t, _ in known) / util, _mean(d for _, d in known) / util))
    if util >= 50:
        # Power rises from ~10 % of the limit at idle (more on small cards: an L4 idles at ~20 %) by the work's
        # intensity per unit of utilisation; only busy windows are read, where the idle share matters least.
        fractions = [g.power_frac for g in gpus if g.power_frac is not None]
        if fractions:
            acc.intensity.append(min(1.5, max(0.0, (_mean(fractions) - 0.1) / (0.9 * util / 100))))
        tensor = [g.tensor_active for g in gpus if g.tensor_active is not None]
        dram = [g.dram_active for g in gpus if g.dram_active is not None]
        if tensor:
            acc.tensor.append(_mean(tensor) / util)
        if dram:
            acc.dram.append(_mean(dram) / util)
    for g, s in zip(gpus, all_series, strict=True):
        acc.idle_seconds += sum([v < 2 for v in s])
        acc.seconds += len(s)
        mem = g.mem_max_mib
        if mem is not None:
            acc.mem.append(mem)
        acc.links.append(g.link_bps)
    acc.east.append(east)
    acc.north.append(north)
    acc.ckpt.append(1.0 if ckpt else 0.0)


def _fold_windows(acc: _Acc, rows: list[tuple[WindowDigest, tuple[int, ...], float, float, bool]], node: str) -> None:
    """Fold a workload's windows on one node, in order: (window, its devices, east-west, north-south, a save
    burst). Runs of windows with the same devices are folded as arrays."""
    start = 0
    while start < len(rows):
        held = rows[start][1]
        end = start + 1
        while end < len(rows) and rows[end][1] == held:
            end += 1
        _fold_run(acc, rows[start:end], set(held), node)
        start = end


def _fold_run(
    acc: _Acc, rows: list[tuple[WindowDigest, tuple[int, ...], float, float, bool]], gpu_ids: set[int], node: str
) -> None:
    """``_fold_window`` for consecutive windows of the same devices, as arrays: windows × GPUs × the digest's
    fields. The same figures to the last bits of a float (sums in another order); windows whose GPUs or series
    lengths differ (a GPU lost, a sample missed) are folded one by one."""
    found = []  # per window: its packed rows, their width, which of them are the workload's
    shapes = []
    for w, *_ in rows:
        block = w.gpu_rows
        stride = int(block[0])
        listed, seconds = block[1::stride], block[1 + ROW_SECONDS :: stride]
        at = [k for k, index in enumerate(listed) if index in gpu_ids]  # 1.0 in {1} holds
        found.append((block, stride, at))
        shapes.append((tuple([listed[k] for k in at]), tuple([seconds[k] for k in at])))
    shape = set(shapes)
    if len(shape) > 1 and len(rows) >= 8:
        # one odd window (a sample missed, a shorter last window) costs its own run, not the array fold of all
        first = 0
        for i in range(1, len(rows) + 1):
            if i == len(rows) or shapes[i] != shapes[first]:
                _fold_run(acc, rows[first:i], gpu_ids, node)
                first = i
        return
    lengths = next(iter(shape))[1] if len(shape) == 1 else ()
    if len(rows) < 4 or len(shape) != 1 or not lengths or len(set(lengths)) != 1:
        for window, _, east, north, ckpt in rows:
            _fold_window(acc, window, gpu_ids, east, north, ckpt, node)
        return
    indices = [int(i) for i in next(iter(shape))[0]]
    cut = ROW_SERIES_AT + int(lengths[0])  # a longer series of a GPU not the workload's pads the others
    digests = np.stack(
        [np.frombuffer(block, np.float32, offset=4).reshape(-1, stride)[at, :cut] for block, stride, at in found]
    ).astype(np.float64)  # windows × GPUs × (head, seconds, series)
    width = len(indices)
    acc.windows += len(rows)
    util_list = [math.fsum(row) / width for row in digests[:, :, 1].tolist()]
    util = np.array(util_list)
    acc.util_means.extend(util_list)
    acc.util_p95.extend(digests[:, :, 2].max(axis=1).tolist())
    series = digests[:, :, ROW_SERIES_AT:]
    seconds = series.shape[2]
    if seconds > 1:
        means = series.mean(axis=2)
        spread = np.sqrt(((series - means[:, :, None]) ** 2).mean(axis=2))
        cvs = np.divide(spread, means, out=np.zeros_like(means), where=means > 1e-9)
        _extend(acc.cvs, cvs)
    if seconds:
        acc.first_node = acc.first_node or node
        if node == acc.first_node and width > 1:
            for j, index in enumerate(indices):
                _extend(acc.per_gpu.setdefault(index, _singles()), series[:, j, :])
        if width == 1:
            levels = series[:, 0, :]
        else:
            levels = series.mean(axis=1)
            _extend(acc.spreads, (series.max(axis=1) - series.min(axis=1)) / np.maximum(levels, 5.0))
        _extend(acc.load, levels)
        _extend(acc.busy, levels[levels >= 5])
        if _dense(rows[0][0], seconds):
            _extend(acc.centred, levels - levels.mean(axis=1, keepdims=True))
            _keep_recent(acc.centred)
        else:
            acc.sparse = True
    power, tensor, dram = digests[:, :, 6], digests[:, :, 7], digests[:, :, 8]
    with np.errstate(invalid="ignore", divide="ignore"):
        both = ~np.isnan(tensor) & ~np.isnan(dram)
        known = both.sum(axis=1)
        gpm_t = np.where(both, tensor, 0.0).sum(axis=1) / known
        gpm_d = np.where(both, dram, 0.0).sum(axis=1) / known
        for k in np.flatnonzero((util >= 5) & (known > 0)).tolist():
            acc.gpm.append((float(gpm_t[k]) / util_list[k], float(gpm_d[k]) / util_list[k]))
        busy = util >= 50
        if busy.any():
            columns = ((power, acc.intensity, True), (tensor, acc.tensor, False), (dram, acc.dram, False))
            for values, out, intensity in columns:
                have = ~np.isnan(values)
                count = have.sum(axis=1)
                mean = np.where(have, values, 0.0).sum(axis=1) / count
                for k in np.flatnonzero(busy & (count > 0)).tolist():
                    if intensity:
                        out.append(min(1.5, max(0.0, (float(mean[k]) - 0.1) / (0.9 * util_list[k] / 100))))
                    else:
                        out.append(float(mean[k]) / util_list[k])
    acc.idle_seconds += int((series < 2).sum())
    acc.seconds += series.size
    memory = digests[:, :, 4]
    _extend(acc.mem, memory[~np.isnan(memory)])
    _extend(acc.links, digests[:, :, 5])
    for _, _, east, north, ckpt in rows:
        acc.east.append(east)
        acc.north.append(north)
        acc.ckpt.append(1.0 if ckpt else 0.0)


def _trains_hard(window: WindowDigest, gpu_ids: Sequence[int]) -> bool:
    rows = window.gpu_rows
    at = rows.starts(set(gpu_ids))
    if not at:
        return False
    mean = sum(rows[a + 1] for a in at) / len(at)
    variation = sum(rows[a + 3] / max(rows[a + 1], 1.0) for a in at) / len(at)
    return mean >= 60 and variation < 0.15


def _servers(window: WindowDigest) -> set[str]:
    """Workloads listening with three clients or more (schema 2): a server writes logs, not checkpoints, so a
    continuous-batching server computing as steadily as training is no claimant to a save burst beside it."""
    listening = {r.id for r in window.workloads if r.listen_ports}
    return {v.workload for v in window.volatile if v.workload in listening and (v.inbound_peers or 0) >= 3}


def nnls(columns: list[list[float]], target: list[float], rounds: int = 200) -> list[float]:
    """Non-negative least squares by coordinate descent: a ≥ 0 minimising |target - Σ a_j columns_j|²."""
    if not columns:
        return []
    x = np.asarray(columns, dtype=np.float64)
    residual = np.asarray(target, dtype=np.float64).copy()
    coef = [0.0] * len(columns)
    norms = np.einsum("ij,ij->i", x, x).tolist()
    peaks = x.max(axis=1, initial=0.0).tolist()
    done = 1e-6 * (max(target, default=0.0) + 1)
    for _ in range(rounds):
        moved = 0.0
        for j, col in enumerate(x):
            if norms[j] <= 0:
                continue
            new = max(0.0, coef[j] + float(col @ residual) / norms[j])
            delta = new - coef[j]
            if delta:
                coef[j] = new
                residual -= delta * col
                moved = max(moved, abs(delta) * peaks[j])
        if moved < done:
            break
    return coef


def _steady(traffic: list[float]) -> list[float]:
    """A node's traffic with one-off spikes (a model loaded at start-up, a checkpoint) clipped to three times its
    median, so the regression below attributes what flows steadily, not an event, to every window."""
    if len(traffic) < 6:
        return traffic
    cap = 3 * statistics.median(traffic)
    return [min(t, cap) for t in traffic]


def _attribute(loads: dict[str, list[float]], traffic: list[float]) -> dict[str, list[float]]:
    """Split a node's per-window traffic among its workloads.

    One workload gets it all. Several: traffic is regressed on each workload's per-window load (non-negative
    least squares), so the workload whose activity the traffic follows gets it — a serving workload's client
    traffic does not end up on the fine-tuning job beside it. With too few windows to regress, it is shared by
    load.
    """
    ids = list(loads)
    if len(ids) == 1:
        return {ids[0]: list(traffic)}
    if len(traffic) >= 6 and any(traffic):
        coef = nnls([loads[i] for i in ids], traffic)
        return {i: [c * x for x in loads[i]] for i, c in zip(ids, coef, strict=True)}
    out: dict[str, list[float]] = {}
    for w, total in enumerate(traffic):
        whole = sum(loads[i][w] for i in ids)
        for i in ids:
            out.setdefault(i, []).append(total * loads[i][w] / whole if whole else total / len(ids))
    return out


def _bursts(peaks: list[float], floor: float = CHECKPOINT_BURST_BPS) -> list[bool]:
    """Windows with a save burst: a busiest second well above the node's usual one (or, for a workload's own
    counts, bytes written in a window well above its usual window).

    Relative as well as absolute, because a LoRA adapter save is 50-200 MB where a full checkpoint is tens of GB,
    and logs write a steady trickle."""
    usual = statistics.median(peaks) if peaks else 0.0
    return [p >= max(floor, 8 * usual) for p in peaks]


def _own_saves(windows: list[WindowDigest]) -> dict[str, dict[int, tuple[float, float, bool]]]:
    """Per workload whose processes' storage traffic the agent read (schema 2): by window index, its own read and
    write rates and whether that window held a save (``_bursts`` over the bytes it wrote in each window, from
    ``OWN_SAVE_BYTES``). Its own counts need no sharing among the node's workloads: a job's save is told from a
    neighbour's steady results."""
    own: dict[str, dict[int, tuple[float, float]]] = {}
    for i, window in enumerate(windows):
        if window.end - window.start > OWN_IO_WINDOW_S:
            continue
        for v in window.volatile:
            if v.disk_write_bps is not None:
                own.setdefault(v.workload, {})[i] = (v.disk_read_bps or 0.0, v.disk_write_bps)
    out: dict[str, dict[int, tuple[float, float, bool]]] = {}
    for wid, rates in own.items():
        written = [write * max(windows[i].end - windows[i].start, 1.0) for i, (_, write) in rates.items()]
        saved = _bursts(written, floor=OWN_SAVE_BYTES)
        out[wid] = {i: (read, write, s) for (i, (read, write)), s in zip(rates.items(), saved, strict=True)}
    return out


def _save_bursts(windows: list[WindowDigest]) -> tuple[list[bool], list[bool]]:
    """Saves to local disks, and to shared storage (NFS, Lustre, object storage) out of the front-end NICs."""
    disk = _bursts([w.peak_write_bps for w in windows])
    network = _bursts([w.north_tx_peak_bps for w in windows], floor=NETWORK_SAVE_BPS)
    return disk, network


def _claimants(
    windows: list[WindowDigest],
    devices: Layout,
    disk: list[bool],
    network: list[bool],
    own_io: dict[str, dict[int, tuple[float, float, bool]]],
) -> list[list[str]]:
    """Per window with a save burst on the node, the workloads that may have made it.

    On a shared node a burst is the save of a job computing hard and steadily, as training does between
    checkpoints (a server listening with three clients or more writes logs, not checkpoints); with several such
    jobs it is nobody's evidence. A job whose own storage counts are known (schema 2) is no claimant to a burst on
    the disks: its counts say whether it saved, and where one of them did, the burst is explained. Its counts do
    not see an upload to object storage, so a burst out of the front end stays open to it. A save its own counts
    saw up to ``WRITEBACK_S`` before a disk burst explains it too: written bytes are counted as pages are dirtied,
    and the disks see them when writeback flushes them, often windows later."""
    saves = {i for per in own_io.values() for i, (_, _, saved) in per.items() if saved}
    out: list[list[str]] = []
    last_save = None  # the end of the latest window, up to this one, with a workload's own save
    for i, window in enumerate(windows):
        if i in saves:
            last_save = window.end
        if not (disk[i] or network[i]):
            out.append([])
            continue
        servers = _servers(window)
        steady = [
            r.id for r in window.workloads if _trains_hard(window, devices.effective(r.gpus)) and r.id not in servers
        ]
        if not network[i]:
            if last_save is not None and last_save >= window.start - WRITEBACK_S:
                steady = []
            else:
                steady = [wid for wid in steady if i not in own_io.get(wid, {})]
        out.append(steady)
    return out


def step_period(centred: Sequence[float], max_lag: int = 60) -> tuple[int | None, float]:
    """The lag at which per-second load repeats, and how strongly: an autocorrelation peak that follows a dip.

    A training step (compute, then wait for data or the all-reduce) repeats with a fixed period; a server's load
    follows arrivals and a notebook's bursts persist, then fade: neither rises again after falling."""
    x = np.asarray(centred[-PERIOD_SECONDS:], dtype=np.float64)
    n = len(x)
    if n < 30 or not np.isfinite(x).all():
        return None, 0.0
    x = x - x.mean()
    energy = float(np.dot(x, x))
    if energy <= 1e-9 * n:
        return None, 0.0
    lags = min(max_lag, n // 3)
    r = np.array([float(np.dot(x[:-lag], x[lag:])) / energy for lag in range(1, lags + 1)])
    # The fundamental is the first lag that rises again after a dip. One of 2 s is at the 1 Hz sampling's Nyquist
    # limit: an alternation every second is aliasing, not a step, and so are its multiples.
    for lag in range(2, lags + 1):
        value = r[lag - 1]
        if value >= 0.35 and value - float(r[: lag - 1].min()) >= 0.35:
            return (lag, float(value)) if lag >= 3 else (None, 0.0)
    return None, 0.0


@dataclass(frozen=True, slots=True)
class Baseline:
    """A node's own traffic, bytes/s: front-end out and in, disk reads and writes; ``source`` says where it was
    measured ("node", "site"), None where nothing is known."""

    tx: float = 0.0
    rx: float = 0.0
    read: float = 0.0
    write: float = 0.0
    source: str | None = None

    @property
    def known(self) -> bool:
        return self.source is not None


BASELINE_CAP_BPS = 5e6
"""Most of a node's own traffic taken for background, per channel: its services send and write at most a few MB/s.
More than that in windows without GPU work is a workload's data moving (a model download, a stalled input
pipeline still reading), not the node's."""


def _channels(window: WindowDigest) -> tuple[float, float, float, float]:
    return (max(window.north_bps - window.north_rx_bps, 0.0), window.north_rx_bps, window.read_bps, window.write_bps)


def _quiet(window: WindowDigest) -> bool:
    """A window in which no GPU of the node did any work."""
    rows = window.gpu_rows
    width = int(rows[0])
    for at in range(1, len(rows), width):
        seconds = int(rows[at + ROW_SECONDS])
        series = rows[at + ROW_SERIES_AT : at + ROW_SERIES_AT + seconds]
        if not (max(series) if seconds else rows[at + 2]) < QUIET_UTIL:  # its busiest second, else its p95
            return False
    return len(rows) > 1


def _medians(windows: Sequence[WindowDigest], source: str) -> Baseline:
    columns = list(zip(*(_channels(w) for w in windows), strict=True))
    tx, rx, read, write = (min(BASELINE_CAP_BPS, statistics.median(c)) for c in columns)
    return Baseline(tx, rx, read, write, source)


def site_baseline(fleet: Fleet, site: str, horizon: int | None = None) -> Baseline | None:
    """What the site's nodes without workloads send and write: per node its median, then the busiest of them (the
    90th percentile from ten nodes on), an upper bound of an ordinary node's own traffic. None without such nodes."""
    per_node = []
    for (rec_site, _), record in fleet.nodes.items():
        windows = list(record.windows)[-horizon:] if horizon else list(record.windows)
        if rec_site == site and len(windows) >= QUIET_WINDOWS and not any(w.workloads for w in windows):
            per_node.append(_medians(windows, "site"))
    if not per_node:
        return None

    def high(values: list[float]) -> float:
        ordered = sorted(values)
        return ordered[math.ceil(0.9 * len(ordered)) - 1]

    return Baseline(
        high([b.tx for b in per_node]),
        high([b.rx for b in per_node]),
        high([b.read for b in per_node]),
        high([b.write for b in per_node]),
        "site",
    )


def node_baseline(windows: Sequence[WindowDigest], reference: Baseline | None) -> Baseline:
    """The node's own traffic: its medians over windows in which its GPUs did nothing, given a few of them; else
    the site's reference; else nothing known (zero taken off)."""
    quiet = [w for w in windows if _quiet(w)]
    if len(quiet) >= QUIET_WINDOWS:
        return _medians(quiet, "node")
    return reference if reference is not None else Baseline()


RUN_BUSY, RUN_IDLE = 5.0, 2.0  # % a second is busy at or above, idle below (as zero_seconds counts)
MIN_GAPS = 5  # idle gaps between runs before their regularity is read


def work_runs(series: Sequence[Sequence[float]]) -> tuple[float, float, float | None] | None:
    """(starts a minute, mean run in seconds, the idle gaps' coefficient of variation) of per-second load, one
    series per GPU over the same seconds; starts at the same second on several GPUs count once (one cell, one
    collective step). None without any start."""
    starts: set[int] = set()
    runs: list[int] = []
    gaps: list[int] = []
    seconds = 0
    for values in series:
        s = np.asarray(values, dtype=np.float64)
        seconds = max(seconds, len(s))
        if len(s) < 2:
            continue
        busy, idle = s >= RUN_BUSY, s < RUN_IDLE
        began = np.flatnonzero(busy[1:] & idle[:-1]) + 1
        ended = np.flatnonzero(idle[1:] & busy[:-1]) + 1
        starts.update(began.tolist())
        # each run ends at the first end after its start (or with the series); each gap at the next start
        closing = np.append(ended, len(s))[np.searchsorted(ended, began)]
        runs.extend((closing - began).tolist())
        following = np.searchsorted(began, ended)
        closed = following < len(began)
        gaps.extend((began[following[closed]] - ended[closed]).tolist())
    if not starts or seconds < 60:
        return None
    gap_cv = _cv(gaps) if len(gaps) >= MIN_GAPS else None
    return len(starts) / seconds * 60, _mean(runs), gap_cv


def gpu_lockstep(per_gpu: Mapping[int, Sequence[float]]) -> float | None:
    """How closely its GPUs' per-second loads move together: the mean correlation of each GPU with the mean of the
    others. Only where the load varies by a few points or more: at a flat 99 % every GPU looks alike, and noise
    alone says nothing."""
    if len(per_gpu) < 2:
        return None
    length = min(len(v) for v in per_gpu.values())
    if length < 30:
        return None
    x = np.asarray([v[:length] for v in per_gpu.values()], dtype=np.float64)
    if not np.isfinite(x).all() or float(np.median(x.std(axis=1))) < 3.0:
        return None
    correlations = []
    for i in range(len(x)):
        others = np.delete(x, i, axis=0).mean(axis=0)
        a, b = x[i] - x[i].mean(), others - others.mean()
        denominator = math.sqrt(float(np.dot(a, a)) * float(np.dot(b, b)))
        if denominator > 1e-9:
            correlations.append(float(np.dot(a, b)) / denominator)
    return statistics.fmean(correlations) if correlations else None


GONE_WINDOWS = 3  # a workload its node has not reported for this many of the node's windows has left it
# The nodes of one multi-node job report it in the same minute; a workload first seen elsewhere later than that
# after its last window on a node moved there (a rescheduled pod waits out eviction and start-up: minutes).
TOGETHER_SECONDS = 60.0


def departed(fleet: Fleet, site: str) -> set[tuple[str, str]]:
    """(workload, node) pairs of workloads that left the node: the node has gone on reporting without them for
    ``GONE_WINDOWS`` windows (it ended, or a scheduler moved it and it came back as a new pod), or they were seen
    elsewhere only since a minute or more after their last window there (moved under the same id). A multi-node
    job reports from all its nodes in the same minute. What a workload did on hardware it left says nothing of
    where it runs."""
    spans: dict[str, dict[str, tuple[float, float]]] = defaultdict(dict)
    gone = set()
    for (rec_site, node), record in fleet.nodes.items():
        if rec_site != site or not record.windows:
            continue
        recent = {ref.id for window in list(record.windows)[-GONE_WINDOWS:] for ref in window.workloads}
        for window in record.windows:
            for ref in window.workloads:
                first, last = spans[ref.id].get(node, (window.end, window.end))
                spans[ref.id][node] = (min(first, window.end), max(last, window.end))
                if ref.id not in recent:
                    gone.add((ref.id, node))
    for wid, by_node in spans.items():
        if len(by_node) > 1:
            newest = max(first for first, _ in by_node.values())
            gone |= {(wid, node) for node, (_, last) in by_node.items() if last < newest - TOGETHER_SECONDS}
    return gone


def workload_features(fleet: Fleet, site: str, horizon: int | None = None) -> list[WorkloadFeatures]:
    """Features of every workload seen in ``site`` over the last ``horizon`` windows of each node."""
    accs: dict[str, _Acc] = defaultdict(_Acc)
    reference = site_baseline(fleet, site, horizon)
    gone = departed(fleet, site)
    records = [
        (r, r.birth) for (rec_site, _), r in sorted(fleet.nodes.items()) if rec_site == site and r.birth is not None
    ]
    # A workload's features are worked out once the last node it runs on is folded, and its figures let go: held
    # all together until the end, a large site's would be most of what a plan holds at its peak.
    last = {
        ref.id: n
        for n, (record, _) in enumerate(records)
        for w in _recent(record.windows, horizon)
        for ref in w.workloads
    }
    finished: dict[int, list[str]] = defaultdict(list)
    for wid, n in last.items():
        finished[n].append(wid)
    out: dict[str, WorkloadFeatures] = {}
    for n, (record, birth) in enumerate(records):
        gpu_info = {g.index: g for g in birth.gpus}
        devices = layout(birth)
        windows = _recent(record.windows, horizon)
        refs = {ref.id: ref for window in windows for ref in window.workloads}
        # Node-level signals (NICs, disks) per window, then shared among the node's workloads.
        by_index = [dict(zip(map(int, w.gpu_rows.column(0)), w.gpu_rows.column(1), strict=True)) for w in windows]
        loads = {
            wid: [sum([u[i] for i in held if i in u]) for u in by_index]
            for wid, held in ((wid, devices.effective(ref.gpus)) for wid, ref in refs.items())
        }
        disk, network = _save_bursts(windows)
        bursts = [a or b for a, b in zip(disk, network, strict=True)]
        own_io = _own_saves(windows)
        hard = _claimants(windows, devices, disk, network, own_io)
        base = node_baseline(windows, reference)
        per_node_gpu = max(len(gpu_info), 1)
        own = [_channels(w) for w in windows]
        channels = {
            "east": [w.east_bps for w in windows],
            "tx": [max(c[0] - base.tx, 0.0) for c in own],
            "rx": [max(c[1] - base.rx, 0.0) for c in own],
            "read": [max(c[2] - base.read, 0.0) for c in own],
            "write": [max(c[3] - base.write, 0.0) for c in own],
        }
        shared = {name: _attribute(loads, _steady(values)) if refs else {} for name, values in channels.items()}
        node_loads = [sum(column) for column in zip(*loads.values(), strict=True)] if loads else []
        effective: dict[int, tuple[int, ...]] = {}  # per interned reference: its devices
        tenancies: dict[tuple[int, ...], dict[str, dict[int, float]]] = {}  # per set of references, unpinned
        latest: dict[str, tuple[tuple[int, ...], dict[int, float]]] = {}  # per workload: its last window here
        pending: dict[str, list[tuple[WindowDigest, tuple[int, ...], float, float, bool]]] = {}
        down: dict[str, list[bool]] = {}  # per pending window: its GPUs were held down
        for i, window in enumerate(windows):
            facts_of = {v.workload: v for v in window.volatile}
            pinned_mib = _pinned(window)
            if pinned_mib:
                tenants = tenancy(window.workloads, devices, pinned_mib)
            else:  # the same references window after window (interned): the same tenancy
                key = tuple(map(id, window.workloads))
                tenants = tenancies.get(key) or tenancies.setdefault(key, tenancy(window.workloads, devices, {}))
            present = set(window.gpu_rows.column(0))
            for ref in window.workloads:
                if (ref.id, record.node) in gone:
                    continue
                acc = accs[ref.id]
                acc.name, acc.hint = ref.name, ref.hint
                acc.program = ref.program or acc.program
                acc.listen = tuple(ref.listen_ports) or acc.listen
                acc.step = ref.sched_step or acc.step
                held_gpus = effective.get(id(ref))
                if held_gpus is None:
                    held_gpus = effective[id(ref)] = devices.effective(ref.gpus)
                parts = tenants.get(ref.id, {})
                latest[ref.id] = (held_gpus, parts)  # the latest window says what it holds now: tenants come and go
                # A checkpoint burst on a shared node belongs to a job computing hard and steadily, as training
                # does between checkpoints; a serving workload is bursty.
                io = own_io.get(ref.id, {}).get(i)
                claimed = len(refs) == 1 or hard[i] == [ref.id]
                ckpt = (io[2] or (network[i] and claimed)) if io is not None else bursts[i] and claimed
                if bursts[i] and len(hard[i]) > 1 and ref.id in hard[i]:
                    accs[ref.id].shared_bursts += 1 / len(hard[i])
                ingress = shared["rx"][ref.id][i]
                north = shared["tx"][ref.id][i] + ingress
                facts = facts_of.get(ref.id)
                if facts is not None:
                    # None: the agent did not read its sockets, which says nothing (0 says no client was connected).
                    if facts.inbound_connections is not None:
                        acc.connections = max(acc.connections or 0, facts.inbound_connections)
                    if facts.inbound_peers is not None:
                        acc.peers = max(acc.peers or 0, facts.inbound_peers)
                    if facts.net_rx_bps is not None and facts.net_tx_bps is not None:
                        # A pod's own network namespace: its traffic, no regression needed.
                        acc.own_net = True
                        ingress, north = facts.net_rx_bps, facts.net_rx_bps + facts.net_tx_bps
                measured = not present.isdisjoint(held_gpus)
                blind = [] if measured or not window.blind else [b for b in window.blind if b.gpu in held_gpus]
                if not measured and not blind:
                    continue  # none of its GPUs reported this window: nothing of it to fold
                acc.gpu_windows += len(blind) or sum([1 for g in held_gpus if g in present])
                held_down = bool(window.throttles) and _held_down(acc, window.throttles, held_gpus, gpu_info)
                if held_down:
                    acc.held_spans.append((window.start, window.end))
                if blind:
                    _fold_blind(acc, blind, shared["east"][ref.id][i], north, ckpt)
                    if acc.blind_reason is None:
                        acc.blind_reason = _blind_reason(gpu_info, blind[0].gpu)
                else:
                    pending.setdefault(ref.id, []).append((window, held_gpus, shared["east"][ref.id][i], north, ckpt))
                    down.setdefault(ref.id, []).append(held_down)
                acc.held_mem.append(_held_memory(window, pinned_mib.get(ref.id, {}), held_gpus, parts))
                acc.node_front.append((channels["tx"][i] + channels["rx"][i]) / per_node_gpu)
                acc.ingress.append(ingress)
                acc.egress.append(max(north - ingress, 0.0))
                if io is not None:
                    acc.own_reads.append(io[0])
                    acc.own_writes.append(io[1])
                else:
                    acc.reads.append(shared["read"][ref.id][i])
                    acc.writes.append(shared["write"][ref.id][i])
                acc.baseline.append((base.tx + base.rx) / per_node_gpu)
                acc.baseline_from.add(base.source)
                if node_loads[i] >= 5:
                    acc.shares.append(loads[ref.id][i] / node_loads[i])
        for wid, (held_gpus, parts) in latest.items():
            first = gpu_info.get(held_gpus[0]) if held_gpus else None
            alone = len(held_gpus) == 1 and parts.get(held_gpus[0]) == 1.0
            accs[wid].placements[record.node] = Placement(
                node=record.node,
                gpu_model=first.model if first else "unknown",
                gpu_memory_mib=first.memory_mib if first else 0,
                gpus=held_gpus,
                held=units(parts, devices),
                profile=_profile(devices, held_gpus[0]) if alone else None,
            )
        for wid, rows in pending.items():
            clean = [row for row, held_down in zip(rows, down[wid], strict=True) if not held_down]
            kept = rows
            if len(clean) < len(rows):
                if len(clean) >= MIN_CLEAN_WINDOWS:
                    accs[wid].left_out += len(rows) - len(clean)
                    kept = clean
                else:
                    accs[wid].throttled_load = True
            _fold_windows(accs[wid], kept, record.node)
        del pending, down
        for wid in finished.pop(n, ()):
            done = accs.pop(wid) if wid in accs else None  # none where it left every node it was seen on
            if done is not None and done.windows:
                out[wid] = _features(fleet, site, wid, done)
    return [out[wid] for wid in sorted(out)]


def _blind_reason(gpu_info: Mapping[int, GpuInfo], index: int) -> str:
    """Why a device reports no utilisation, as its birth (or its GPU's, for a MIG instance) says."""
    info = gpu_info.get(index)
    parent = gpu_info.get(info.parent) if info is not None and info.parent is not None else None
    return (info and info.util_unavailable) or (parent and parent.util_unavailable) or UTIL_UNAVAILABLE


def _recent(windows: Iterable[WindowDigest], horizon: int | None) -> list[WindowDigest]:
    return list(windows)[-horizon:] if horizon else list(windows)


def _features(fleet: Fleet, site: str, wid: str, acc: _Acc) -> WorkloadFeatures:
    """A workload's features from its folded figures."""
    # its history where it runs now: digests it left on a node it moved away from describe other hardware
    digests: list[Digest] = []
    for node in acc.placements:
        held = fleet.record(site, node)
        if held is not None:
            digests += held.history.of(wid)
    if acc.held_spans:
        # Ten minutes with a window held down in them peak at what the throttle inflated: left out, as the windows
        # are, while the node's recent windows show them (older ones are no longer known).
        digests = [d for d in digests if not any(s < d.end and e > d.end - DIGEST_SECONDS for s, e in acc.held_spans)]
    hours, daily_peak, diurnal = _daily(digests)
    placements = list(acc.placements.values())
    memory = max((p.gpu_memory_mib for p in placements), default=0)
    mem_peak = max(acc.mem, default=0.0)
    gpus = max(sum(len(p.gpus) for p in placements), 1)
    per_gpu = len(placements) / gpus
    period, strength = step_period(acc.centred)
    # its throttle figures are % of a window, summed over its GPUs' windows: shares of its GPU time
    shares = [value / 100 / acc.gpu_windows if acc.gpu_windows else 0.0 for value in acc.throttle]
    # Its own counts stand for its storage traffic only where most of its windows have them (an agent upgraded an
    # hour ago has sent a few): a median mostly of the node's writes shared by load is not its own, and read as such
    # a neighbour's steady results would be its evidence whatever share of the node it uses.
    own_io = len(acc.own_writes) >= max(len(acc.writes), 1)
    reads = acc.own_reads if own_io else acc.reads + acc.own_reads
    writes = acc.own_writes if own_io else acc.writes + acc.own_writes
    runs = None
    if not acc.sparse:
        runs = work_runs(list(acc.per_gpu.values()) if acc.per_gpu else [acc.load])
    return WorkloadFeatures(
        id=wid,
        name=acc.name,
        hint=acc.hint,
        placements=placements,
        windows=acc.windows,
        mean_util=_mean(acc.util_means),
        p95_util=_p95(acc.load) if len(acc.load) >= 20 else _mean(acc.util_p95),
        burstiness=_mean(acc.cvs),
        gpu_spread=_mean(acc.spreads),
        zero_seconds=acc.idle_seconds / acc.seconds if acc.seconds else 0.0,
        mem_used_mib=mem_peak,
        mem_fraction=mem_peak / memory if memory else 0.0,
        mem_stability=_cv(acc.mem),
        gpu_link_bps=_mean(acc.links),
        east_west_bps=_mean(acc.east) * per_gpu,
        north_south_bps=_mean(acc.north) * per_gpu,
        checkpoint_windows=_mean(acc.ckpt),
        write_bursts=int(sum(acc.ckpt)),
        history_hours=hours,
        daily_peak_p95=daily_peak,
        diurnal_ratio=diurnal,
        busy_cv=_cv(acc.busy),
        busy_level=_mean(acc.busy),
        busy_seconds=len(acc.busy),
        node_front_bps=_median(acc.node_front),
        period_s=period,
        period_strength=strength,
        # A few busy windows (a notebook's cell) say little about how the work uses the GPU.
        intensity=statistics.median(acc.intensity) if len(acc.intensity) >= 3 else None,
        tensor_share=statistics.median(acc.tensor) if len(acc.tensor) >= 3 else None,
        dram_share=statistics.median(acc.dram) if len(acc.dram) >= 3 else None,
        shape_tensor=statistics.median(t for t, _ in acc.gpm) if len(acc.gpm) >= 3 else None,
        shape_dram=statistics.median(d for _, d in acc.gpm) if len(acc.gpm) >= 3 else None,
        # Medians: what the workload does most of the time, not a model load at its start.
        ingress_bps=_median(acc.ingress) * per_gpu,
        egress_bps=_median(acc.egress) * per_gpu,
        disk_read_bps=_median(reads) * per_gpu,
        program=acc.program,
        listen_ports=acc.listen,
        inbound_connections=acc.connections,
        inbound_peers=acc.peers,
        own_network=acc.own_net,
        sched_step=acc.step,
        held_mem_mib=max(acc.held_mem, default=0.0),
        front_baseline_bps=None if None in acc.baseline_from else _median(acc.baseline),
        # The least certain source of any of its nodes.
        baseline_from=None if None in acc.baseline_from else ("site" if "site" in acc.baseline_from else "node"),
        node_share=_mean(acc.shares) if acc.shares else 1.0,
        write_bps=_median(writes) * per_gpu,
        own_writes=own_io,
        shared_bursts=acc.shared_bursts,
        lockstep=gpu_lockstep(acc.per_gpu),
        per_second=not acc.sparse,
        starts_per_min=runs[0] if runs else None,
        run_s=runs[1] if runs else None,
        gap_cv=runs[2] if runs else None,
        throttle_power=shares[0],
        throttle_thermal=shares[1],
        throttle_hw=shares[2],
        throttled_share=shares[3],
        power_limit_w=acc.lowered_limit,
        throttled_left_out=acc.left_out,
        throttled_load=acc.throttled_load,
        util_unavailable=acc.blind_reason if acc.blind_windows and not acc.util_means else None,
    )
