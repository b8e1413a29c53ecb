"""Prometheus as a source of the fleet: dcgm-exporter's series (with kube-state-metrics and cAdvisor where they are
scraped too) read through the HTTP API and fed to a ``Fleet`` as births and windows, the way agents' messages are.

A read is cut in pieces no server refuses: nodes in groups, time in stretches, so that one query asks for at most
``points_per_query`` points and no series for more than 10,000 (Prometheus refuses 11,000 a series). A query the
server still finds too large is split again (nodes first, then time), down to one node over one window. Queries run
a few at a time (``concurrency``); each group's series are turned into windows and ingested as soon as they arrive,
so memory holds a few groups' series, not the fleet's.

kube-state-metrics gives each pod its controller (``kube_pod_owner``, ``kube_replicaset_owner``: the Deployment a
capacity team would move) and, with ``owner_label``, its team (``kube_pod_labels``). cAdvisor gives each pod's own
network traffic (``container_network_*_bytes_total``: the pod's network namespace, the same figure the agent reads
from ``/proc/PID/net/dev``) and storage traffic (``container_fs_{reads,writes}_bytes_total``: its cgroup's block I/O,
where the agent reads its processes' ``/proc/PID/io``). All are optional: without kube-state-metrics a pod is named
by itself and owned by its namespace; without cAdvisor's series its windows carry no traffic of its own.
node_exporter gives each node's CPUs, memory, NVMe and network file systems as its birth's host
(optimizer/ingest/nodeexporter.py), where it is scraped too.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgspec

from agent.protocol import HostInfo, TopicKind, node_topic
from optimizer.ingest.dcgm import (
    FB_USED,
    GPU_UTIL,
    GR_ENGINE,
    INVENTORY_ONLY,
    METRICS,
    NODE_LABELS,
    PEAKS,
    RAW,
    SLURM_JOBS,
    STORE_ONLY,
    THROTTLE_METRICS,
    NodeSeries,
    PodMeta,
    Tally,
    add_pod_rate,
    add_series,
    birth,
    valid_node,
    windows,
)
from optimizer.ingest.fleet import Fleet
from optimizer.ingest.nodeexporter import QUERIES, host_infos
from optimizer.ingest.promapi import PromClient, PrometheusError, Series, TooLarge

log = logging.getLogger(__name__)

MAX_POINTS_PER_SERIES = 10_000  # Prometheus refuses a range query past 11,000 points a series
GPUS_PER_NODE_GUESS = 8
CADVISOR_RX = "container_network_receive_bytes_total"
CADVISOR_TX = "container_network_transmit_bytes_total"
CADVISOR_READ = "container_fs_reads_bytes_total"
CADVISOR_WRITE = "container_fs_writes_bytes_total"
# Block devices cAdvisor names (from /sys/block) that stack over others: md RAID, device-mapper
STACKED_DEVICES = r"(/dev/)?(md[0-9a-z_]+|dm-[0-9]+|mapper/.+)"
SERIES_PER_GPU = len(METRICS)


@dataclass(frozen=True, slots=True)
class ReadSettings:
    """How to read one fleet out of a Prometheus-compatible server."""

    site: str = "default"
    node_label: str | None = None  # None: Hostname, else hostname (dcgm-exporter's spellings)
    owner_label: str | None = None  # a pod label (as kube-state-metrics writes it, label_team) naming the owner
    step: float = 30.0  # seconds between the points read: dcgm-exporter's default collect interval is 30 s
    window: float = 300.0  # seconds of points in one telemetry window
    points_per_query: int = 2_000_000
    concurrency: int = 3
    selector: str = ""  # extra label matchers for every dcgm series, e.g. 'cluster="eu-1"'
    store_fields: bool = True  # read what only the store keeps (temperature, clocks...); False: what plans use


@dataclass(slots=True)
class ReadReport:
    """What a read found and left out, for the log, the progress line and the import's summary."""

    nodes: int = 0
    nodes_read: int = 0
    windows: int = 0
    refused: int = 0  # windows or births the fleet refused (its reasons are counted there)
    series: int = 0
    queries: int = 0
    splits: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    profiling: bool = False  # any DCGM_FI_PROF_* series seen
    kube_state: bool = False
    cadvisor: bool = False  # cAdvisor's network series for some GPU pod
    cadvisor_disk: bool = False  # and its storage series
    node_label: str | None = None
    bad_nodes: list[str] = field(default_factory=list)


