"""The aiohttp application: routes, request counting, start and stop.

Every client is a stranger: a request must name a Host this server answers to (a page elsewhere cannot reach the
API through DNS rebinding), be sent within ``header_timeout`` and answered within ``request_timeout``; at most
``max_connections`` are open at once, and a new one past that pushes out the longest-open one that never sent a
request. Every response, error pages included, carries the content-security policy and ``nosniff``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import psutil
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from agent.metrics import Family, render
from optimizer.serve import audit
from optimizer.serve.audit import AuditLog
from optimizer.serve.config import ApiSettings
from optimizer.serve.selfmetrics import optimizer_metrics
from optimizer.serve.service import Optimizer
from optimizer.serve.tokens import Role
from optimizer.serve.web.access import Access
from optimizer.serve.web.api import JsonApi
from optimizer.serve.web.pages import Console

log = logging.getLogger(__name__)

MAX_BODY = 4096
STATIC = Path(__file__).parent / "static"
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
}
WILDCARDS = ("", "0.0.0.0", "::")
# open even when reads need a token: probes and Prometheus scrape these, and the sign-in page needs its script
OPEN_PATHS = ("/healthz", "/metrics")


def _bare_host(value: str) -> str:
    """The host of a Host header, lower case, without its port or IPv6 brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def allowed_hosts(settings: ApiSettings) -> frozenset[str]:
    """The names a request's Host header may give: the listen address, loopback names, ``settings.hosts``, and
    when listening on every address, this machine's names and addresses."""
    names = {"localhost", "127.0.0.1", "::1", *(_bare_host(h) for h in settings.hosts)}
    if settings.listen not in WILDCARDS:
        names.add(_bare_host(settings.listen))
    else:
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        for addresses in psutil.net_if_addrs().values():
            for a in addresses:
                if a.family in (socket.AF_INET, socket.AF_INET6):
                    names.add(a.address.split("%", 1)[0].lower())
    return frozenset(n for n in names if n)


