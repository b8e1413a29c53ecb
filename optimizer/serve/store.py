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
from collections.abc import Callable, Iterable, Mapping
from math import isfinite
from operator import getitem, is_, itemgetter
from pathlib import Path
from types import MethodType
from typing import Any

from influxdb_client.client.influxdb_client import InfluxDBClient
from influxdb_client.client.write_api import SYNCHRONOUS
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from agent.backoff import Backoff
from agent.config import secret_or_file
from agent.protocol import Birth, NicRole, Plan, Stats, Telemetry
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


def _mean(s: Stats | None) -> float | None:
    return s.mean if s is not None else None


# A window's fields, in the order line protocol sorts them: (field, the window's attribute, index in its Stats),
# index None for a plain number. Built once, so that a window's lines need no sorting and no name lookups: they
# are written for every window taken in (bench/store_lines.py).
_FieldPlan = tuple[tuple[str, str, int | None], ...]


def _plan(fields: tuple[str, ...], derived: dict[str, tuple[str, int | None]]) -> _FieldPlan:
    return tuple(sorted((f, *derived.get(f, (f, 0))) for f in fields))


_GPU_FIELDS = _plan(
    series.GPU.fields, {"util_p95": ("util", 1), "util_max": ("util", 2), "xid_events": ("xid_events", None)}
)
_NIC_FIELDS = _plan(
    series.NIC.fields,
    {"rx_bps_max": ("rx_bps", 2), "tx_bps_max": ("tx_bps", 2), "errors": ("errors", None), "drops": ("drops", None)},
)
_DISK_FIELDS = _plan(series.DISK.fields, {"write_bps_max": ("write_bps", 2)})
_HOST_FIELDS = _plan(series.HOST.fields, {})


def _field_text(plan: _FieldPlan, values: dict[str, Any]) -> tuple[str, int]:
    """The field set of one line (``values``: a section's ``__dict__``) and how many values it holds, a value at
    a time: what ``_Fields`` does when a number is new or not finite."""
    parts = []
    for name, attribute, index in plan:
        value = values[attribute]
        if value is None:
            continue
        number: float = value[index] if index is not None else value
        text = _NUMBERS.get(number)
        if text is None:
            text = _number(number)
            if text is None:
                continue
        parts.append(f"{name}={text}")
    return ",".join(parts), len(parts)


# The text of numbers already written: values arrive rounded to 4 significant digits, so they repeat window
# after window and a lookup is cheaper than float's repr. Bounded: cleared once full.
_NUMBERS: dict[float, str] = {}
NUMBERS_CACHED = 65_536


def _number(value: float) -> str | None:
    """``value`` as line protocol writes a float (a whole one without ``.0``); None when not finite."""
    number = float(value)
    if not isfinite(number):
        return None
    text = repr(number)
    text = text[:-2] if text[-2:] == ".0" else text
    if len(_NUMBERS) >= NUMBERS_CACHED:
        _NUMBERS.clear()
    _NUMBERS[value] = text
    return text


