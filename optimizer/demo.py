"""``fleetfit demo``: an embedded broker, a simulated fleet with planted misplacements and the optimizer, all
in one process. Simulated time runs ``time_scale`` times faster so minutes of telemetry pass in seconds."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.clock import Clock
from agent.config import MqttSettings
from agent.protocol import Plan
from agent.simulate import SimulatedFleet
from collectors.scenarios import ScenarioNode, build_scenario
from optimizer.alerts.alerter import Alerter
from optimizer.alerts.settings import AlertSettings, ReceiverSettings
from optimizer.broker import EmbeddedBroker
from optimizer.catalog import load_catalog
from optimizer.config import ApiSettings, OptimizerConfig, OptimizerSettings
from optimizer.lifecycle import Lifecycle
from optimizer.recommend import PlanSettings
from optimizer.service import Optimizer
from optimizer.web.app import WebServer

log = logging.getLogger(__name__)

DEMO_SITE = "demo"
DEMO_FLUSH_TIMEOUT = 5.0  # seconds the demo's last alerts may take at the end: an unreachable hook must not hold it


@dataclass(frozen=True, slots=True)
class DemoOptions:
    nodes: int = 10
    duration: float = 45.0
    seed: int = 1
    time_scale: float = 10.0
    solve_interval: float = 5.0
    webhooks: tuple[tuple[str, str], ...] = ()  # (kind, url) pairs the recommendations are posted to
    console: bool = True  # serve the console on 127.0.0.1
    console_port: int = 0  # 0: a free port
    keep_serving: bool = False  # after the run, keep the console up until SIGINT/SIGTERM


ConsoleReady = Callable[[str, str], None]  # (the console's URL, the token its buttons need)


def _alerting(webhooks: tuple[tuple[str, str], ...], state_dir: Path) -> tuple[Lifecycle | None, Alerter | None]:
    """A lifecycle and alert hooks in a throw-away state directory when webhooks were given, else neither.

    The URLs travel in this process's environment, as a configured receiver's would, so they never sit in
    settings that could be printed."""
    if not webhooks:
        return None, None
    receivers = []
    for n, (kind, url) in enumerate(webhooks):
        variable = f"FLEETFIT_DEMO_WEBHOOK_{n}"
        os.environ[variable] = url
        receivers.append(ReceiverSettings(name=f"demo-{kind}-{n}", kind=kind, url_env=variable))
    settings = AlertSettings(
        receivers=receivers, group_wait=3.0, retry_initial=0.5, max_attempts=4, timeout=DEMO_FLUSH_TIMEOUT
    )
    return Lifecycle.in_state_dir(state_dir), Alerter.in_state_dir(settings, state_dir)


async def run_demo(
    options: DemoOptions, on_plan: Callable[[Plan], None] | None = None, on_console: ConsoleReady | None = None
) -> Plan | None:
    """Run the demo for ``options.duration`` seconds (or until SIGINT/SIGTERM); return the final plan."""
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
        with tempfile.TemporaryDirectory(prefix="fleetfit-demo-") as state:
            return await _run(options, nodes, stop, Path(state), on_plan, on_console)
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
                node_window_rate=0.2 * max(1.0, options.time_scale),
                max_clock_skew=86_400.0 * max(1.0, options.time_scale),
            ),
            # the demo's fleet is minutes old: it releases and resizes on what it has seen, not on a day of it
            plan=PlanSettings(time_limit=5.0, history_min_hours=0),
            alerts=AlertSettings(flush_timeout=DEMO_FLUSH_TIMEOUT),
        )
        lifecycle, alerter = _alerting(options.webhooks, state_dir)
        if lifecycle is None and options.console:  # the console's buttons keep their state here
            lifecycle = Lifecycle.in_state_dir(state_dir)
        optimizer = Optimizer(config, load_catalog(), on_plan=on_plan, lifecycle=lifecycle, alerter=alerter)
        console = _console(optimizer, options)
        if console is not None:
            await console[0].start()
            if on_console is not None:
                on_console(console[0].url, console[1])
        optimizer_task = asyncio.create_task(optimizer.run(), name="optimizer")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(optimizer.connected.wait(), timeout=10)
        fleet = SimulatedFleet(nodes, mqtt, site=DEMO_SITE, clock=Clock(options.time_scale), seed=options.seed)
        log.info(
            "simulating %d nodes at %gx real time; planted misplacements: %s",
            len(nodes),
            options.time_scale,
            ", ".join(sorted(w.name for n in nodes for w in n.workloads if w.id in n.misplaced)),
        )
        fleet_task = asyncio.create_task(fleet.run(stop), name="fleet")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=options.duration)
        interrupted = stop.is_set()
        stop.set()
        await fleet_task
        await optimizer.plan_once()
        if console is not None and options.keep_serving and not interrupted:
            stop.clear()
            log.info("the run is over; the console stays up until Ctrl-C")
            await stop.wait()
        optimizer.should_exit.set()
        await optimizer_task  # posts the alerts still gathering
        if console is not None:
            await console[0].stop()
        if lifecycle is not None:
            lifecycle.close()
        return optimizer.plans.get(DEMO_SITE)


def _console(optimizer: Optimizer, options: DemoOptions) -> tuple[WebServer, str] | None:
    """The console on 127.0.0.1 with a fresh token for its buttons (the demo's state is thrown away)."""
    if not options.console:
        return None
    token = secrets.token_urlsafe(12)
    settings = ApiSettings(listen="127.0.0.1", port=options.console_port, token=token)
    return WebServer(optimizer, settings), token
