"""The optimizer's HTTP API: recommendations, workloads and nodes as JSON, a page for people, health and
Prometheus self-metrics. Reading is open; changing a recommendation's state needs the bearer token."""

from __future__ import annotations

import hmac
import html
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from agent.config import secret_or_file
from agent.metrics import Family, render
from optimizer.lifecycle import OPEN, LifecycleError, RecState

if TYPE_CHECKING:
    from optimizer.service import Optimizer

log = logging.getLogger(__name__)

MAX_BODY = 4096


class ApiSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    listen: str = Field(default="127.0.0.1", description="address to bind; empty: no HTTP API")
    port: int = Field(default=8470, ge=0, le=65535)
    token: SecretStr | None = Field(default=None, description="bearer token for state changes (FLEETFIT_API_TOKEN)")
    token_file: Path | None = Field(default=None, description="file holding the bearer token (a credential)")

    @model_validator(mode="after")
    def _token_file(self) -> ApiSettings:
        self.token = secret_or_file(self.token, self.token_file, "token")
        return self


class Api:
    def __init__(self, optimizer: Optimizer, settings: ApiSettings) -> None:
        self.optimizer = optimizer
        self.settings = settings
        self.requests: Counter[tuple[str, int]] = Counter()
        self.started = time.time()
        self._runner: web.AppRunner | None = None
        self.port = settings.port

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._count])
        app.router.add_get("/", self.page)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/api/v1/recommendations", self.recommendations)
        app.router.add_post("/api/v1/recommendations/{id}/{action}", self.change)
        app.router.add_get("/api/v1/workloads", self.workloads)
        app.router.add_get("/api/v1/nodes", self.nodes)
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.listen, self.settings.port)
        await site.start()
        addresses = self._runner.addresses
        if addresses:
            self.port = int(addresses[0][1])
        log.info("HTTP API on http://%s:%d/", self.settings.listen, self.port)

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

    # ------------------------------------------------------------------ read paths

    def _plans(self) -> list[dict[str, object]]:
        return [p.model_dump(mode="json", by_alias=True) for p in self.optimizer.plans.values()]

    async def recommendations(self, request: web.Request) -> web.Response:
        state = request.query.get("state")
        lifecycle = self.optimizer.lifecycle
        if lifecycle is None:  # no state directory: the current plans are all there is
            rows = [dict(r, state="new", site=p["site"]) for p in self._plans() for r in p["recommendations"]]  # type: ignore[attr-defined]
            return web.json_response(rows)
        if state == "all":
            states = list(RecState)
        elif state:
            try:
                states = [RecState(state)]
            except ValueError:
                raise web.HTTPBadRequest(text=f"unknown state {state!r}\n") from None
        else:
            states = list(OPEN)
        tracked = lifecycle.list(request.query.get("site"), states)
        return web.json_response(
            [
                {
                    **t.recommendation.model_dump(mode="json"),
                    "site": t.site,
                    "state": t.state.value,
                    "first_seen": t.first_seen,
                    "last_seen": t.last_seen,
                }
                for t in tracked
            ]
        )

    async def workloads(self, request: web.Request) -> web.Response:
        return web.json_response(
            [dict(w, site=p["site"]) for p in self._plans() for w in p["workloads"]]  # type: ignore[attr-defined]
        )

    async def nodes(self, request: web.Request) -> web.Response:
        out = []
        for (site, name), record in sorted(self.optimizer.fleet.nodes.items()):
            birth = record.birth
            out.append(
                {
                    "site": site,
                    "node": name,
                    "status": record.status.value,
                    "session": record.session,
                    "gpus": len(birth.gpus) if birth else 0,
                    "gpu_model": birth.gpus[0].model if birth and birth.gpus else None,
                    "windows_held": len(record.windows),
                    "last_window_end": record.windows[-1].end if record.windows else None,
                }
            )
        return web.json_response(out)

    async def healthz(self, request: web.Request) -> web.Response:
        ok = self.optimizer.connected.is_set()
        health = self.optimizer.health()
        # a failing site or a node left out is degraded service, not a dead daemon: 200, for probes that restart
        status = "broker unreachable" if not ok else "degraded" if any(health.values()) else "ok"
        body = {"status": status, "nodes": len(self.optimizer.fleet.nodes), **health}
        return web.json_response(body, status=200 if ok else 503)

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

    async def page(self, request: web.Request) -> web.Response:
        rows = []
        for p in self.optimizer.plans.values():
            for r in p.recommendations:
                rows.append(
                    "<tr>"
                    + "".join(
                        f"<td>{html.escape(str(v))}</td>"
                        for v in (
                            r.workload_name,
                            r.workload_class.value,
                            f"{r.from_node} ({r.from_hardware})",
                            f"{r.to_node} ({r.to_hardware})",
                            f"${r.monthly_savings_usd:,.0f}",
                            r.risk,
                            r.reason,
                        )
                    )
                    + "</tr>"
                )
        total = sum(p.monthly_savings_usd for p in self.optimizer.plans.values())
        body = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>fleetfit recommendations</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}</style></head>
<body><h1>fleetfit recommendations</h1>
<p id="summary">{len(rows)} recommended move(s), saving ${total:,.0f} a month.</p>
<table id="recommendations"><thead><tr><th>workload</th><th>class</th><th>from</th><th>to</th><th>saving / month</th>
<th>risk</th><th>why</th></tr></thead><tbody>
{"".join(rows)}
</tbody></table></body></html>
"""
        return web.Response(text=body, content_type="text/html", charset="utf-8")

    # ------------------------------------------------------------------ state changes

    async def change(self, request: web.Request) -> web.Response:
        token = self.settings.token
        given = request.headers.get("Authorization", "")
        if token is None:
            raise web.HTTPForbidden(text="state changes are disabled: no API token is configured\n")
        if not hmac.compare_digest(given.encode(), f"Bearer {token.get_secret_value()}".encode()):
            raise web.HTTPUnauthorized(
                text="a valid bearer token is required\n", headers={"WWW-Authenticate": "Bearer"}
            )
        await request.read()  # a state change carries no body; a large one is refused (413) here
        actions = {"ack": RecState.ACKNOWLEDGED, "dismiss": RecState.DISMISSED, "reopen": RecState.NEW}
        action = request.match_info["action"]
        if action not in actions:
            raise web.HTTPBadRequest(text=f"unknown action {action!r}; use ack, dismiss or reopen\n")
        if self.optimizer.lifecycle is None:
            raise web.HTTPConflict(text="this optimizer keeps no recommendation state\n")
        try:
            tracked = self.optimizer.lifecycle.set_state(request.match_info["id"], actions[action])
        except LifecycleError as exc:
            status = web.HTTPNotFound if "no recommendation" in str(exc) else web.HTTPConflict
            raise status(text=f"{exc}\n") from None
        return web.json_response({"id": tracked.recommendation.id, "state": tracked.state.value})
