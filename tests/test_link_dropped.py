"""A broker that drops the connection after CONNACK: at once, or while the client waits for a SUBSCRIBE's
acknowledgement (as the demo's embedded broker did when a session failed inside it). The agent and the optimizer
reconnect, and say nothing more than that: the loss recorded inside aiomqtt is read, so asyncio never prints it as
an unread error with a traceback."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_until

import agent.mqtt
from agent.config import MqttSettings
from agent.mqtt import Link
from agent.simulate import offline_windows
from agent.spool import MemoryQueue
from collectors.sim.scenarios import build_scenario
from optimizer.decide.catalog import load_catalog
from optimizer.serve.config import OptimizerConfig, OptimizerSettings
from optimizer.serve.service import Optimizer

CONNACK = bytes([0x20, 0x02, 0x00, 0x00])


async def _packet(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One MQTT control packet: its first byte and its body."""
    first = (await reader.readexactly(1))[0]
    length, shift = 0, 0
    while True:
        byte = (await reader.readexactly(1))[0]
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return first, await reader.readexactly(length)


class DroppingBroker:
    """Acknowledges CONNECT and QoS 1 PUBLISH; a SUBSCRIBE is never acknowledged: the connection is dropped. With
    ``at_once`` the connection is dropped right after CONNACK."""

    def __init__(self, at_once: bool) -> None:
        self.at_once = at_once
        self.dropped = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                first, body = await _packet(reader)
                kind = first >> 4
                if kind == 1:  # CONNECT
                    writer.write(CONNACK)
                    if self.at_once:
                        await writer.drain()
                        self.dropped += 1
                        break
                elif kind == 3 and (first >> 1) & 3:  # PUBLISH at QoS 1: topic, then the packet id
                    topic_length = int.from_bytes(body[:2], "big")
                    writer.write(bytes([0x40, 0x02]) + body[2 + topic_length : 4 + topic_length])
                elif kind == 8:  # SUBSCRIBE: gone, without a word
                    self.dropped += 1
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


def _link(settings: MqttSettings, tmp_path: Path) -> Callable[[], Awaitable[None]]:
    birth, _ = offline_windows(build_scenario("mixed", 1, seed=3)[0], 1, site="lab")
    return Link(settings, "lab", birth.node, 1, lambda: birth, MemoryQueue(10), time.time).run


def _optimizer(settings: MqttSettings, tmp_path: Path) -> Callable[[], Awaitable[None]]:
    config = OptimizerConfig(mqtt=settings, optimizer=OptimizerSettings(state_dir=tmp_path))
    return Optimizer(config, load_catalog()).run


@pytest.mark.parametrize("client", [_link, _optimizer], ids=["agent", "optimizer"])
@pytest.mark.parametrize("at_once", [False, True], ids=["during SUBSCRIBE", "right after CONNACK"])
async def test_a_dropped_connection_is_retried_without_an_unread_error(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    client: Callable[[MqttSettings, Path], Callable[[], Awaitable[None]]],
    at_once: bool,
) -> None:
    monkeypatch.setattr(agent.mqtt, "PUBLISH_TIMEOUT_S", 0.5)  # the SUBSCRIBE's wait for its acknowledgement
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    broker = DroppingBroker(at_once)
    server = await asyncio.start_server(broker.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    settings = MqttSettings(host="127.0.0.1", port=port, protocol="3.1.1", reconnect_max_delay=0.2)
    task = asyncio.create_task(client(settings, tmp_path)())
    try:
        await wait_until(lambda: broker.dropped >= 3, 30, "three connections dropped")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        server.close()
        await server.wait_closed()
        for _ in range(3):  # the dropped clients' futures are collected: any unread error is reported now
            gc.collect()
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
        server.close()
        loop.set_exception_handler(None)
    assert [str(e.get("message")) for e in errors] == []
