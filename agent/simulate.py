"""Run a simulated fleet: one real :class:`agent.service.Agent` per virtual node, all in one process, each
with its own MQTT connection, fed by :class:`collectors.sim.node.SimulatedNode` instead of hardware."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from agent import __version__
from agent.clock import Clock
from agent.config import AgentConfig, AgentSettings, MqttSettings
from agent.protocol import Birth, Telemetry, encode
from agent.service import Agent
from agent.spool import MemoryQueue
from agent.window import WindowBuilder
from collectors.sim.node import SimulatedNode
from collectors.sim.scenarios import ScenarioNode, simulated_node
from collectors.sim.spec import DAY_S

log = logging.getLogger(__name__)


class SimulatedFleet:
    """Agents for ``nodes``; ``record`` receives every window as JSONL with its ground-truth labels."""

    def __init__(
        self,
        nodes: list[ScenarioNode],
        mqtt: MqttSettings,
        site: str = "sim",
        clock: Clock | None = None,
        publish_interval: float = 10.0,
        seed: int = 0,
        record: IO[str] | None = None,
        stagger: bool = True,
        history: float = 0.0,
    ) -> None:
        """``history``: seconds of each node's past queued before its agent starts (see :func:`past_windows`),
        replayed after the birth as an agent replays its spool; 0 for none."""
        self.clock = clock or Clock()
        # Real agents boot at different moments, so their windows close at different moments; without a spread
        # every simulated node would publish in the same instant, a burst no real fleet sends.
        rng = random.Random(f"stagger:{seed}")
        spread = publish_interval / self.clock.scale if stagger else 0.0
        self._delays = [rng.uniform(0, spread) for _ in nodes]
        self.nodes = nodes
        self._record = record
        self._history = history
        self._seed = seed
        self.live = asyncio.Event()
        self.history_windows = 0
        session = int(time.time())
        self.agents: list[Agent] = []
        self.sims: list[SimulatedNode] = []
        for node in nodes:
            config = AgentConfig(
                agent=AgentSettings(node=node.name, site=site, publish_interval=publish_interval),
                mqtt=mqtt,
            )
            sim = simulated_node(node, self.clock.wall, seed)
            self.sims.append(sim)
            queue = MemoryQueue(config.agent.spool_max_windows)
            agent = Agent(config, [sim], session=session, clock=self.clock, hostname=node.name, queue=queue)
            if record is not None:
                labels = {w.id: w.pattern.value for w in node.workloads}
                agent.on_window = self._recorder(labels)
                self._write({"birth": agent.birth().model_dump(mode="json", by_alias=True, exclude_none=True),
                             "labels": labels})  # fmt: skip
            self.agents.append(agent)

    def _write(self, line: dict[str, object]) -> None:
        if self._record is not None:
            self._record.write(json.dumps(line, separators=(",", ":")) + "\n")

    def _recorder(self, labels: dict[str, str]) -> Callable[[Telemetry], None]:
        def write(window: Telemetry) -> None:
            self._write({"labels": labels, "window": window.model_dump(mode="json", by_alias=True, exclude_none=True)})

        return write

    async def run(self, stop: asyncio.Event) -> None:
        """Run every agent until ``stop`` is set, then shut them all down gracefully. With ``history``, each agent
        starts once its node's history is queued, and ``live`` is set when the last one has."""
        tasks: list[asyncio.Task[None]] = []
        started = time.monotonic()
        try:
            for agent, delay, node, sim in zip(self.agents, self._delays, self.nodes, self.sims, strict=True):
                if not await self._queue_history(agent, node, sim, stop):
                    break
                tasks.append(asyncio.create_task(self._start(agent, delay), name=f"agent-{agent.settings.node}"))
            else:
                if self._history > 0:
                    log.info(
                        "queued %.1f h of history per node (%d windows in all) in %.1f s",
                        self._history / 3600,
                        self.history_windows,
                        time.monotonic() - started,
                    )
                self.live.set()
            await stop.wait()
        finally:
            for a in self.agents:
                a.should_exit.set()
            if tasks:
                done, pending = await asyncio.wait(tasks, timeout=15)
                for t in pending:
                    t.cancel()
                for t in done:
                    if not t.cancelled() and t.exception() is not None:
                        log.error("agent task failed: %r", t.exception())
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(*pending, return_exceptions=True)
            log.info("%s", self.summary())

    async def _queue_history(self, agent: Agent, node: ScenarioNode, sim: SimulatedNode, stop: asyncio.Event) -> bool:
        """Put the ``history`` seconds before the node's live simulation in its agent's queue, as the spool of an
        earlier run; False when ``stop`` came first."""
        if self._history <= 0:
            return True
        settings = agent.settings
        for window in past_windows(
            node,
            sim.started,
            self._history,
            site=settings.site,
            session=agent.session - 1,  # an earlier run of the agent: the optimizer takes it as a replay
            publish_interval=settings.publish_interval,
            seed=self._seed,
        ):
            agent.queue.put(encode(window))
            self.history_windows += 1
            await asyncio.sleep(0)  # a day of windows takes a second to build: the live agents keep their beat
            if stop.is_set():
                return False
        return True

    @staticmethod
    async def _start(agent: Agent, delay: float) -> None:
        """Start ``agent`` after its stagger delay, unless the fleet is told to stop first."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await agent.should_exit.wait()
        if not agent.should_exit.is_set():
            await agent.run()

    def summary(self) -> str:
        agents = self.agents
        return (
            f"simulated {len(agents)} node(s): {sum(a.windows_closed for a in agents)} windows closed, "
            f"{sum(a.link.published for a in agents)} published, {sum(len(a.queue) for a in agents)} queued, "
            f"{sum(a.queue.dropped for a in agents)} dropped, {sum(a.ticks_missed for a in agents)} ticks missed"
        )


def open_record(path: Path | None) -> IO[str] | None:
    return path.open("a", encoding="utf-8") if path else None


class ManualClock:
    """A clock tests and offline runs advance by hand."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def shift_to_now(windows: list[Telemetry]) -> list[Telemetry]:
    """``windows`` moved in time to end now: a live optimizer takes only windows of the last day, while offline
    simulation starts at a fixed date."""
    shift = time.time() - max(w.end for w in windows)
    return [w.model_copy(update={"start": w.start + shift, "end": w.end + shift}) for w in windows]


