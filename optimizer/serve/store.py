"""Writes telemetry windows and plans to InfluxDB (or anything speaking its v2 write API, such as
VictoriaMetrics) with influxdb-client, in batches, retrying with jittered exponential backoff.

Points wait in a bounded buffer until the server has accepted them: an outage loses nothing until the buffer
is full; past that the oldest points are dropped and counted. With no URL configured there is no store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import chain, compress, repeat
from operator import attrgetter, is_, is_not, itemgetter
from pathlib import Path
from typing import NamedTuple

from influxdb_client.client.influxdb_client import InfluxDBClient
from influxdb_client.client.write_api import SYNCHRONOUS
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from agent.backoff import Backoff
from agent.config import secret_or_file
from agent.protocol import Birth, NicRole, Plan
from optimizer.ingest.window import MAX, MEAN, P95, STD, Window
from optimizer.serve import series
from optimizer.serve.lineproto import Line, encode_line, tag_value
from optimizer.serve.series import Measurement

log = logging.getLogger(__name__)

Writer = Callable[[list[str]], None]

# 4xx answers that speak of the server or the credentials rather than the batch: the batch is retried.
RETRIED_CLIENT_ERRORS = frozenset({401, 403, 404, 408, 429})


class StoreSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str | None = Field(default=None, description="e.g. http://influxdb:8086; none: no store")
    token: SecretStr | None = None
    token_file: Path | None = Field(default=None, description="file holding the token (a credential)")
    org: str = "fleetfit"
    bucket: str = "fleetfit"
    batch_size: int = Field(default=5000, ge=1)
    flush_interval: float = Field(default=1.0, gt=0)
    max_buffer_points: int = Field(default=1_000_000, ge=1)
    timeout: float = Field(default=10.0, gt=0)
    retry_max_delay: float = Field(default=30.0, gt=0)

    @model_validator(mode="after")
    def _token_file(self) -> StoreSettings:
        self.token = secret_or_file(self.token, self.token_file, "token")
        return self


def point(m: Measurement, tags: Mapping[str, str | None], fields: Mapping[str, float | None], ts: float) -> Line:
    """A line of measurement ``m``; names outside ``m`` are a programming error, caught here."""
    if not (tags.keys() <= m.tag_set and fields.keys() <= m.field_set):
        unknown = (set(tags) - m.tag_set) | (set(fields) - m.field_set)
        raise KeyError(f"{m.name} has no {', '.join(sorted(unknown))}")
    line = encode_line(m.name, tags, fields, ts)
    return line if line is not None else Line("", 0)


class _Layout(NamedTuple):
    """How the lines of a window's sections of one kind are written, for one set of stats arrays present."""

    pick: Callable[[tuple[float, ...]], tuple[float, ...]]  # the fields' values, section by section, in field order
    template: str  # "name=%s,..." per section, in the order line protocol sorts fields; sections on lines of their own
    counts: tuple[int, ...]  # values on each section's line