def auto_step(seconds: float, step: float | None) -> float:
    """The step for a read of ``seconds``: the one given, else 30 s (dcgm-exporter's default collect interval) up to
    2,880 points a series (a day), longer for longer reads so that no series holds more."""
    if step is not None:
        return step
    return float(max(30, math.ceil(seconds / 2880 / 30) * 30))


def auto_window(seconds: float, step: float) -> float:
    """A window for a read of ``seconds``: 5 minutes, or a 96th of the read past 8 hours (15 minutes for a day),
    whole minutes and at least two steps. A window is the unit the fleet keeps and the classifier counts (3 to
    classify, 6 for full confidence); a day in 96 keeps the work of a long read near that of 8 hours."""
    window = max(300.0, math.ceil(seconds / 96 / 60) * 60)
    return max(window, math.ceil(2 * step / 60) * 60)


def _raw(text: str) -> str:
    """``text`` as a PromQL raw string literal (backticks: nothing inside is an escape)."""
    if "`" in text:
        raise ValueError(f"{text!r} cannot be quoted")
    return f"`{text}`"


def _ksm_label(name: str) -> str:
    """A pod label as kube-state-metrics names it in ``kube_pod_labels``: ``label_`` and the name with every
    character Prometheus does not allow in a label name made ``_`` (``app.kubernetes.io/part-of`` ->
    ``label_app_kubernetes_io_part_of``)."""
    if name.startswith("label_"):
        return name
    return "label_" + "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in name)


def _regex_of(names: Sequence[str]) -> str:
    special = set(r"\.+*?()|[]{}^$")
    return "|".join("".join("\\" + c if c in special else c for c in n) for n in names)


