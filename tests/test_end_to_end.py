"""Agents → real Mosquitto → optimizer: receive, classify, plan, publish the plan retained."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt
import pytest
from conftest import (
    MosquittoServer,
    durable_subscriber,
    private_broker,
    recent,
    start_agent,
    wait_until,
    write_agent_config,
)

from agent.clock import Clock
from agent.mqtt import make_client
from agent.protocol import NodeStatus, Plan, State, Telemetry, TopicKind, decode, encode, recommendations_topic
from agent.simulate import SimulatedFleet
from collectors.sim.scenarios import build_scenario
from optimizer.decide.catalog import load_catalog
from optimizer.plan.recommend import PlanSettings
from optimizer.serve.config import OptimizerConfig, OptimizerSettings
from optimizer.serve.service import Optimizer


@contextlib.asynccontextmanager
async def collecting(settings: object, topic_filter: str) -> AsyncIterator[list[aiomqtt.Message]]:
    """Subscribe and collect messages in the background."""
    from agent.config import MqttSettings

    assert isinstance(settings, MqttSettings)
    received: list[aiomqtt.Message] = []
    async with make_client(settings, f"collector-{os.getpid()}-{id(received)}") as client:
        await client.subscribe(topic_filter, qos=1)

        async def pump() -> None:
            async for m in client.messages:
                received.append(m)

        task = asyncio.create_task(pump())
        try:
            yield received
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_simulated_fleet_through_mosquitto_to_a_plan(
    mosquitto: MosquittoServer, prefix: str, tmp_path: Path
) -> None:
    from optimizer.decide.snapshot import Snapshot
    from optimizer.serve.lifecycle import Lifecycle

    mqtt = mosquitto.settings(prefix)
    nodes = build_scenario("demo", 8, seed=3)
    # every planted misplacement but chat-serving, whose load no card of the site cheaper than its H100s carries
    planted = {w.id for n in nodes for w in n.workloads if w.id in n.misplaced and w.name != "chat-serving"}
    config = OptimizerConfig(
        mqtt=mqtt,
        optimizer=OptimizerSettings(solve_interval=1.0, state_dir=tmp_path),
        plan=PlanSettings(time_limit=5),
    )
    plans: list[Plan] = []
    lifecycle = Lifecycle.in_state_dir(tmp_path)
    optimizer = Optimizer(config, load_catalog(), on_plan=plans.append, lifecycle=lifecycle)
    opt_task = asyncio.create_task(optimizer.run())
    await asyncio.wait_for(optimizer.connected.wait(), 10)
    stop = asyncio.Event()
    fleet = SimulatedFleet(nodes, mqtt, site="e2e", clock=Clock(20.0), seed=3)
    fleet_task = asyncio.create_task(fleet.run(stop))
    try:
        await wait_until(
            lambda: bool(plans) and {r.workload for r in plans[-1].recommendations} == planted,
            limit=60,
            what="a plan that moves the planted misplacements",
        )
        assert optimizer.fleet.rejected == {}
        assert len(optimizer.fleet.nodes) == 8
        # Anyone can read the current plan: it is retained on the site's recommendations topic.
        async with make_client(mqtt, "plan-reader") as reader:
            await reader.subscribe(recommendations_topic(prefix, "e2e"), qos=1)
            message = await asyncio.wait_for(anext(aiter(reader.messages)), 10)
            assert message.retain
            plan = decode(TopicKind.RECOMMENDATIONS, message.payload)  # type: ignore[arg-type]
            assert isinstance(plan, Plan) and plan.site == "e2e"
            assert {r.workload for r in plan.recommendations} == planted
        # the daemon tracks them, and leaves its snapshot for what-if planning
        assert {t.recommendation.workload for t in lifecycle.list()} == planted
        snapshot = Snapshot.model_validate_json((tmp_path / "snapshot-e2e.json").read_bytes())
        assert {w.id for w in snapshot.workloads} >= planted
    finally:
        stop.set()
        await fleet_task
        optimizer.should_exit.set()
        await opt_task


async def test_agent_sigterm_publishes_the_open_window_and_goes_offline(
    mosquitto: MosquittoServer, prefix: str, tmp_path: Path
) -> None:
    config = write_agent_config(tmp_path, mosquitto.port, prefix, "e2e-node", 2.0)
    async with collecting(mosquitto.settings(prefix), f"{prefix}/lab/e2e-node/#") as received:
        proc = await start_agent(config, stderr=asyncio.subprocess.PIPE)
        try:
            await wait_until(lambda: any(m.topic.value.endswith("/telemetry") for m in received), 20, "a window")
            await asyncio.sleep(1.0)  # into the next window
            proc.send_signal(signal.SIGTERM)
            _, stderr = await asyncio.wait_for(proc.communicate(), 20)
        finally:
            if proc.returncode is None:
                proc.kill()
        assert proc.returncode == 0, stderr.decode()[-2000:]
        await asyncio.sleep(0.5)
    telemetry = [decode(TopicKind.TELEMETRY, m.payload) for m in received if m.topic.value.endswith("/telemetry")]  # type: ignore[arg-type]
    assert [t.seq for t in telemetry if isinstance(t, Telemetry)] == list(range(len(telemetry)))
    last = telemetry[-1]
    assert isinstance(last, Telemetry) and last.samples >= 1 and last.end - last.start < 2.0  # the partial window
    states = [decode(TopicKind.STATE, m.payload) for m in received if m.topic.value.endswith("/state")]  # type: ignore[arg-type]
    assert isinstance(states[-1], State) and states[-1].status is NodeStatus.OFFLINE
    assert b"SIGTERM received" in stderr


async def test_killed_agent_is_marked_offline_by_its_last_will(
    mosquitto: MosquittoServer, prefix: str, tmp_path: Path
) -> None:
    config = write_agent_config(tmp_path, mosquitto.port, prefix, "e2e-node", 2.0)
    async with collecting(mosquitto.settings(prefix), f"{prefix}/lab/e2e-node/state") as received:
        proc = await start_agent(config)
        await wait_until(lambda: len(received) >= 1, 20, "online state")
        proc.kill()
        await proc.wait()
        await wait_until(lambda: len(received) >= 2, 20, "the last will")
    first, will = (decode(TopicKind.STATE, m.payload) for m in received[:2])  # type: ignore[arg-type]
    assert isinstance(first, State) and first.status is NodeStatus.ONLINE
    assert isinstance(will, State) and will.status is NodeStatus.OFFLINE and will.session == first.session
    # every start is a new session
    assert (tmp_path / "state" / "session").read_text().strip() == str(first.session)


@pytest.mark.slow
async def test_agent_rides_out_a_broker_outage_without_losing_windows(tmp_path: Path, prefix: str) -> None:
    """An agent process publishing a window a second while its broker is away for 8 s (longer outages, under 50
    nodes at once, are test_faults.py's): every window comes, once and in order. Deliberate bug caught: a window
    closed while the broker is away published at once and lost, instead of queued."""
    broker = private_broker(tmp_path, persistent=True)
    port = broker.port
    broker.start()
    received: list[bytes] = []
    collector = asyncio.create_task(durable_subscriber(port, f"{prefix}/lab/e2e-node/telemetry", received))
    await asyncio.sleep(0.5)
    config = write_agent_config(tmp_path, port, prefix, "e2e-node", 1.0)
    proc = await start_agent(config)
    try:
        await wait_until(lambda: len(received) >= 2, 20, "windows before the outage")
        broker.stop()
        await asyncio.sleep(8)  # ~8 windows close while the broker is away
        broker.start()
        before = len(received)
        await wait_until(lambda: len(received) >= before + 10, 40, "windows after the outage")
        seqs = [json.loads(p)["seq"] for p in received]
        # every window, in order; QoS 1 is at least once, so a window in flight as the broker went may come twice
        once = list(dict.fromkeys(seqs))
        assert once == list(range(seqs[0], max(seqs) + 1)), seqs
        assert len(seqs) - len(once) <= 1, seqs
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 20)
        collector.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await collector
        broker.stop()


async def test_a_restarted_optimizer_receives_what_was_published_while_it_was_away(
    mosquitto: MosquittoServer, prefix: str
) -> None:
    from agent.protocol import node_topic
    from agent.simulate import offline_windows

    mqtt = mosquitto.settings(prefix).model_copy(update={"session_expiry": 300})
    config = OptimizerConfig(mqtt=mqtt, optimizer=OptimizerSettings(client_id=f"opt-{prefix[-10:]}"))
    first = Optimizer(config, load_catalog())
    task = asyncio.create_task(first.run())
    await asyncio.wait_for(first.connected.wait(), 10)
    first.should_exit.set()
    await task
    node = build_scenario("demo", 8)[0]
    birth, windows = offline_windows(node, 5, site="away")
    windows = recent(windows)
    async with make_client(mosquitto.settings(prefix), "publisher") as client:
        await client.publish(node_topic(prefix, "away", node.name, TopicKind.BIRTH), encode(birth), qos=1, retain=True)
        for w in windows:
            await client.publish(node_topic(prefix, "away", node.name, TopicKind.TELEMETRY), encode(w), qos=1)
    second = Optimizer(config, load_catalog())
    task = asyncio.create_task(second.run())
    try:
        await wait_until(lambda: second.fleet.accepted["telemetry"] == 5, 15, "the windows queued by the broker")
    finally:
        second.should_exit.set()
        await task


async def test_a_shared_subscription_group_splits_the_stream(mosquitto: MosquittoServer, prefix: str) -> None:
    from agent.protocol import node_topic
    from agent.simulate import offline_windows

    optimizers = [
        Optimizer(
            OptimizerConfig(
                mqtt=mosquitto.settings(prefix),
                optimizer=OptimizerSettings(client_id=f"opt-{i}-{prefix[-10:]}", shared_group="planners"),
            ),
            load_catalog(),
        )
        for i in range(2)
    ]
    tasks = [asyncio.create_task(o.run()) for o in optimizers]
    try:
        for o in optimizers:
            await asyncio.wait_for(o.connected.wait(), 10)
        nodes = build_scenario("demo", 8)[:4]
        async with make_client(mosquitto.settings(prefix), "publisher") as client:
            for node in nodes:
                _, windows = offline_windows(node, 10, site="shared")
                for w in recent(windows):
                    await client.publish(node_topic(prefix, "shared", node.name, TopicKind.TELEMETRY), encode(w), qos=1)
        await wait_until(lambda: sum(o.fleet.accepted["telemetry"] for o in optimizers) == 40, 15, "all windows")
        counts = [o.fleet.accepted["telemetry"] for o in optimizers]
        assert all(c > 0 for c in counts), counts  # each got a share, none got everything twice
    finally:
        for o in optimizers:
            o.should_exit.set()
        await asyncio.gather(*tasks)
