"""The live optimizer's Prometheus source (``[sources.prometheus]``): agentless nodes read every interval from the
dcgm-exporter series a Prometheus-compatible server holds, into the same fleet agents feed (docs/prometheus.md).

Each read takes the windows completed since the last one, a scrape interval or two after they end (``SETTLE``: a
server holds a point once its scrape is done); at start it reads ``backfill`` seconds back, so that the first plans
need not wait for windows to accrue. A node that has an agent is read from its agent: its series are left alone. A
node no read finds for three intervals is said offline, as an agent's last will would; it comes back with a birth.
A read that fails (the server down, a refusal) is logged, counted and tried again next interval from where the last
good read stopped, at most a day back (what the fleet accepts of a node at once).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import msgspec

from agent.config import credential_path
from agent.protocol import SCHEMA_VERSION, NodeStatus, TopicKind, node_topic
from optimizer.act.settings import SlurmSettings
from optimizer.act.slurm import Slurm
from optimizer.decide.catalog import Catalog
from optimizer.ingest.dcgm import SOURCE, PodMeta
from optimizer.ingest.fleet import Fleet
from optimizer.ingest.promapi import Endpoint, PromClient, PrometheusError
from optimizer.ingest.promsource import PrometheusSource, ReadSettings
from optimizer.serve.config import PrometheusSource as SourceSettings

log = logging.getLogger(__name__)
jobs_read: Counter[str] = Counter()  # reads of a Slurm site's jobs, by result: ok, failed

GONE_INTERVALS = 3  # reads a node may be missing from before it is said offline
MAX_CATCH_UP = 86_400.0  # what the fleet takes of a node's time at once (node_replay_seconds' default)


def from_prometheus(fleet: Fleet, site: str, node: str) -> bool:
    """Whether the fleet's node was read from Prometheus (its birth says so)."""
    record = fleet.record(site, node)
    return record is not None and record.birth is not None and record.birth.agent_version == SOURCE


def has_agent(fleet: Fleet, site: str, node: str) -> bool:
    """Whether the fleet's node has an agent (its birth came from one): it is read from the agent."""
    record = fleet.record(site, node)
    return record is not None and record.birth is not None and record.birth.agent_version != SOURCE


def slurm_jobs(settings: SlurmSettings) -> Callable[[], Awaitable[dict[str, PodMeta]]]:
    """A reader of the running jobs of a Slurm site (``squeue``, on a worker thread with a deadline): each job's
    name and account by job id; none, with one log line, when squeue does not answer."""
    backend = Slurm(settings)

    async def read() -> dict[str, PodMeta]:
        try:
            jobs, problem = await asyncio.wait_for(asyncio.to_thread(backend.jobs, None, True), settings.timeout + 5)
        except TimeoutError:
            jobs, problem = [], f"no answer in {settings.timeout + 5:g} s"
        if problem:
            jobs_read["failed"] += 1
            log.info("slurm: jobs not read, workloads keep their job ids as names: %s", problem.splitlines()[-1])
            return {}
        jobs_read["ok"] += 1
        return {j.id: PodMeta(name=j.name or None, owner=j.account or None) for j in jobs if j.id}

    return read


