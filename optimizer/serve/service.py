"""The optimizer daemon: ingest telemetry from MQTT, plan every ``solve_interval``, publish each site's plan
retained on ``{prefix}/{site}/recommendations`` and hand it to the caller."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import sqlite3
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Protocol

import aiomqtt

from agent.backoff import Backoff
from agent.heap import trim
from agent.mqtt import make_client, raise_if_cancelled
from agent.notify import Notifier
from agent.protocol import (
    MAX_HANDOVER_ENTRIES,
    MAX_PAYLOAD_BYTES,
    Handover,
    NodeStatus,
    Plan,
    Recommendation,
    Resend,
    WorkloadClass,
    encode,
    handover_filters,
    handover_site,
    handover_topic,
    presence_filter,
    presence_topic,
    recommendations_topic,
    resend_topic,
    subscription_filters,
)
from optimizer.act.settings import SlurmSettings
from optimizer.decide.catalog import Catalog, Correction
from optimizer.decide.inventory import inventory_check, load_inventories
from optimizer.decide.snapshot import Snapshot, from_fleet
from optimizer.ingest.fleet import Fleet, IngestLimits
from optimizer.ingest.history import DIGEST_SECONDS
from optimizer.ingest.lag import Lag
from optimizer.ingest.window import Window
from optimizer.plan.interrupt import SolveStop
from optimizer.plan.recommend import plan_snapshot
from optimizer.serve.alerts.alerter import Alerter
from optimizer.serve.alerts.journal import Sent
from optimizer.serve.config import OptimizerConfig
from optimizer.serve.handover import Handovers
from optimizer.serve.intake import Intake
from optimizer.serve.lifecycle import Lifecycle, Offloaded, RecState
from optimizer.serve.outcomes import OBSERVE_HOURS, Learning, Outcome, learning, missed, observe
from optimizer.serve.ownership import Ownership
from optimizer.serve.promfeed import PrometheusFeed, from_prometheus, slurm_jobs
from optimizer.serve.report import Ledger, nodes_online, owners_of
from optimizer.serve.store import Store, plan_points, window_points

log = logging.getLogger(__name__)

# The largest packet the broker may forward: a maximal payload plus its topic and headers.
MAX_PACKET_BYTES = MAX_PAYLOAD_BYTES + 4096
# Windows missing from a node's sequence are asked for once they have been missing this long (the broker keeps a
# publisher's order, so a gap is a window lost, not one still on its way), every RESEND_INTERVAL seconds, and given
# up after RESEND_GIVE_UP (counted in fleetfit_windows_lost_total).
RESEND_DELAY = 5.0
RESEND_INTERVAL = 10.0
RESEND_GIVE_UP = 3600.0
# The owner of a site publishes its handover record right after each plan and each alert post, and at least this
# often (seconds) when it says something new: `fleetfit recommendations ack` writes the state file from outside.
HANDOVER_INTERVAL = 10.0


class Server(Protocol):
    """Something served beside the optimizer for as long as it runs (the HTTP API and console)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class Optimizer:
    def __init__(
        self,
        config: OptimizerConfig,
        catalog: Catalog,
        on_plan: Callable[[Plan], None] | None = None,
        store: Store | None = None,
        lifecycle: Lifecycle | None = None,
        alerter: Alerter | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``clock``: wall time in seconds, for what ingest checks and planning observes (a simulation's own)."""
        self.config = config
        self.clock = clock
        self.catalog = catalog.with_prices(config.prices)
        settings = config.optimizer
        limits = ingest_limits(config, self.catalog)
        self.fleet = Fleet(config.mqtt.prefix, settings.horizon_windows, limits, clock=clock)
        self.plans: dict[str, Plan] = {}
        self.on_plan = on_plan
        self.should_exit = asyncio.Event()
        self.failed: str | None = None  # why the daemon stopped on its own (a task that died)
        self.notifier = Notifier(environ={})  # serve() hands it systemd's environment
        self.resend_interval = RESEND_INTERVAL
        self.resend_delay = RESEND_DELAY
        self.connects = 0  # broker sessions begun
        self.resend_requests = 0  # requests published, one per node and round
        self.internal_errors = 0  # messages whose handling raised (a bug): logged, counted, the loop goes on
        self.state_error: str | None = None  # why the last lifecycle write failed (a full disk), until one succeeds
        self.state_write_failures = 0
        self.solve_stop = SolveStop()  # set once, at shutdown
        self.connected = asyncio.Event()
        self._client: aiomqtt.Client | None = None
        self._intake: Intake | None = None  # the connected client's
        self._backoff = Backoff(cap=config.mqtt.reconnect_max_delay)
        self.store = store if store is not None else (Store(config.influxdb) if config.influxdb.url else None)
        self.lifecycle = lifecycle
        self.tracker = Offloaded(lifecycle) if lifecycle is not None else None  # the lifecycle, off the loop
        self.ledger = Ledger(lifecycle.path) if lifecycle is not None else None  # showback, written by tracker
        self.servers: list[Server] = []
        self.alerter = alerter
        self.plans_made = 0
        self.plan_cpu_seconds = 0.0  # CPU the planning threads spent, all rounds
        self.plan_wait = config.optimizer.solve_interval  # seconds before the next round: at least solve_interval
        self._stretched = False  # rounds rest longer than solve_interval (planning at its CPU share)
        self.lag = Lag()
        self.plan_failures: Counter[str] = Counter()  # per site
        self.failing_sites: dict[str, str] = {}  # site -> why its last round failed
        self.excluded_nodes: dict[str, dict[str, str]] = {}  # site -> node -> "reason: detail", last round
        # site -> (node, reason) -> devices whose share of a GPU was estimated in the last round
        self.share_estimates: dict[str, Counter[tuple[str, str]]] = {}
        self.learned: dict[str, tuple[Correction, ...]] = {}  # site -> factors its observed moves taught
        self.ownership = Ownership(
            config.mqtt.prefix, settings.client_id, settings.sites, settings.standby_sites, settings.peers
        )
        self.started = time.time()  # orders this process's presence after its predecessor's
        # sites' alert and lifecycle state handed between the optimizers that plan them in turn
        self.handovers = Handovers(config.mqtt.prefix, self.ownership)
        self.handover_interval = HANDOVER_INTERVAL
        self._handover_due = asyncio.Event()
        if alerter is not None:
            alerter.on_post = lambda _site: self._handover_due.set()
        # agentless nodes, read from dcgm-exporter's series in Prometheus (docs/prometheus.md)
        source = config.sources.prometheus
        site = config.sites.get(source.site) if source else None
        # a Slurm site's job names and accounts, which dcgm-exporter's hpc_job label leaves out
        jobs = slurm_jobs(site.slurm or SlurmSettings()) if site is not None and site.scheduler == "slurm" else None
        self.feed = PrometheusFeed(source, self.fleet, self._take_read, self.catalog, jobs=jobs) if source else None

    async def _ingest(self) -> None:
        """Subscribe and take messages in; reconnect with backoff after any failure, whatever it was (a broker
        gone, a CA file unreadable for a moment, a bug), logging each."""
        settings = self.config.mqtt
        if "max_queued_messages" in self.config.optimizer.model_fields_set:
            log.warning("[optimizer] max_queued_messages is no longer used: messages are taken in as they are read")
        presence_at = presence_topic(settings.prefix, self.config.optimizer.client_id)
        presence_head = presence_at.rsplit("/", 1)[0] + "/"
        # the broker says this optimizer is offline when its connection dies: its standbys take its sites over
        scoped = self.ownership.scoped
        will = aiomqtt.Will(presence_at, self._presence(NodeStatus.OFFLINE), qos=1, retain=True) if scoped else None
        while True:
            try:
                client = make_client(
                    settings,
                    self.config.optimizer.client_id,
                    will=will,
                    max_packet_size=MAX_PACKET_BYTES,
                )
                # A message is acknowledged once it has been taken in, not on receipt: what the client holds
                # unread when the optimizer stops is delivered again by the broker (persistent session).
                intake = self._intake = Intake(client, lambda t, payload: self._message(t, payload, presence_head))
                async with client:
                    self.ownership.connected()
                    filters = subscription_filters(
                        settings.prefix, self.config.optimizer.shared_group, self.ownership.subscribed_sites
                    )
                    # presences first: the broker sends retained messages in the order of the subscriptions, and a
                    # handover record is trusted by the presence of the optimizer that wrote it
                    handovers = handover_filters(settings.prefix, self.ownership.subscribed_sites) if scoped else []
                    for topic_filter in [presence_filter(settings.prefix), *handovers, *filters]:
                        await client.subscribe(topic_filter, qos=1)
                    if scoped:  # after subscribing, so that its echo says the others' retained presences are in
                        await client.publish(presence_at, self._presence(NodeStatus.ONLINE), qos=1, retain=True)
                    self._client = client
                    self._backoff.reset()
                    self.connects += 1
                    self.connected.set()
                    log.info(
                        "subscribed to %s on %s:%d",
                        ", ".join(f"{settings.prefix}/{s}/#" for s in self.ownership.subscribed_sites or ["+"]),
                        settings.host,
                        settings.port,
                    )
                    intake.start()
                    await intake.closed()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.connected.clear()
                self.ownership.disconnected()
                self._client = None
                # On Python 3.11 a cancellation that lands as aiomqtt's connect completes is swallowed by its
                # asyncio.wait_for; the task stays marked cancelling, and must end here rather than reconnect.
                raise_if_cancelled()
                delay = self._backoff.next_delay()
                what = "connection lost" if isinstance(exc, aiomqtt.MqttError) else "cannot connect"
                log.warning(
                    "broker %s:%d: %s (%s); reconnecting in %.1f s",
                    settings.host,
                    settings.port,
                    what,
                    _brief(exc),
                    delay,
                    exc_info=not isinstance(exc, aiomqtt.MqttError | OSError),
                )
                await asyncio.sleep(delay)

    def _message(self, topic: str, payload: bytes | bytearray, presence_head: str) -> None:
        """One message in, whatever its kind. A failure here is a bug: logged and counted, and the next message is
        taken (bad input is refused and counted by the steps themselves)."""
        try:
            if topic.startswith(presence_head):
                self.ownership.observe(topic, payload)
            elif topic.endswith("/handover") and handover_site(self.config.mqtt.prefix, topic) is not None:
                self.handovers.observe(topic, payload)
            else:
                self._take(topic, payload)
        except Exception:
            self.internal_errors += 1
            if self.internal_errors <= 5 or self.internal_errors % 1000 == 0:
                log.exception("message on %r not handled (%d so far)", topic[:200], self.internal_errors)

    def _presence(self, status: NodeStatus) -> bytes:
        return self.ownership.presence(status, self.started).model_dump_json(by_alias=True).encode()

    async def _leave(self) -> None:
        """Say this optimizer is going (a clean disconnect sends no last will): its standbys take over now."""
        client = self._client
        if client is None or not self.ownership.scoped:
            return
        topic = presence_topic(self.config.mqtt.prefix, self.config.optimizer.client_id)
        try:
            await asyncio.wait_for(client.publish(topic, self._presence(NodeStatus.OFFLINE), qos=1, retain=True), 5)
        except (aiomqtt.MqttError, TimeoutError) as exc:
            log.info("could not say this optimizer is leaving (its last will will): %s", _brief(exc))

    def _take(self, topic: str, payload: bytes | bytearray, timely: bool = True) -> bool:
        """A node's message: into the fleet, and a window's lines into the store; whether it was accepted.
        ``timely``: it came as it was made (MQTT), so how late it came is the ingest lag; a window a source read
        later on purpose (Prometheus, settled windows and a backfill) is not counted there."""
        accepted = self.fleet.ingest(topic, payload)
        if isinstance(accepted, Window):
            if timely:
                self.lag.add(self.fleet.clock() - accepted.end)
            if self.store is not None:
                record = self.fleet.record(accepted.site, accepted.node)
                self.store.add(window_points(record.birth if record else None, accepted))
        return accepted is not None

    def _take_read(self, topic: str, payload: bytes) -> bool:
        """A message a source read (Prometheus) rather than a node sent: taken as a node's, outside the ingest lag."""
        return self._take(topic, payload, timely=False)

    async def request_resends(self) -> int:
        """Ask each node for the windows missing from its sequence; the number of nodes asked."""
        client = self._client
        awaited = self.fleet.awaited(self.resend_delay, RESEND_GIVE_UP)
        # a node read from Prometheus has no agent to answer: what its server lacks, it lacks
        awaited = {key: ranges for key, ranges in awaited.items() if not from_prometheus(self.fleet, *key)}
        # a node's gaps are asked for by its site's owner only: a standby asking too would double the replay
        awaited = {key: ranges for key, ranges in awaited.items() if self.ownership.owns(key[0])}
        if client is None or not awaited:
            return 0
        asked = 0
        for (site, node), ranges in sorted(awaited.items()):
            request = Resend(node=node, windows=ranges)
            try:
                await client.publish(resend_topic(self.config.mqtt.prefix, site, node), encode(request), qos=1)
            except aiomqtt.MqttError as exc:
                log.info("could not ask %s/%s for its missing windows: %s", site, node, exc)
                break
            asked += 1
        self.resend_requests += asked
        return asked

    async def _resending(self) -> None:
        while True:
            await asyncio.sleep(self.resend_interval)
            try:
                await self.request_resends()
            except Exception:
                log.exception("asking nodes for missing windows failed; trying again next round")

    async def plan_once(self) -> list[Plan]:
        """Plan every site seen so far; publish and report each plan. A site whose planning fails keeps its
        previous plan and is counted and named; the other sites plan regardless."""
        snapshot = self.fleet.snapshot()
        plans = []
        owned = self.ownership.owned(snapshot.sites())
        for site in set(self.plans) - set(owned):  # planned by another optimizer now: its plan is the one to read
            del self.plans[site]
        for site in owned:
            try:
                plan = await self._plan_and_publish(snapshot, site)
            except Exception as exc:
                self.plan_failures[site] += 1
                first = site not in self.failing_sites  # the traceback once, not every round
                self.failing_sites[site] = _brief(exc)
                log.warning("planning site %s failed, keeping its previous plan: %s", site, _brief(exc), exc_info=first)
                continue
            self.failing_sites.pop(site, None)
            plans.append(plan)
        return plans

    async def _plan_and_publish(self, snapshot: Fleet, site: str) -> Plan:
        open_actions = await self._open_actions(site)
        # the site's applied moves teach its plans (no other site's nodes can), and are followed for a day
        done: list[Outcome] = await self.tracker.read(lambda db: db.outcomes(site)) if self.tracker is not None else []
        # features, classification and the solve all run off the event loop, so ingest goes on meanwhile
        fleet_snapshot, plan, excluded, observed = await asyncio.to_thread(
            self._plan_site, snapshot, site, open_actions, done
        )
        if observed and self.tracker is not None:
            try:
                await self.tracker.write(self.tracker.lifecycle.save_outcomes, observed)
            except sqlite3.Error as exc:  # a full disk: the plan stands, what was observed is observed again
                self._state_failed(exc)
        if excluded != self.excluded_nodes.get(site, {}):
            for node, why in sorted(excluded.items()):
                log.warning("site %s: planning without node %s (%s)", site, node, why)
        self.excluded_nodes[site] = excluded
        self._export(fleet_snapshot)
        self.plans[site] = plan
        self.plans_made += 1
        await self._publish(plan)
        if self.store is not None:
            self.store.add(plan_points(plan))
        await self._track(plan)
        self._handover_due.set()
        if self.on_plan is not None:
            self.on_plan(plan)
        return plan

    def health(self) -> dict[str, object]:
        """What /healthz reports beyond the broker: sites that fail to plan, nodes left out of planning, nodes
        whose births differ from their site's inventory, and a state directory that cannot keep state."""
        flagged: dict[str, dict[str, str]] = {}
        for (site, node), why in sorted(self.fleet.inventory_flags.items()):
            flagged.setdefault(site, {})[node] = why
        return {
            "failing_sites": dict(sorted(self.failing_sites.items())),
            "excluded_nodes": {s: dict(sorted(n.items())) for s, n in sorted(self.excluded_nodes.items()) if n},
            "inventory_mismatch": flagged,
            "state": self.state_problem(),
        }

    def state_problem(self) -> str | None:
        """Why recommendation states and the alert log are not being kept, or None when they are."""
        journal_error = self.alerter.journal_error if self.alerter is not None else None
        problems = [
            p for p in (self.lifecycle.problem if self.lifecycle else None, self.state_error, journal_error) if p
        ]
        return "; ".join(problems) or None

    def attach(self, server: Server) -> None:
        """Serve ``server`` while the optimizer runs (started after the tasks, stopped before the flush)."""
        self.servers.append(server)

    async def _track(self, plan: Plan) -> None:
        """Fold the plan into the recommendation lifecycle and hand what changed to the alert hooks."""
        resolved: list[tuple[Recommendation, RecState]] = []
        states: dict[str, RecState] = {}
        if self.tracker is not None:
            lifecycle = self.tracker.lifecycle
            # A workload the plan could not act on (unclassified or unsure, as after a restart, with few windows)
            # has not had its moves withdrawn: they stay open until it is judged again.
            sure = self.config.plan.min_confidence
            seen = {
                w.id: w.hardware
                for w in plan.workloads
                if w.workload_class is not WorkloadClass.UNKNOWN and w.confidence >= sure
            }
            ids = [r.id for r in plan.recommendations]
            try:
                resolved = await self.tracker.write(lifecycle.record, plan, seen)
                # decisions made on the optimizer that planned the site before (a takeover, or the owner back)
                decisions = self.handovers.decisions(plan.site)
                if decisions:
                    adopted = await self.tracker.write(lifecycle.adopt, plan.site, decisions)
                    self._adopted("decision", plan.site, len(adopted))
                states = await self.tracker.write(lifecycle.states, ids)
                if self.ledger is not None:
                    owners = owners_of(self.fleet, plan.site)
                    interval = self.config.optimizer.solve_interval
                    online = nodes_online(self.fleet, plan.site)  # nodes gone offline are not charged
                    await self.tracker.write(self.ledger.account, plan, owners, self.catalog, interval, online=online)
            except sqlite3.Error as exc:
                # a full disk or a failing one: the plan stands and its alerts go out, from the states still read
                self._state_failed(exc)
                with contextlib.suppress(sqlite3.Error):
                    states = await self.tracker.read(lambda db: db.states(ids))
            else:
                self._state_written()
        if self.alerter is not None:
            # what it posted, before this plan's moves are weighed for posting
            posts, settling = self.handovers.posts(plan), self.handovers.settling(plan)
            if posts or settling:
                posted, settled = self.alerter.adopt(plan.site, posts, settling)
                self._adopted("post", plan.site, posted)
                self._adopted("settling", plan.site, settled)
            self.alerter.observe(plan, states, resolved)

    def _adopted(self, what: str, site: str, count: int) -> None:
        if count:
            self.handovers.adopted[what] += count
            log.info("site %s: took %d %s(s) in from the optimizer that planned it before", site, count, what)

    async def publish_handover(self) -> int:
        """Publish the handover record of each site this optimizer plans, where it says something new since the
        last; returns how many were published."""
        client = self._client
        if client is None or not self.ownership.scoped or self.tracker is None:
            return 0
        published = 0
        for site in self.ownership.planning:
            if not self.ownership.owns(site):  # let go since the last round: the new owner's record is the one
                continue
            record = await self._handover_record(site)
            if record is None:
                continue
            topic = handover_topic(self.config.mqtt.prefix, site)
            try:
                await client.publish(topic, encode(record), qos=1, retain=True)
            except aiomqtt.MqttError as exc:
                log.info("could not hand site %s's state over: %s", site, _brief(exc))
                break
            self.handovers.sent(record)
            published += 1
        return published

    async def _handover_record(self, site: str) -> Handover | None:
        assert self.tracker is not None
        decisions = await self.tracker.read(lambda db: db.decisions(site, MAX_HANDOVER_ENTRIES))
        posts: list[tuple[str, str, Sent]] = []
        settling: dict[str, tuple[float, float, int]] = {}
        if self.alerter is not None:
            try:
                posts = self.alerter.journal.posts(site, MAX_HANDOVER_ENTRIES)
                settling = self.alerter.journal.settling(site, MAX_HANDOVER_ENTRIES)
            except sqlite3.Error as exc:
                log.warning("site %s: the alert log cannot be read for its handover: %s", site, _brief(exc))
        ids = {rec_id for _, rec_id, _ in posts}
        bodies = await self.tracker.read(lambda db: db.bodies(ids)) if ids else {}
        return self.handovers.build(site, decisions, posts, bodies, settling)

    async def _handing_over(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.handover_interval):
                    await self._handover_due.wait()
            self._handover_due.clear()
            try:
                await self.publish_handover()
            except Exception:
                log.exception("handing sites' state over failed; trying again next round")

    def _learned(self, fleet: Fleet, site: str, done: list[Outcome]) -> tuple[Catalog, list[Outcome], Learning]:
        """The catalog with what the site's applied moves taught, and its moves of the last day as now observed."""
        now = self.clock()
        followed = [
            observe(fleet, self.catalog, o, now)
            for o in done
            if o.site == site and o.applied_at >= now - OBSERVE_HOURS * 3600 - DIGEST_SECONDS
        ]
        fresh = {o.recommendation.id: o for o in followed}
        taught = learning(self.catalog, [fresh.get(o.recommendation.id, o) for o in done if o.site == site])
        learned = taught.of_site(site)
        if learned != self.learned.get(site, ()):
            for c in learned:
                log.info(
                    "site %s learned: %s work on %s runs %.2fx the catalog's speed against %s (%d move(s) to %d "
                    "node(s), %.0f h)",
                    site,
                    c.shape,
                    c.to_key,
                    c.factor,
                    c.from_key,
                    c.moves,
                    taught.nodes_of(site, c),
                    c.hours,
                )
            self.learned[site] = learned
        return self.catalog.with_corrections(learned), followed, taught

    async def _open_actions(self, site: str) -> list[Recommendation]:
        """The site's open actions, which the next plan keeps unless it finds clearly better: new or acknowledged
        in the lifecycle (so they survive a restart), else the last plan's."""
        if self.tracker is not None:
            tracked = await self.tracker.read(lambda lifecycle: lifecycle.list(site))
            return [t.recommendation for t in tracked]
        last = self.plans.get(site)
        return list(last.recommendations) if last is not None else []

    async def flush_alerts(self, when: str) -> None:
        """Post what the alert hooks have gathered now, for at most ``[alerts] flush_timeout`` seconds."""
        if self.alerter is None:
            return
        try:
            await asyncio.wait_for(self.alerter.flush(), timeout=self.config.alerts.flush_timeout)
        except TimeoutError:
            log.warning("alerts still unsent %s: %d action(s)", when, self.alerter.pending)

    def _state_failed(self, exc: sqlite3.Error) -> None:
        first = self.state_error is None
        self.state_error = f"cannot write recommendation states: {_brief(exc)}"
        self.state_write_failures += 1
        if first:
            log.error("%s; planning and alerts go on, states are not kept until writes succeed", self.state_error)

    def _state_written(self) -> None:
        if self.state_error is not None:
            log.warning("recommendation states written again after %d failed round(s)", self.state_write_failures)
            self.state_error = None

    def _plan_site(
        self,
        fleet: Fleet,
        site: str,
        open_actions: Sequence[Recommendation] = (),
        done: list[Outcome] | None = None,
    ) -> tuple[Snapshot, Plan, dict[str, str], list[Outcome]]:
        began = time.thread_time()  # this worker thread's CPU: features, classification and a 1-worker solve
        try:
            return self._planned(fleet, site, open_actions, done or [])
        finally:
            # What the plan held and let go (features' figures, the snapshot's models, the solver's) stays in the C
            # heap for later use unless handed back: at 2,000 nodes hundreds of MiB held between rounds for nothing.
            # Here, once the plan's own references are gone; glibc trims every thread's arena, this one's too.
            trim()
            self.plan_cpu_seconds += time.thread_time() - began

    def _planned(
        self, fleet: Fleet, site: str, open_actions: Sequence[Recommendation], done: list[Outcome]
    ) -> tuple[Snapshot, Plan, dict[str, str], list[Outcome]]:
        catalog, followed, taught = self._learned(fleet, site, done)
        pinned = self.config.plan.pinned
        excluded: dict[str, str] = {}
        estimated: Counter[tuple[str, str]] = Counter()
        try:
            fleet_snapshot = from_fleet(fleet, site, pinned, excluded, estimated)
        except Exception:
            # Some node's data breaks the snapshot: find which, one node at a time, and plan without them.
            for name in sorted(node for s, node in fleet.nodes if s == site):
                alone = Fleet(fleet.prefix, fleet.horizon)
                alone.nodes[(site, name)] = fleet.nodes[(site, name)]
                try:
                    from_fleet(alone, site, pinned, {})
                except Exception as exc:
                    excluded[name] = f"error: {_brief(exc)}"
            if not excluded:
                raise
            rest = Fleet(fleet.prefix, fleet.horizon)
            rest.nodes = {k: r for k, r in fleet.nodes.items() if not (k[0] == site and k[1] in excluded)}
            estimated.clear()
            fleet_snapshot = from_fleet(rest, site, pinned, excluded, estimated)
        if estimated != self.share_estimates.get(site, Counter()):
            for (node, reason), count in sorted(estimated.items()):
                log.warning(
                    "site %s: node %s: %d GPU device(s) with an unreadable %s; share estimated",
                    site,
                    node,
                    count,
                    reason,
                )
        self.share_estimates[site] = estimated
        plan = plan_snapshot(fleet_snapshot, catalog, self.config.plan, stop=self.solve_stop, open_actions=open_actions)
        misses = missed(followed, taught.outliers)
        if misses:
            plan = plan.model_copy(update={"findings": [*plan.findings, *misses]})
        return fleet_snapshot, plan, excluded, followed

    def _export(self, fleet_snapshot: Snapshot) -> None:
        """Leave the live snapshot in the state directory for `fleetfit plan` what-if runs (daemon only)."""
        directory = self.config.optimizer.state_dir
        if self.lifecycle is None or not directory.is_dir():
            return
        path = directory / f"snapshot-{fleet_snapshot.site}.json"
        try:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(fleet_snapshot.model_dump_json(by_alias=True, indent=1))
            tmp.replace(path)
        except OSError as exc:
            log.warning("could not write %s: %s", path, exc)

    async def _publish(self, plan: Plan) -> None:
        client = self._client
        if client is None:
            return
        try:
            await client.publish(
                recommendations_topic(self.config.mqtt.prefix, plan.site), encode(plan), qos=1, retain=True
            )
        except aiomqtt.MqttError as exc:
            log.warning("could not publish the plan for %s: %s", plan.site, exc)

    async def _planning(self) -> None:
        while True:
            await asyncio.sleep(self.plan_wait)
            spent, began = self.plan_cpu_seconds, time.monotonic()
            try:
                await self.plan_once()
            except Exception:
                log.exception("planning failed; keeping the previous plan")
            self._pace(self.plan_cpu_seconds - spent, time.monotonic() - began)

    def _pace(self, cpu: float, wall: float) -> None:
        """Space the next round so that planning takes at most ``plan_cpu_share`` of a core on average: a round
        that took ``cpu`` seconds of CPU over ``wall`` seconds is followed by at least ``cpu / share - wall`` of
        rest. Ingest shares the process; at thousands of nodes a round every solve_interval would crowd it out."""
        settings = self.config.optimizer
        wait = max(settings.solve_interval, cpu / settings.plan_cpu_share - wall)
        stretched = wait > settings.solve_interval * 1.1  # told when it starts and ends, not at every wobble
        if stretched != self._stretched:
            if stretched:
                log.info(
                    "a round of plans took %.1f s of CPU: resting %.0f s between rounds rather than solve_interval's "
                    "%g s, so that planning takes at most %g%% of a core (optimizer.plan_cpu_share)",
                    cpu,
                    wait,
                    settings.solve_interval,
                    settings.plan_cpu_share * 100,
                )
            else:
                log.info("rounds of plans rest solve_interval's %g s again", settings.solve_interval)
            self._stretched = stretched
        self.plan_wait = wait

    async def run(self) -> None:
        """Run until ``should_exit`` is set, or until one of the long-lived tasks dies (``failed`` says which:
        the caller exits non-zero so that systemd restarts the daemon). Shutdown always flushes."""
        tasks = [
            asyncio.create_task(self._ingest(), name="optimizer-ingest"),
            asyncio.create_task(self._planning(), name="optimizer-planning"),
        ]
        if self.config.optimizer.request_resends:
            tasks.append(asyncio.create_task(self._resending(), name="optimizer-resend"))
        if self.store is not None:
            tasks.append(asyncio.create_task(self.store.run(), name="optimizer-store"))
        if self.alerter is not None:
            tasks.append(asyncio.create_task(self.alerter.run(), name="optimizer-alerts"))
        if self.ownership.scoped and self.tracker is not None:
            tasks.append(asyncio.create_task(self._handing_over(), name="optimizer-handover"))
        if self.feed is not None:
            tasks.append(asyncio.create_task(self.feed.run(), name="optimizer-prometheus"))
        tasks.append(asyncio.create_task(self._watch(list(tasks)), name="optimizer-watchdog"))
        try:
            for server in self.servers:
                await server.start()
            self.notifier.ready()
            await self.should_exit.wait()
        finally:
            self.notifier.stopping()
            await self._shutdown(tasks)

    async def _watch(self, tasks: list[asyncio.Task[None]]) -> None:
        """Ping systemd's watchdog while every task runs; a task that ends (none should) stops the daemon."""
        while True:
            dead = [t for t in tasks if t.done()]
            if dead:
                task = dead[0]
                error = None if task.cancelled() else task.exception()
                why = "ended" if error is None else f"died: {_brief(error)}"
                self.failed = f"task {task.get_name()} {why}"
                log.error("%s; stopping so that the service manager restarts the optimizer", self.failed)
                self.should_exit.set()
                return
            self.notifier.watchdog(time.monotonic())
            await asyncio.sleep(1.0)

    async def _shutdown(self, tasks: list[asyncio.Task[None]]) -> None:
        """Stop the tasks, then flush the lifecycle, alerts and store: each step runs whatever the one before did.
        Alerts gathered are posted and each site's state handed over while the broker connection stands, and only
        then does the optimizer say it leaves: its standbys take over from where it stopped."""
        self.solve_stop.stop()  # a plan still solving in its thread would hold the process's exit
        if self._intake is not None:  # what is not taken in yet stays with the broker, for the next session
            self._intake.stop()
        ingest = [t for t in tasks if t.get_name() == "optimizer-ingest"]
        await _stop(t for t in tasks if t not in ingest)
        try:
            await self.flush_alerts("at shutdown")  # what was gathered but not yet posted goes out now, within bounds
        except Exception as exc:
            log.warning("at shutdown, could not post pending alerts: %s", _brief(exc))
        try:
            await asyncio.wait_for(self.publish_handover(), 5)
        except Exception as exc:
            log.warning("at shutdown, could not hand the sites' state over: %s", _brief(exc))
        await self._leave()
        await _stop(ingest)
        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            *((f"stop {type(s).__name__}", s.stop) for s in self.servers),
        ]
        if self.tracker is not None:
            tracker = self.tracker
            steps.append(("close the recommendation state", lambda: asyncio.to_thread(tracker.close)))
        if self.ledger is not None:
            ledger = self.ledger
            steps.append(("close the showback ledger", lambda: asyncio.to_thread(ledger.close)))
        if self.alerter is not None:
            alerter = self.alerter
            steps.append(("close the alert log", alerter.close))
        if self.store is not None:
            steps.append(("flush the store", self._flush_store))
        for what, step in steps:
            try:
                await step()
            except Exception as exc:
                log.warning("at shutdown, could not %s: %s", what, _brief(exc))
        self.notifier.close()

    async def _flush_store(self) -> None:
        assert self.store is not None
        try:
            await self.store.flush(5.0)
        finally:
            self.store.close()


async def _stop(tasks: Iterable[asyncio.Task[None]], every: float = 0.5) -> None:
    """Cancel ``tasks`` and wait for each to end, cancelling again any that swallowed the cancellation (Python
    3.11's asyncio.wait_for can, inside a client library): a shutdown never hangs on one."""
    stopping = list(tasks)
    for t in stopping:
        t.cancel()
    pending = {t for t in stopping if not t.done()}
    while pending:
        _, pending = await asyncio.wait(pending, timeout=every)
        for t in pending:
            t.cancel()
    for t in stopping:
        if t.cancelled():
            continue
        exc = t.exception()
        if exc is not None:  # it died before shutdown: already told, and no reason to skip the flush
            log.warning("task %s had stopped: %s", t.get_name(), _brief(exc))


def ingest_limits(config: OptimizerConfig, catalog: Catalog) -> IngestLimits:
    """What the live optimizer holds each node to, from its settings."""
    settings = config.optimizer
    inventories = load_inventories(config.sites, catalog)
    return IngestLimits(
        clock_skew=settings.max_clock_skew,
        time_rate=settings.node_time_rate,
        replay_seconds=settings.node_replay_seconds,
        refusal_rate=settings.node_refusal_rate,
        refusal_burst=settings.node_refusal_burst,
        control_rate=settings.node_birth_rate,
        control_burst=settings.node_birth_burst,
        workloads_per_node=settings.max_workloads_per_node,
        inventory=inventory_check(catalog, settings.max_gpus_per_node),
        site_inventory=inventories.reconcile if inventories else None,
    )


def _brief(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:200]


def tune_gc() -> None:
    """Collect young objects far less often.

    The optimizer holds every node's recent windows (hundreds of objects each); with the default thresholds
    Python's cyclic collector rescans them so often that it costs twice the validation itself. Windows form no
    reference cycles and are freed by reference counting, so rarer collections cost nothing in memory.
    """
    gc.collect()
    gc.freeze()  # what exists at start (modules, catalog) never needs scanning again
    gc.set_threshold(50_000, 20, 100)


async def serve(optimizer: Optimizer, notifier: Notifier | None = None) -> None:
    """Run ``optimizer`` under SIGTERM/SIGINT (and systemd's notify protocol and watchdog, with ``notifier``)."""
    tune_gc()
    if notifier is not None:
        optimizer.notifier = notifier
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()

    def on_signal(sig: signal.Signals) -> None:
        if optimizer.should_exit.is_set() and task is not None:  # a second signal: stop waiting on anything
            log.warning("second %s: exiting now", sig.name)
            task.cancel()
            return
        optimizer.should_exit.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await optimizer.run()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
