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
from pathlib import Path
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
    """The field set of one line (``values``: a section's ``__dict__``) and how many values it holds."""
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


def _line(head: str, fields: tuple[str, int], tail: str) -> Line:
    text, values = fields
    return Line(f"{head} {text}{tail}", values) if values else Line("", 0)


def window_points(birth: Birth | None, w: Telemetry) -> list[Line]:
    """Points for one telemetry window, tagged with site, node and GPU model: what ``point`` writes for them,
    built without its generic sorting (tags are written in sorted order by hand)."""
    models = {g.index: g.model for g in birth.gpus} if birth else {}
    roles = {n.name: n.role for n in birth.nics} if birth else {}
    node, site = tag_value(w.node), tag_value(w.site)
    tail = f" {round(w.end * 1e6) * 1000}"  # nanoseconds, rounded to the microsecond like every line
    out = []
    for g in w.gpus:
        d = g.__dict__
        model, workload = models.get(g.index), d["workload"]
        head = f"{series.GPU.name},gpu={g.index}"
        if model:
            head += f",model={tag_value(model)}"
        head += f",node={node},site={site}"
        if workload:
            head += f",workload={tag_value(workload)}"
        out.append(_line(head, _field_text(_GPU_FIELDS, d), tail))
    for n in w.nics:
        role = roles.get(n.name, NicRole.OTHER).value
        head = f"{series.NIC.name},nic={tag_value(n.name)},node={node},role={role},site={site}"
        out.append(_line(head, _field_text(_NIC_FIELDS, n.__dict__), tail))
    for disk in w.disks:
        head = f"{series.DISK.name},disk={tag_value(disk.name)},node={node},site={site}"
        out.append(_line(head, _field_text(_DISK_FIELDS, disk.__dict__), tail))
    host = _field_text(_HOST_FIELDS, w.host.__dict__)
    if host[1]:
        out.append(_line(f"{series.HOST.name},node={node},site={site}", host, tail))
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
