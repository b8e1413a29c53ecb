"""``fleetfit demo``: an embedded broker, a simulated fleet with planted misplacements and the optimizer, all
in one process. Simulated time runs ``time_scale`` times faster so minutes of telemetry pass in seconds."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass

from agent.clock import Clock
from agent.config import MqttSettings
from agent.protocol import Plan
from agent.simulate import SimulatedFleet
from collectors.scenarios import build_scenario
from optimizer.broker import EmbeddedBroker
from optimizer.catalog import load_catalog
from optimizer.config import OptimizerConfig, OptimizerSettings
from optimizer.recommend import PlanSettings
from optimizer.service import Optimizer

log = logging.getLogger(__name__)

DEMO_SITE = "demo"


@dataclass(frozen=True, slots=True)
class DemoOptions:
    nodes: int = 10
    duration: float = 45.0
    seed: int = 1
    time_scale: float = 10.0
    solve_interval: float = 5.0


async def run_demo(options: DemoOptions, on_plan: Callable[[Plan], None] | None = None) -> Plan | None:
    """Run the demo for ``options.duration`` seconds (or until SIGINT/SIGTERM); return the final plan."""
    nodes = build_scenario("demo", options.nodes, options.seed)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with EmbeddedBroker() as broker:
            log.info("embedded broker on %s:%d", broker.host, broker.port)
            mqtt = MqttSettings(host=broker.host, port=broker.port, protocol="3.1.1", reconnect_max_delay=2.0)
            config = OptimizerConfig(
                mqtt=mqtt,
                optimizer=OptimizerSettings(solve_interval=options.solve_interval, horizon_windows=60),
                plan=PlanSettings(time_limit=5.0),
            )
            optimizer = Optimizer(config, load_catalog(), on_plan=on_plan)
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
            stop.set()
            await fleet_task
            await optimizer.plan_once()
            optimizer.should_exit.set()
            await optimizer_task
            return optimizer.plans.get(DEMO_SITE)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
