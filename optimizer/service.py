"""The optimizer daemon: ingest telemetry from MQTT, plan every ``solve_interval``, publish each site's plan
retained on ``{prefix}/{site}/recommendations`` and hand it to the caller."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Callable
from typing import Protocol

import aiomqtt

from agent.backoff import Backoff
from agent.metrics import Family
from agent.mqtt import make_client
from agent.protocol import Plan, Recommendation, Telemetry, encode, recommendations_topic, subscription_filters
from optimizer.alerts.alerter import Alerter
from optimizer.catalog import Catalog
from optimizer.config import OptimizerConfig
from optimizer.fleet import Fleet
from optimizer.lifecycle import Lifecycle, Offloaded, RecState
from optimizer.recommend import plan_snapshot
from optimizer.report import Ledger, owners_of
from optimizer.selfmetrics import Lag, optimizer_metrics
from optimizer.snapshot import Snapshot, from_fleet
from optimizer.store import Store, plan_points, window_points

log = logging.getLogger(__name__)


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
    ) -> None:
        self.config = config
        self.catalog = catalog.with_prices(config.prices)
        self.fleet = Fleet(config.mqtt.prefix, config.optimizer.horizon_windows)
        self.plans: dict[str, Plan] = {}
        self.on_plan = on_plan
        self.should_exit = asyncio.Event()
        self.connected = asyncio.Event()
        self._client: aiomqtt.Client | None = None
        self._backoff = Backoff(cap=config.mqtt.reconnect_max_delay)
        self.store = store if store is not None else (Store(config.influxdb) if config.influxdb.url else None)
        self.lifecycle = lifecycle
        self.tracker = Offloaded(lifecycle) if lifecycle is not None else None  # the lifecycle, off the loop
        self.ledger = Ledger(lifecycle.path) if lifecycle is not None else None  # showback, written by tracker
        self.servers: list[Server] = []
        self.alerter = alerter
        self.plans_made = 0
        self.lag = Lag()

    async def _ingest(self) -> None:
        settings = self.config.mqtt
        while True:
            try:
                async with make_client(
                    settings,
                    self.config.optimizer.client_id,
                    max_queued_incoming=self.config.optimizer.max_queued_messages,
                ) as client:
                    for topic_filter in subscription_filters(settings.prefix, self.config.optimizer.shared_group):
                        await client.subscribe(topic_filter, qos=1)
                    self._client = client
                    self._backoff.reset()
                    self.connected.set()
                    log.info("subscribed to %s/# on %s:%d", settings.prefix, settings.host, settings.port)
                    async for message in client.messages:
                        payload = message.payload
                        if not isinstance(payload, bytes | bytearray):
                            payload = str(payload).encode() if payload is not None else b""
                        accepted = self.fleet.ingest(str(message.topic), payload)
                        if isinstance(accepted, Telemetry):
                            self.lag.add(time.time() - accepted.end)
                            if self.store is not None:
                                record = self.fleet.record(accepted.site, accepted.node)
                                self.store.add(window_points(record.birth if record else None, accepted))
            except aiomqtt.MqttError as exc:
                self.connected.clear()
                self._client = None
                delay = self._backoff.next_delay()
                log.warning(
                    "broker %s:%d: connection lost (%s); reconnecting in %.1f s",
                    settings.host,
                    settings.port,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)

    async def plan_once(self) -> list[Plan]:
        """Plan every site seen so far; publish and report each plan."""
        snapshot = self.fleet.snapshot()
        plans = []
        for site in snapshot.sites():
            # features, classification and the solve all run off the event loop, so ingest goes on meanwhile
            fleet_snapshot, plan = await asyncio.to_thread(self._plan_site, snapshot, site)
            self._export(fleet_snapshot)
            self.plans[site] = plan
            self.plans_made += 1
            plans.append(plan)
            await self._publish(plan)
            if self.store is not None:
                self.store.add(plan_points(plan))
            await self._track(plan)
            if self.on_plan is not None:
                self.on_plan(plan)
        return plans

    def self_metrics(self) -> list[Family]:
        return optimizer_metrics(self)

    def attach(self, server: Server) -> None:
        """Serve ``server`` while the optimizer runs (started after the tasks, stopped before the flush)."""
        self.servers.append(server)

    async def _track(self, plan: Plan) -> None:
        """Fold the plan into the recommendation lifecycle and hand what changed to the alert hooks."""
        resolved: list[tuple[Recommendation, RecState]] = []
        states: dict[str, RecState] = {}
        if self.tracker is not None:
            lifecycle = self.tracker.lifecycle
            resolved = await self.tracker.write(lifecycle.record, plan, {w.id: w.hardware for w in plan.workloads})
            states = await self.tracker.write(lifecycle.states, [r.id for r in plan.recommendations])
            if self.ledger is not None:
                owners = owners_of(self.fleet, plan.site)
                interval = self.config.optimizer.solve_interval
                await self.tracker.write(self.ledger.account, plan, owners, self.catalog, interval)
        if self.alerter is not None:
            self.alerter.observe(plan, states, resolved)

    def _plan_site(self, fleet: Fleet, site: str) -> tuple[Snapshot, Plan]:
        fleet_snapshot = from_fleet(fleet, site, self.config.plan.pinned)
        return fleet_snapshot, plan_snapshot(fleet_snapshot, self.catalog, self.config.plan)

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
        interval = self.config.optimizer.solve_interval
        while True:
            await asyncio.sleep(interval)
            try:
                await self.plan_once()
            except Exception:
                log.exception("planning failed; keeping the previous plan")

    async def run(self) -> None:
        """Run until ``should_exit`` is set."""
        tasks = [
            asyncio.create_task(self._ingest(), name="optimizer-ingest"),
            asyncio.create_task(self._planning(), name="optimizer-planning"),
        ]
        if self.store is not None:
            tasks.append(asyncio.create_task(self.store.run(), name="optimizer-store"))
        if self.alerter is not None:
            tasks.append(asyncio.create_task(self.alerter.run(), name="optimizer-alerts"))
        for server in self.servers:
            await server.start()
        try:
            await self.should_exit.wait()
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            for server in self.servers:
                await server.stop()
            if self.tracker is not None:
                await asyncio.to_thread(self.tracker.close)
            if self.ledger is not None:
                self.ledger.close()
            if self.alerter is not None:
                try:  # what was gathered but not yet posted goes out now, within bounds
                    await asyncio.wait_for(self.alerter.flush(), timeout=self.config.alerts.flush_timeout)
                except TimeoutError:
                    log.warning("alerts still unsent at shutdown: %d move(s)", self.alerter.pending)
                await self.alerter.close()
            if self.store is not None:
                await self.store.flush(5.0)
                self.store.close()


def tune_gc() -> None:
    """Collect young objects far less often.

    The optimizer holds every node's recent windows (hundreds of objects each); with the default thresholds
    Python's cyclic collector rescans them so often that it costs twice the validation itself. Windows form no
    reference cycles and are freed by reference counting, so rarer collections cost nothing in memory.
    """
    gc.collect()
    gc.freeze()  # what exists at start (modules, catalog) never needs scanning again
    gc.set_threshold(50_000, 20, 100)


async def serve(optimizer: Optimizer) -> None:
    """Run ``optimizer`` under SIGTERM/SIGINT."""
    tune_gc()
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
