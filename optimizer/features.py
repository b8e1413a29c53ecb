"""Workload features from telemetry windows: the signals the classifier and the planner reason about.

A workload is what the agents attributed GPUs to; the same workload id seen on several nodes is one workload
(multi-node training). Node-level traffic (NICs, disks) is shared among a node's workloads by GPU count.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from optimizer.digest import WindowDigest
from optimizer.fleet import Fleet
from optimizer.history import Digest

CHECKPOINT_BURST_BPS = 500e6  # a write second above this is a checkpoint-sized burst


@dataclass(frozen=True, slots=True)
class Placement:
    node: str
    gpu_model: str
    gpu_memory_mib: int
    gpus: tuple[int, ...]


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

    @property
    def gpus(self) -> int:
        return sum(len(p.gpus) for p in self.placements)

    @property
    def nodes(self) -> list[str]:
        return [p.node for p in self.placements]

    @property
    def multi_node(self) -> bool:
        return len(self.placements) > 1


def _mean(values: Iterable[float]) -> float:
    items = list(values)
    return statistics.fmean(items) if items else 0.0


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
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if mean > 1e-9 else 0.0


@dataclass(slots=True)
class _Acc:
    name: str = ""
    hint: str | None = None
    placements: dict[str, Placement] = field(default_factory=dict)
    util_means: list[float] = field(default_factory=list)
    util_p95: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)
    cvs: list[float] = field(default_factory=list)
    spreads: list[float] = field(default_factory=list)
    zeros: list[float] = field(default_factory=list)
    mem: list[float] = field(default_factory=list)
    links: list[float] = field(default_factory=list)
    east: list[float] = field(default_factory=list)
    north: list[float] = field(default_factory=list)
    ckpt: list[float] = field(default_factory=list)
    windows: int = 0


def _fold_window(acc: _Acc, window: WindowDigest, gpu_ids: set[int], east: float, north: float, ckpt: bool) -> None:
    gpus = [g for g in window.gpus if g.index in gpu_ids]
    if not gpus:
        return
    acc.windows += 1
    acc.util_means.append(_mean(g.util_mean for g in gpus))
    acc.util_p95.append(max(g.util_p95 for g in gpus))
    acc.cvs.extend(_cv(g.series) for g in gpus if len(g.series) > 1)
    series = [g.series for g in gpus if len(g.series)]
    if series:
        for i in range(min(len(s) for s in series)):
            column = [s[i] for s in series]
            level = statistics.fmean(column)
            acc.load.append(level)
            if len(series) > 1:
                acc.spreads.append((max(column) - min(column)) / max(level, 5.0))
    for g in gpus:
        acc.zeros.extend(1.0 if v < 2 else 0.0 for v in g.series)
        if g.mem_max_mib is not None:
            acc.mem.append(g.mem_max_mib)
        acc.links.append(g.link_bps)
    acc.east.append(east)
    acc.north.append(north)
    acc.ckpt.append(1.0 if ckpt else 0.0)


def _window_load(window: WindowDigest, gpu_ids: Sequence[int]) -> float:
    """GPU-percent of work a workload did in a window: its GPUs' mean utilisation summed."""
    ids = set(gpu_ids)
    return sum(g.util_mean for g in window.gpus if g.index in ids)


def _trains_hard(window: WindowDigest, gpu_ids: Sequence[int]) -> bool:
    ids = set(gpu_ids)
    gpus = [g for g in window.gpus if g.index in ids]
    if not gpus:
        return False
    mean = sum(g.util_mean for g in gpus) / len(gpus)
    variation = sum(g.util_std / max(g.util_mean, 1.0) for g in gpus) / len(gpus)
    return mean >= 60 and variation < 0.15


