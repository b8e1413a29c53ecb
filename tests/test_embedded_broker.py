"""The demo's embedded broker (amqtt) when a client connects while another subscribes, as the demo's agents do.

amqtt 0.12 walks its table of topic filters with awaits inside (sending a connecting client the retained messages
of every filter); a SUBSCRIBE from another client meanwhile ended that walk with "dictionary changed size during
iteration". The connecting client was then never served: its SUBSCRIBE timed out, and the traceback landed on the
demo's stderr. The test makes the other client's SUBSCRIBE land inside the walk every time, at its first await."""

from __future__ import annotations

import asyncio
from typing import Any

import aiomqtt

from optimizer.serve.broker import EmbeddedBroker


async def test_a_client_connecting_while_another_subscribes_is_served() -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        async with EmbeddedBroker() as embedded:
            broker: Any = embedded._broker
            async with aiomqtt.Client("127.0.0.1", embedded.port, identifier="watcher") as watcher:
                await watcher.subscribe("births/+", qos=1)
                walk_step = broker._publish_retained_messages_for_subscription
                landed: list[str] = []

                async def step_with_a_subscribe_meanwhile(subscription: tuple[str, int], session: Any) -> None:
                    if session.client_id == "node-1" and not landed:
                        landed.append(subscription[0])  # another client's SUBSCRIBE, taken in by the broker now
                        await asyncio.wait_for(watcher.subscribe("commands/node-2", qos=1), 5)
                    await walk_step(subscription, session)

                broker._publish_retained_messages_for_subscription = step_with_a_subscribe_meanwhile
                async with aiomqtt.Client("127.0.0.1", embedded.port, identifier="node-1", timeout=5) as node:
                    await node.subscribe("commands/node-1", qos=1)  # acknowledged: the node is served
                assert landed == ["births/+"]
    finally:
        loop.set_exception_handler(None)
    assert [str(e.get("exception") or e.get("message")) for e in errors] == []
