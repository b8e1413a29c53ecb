"""``fleetfit demo``: an embedded broker, a simulated fleet with planted misplacements and the optimizer, all
in one process. Simulated time runs ``time_scale`` times faster so minutes of telemetry pass in seconds.

The optimizer releases idle allocations and resizes services only on a day of load history (the plan setting
``history_min_hours``, 24 by default), which it keeps as 10-minute digests (optimizer/ingest/history.py). A real
deployment has that day because the optimizer has been running for it; the demo cannot wait a day, so each
simulated agent starts with the last ``history`` seconds of its node in its queue, as an agent restarted after
an outage starts with its spool, and publishes them after its birth, before its live windows. The optimizer
ingests them as it does any replay, through MQTT and within its per-node burst (360 windows): the day is
thinned to one 10 s window per 10-minute digest (agent.simulate.past_windows), since building every second
of a day for every node would take minutes. The busiest part of the day, the services' daily peak, is where the
live run starts, and comes in full.

Chat receivers get one message each, when the run ends: the final plan's actions, all of them, as the terminal
and the console list them. The demo's plans change while its history is still arriving (classes firm up as
windows come in, a day of history turns a move of an idle allocation into its release), far faster than a
deployment's, whose plans come a minute apart from telemetry that has been arriving all along; posting as the run
goes would post moves a later plan withdraws. So the demo gathers for the whole run (``group_wait``; each plan
drops from the gathering message what it no longer proposes) and posts after its final plan, which no later plan
can withdraw (``settle_plans``: 1, no minimum time)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.clock import Clock
from agent.config import MqttSettings
from agent.protocol import Plan
from agent.simulate import SimulatedFleet
from collectors.sim.scenarios import ScenarioNode, build_scenario, rest_of_node
from optimizer.commands.demostate import DemoState, demo_state
from optimizer.decide.catalog import load_catalog
from optimizer.plan.recommend import PlanSettings
from optimizer.serve import tokens
from optimizer.serve.alerts.alerter import Alerter
from optimizer.serve.alerts.settings import AlertSettings, ReceiverSettings
from optimizer.serve.broker import EmbeddedBroker
from optimizer.serve.config import ApiSettings, OptimizerConfig, OptimizerSettings
from optimizer.serve.lifecycle import Lifecycle
from optimizer.serve.service import Optimizer
from optimizer.serve.web.app import WebServer

log = logging.getLogger(__name__)

DEMO_SITE = "demo"
DEMO_FLUSH_TIMEOUT = 5.0  # seconds the demo's last alerts may take at the end: an unreachable hook must not hold it
DEMO_GROUP_WAIT = 3600.0  # longer than any run: the demo posts once, after its final plan (see above)
DEMO_SETTLE_PLANS = 1  # the final plan's actions are posted, all of them: no later plan withdraws one
DEMO_HISTORY = 25.5 * 3600.0  # a day and a bit: the digests must span the 24 h that releasing and resizing wait for


@dataclass(frozen=True, slots=True)
class DemoOptions:
    nodes: int = 13
    duration: float = 25.0  # seconds of live telemetry, after the fleet's history is queued
    seed: int = 1
    time_scale: float = 10.0
    solve_interval: float = 5.0
    webhooks: tuple[tuple[str, str], ...] = ()  # (kind, url) pairs the recommendations are posted to
    console: bool = True  # serve the console on 127.0.0.1
    console_port: int = 0  # 0: a free port
    keep_serving: bool = False  # after the run, keep the console up until SIGINT/SIGTERM
    history: float = DEMO_HISTORY  # seconds of each node's past its agent replays before going live
    state_dir: Path | None = None  # None: the demo's own directory (optimizer/commands/demostate.py)


ConsoleReady = Callable[[str, str], None]  # (the console's URL, the token its buttons need)
StateReady = Callable[[DemoState], None]  # where the run keeps its state, for the commands that read it


def _alerting(webhooks: tuple[tuple[str, str], ...], state_dir: Path) -> Alerter | None:
    """Alert hooks with their log in the run's state directory when webhooks were given, else none.

    The URLs travel in this process's environment, as a configured receiver's would, so they never sit in
    settings that could be printed."""
    if not webhooks:
        return None
    receivers = []
    for n, (kind, url) in enumerate(webhooks):
        variable = f"FLEETFIT_DEMO_WEBHOOK_{n}"
        os.environ[variable] = url
        receivers.append(ReceiverSettings(name=f"demo-{kind}-{n}", kind=kind, url_env=variable))
    settings = AlertSettings(
        receivers=receivers,
        group_wait=DEMO_GROUP_WAIT,
        settle_seconds=0.0,
        settle_plans=DEMO_SETTLE_PLANS,
        retry_initial=0.5,
        max_attempts=4,
        timeout=DEMO_FLUSH_TIMEOUT,
    )
    return Alerter.in_state_dir(settings, state_dir)


async def run_demo(
    options: DemoOptions,
    on_plan: Callable[[Plan], None] | None = None,
    on_console: ConsoleReady | None = None,
    on_state: StateReady | None = None,
    on_final: Callable[[Plan], None] | None = None,
) -> Plan | None:
    """Run the demo for ``options.duration`` seconds once the fleet is live (or until SIGINT/SIGTERM); return the
    final plan. ``on_final`` hears of it as soon as it is made, before the console stays up (``keep_serving``).
    DemoStateError: the chosen state directory cannot be used."""
    nodes = build_scenario("demo", options.nodes, options.seed)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set() and task is not None:  # a second signal: leave now, whatever is still pending
            log.warning("second %s: exiting now", sig.name)
            task.cancel()
            return
        log.info("%s received: stopping (a second one exits at once)", sig.name)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        with demo_state(options.state_dir) as state:
            if on_state is not None:
                on_state(state)
            return await _run(options, nodes, stop, state.path, on_plan, on_console, on_final)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _run(
    options: DemoOptions,
    nodes: list[ScenarioNode],
    stop: asyncio.Event,
    state_dir: Path,
    on_plan: Callable[[Plan], None] | None,
    on_console: ConsoleReady | None = None,
    on_final: Callable[[Plan], None] | None = None,
) -> Plan | None:
    async with EmbeddedBroker() as broker:
        log.info("embedded broker on %s:%d", broker.host, broker.port)
        mqtt = MqttSettings(host=broker.host, port=broker.port, protocol="3.1.1", reconnect_max_delay=2.0)
        config = OptimizerConfig(
            mqtt=mqtt,
            optimizer=OptimizerSettings(
                solve_interval=options.solve_interval,
                horizon_windows=60,
                state_dir=state_dir,
                # simulated time runs faster: windows come more often and their timestamps run ahead of now
                node_time_rate=OptimizerSettings().node_time_rate * max(1.0, options.time_scale),
                max_clock_skew=86_400.0 * max(1.0, options.time_scale),
            ),
            plan=PlanSettings(time_limit=5.0),
            alerts=AlertSettings(flush_timeout=DEMO_FLUSH_TIMEOUT),
        )
        # recommendation states (the console's buttons, `fleetfit recommendations`) and the ledger (`fleetfit
        # report`), where the other commands can read them
        lifecycle = Lifecycle.in_state_dir(state_dir)
        alerter = _alerting(options.webhooks, state_dir)
        optimizer = Optimizer(config, load_catalog(), on_plan=on_plan, lifecycle=lifecycle, alerter=alerter)
        console = _console(optimizer, options)
        if console is not None:
            await console[0].start()
            if on_console is not None:
                on_console(console[0].url, console[1])
        optimizer_task = asyncio.create_task(optimizer.run(), name="optimizer")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(optimizer.connected.wait(), timeout=10)
        fleet_task: asyncio.Task[None] | None = None
        try:
            fleet = SimulatedFleet(
                nodes, mqtt, site=DEMO_SITE, clock=Clock(options.time_scale), seed=options.seed, history=options.history
            )
            names = {w.id: w.name for n in nodes for w in n.workloads}
            log.info(
                "simulating %d nodes at %gx real time; planted misplacements: %s; GPUs waiting on the rest of "
                "their node: %s",
                len(nodes),
                options.time_scale,
                ", ".join(sorted(w.name for n in nodes for w in n.workloads if w.id in n.misplaced)),
                ", ".join(
                    sorted(f"{names[wid]} ({kind.value})" for n in nodes for wid, kind in rest_of_node(n).items())
                ),
            )
            fleet_task = asyncio.create_task(fleet.run(stop), name="fleet")
            await _first(stop.wait(), fleet.live.wait(), fleet_task)  # the duration counts from when the fleet is live
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=options.duration)
            interrupted = stop.is_set()
            stop.set()
            await fleet_task
            await _ingested(optimizer, sum(a.link.published for a in fleet.agents))
            final = {p.site: p for p in await optimizer.plan_once()}.get(DEMO_SITE)
            if console is not None and options.keep_serving and not interrupted:
                await optimizer.flush_alerts("at the end of the run")  # the final plan's settled moves (see above)
                if on_final is not None and final is not None:
                    on_final(final)
                stop.clear()
                log.info("the run is over; the console stays up until Ctrl-C")
                await stop.wait()
            optimizer.should_exit.set()
            await optimizer_task  # posts the alerts still gathering: the final plan's settled moves (see above)
        except asyncio.CancelledError:  # a second signal: leave now, without the final plan or the last alerts
            running = [t for t in (fleet_task, optimizer_task) if t is not None]
            for t in running:
                t.cancel()
            await asyncio.sleep(0.05)  # into their clean-up
            for t in running:
                t.cancel()  # again: cuts short the optimizer's flush of the alerts still gathering
            await asyncio.gather(*running, return_exceptions=True)
            raise
        if console is not None:
            await console[0].stop()
        lifecycle.close()
        # a round of planning that began before the run ended may finish after the final plan: it is older
        return final or optimizer.plans.get(DEMO_SITE)


async def _ingested(optimizer: Optimizer, published: int, stall: float = 5.0) -> None:
    """Wait until the optimizer has taken in as many windows as the agents published, so that the final plan
    counts every one of them: as long as it keeps taking them in (a day of history per node is a backlog on a
    busy machine), and at most ``stall`` seconds without progress."""

    def taken() -> int:
        return optimizer.fleet.accepted["telemetry"] + sum(optimizer.fleet.rejected.values())

    last, since = taken(), time.monotonic()
    while (now := taken()) < published:
        if now > last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > stall:
            log.warning("the final plan misses %d window(s) the optimizer has not taken in", published - now)
            return
        await asyncio.sleep(0.1)


async def _first(*waits: Coroutine[Any, Any, object] | asyncio.Task[None]) -> None:
    """Wait until any of ``waits`` is done; cancel the coroutines' tasks that are not (tasks given are left)."""
    made = [asyncio.ensure_future(w) for w in waits if not isinstance(w, asyncio.Task)]
    given = [w for w in waits if isinstance(w, asyncio.Task)]
    try:
        await asyncio.wait([*made, *given], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in made:
            task.cancel()


def _console(optimizer: Optimizer, options: DemoOptions) -> tuple[WebServer, str] | None:
    """The console on 127.0.0.1 with a fresh token for its buttons, held by an admin named ``demo`` (a tokens file
    of its own beside the demo's state, made afresh each run)."""
    if not options.console:
        return None
    tracker = optimizer.tracker
    if tracker is None:  # no state directory: the old shared token (with its warning) is all there is
        token = secrets.token_urlsafe(12)
        return WebServer(optimizer, ApiSettings(listen="127.0.0.1", port=options.console_port, token=token)), token
    path = tracker.lifecycle.path.parent / "demo-tokens"
    path.unlink(missing_ok=True)
    token = tokens.add(path, "demo", tokens.Role.ADMIN)
    settings = ApiSettings(listen="127.0.0.1", port=options.console_port, tokens_file=path)
    return WebServer(optimizer, settings), token
