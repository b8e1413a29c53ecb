"""Beyond one broker: nodes on broker A, the optimizer on broker B, the two Mosquittos bridged. What the agent and
the optimizer need from a broker cluster: windows arrive, retained births are visible on the other broker, and
QoS 1 windows published while the optimizer is away are queued for its persistent session across the bridge."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MosquittoServer, private_broker, recent, wait_until

from agent.mqtt import make_client
from agent.protocol import TopicKind, encode, node_topic
from agent.simulate import offline_windows
from collectors.sim.scenarios import build_scenario
from optimizer.decide.catalog import load_catalog
from optimizer.serve.config import OptimizerConfig, OptimizerSettings
from optimizer.serve.service import Optimizer


@pytest.fixture
def bridged(tmp_path: Path, prefix: str) -> Iterator[tuple[MosquittoServer, MosquittoServer]]:
    """Broker A, and broker B bridged to it for the prefix in both directions at QoS 1 (docs/operations.md)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = private_broker(tmp_path / "a")
    b = private_broker(tmp_path / "b", persistent=True)
    with b.config.open("a") as config:
        config.write(
            f"connection to-a\naddress 127.0.0.1:{a.port}\ntopic {prefix}/# both 1\n"
            "cleansession false\nbridge_protocol_version mqttv50\ntry_private true\nrestart_timeout 1\n"
        )
    a.start()
    b.start()
    yield a, b
    b.stop()
    a.stop()


async def test_windows_births_and_queued_qos1_cross_a_bridge(
    bridged: tuple[MosquittoServer, MosquittoServer], prefix: str, tmp_path: Path
) -> None:
    a, b = bridged
    node = build_scenario("demo", 8)[0]
    birth, windows = offline_windows(node, 10, site="lab")
    windows = recent(windows)
    mqtt_b = b.settings(prefix).model_copy(update={"session_expiry": 300})
    config = OptimizerConfig(mqtt=mqtt_b, optimizer=OptimizerSettings(client_id=f"opt-{prefix[-8:]}"))
    first = Optimizer(config, load_catalog())
    task = asyncio.create_task(first.run())
    try:
        await asyncio.wait_for(first.connected.wait(), 10)
        await asyncio.sleep(1.0)  # B's bridge connects to A
        async with make_client(a.settings(prefix), "node-on-a") as client:
            topic = node_topic(prefix, "lab", node.name, TopicKind.BIRTH)
            await client.publish(topic, encode(birth), qos=1, retain=True)
            for w in windows[:5]:
                await client.publish(node_topic(prefix, "lab", node.name, TopicKind.TELEMETRY), encode(w), qos=1)
        await wait_until(lambda: first.fleet.accepted["telemetry"] == 5, 15, "windows from across the bridge")
        assert first.fleet.accepted["birth"] == 1
    finally:
        first.should_exit.set()
        await task

    # the birth is retained on B too: a client of B that subscribes later reads it
    async with make_client(b.settings(prefix), "late-reader") as reader:
        await reader.subscribe(node_topic(prefix, "lab", node.name, TopicKind.BIRTH), qos=1)
        async with asyncio.timeout(5):
            message = await anext(aiter(reader.messages))
        assert message.retain and bytes(message.payload) == encode(birth)  # type: ignore[arg-type]

    # the optimizer is away; windows published on A at QoS 1 wait on B for its persistent session
    async with make_client(a.settings(prefix), "node-on-a") as client:
        for w in windows[5:]:
            await client.publish(node_topic(prefix, "lab", node.name, TopicKind.TELEMETRY), encode(w), qos=1)
    second = Optimizer(config, load_catalog())
    task = asyncio.create_task(second.run())
    try:
        await wait_until(lambda: second.fleet.accepted["telemetry"] == 5, 15, "the windows B queued")
    finally:
        second.should_exit.set()
        await task