class _Fields:
    """How one measurement's fields are read from a window's sections of one kind (its GPUs, its NICs, its disks,
    its host) and written.

    A field is one figure of a stats array (``util_p95``: util's p95) or a plain number (``errors``, never
    absent). All sections' arrays and numbers are read by C calls and flattened into one tuple, from which the
    fields are picked by position and written by one ``%``; positions and template are worked out once for
    each set of arrays present. Numbers are written as influxdb-client writes them (``repr``, a whole float
    without ``.0``), looked up rather than formatted: values arrive rounded to 4 significant digits and repeat
    window after window. Every value of a window is finite (``optimizer.ingest.window``). This runs for the ~15
    lines of every window taken in (``bench/store_lines.py``)."""

    def __init__(self, fields: tuple[str, ...], derived: dict[str, tuple[str, int | None]]) -> None:
        self.plan = sorted((name, *derived.get(name, (name, MEAN))) for name in fields)
        self.arrays = list(dict.fromkeys(attribute for _, attribute, index in self.plan if index is not None))
        self.numbers = list(dict.fromkeys(attribute for _, attribute, index in self.plan if index is None))
        if len(self.arrays) < 2:
            raise ValueError("a section's arrays are read as a tuple: two at least")
        self.read_arrays = attrgetter(*self.arrays)
        self.layouts: dict[tuple[bool, ...], _Layout] = {}

    def _numbers(self, sections: Sequence[object]) -> Iterable[float]:
        if len(self.numbers) >= 2:
            return chain.from_iterable(map(attrgetter(*self.numbers), sections))
        if not self.numbers:
            return ()
        one: Callable[[object], float] = attrgetter(self.numbers[0])
        return map(one, sections)

    def lines(self, sections: Sequence[object], heads: Iterable[str], tail: str) -> list[Line]:
        """One line per section (an empty one, of no values, for a section with none), with its head."""
        arrays = tuple(chain.from_iterable(map(self.read_arrays, sections)))
        present = tuple(map(is_not, arrays, repeat(None)))
        layout = self.layouts.get(present)
        if layout is None:
            if len(self.layouts) >= LAYOUTS_CACHED:
                self.layouts.clear()
            layout = self.layouts[present] = self._layout(present, len(sections))
        values = layout.pick((*chain.from_iterable(filter(None, arrays)), *self._numbers(sections)))
        texts = tuple(map(_NUMBERS.get, values))
        if None in texts:  # numbers not written before: those formatted, the rest still looked up
            for value in compress(values, map(is_, texts, repeat(None))):
                _number(value)
            texts = tuple(map(_NUMBERS.get, values))
            if None in texts:  # the cache filled up and was cleared on the way
                texts = tuple(map(_number, values))
        fields = (layout.template % texts).split("\n")
        return [
            Line(f"{head} {text}{tail}", count) if count else _NO_LINE
            for head, text, count in zip(heads, fields, layout.counts, strict=True)
        ]

    def _layout(self, present: tuple[bool, ...], sections: int) -> _Layout:
        width = len(self.arrays)
        at: dict[tuple[int, str, int | None], int] = {}
        for section in range(sections):
            for attribute in compress(self.arrays, present[section * width : (section + 1) * width]):
                for index in (MEAN, P95, MAX, STD):
                    at[(section, attribute, index)] = len(at)
        for section in range(sections):
            for attribute in self.numbers:
                at[(section, attribute, None)] = len(at)
        positions: list[int] = []
        templates, counts = [], []
        for section in range(sections):
            written = [(name, at[key]) for name, *where in self.plan if (key := (section, *where)) in at]
            positions += (position for _, position in written)
            templates.append(",".join(f"{name}=%s" for name, _ in written))
            counts.append(len(written))
        pick: Callable[[tuple[float, ...]], tuple[float, ...]]
        if len(positions) >= 2:
            pick = itemgetter(*positions)
        else:  # one value (a slice keeps it a tuple), or none
            first = positions[0] if positions else 0
            pick = itemgetter(slice(first, first + len(positions)))
        return _Layout(pick, "\n".join(templates), tuple(counts))


_NO_LINE = Line("", 0)
_OTHER = NicRole.OTHER.value  # a NIC the birth does not list
# Sets of arrays present, per measurement: an honest fleet has a few (GPU counts, GPM or not, NVLink or not). Cleared
# once full, so that a node varying its absent figures window after window holds at most this many (a layout for
# 64 GPUs is ~20 KB of template).
LAYOUTS_CACHED = 256
# The text of numbers already written. Bounded: cleared once full.
_NUMBERS: dict[float, str] = {}
NUMBERS_CACHED = 65_536


def _number(value: float) -> str:
    """``value`` (finite) as line protocol writes a float: a whole one without ``.0``."""
    text = _NUMBERS.get(value)
    if text is None:
        text = repr(float(value))
        text = text[:-2] if text[-2:] == ".0" else text
        if len(_NUMBERS) >= NUMBERS_CACHED:
            _NUMBERS.clear()
        _NUMBERS[value] = text
    return text


_GPU_FIELDS = _Fields(
    series.GPU.fields, {"util_p95": ("util", P95), "util_max": ("util", MAX), "xid_events": ("xid_events", None)}
)
_NIC_FIELDS = _Fields(
    series.NIC.fields,
    {
        "rx_bps_max": ("rx_bps", MAX),
        "tx_bps_max": ("tx_bps", MAX),
        "errors": ("errors", None),
        "drops": ("drops", None),
    },
)
_DISK_FIELDS = _Fields(series.DISK.fields, {"write_bps_max": ("write_bps", MAX)})
_HOST_FIELDS = _Fields(series.HOST.fields, {})


class _Heads(NamedTuple):
    """The measurement and tags of a node's lines, by section: the same window after window."""

    birth: Birth | None  # what they were written from
    made_of: tuple[object, ...]  # and from: the GPUs' indices and workloads, the NICs' and disks' names
    gpus: list[str]
    nics: list[str]
    disks: list[str]
    host: tuple[str]


