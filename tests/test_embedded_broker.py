"""The demo's embedded broker (amqtt) under clients that connect while others subscribe, as the demo's agents do.

amqtt 0.12 walks its table of topic filters with awaits inside (sending a connecting client the retained messages
of every filter); a SUBSCRIBE from another client meanwhile ends that walk with "dictionary changed size during
iteration". The connecting client is then never served: its SUBSCRIBE times out, and the traceback lands on the
demo's stderr. The same clients against the broker as it was built show the failure: this test turns red when the
embedded broker's guard is removed."""

from __future__ import annotations

import asyncio
from typing import Any

import aiomqtt

from optimizer.serve.broker import EmbeddedBroker

RETAINED = 30  # filters whose retained messages a connecting client is sent, each an await inside the walk
CONNECTING = 20


async def test_clients_connect_while_another_subscribes_and_each_is_served() -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        async with EmbeddedBroker() as broker:
            port = broker.port
            async with aiomqtt.Client("127.0.0.1", port, identifier="publisher") as publisher:
                for i in range(RETAINED):
                    await publisher.publish(f"births/{i}", b"born", qos=1, retain=True)
            async with aiomqtt.Client("127.0.0.1", port, identifier="watcher") as watcher:
                for i in range(RETAINED):
                    await watcher.subscribe(f"births/{i}", qos=1)

                async def subscribe_more() -> None:
                    for i in range(300):
                        await watcher.subscribe(f"commands/{i}", qos=1)

                async def connect(k: int) -> None:
                    async with aiomqtt.Client("127.0.0.1", port, identifier=f"node-{k}", timeout=5) as client:
                        await client.subscribe(f"commands/node-{k}", qos=1)

                results = await asyncio.gather(
                    subscribe_more(), *(connect(k) for k in range(CONNECTING)), return_exceptions=True
                )
    finally:
        loop.set_exception_handler(None)
    failed = [r for r in results if isinstance(r, BaseException)]
    assert failed == [], f"{len(failed)} client(s) not served: {failed[:3]}"
    assert [str(e.get("exception") or e.get("message")) for e in errors] == []
