"""The rest of the node: GPUs paid for while they wait on the host's CPUs, on storage or on a neighbour.

Four findings, each read from what the node's windows show beside the workload's GPUs (docs/nodefit.md):

* input-starved training: its GPUs below a training's usual level while every host CPU is busy: the data
  loader's workers (decode, augmentation) cannot keep up, and more GPUs or faster ones would wait as long;
* checkpoint stall: its GPUs idle inside its own save bursts: the save blocks the training loop (``torch.save``,
  DCP's ``save``), where ``async_save`` would let them compute while the state is written;
* slow cold start: a replica whose GPUs idle while its memory fills and the node reads, for longer than the same
  bytes would take from local NVMe;
* mixed node: a service whose per-second load varies more in the windows a training neighbour exchanges
  gradients over the links they share than in the others.

Each is measured per workload (``measure``, kept in the snapshot as ``node_fit``) and judged with its class
(``detect``). Costs are GPU-hours paid while the GPUs wait, at the catalog's price per GPU-hour: estimates, since
what the wait would have become without the cause is not measured.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from agent.protocol import Finding, FindingKind, WorkloadClass
from optimizer.decide.catalog import GpuType
from optimizer.decide.features import _save_bursts
from optimizer.ingest.digest import WindowDigest
from optimizer.ingest.fleet import Fleet
from optimizer.ingest.shares import layout

GB = 1e9
# Host CPU (%, all cores) at which a data loader's workers hold every core: the kernel's own work and the
# exporters leave a few percent, so 90 is saturation, not a busy host.
CPU_SATURATED_PCT = 90.0
# Training keeps its GPUs 85-95 % busy when its input keeps up (the reference article; DESIGN.md): below 85 the
# GPUs wait for something, and what they wait for below it is the cost.
TRAINING_BUSY_PCT = 85.0
STARVED_SHARE = 0.5  # starved in most of its windows: a steady cause, not one slow shard of the dataset
# A synchronous save idles the GPUs for all of it, an asynchronous one not at all: idle for half the save's
# windows beyond their usual idle time parts the two with room for the windows a save only partly covers.
SAVE_IDLE = 0.5
MIN_SAVE_WINDOWS = 2  # windows inside its own save bursts before a stall is judged
MIN_OTHER_WINDOWS = 3  # and outside them, for its usual idle time
IDLE_PCT = 5.0  # a GPU whose busiest seconds (p95) stay under this ran no work in the window
# Bytes/s a node reads while a replica loads its weights: NFS and object storage deliver 1-5 GB/s; a service's
# own requests and a node's logs are MB/s, so a tenth of the slowest load parts them.
LOAD_READ_BPS = 100e6
# An estimate of a local NVMe cache's read: one PCIe Gen4 x4 data-centre drive reads 6.9 GB/s sequentially
# (Samsung PM9A3 datasheet); used where the node's birth says nothing of its NVMe.
LOCAL_NVME_READ_BPS = 6.9e9
FILLING = 0.95  # memory below this share of its peak: weights still arriving (a serving engine's is flat)
MIN_LOADING_WINDOWS = 2  # windows seen loading (whole starts or not) before a start's cost is judged
# Read at under half of what local NVMe delivers: a local copy would at least halve each start.
LOCAL_SPEEDUP = 2.0
CONTIGUOUS_S = 2.0  # windows this close follow each other: a load phase or a save is read across them
# Exchange windows: a neighbour's NVLink + PCIe traffic per GPU at twice its calm level and at least 1 GB/s
# (gradients move GB/s; a service's requests and a loader's batches, MB/s); calm windows within a quarter of that
# level (the 1 Hz counters' own spread is a few percent).
EXCHANGE_FACTOR = 2.0
CALM_FACTOR = 1.25
EXCHANGE_MIN_BPS = 1e9
# A service's per-second variability (cv within a window) 30 % higher in its neighbour's exchange windows than
# outside them: requests waiting on shared links. Over three windows or more a side, the sampling spread of a
# mean cv is a few percent (an estimate from the simulated services' clean windows, bench/nodefit.py).
MIXED_CV_RATIO = 1.3
# Or 15 % busier in them at the same load: each request holds its GPU longer while it waits on the links. A service's
# mean over three 10 s windows or more varies by a few percent from its request arrivals alone (an estimate).
MIXED_SLOWDOWN = 1.15
MIN_SIDE_WINDOWS = 3
SERVING = frozenset({WorkloadClass.INFERENCE, WorkloadClass.INTERACTIVE})
# The findings this module makes, in the order the module's docstring tells them: every reader of "GPUs waiting on
# the rest of their node" (the plan's text, chat, the benchmark) takes them from here.
FINDING_KINDS = (
    FindingKind.INPUT_STARVED_TRAINING,
    FindingKind.CHECKPOINT_STALL,
    FindingKind.SLOW_COLD_START,
    FindingKind.MIXED_NODE,
)
# Storage-bound input. A pipeline bound by its storage's bandwidth reads at that bandwidth every second whatever its
# GPUs do, so the node's reads sit on a plateau while the GPUs wait; one bound by its GPUs reads what they consume
# and follows them. Plateau: the windows' mean reads within 10 % of their median (an estimate: a 10 s mean of a
# read stream at its limit varies by a few percent).
PLATEAU_SPREAD = 0.10
# Near the ceiling: local disks at 70 % or more of the node's NVMe read estimate (a sequential figure from the
# drives' PCIe links: a dataloader's reads of many files reach 70-90 % of it, an estimate).
NEAR_LOCAL = 0.7
# Over a network file system the ceiling is the mount's share of the filer and of the front-end NIC, which the node
# does not report: one NFS client over one TCP connection delivers about 1-2 GB/s (no nconnect; an estimate), so a
# plateau at 1 GB/s or more over the network is taken as the mount's limit.
NETWORK_CEILING_BPS = 1e9


class NodeFit(BaseModel):
    """What a workload's node showed beside its GPUs over the windows read (None: not measured)."""

    model_config = ConfigDict(extra="forbid")

    windows: int = Field(default=0, ge=0)
    starved_share: float | None = Field(default=None, ge=0, le=1, description="host CPU saturated, GPUs below 85 %")
    starved_util: float | None = Field(default=None, ge=0, le=100, description="its GPUs' mean % in those windows")
    starved_cpu: float | None = Field(default=None, ge=0, le=100, description="host CPU % in those windows")
    starved_wait: float | None = Field(default=None, ge=0, le=1, description="GPU time below 85 %, all windows")
    cores_per_gpu: float | None = Field(default=None, gt=0, description="its node's logical CPUs per GPU")
    save_windows: int = Field(default=0, ge=0, description="windows inside its own save bursts")
    save_share: float | None = Field(default=None, ge=0, le=1)
    save_idle: float | None = Field(default=None, ge=-1, le=1, description="GPU idle share inside saves, beyond usual")
    save_gb: float | None = Field(default=None, ge=0, description="the largest save seen, GB")
    save_gbps: float | None = Field(default=None, ge=0, description="its write rate, GB/s")
    cold_starts: int = Field(default=0, ge=0, description="load phases seen from start to serving")
    cold_start_s: float | None = Field(default=None, ge=0, description="their mean length, s")
    cold_start_gb: float | None = Field(default=None, ge=0, description="bytes read in each, GB")
    loading_share: float | None = Field(default=None, ge=0, le=1, description="windows its GPUs spent loading")
    loading_windows: int = Field(default=0, ge=0)
    loading_gbps: float | None = Field(default=None, ge=0, description="the node's reads in them, GB/s")
    local_read_gbps: float | None = Field(default=None, ge=0, description="its node's local NVMe read, GB/s")
    neighbour: str | None = Field(default=None, max_length=200, description="the neighbour that exchanged most")
    neighbour_name: str | None = Field(default=None, max_length=200)
    cv_ratio: float | None = Field(default=None, ge=0, description="its variability in exchange windows / others")
    slowdown: float | None = Field(default=None, ge=0, description="its mean % in exchange windows / others")
    contended_share: float | None = Field(default=None, ge=0, le=1)
    contended_extra_util: float | None = Field(default=None, ge=0, le=100, description="% more busy in them")
    storage_share: float | None = Field(
        default=None, ge=0, le=1, description="GPUs below 85 % while the node's reads sit on a plateau at their limit"
    )
    storage_gbps: float | None = Field(default=None, ge=0, description="the node's reads in those windows, GB/s")
    storage_limit_gbps: float | None = Field(default=None, ge=0, description="the ceiling they were read against")
    storage_network: bool | None = Field(default=None, description="read over a network file system")
    storage_util: float | None = Field(default=None, ge=0, le=100, description="its GPUs' mean % in those windows")
    storage_wait: float | None = Field(default=None, ge=0, le=1, description="GPU time below 85 % in them, all windows")