# Each node's latest heads: one entry a node, however often its workloads change (a node that renames them every
# window only misses every time). Cleared past this many nodes.
_HEADS: dict[tuple[str, str], _Heads] = {}
HEADS_CACHED = 65_536
_gpu_tags, _name = attrgetter("index", "workload"), attrgetter("name")


def _heads(birth: Birth | None, w: Window) -> _Heads:
    """Tags sorted by hand (line protocol sorts them), escaped once each, written again when what they are made
    of changes."""
    gpu_tags = tuple(map(_gpu_tags, w.gpus))
    made_of = (gpu_tags, tuple(map(_name, w.nics)), tuple(map(_name, w.disks)))
    heads = _HEADS.get((w.site, w.node))
    if heads is not None and heads.birth is birth and heads.made_of == made_of:
        return heads
    models = {g.index: tag_value(g.model) for g in birth.gpus if g.model} if birth else {}
    roles = {n.name: n.role.value for n in birth.nics} if birth else {}
    node, site = tag_value(w.node), tag_value(w.site)
    gpus = []
    for index, workload in gpu_tags:
        head = f"{series.GPU.name},gpu={index}"
        if model := models.get(index):
            head += f",model={model}"
        head += f",node={node},site={site}"
        if workload:
            head += f",workload={tag_value(workload)}"
        gpus.append(head)
    heads = _Heads(
        birth,
        made_of,
        gpus,
        [
            f"{series.NIC.name},nic={tag_value(n.name)},node={node},role={roles.get(n.name, _OTHER)},site={site}"
            for n in w.nics
        ],
        [f"{series.DISK.name},disk={tag_value(d.name)},node={node},site={site}" for d in w.disks],
        (f"{series.HOST.name},node={node},site={site}",),
    )
    if len(_HEADS) >= HEADS_CACHED:
        _HEADS.clear()
    _HEADS[(w.site, w.node)] = heads
    return heads


def window_points(birth: Birth | None, w: Window) -> list[Line]:
    """Points for one telemetry window, tagged with site, node and GPU model: what ``point`` writes for them,
    built without its generic sorting."""
    heads = _heads(birth, w)
    tail = f" {round(w.end * 1e6) * 1000}"  # nanoseconds, rounded to the microsecond like every line
    host = _HOST_FIELDS.lines((w.host,), heads.host, tail)
    return [
        *_GPU_FIELDS.lines(w.gpus, heads.gpus, tail),
        *_NIC_FIELDS.lines(w.nics, heads.nics, tail),
        *_DISK_FIELDS.lines(w.disks, heads.disks, tail),
        *(line for line in host if line.values),
    ]


def plan_points(plan: Plan) -> list[Line]:
    """Points for a plan: each workload's class, each finding and recommendation, and the plan's summary."""
    t, site = plan.generated_at, plan.site
    out = [
        point(
            series.WORKLOAD,
            {"site": site, "workload": v.id, "name": v.name, "class": v.workload_class.value, "hardware": v.hardware},
            {"confidence": v.confidence, "gpus": v.gpus, "mean_util": v.mean_util},
            t,
        )
        for v in plan.workloads
    ]
    out += [
        point(
            series.FINDING,
            {"site": site, "workload": f.workload, "kind": f.kind.value, "hardware": f.hardware},
            {"wasted_usd_per_hour": f.wasted_usd_per_hour, "confidence": f.confidence},
            t,
        )
        for f in plan.findings
    ]
    out += [
        point(
            series.RECOMMENDATION,
            {
                "site": site,
                "id": r.id,
                "workload": r.workload,
                "class": r.workload_class.value,
                "from_node": r.from_node,
                "to_node": r.to_node,
                "from_hardware": r.from_hardware,
                "to_hardware": r.to_hardware,
                "kind": r.kind or "move",
            },
            {
                "monthly_savings_usd": r.monthly_savings_usd,
                "confidence": r.confidence,
                "gpus": r.gpus,
                "wave": r.wave,
                "gpus_after": r.gpus_after,
            },
            t,
        )
        for r in plan.recommendations
    ]
    s = plan.solver
    out.append(
        point(
            series.PLAN,
            {"site": site, "status": s.status},
            {
                "objective_usd": s.objective,
                "best_bound_usd": s.best_bound,
                "gap": s.gap,
                "solve_seconds": s.solve_seconds,
                "monthly_savings_usd": plan.monthly_savings_usd,
                "recommendations": len(plan.recommendations),
                "workloads": len(plan.workloads),
                "wasted_usd_per_hour": sum(f.wasted_usd_per_hour for f in plan.findings),
                "bound_savings_usd": s.bound_savings_usd,
            },
            t,
        )
    )
    return out


