"""A simulated fleet's past as the exporters would have published it, timestamped, for backfilling a
Prometheus-compatible store.

Two forms: OpenMetrics text, which ``promtool tsdb create-blocks-from openmetrics`` turns into TSDB blocks (every
family's samples together, ``# EOF`` last), and the Prometheus text format with millisecond timestamps, which
VictoriaMetrics' ``/api/v1/import/prometheus`` takes in any order. Lines are written as they are made: a family's
OpenMetrics lines go to a file of their own beside the output, which is joined onto the output once the
simulation has passed, so memory holds one step of one node at a time.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import multiprocessing
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from collectors.sim.exporter import (
    KUBE_FAMILIES,
    NODE_FAMILIES,
    ExporterOptions,
    Family,
    Field,
    NodeView,
    fields,
    gpu_label_sets,
    ground_truth,
    kube_series,
    node_series,
    node_view,
)
from collectors.sim.names import HistoryFormat
from collectors.sim.scenarios import ScenarioNode, simulated_node
from collectors.sim.spec import DAY_S


@dataclass(frozen=True, slots=True)
class HistoryStats:
    steps: int
    lines: int
    bytes: int
    seconds: float
    workloads: int


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def labels_path(path: Path) -> Path:
    """Where the ground truth of ``path`` goes: ``FILE.labels.json``."""
    return path.with_name(path.name + ".labels.json")


def write_history(
    nodes: Sequence[ScenarioNode],
    path: Path,
    *,
    end: float,
    span: float,
    step: float,
    options: ExporterOptions,
    fmt: HistoryFormat = "openmetrics",
    seed: int = 0,
    jobs: int = 1,
    sample_every: float | None = None,
) -> HistoryStats:
    """Write the ``span`` seconds before ``end``, one sample of every node each ``step`` seconds, to ``path``,
    and the ground truth to ``FILE.labels.json``. ``jobs`` processes simulate a share of the nodes each.

    Each node is sampled once a step: its counters (bytes) cover the whole step, but episodes that start at a rate
    per sample (data-loader stalls, notebook cells, a batch's late inputs) start once a step's sample rather than
    once a second's; ``sample_every`` (1: every second) samples the nodes between steps too, as a live node runs,
    at that many times the cost. The nodes' simulation is taken to have started a whole number of days before
    ``end``, as :func:`agent.simulate.past_windows` takes it, so daily cycles meet those of a live run that starts
    then."""
    if step <= 0 or span < step:
        raise ValueError("the history needs a step above 0 and a span of at least one step")
    started = time.monotonic()
    chosen = fields(options.fields)
    headers = [(f.name, f.kind, f.help) for f in chosen] + [
        (fam.name, fam.kind, fam.help) for fams, _ in _extra(options) for fam in fams
    ]
    parts = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        jobs = max(1, min(jobs, len(nodes)))
        shares = [list(nodes[i::jobs]) for i in range(jobs)]
        work = [
            _Share(share, parts / f"{i:03d}", end, span, step, options, fmt, seed, sample_every)
            for i, share in enumerate(shares)
        ]
        if jobs == 1:
            results = [_simulate(work[0])]
        else:
            with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
                results = list(pool.map(_simulate, work))
        size = _join(path, fmt, headers, [w.directory for w in work])
    finally:
        shutil.rmtree(parts, ignore_errors=True)
    truth: dict[str, str] = {}
    for _, share_truth in results:
        truth.update(share_truth)
    labels_path(path).write_text(json.dumps(truth, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    lines = sum(n for n, _ in results)
    return HistoryStats(int(span // step), lines, size, time.monotonic() - started, len(truth))


Series = Callable[[NodeView], Iterator[tuple[int, str, str]]]


def _extra(options: ExporterOptions) -> list[tuple[Sequence[Family], Series]]:
    """The families beside dcgm-exporter's, in the order they are written."""
    if options.kubernetes:
        return [(KUBE_FAMILIES, kube_series), (NODE_FAMILIES, node_series)]
    return [(NODE_FAMILIES, node_series)]


@dataclass(frozen=True, slots=True)
class _Share:
    """One process's work: its nodes, and the folder its family files go to."""

    nodes: list[ScenarioNode]
    directory: Path
    end: float
    span: float
    step: float
    options: ExporterOptions
    fmt: HistoryFormat
    seed: int
    sample_every: float | None = None


def _simulate(share: _Share) -> tuple[int, dict[str, str]]:
    """Simulate ``share``'s nodes over the span, writing each family's lines to a file of its own in its folder
    (one file for VictoriaMetrics, where order does not matter); the lines written and the ground truth."""
    count = int(share.span // share.step)
    days = max(1, math.ceil(share.span / DAY_S))
    clock = _Clock(share.end - days * DAY_S)
    sims = [simulated_node(n, clock, share.seed + 2) for n in share.nodes]  # other draws than the live run's
    chosen = fields(share.options.fields)
    extra = _extra(share.options)
    families = len(chosen) + sum(len(f) for f, _ in extra)
    share.directory.mkdir()
    victoria = share.fmt == "victoriametrics"
    files = [(share.directory / f"{i:03d}").open("w", encoding="utf-8") for i in range(1 if victoria else families)]
    pending: list[list[str]] = [[] for _ in range(families)]
    prefixes: list[list[list[list[str]]] | None] = [None] * len(sims)
    lines = 0
    try:
        for k in range(count):
            t = share.end - (count - 1 - k) * share.step
            if share.sample_every and k:
                between = max(0, math.ceil(share.step / share.sample_every) - 1)
                for sub in range(between, 0, -1):
                    clock.now = t - sub * share.sample_every
                    for sim in sims:
                        sim.sample()
            clock.now = t
            stamp = _stamp(t, victoria)
            for n, sim in enumerate(sims):
                sim.sample()
                view = node_view(sim)
                if view.dcgm:
                    cached = prefixes[n]
                    if cached is None:
                        cached = prefixes[n] = _prefixes(view, chosen, share.options)
                    _gpu_lines(pending, view, chosen, cached, stamp)
                base = len(chosen)
                for fams, series in extra:
                    for i, labels, value in series(view):
                        pending[base + i].append(f"{fams[i].name}{{{labels}}} {value}{stamp}")
                    base += len(fams)
            # A step's lines at a time: one write per family rather than one per line.
            for i, batch in enumerate(pending):
                if batch:
                    files[0 if victoria else i].write("".join(batch))
                    lines += len(batch)
                    batch.clear()
    finally:
        for f in files:
            f.close()
    return lines, dict(ground_truth((node_view(s), s.specs) for s in sims))


def _stamp(t: float, victoria: bool) -> str:
    """The timestamp after each value: milliseconds for VictoriaMetrics, seconds in OpenMetrics."""
    if victoria:
        return f" {round(t * 1000)}\n"
    return f" {int(t)}\n" if t == int(t) else f" {t:.3f}\n"


def _prefixes(view: NodeView, chosen: Sequence[Field], options: ExporterOptions) -> list[list[list[str]]]:
    """Per GPU, per field, the text before the value of each of its series (one per holder)."""
    out = []
    for g in view.gpus:
        sets = gpu_label_sets(view, g, options)
        out.append([[] if g.mig is not None and not f.on_mig else [f"{f.name}{{{s}}} " for s in sets] for f in chosen])
    return out


def _gpu_lines(
    pending: list[list[str]], view: NodeView, chosen: Sequence[Field], prefixes: list[list[list[str]]], stamp: str
) -> None:
    for g, per_field in zip(view.gpus, prefixes, strict=True):
        for i, (f, heads) in enumerate(zip(chosen, per_field, strict=True)):
            if not heads:
                continue
            value = f.value(g)
            if value is None:
                continue
            tail = value + stamp
            batch = pending[i]
            for head in heads:
                batch.append(head + tail)


def _join(path: Path, fmt: HistoryFormat, headers: Sequence[tuple[str, str, str]], shares: Sequence[Path]) -> int:
    """The output from the shares' files, each removed once copied; its size. OpenMetrics: each family's metadata
    then its lines from every share (a series lives in one share, so its timestamps still rise), ``# EOF`` last."""
    with path.open("wb") as out:
        if fmt == "victoriametrics":
            for share in shares:
                _append(out, share / "000")
        else:
            for i, (name, kind, help_text) in enumerate(headers):
                files = [share / f"{i:03d}" for share in shares]
                if not any(f.stat().st_size for f in files):
                    continue
                # OpenMetrics names a counter's family without its _total suffix.
                family = name.removesuffix("_total") if kind == "counter" else name
                out.write(f"# HELP {family} {help_text}\n# TYPE {family} {kind}\n".encode())
                for f in files:
                    _append(out, f)
            out.write(b"# EOF\n")
    return path.stat().st_size


def _append(out: IO[bytes], part: Path) -> None:
    with part.open("rb") as src:
        shutil.copyfileobj(src, out, 1 << 20)
    part.unlink()
