"""The optimizer's intake on a real Mosquitto: every message handed over once and acknowledged, a failing
message costing only itself, a trickle of messages read several to a round, and a lost connection reported."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import aiomqtt
import pytest

from agent.config import MqttSettings
from agent.mqtt import make_client
from optimizer.serve.intake import GATHER, MAX_PAUSE, Intake
from tests.conftest import MosquittoServer, private_broker, wait_until


def _persistent(server: MosquittoServer, prefix: str, protocol: str = "5") -> MqttSettings:
    return server.settings(prefix, protocol).model_copy(update={"session_expiry": 3600})


async def _publish(server: MosquittoServer, topics: list[str], every: float | None = None) -> None:
    """QoS 1 messages ``m0``, ``m1``, ... ``every`` seconds apart, or all at once."""
    client = aiomqtt.Client("127.0.0.1", server.port, identifier=f"pub-{id(topics)}")
    client._client.max_inflight_messages_set(0)  # paho's own limit of 20 would pace a burst
    async with client:
        if every is None:
            await asyncio.gather(*(client.publish(t, f"m{i}".encode(), qos=1) for i, t in enumerate(topics)))
            return
        for i, topic in enumerate(topics):
            await client.publish(topic, f"m{i}".encode(), qos=1)
            await asyncio.sleep(every)


async def _take(settings: MqttSettings, name: str, handled: list[tuple[str, bytes]], until: int) -> Intake:
    """Connect with a persistent session, take messages in until ``until`` have been handled, disconnect."""
    client = make_client(settings, name)

    def handle(topic: str, payload: bytes | bytearray) -> None:
        handled.append((topic, bytes(payload)))

    intake = Intake(client, handle)
    async with client:
        await client.subscribe(f"{settings.prefix}/#", qos=1)
        intake.start()
        await wait_until(lambda: len(handled) >= until, 20, f"{until} messages")
        await asyncio.sleep(0.3)  # the acknowledgements of the last round go out
    return intake


async def test_each_message_once_and_acknowledged(mosquitto: MosquittoServer, prefix: str) -> None:
    settings = _persistent(mosquitto, prefix)
    handled: list[tuple[str, bytes]] = []
    await _take(settings, f"intake-{prefix[-6:]}", handled, 0)  # the session exists: the broker keeps for it
    topics = [f"{prefix}/site/n{i % 7}/telemetry" for i in range(300)]
    await _publish(mosquitto, topics)
    await _take(settings, f"intake-{prefix[-6:]}", handled, 300)
    assert [p for _, p in handled] == [f"m{i}".encode() for i in range(300)]
    assert [t for t, _ in handled] == topics
    # acknowledged: the same session, back again, is delivered nothing more
    again: list[tuple[str, bytes]] = []
    client = make_client(settings, f"intake-{prefix[-6:]}")
    intake = Intake(client, lambda t, p: again.append((t, bytes(p))))
    async with client:
        intake.start()
        await asyncio.sleep(1.0)
    assert again == []


async def test_a_failing_message_costs_only_itself(mosquitto: MosquittoServer, prefix: str) -> None:
    settings = _persistent(mosquitto, prefix)
    name = f"failing-{prefix[-6:]}"
    handled: list[bytes] = []

    def handle(topic: str, payload: bytes | bytearray) -> None:
        if payload == b"m3":
            raise ValueError("a bug met by one message")
        handled.append(bytes(payload))

    client = make_client(settings, name)
    intake = Intake(client, handle)
    async with client:
        await client.subscribe(f"{prefix}/#", qos=1)
        intake.start()
        await _publish(mosquitto, [f"{prefix}/s/n/telemetry"] * 8)
        await wait_until(lambda: len(handled) == 7, 10, "the other seven messages")
        await asyncio.sleep(0.3)
    assert intake.failures == 1
    assert handled == [f"m{i}".encode() for i in range(8) if i != 3]
    again: list[bytes] = []
    client = make_client(settings, name)
    later = Intake(client, lambda t, p: again.append(bytes(p)))
    async with client:
        later.start()
        await asyncio.sleep(1.0)
    assert again == []  # acknowledged too: it would fail again, and hold a slot of the broker's window for good


async def test_a_trickle_is_read_several_messages_a_round(mosquitto: MosquittoServer, prefix: str) -> None:
    """Nodes' windows arrive one at a time; a wake-up per message costs more than the message. 150 messages
    5 ms apart are taken in far fewer rounds."""
    handled: list[tuple[str, bytes]] = []
    client = make_client(mosquitto.settings(prefix), f"trickle-{prefix[-6:]}")
    intake = Intake(client, lambda t, p: handled.append((t, bytes(p))))
    async with client:
        await client.subscribe(f"{prefix}/#", qos=1)
        intake.start()
        await _publish(mosquitto, [f"{prefix}/s/n{i}/telemetry" for i in range(150)], every=0.005)
        await wait_until(lambda: len(handled) == 150, 20, "150 messages")
    assert len(handled) == 150
    mean_pause = intake.paused_seconds / max(intake.pauses, 1)
    print(f"150 messages in {intake.rounds} rounds; {intake.pauses} pauses of {mean_pause:.3f} s on average")
    # One message a round would take 150 rounds; at ~200 messages a second the pause gathers several. Under
    # load rounds only grow larger.
    assert intake.rounds <= 150 / 3, f"{intake.rounds} rounds for 150 messages"
    assert intake.rate > 0
    # Each round costs a wake-up, the reader's registration, a timer and a write besides its messages: a pause
    # after a quiet round waits for a couple of dozen more, at a few hundred a second longer than 50 ms.
    assert intake.pauses and mean_pause > 0.05, (intake.paused_seconds, intake.pauses)


async def test_a_slow_fleet_waits_no_longer_than_the_pause_cap(
    mosquitto: MosquittoServer, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small fleet's windows arrive 20 a second: a pause sized to gather GATHER (24) of them would be 1.2 s,
    and every window would wait that long before it is read. Every pause is MAX_PAUSE at most, and each message
    is handled within about MAX_PAUSE of being published (a quarter of a second more allowed for a busy machine).
    Deliberate bug caught: the MAX_PAUSE cap removed."""
    assert GATHER / 20 > MAX_PAUSE  # the rate below is slow enough for the cap to matter
    sent: dict[bytes, float] = {}
    handled: dict[bytes, float] = {}
    client = make_client(mosquitto.settings(prefix), f"slow-{prefix[-6:]}")

    def handle(topic: str, payload: bytes | bytearray) -> None:
        handled.setdefault(bytes(payload), time.monotonic())

    intake = Intake(client, handle)
    pauses: list[float] = []
    loop = asyncio.get_running_loop()
    call_later = loop.call_later

    def noting_pauses(delay: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        if callback == intake._resume:
            pauses.append(delay)
        return call_later(delay, callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_later", noting_pauses)
    publisher = aiomqtt.Client("127.0.0.1", mosquitto.port, identifier=f"slow-pub-{prefix[-6:]}")
    async with client:
        await client.subscribe(f"{prefix}/#", qos=1)
        intake.start()
        async with publisher:
            for i in range(40):
                payload = f"m{i}".encode()
                sent[payload] = time.monotonic()
                await publisher.publish(f"{prefix}/s/n{i}/telemetry", payload, qos=1)
                await asyncio.sleep(0.05)
        await wait_until(lambda: len(handled) == 40, 20, "40 messages")
    assert pauses and max(pauses) <= MAX_PAUSE, pauses
    waits = sorted(handled[p] - sent[p] for p in sent)
    print(f"{len(pauses)} pauses; waits from publish to handled: median {waits[20]:.3f} s, longest {waits[-1]:.3f} s")
    assert waits[-1] <= MAX_PAUSE + 0.25, waits[-5:]
    assert len(pauses) >= 5, pauses  # quiet rounds, each followed by a pause


async def test_a_lost_connection_is_reported(tmp_path: Path, prefix: str) -> None:
    server = private_broker(tmp_path)
    server.start()
    client = make_client(server.settings(prefix), f"lost-{prefix[-6:]}")
    intake = Intake(client, lambda t, p: None)
    try:
        with contextlib.suppress(aiomqtt.MqttError):  # leaving: the broker is gone, so is the goodbye
            async with client:
                intake.start()
                waiter = asyncio.ensure_future(intake.closed())
                await asyncio.sleep(0.2)
                assert not waiter.done()
                server.stop()
                with pytest.raises(aiomqtt.MqttError):  # the optimizer reconnects on this
                    await asyncio.wait_for(waiter, 10)
    finally:
        server.stop()


def test_the_optimizer_counts_a_message_it_fails_on_whatever_its_kind() -> None:
    """A bug met by one message (a node's, a presence, a handover record) is counted in
    ``fleetfit_internal_errors_total`` and costs only that message."""
    from optimizer.decide.catalog import load_catalog
    from optimizer.serve.config import OptimizerConfig
    from optimizer.serve.service import Optimizer

    opt = Optimizer(OptimizerConfig(), load_catalog())
    prefix = opt.config.mqtt.prefix

    def broken(*_: object) -> None:
        raise RuntimeError("a bug")

    opt.fleet.ingest = broken  # type: ignore[method-assign,assignment]
    opt.ownership.observe = broken  # type: ignore[method-assign]
    opt.handovers.observe = broken  # type: ignore[method-assign]
    head = f"{prefix}/_optimizers/"
    opt._message(f"{prefix}/s/n1/telemetry", b"{}", head)
    opt._message(f"{head}other", b"{}", head)
    opt._message(f"{prefix}/s/handover", b"{}", head)
    assert opt.internal_errors == 3


async def test_a_setting_that_no_longer_does_anything_says_so(
    mosquitto: MosquittoServer, prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from optimizer.decide.catalog import load_catalog
    from optimizer.serve.config import OptimizerConfig, OptimizerSettings
    from optimizer.serve.service import Optimizer

    for settings, said in ((OptimizerSettings(state_dir=tmp_path), False), (OptimizerSettings(state_dir=tmp_path, max_queued_messages=5000), True)):  # fmt: skip
        caplog.clear()
        opt = Optimizer(OptimizerConfig(mqtt=mosquitto.settings(prefix), optimizer=settings), load_catalog())
        task = asyncio.create_task(opt.run())
        await wait_until(opt.connected.is_set, 10, "the optimizer to subscribe")
        opt.should_exit.set()
        await task
        assert ("max_queued_messages is no longer used" in caplog.text) is said
