"""An embedded MQTT broker (amqtt, MQTT 3.1.1) for the demo, so it needs nothing installed.
Production and tests use Mosquitto."""

from __future__ import annotations

import logging
import socket
from _collections_abc import dict_items
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from amqtt.broker import Broker


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class _Subscriptions(dict[str, Any]):
    """amqtt's table of topic filters, iterated over snapshots.

    amqtt 0.12 walks its ``_subscriptions`` dict with awaits inside the loop (sending retained messages to a client
    that connects, broadcasting a message), while another client's SUBSCRIBE adds a filter to the same dict: the walk
    then raises "dictionary changed size during iteration". A client connecting at that moment is left without a
    message loop (its SUBSCRIBE never acknowledged) and a broadcast can be dropped. Walking a copy of the keys or
    items, as the broker's own deletion loop needs anyway, removes the race; lookups and updates stay the dict's own.
    """

    def __iter__(self) -> Iterator[str]:
        return iter(list(super().keys()))

    def items(self) -> dict_items[str, Any]:
        return dict(super().items()).items()


class EmbeddedBroker:
    """``async with EmbeddedBroker() as broker:`` listens on ``broker.port`` on loopback."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.host = host
        self.port = port or free_port(host)
        self._broker: Broker | None = None

    async def __aenter__(self) -> EmbeddedBroker:
        for name in ("amqtt", "transitions"):
            logging.getLogger(name).setLevel(logging.ERROR)
        config = {
            "listeners": {"default": {"type": "tcp", "bind": f"{self.host}:{self.port}", "max_connections": 10_000}},
            "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
        }
        self._broker = Broker(config)
        if type(getattr(self._broker, "_subscriptions", None)) is not dict:
            raise RuntimeError("amqtt no longer keeps its topic filters in _subscriptions: the broker needs updating")
        self._broker._subscriptions = _Subscriptions()
        await self._broker.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._broker is not None:
            await self._broker.shutdown()
            self._broker = None