def _getter(keys: list[str]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """The values of ``keys`` as a tuple, by one C call (itemgetter of one key gives the value itself)."""
    if len(keys) == 1:
        one = itemgetter(keys[0])
        return lambda values: (one(values),)
    return itemgetter(*keys)


class _Fields:
    """One measurement's field set, written by C calls alone where every number's text is cached: the section's
    statistics read at once, which are absent (their "shape") looked up for a format string and the indices into
    each, the numbers' texts looked up together. A node's sections keep their shape window after window.

    ``plain`` numbers (counts, never absent) come first (``before``) or last in the sorted field order."""

    __slots__ = ("_absent", "_before", "_plain", "_plan", "_read", "_shapes")

    def __init__(self, plan: _FieldPlan, before: bool = False) -> None:
        plain = [f for f in plan if f[2] is None]
        edge = plan[: len(plain)] if before else plan[len(plan) - len(plain) :]
        if edge != tuple(plain):
            raise ValueError("plain numbers must come first or last in the field order")
        stats = [a for _, a, index in plan if index is not None]
        self._plan = plan
        self._read = _getter(stats)
        self._absent = (None,) * len(stats)
        self._plain = _getter([a for _, a, _ in plain]) if plain else None
        self._before = before
        self._shapes: dict[tuple[bool, ...], tuple[str, tuple[int, ...], int]] = {}

    def _shape(self, absent: tuple[bool, ...]) -> tuple[str, tuple[int, ...], int]:
        stats = [f for f in self._plan if f[2] is not None]
        plain = [f[0] for f in self._plan if f[2] is None]
        present = [(name, index) for (name, _, index), gone in zip(stats, absent, strict=True) if not gone]
        names = [*plain, *(n for n, _ in present)] if self._before else [*(n for n, _ in present), *plain]
        shape = ",".join(f"{name}=%s" for name in names), tuple(i for _, i in present if i is not None), len(names)
        self._shapes[absent] = shape
        return shape

    def text(self, values: dict[str, Any]) -> tuple[str, int]:
        """The field set of one line (``values``: a section's ``__dict__``) and how many values it holds."""
        stats = self._read(values)
        absent = tuple(map(is_, stats, self._absent))
        shape = self._shapes.get(absent) or self._shape(absent)
        numbers = tuple(map(getitem, filter(None, stats), shape[1]))
        if self._plain is not None:
            plain = self._plain(values)
            numbers = (*plain, *numbers) if self._before else (*numbers, *plain)
        texts = tuple(map(_NUMBERS.get, numbers))
        if None in texts:  # a number not written before, or not finite
            return _field_text(self._plan, values)
        return shape[0] % texts, shape[2]


_GPU_TEXT = _Fields(_GPU_FIELDS)
_NIC_TEXT = _Fields(_NIC_FIELDS, before=True)
_DISK_TEXT = _Fields(_DISK_FIELDS)
_HOST_TEXT = _Fields(_HOST_FIELDS)
_new_line = MethodType(tuple.__new__, Line)  # a Line without NamedTuple's Python-level __new__
_NO_LINE = Line("", 0)

# Each line's measurement and tags, by what they are made of: the same every window of a node, so written once.
_HEADS: dict[tuple[str | int | None, ...], str] = {}
HEADS_CACHED = 65_536
# What lines need of a birth (GPU models, NIC roles), worked out once per birth
_BIRTH_TAGS: dict[int, tuple[Birth, dict[int, str], dict[str, str]]] = {}


def _birth_tags(birth: Birth | None) -> tuple[dict[int, str], dict[str, str]]:
    if birth is None:
        return {}, {}
    cached = _BIRTH_TAGS.get(id(birth))
    if cached is not None and cached[0] is birth:
        return cached[1], cached[2]
    if len(_BIRTH_TAGS) >= 65_536:  # births replaced over a long run: start afresh rather than grow
        _BIRTH_TAGS.clear()
    models = {g.index: g.model for g in birth.gpus}
    roles = {n.name: n.role.value for n in birth.nics}
    _BIRTH_TAGS[id(birth)] = (birth, models, roles)
    return models, roles


def _head(key: tuple[str | int | None, ...]) -> str:
    """The measurement and tags of a line (tags in sorted order) for a ``_HEADS`` key."""
    kind, site, node = key[0], tag_value(str(key[1])), tag_value(str(key[2]))
    if kind == series.GPU.name:
        index, model, workload = key[3:]
        head = f"{kind},gpu={index}" + (f",model={tag_value(str(model))}" if model else "")
        head += f",node={node},site={site}" + (f",workload={tag_value(str(workload))}" if workload else "")
    elif kind == series.NIC.name:
        head = f"{kind},nic={tag_value(str(key[3]))},node={node},role={key[4]},site={site}"
    elif kind == series.DISK.name:
        head = f"{kind},disk={tag_value(str(key[3]))},node={node},site={site}"
    else:
        head = f"{kind},node={node},site={site}"
    if len(_HEADS) >= HEADS_CACHED:
        _HEADS.clear()
    _HEADS[key] = head
    return head


def window_points(birth: Birth | None, w: Telemetry) -> list[Line]:
    """Points for one telemetry window, tagged with site, node and GPU model: what ``point`` writes for them,
    built without its generic sorting (tags and fields are written in sorted order by plan)."""
    models, roles = _birth_tags(birth)
    d = w.__dict__
    node, site = d["node"], d["site"]
    tail = f" {round(d['end'] * 1e6) * 1000}"  # nanoseconds, rounded to the microsecond like every line
    heads, out = _HEADS, []
    gpu, nic, disk = series.GPU.name, series.NIC.name, series.DISK.name
    for g in d["gpus"]:
        fields = g.__dict__
        index = fields["index"]
        key: tuple[str | int | None, ...] = (gpu, site, node, index, models.get(index), fields["workload"])
        text, n = _GPU_TEXT.text(fields)  # never empty: a GPU line always holds xid_events
        out.append(_new_line((f"{heads.get(key) or _head(key)} {text}{tail}", n)))
    for c in d["nics"]:
        fields = c.__dict__
        name = fields["name"]
        key = (nic, site, node, name, roles.get(name, NicRole.OTHER.value))
        text, n = _NIC_TEXT.text(fields)  # never empty: errors and drops
        out.append(_new_line((f"{heads.get(key) or _head(key)} {text}{tail}", n)))
    for k in d["disks"]:
        fields = k.__dict__
        text, n = _DISK_TEXT.text(fields)
        if n:
            key = (disk, site, node, fields["name"])
            out.append(_new_line((f"{heads.get(key) or _head(key)} {text}{tail}", n)))
        else:
            out.append(_NO_LINE)
    text, n = _HOST_TEXT.text(d["host"].__dict__)
    if n:
        key = (series.HOST.name, site, node)
        out.append(_new_line((f"{heads.get(key) or _head(key)} {text}{tail}", n)))
    return out


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