class Subject(Protocol):
    """A snapshot workload as the findings read it."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def nodes(self) -> list[str]: ...
    @property
    def gpus(self) -> int: ...
    @property
    def workload_class(self) -> WorkloadClass: ...
    @property
    def confidence(self) -> float: ...
    @property
    def share(self) -> float: ...
    @property
    def node_fit(self) -> NodeFit | None: ...


# ----------------------------------------------------------------------------------------------- measuring


@dataclass(slots=True)
class _Seen:
    """One workload's windows on one node: per window its figures, and the node's."""

    name: str
    listens: bool = False
    at: list[int] = field(default_factory=list)  # which of the node's windows
    util: list[float] = field(default_factory=list)  # mean across its GPUs
    p95: list[float] = field(default_factory=list)  # the busiest of its GPUs
    cv: list[float] = field(default_factory=list)  # per-second variation within the window, mean of its GPUs
    link: list[float] = field(default_factory=list)  # NVLink + PCIe per GPU
    mem: list[float] = field(default_factory=list)  # peak MiB across its GPUs (NaN: not read)


def _fold(windows: Sequence[WindowDigest], devices: Mapping[str, tuple[int, ...]]) -> dict[str, _Seen]:
    """Each workload's figures per window, read straight from the window's packed rows (a GPU's head: index,
    util_mean, util_p95, util_std, mem_max_mib, link_bps): no GPU copied out, a plan at fleet size reads them all."""
    seen: dict[str, _Seen] = {}
    for i, w in enumerate(windows):
        rows = w.gpu_rows
        width = int(rows[0])
        starts = {int(index): 1 + k * width for k, index in enumerate(rows[1::width])}
        for ref in w.workloads:
            at = [starts[g] for g in devices.get(ref.id, tuple(ref.gpus)) if g in starts]
            if not at:
                continue
            s = seen.get(ref.id)
            if s is None:
                s = seen[ref.id] = _Seen(ref.name)
            s.listens = s.listens or bool(ref.listen_ports)
            n = len(at)
            means = [rows[a + 1] for a in at]
            s.at.append(i)
            s.util.append(sum(means) / n)
            s.p95.append(max([rows[a + 2] for a in at]))
            s.cv.append(sum([rows[a + 3] / max(m, 1.0) for a, m in zip(at, means, strict=True)]) / n)
            s.link.append(sum([rows[a + 5] for a in at]) / n)
            mems = [m for a in at if not math.isnan(m := rows[a + 4])]
            s.mem.append(max(mems) if mems else math.nan)
    return seen


def _seconds(w: WindowDigest) -> float:
    return max(w.end - w.start, 0.0)


def _follows(a: WindowDigest, b: WindowDigest) -> bool:
    return 0 <= b.start - a.end <= CONTIGUOUS_S


def _starved(fit: NodeFit, s: _Seen, windows: Sequence[WindowDigest]) -> None:
    known = [(u, windows[i].cpu_util) for u, i in zip(s.util, s.at, strict=True) if windows[i].cpu_util is not None]
    if not known:
        return
    hit = [(u, c) for u, c in known if c is not None and c >= CPU_SATURATED_PCT and u < TRAINING_BUSY_PCT]
    fit.starved_share = len(hit) / len(known)
    fit.starved_wait = sum(TRAINING_BUSY_PCT - u for u, _ in hit) / 100 / len(known)
    if hit:
        fit.starved_util = statistics.fmean(u for u, _ in hit)
        fit.starved_cpu = statistics.fmean(c for _, c in hit if c is not None)


def _storage(fit: NodeFit, s: _Seen, windows: Sequence[WindowDigest], local_bps: float | None, network: bool) -> None:
    """Windows in which its GPUs sit below a training's level, the host's CPUs are not what holds them, and the
    node's storage reads (front-end traffic in, on a node with network mounts; its disks otherwise) are on a plateau
    near their ceiling."""
    waiting = [
        (u, windows[i].north_rx_bps if network else windows[i].read_bps)
        for u, i in zip(s.util, s.at, strict=True)
        if u < TRAINING_BUSY_PCT and (windows[i].cpu_util or 0.0) < CPU_SATURATED_PCT
    ]
    reads = [r for _, r in waiting]
    if not reads or not s.util:
        return
    level = statistics.median(reads)
    ceiling = NETWORK_CEILING_BPS if network else NEAR_LOCAL * (local_bps or LOCAL_NVME_READ_BPS)
    if level < max(ceiling, LOAD_READ_BPS):
        return
    hit = [(u, r) for u, r in waiting if abs(r - level) <= PLATEAU_SPREAD * level]
    fit.storage_share = len(hit) / len(s.util)
    fit.storage_wait = sum(TRAINING_BUSY_PCT - u for u, _ in hit) / 100 / len(s.util)
    if not hit:
        return
    fit.storage_util = statistics.fmean(u for u, _ in hit)
    fit.storage_gbps = statistics.fmean(r for _, r in hit) / GB
    fit.storage_limit_gbps = (NETWORK_CEILING_BPS if network else local_bps or LOCAL_NVME_READ_BPS) / GB
    fit.storage_network = network


def _written(w: WindowDigest, to_disk: bool) -> tuple[float, float]:
    """A save window's mean and busiest-second rate, bytes/s, where the save went: the node's disks, or out of its
    front end (to NFS or object storage: the front end's mean out is its traffic less what came in)."""
    if to_disk:
        return w.write_bps, w.peak_write_bps
    return max(w.north_bps - w.north_rx_bps, 0.0), w.north_tx_peak_bps


def _saves(
    fit: NodeFit, wid: str, s: _Seen, windows: Sequence[WindowDigest], disk: list[bool], network: list[bool]
) -> None:
    """Its GPUs' idle time inside the save bursts that are its own (the one workload on the node, or the one that
    does not listen for clients: a service's writes are its logs), beyond their usual idle share. A window holds
    a save's seconds in the ratio of its mean write rate to its busiest second's, on the disks or out of the front
    end, wherever the burst was: a save that begins or ends inside a window counts for the seconds it wrote."""
    inside: list[tuple[float, float]] = []  # (GPU idle seconds, seconds writing) per window of its saves
    outside: list[float] = []
    runs: list[list[int]] = []
    run: list[int] = []
    for u, i in zip(s.util, s.at, strict=True):
        w = windows[i]
        writers = [r.id for r in w.workloads if not r.listen_ports]
        mine = (disk[i] or network[i]) and (len(w.workloads) == 1 or writers == [wid])
        idle = 1 - min(u, 100.0) / 100
        if not mine:
            outside.append(idle)
            continue
        seconds = _seconds(w)
        mean, peak = _written(w, disk[i])
        writing = seconds * min(1.0, mean / peak) if peak > 0 else seconds
        inside.append((min(idle * seconds, writing), writing))
        if run and not _follows(windows[run[-1]], w):
            runs.append(run)
            run = []
        run.append(i)
    if run:
        runs.append(run)
    fit.save_windows = len(inside)
    if len(inside) < MIN_SAVE_WINDOWS or len(outside) < MIN_OTHER_WINDOWS:
        return
    writing = sum(wr for _, wr in inside)
    if writing <= 0:
        return
    fit.save_share = min(1.0, writing / sum(_seconds(windows[i]) for i in s.at))
    fit.save_idle = sum(idle for idle, _ in inside) / writing - statistics.fmean(outside)
    rates = {i: _written(windows[i], disk[i]) for r in runs for i in r}
    written = [(sum(rates[i][0] * _seconds(windows[i]) for i in r), max(rates[i][1] for i in r)) for r in runs]
    volume, peak = max(written)
    fit.save_gb, fit.save_gbps = volume / GB, peak / GB


def _cold_starts(fit: NodeFit, s: _Seen, windows: Sequence[WindowDigest], local_bps: float | None) -> None:
    """Load phases: windows in which its GPUs ran nothing while their memory filled and the node read, ended by
    a window in which they served."""
    inbound = [w.read_bps + w.north_rx_bps for w in windows]
    usual = statistics.median(inbound) if inbound else 0.0

    def excess(w: WindowDigest) -> float:
        return (w.read_bps + w.north_rx_bps - usual) * _seconds(w)

    known = [m for m in s.mem if math.isfinite(m)]
    full = max(known, default=math.nan)
    loading = []
    for k, (p95, i) in enumerate(zip(s.p95, s.at, strict=True)):
        # a replica still filling its memory holds less than it does serving (NaN: memory not read)
        filling = not math.isfinite(s.mem[k]) or s.mem[k] < FILLING * full
        loading.append(p95 < IDLE_PCT and inbound[i] - usual >= LOAD_READ_BPS and filling)
    fit.loading_share = sum(loading) / len(loading)
    fit.loading_windows = sum(loading)
    fit.local_read_gbps = (local_bps or LOCAL_NVME_READ_BPS) / GB
    spent = [windows[i] for i, yes in zip(s.at, loading, strict=True) if yes]
    if spent:
        fit.loading_gbps = sum(map(excess, spent)) / max(sum(map(_seconds, spent)), 1.0) / GB
    phases: list[tuple[float, float]] = []  # (seconds, bytes)
    k = 0
    while k < len(loading):
        if not loading[k]:
            k += 1
            continue
        first = k
        while k + 1 < len(loading) and loading[k + 1] and _follows(windows[s.at[k]], windows[s.at[k + 1]]):
            k += 1
        after = k + 1
        served = after < len(loading) and s.p95[after] >= IDLE_PCT  # its GPUs ran work: it serves
        if served and _follows(windows[s.at[k]], windows[s.at[after]]):
            span = [windows[s.at[j]] for j in range(first, k + 1)]
            seconds = sum(map(_seconds, span))
            volume = sum(excess(w) for w in span)
            # The windows either side hold the load's first and last seconds: their reads beyond the usual, at the
            # phase's rate, count as the seconds they took.
            edges = [windows[s.at[after]]]
            if first > 0 and _follows(windows[s.at[first - 1]], span[0]):
                edges.append(windows[s.at[first - 1]])
            extra = sum(max(excess(w), 0.0) for w in edges)
            rate = volume / seconds if seconds else 0.0
            phases.append((seconds + (extra / rate if rate > 0 else 0.0), volume + extra))
        k += 1
    fit.cold_starts = len(phases)
    if phases:
        fit.cold_start_s = statistics.fmean(p[0] for p in phases)
        fit.cold_start_gb = statistics.fmean(p[1] for p in phases) / GB


def _neighbours(fit: NodeFit, s: _Seen, seen: Mapping[str, _Seen], wid: str) -> None:
    """Its variability in the windows a neighbour's links burst against the windows they do not."""
    mine = dict(zip(s.at, zip(s.cv, s.util, strict=True), strict=True))
    best: tuple[float, float, str, float, float] | None = None
    for other_id, other in seen.items():
        if other_id == wid or not other.link:
            continue
        # its calm level: the quietest quarter of its windows (an exchange may fill half of them or more)
        usual = statistics.quantiles(other.link, n=4)[0] if len(other.link) >= 4 else min(other.link)
        floor = max(EXCHANGE_FACTOR * usual, EXCHANGE_MIN_BPS)
        during: list[tuple[float, float]] = []
        apart: list[tuple[float, float]] = []
        for i, link in zip(other.at, other.link, strict=True):
            if i in mine and link >= floor:
                during.append(mine[i])
            elif i in mine and link <= CALM_FACTOR * usual:  # windows an exchange only grazed count on neither side
                apart.append(mine[i])
        if len(during) < MIN_SIDE_WINDOWS or len(apart) < MIN_SIDE_WINDOWS:
            continue
        calm = statistics.fmean(cv for cv, _ in apart)
        ratio = statistics.fmean(cv for cv, _ in during) / max(calm, 1e-3)
        busy, usual = statistics.fmean(u for _, u in during), statistics.fmean(u for _, u in apart)
        slowdown = busy / max(usual, 1.0)
        share = len(during) / len(other.link)
        if best is None or (slowdown, ratio) > best[:2]:
            best = (slowdown, ratio, other_id, share, max(busy - usual, 0.0))
            fit.neighbour_name = other.name
    if best is not None:
        fit.slowdown, fit.cv_ratio, fit.neighbour, fit.contended_share, fit.contended_extra_util = best


def measure(fleet: Fleet, site: str) -> dict[str, NodeFit]:
    """Per workload of ``site``, what its node showed beside its GPUs (on the node where it ran most windows)."""
    out: dict[str, NodeFit] = {}
    for (rec_site, _), record in sorted(fleet.nodes.items()):
        if rec_site != site or record.birth is None or not record.windows:
            continue
        windows = list(record.windows)
        devices = layout(record.birth)
        held = {ref.id: devices.effective(ref.gpus) for w in windows for ref in w.workloads}
        seen = _fold(windows, held)
        # the saves the classifier reads (local disks or out of the front end): a stall is judged on the same bursts
        disk, network = _save_bursts(windows)
        host = record.birth.host
        local = host.local_nvme_read_bps if host is not None and host.local_nvme_bytes else None
        # per GPU as the planner counts a target's (snapshot.py): a partition or MIG instance is no GPU of its own
        cores = host.cpu_cores / devices.node_gpus if host is not None and host.cpu_cores else None
        for wid, s in seen.items():
            if wid in out and out[wid].windows >= len(s.util):
                continue
            fit = NodeFit(windows=len(s.util), cores_per_gpu=cores)
            _starved(fit, s, windows)
            _storage(fit, s, windows, local, bool(host is not None and host.network_mounts))
            _saves(fit, wid, s, windows, disk, network)
            _cold_starts(fit, s, windows, local)
            _neighbours(fit, s, seen, wid)
            out[wid] = fit
    return out


# ----------------------------------------------------------------------------------------------- judging


def starved(cls: WorkloadClass, fit: NodeFit | None) -> bool:
    """Whether training waits on its host's CPUs in most of its windows."""
    return (
        cls is WorkloadClass.TRAINING
        and fit is not None
        and (fit.starved_share or 0) >= STARVED_SHARE
        and bool(fit.starved_wait)
    )


def storage_starved(cls: WorkloadClass, fit: NodeFit | None) -> bool:
    """Whether training waits on its storage's bandwidth in most of its windows (and not on its host's CPUs)."""
    return (
        cls is WorkloadClass.TRAINING
        and fit is not None
        and not starved(cls, fit)
        and (fit.storage_share or 0) >= STARVED_SHARE
        and bool(fit.storage_wait)
    )


def cores_needed(cls: WorkloadClass, fit: NodeFit | None) -> float | None:
    """CPU cores per GPU input-starved training needs on a node it moves to: its node's, scaled by how far its GPUs
    sit below a training's usual level (the loader's throughput grows with its cores; an estimate). None where it
    is not starved or its node's cores are not known."""
    if fit is None or not starved(cls, fit) or fit.cores_per_gpu is None or not fit.starved_util:
        return None
    return float(min(512, math.ceil(fit.cores_per_gpu * TRAINING_BUSY_PCT / max(fit.starved_util, 1.0))))


def _finding(
    w: Subject, hw: GpuType, kind: FindingKind, waste: float, confidence: float, detail: str, fix: str | None
) -> Finding:
    return Finding(
        workload=w.id,
        workload_name=w.name,
        kind=kind,
        hardware=hw.name,
        nodes=w.nodes,
        wasted_usd_per_hour=round(max(waste, 0.0), 3),
        confidence=round(min(max(confidence, 0.0), 1.0), 2),
        detail=detail[:2000],
        fix=fix,
    )


def _input_starved(w: Subject, hw: GpuType, fit: NodeFit, hourly: float) -> Finding | None:
    """Training whose input cannot keep up, on its host's CPUs or else on its storage's bandwidth: one finding
    either way, the GPU time below a training's level paid while it waits."""
    cls = w.workload_class
    if starved(cls, fit):
        util, share, wait = fit.starved_util, fit.starved_share, fit.starved_wait
        cause = (
            f"the host's CPUs run at {fit.starved_cpu or 0:.0f} %",
            f"the data loader cannot keep up (training keeps GPUs {TRAINING_BUSY_PCT:.0f} % busy when its input does)",
        )
        fix = (
            "more DataLoader workers (num_workers up to the cores per GPU), pin_memory=True and prefetch_factor, "
            "or decode on the GPU (NVIDIA DALI); a node with more CPU cores per GPU if the cores are all busy"
        )
    elif storage_starved(cls, fit):
        util, share, wait = fit.storage_util, fit.storage_share, fit.storage_wait
        where = "over its network file system" if fit.storage_network else "from its local disks"
        limit = "one NFS client's usual limit" if fit.storage_network else "the node's NVMe read estimate"
        cause = (
            f"the node reads {where} at a flat {fit.storage_gbps or 0:.1f} GB/s "
            f"({limit}: {fit.storage_limit_gbps or 0:.1f} GB/s)",
            "its input waits on storage bandwidth, not on the host's CPUs",
        )
        fix = (
            "stage the dataset on local NVMe before the job starts (or cache it there: a node-local dataset "
            "cache), read it in fewer, larger files (WebDataset shards) and raise prefetch_factor; a node with "
            "local NVMe if this one has none"
        )
    else:
        return None
    return _finding(
        w,
        hw,
        FindingKind.INPUT_STARVED_TRAINING,
        hourly * (wait or 0.0),
        w.confidence * min(1.0, share or 0),
        f"its GPUs at {util or 0:.0f} % while {cause[0]} in {share or 0:.0%} of its windows: {cause[1]}; faster GPUs "
        f"would wait as long. Waste: GPU time below {TRAINING_BUSY_PCT:.0f} %, an estimate",
        fix,
    )


def _judge(w: Subject, hw: GpuType, fit: NodeFit, classes: Mapping[str, WorkloadClass]) -> list[Finding]:
    hourly = w.gpus * w.share * hw.price_per_gpu_hour  # the catalog's price of the GPUs it holds
    cls, out = w.workload_class, []
    waiting = _input_starved(w, hw, fit, hourly)
    if waiting is not None:
        out.append(waiting)
    if cls is WorkloadClass.TRAINING and fit.save_idle is not None and fit.save_idle >= SAVE_IDLE:
        share = fit.save_share or 0.0
        size = f"{fit.save_gb:.0f} GB at {fit.save_gbps:.1f} GB/s, " if fit.save_gb and fit.save_gbps else ""
        out.append(
            _finding(
                w,
                hw,
                FindingKind.CHECKPOINT_STALL,
                hourly * share * fit.save_idle,
                w.confidence,
                f"its GPUs idle {fit.save_idle:.0%} more in its own save bursts ({size}{fit.save_windows} windows, "
                f"{share:.0%} of its time) than between them: the save blocks training. Waste: GPU time idle in "
                "saves, an estimate",
                "asynchronous checkpointing: torch.distributed.checkpoint.async_save (or the framework's async "
                "option), which copies the state to host memory and writes it while the GPUs compute",
            )
        )
    local = fit.local_read_gbps or LOCAL_NVME_READ_BPS / GB
    rate = fit.loading_gbps or 0.0
    if cls in SERVING and fit.loading_windows >= MIN_LOADING_WINDOWS and 0 < rate * LOCAL_SPEEDUP <= local:
        whole = ""
        if fit.cold_starts and fit.cold_start_s and fit.cold_start_gb:
            whole = (
                f"; a start seen whole took {fit.cold_start_s:.0f} s for {fit.cold_start_gb:.0f} GB, "
                f"{fit.cold_start_gb / local:.0f} s from local NVMe"
            )
        out.append(
            _finding(
                w,
                hw,
                FindingKind.SLOW_COLD_START,
                hourly * (fit.loading_share or 0.0) * (1 - rate / local),
                w.confidence,
                f"its GPUs idle while it reads its weights at {rate:.1f} GB/s in {fit.loading_share or 0:.0%} of its "
                f"windows (replicas starting); the node's local NVMe reads {local:.1f} GB/s{whole}. Waste: the GPU "
                "time a local copy saves, an estimate",
                "keep the weights on the node's local NVMe (a node-local model cache, pulled before the replica "
                "starts) or stream them from the cache in parallel",
            )
        )
    neighbour = classes.get(fit.neighbour or "")
    contended = (fit.cv_ratio or 0) >= MIXED_CV_RATIO or (fit.slowdown or 0) >= MIXED_SLOWDOWN
    if cls in SERVING and neighbour is WorkloadClass.TRAINING and contended:
        share = fit.contended_share or 0.0
        out.append(
            _finding(
                w,
                hw,
                FindingKind.MIXED_NODE,
                hourly * share * (fit.contended_extra_util or 0.0) / 100,
                w.confidence * 0.8,
                f"in the {share:.0%} of windows in which training {fit.neighbour_name or fit.neighbour} exchanges "
                f"gradients on the same node its GPUs are {fit.slowdown or 0:.2f}x as busy "
                f"(+{fit.contended_extra_util or 0:.0f} points) and vary {fit.cv_ratio or 0:.2f}x as much: its "
                "requests wait on the shared links. "
                "Waste: its extra GPU time in them, an estimate; the cost that matters is its latency. Keep training "
                "and latency-sensitive serving on separate nodes",
                None,
            )
        )
    return out


def detect(catalog_hardware: Iterable[tuple[Subject, GpuType | None]]) -> list[Finding]:
    """Rest-of-node findings for workloads (each with its catalog hardware), most wasteful first."""
    pairs = list(catalog_hardware)
    classes = {w.id: w.workload_class for w, _ in pairs}
    out = []
    for w, hw in pairs:
        if hw is not None and w.node_fit is not None:
            out += _judge(w, hw, w.node_fit, classes)
    out.sort(key=lambda f: -f.wasted_usd_per_hour)
    return out
