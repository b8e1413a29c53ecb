"""An agent back from a broker outage replays its spool: the optimizer limits windows by the time they cover, so
the whole backlog is taken in however fast it arrives; the agent paces it all the same, and its pacing survives a
restart."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiomqtt
import pytest
from conftest import MosquittoServer, wait_until

from agent.clock import Clock
from agent.config import AgentSettings, MqttSettings
from agent.mqtt import Link
from agent.pacing import Pacer
from agent.protocol import TopicKind, encode, node_topic
from agent.simulate import offline_windows
from agent.spool import MemoryQueue
from collectors.sim.scenarios import build_scenario
from optimizer.ingest.fleet import Fleet, IngestLimits
from optimizer.serve.config import OptimizerSettings

BACKLOG = 60
WINDOW_S = 10.0  # offline_windows' window length


async def _replay(mosquitto: MosquittoServer, prefix: str, pacer: Pacer | None) -> Fleet:
    """A spool of BACKLOG windows published by the agent's link into a live optimizer fleet."""
    birth, windows = offline_windows(build_scenario("mixed", 1, seed=3)[0], BACKLOG, site="lab")
    # the optimizer's default rate, and a replay budget just covering the backlog
    fleet = Fleet(prefix, limits=IngestLimits(time_rate=1.25, replay_seconds=BACKLOG * WINDOW_S, refusal_rate=1.0))
    queue = MemoryQueue(BACKLOG)
    for w in windows:
        queue.put(encode(w))
    settings = MqttSettings(host="127.0.0.1", port=mosquitto.port, prefix=prefix)
    link = Link(settings, "lab", birth.node, 1, lambda: birth, queue, time.time, pacer)
    seen: list[int] = []

    async def optimizer() -> None:
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            await client.subscribe(f"{prefix}/#", qos=1)
            ready.set()
            async for message in client.messages:
                fleet.ingest(str(message.topic), message.payload)  # type: ignore[arg-type]
                if str(message.topic) == node_topic(prefix, "lab", birth.node, TopicKind.TELEMETRY):
                    seen.append(1)

    ready = asyncio.Event()
    subscriber = asyncio.create_task(optimizer())
    await ready.wait()
    publisher = asyncio.create_task(link.run())
    try:
        await wait_until(lambda: len(seen) >= BACKLOG, 30, "the backlog to arrive")
    finally:
        publisher.cancel()
        subscriber.cancel()
        await asyncio.gather(publisher, subscriber, return_exceptions=True)
    return fleet


async def test_a_replay_arriving_at_once_is_taken_in_whole(mosquitto: MosquittoServer, prefix: str) -> None:
    fleet = await _replay(mosquitto, prefix, None)  # unpaced: the whole spool as fast as the link goes
    assert fleet.accepted["telemetry"] == BACKLOG and not fleet.rejected


async def test_a_paced_replay_is_taken_in_whole(mosquitto: MosquittoServer, prefix: str) -> None:
    pacer = Pacer(25.0, 10, Clock())
    fleet = await _replay(mosquitto, prefix, pacer)
    # the burst of 10 went at once and most of the rest waited for a token; a step slower than a token's 40 ms
    # finds one ready, so a busy machine waits less often: half the backlog still shows the replay was paced
    assert pacer.waits >= BACKLOG // 2
    assert fleet.accepted["telemetry"] == BACKLOG and not fleet.rejected


class HandClock(Clock):
    """Time that moves only when told to, or when a sleeper waits for it: no scheduler's delay refills a token."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return 1.8e9 + self.now

    async def sleep_until(self, deadline: float) -> None:
        self.now = max(self.now, deadline)


async def test_pacing_survives_a_restart(tmp_path: Path) -> None:
    clock = HandClock()
    state = tmp_path / "pacing.json"
    first = Pacer(1.0, 5, clock, state)
    for _ in range(5):
        await first.take()
    assert first.waits == 0
    first.save()  # as the agent does on its way out (and every second while taking)
    second = Pacer(1.0, 5, clock, state)  # the restarted agent: no fresh burst of 5
    await second.take()
    assert second.waits == 1
    fresh = Pacer(1.0, 5, clock, tmp_path / "other.json")  # without the state it would have had one
    await fresh.take()
    assert fresh.waits == 0
    second.save()
    clock.now += 6  # the time since the state was kept refills it
    rested = Pacer(1.0, 5, clock, state)
    for _ in range(3):
        await rested.take()
    assert rested.waits == 0


def test_a_full_spool_fits_the_optimizers_replay_budget() -> None:
    agent, optimizer = AgentSettings(), OptimizerSettings()
    assert agent.spool_max_windows * agent.publish_interval <= optimizer.node_replay_seconds
    assert agent.pace > 1 / agent.publish_interval  # a backlog drains beside the live windows


def test_a_pace_that_could_never_drain_a_backlog_is_refused() -> None:
    with pytest.raises(ValueError, match="publish_rate must exceed"):
        AgentSettings(publish_interval=10, publish_rate=0.1)