class PrometheusSource:
    """Reads dcgm-exporter series of ``[start, end)`` into ``fleet``."""

    def __init__(
        self,
        client: PromClient,
        fleet: Fleet,
        settings: ReadSettings,
        power_limit: Callable[[str], float | None] | None = None,
        progress: Callable[[ReadReport], None] | None = None,
        skip_node: Callable[[str], bool] | None = None,
        ingest: Callable[[str, bytes], bool] | None = None,
    ) -> None:
        """``ingest`` takes each message (topic, payload) and says whether it was accepted: the fleet's own by
        default; the live optimizer's also writes accepted windows to its store."""
        self.client = client
        self.fleet = fleet
        self.ingest = ingest or (lambda topic, payload: fleet.ingest(topic, payload) is not None)
        self.seen: dict[str, float] = {}  # node -> the end of the last read that found it
        self.settings = settings
        self.power_limit = power_limit
        self.progress = progress
        self.skip_node = skip_node or (lambda node: False)
        self.sent_births: dict[str, int] = {}  # node -> devices in the birth last sent
        self.hosts: dict[str, HostInfo] = {}  # node -> its host from node_exporter, as the last read found it
        self.sent_hosts: dict[str, HostInfo | None] = {}  # node -> the host in the birth last sent
        # job id -> its name and account, as the site's Slurm told the caller (optimizer/serve/promfeed.py): what
        # dcgm-exporter's hpc_job label alone does not say
        self.jobs: dict[str, PodMeta] = {}

    async def node_label(self, start: float, end: float, required: bool = True) -> tuple[str, list[str]]:
        """The label naming nodes, and the nodes it names between ``start`` and ``end``; with none found, an error
        saying what to check, or (not ``required``: a live read, where every node may have gone) no nodes."""
        s = self.settings
        match = self._match(FB_USED)
        for label in (s.node_label,) if s.node_label else NODE_LABELS:
            names = await self.client.label_values(label, match, start, end)
            if names:
                return label, names
        if not required:
            return s.node_label or NODE_LABELS[0], []
        if s.node_label:
            raise PrometheusError(
                f"no {FB_USED} series carries the label {s.node_label!r} between those times: check --node-label"
            )
        raise PrometheusError(
            f"no dcgm-exporter series ({FB_USED}) with a Hostname or hostname label between those times: is "
            "dcgm-exporter scraped by this server, and for that period? (or name the node label with --node-label)"
        )

    def _match(self, metric: str, extra: str = "") -> str:
        matchers = ", ".join(m for m in (self.settings.selector, extra) if m)
        return f"{metric}{{{matchers}}}" if matchers else metric

    async def read(self, start: float, end: float, required: bool = True) -> ReadReport:
        """Read every node's series from ``start`` to ``end`` (whole windows) into the fleet; ``required``: finding
        no node is an error."""
        s = self.settings
        report = ReadReport()
        label, found = await self.node_label(start, end, required)
        report.node_label = label
        nodes = []
        for name in sorted(set(found)):
            if not valid_node(name):
                report.bad_nodes.append(name)
                report.skipped["node_name"] += 1
            elif not self.skip_node(name):
                nodes.append(name)
        report.nodes = len(nodes)
        if report.bad_nodes:
            log.warning(
                "%d node name(s) in %r are no valid node id and are left out (e.g. %r)",
                len(report.bad_nodes), label, report.bad_nodes[0],
            )  # fmt: skip
        pods = await self._pods(start, end, report)
        pods.update({(SLURM_JOBS, job): meta for job, meta in self.jobs.items()})
        self.hosts.update(await self._hosts(end, nodes, report))
        span = min(end - start, s.step * MAX_POINTS_PER_SERIES)
        span = max(s.window, math.floor(span / s.window) * s.window)
        # a node's points over the span: utilisation at every step, one figure a window for the rest
        per_node = GPUS_PER_NODE_GUESS * (span / s.step + SERIES_PER_GPU * span / s.window)
        group = max(1, min(len(nodes), int(s.points_per_query / per_node)))
        groups = [nodes[i : i + group] for i in range(0, len(nodes), group)]
        limit = asyncio.Semaphore(s.concurrency)

        async def one(names: list[str]) -> None:
            async with limit:
                await self._group(names, label, start, end, span, pods, report)

        if groups:
            await asyncio.gather(*(one(g) for g in groups))
        return report

    async def _pods(self, start: float, end: float, report: ReadReport) -> dict[tuple[str, str], PodMeta]:
        """Each pod's controller and owner from kube-state-metrics, where the server has it."""
        seconds = max(1, math.ceil(end - start))
        at = end

        async def instant(query: str) -> list[dict[str, str]]:
            try:
                series = await self.client.query_range(query, at, at, 60)
            except PrometheusError as exc:
                log.info("kube-state-metrics not read (%s)", exc)
                return []
            report.queries += 1
            return [x.labels for x in series]

        owners = await instant(f"last_over_time(kube_pod_owner[{seconds}s])")
        if not owners:
            return {}
        report.kube_state = True
        replicasets = {
            (x.get("namespace", ""), x.get("replicaset", "")): (x.get("owner_kind"), x.get("owner_name"))
            for x in await instant(f"last_over_time(kube_replicaset_owner[{seconds}s])")
        }
        labels: dict[tuple[str, str], str] = {}
        if self.settings.owner_label:
            key = _ksm_label(self.settings.owner_label)
            for x in await instant(f"last_over_time(kube_pod_labels[{seconds}s])"):
                if x.get(key):
                    labels[(x.get("namespace", ""), x.get("pod", ""))] = x[key]
        uids = {
            (x.get("namespace", ""), x.get("pod", "")): x.get("uid")
            for x in await instant(f"last_over_time(kube_pod_info[{seconds}s])")
        }
        out: dict[tuple[str, str], PodMeta] = {}
        for x in owners:
            pod = (x.get("namespace", ""), x.get("pod", ""))
            kind, name = x.get("owner_kind"), x.get("owner_name")
            if kind == "ReplicaSet" and (pod[0], name or "") in replicasets:
                kind, name = replicasets[(pod[0], name or "")]
            if kind in (None, "", "<none>"):
                kind, name = None, None
            out[pod] = PodMeta(name=name, kind=kind, owner=labels.get(pod), uid=uids.get(pod) or None)
        for pod, owner in labels.items():
            out.setdefault(pod, PodMeta(owner=owner, uid=uids.get(pod) or None))
        return out

    async def _hosts(self, at: float, nodes: list[str], report: ReadReport) -> dict[str, HostInfo]:
        """Each node's CPUs, memory, NVMe and network file systems from node_exporter, where the server has it
        (optimizer/ingest/nodeexporter.py)."""
        answers: dict[str, list[Series]] = {}
        for key, query in QUERIES.items():
            try:
                answers[key] = await self.client.query_range(query, at, at, 60)
            except PrometheusError as exc:
                log.info("node_exporter's %s not read (%s)", key, exc)
                continue
            report.queries += 1
        found, skipped = host_infos(answers, nodes)
        report.skipped.update(skipped)
        return found

    async def _group(
        self,
        names: list[str],
        label: str,
        start: float,
        end: float,
        span: float,
        pods: dict[tuple[str, str], PodMeta],
        report: ReadReport,
    ) -> None:
        """One group of nodes, stretch by stretch; halved and read again when the server finds it too large."""
        s = self.settings
        t = start
        while t < end - 1e-6:
            stop = min(end, t + span)
            try:
                nodes = await self._fetch(names, label, t, stop, pods, report)
            except TooLarge:
                report.splits += 1
                if len(names) > 1:
                    half = len(names) // 2
                    await self._group(names[:half], label, t, stop, span, pods, report)
                    await self._group(names[half:], label, t, stop, span, pods, report)
                elif span > s.window:
                    smaller = max(s.window, math.floor(span / 2 / s.window) * s.window)
                    await self._group(names, label, t, stop, smaller, pods, report)
                else:
                    raise PrometheusError(
                        f"the server refuses even one node ({names[0]}) over one window ({s.window:g} s) as too large: "
                        "raise its limits or give a longer --step"
                    ) from None
                t = stop
                continue
            await self._ingest(nodes, t, stop, report)
            t = stop
            if self.progress is not None:
                self.progress(report)

    async def _fetch(
        self,
        names: list[str],
        label: str,
        start: float,
        end: float,
        pods: dict[tuple[str, str], PodMeta],
        report: ReadReport,
    ) -> dict[str, NodeSeries]:
        s = self.settings
        where = [f"{label}=~{_raw(_regex_of(names))}", *([s.selector] if s.selector else [])]

        def selector(metric: str, *more: str) -> str:
            return metric + "{" + ", ".join([*where, *more]) + "}"

        # The last point of a stretch sits just before its end, so that a window never takes one of the next's.
        last = end - min(s.step, 1.0) / 2
        # Utilisation point by point: its seconds at 0 %, spread and p95 are read from them. Every other figure is
        # a window's mean (memory and limits its most), worked out by the server: a window's one value instead of a
        # point a scrape, for a tenth of the transfer. A function drops the metric's name; it is put back.
        queries: list[tuple[str, str, float, float, float]] = [
            (GPU_UTIL, selector(GPU_UTIL), start, last, s.step),
            (GR_ENGINE, selector(GR_ENGINE, 'GPU_I_ID!=""'), start, last, s.step),  # MIG instances only
            # a bitmask and two counters, which no mean summarises; absent unless the exporter's CSV enables them
            *((m, selector(m), start, last, s.step) for m in THROTTLE_METRICS),
        ]
        length = f"{round(s.window)}s"
        for metric in METRICS:
            if metric in INVENTORY_ONLY:  # the most over the stretch: one figure a series
                stretch = f"{round(end - start)}s"
                queries.append((metric, f"max_over_time({selector(metric)}[{stretch}])", end, end, s.window))
            elif metric not in RAW and (s.store_fields or metric not in STORE_ONLY):
                how = "max" if metric in PEAKS else "avg"
                queries.append(
                    (metric, f"{how}_over_time({selector(metric)}[{length}])", start + s.window, end, s.window)
                )
        answers = await asyncio.gather(*(self.client.query_range(q, a, b, step) for _, q, a, b, step in queries))
        report.queries += len(queries)
        tally = Tally()
        nodes: dict[str, NodeSeries] = {}
        wanted = set(names)
        for (metric, *_), series in zip(queries, answers, strict=True):
            report.series += len(series)
            aggregated = metric not in RAW
            for k, x in enumerate(series):
                if k % 500 == 499:
                    await asyncio.sleep(0)  # a large answer is read in turns with the rest of the loop's work
                if aggregated:
                    # a window's figure, evaluated at its end: placed in its middle, where its window reads it
                    half = s.window / 2
                    x = Series({**x.labels, "__name__": metric}, [t - half for t in x.times], x.values)  # noqa: PLW2901
                self._take_series(x, label, wanted, nodes, pods, tally, report)
        held = sorted({p for n in nodes.values() for d in n.devices.values() for h in d.holders if (p := h.pod)})
        if held:
            await self._pod_traffic(held, start, last, nodes, report)
        report.skipped.update(tally.skipped)
        return nodes

    def _take_series(
        self,
        x: Series,
        label: str,
        names: set[str],
        nodes: dict[str, NodeSeries],
        pods: dict[tuple[str, str], PodMeta],
        tally: Tally,
        report: ReadReport,
    ) -> None:
        """One series into its node's devices, when it names one of ``names``."""
        node = x.labels.get(label, "")
        if node not in names:
            tally.skip("node_label")
            return
        if x.labels.get("__name__", "").startswith("DCGM_FI_PROF_"):
            report.profiling = True
        into = nodes.get(node)
        if into is None:
            into = nodes[node] = NodeSeries(node)
        add_series(into, x.labels, x.times, x.values, pods, tally)

    async def _pod_traffic(
        self,
        held: list[tuple[str, str]],
        start: float,
        end: float,
        nodes: dict[str, NodeSeries],
        report: ReadReport,
    ) -> None:
        """The pods' own network and storage traffic from cAdvisor (one series a pod and field), where it is
        scraped."""
        s = self.settings
        where = {
            pod: node for node, n in nodes.items() for d in n.devices.values() for h in d.holders if (pod := h.pod)
        }
        rate = f"{max(120, int(4 * s.step))}s"
        pods_re = _raw(_regex_of(sorted({p for _, p in held})))

        def network(metric: str) -> str:
            # cAdvisor writes a pod's traffic once per interface (under its sandbox, and on some runtimes again under
            # each container): the most per interface, summed over interfaces, counts it once.
            return (
                f"sum by (namespace, pod) (max by (namespace, pod, interface) "
                f'(rate({metric}{{pod=~{pods_re}, interface!="lo"}}[{rate}])))'
            )

        def disk(metric: str) -> str:
            def per_pod(devices: str) -> str:
                # Storage is counted per cgroup and device: each container's own, and the pod's cgroup
                # (container="") holding them all, beside the sandbox's (container="" or "POD", no I/O of its own).
                # Per device, the most of the pod's cgroup and its containers' sum counts each byte once whichever
                # of them is scraped. Rates come before any sum: a restarted container's counter back at 0 is a
                # reset of its own series, where a sum of counters would fall and read the other containers' whole
                # history as one interval's bytes.
                match = f"pod=~{pods_re}{devices}"
                containers = (
                    f"sum by (namespace, pod, device) "
                    f'(rate({metric}{{{match}, container!="", container!="POD"}}[{rate}]))'
                )
                cgroup = f'rate({metric}{{{match}, container=""}}[{rate}])'
                return (
                    f"sum by (namespace, pod) (max by (namespace, pod, device) "
                    f'(label_replace({containers}, "cgroup", "containers", "", "") or {cgroup}))'
                )

            # A block layer over other devices (md RAID, device-mapper: LVM, dm-crypt) hands each byte on to its
            # members, and the cgroup counts it again on each: where a pod's traffic shows on such a device, that
            # device's figure is its own (a pod that also used a bare drive in that step is read short of it).
            return f"({per_pod(f', device=~{_raw(STACKED_DEVICES)}')} > 0) or {per_pod('')}"

        families = (
            ("network", [("net_rx_bps", network(CADVISOR_RX)), ("net_tx_bps", network(CADVISOR_TX))]),
            ("storage", [("disk_read_bps", disk(CADVISOR_READ)), ("disk_write_bps", disk(CADVISOR_WRITE))]),
        )
        for family, queries in families:
            for name, query in queries:
                try:
                    series = await self.client.query_range(query, start, end, s.step)
                except TooLarge:
                    raise
                except PrometheusError as exc:
                    log.info("cAdvisor %s not read (%s)", family, exc)
                    break
                report.queries += 1
                for x in series:
                    key = (x.labels.get("namespace", ""), x.labels.get("pod", ""))
                    node = where.get(key)
                    if node is not None:
                        if family == "network":
                            report.cadvisor = True
                        else:
                            report.cadvisor_disk = True
                        add_pod_rate(nodes[node], key[0], key[1], name, x.times, x.values)

    async def _ingest(self, nodes: dict[str, NodeSeries], start: float, end: float, report: ReadReport) -> None:
        """Each node's birth (when its devices are new) and windows into the fleet, yielding to the event loop
        between nodes: in the live optimizer a read of a thousand nodes is seconds of work beside the broker's."""
        s = self.settings
        for name, node in sorted(nodes.items()):
            if not node.devices:
                continue
            devices = len(node.devices)
            host = self.hosts.get(name)
            if self.sent_births.get(name) != devices or self.sent_hosts.get(name) != host:
                payload = birth(node, s.site, start, self.power_limit)
                if host is not None:
                    payload["host"] = host.model_dump(mode="json")
                topic = node_topic(self.fleet.prefix, s.site, name, TopicKind.BIRTH)
                if not self.ingest(topic, msgspec.json.encode(payload)):
                    report.refused += 1
                    continue
                self.sent_births[name] = devices
                self.sent_hosts[name] = host
                report.nodes_read += 1
            # the node's latest point, not the read's end: a server repeats a series' last value for a while
            # (Prometheus' lookback) after its exporter is gone
            latest = max((p.times[-1] for d in node.devices.values() for p in d.metrics.values() if p.times), default=0)
            self.seen[name] = max(self.seen.get(name, 0.0), latest)
            topic = node_topic(self.fleet.prefix, s.site, name, TopicKind.TELEMETRY)
            for w in windows(node, s.site, start, end, s.window):
                if self.ingest(topic, msgspec.json.encode(w)):
                    report.windows += 1
                else:
                    report.refused += 1
            await asyncio.sleep(0)

    def gone(self, now: float, after: float) -> list[str]:
        """Nodes no read has found for ``after`` seconds: forgotten here (their next appearance is a new birth)."""
        lost = [name for name, seen in self.seen.items() if now - seen > after]
        for name in lost:
            del self.seen[name]
            self.sent_births.pop(name, None)
            self.sent_hosts.pop(name, None)
            self.hosts.pop(name, None)
        return lost


def window_bounds(since: float, until: float | None, window: float, now: float | None = None) -> tuple[float, float]:
    """Whole windows from ``since`` seconds before ``until`` (default now) up to ``until``."""
    if until is None:
        until = time.time() if now is None else now
    end = math.floor(until / window) * window
    start = math.floor((end - since) / window) * window
    return start, end
