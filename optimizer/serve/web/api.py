"""The JSON API: recommendations, workloads and nodes, health, and the one write: a person's decision on a
recommendation. Reading is open; changing a recommendation's state needs the bearer token."""

from __future__ import annotations

import hmac
import logging
import sqlite3
from collections.abc import Mapping

from aiohttp import web

from optimizer.ingest.dcgm import SOURCE as PROMETHEUS
from optimizer.plan.render import action_fields, numbered
from optimizer.serve.config import ApiSettings
from optimizer.serve.lifecycle import OPEN, Lifecycle, LifecycleError, RecState, Tracked
from optimizer.serve.outcomes import Outcome
from optimizer.serve.report import UNATTRIBUTED, site_owners
from optimizer.serve.service import Optimizer

log = logging.getLogger(__name__)

ACTIONS = {"ack": RecState.ACKNOWLEDGED, "dismiss": RecState.DISMISSED, "reopen": RecState.NEW}


def tracked_json(
    t: Tracked,
    owners: dict[tuple[str, str], str],
    outcome: Outcome | None = None,
    number: Mapping[str, int] | None = None,
) -> dict[str, object]:
    """A recommendation with its number in its plan's order, its state, owner and, once applied, the load
    observed against the projection."""
    return {
        **t.recommendation.model_dump(mode="json"),
        **action_fields(t.recommendation, number or {}),
        "owner": owners.get((t.site, t.recommendation.workload), UNATTRIBUTED),
        "site": t.site,
        "state": t.state.value,
        "first_seen": t.first_seen,
        "last_seen": t.last_seen,
        "outcome": outcome.as_json() if outcome is not None else None,
    }


class JsonApi:
    def __init__(self, optimizer: Optimizer, settings: ApiSettings) -> None:
        self.optimizer = optimizer
        self.settings = settings

    def _plans(self) -> list[dict[str, object]]:
        return [p.model_dump(mode="json", by_alias=True) for p in self.optimizer.plans.values()]

    async def recommendations(self, request: web.Request) -> web.Response:
        state = request.query.get("state")
        tracker = self.optimizer.tracker
        if tracker is None:  # no state directory: the current plans are all there is
            plans = list(self.optimizer.plans.values())
            rows = [
                {
                    **r.model_dump(mode="json"),
                    **action_fields(r, numbered(p.recommendations)),
                    "state": "new",
                    "site": p.site,
                }
                for p in plans
                for r in p.recommendations
            ]
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
        site = request.query.get("site")
        owners = site_owners(self.optimizer.fleet)

        def query(db: Lifecycle) -> tuple[list[Tracked], dict[str, Outcome], dict[str, tuple[str | None, str | None]]]:
            rows = db.list(site, states)
            gone = [t.recommendation.id for t in rows if (t.site, t.recommendation.workload) not in owners]
            applied = (t.recommendation.id for t in rows if t.state is RecState.APPLIED)
            return rows, db.outcomes_of(applied), db.kept_owners(gone)

        try:
            tracked, outcomes, kept = await tracker.read(query)
        except sqlite3.Error as exc:
            raise web.HTTPServiceUnavailable(text=f"recommendation state unreadable: {exc}\n") from None
        for t in tracked:  # an applied move's workload left the fleet: the one that continued it, or its last owner
            follow, owner = kept.get(t.recommendation.id, (None, None))
            if (found := owners.get((t.site, follow)) if follow else None) or owner:
                owners[(t.site, t.recommendation.workload)] = found or owner or UNATTRIBUTED
        numbers = {p.site: numbered(p.recommendations) for p in self.optimizer.plans.values()}
        return web.json_response(
            [tracked_json(t, owners, outcomes.get(t.recommendation.id), numbers.get(t.site)) for t in tracked]
        )

    async def plans(self, request: web.Request) -> web.Response:
        """Each site's current plan as published (the protocol's ``Plan``: actions, blocked moves, purchases)."""
        site = request.query.get("site")
        return web.json_response([p for p in self._plans() if site is None or p["site"] == site])

    async def workloads(self, request: web.Request) -> web.Response:
        owners = site_owners(self.optimizer.fleet)
        return web.json_response(
            [
                dict(w, site=p["site"], owner=owners.get((str(p["site"]), str(w["id"])), UNATTRIBUTED))
                for p in self._plans()
                for w in p["workloads"]  # type: ignore[attr-defined]
            ]
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
                    "source": "prometheus" if birth and birth.agent_version == PROMETHEUS else "agent",
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
        # which sites this optimizer plans, when several share the broker (docs/operations.md, Scaling out)
        ownership = self.optimizer.ownership.view()
        body = {"status": status, "nodes": len(self.optimizer.fleet.nodes), **health, "ownership": ownership}
        return web.json_response(body, status=200 if ok else 503)

    async def change(self, request: web.Request) -> web.Response:
        token = self.settings.token
        given = request.headers.get("Authorization", "")
        if token is None:
            raise web.HTTPForbidden(text="state changes are disabled: no API token is configured\n")
        if not given.isascii():  # a bearer token is ASCII; anything else is no credential at all
            raise web.HTTPBadRequest(text="the Authorization header is not ASCII\n")
        if not hmac.compare_digest(given.encode(), f"Bearer {token.get_secret_value()}".encode()):
            raise web.HTTPUnauthorized(
                text="a valid bearer token is required\n", headers={"WWW-Authenticate": "Bearer"}
            )
        await request.read()  # a state change carries no body; a large one is refused (413) here
        action = request.match_info["action"]
        if action not in ACTIONS:
            raise web.HTTPBadRequest(text=f"unknown action {action!r}; use ack, dismiss or reopen\n")
        tracker = self.optimizer.tracker
        if tracker is None:
            raise web.HTTPConflict(text="this optimizer keeps no recommendation state\n")
        try:
            tracked = await tracker.write(tracker.lifecycle.set_state, request.match_info["id"], ACTIONS[action])
        except LifecycleError as exc:
            status = web.HTTPNotFound if "no recommendation" in str(exc) else web.HTTPConflict
            raise status(text=f"{exc}\n") from None
        except sqlite3.OperationalError as exc:  # another process held the write lock past the timeout
            log.warning("recommendation %s not changed: %s", request.match_info["id"][:64], exc)
            raise web.HTTPServiceUnavailable(text=f"recommendation state is busy ({exc}); try again\n") from None
        return web.json_response({"id": tracked.recommendation.id, "state": tracked.state.value})
