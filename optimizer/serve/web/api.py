"""The JSON API: recommendations, workloads and nodes, health, the audit log, and the one write: a person's
decision on a recommendation. Reading is open (or needs a viewer's token, ``[api] read_requires_token``);
deciding needs an approver's token, and every decision, refused ones included, is audited under its holder."""

from __future__ import annotations

import logging
import math
import sqlite3
from collections.abc import Mapping
from datetime import UTC, datetime

from aiohttp import web

from optimizer.ingest.dcgm import SOURCE as PROMETHEUS
from optimizer.plan.render import action_fields, numbered
from optimizer.serve import audit
from optimizer.serve.audit import AuditLog
from optimizer.serve.config import ApiSettings
from optimizer.serve.lifecycle import OPEN, Lifecycle, LifecycleError, RecState, Tracked
from optimizer.serve.outcomes import Outcome
from optimizer.serve.report import UNATTRIBUTED, site_owners
from optimizer.serve.service import Optimizer
from optimizer.serve.tokens import SHARED_NAME, Role
from optimizer.serve.web.access import Access

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


def parse_since(value: str) -> float:
    """A ``since`` filter: Unix seconds, or an ISO 8601 date or time (UTC unless it says otherwise)."""
    wrong = web.HTTPBadRequest(text=f"since {value[:40]!r}: give Unix seconds or an ISO 8601 date or time\n")
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):  # float() takes "nan", which SQLite compares as NULL: an empty answer
            raise wrong
        return seconds
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise wrong from None
    return at.timestamp() if at.tzinfo else at.replace(tzinfo=UTC).timestamp()


class JsonApi:
    def __init__(
        self,
        optimizer: Optimizer,
        settings: ApiSettings,
        access: Access | None = None,
        audit_log: AuditLog | None = None,
    ) -> None:
        self.optimizer = optimizer
        self.settings = settings
        self.access = access or Access(settings)
        self.audit_log = audit_log

    async def _audit(self, action: str, who: str, where: str, target: str, result: str, detail: str) -> None:
        """One audit entry, written on the state file's writer thread (never on the loop)."""
        tracker = self.optimizer.tracker
        if tracker is None or self.audit_log is None:
            audit.record(action, who, where, target, result, detail, into=self.audit_log)
            return
        await tracker.write(audit.record, action, who, where, target, result, detail, into=self.audit_log)

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
                    # 1: an agent that sends no process facts (clients, program), which most unclassified need
                    "schema": birth.schema_ if birth else None,
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
        if not self.access.configured:
            raise web.HTTPForbidden(text="state changes are disabled: no API token is configured\n")
        holder = self.access.holder(request)
        await request.read()  # a state change carries no body; a large one is refused (413) here
        action = request.match_info["action"]
        if action not in ACTIONS:
            raise web.HTTPBadRequest(text=f"unknown action {action!r}; use ack, dismiss or reopen\n")
        rec_id = request.match_info["id"][:200]
        where = self.access.client(request)
        try:
            self.access.permit(holder, Role.APPROVER)
        except web.HTTPForbidden:
            await self._audit(action, holder.name, where, rec_id, audit.FORBIDDEN, f"a {holder.role.value} may not")
            raise
        tracker = self.optimizer.tracker
        if tracker is None:
            raise web.HTTPConflict(text="this optimizer keeps no recommendation state\n")
        try:
            tracked = await tracker.write(tracker.lifecycle.set_state, rec_id, ACTIONS[action])
        except LifecycleError as exc:
            await self._audit(action, holder.name, where, rec_id, audit.REFUSED, str(exc))
            status = web.HTTPNotFound if "no recommendation" in str(exc) else web.HTTPConflict
            raise status(text=f"{exc}\n") from None
        except sqlite3.OperationalError as exc:  # another process held the write lock past the timeout
            log.warning("recommendation %s not changed: %s", rec_id[:64], exc)
            await self._audit(action, holder.name, where, rec_id, audit.FAILED, str(exc))
            raise web.HTTPServiceUnavailable(text=f"recommendation state is busy ({exc}); try again\n") from None
        await self._audit(action, holder.name, where, rec_id, audit.OK, tracked.state.value)
        return web.json_response({"id": tracked.recommendation.id, "state": tracked.state.value})

    async def whoami(self, request: web.Request) -> web.Response:
        """The holder of the request's token and their role (the console shows who is signed in)."""
        holder = self.access.holder(request)
        body: dict[str, object] = {"name": holder.name, "role": holder.role.value}
        if holder.name == SHARED_NAME:
            body["note"] = "the old shared token: decisions made with it name nobody; ask for a token of your own"
        return web.json_response(body)

    async def audit(self, request: web.Request) -> web.Response:
        """The audit log, the latest first: ``workload``, ``who``, ``since`` filter; ``limit`` (at most 500) and
        ``before`` (the ``next`` of an earlier page) page through it. Needs a viewer's token: it names people and
        their addresses."""
        self.access.require(request, Role.VIEWER)
        q = request.query
        try:
            limit = int(q.get("limit", "100"))
            before = int(q["before"]) if "before" in q else None
        except ValueError:
            raise web.HTTPBadRequest(text="limit and before are whole numbers\n") from None
        if not 1 <= limit <= audit.PAGE_MAX:
            raise web.HTTPBadRequest(text=f"limit is 1 to {audit.PAGE_MAX}\n")
        since = parse_since(q["since"]) if "since" in q else None
        tracker, audit_log = self.optimizer.tracker, self.audit_log
        if tracker is None or audit_log is None:
            return web.json_response({"entries": [], "next": None, "note": "this optimizer keeps no state file"})
        try:
            entries = await tracker.read(
                lambda _: audit_log.query(q.get("workload"), q.get("who"), since, before, limit)
            )
        except sqlite3.Error as exc:
            raise web.HTTPServiceUnavailable(text=f"audit log unreadable: {exc}\n") from None
        following = None
        if len(entries) == limit:
            following = str(request.rel_url.update_query(before=str(entries[-1].id)))
        return web.json_response({"entries": [e.as_json() for e in entries], "next": following})

    async def reload_tokens(self, request: web.Request) -> web.Response:
        """Reread the tokens file now (it is reread when it changes anyway); admin only, audited."""
        holder = self.access.require(request, Role.ADMIN)
        tokens = self.access.tokens
        tokens.refresh(force=True)
        result = audit.FAILED if tokens.problem else audit.OK
        detail = tokens.problem or ", ".join(f"{n} {role}" for role, n in sorted(tokens.roles().items()))
        await self._audit("reload_tokens", holder.name, self.access.client(request), "tokens_file", result, detail)
        return web.json_response({"tokens": dict(tokens.roles()), "problem": tokens.problem})