# One window per 10-minute history digest (optimizer/ingest/history.py), a little over 10 minutes apart so that short
# cycles (checkpoints every few minutes) are not always caught at the same phase.
PAST_WINDOW_EVERY = 610.0


def past_windows(
    node: ScenarioNode,
    end: float,
    span: float,
    site: str = "sim",
    session: int = 1,
    publish_interval: float = 10.0,
    seed: int = 0,
    every: float = PAST_WINDOW_EVERY,
) -> Iterator[Telemetry]:
    """``node``'s windows over the ``span`` seconds before ``end``, one every ``every`` seconds, each built by the
    agent's window code from a ``publish_interval`` of 1 Hz samples.

    The node's simulation is taken to have started a whole number of days before ``end``, so daily cycles meet
    those of a live simulation that starts at ``end``."""
    days = max(1, math.ceil(span / DAY_S))
    clock = ManualClock(end - days * DAY_S)
    sim = simulated_node(node, clock, seed + 1)  # other draws than the live simulation's
    ticks = max(1, round(publish_interval))
    count = int(span // every)
    for seq in range(count):
        clock.now = end - (count - seq) * every
        builder = WindowBuilder(node.name, site, session)  # rates start afresh: the gap before is not a second
        start = clock.now
        for _ in range(ticks):
            clock.now += publish_interval / ticks
            builder.add(sim.sample(), clock.now)
        yield builder.close(seq, start, clock.now, sim.workloads())


def offline_windows(
    node: ScenarioNode, windows: int, publish_interval: float = 10.0, site: str = "sim", seed: int = 0
) -> tuple[Birth, list[Telemetry]]:
    """Simulate ``node`` without a broker or real time: its birth and ``windows`` consecutive windows, built by
    the same window code the agent uses."""
    clock = ManualClock()
    sim = simulated_node(node, clock, seed)
    inventory = sim.inventory()
    birth = Birth(
        node=node.name,
        site=site,
        session=1,
        agent_version=__version__,
        hostname=node.name,
        timestamp=clock.now,
        gpus=inventory.gpus,
        nics=inventory.nics,
        disks=inventory.disks,
        host=inventory.host,
    )
    builder = WindowBuilder(node.name, site, session=1)
    out = []
    ticks = max(1, round(publish_interval))
    for seq in range(windows):
        start = clock.now
        for _ in range(ticks):
            clock.now += publish_interval / ticks
            builder.add(sim.sample(), clock.now)
        out.append(builder.close(seq, start, clock.now, sim.workloads()))
    return birth, out
