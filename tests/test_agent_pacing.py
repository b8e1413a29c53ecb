"""An agent back from a broker outage replays its spool paced under the optimizer's per-node window limit, so
the whole backlog is taken in rather than all but the first burst refused."""

from __future__ import annotations

import asyncio
import time

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
from collectors.scenarios import build_scenario
from optimizer.config import OptimizerSettings
from optimizer.fleet import Fleet, IngestLimits

BACKLOG = 60
OPTIMIZER_RATE, OPTIMIZER_BURST = 25.0, 12  # the optimizer's limits, scaled up so the test takes seconds


async def _replay(mosquitto: MosquittoServer, prefix: str, pacer: Pacer | None) -> Fleet:
    """A spool of BACKLOG windows published by the agent's link into a live optimizer fleet."""
    birth, windows = offline_windows(build_scenario("mixed", 1, seed=3)[0], BACKLOG, site="lab")
    fleet = Fleet(prefix, limits=IngestLimits(window_rate=OPTIMIZER_RATE, window_burst=OPTIMIZER_BURST))
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


async def test_a_paced_replay_is_taken_in_whole(mosquitto: MosquittoServer, prefix: str) -> None:
    pacer = Pacer(0.8 * OPTIMIZER_RATE, OPTIMIZER_BURST - 2, Clock())
    fleet = await _replay(mosquitto, prefix, pacer)
    assert pacer.waits >= BACKLOG - OPTIMIZER_BURST  # the burst went at once, the rest was paced
    assert fleet.rejected["rate_limited"] == 0
    assert fleet.accepted["telemetry"] == BACKLOG


async def test_an_unpaced_replay_loses_all_but_the_burst(mosquitto: MosquittoServer, prefix: str) -> None:
    fleet = await _replay(mosquitto, prefix, None)
    assert fleet.rejected["rate_limited"] > BACKLOG // 2


def test_the_default_pace_stays_under_the_optimizers_default_limit() -> None:
    agent, optimizer = AgentSettings(), OptimizerSettings()
    assert agent.pace < optimizer.node_window_rate and agent.publish_burst < optimizer.node_window_burst
    assert agent.pace > 1 / agent.publish_interval  # a backlog drains beside the live windows


def test_a_pace_that_could_never_drain_a_backlog_is_refused() -> None:
    with pytest.raises(ValueError, match="publish_rate must exceed"):
        AgentSettings(publish_interval=10, publish_rate=0.1)