class Store:
    """The bounded buffer and the writer task; ``writer`` is injectable for tests."""

    def __init__(self, settings: StoreSettings, writer: Writer | None = None) -> None:
        self.settings = settings
        self._buffer: deque[Line] = deque()
        self._ready = asyncio.Event()
        self._client: InfluxDBClient | None = None
        self._writer = writer or self._influx_writer()
        self._backoff = Backoff(base=0.5, cap=settings.retry_max_delay)
        self.written = 0
        self.values_written = 0  # field values: what a Prometheus-style store counts as samples
        self.dropped = 0
        self.failures = 0
        self.rejected = 0  # points in batches the server refused as bad (HTTP 4xx), dropped
        self.healthy = True

    def _influx_writer(self) -> Writer:
        s = self.settings
        self._client = InfluxDBClient(
            url=s.url or "",
            token=s.token.get_secret_value() if s.token else "",
            org=s.org,
            timeout=int(s.timeout * 1000),
            retries=0,
        )
        api = self._client.write_api(write_options=SYNCHRONOUS)

        def write(lines: list[str]) -> None:
            api.write(bucket=s.bucket, org=s.org, record=lines)  # nanosecond timestamps, the default

        return write

    def __len__(self) -> int:
        return len(self._buffer)

    def add(self, points: Iterable[Line]) -> None:
        for p in points:
            if not p.values:
                continue
            if len(self._buffer) >= self.settings.max_buffer_points:
                self._buffer.popleft()
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 10_000 == 0:
                    log.warning("store buffer full: dropped the oldest point (%d so far)", self.dropped)
            self._buffer.append(p)
        if len(self._buffer) >= self.settings.batch_size:
            self._ready.set()

    async def run(self) -> None:
        """Write batches until cancelled; a failed batch stays at the front and is retried with backoff."""
        while True:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that arrives as the
            # event is set, and shutdown would then wait on this loop forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.flush_interval):
                    await self._ready.wait()
            self._ready.clear()
            while self._buffer:
                if not await self._write_batch():
                    await asyncio.sleep(self._backoff.next_delay())

    async def _write_batch(self) -> bool:
        batch = [self._buffer[i].text for i in range(min(self.settings.batch_size, len(self._buffer)))]
        try:
            await asyncio.to_thread(self._writer, batch)
        except Exception as exc:
            status = getattr(exc, "status", None)
            if isinstance(status, int) and 400 <= status < 500 and status not in RETRIED_CLIENT_ERRORS:
                self._reject(batch, status, exc)
                return True
            self.failures += 1
            if self.healthy:
                log.warning("store write failed (%s); %d point(s) buffered, retrying", _brief(exc), len(self._buffer))
            self.healthy = False
            return False
        for _ in batch:
            self.values_written += self._buffer.popleft().values
        self.written += len(batch)
        if not self.healthy:
            log.info("store writes resumed; %d point(s) still buffered", len(self._buffer))
        self.healthy = True
        self._backoff.reset()
        return True

    def _reject(self, batch: list[str], status: int, exc: Exception) -> None:
        """The server refuses the batch itself: the same batch would be refused forever and wedge the store."""
        for _ in batch:
            self._buffer.popleft()
        first = self.rejected == 0
        self.rejected += len(batch)
        if first or self.rejected % 10_000 < len(batch):
            log.warning(
                "store refused %d point(s) with HTTP %d (%s); dropped them (%d so far)",
                len(batch), status, _brief(exc), self.rejected,
            )  # fmt: skip

    async def flush(self, limit: float) -> None:
        """Try to write what is buffered within ``limit`` seconds (on shutdown)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while self._buffer and loop.time() < deadline:
            if not await self._write_batch():
                await asyncio.sleep(min(0.5, max(0.0, deadline - loop.time())))
        if self._buffer:
            log.warning("shutting down with %d point(s) not written", len(self._buffer))

    def close(self) -> None:
        if self._client is not None:
            self._client.close()  # type: ignore[no-untyped-call]


def _brief(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]
