"""The simulated fleet's exporters over HTTP: ``/metrics`` with every node's series, ``/nodes/<node>/metrics`` with
one node's (a per-node scrape target), rendered on each scrape from the nodes' last samples.

The nodes' state is copied on the event loop (references to their last samples, which are never changed once
made) and the text is rendered in a worker thread, so a scrape of a large fleet never holds up the nodes'
sampling. Rejected requests are logged and counted by reason on ``/-/metrics``, apart from the exporters' series.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Sequence
from typing import Protocol
from urllib.parse import unquote

from agent.metrics import labelled, reply
from agent.metrics import render as render_self
from collectors.sim.exporter import ExporterOptions, NodeView, node_view, render
from collectors.sim.node import Latest, SimulatedNode
from collectors.sim.spec import WorkloadSpec

log = logging.getLogger(__name__)


class Clock(Protocol):
    """The simulation's clock (agent.clock.Clock): simulated seconds since its start, and how fast they pass."""

    scale: float

    def monotonic(self) -> float: ...


class ExporterServer:
    """Serves the exporters' series of ``sims`` on ``host:port`` (port 0: a free one, in ``port`` once started)."""

    def __init__(self, sims: Sequence[SimulatedNode], options: ExporterOptions, host: str = "127.0.0.1", port: int = 0):
        self.sims = sims
        self.options = options
        self.host = host
        self.port = port
        self.scrapes = 0
        self.rejected: dict[str, int] = {}
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port, limit=8192)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _reject(self, reason: str, detail: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        log.warning("exporter: request refused (%s): %s", reason, detail)

    def _snapshot(self, node: str | None) -> list[tuple[SimulatedNode, Latest | None, list[WorkloadSpec]]]:
        return [(s, s.latest, list(s.specs)) for s in self.sims if node is None or s.node == node]

    def _render(self, taken: list[tuple[SimulatedNode, Latest | None, list[WorkloadSpec]]]) -> str:
        views: list[NodeView] = [node_view(s, latest, specs) for s, latest, specs in taken]
        return render(views, self.options)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5.0)
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError, ConnectionError):
            self._reject("bad_request", "not an HTTP request line within 8 KiB and 5 s")
            await self._reply(writer, 400, "bad request\n")
            return
        path = target.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            self._reject("method", f"{method[:16]!r} {path[:64]!r}")
            await self._reply(writer, 405, "method not allowed\n")
            return
        if path == "/-/metrics":
            text = render_self(
                [
                    labelled(
                        "fleetfit_sim_exporter_requests_rejected_total",
                        "counter",
                        "Requests to the simulated exporters refused, by reason.",
                        "reason",
                        {r: float(n) for r, n in self.rejected.items()},
                    )
                ]
            )
            await self._reply(writer, 200, text, head_only=method == "HEAD")
            return
        node: str | None = None
        if path.startswith("/nodes/") and path.endswith("/metrics"):
            node = unquote(path[len("/nodes/") : -len("/metrics")])
            if not any(s.node == node for s in self.sims):
                self._reject("unknown_node", f"{node[:64]!r}")
                await self._reply(writer, 404, f"no simulated node {node[:64]!r}\n")
                return
        elif path != "/metrics":
            self._reject("not_found", f"{path[:64]!r}")
            await self._reply(writer, 404, "not found: try /metrics or /nodes/<node>/metrics\n")
            return
        self.scrapes += 1
        text = await asyncio.to_thread(self._render, self._snapshot(node))
        await self._reply(writer, 200, text, head_only=method == "HEAD")

    async def _reply(self, writer: asyncio.StreamWriter, status: int, text: str, head_only: bool = False) -> None:
        await reply(writer, status, text, head_only)


async def drive(sims: Sequence[SimulatedNode], clock: Clock, stop: asyncio.Event) -> None:
    """Sample every node once a simulated second until ``stop`` is set, as their agents would without a broker.
    The loop yields between nodes every hundred, so that scrapes are answered in the meantime."""
    tick = 0
    while not stop.is_set():
        for i, sim in enumerate(sims):
            sim.sample()
            if i % 100 == 99:
                await asyncio.sleep(0)
        tick += 1
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, (tick - clock.monotonic()) / clock.scale)):
                await stop.wait()
        if clock.monotonic() - tick > 10:  # fallen behind by more than 10 simulated seconds: skip, do not race
            tick = math.floor(clock.monotonic())