class WebServer:
    """The optimizer's HTTP API and console on ``settings.listen:settings.port`` (port 0: a free one)."""

    def __init__(self, optimizer: Optimizer, settings: ApiSettings) -> None:
        self.optimizer = optimizer
        self.settings = settings
        self.requests: Counter[tuple[str, int]] = Counter()
        self.started = time.time()
        self._runner: web.AppRunner | None = None
        self.port = settings.port
        self.access = Access(settings)
        self.audit_log, self._own_audit = self._audit_log()
        self.console = Console(optimizer, self.audit_log)
        self.hosts = allowed_hosts(settings)
        self.refused: Counter[str] = Counter()  # connections and requests refused, by reason
        self._opened: dict[RequestHandler, float] = {}  # open connections -> when each opened
        self._served: set[RequestHandler] = set()  # open connections that sent a request

    def _audit_log(self) -> tuple[AuditLog | None, bool]:
        """The audit log in the optimizer's state file (the process's own when it set one there), and whether
        this server opened it."""
        tracker = self.optimizer.tracker
        if tracker is None:
            return None, False
        path = tracker.lifecycle.path
        current = audit.current()
        if current is not None and current.path == path:
            return current, False
        return AuditLog(path, self.settings.audit_retention_days, self.settings.audit_max_entries), True

    @property
    def url(self) -> str:
        host = self.settings.listen if self.settings.listen not in ("", "0.0.0.0", "::") else "127.0.0.1"
        return f"http://{host}:{self.port}/"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._count, self._guard, self._reads])
        app.on_response_prepare.append(_security_headers)
        api = JsonApi(self.optimizer, self.settings, self.access, self.audit_log)
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
        app.router.add_get("/api/v1/audit", api.audit)
        app.router.add_get("/api/v1/whoami", api.whoami)
        app.router.add_post("/api/v1/tokens/reload", api.reload_tokens)
        return app

    async def start(self) -> None:
        # keepalive_timeout also closes a connection that has not sent a whole request by then (aiohttp 3.14);
        # the server's own timer below does so whatever aiohttp does
        self._runner = web.AppRunner(self.app(), access_log=None, keepalive_timeout=self.settings.header_timeout)
        await self._runner.setup()
        server = self._runner.server
        assert server is not None
        admit = server.connection_made
        loop = asyncio.get_running_loop()

        def connection_made(handler: RequestHandler, transport: asyncio.Transport) -> None:
            self._make_room(handler)
            self._opened[handler] = loop.time()
            loop.call_later(self.settings.header_timeout, self._deadline, handler)
            admit(handler, transport)

        server.connection_made = connection_made  # type: ignore[method-assign]
        lost = server.connection_lost

        def connection_lost(handler: RequestHandler, exc: BaseException | None = None) -> None:
            self._opened.pop(handler, None)
            self._served.discard(handler)
            lost(handler, exc)

        server.connection_lost = connection_lost  # type: ignore[method-assign]
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
        if self._own_audit and self.audit_log is not None:
            self.audit_log.close()  # no request is left to write to it

    def _make_room(self, newcomer: RequestHandler) -> None:
        """At the cap, close the longest-open connection that never sent a request (a slow or idle client), else
        the longest-open one: a new client is always heard, and no number of slow ones takes every descriptor."""
        if len(self._opened) < self.settings.max_connections:
            return
        silent = [h for h in self._opened if h not in self._served]
        victim = min(silent or self._opened, key=self._opened.__getitem__)
        del self._opened[victim]
        self.refused["connection_cap"] += 1
        if self.refused["connection_cap"] in (1, 100) or self.refused["connection_cap"] % 10_000 == 0:
            log.warning(
                "HTTP: %d connections open (api.max_connections); closing the oldest that %s (%d so far)",
                self.settings.max_connections,
                "sent no request" if silent else "is idle",
                self.refused["connection_cap"],
            )
        victim.force_close()

    def _deadline(self, handler: RequestHandler) -> None:
        """Close a connection that has not sent a whole request within ``header_timeout`` of opening."""
        if handler in self._opened and handler not in self._served:
            self.refused["header_timeout"] += 1
            handler.force_close()

    @web.middleware
    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Host check, a deadline for the whole request, and 400 for what cannot be decoded."""
        protocol = request.protocol
        if isinstance(protocol, RequestHandler) and protocol in self._opened:
            self._served.add(protocol)
        host = request.headers.get("Host")
        if host is not None and _bare_host(host) not in self.hosts:
            self.refused["host"] += 1
            raise web.HTTPMisdirectedRequest(
                text=f"this server does not answer to {host[:100]!r} (api.hosts lists the names it does)\n"
            )
        try:
            async with asyncio.timeout(self.settings.request_timeout):
                return await handler(request)
        except TimeoutError:
            self.refused["request_timeout"] += 1
            raise web.HTTPRequestTimeout(text="the request took too long\n") from None
        except UnicodeError:  # a header or parameter that is no text
            self.refused["bad_header"] += 1
            raise web.HTTPBadRequest(text="a header or parameter is not valid text\n") from None

    @web.middleware
    async def _reads(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """With ``read_requires_token``, every read but health, metrics and the console's own files needs a viewer's
        token (the console's pages take it from the cookie its script sets); a page asks for it."""
        path = request.path
        if (
            not self.settings.read_requires_token
            or request.method not in ("GET", "HEAD")
            or path in OPEN_PATHS
            or path.startswith("/static/")
            or path in ("/api/v1/audit", "/api/v1/whoami")  # these check the token themselves
        ):
            return await handler(request)
        page = not path.startswith("/api/")
        try:
            self.access.require(request, Role.VIEWER, cookie=page)
        except web.HTTPException as exc:
            if not page:
                raise
            return self.console.sign_in(exc.status, (exc.text or "").strip())
        return await handler(request)

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
        families = [*optimizer_metrics(self.optimizer), *self._request_metrics()]
        return web.Response(text=render(families), content_type="text/plain", charset="utf-8")

    def _request_metrics(self) -> list[Family]:
        return [
            Family(
                "fleetfit_http_requests_total",
                "counter",
                "HTTP requests by route and status.",
                [({"route": r, "status": str(c)}, n) for (r, c), n in sorted(self.requests.items())],
            ),
            Family(
                "fleetfit_http_refused_total",
                "counter",
                "HTTP connections and requests refused: connection_cap, header_timeout, request_timeout, host, "
                "bad_header.",
                [({"reason": r}, n) for r, n in sorted(self.refused.items())],
            ),
            Family("fleetfit_http_connections", "gauge", "HTTP connections open.", [({}, len(self._opened))]),
            *self._access_metrics(),
        ]

    def _access_metrics(self) -> list[Family]:
        tokens = self.access.tokens
        return [
            Family(
                "fleetfit_api_auth_refused_total",
                "counter",
                "API requests refused for their token: no_token, malformed, unknown_token (401), role (403).",
                [({"reason": r}, n) for r, n in sorted(self.access.refused.items())],
            ),
            Family(
                "fleetfit_api_tokens",
                "gauge",
                "API tokens in force, by role (the old shared token counts as one admin).",
                [({"role": r.value}, tokens.roles().get(r.value, 0)) for r in Role],
            ),
            Family(
                "fleetfit_api_token_lines_rejected_total",
                "counter",
                "Lines of the tokens file rejected at each read: fields, name, role, hash, duplicate_token.",
                [({"reason": r}, n) for r, n in sorted(tokens.rejected.items())],
            ),
            Family(
                "fleetfit_api_tokens_file_stale",
                "gauge",
                "1 when the tokens file changed but could not be read: the tokens read last stay in force.",
                [({}, 1 if tokens.problem else 0)],
            ),
            Family(
                "fleetfit_api_shared_token",
                "gauge",
                "1 while the old shared token ([api] token) is accepted (as an admin named shared-token).",
                [({}, 1 if tokens.shared else 0)],
            ),
            Family(
                "fleetfit_audit_unrecorded_total",
                "counter",
                "Audit entries logged but not written to the state file: no_state_file, database.",
                [({"reason": r}, n) for r, n in sorted(audit.unrecorded.items())],
            ),
        ]


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """The console loads nothing from elsewhere; the browser is told so, refuses to frame it, and takes every
    response (error pages included) for the type it says it is."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
