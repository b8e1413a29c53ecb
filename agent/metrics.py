"""Self-metrics in the Prometheus text exposition format, and a small HTTP endpoint that serves them.

The agent stays free of an HTTP framework (its memory budget is tight); the optimizer serves the same text
from its API."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}


async def reply(writer: asyncio.StreamWriter, status: int, text: str, head_only: bool = False) -> None:
    """One HTTP/1.1 answer on a connection that then closes: metrics (``CONTENT_TYPE``) on 200, plain text else."""
    body = text.encode()
    content_type = CONTENT_TYPE if status == 200 else "text/plain; charset=utf-8"
    header = (
        f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    with contextlib.suppress(ConnectionError):
        writer.write(header.encode() + (b"" if head_only else body))
        await writer.drain()
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    kind: Literal["counter", "gauge"]
    help: str
    samples: list[tuple[Mapping[str, str], float]] = field(default_factory=list)


def counter(name: str, help: str, value: float | None = None, **labels: str) -> Family:
    return Family(name, "counter", help, [] if value is None else [(labels, value)])


def gauge(name: str, help: str, value: float | None = None, **labels: str) -> Family:
    return Family(name, "gauge", help, [] if value is None else [(labels, value)])


def labelled(
    name: str, kind: Literal["counter", "gauge"], help: str, label: str, values: Mapping[str, float]
) -> Family:
    """One sample per key of ``values``, labelled ``label``."""
    return Family(name, kind, help, [({label: k}, v) for k, v in sorted(values.items())])


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(families: Iterable[Family]) -> str:
    lines = []
    for f in families:
        lines.append(f"# HELP {f.name} {f.help}")
        lines.append(f"# TYPE {f.name} {f.kind}")
        for labels, value in f.samples:
            inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            number = int(value) if float(value).is_integer() else value
            lines.append(f"{f.name}{{{inner}}} {number}" if inner else f"{f.name} {number}")
    return "\n".join(lines) + "\n"


class MetricsServer:
    """Serves ``GET /metrics`` on ``host:port`` with what ``collect`` returns; anything else gets 404/405."""

    def __init__(self, host: str, port: int, collect: Callable[[], Iterable[Family]]) -> None:
        self.host = host
        self.port = port
        self.collect = collect
        self.requests = 0
        self.bad_requests = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port, limit=8192)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5.0)
            method, path, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError, ConnectionError):
            self.bad_requests += 1
            await self._reply(writer, 400, "bad request\n")
            return
        self.requests += 1
        if path.split("?", 1)[0] != "/metrics":
            await self._reply(writer, 404, "not found: try /metrics\n")
        elif method not in ("GET", "HEAD"):
            await self._reply(writer, 405, "method not allowed\n")
        else:
            await self._reply(writer, 200, render(self.collect()), head_only=method == "HEAD")

    async def _reply(self, writer: asyncio.StreamWriter, status: int, text: str, head_only: bool = False) -> None:
        await reply(writer, status, text, head_only)
