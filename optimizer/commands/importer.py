"""``fleetfit import prometheus URL``: a fleet snapshot (docs/snapshot.md) with every workload classified, read from
the dcgm-exporter series a Prometheus-compatible server already holds (docs/prometheus.md)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from optimizer.commands import cliargs

if TYPE_CHECKING:
    from optimizer.decide.catalog import Catalog
    from optimizer.decide.snapshot import Snapshot
    from optimizer.ingest.promapi import Endpoint
    from optimizer.ingest.promsource import ReadReport, ReadSettings

log = logging.getLogger("fleetfit")

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw]?)$")
MAX_SINCE = 31 * 86400  # a month: past it, ask for less (the classifier needs hours, the daily peak a day)


def duration(text: str) -> float:
    """``30s``, ``15m``, ``24h``, ``7d``, ``2w`` or plain seconds, positive and at most a month."""
    m = _DURATION.match(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a duration such as 30m, 24h or 7d")
    seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if not 0 < seconds <= MAX_SINCE:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration from 1 s to 31 d")
    return seconds


def moment(text: str) -> float:
    """A point in time: Unix seconds, an ISO 8601 time (UTC unless it says otherwise), or a duration ago."""
    stripped = text.strip()
    try:
        return time.time() - duration(stripped)
    except argparse.ArgumentTypeError:
        pass
    try:
        value = float(stripped)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(stripped)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected Unix seconds, an ISO time (2026-12-01T12:00Z) or a duration ago (2h)"
            ) from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        value = parsed.timestamp()
    if not (math.isfinite(value) and 0 < value < 9e9):
        raise argparse.ArgumentTypeError(f"{text!r}: not a plausible time")
    return value


def add_parser(sub: argparse._SubParsersAction[cliargs.Parser]) -> None:
    """``fleetfit import prometheus``."""
    p = sub.add_parser(
        "import",
        help="a fleet snapshot from what a team already collects (dcgm-exporter series in Prometheus)",
        description="Read what a fleet already collects, classify every workload, and write a fleet snapshot "
        "(docs/snapshot.md) that `fleetfit plan` turns into moves.",
    )
    kinds = p.add_subparsers(dest="import_kind", metavar="{prometheus}", required=True)
    q = kinds.add_parser(
        "prometheus",
        help="dcgm-exporter series through the Prometheus HTTP API (Prometheus, VictoriaMetrics, Thanos, Mimir)",
        description="Read dcgm-exporter's GPU series (with kube-state-metrics and cAdvisor where scraped) through "
        "the Prometheus HTTP API, classify every workload (a pod or a Slurm job) and write a fleet snapshot to stdout. "
        "Progress goes to stderr. docs/prometheus.md says which series and labels are read.",
    )
    q.add_argument("url", type=cliargs.http_url, help="the server's base URL, e.g. http://prometheus:9090")
    q.add_argument("--since", type=duration, default=24 * 3600.0, help="how far back to read (default 24h)")
    q.add_argument("--until", type=moment, help="the end of the read: Unix seconds, ISO time or 2h (ago); default now")
    q.add_argument("--format", choices=["json", "table"], default="json", help="snapshot JSON (default) or a table")
    q.add_argument("--site", default="default", help="the snapshot's site name (default: default)")
    q.add_argument(
        "--node-label",
        help="the label naming each node (default: Hostname, else hostname; on Kubernetes, where Hostname is the "
        "exporter pod's name, the label your scrape config copies the node name into: node, kubernetes_node)",
    )
    q.add_argument(
        "--owner-label",
        help="a pod label naming the team that owns it (team, app.kubernetes.io/part-of), read from "
        "kube-state-metrics' kube_pod_labels; default: the pod's namespace",
    )
    q.add_argument("--selector", help='extra label matchers for every series, e.g. cluster="eu-1"')
    q.add_argument("--step", type=duration, help="seconds between points read (default 30 s, longer past a day)")
    q.add_argument(
        "--window",
        type=duration,
        help="seconds of points in one telemetry window (default 5m, a 96th of --since past 8 h: 15m for a day)",
    )
    q.add_argument("--bearer-token-file", type=Path, help="a file holding the bearer token the server wants")
    q.add_argument("--basic-auth-user", help="basic auth user (its password from --basic-auth-password-file)")
    q.add_argument("--basic-auth-password-file", type=Path, help="a file holding the basic auth password")
    q.add_argument("--ca-file", type=Path, help="the CA certificate (PEM) the server's TLS certificate chains to")
    q.add_argument("--timeout", type=cliargs.positive_float, default=60.0, help="seconds per query (default 60)")
    q.add_argument("--header", action="append", default=[], metavar="NAME=VALUE", help="an extra HTTP header "
                   "(X-Scope-OrgID=team-a for Mimir and Cortex tenants); repeatable")  # fmt: skip
    q.add_argument("--catalog", type=Path, help="a hardware catalog (default: the built-in one)")
    q.add_argument("--pin", action="append", default=[], metavar="GLOB", help="workload ids never moved; repeatable")
    q.set_defaults(func=run)


def _headers(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not re.match(r"^[A-Za-z0-9-]+$", name) or any(c in value for c in "\r\n"):
            raise ValueError(f"--header {pair!r}: expected NAME=VALUE")
        out[name] = value
    return out


class _Progress:
    """One line on stderr at most every two seconds, while a long import runs (and only on a terminal or when
    asked for by the log level)."""

    def __init__(self) -> None:
        self.last = 0.0
        self.started = time.monotonic()
        self.show = sys.stderr.isatty() or log.isEnabledFor(logging.INFO)

    def __call__(self, report: ReadReport) -> None:
        now = time.monotonic()
        if not self.show or now - self.last < 2.0:
            return
        self.last = now
        print(
            f"fleetfit: {report.nodes_read} of {report.nodes} nodes, {report.windows} windows, "
            f"{report.queries} queries in {now - self.started:.0f} s",
            file=sys.stderr,
        )


def run(args: argparse.Namespace) -> int:
    from optimizer.decide.catalog import CatalogError, load_catalog
    from optimizer.ingest.promapi import Endpoint, PrometheusError
    from optimizer.ingest.promsource import ReadSettings

    try:
        catalog = load_catalog(args.catalog)
        headers = _headers(args.header)
    except CatalogError as exc:  # the catalog file's contents
        return cliargs.fail(str(exc))
    except ValueError as exc:  # --header
        return cliargs.fail(str(exc), cliargs.USAGE)
    if args.basic_auth_user and args.bearer_token_file:
        return cliargs.fail("give --bearer-token-file or --basic-auth-user, not both", cliargs.USAGE)
    endpoint = Endpoint(
        url=args.url,
        bearer_token_file=args.bearer_token_file,
        basic_user=args.basic_auth_user,
        basic_password_file=args.basic_auth_password_file,
        ca_file=args.ca_file,
        timeout=args.timeout,
        headers=headers,
    )
    from optimizer.ingest.promsource import auto_step, auto_window

    step = auto_step(args.since, args.step)
    window = args.window if args.window is not None else auto_window(args.since, step)
    if window < 2 * step:
        return cliargs.fail(f"--window {window:g} s holds fewer than two points at a step of {step:g} s", cliargs.USAGE)
    settings = ReadSettings(
        site=args.site,
        node_label=args.node_label,
        owner_label=args.owner_label,
        step=step,
        window=window,
        selector=args.selector or "",
        store_fields=False,  # a snapshot keeps what plans read
    )
    try:
        snapshot, report = asyncio.run(read_snapshot(endpoint, settings, args.since, args.until, catalog, args.pin))
    except PrometheusError as exc:
        return cliargs.fail(str(exc))
    except ValueError as exc:  # a site name or selector the protocol refuses
        return cliargs.fail(str(exc), cliargs.USAGE)
    print(_summary(report, snapshot), file=sys.stderr)
    if args.format == "json":
        print(json.dumps(snapshot.model_dump(mode="json", by_alias=True, exclude_none=True), indent=1))
    else:
        print(render_table(snapshot))
    return 0 if snapshot.nodes else 1


async def read_snapshot(
    endpoint: Endpoint,
    settings: ReadSettings,
    since: float,
    until: float | None,
    catalog: Catalog,
    pinned: list[str],
) -> tuple[Snapshot, ReadReport]:
    """Read the fleet from the server and build its snapshot."""
    from optimizer.decide.snapshot import from_fleet
    from optimizer.ingest.fleet import Fleet
    from optimizer.ingest.promapi import PromClient
    from optimizer.ingest.promsource import PrometheusSource, window_bounds

    start, end = window_bounds(since, until, settings.window)
    windows = max(1, round((end - start) / settings.window))
    fleet = Fleet("prometheus", horizon_windows=windows)

    def tdp(model: str) -> float | None:
        hw = catalog.lookup(model)
        return None if hw is None else hw.datasheet.tdp_w

    async with PromClient(endpoint) as client:
        source = PrometheusSource(client, fleet, settings, power_limit=tdp, progress=_Progress())
        report = await source.read(start, end)
    snapshot = from_fleet(fleet, settings.site, pinned)
    if not report.profiling and snapshot.workloads:
        missing = (
            "no DCGM profiling fields (DCGM_FI_PROF_*) in this server: no tensor or DRAM activity, the shape read from "
            "power per utilisation"
        )
        workloads = [w.model_copy(update={"evidence": [*w.evidence, missing]}) for w in snapshot.workloads]
        snapshot = snapshot.model_copy(update={"workloads": workloads})
    return snapshot, report


def _summary(report: ReadReport, snapshot: Snapshot) -> str:
    what = []
    if not report.profiling:
        what.append("no DCGM_FI_PROF_* series (profiling off): shape from power per utilisation, lower confidence")
    if not report.kube_state:
        what.append("no kube-state-metrics: pods named by themselves, owned by their namespace")
    if report.kube_state and not report.cadvisor:
        what.append("no cAdvisor network series for GPU pods")
    if report.kube_state and not report.cadvisor_disk:
        what.append(
            "no cAdvisor storage series (container_fs_*_bytes_total) for GPU pods: their own disk traffic unknown"
        )
    skipped = ", ".join(f"{n} {reason}" for reason, n in sorted(report.skipped.items()))
    lines = [
        f"fleetfit: {len(snapshot.nodes)} nodes ({report.node_label} label), {len(snapshot.workloads)} workloads, "
        f"{report.windows} windows from {report.series} series in {report.queries} queries"
        + (f" ({report.splits} split as too large)" if report.splits else "")
    ]
    if skipped:
        lines.append(f"fleetfit: left out: {skipped}")
    lines.extend(f"fleetfit: {w}" for w in what)
    return "\n".join(lines)


def render_table(snapshot: Snapshot) -> str:
    """The snapshot's workloads, one line each, for a person."""
    hardware = {n.name: f"{n.gpus} x {n.hardware}" for n in snapshot.nodes}
    rows = [("WORKLOAD", "CLASS", "CONF", "NODE", "GPUS", "MEAN %", "P95 %", "SHAPE", "WHY")]
    for w in sorted(snapshot.workloads, key=lambda w: (w.nodes[0], w.name)):
        shape = "" if w.shape is None else w.shape if isinstance(w.shape, str) else f"{w.shape:.2f}"
        rows.append(
            (
                w.name[:40],
                w.workload_class.value,
                f"{w.confidence:.2f}",
                ",".join(w.nodes)[:30],
                str(w.gpus),
                f"{w.mean_util:.0f}",
                f"{(w.p95_util or 0):.0f}",
                shape,
                (w.evidence[0] if w.evidence else "")[:70],
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows]
    nodes = ", ".join(f"{name} ({hw})" for name, hw in sorted(hardware.items())[:10])
    more = f" and {len(hardware) - 10} more" if len(hardware) > 10 else ""
    return "\n".join([f"site {snapshot.site}: {len(snapshot.nodes)} nodes: {nodes}{more}", *lines])