class PrometheusFeed:
    """Reads ``settings`` every interval into ``fleet`` through ``ingest``."""

    def __init__(
        self,
        settings: SourceSettings,
        fleet: Fleet,
        ingest: Callable[[str, bytes], bool],
        catalog: Catalog,
        clock: Callable[[], float] = time.time,
        jobs: Callable[[], Awaitable[dict[str, PodMeta]]] | None = None,
    ) -> None:
        """``jobs`` reads the site's Slurm jobs (name and account by job id) before each read, where the site names
        Slurm as its scheduler: dcgm-exporter labels a GPU with its job's id alone."""
        self.settings = settings
        self.jobs = jobs
        self.fleet = fleet
        self.ingest = ingest
        self.catalog = catalog
        self.clock = clock
        self.reads: Counter[str] = Counter()  # by result: ok, failed
        self.windows = 0
        self.last_error: str | None = None
        self.done_until: float | None = None  # the end of the last good read
        # secrets named as systemd credentials (a relative path) are read from $CREDENTIALS_DIRECTORY
        token, password = settings.bearer_token_file, settings.basic_auth_password_file
        self.endpoint = Endpoint(
            url=settings.url,
            bearer_token_file=None if token is None else credential_path(token),
            basic_user=settings.basic_auth_user,
            basic_password_file=None if password is None else credential_path(password),
            ca_file=None if settings.ca_file is None else credential_path(settings.ca_file),
            timeout=settings.timeout,
        )
        self.read_settings = ReadSettings(
            site=settings.site,
            node_label=settings.node_label,
            owner_label=settings.owner_label,
            step=settings.step,
            window=settings.interval,
            selector=settings.selector,
        )
        self._source: PrometheusSource | None = None

    def _tdp(self, model: str) -> float | None:
        hw = self.catalog.lookup(model)
        return None if hw is None else hw.datasheet.tdp_w

    @property
    def settle(self) -> float:
        """Seconds after a window ends before it is read: two scrape intervals."""
        return 2 * self.settings.step

    def nodes(self) -> int:
        return 0 if self._source is None else len(self._source.seen)

    async def read_once(self, client: PromClient) -> int:
        """Read the windows completed since the last read; the number of windows taken in."""
        s = self.settings
        now = self.clock()
        end = math.floor((now - self.settle) / s.interval) * s.interval
        start = self.done_until if self.done_until is not None else end - s.backfill
        start = max(start, end - MAX_CATCH_UP)
        start = math.floor(start / s.interval) * s.interval
        if self._source is None:
            site = s.site
            self._source = PrometheusSource(
                client,
                self.fleet,
                self.read_settings,
                power_limit=self._tdp,
                skip_node=lambda node: has_agent(self.fleet, site, node),
                ingest=self.ingest,
            )
        self._source.client = client
        if end <= start:
            return 0
        if self.jobs is not None:
            self._source.jobs = await self.jobs()
        report = await self._source.read(start, end, required=False)
        self.done_until = end
        self.windows += report.windows
        for node in self._source.gone(end, GONE_INTERVALS * s.interval):
            self._offline(node, now)
        if report.skipped:
            log.info("prometheus: left out of the series read: %s", dict(report.skipped))
        return report.windows

    def _offline(self, node: str, now: float) -> None:
        if not from_prometheus(self.fleet, self.settings.site, node):
            return
        record = self.fleet.record(self.settings.site, node)
        session = record.session if record is not None and record.session >= 0 else 1
        state = {"schema": SCHEMA_VERSION, "node": node, "session": session, "status": NodeStatus.OFFLINE.value,
                 "timestamp": now}  # fmt: skip
        topic = node_topic(self.fleet.prefix, self.settings.site, node, TopicKind.STATE)
        self.ingest(topic, msgspec.json.encode(state))
        log.info("prometheus: %s/%s not seen for %d reads: offline", self.settings.site, node, GONE_INTERVALS)

    async def run(self) -> None:
        """Read every interval until cancelled; a failed read is logged and counted, never fatal."""
        s = self.settings
        async with PromClient(self.endpoint) as client:
            while True:
                try:
                    windows = await self.read_once(client)
                except PrometheusError as exc:
                    self.reads["failed"] += 1
                    message = str(exc)
                    if message != self.last_error:
                        log.warning("prometheus: read failed (tried again in %g s): %s", s.interval, message)
                    self.last_error = message
                except Exception:  # a bug must not end the optimizer: it is logged and counted like a failed read
                    self.reads["failed"] += 1
                    log.exception("prometheus: read failed")
                else:
                    self.reads["ok"] += 1
                    if self.last_error is not None:
                        log.info("prometheus: reading again (%d windows)", windows)
                    self.last_error = None
                now = self.clock()
                following = (math.floor((now - self.settle) / s.interval) + 1) * s.interval + self.settle
                await asyncio.sleep(max(1.0, following - now))
