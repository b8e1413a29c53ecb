"""The aiohttp application: routes, request counting, start and stop."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from agent.metrics import Family, render
from optimizer.config import ApiSettings
from optimizer.service import Optimizer
from optimizer.web.api import JsonApi
from optimizer.web.pages import Console

log = logging.getLogger(__name__)

MAX_BODY = 4096
STATIC = Path(__file__).parent / "static"


class WebServer:
    """The optimizer's HTTP API and console on ``settings.listen:settings.port`` (port 0: a free one)."""

    def __init__(self, optimizer: Optimizer, settings: ApiSettings) -> None:
        self.optimizer = optimizer
        self.settings = settings
        self.requests: Counter[tuple[str, int]] = Counter()
        self.started = time.time()
        self._runner: web.AppRunner | None = None
        self.port = settings.port
        self.console = Console(optimizer)

    @property
    def url(self) -> str:
        host = self.settings.listen if self.settings.listen not in ("", "0.0.0.0", "::") else "127.0.0.1"
        return f"http://{host}:{self.port}/"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._count, _headers])
        api = JsonApi(self.optimizer, self.settings)
        console = self.console
        app.router.add_get("/", console.overview)
        app.router.add_get("/recommendations", console.recommendations)
        app.router.add_get("/findings", console.findings)
        app.router.add_get("/workload", console.workload)
        app.router.add_get("/owners", console.owners)
        app.router.add_static("/static/", STATIC, append_version=False)
        app.router.add_get("/healthz", api.healthz)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/api/v1/recommendations", api.recommendations)
        app.router.add_post("/api/v1/recommendations/{id}/{action}", api.change)
        app.router.add_get("/api/v1/workloads", api.workloads)
        app.router.add_get("/api/v1/nodes", api.nodes)
        app.router.add_get("/api/v1/plans", api.plans)
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.listen, self.settings.port)
        await site.start()
        addresses = self._runner.addresses
        if addresses:
            self.port = int(addresses[0][1])
        log.info("HTTP API and console on %s", self.url)
        self.console.warm()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _count(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            self.requests[(route, exc.status)] += 1
            raise
        self.requests[(route, response.status)] += 1
        return response

    async def metrics(self, request: web.Request) -> web.Response:
        families = [*self.optimizer.self_metrics(), self._request_metrics()]
        return web.Response(text=render(families), content_type="text/plain", charset="utf-8")

    def _request_metrics(self) -> Family:
        return Family(
            "fleetfit_http_requests_total",
            "counter",
            "HTTP requests by route and status.",
            [({"route": r, "status": str(c)}, n) for (r, c), n in sorted(self.requests.items())],
        )


@web.middleware
async def _headers(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """The console loads nothing from elsewhere; the browser is told so, and refuses to frame it."""
    response = await handler(request)
    response.headers.setdefault(
        "Content-Security-Policy",
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'",
    )
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    return response
