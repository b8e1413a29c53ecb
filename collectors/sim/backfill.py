"""A simulated fleet's past as the exporters would have published it, timestamped, for backfilling a
Prometheus-compatible store.

Two forms: OpenMetrics text, which ``promtool tsdb create-blocks-from openmetrics`` turns into TSDB blocks (every
family's samples together, ``# EOF`` last), and the Prometheus text format with millisecond timestamps, which
VictoriaMetrics' ``/api/v1/import/prometheus`` takes in any order. Lines are written as they are made: a family's
OpenMetrics lines go to a file of their own beside the output, which is joined onto the output once the
simulation has passed, so memory holds one step of one node at a time.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

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
from collectors.sim.scenarios import ScenarioNode, simulated_node
from collectors.sim.spec import DAY_S

HistoryFormat = Literal["openmetrics", "victoriametrics"]
HISTORY_FORMATS: tuple[HistoryFormat, ...] = ("openmetrics", "victoriametrics")


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
) -> HistoryStats:
    """Write the ``span`` seconds before ``end``, one sample of every node each ``step`` seconds, to ``path``,
    and the ground truth to ``FILE.labels.json``.

    Each node is sampled once a step: its counters (bytes) cover the whole step, but episodes that start at a rate
    per sample (data-loader stalls, notebook cells, a batch's late inputs) start once a step's sample rather than
    once a second's. The nodes' simulation is taken to have started a whole number of days before ``end``, as
    :func:`agent.simulate.past_windows` takes it, so daily cycles meet those of a live run that starts then."""
    if step <= 0 or span < step:
        raise ValueError("the history needs a step above 0 and a span of at least one step")
    started = time.monotonic()
    count = int(span // step)
    days = max(1, math.ceil(span / DAY_S))
    clock = _Clock(end - days * DAY_S)
    sims = [simulated_node(n, clock, seed + 2) for n in nodes]  # other draws than the live simulation's
    chosen = fields(options.fields)
    extra: list[tuple[Sequence[Family], Callable[[NodeView], Iterator[tuple[int, str, str]]]]] = [
        (NODE_FAMILIES, node_series)
    ]
    if options.kubernetes:
        extra.insert(0, (KUBE_FAMILIES, kube_series))
    families = len(chosen) + sum(len(f) for f, _ in extra)
    writer = _Writer(path, fmt, families)
    prefixes: list[list[list[list[str]]] | None] = [None] * len(sims)
    try:
        for k in range(count):
            t = end - (count - 1 - k) * step
            clock.now = t
            stamp = writer.stamp(t)
            for n, sim in enumerate(sims):
                sim.sample()
                view = node_view(sim)
                if view.dcgm:
                    cached = prefixes[n]
                    if cached is None:
                        cached = prefixes[n] = _prefixes(view, chosen, options)
                    _gpu_lines(writer, view, chosen, cached, stamp)
                base = len(chosen)
                for fams, series in extra:
                    for i, labels, value in series(view):
                        writer.add(base + i, f"{fams[i].name}{{{labels}}} {value}{stamp}")
                    base += len(fams)
        headers = [(f.name, f.kind, f.help) for f in chosen] + [
            (fam.name, fam.kind, fam.help) for fams, _ in extra for fam in fams
        ]
        size = writer.finish(headers)
    except BaseException:
        writer.abort()
        raise
    truth = ground_truth((node_view(s), s.specs) for s in sims)
    labels_path(path).write_text(json.dumps(dict(truth), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return HistoryStats(count, writer.lines, size, time.monotonic() - started, len(truth))


def _prefixes(view: NodeView, chosen: Sequence[Field], options: ExporterOptions) -> list[list[list[str]]]:
    """Per GPU, per field, the text before the value of each of its series (one per holder)."""
    out = []
    for g in view.gpus:
        sets = gpu_label_sets(view, g, options)
        out.append([[] if g.mig is not None and not f.on_mig else [f"{f.name}{{{s}}} " for s in sets] for f in chosen])
    return out


def _gpu_lines(
    writer: _Writer, view: NodeView, chosen: Sequence[Field], prefixes: list[list[list[str]]], stamp: str
) -> None:
    for g, per_field in zip(view.gpus, prefixes, strict=True):
        for i, (f, heads) in enumerate(zip(chosen, per_field, strict=True)):
            if not heads:
                continue
            value = f.value(g)
            if value is None:
                continue
            tail = value + stamp
            for head in heads:
                writer.add(i, head + tail)


class _Writer:
    """OpenMetrics: a file per family, joined at the end; VictoriaMetrics: one stream in the order made."""

    def __init__(self, path: Path, fmt: HistoryFormat, families: int) -> None:
        self.path = path
        self.fmt = fmt
        self.lines = 0
        self._parts: Path | None = None
        self._files: list[IO[str]] = []
        if fmt == "openmetrics":
            self._parts = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
            self._files = [
                (self._parts / f"{i:03d}").open("w", encoding="utf-8", buffering=1 << 20) for i in range(families)
            ]
        else:
            out = path.open("w", encoding="utf-8", buffering=1 << 20)
            self._files = [out] * families

    def stamp(self, t: float) -> str:
        """The timestamp written after each value: seconds in OpenMetrics, milliseconds for VictoriaMetrics."""
        if self.fmt == "victoriametrics":
            return f" {round(t * 1000)}\n"
        return f" {int(t)}\n" if t == int(t) else f" {t:.3f}\n"

    def add(self, family: int, line: str) -> None:
        self._files[family].write(line)
        self.lines += 1

    def finish(self, headers: Sequence[tuple[str, str, str]]) -> int:
        """Close the output (in OpenMetrics: each family's metadata then its lines, ``# EOF`` last); its size."""
        if self.fmt == "victoriametrics":
            self._files[0].close()
            return self.path.stat().st_size
        assert self._parts is not None
        with self.path.open("w", encoding="utf-8") as out:
            for i, (name, kind, help_text) in enumerate(headers):
                part = self._files[i]
                part.close()
                if (self._parts / f"{i:03d}").stat().st_size == 0:
                    continue
                # OpenMetrics names a counter's family without its _total suffix.
                family = name.removesuffix("_total") if kind == "counter" else name
                out.write(f"# HELP {family} {help_text}\n# TYPE {family} {kind}\n")
                out.flush()
                with (self._parts / f"{i:03d}").open("r", encoding="utf-8") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
                (self._parts / f"{i:03d}").unlink()
            out.write("# EOF\n")
        shutil.rmtree(self._parts, ignore_errors=True)
        return self.path.stat().st_size

    def abort(self) -> None:
        for f in set(self._files):
            f.close()
        if self._parts is not None:
            shutil.rmtree(self._parts, ignore_errors=True)