def nnls(columns: list[list[float]], target: list[float], rounds: int = 200) -> list[float]:
    """Non-negative least squares by coordinate descent: a ≥ 0 minimising |target - Σ a_j columns_j|²."""
    coef = [0.0] * len(columns)
    residual = list(target)
    norms = [sum(v * v for v in col) for col in columns]
    for _ in range(rounds):
        moved = 0.0
        for j, col in enumerate(columns):
            if norms[j] <= 0:
                continue
            step = sum(c * r for c, r in zip(col, residual, strict=True)) / norms[j]
            new = max(0.0, coef[j] + step)
            delta = new - coef[j]
            if delta:
                coef[j] = new
                residual = [r - delta * c for r, c in zip(residual, col, strict=True)]
                moved = max(moved, abs(delta) * max(col, default=0.0))
        if moved < 1e-6 * (max(target, default=0.0) + 1):
            break
    return coef


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


def workload_features(fleet: Fleet, site: str, horizon: int | None = None) -> list[WorkloadFeatures]:
    """Features of every workload seen in ``site`` over the last ``horizon`` windows of each node."""
    accs: dict[str, _Acc] = defaultdict(_Acc)
    for (rec_site, _), record in sorted(fleet.nodes.items()):
        if rec_site != site or record.birth is None:
            continue
        gpu_info = {g.index: g for g in record.birth.gpus}
        windows = list(record.windows)[-horizon:] if horizon else list(record.windows)
        refs = {ref.id: ref for window in windows for ref in window.workloads}
        # Node-level signals (NICs, disks) per window, then shared among the node's workloads.
        loads = {wid: [_window_load(w, ref.gpus) for w in windows] for wid, ref in refs.items()}
        traffic = [(w.east_bps, w.north_bps, w.peak_write_bps) for w in windows]
        east = _attribute(loads, [t[0] for t in traffic]) if refs else {}
        north = _attribute(loads, [t[1] for t in traffic]) if refs else {}
        for i, window in enumerate(windows):
            for ref in window.workloads:
                acc = accs[ref.id]
                acc.name, acc.hint = ref.name, ref.hint
                first = gpu_info.get(ref.gpus[0]) if ref.gpus else None
                acc.placements[record.node] = Placement(
                    node=record.node,
                    gpu_model=first.model if first else "unknown",
                    gpu_memory_mib=first.memory_mib if first else 0,
                    gpus=tuple(ref.gpus),
                )
                # A checkpoint burst on a shared node belongs to a job computing hard and steadily, as training
                # does between checkpoints; a serving workload is bursty.
                ckpt = traffic[i][2] >= CHECKPOINT_BURST_BPS and (len(refs) == 1 or _trains_hard(window, ref.gpus))
                _fold_window(acc, window, set(ref.gpus), east[ref.id][i], north[ref.id][i], ckpt)
    digests: dict[str, list[Digest]] = defaultdict(list)
    for (rec_site, _), record in fleet.nodes.items():
        if rec_site == site:
            for wid in accs:
                digests[wid] += record.history.of(wid)
    out = []
    for wid, acc in sorted(accs.items()):
        if acc.windows == 0:
            continue
        hours, daily_peak, diurnal = _daily(digests[wid])
        placements = list(acc.placements.values())
        memory = max((p.gpu_memory_mib for p in placements), default=0)
        mem_peak = max(acc.mem, default=0.0)
        gpus = max(sum(len(p.gpus) for p in placements), 1)
        out.append(
            WorkloadFeatures(
                id=wid,
                name=acc.name,
                hint=acc.hint,
                placements=placements,
                windows=acc.windows,
                mean_util=_mean(acc.util_means),
                p95_util=_p95(acc.load) if len(acc.load) >= 20 else _mean(acc.util_p95),
                burstiness=_mean(acc.cvs),
                gpu_spread=_mean(acc.spreads),
                zero_seconds=_mean(acc.zeros),
                mem_used_mib=mem_peak,
                mem_fraction=mem_peak / memory if memory else 0.0,
                mem_stability=_cv(acc.mem),
                gpu_link_bps=_mean(acc.links),
                east_west_bps=_mean(acc.east) * len(placements) / gpus,
                north_south_bps=_mean(acc.north) * len(placements) / gpus,
                checkpoint_windows=_mean(acc.ckpt),
                write_bursts=int(sum(acc.ckpt)),
                history_hours=hours,
                daily_peak_p95=daily_peak,
                diurnal_ratio=diurnal,
            )
        )
    return out
