"""The console: pages a capacity team reads every day, rendered on the server.

Every page is plain HTML with inline SVG charts, one stylesheet and one small script (for the
acknowledge / dismiss / reopen buttons), all served from here: nothing is fetched from elsewhere. Filters are
ordinary GET forms, so every page works from the keyboard and can be bookmarked. Agent-supplied text (workload
and owner names) is escaped everywhere.
"""

from __future__ import annotations

import asyncio
import html
import sqlite3
import time
from collections.abc import Iterable
from urllib.parse import urlencode

from aiohttp import web

from agent.protocol import Finding, NodeStatus, Plan, Recommendation, WorkloadClass, WorkloadView
from optimizer.act.backend import answer_of
from optimizer.plan.render import (
    KINDS,
    action_text,
    change,
    finding_words,
    kind_of,
    kind_word,
    numbered,
    order_key,
    projected_load,
    total_text,
    waits_cell,
    waves_of,
)
from optimizer.serve.audit import AuditLog, Entry
from optimizer.serve.executions import Execution
from optimizer.serve.lifecycle import OPEN, Lifecycle, RecState, Tracked
from optimizer.serve.outcomes import Outcome
from optimizer.serve.report import UNATTRIBUTED, By, live_showback, nodes_online, owners_of, site_owners
from optimizer.serve.service import Optimizer
from optimizer.serve.web.charts import bar_chart, line_chart
from optimizer.serve.web.views import OldAgents, Overview, Trend, hardware_sites, on_line, overview, unblock, where_else

MAX_ROWS = 200  # rows per table; the JSON API has the rest
NAV = (("/", "Overview"), ("/recommendations", "Recommendations"), ("/findings", "Findings"), ("/owners", "Owners"))


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def money(value: float, digits: int = 0) -> str:
    return f"${value:,.{digits}f}"


def layout(title: str, path: str, body: str) -> str:
    nav = "".join(
        f'<a href="{href}"{" aria-current=page" if href == path else ""}>{esc(label)}</a>' for href, label in NAV
    )
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · fleetfit</title>"
        '<link rel="stylesheet" href="/static/console.css"><script src="/static/console.js" defer></script>'
        '</head><body><a class="skip" href="#main">Skip to content</a>'
        f'<header><span class="brand">fleetfit</span><nav aria-label="Console">{nav}</nav>'
        '<span id="who" class="who" role="status"></span></header>'
        f'<main id="main"><h1>{esc(title)}</h1>{body}</main></body></html>\n'
    )


def table(
    caption: str, headers: Iterable[str], rows: list[list[str]], table_id: str, numeric: Iterable[int] = ()
) -> str:
    """A table of pre-escaped cells; ``numeric`` columns are right-aligned."""
    right = set(numeric)
    head = "".join(f'<th scope="col"{" class=num" if i in right else ""}>{esc(h)}</th>' for i, h in enumerate(headers))
    shown = rows[:MAX_ROWS]
    body = "".join(
        "<tr>" + "".join(f"<td{' class=num' if i in right else ''}>{c}</td>" for i, c in enumerate(r)) + "</tr>"
        for r in shown
    )
    more = f'<p class="note">{len(rows) - len(shown)} more not shown.</p>' if len(rows) > len(shown) else ""
    return (
        f'<table id="{table_id}"><caption>{esc(caption)}</caption><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table>{more}"
    )


def _observed(outcome: Outcome | None, projected: str) -> str:
    """What was seen after an action was applied; an action with a projection that is not applied yet says so."""
    if outcome is not None:
        return outcome.describe()
    return "not applied yet" if projected else ""


def workload_link(workload: str, name: str, site: str | None = None) -> str:
    """A link to a workload's page; ids are a site's own, so the link names the site."""
    query = {"id": workload} | ({"site": site} if site else {})
    return f'<a href="/workload?{urlencode(query)}">{esc(name or workload)}</a>'


def cards(items: list[tuple[str, str, str]]) -> str:
    return (
        '<section class="cards" aria-label="Summary">'
        + "".join(
            f'<div class="card" id="{i}"><span class="label">{esc(k)}</span><span class="value">{v}</span></div>'
            for i, k, v in items
        )
        + "</section>"
    )


class Console:
    def __init__(self, optimizer: Optimizer, audit_log: AuditLog | None = None) -> None:
        self.optimizer = optimizer
        self.audit_log = audit_log
        self._overview: tuple[tuple[int, int, int], Overview] | None = None
        self._refresh: asyncio.Future[Overview] | None = None
        self._trend = Trend()  # updated by one refresh at a time

    def _plans(self) -> list[Plan]:
        return [self.optimizer.plans[s] for s in sorted(self.optimizer.plans)]

    async def _tracked(self, states: list[RecState]) -> list[Tracked] | None:
        """The lifecycle's recommendations in ``states``, or None when the optimizer keeps no state."""
        tracker = self.optimizer.tracker
        if tracker is None:
            return None

        def query(db: Lifecycle) -> list[Tracked]:
            return db.list(None, states)

        try:
            return await tracker.read(query)
        except sqlite3.Error as exc:
            raise web.HTTPServiceUnavailable(text=f"recommendation state unreadable: {exc}\n") from None

    async def _open_ids(self) -> set[str]:
        tracked = await self._tracked(list(OPEN))
        if tracked is None:
            return {r.id for p in self._plans() for r in p.recommendations}
        return {t.recommendation.id for t in tracked}

    async def _owners_of(
        self, selected: list[tuple[str, Recommendation, str]], owners: dict[tuple[str, str], str]
    ) -> dict[str, str]:
        """Each action's owner: its workload's as the fleet reports it now; for one applied, the workload that
        continued it (a rescheduled pod has a new id) or the owner the showback ledger last charged it under."""
        out = {r.id: owners[(site, r.workload)] for site, r, _ in selected if (site, r.workload) in owners}
        missing = [r.id for _, r, _ in selected if r.id not in out]
        tracker = self.optimizer.tracker
        if not missing or tracker is None:
            return out

        def query(db: Lifecycle) -> dict[str, tuple[str | None, str | None]]:
            return db.kept_owners(missing)

        try:
            kept = await tracker.read(query)
        except sqlite3.Error:  # the owner column is a courtesy: the page stands without it
            return out
        sites = {r.id: site for site, r, _ in selected}
        for rec_id, (follow, owner) in kept.items():
            live = owners.get((sites[rec_id], follow)) if follow else None
            if live is not None or owner is not None:
                out[rec_id] = live or owner or UNATTRIBUTED
        return out

    async def _executions_of(self, rec_ids: list[str]) -> dict[str, Execution]:
        """What `fleetfit apply` last ran for each action, where it ran something."""
        tracker = self.optimizer.tracker
        if tracker is None or not rec_ids:
            return {}
        try:
            return await tracker.read(lambda db: db.executions_of(rec_ids))
        except sqlite3.Error:  # a courtesy, as the owner column: the page stands without it
            return {}

    def _page(self, title: str, path: str, body: str) -> web.Response:
        return web.Response(text=layout(title, path, body), content_type="text/html", charset="utf-8")

    def sign_in(self, status: int, why: str) -> web.Response:
        """The page shown in place of another when reading needs a token the browser did not give."""
        body = (
            f'<p id="sign-in">This console needs a viewer\'s token to read ({esc(why)}). Enter yours: it is kept '
            "for this browser session and the page reloads.</p>" + _token_box()
        )
        page = layout("Sign in", "", body)
        return web.Response(text=page, status=status, content_type="text/html", charset="utf-8")

    async def _decisions(self, workload: str) -> list[Entry]:
        """The audit log's entries for ``workload``, the latest first (empty without a state file)."""
        tracker, audit_log = self.optimizer.tracker, self.audit_log
        if tracker is None or audit_log is None:
            return []
        try:
            return await tracker.read(lambda _: audit_log.query(workload, limit=MAX_ROWS))
        except sqlite3.Error:  # the trail is a courtesy on this page: /api/v1/audit says what is wrong
            return []

    # ------------------------------------------------------------------ overview

    def warm(self) -> None:
        """Start computing the overview now, so that the first visitor does not wait for it."""
        self._refreshed()

    def _refreshed(self) -> tuple[int, int, int]:
        nodes = self.optimizer.fleet.nodes
        # a node going offline changes what is wasted now, plan or no plan
        offline = sum(1 for r in list(nodes.values()) if r.status is not NodeStatus.ONLINE)
        key = (self.optimizer.plans_made, len(nodes), offline)
        fresh = self._overview is not None and self._overview[0] == key
        if not fresh and (self._refresh is None or self._refresh.done()):
            loop = asyncio.get_running_loop()
            refresh = loop.run_in_executor(
                None, overview, self.optimizer.fleet, self._plans(), self.optimizer.catalog, self._trend
            )

            def keep(done: asyncio.Future[Overview]) -> None:
                if not done.cancelled() and done.exception() is None:
                    self._overview = (key, done.result())

            refresh.add_done_callback(keep)
            self._refresh = refresh
        return key

    async def _current_overview(self) -> Overview:
        """The overview of the current plans and fleet, recomputed off the loop once per plan (the first time, the
        trend walks every workload's day of digests: most of a second at 5,000 workloads). A request waits for the
        refresh rather than show an earlier plan's fleet and waste beside the current plan's problems and savings;
        a plan that comes while it waits is waited for too, a few times at most."""
        for _ in range(3):
            key = self._refreshed()
            kept = self._overview
            if kept is not None and kept[0] == key:
                return kept[1]
            assert self._refresh is not None
            await asyncio.shield(self._refresh)  # then kept, by its done callback, before this resumes
        kept = self._overview
        assert kept is not None
        return kept[1]

    async def overview(self, request: web.Request) -> web.Response:
        view = await self._current_overview()
        plans = self._plans()  # those the overview was made from (read after waiting for it)
        open_ids = await self._open_ids()
        savings = sum(r.monthly_savings_usd for p in plans for r in p.recommendations if r.id in open_ids)
        moves = sum(1 for p in plans for r in p.recommendations if r.id in open_ids)
        waste = sum(view.waste_by_kind.values())
        # what wastes now first; a finding whose nodes are all offline after them, said to waste nothing now (the
        # plan's action on it stands for when they are back)
        findings = sorted(
            ((p.site, f, on_line(p.site, f.nodes, view.online)) for p in plans for f in p.findings),
            key=lambda x: (not x[2], -x[1].wasted_usd_per_hour),
        )
        notes = [f"{view.offline:,} offline"] if view.offline else []
        notes += [f"{view.from_prometheus:,} from Prometheus"] if view.from_prometheus else []
        offline = f" ({', '.join(notes)})" if notes else ""
        body = [
            cards(
                [
                    ("card-nodes", "Nodes", f"{view.nodes:,}{offline}"),
                    ("card-gpus", "GPUs", f"{view.gpus:,}"),
                    ("card-workloads", "Workloads", f"{view.workloads:,}"),
                    ("card-waste", "Wasted now", f"{money(waste, 2)}/hour"),
                    ("card-savings", "Open savings", f'<a href="/recommendations">{money(savings)}/month</a>'),
                    ("card-moves", "Open moves", f"{moves}"),
                ]
            )
        ]
        ownership = self.optimizer.ownership
        if ownership.scoped:  # one of several optimizers sharing the broker: say which sites this one plans
            owned = ", ".join(ownership.planning) or "none"
            standby = ", ".join(ownership.standby) or "none"
            body.append(
                f'<p id="sites">Optimizer {esc(ownership.name)} plans {esc(owned)} '
                f"(its sites: {esc(', '.join(ownership.sites) or 'none')}; standing by for: {esc(standby)}).</p>"
            )
        plan_of = {p.site: p for p in plans}
        if not plans:
            body.append('<p class="empty">No plan yet: the first comes one solve interval after telemetry arrives.</p>')
        if view.offline:
            body.append(
                f'<p id="offline">{view.offline:,} node(s) offline: what they hold is not counted as wasted now, '
                "their problems come last, and showback does not charge them.</p>"
            )
        unclassified = next((c for c in view.classes if c.name == WorkloadClass.UNKNOWN.value), None)
        if unclassified is not None and unclassified.gpus:
            # no move is recommended for a workload whose class is unknown: what it wastes stays out of sight
            body.append(
                f'<p id="unclassified">{unclassified.workloads:,} workload(s) on {unclassified.gpus:,} GPU(s) have no '
                f"class, holding {money(unclassified.held_usd, 2)}/hour: no move is recommended for them until their "
                "class is known (each workload's page says what would decide it)."
                f"{_old_agents(view.old_agents)}</p>"
            )
        if findings:
            top = "".join(
                f"<li>{workload_link(f.workload, f.workload_name, site)} on {esc(', '.join(f.nodes))} "
                f"[{esc(f.hardware)}]: {esc(w.kind)}, "
                + (esc(w.cost) if up else f"nothing wasted now (its nodes are offline; {esc(w.cost)} as it ran)")
                + f" — {esc(where_else(w.detail, site, view.hardware_sites))}. "
                + (f'<span class="fix">Fix: {esc(w.fix)}</span>. ' if w.fix else "")
                + f"{_what_the_plan_does(plan_of[site], f)}</li>"
                for site, f, up in findings[:5]
                for w in [finding_words(f)]
            )
            body.append(
                f'<section><h2>Biggest problems</h2><ol id="problems">{top}</ol>'
                '<p><a href="/findings">All findings and blocked moves</a></p></section>'
            )
        hw_rows = [
            [
                esc(h.name),
                f"{h.nodes:,}",
                f"{h.offline:,}",
                f"{h.gpus:,}",
                f"{h.in_use:,}",
                money(h.price, 2),
                money(h.price * h.gpus, 0),
            ]
            for h in view.hardware
        ]
        cls_rows = [[esc(c.name), f"{c.workloads:,}", f"{c.gpus:,}", f"{c.mean_util:.0f} %"] for c in view.classes]
        body.append('<div class="grid"><section><h2>GPUs by hardware</h2>')
        body.append(
            table(
                "GPUs by hardware",
                ["hardware", "nodes", "offline", "GPUs", "in use", "$/GPU-hour", "$/hour"],
                hw_rows,
                "by-hardware",
                numeric=(1, 2, 3, 4, 5, 6),
            )
        )
        body.append("</section><section><h2>GPUs by class</h2>")
        body.append(
            table(
                "GPUs and utilisation by workload class",
                ["class", "workloads", "GPUs", "mean utilisation"],
                cls_rows,
                "by-class",
                numeric=(1, 2, 3),
            )
        )
        body.append("</section></div><section><h2>Wasted per hour, by finding kind</h2>")
        body.append(
            bar_chart(
                "US$ wasted per hour by finding kind",
                [(k.replace("_", " "), v) for k, v in view.waste_by_kind.items()],
                "${:,.2f}/h",
            )
        )
        body.append("</section><section><h2>Utilisation over the last day, by class</h2>")
        body.append(line_chart("Mean GPU utilisation by class, 10-minute digests", list(view.trend.items()), " %", 100))
        body.append("</section>")
        return self._page("Fleet overview", "/", "".join(body))

    # ------------------------------------------------------------------ recommendations

    async def recommendations(self, request: web.Request) -> web.Response:
        q = request.query
        want_site, want_class, want_kind = q.get("site", ""), q.get("class", ""), q.get("action", "")
        want_state = q.get("state", "open")
        plans = self._plans()
        # each site's plan numbers its actions in the order to carry them out; `after` refers to those numbers
        numbers = {p.site: numbered(p.recommendations) for p in plans}
        states = [s.value for s in RecState]
        if want_state == "open":
            wanted_states = {s.value for s in OPEN}
        elif want_state in states:
            wanted_states = {want_state}
        else:
            wanted_states = set(states)
        tracked = await self._tracked([RecState(s) for s in wanted_states])
        rows_src: list[tuple[str, Recommendation, str]]
        if tracked is None:
            rows_src = [(p.site, r, RecState.NEW.value) for p in plans for r in p.recommendations]
        else:
            rows_src = [(t.site, t.recommendation, t.state.value) for t in tracked]
        sites = sorted({s for s, _, _ in rows_src} | {p.site for p in plans})
        selected = [
            (site, r, state)
            for site, r, state in rows_src
            if state in wanted_states
            and (not want_site or site == want_site)
            and (not want_class or r.workload_class.value == want_class)
            and (not want_kind or kind_of(r) == want_kind)
        ]
        # execution order: the plan's order per site; actions no longer planned after them, in their own order
        unplanned = 10**6
        selected.sort(key=lambda x: (x[0], numbers.get(x[0], {}).get(x[1].id, unplanned), order_key(x[1])))
        owners = site_owners(self.optimizer.fleet)
        owner_of = await self._owners_of(selected, owners)
        rows = []
        for n, (site, r, state) in enumerate(selected, 1):
            number = numbers.get(site, {})
            rows.append(
                [
                    str(number[r.id]) if r.id in number else "–",
                    str(r.wave) if r.id in number and r.wave is not None else "–",
                    esc(waits_cell(r, number)) if r.id in number else "",
                    esc(site),
                    f"{esc(kind_word(r.kind))} {workload_link(r.workload, r.workload_name, site)}: {esc(change(r))}",
                    esc(owner_of.get(r.id, UNATTRIBUTED)),
                    esc(r.workload_class.value),
                    money(r.monthly_savings_usd),
                    esc(r.risk),
                    f'<span class="state" data-state="{esc(state)}">{esc(state)}</span>',
                    _buttons(r, state, n),
                ]
            )
        recs = [r for _, r, _ in selected]
        body = [
            _filters(sites, want_site, want_class, want_kind, want_state),
            _token_box(),
            f'<p id="summary">{len(selected)} action(s) shown, in {waves_of(recs)} wave(s), '
            f"{esc(_totals(selected))}. The actions of a wave can be carried out in parallel; one that "
            "waits for another (#2 under waits for) starts once that one is done. Acknowledge an action you will "
            "carry out, dismiss one you will not; the state lasts across plans.</p>",
            '<p id="status" role="status" aria-live="polite"></p>',
            table(
                "Recommended actions in the order to carry them out",
                [
                    "#",
                    "wave",
                    "waits for",
                    "site",
                    "action",
                    "owner",
                    "class",
                    "saving/month",
                    "risk",
                    "state",
                    "decide",
                ],
                rows,
                "recommendations",
                numeric=(0, 1, 7),
            ),
        ]
        shown = selected[:MAX_ROWS]
        ran = await self._executions_of([r.id for _, r, _ in shown])
        details = "".join(
            f"<li><strong>{esc(action_text(r))}</strong>: {esc(r.reason)}. Impact: {esc(r.performance_impact)}."
            f"{_ran(ran.get(r.id), r.id, state)}</li>"
            for _, r, state in shown
        )
        if details:
            body.append(f"<section><h2>Why</h2><ul>{details}</ul></section>")
        return self._page("Recommendations", "/recommendations", "".join(body))

    # ------------------------------------------------------------------ findings

    async def findings(self, request: web.Request) -> web.Response:
        plans = self._plans()
        owners = site_owners(self.optimizer.fleet)
        where = hardware_sites(self.optimizer.fleet, self.optimizer.catalog)
        findings = sorted(((p.site, f) for p in plans for f in p.findings), key=lambda x: -x[1].wasted_usd_per_hour)
        f_rows = [
            [
                esc(site),
                workload_link(f.workload, f.workload_name, site),
                esc(owners.get((site, f.workload), UNATTRIBUTED)),
                esc(w.kind),
                f"{esc(', '.join(f.nodes))} <small>[{esc(f.hardware)}]</small>",
                esc(w.cost),
                f"{f.confidence:.2f}",
                esc(where_else(w.detail, site, where))
                + (f'<br><small class="fix">Fix: {esc(w.fix)}</small>' if w.fix else ""),
            ]
            for site, f in findings
            for w in [finding_words(f)]
        ]
        blocked = sorted(((p.site, b) for p in plans for b in p.blocked), key=lambda x: -x[1].monthly_savings_usd)
        b_rows = [
            [
                esc(site),
                workload_link(b.workload, b.workload_name, site),
                f"{esc(b.node)} <small>[{esc(b.hardware)}]</small>",
                esc(b.reason),
                esc(unblock(b.reason)),
                money(b.monthly_savings_usd),
            ]
            for site, b in blocked
        ]
        waste = sum(f.wasted_usd_per_hour for _, f in findings)
        body = (
            f'<p id="summary">{len(findings)} finding(s) wasting {money(waste, 2)}/hour; '
            f"{len(blocked)} misplacement(s) the plan does not move.</p>"
            + "<section><h2>Findings</h2>"
            + table(
                "Misplacements and GPUs waiting on the rest of their node, most wasteful first",
                ["site", "workload", "owner", "kind", "where", "wasted", "confidence", "detail"],
                f_rows,
                "findings",
                numeric=(5, 6),
            )
            + "</section><section><h2>Blocked moves</h2>"
            + table(
                "Misplacements not moved, and what would unblock them",
                ["site", "workload", "where", "why not moved", "what would unblock it", "would save/month"],
                b_rows,
                "blocked",
                numeric=(5,),
            )
            + "</section>"
        )
        return self._page("Findings and blocked moves", "/findings", body)

    # ------------------------------------------------------------------ workload detail

    async def workload(self, request: web.Request) -> web.Response:
        found = self._find_workload(request)
        if len(found) > 1:
            return self._page("Workloads of that name", "", _choices(found))
        plan, w = found[0]
        wid = w.id
        owners = owners_of(self.optimizer.fleet, plan.site)
        history = []
        for node in w.nodes:
            record = self.optimizer.fleet.record(plan.site, node)
            if record is not None:
                history += [(node, d) for d in record.history.of(w.id)]
        util = [
            (f"mean utilisation ({node})", [(d.end, d.mean_util) for n, d in history if n == node]) for node in w.nodes
        ]
        peak = [(f"p95 peak ({node})", [(d.end, d.peak_p95) for n, d in history if n == node]) for node in w.nodes]
        memory = [
            (f"memory per GPU, GiB ({node})", [(d.end, d.mem_max_mib / 1024) for n, d in history if n == node])
            for node in w.nodes
        ]
        tracker = self.optimizer.tracker
        mine: tuple[Tracked, ...] = ()
        if tracker is not None:

            def query(db: Lifecycle) -> tuple[tuple[Tracked, ...], dict[str, Outcome]]:
                rows = db.of_workload(wid, plan.site)
                return rows, db.outcomes_of(t.recommendation.id for t in rows)

            try:
                mine, outcomes = await tracker.read(query)
            except sqlite3.Error as exc:
                raise web.HTTPServiceUnavailable(text=f"recommendation state unreadable: {exc}\n") from None
        rec_rows = [
            [
                esc(time.strftime("%Y-%m-%d %H:%M", time.gmtime(t.first_seen))),
                esc(time.strftime("%Y-%m-%d %H:%M", time.gmtime(t.changed))),
                esc(action_text(t.recommendation)),
                money(t.recommendation.monthly_savings_usd),
                f'<span class="state" data-state="{esc(t.state.value)}">{esc(t.state.value)}</span>',
                esc(projected_load(t.recommendation)),
                esc(_observed(outcomes.get(t.recommendation.id), projected_load(t.recommendation))),
            ]
            for t in mine
        ]
        if tracker is None:
            rec_rows = [
                [
                    "now",
                    "now",
                    esc(action_text(r)),
                    money(r.monthly_savings_usd),
                    "new",
                    esc(projected_load(r)),
                    "",
                ]
                for r in plan.recommendations
                if r.workload == wid
            ]
        findings = [f for f in plan.findings if f.workload == wid]
        blocked = [b for b in plan.blocked if b.workload == wid]
        facts = [
            ("Site", esc(plan.site)),
            ("Class", f'<span id="class">{esc(w.workload_class.value)}</span> (confidence {w.confidence:.2f})'),
            ("Owner", esc(owners.get(w.id, UNATTRIBUTED))),
            ("Hardware", f"{w.gpus} × {esc(w.hardware)} on {esc(', '.join(w.nodes))}"),
            ("Mean utilisation", f"{w.mean_util:.0f} %"),
            ("Id", f"<code>{esc(w.id)}</code>"),
            ("This page", f'<code id="address">/workload?{esc(urlencode({"site": plan.site, "name": w.name}))}</code>'),
        ]
        body = [
            "<dl class=facts>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>",
            "<section><h2>Evidence</h2><ul id=evidence>"
            + "".join(f"<li>{esc(e)}</li>" for e in w.evidence)
            + "</ul></section>",
        ]
        for said in map(finding_words, findings):
            body.append(
                f'<p class="finding">Finding: {esc(said.kind)}, {esc(said.cost)} — {esc(said.detail)}'
                + (f' <span class="fix">Fix: {esc(said.fix)}</span>' if said.fix else "")
                + "</p>"
            )
        for b in blocked:
            body.append(f'<p class="finding">Not moved: {esc(b.reason)}; {esc(unblock(b.reason))}.</p>')
        body.append("<section><h2>The last day</h2>")
        body.append(line_chart("GPU utilisation, 10-minute digests", util + peak, " %", 100))
        body.append(line_chart("GPU memory held per GPU", memory, " GiB"))
        body.append("</section><section><h2>Recommendation history</h2>")
        body.append(
            table(
                "Actions proposed for this workload",
                ["first proposed", "last change", "action", "saving/month", "state", "projected load", "observed load"],
                rec_rows,
                "history",
                numeric=(3,),
            )
        )
        body.append("</section><section><h2>Decisions</h2>")
        decisions = [
            [
                esc(time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e.at))),
                esc(e.who),
                esc(e.action),
                f'<span class="result" data-result="{esc(e.result)}">{esc(e.result)}</span>',
                esc(e.detail),
            ]
            for e in await self._decisions(wid)
        ]
        body.append(
            table(
                "Who decided on this workload's actions (UTC)",
                ["when", "who", "action", "result", "detail"],
                decisions,
                "decisions",
            )
        )
        body.append("</section>")
        return self._page(w.name or w.id, "", "".join(body))

    def _find_workload(self, request: web.Request) -> list[tuple[Plan, WorkloadView]]:
        """The workloads ``/workload`` names: by ``id`` (as links and the API give it) or by ``name`` (what people
        call it; an ``id`` that is no workload's is tried as a name too), in ``site`` when given. HTTP 404 with
        how to ask when none is."""
        q = request.query
        wid, name, site = q.get("id", ""), q.get("name", ""), q.get("site", "")
        plans = [p for p in self._plans() if not site or p.site == site]
        found = [(p, w) for p in plans for w in p.workloads if w.id == wid] if wid else []
        if not found and (name or wid):
            found = [(p, w) for p in plans for w in p.workloads if w.name == (name or wid)]
        if found:
            return found
        asked = ", ".join(f"{k} {esc(v[:200])}" for k, v in (("site", site), ("id", wid), ("name", name)) if v)
        raise web.HTTPNotFound(
            text=layout(
                "Workload not found",
                "",
                f"<p>No workload with {asked or 'no id or name'} in the current plans. A workload's page is "
                "<code>/workload?site=SITE&amp;name=NAME</code> (its name, as the plans show it) or "
                "<code>/workload?site=SITE&amp;id=ID</code> (its id, as <code>/api/v1/workloads</code> lists it).</p>",
            ),
            content_type="text/html",
        )

    # ------------------------------------------------------------------ owners

    async def owners(self, request: web.Request) -> web.Response:
        by_raw = request.query.get("by", "owner")
        by: By = by_raw if by_raw in ("owner", "site", "hardware") else "owner"  # type: ignore[assignment]
        fleet = self.optimizer.fleet
        open_ids = await self._open_ids()
        rows = live_showback(
            self._plans(), site_owners(fleet), self.optimizer.catalog, open_ids, by, online=nodes_online(fleet)
        )
        classes = [c.value for c in WorkloadClass if any(r.gpus.get(c.value) for r in rows)]  # those in use
        kinds = sorted({k for r in rows for k in r.wasted_usd})
        cells = [
            [
                esc(r.key),
                f"{r.workloads:,}" + (f" ({r.offline:,} offline)" if r.offline else ""),
                *(f"{r.gpus.get(c, 0):,.0f}" for c in classes),
                money(r.held_usd, 2),
                money(r.wasted_total, 2),
                esc(
                    ", ".join(f"{k.replace('_', ' ')} {money(r.wasted_usd[k], 2)}" for k in kinds if k in r.wasted_usd)
                ),
                money(r.open_savings_usd_month),
            ]
            for r in rows
        ]
        choices = "".join(
            f'<option value="{b}"{" selected" if b == by else ""}>{b}</option>' for b in ("owner", "site", "hardware")
        )
        body = (
            '<form class="filters" method="get" action="/owners"><label>Group by '
            f'<select name="by">{choices}</select></label><button type="submit">Show</button></form>'
            "<p>Now, from the current plans: GPUs held by class, what they cost and waste per hour, and the open "
            "savings. <code>fleetfit report</code> sums the same figures over time.</p>"
            + table(
                f"GPU use and waste per {by}",
                [
                    by,
                    "workloads",
                    *(f"{c.replace('_', ' ')} GPUs" for c in classes),
                    "$ held/hour",
                    "$ wasted/hour",
                    "wasted by kind",
                    "open savings/month",
                ],
                cells,
                "owners",
                numeric=(*tuple(range(1, len(classes) + 4)), len(classes) + 5),
            )
            + "<div class=grid><section><h2>Held per hour</h2>"
            + bar_chart(f"US$ held per hour per {by}", [(r.key, r.held_usd) for r in rows[:20]], "${:,.2f}/h", 520)
            + "</section><section><h2>Wasted per hour</h2>"
            + bar_chart(
                f"US$ wasted per hour per {by}",
                [(r.key, r.wasted_total) for r in rows if r.wasted_total][:20],
                "${:,.2f}/h",
                520,
            )
            + "</section></div>"
        )
        return self._page(f"GPU use per {by}", "/owners", body)


NODES_NAMED = 5  # node names the overview lists before "and N more": enough to start upgrading, short enough to read


def _old_agents(old: OldAgents) -> str:
    """The unclassified paragraph's sentences on workloads whose agents send no process facts (empty where none)."""
    if not old.workloads:
        return ""
    sites = {site for site, _ in old.nodes}
    names = [node if len(sites) == 1 else f"{node} ({site})" for site, node in old.nodes[:NODES_NAMED]]
    more = len(old.nodes) - len(names)
    listed = ", ".join(names) + (f" and {more:,} more" if more else "")
    return (
        f' <span id="old-agents">{old.workloads:,} of them ({old.gpus:,} GPU{"" if old.gpus == 1 else "s"}, '
        f"{money(old.held_usd, 2)}/hour) run on nodes whose agent sends no process facts (schema 1): upgrading "
        "fleetfit-agent there reads their clients and program, which decide most of them. "
        f"Node{'' if len(old.nodes) == 1 else 's'}: {esc(listed)}.</span>"
    )


def _what_the_plan_does(plan: Plan, f: Finding) -> str:
    """What the current plan does about a finding: its action, or why it does not move the workload."""
    action = next((r for r in plan.recommendations if r.workload == f.workload), None)
    if action is not None:
        return f"The plan: {esc(action_text(action))}."
    blocked = next((b for b in plan.blocked if b.workload == f.workload), None)
    if blocked is not None:
        return f"<strong>Not moved</strong>: {esc(blocked.reason)}; {esc(unblock(blocked.reason))}."
    if f.fix:  # GPUs waiting on the rest of their node, or slowed by it: fixed there, not by a move
        return "No move needed: the fix is on its node."
    return "No action planned."


def _totals(selected: list[tuple[str, Recommendation, str]]) -> str:
    """The savings of the actions shown: one total where they share a state, else one per state (open, applied,
    expired and dismissed savings are different money: open is to be had, applied was had)."""
    groups: dict[str, list[Recommendation]] = {}
    for _, r, state in selected:
        group = "open" if state in {s.value for s in OPEN} else state
        groups.setdefault(group, []).append(r)
    if len(groups) <= 1:
        return f"{total_text([r for _, r, _ in selected], money)} in all"
    order = ["open", *(s.value for s in RecState if s not in OPEN)]
    return "; ".join(f"{g} {total_text(groups[g], money)}" for g in order if g in groups)


def _ran(e: Execution | None, rec_id: str, state: str) -> str:
    """The scheduler's command for an action and its answer, as `fleetfit apply` recorded them (docs/apply.md)."""
    if e is None:
        if state != RecState.ACKNOWLEDGED:
            return ""
        return f' <span class="ran">Not carried out yet: <code>fleetfit apply {esc(rec_id)}</code>.</span>'
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(e.at))
    commands = "; ".join(e.commands) or "nothing to run"
    said = answer_of(e.output)  # the line `fleetfit apply` printed and chat was told
    return (
        f' <span class="ran" data-status="{esc(e.status)}">{esc(e.backend)}, {esc(when)} UTC, {esc(e.status)}: '
        f"<code>{esc(commands)}</code>{f' ({esc(said)})' if said and e.status != 'applied' else ''}.</span>"
    )


def _choices(found: list[tuple[Plan, WorkloadView]]) -> str:
    """Several workloads answer to one name (replicas of a service, or the same name in several sites)."""
    items = "".join(
        f"<li>{workload_link(w.id, w.name, p.site)} in site {esc(p.site)}: {w.gpus} × {esc(w.hardware)} on "
        f"{esc(', '.join(w.nodes))} (<code>{esc(w.id)}</code>)</li>"
        for p, w in found[:MAX_ROWS]
    )
    return f'<p>{len(found)} workloads answer to that name:</p><ul id="choices">{items}</ul>'


def _buttons(r: Recommendation, state: str, n: int) -> str:
    """The decisions a person may take on a move in ``state`` (the lifecycle enforces the same rules)."""
    allowed = []
    if state == RecState.NEW.value:
        allowed.append(("ack", "Acknowledge"))
    if state in (RecState.NEW.value, RecState.ACKNOWLEDGED.value):
        allowed.append(("dismiss", "Dismiss"))
    if state in (RecState.ACKNOWLEDGED.value, RecState.DISMISSED.value):  # reopening undoes either
        allowed.append(("reopen", "Reopen"))
    return "".join(
        f'<button type="button" class="decide" data-id="{esc(r.id)}" data-action="{a}" '
        f'aria-label="{label} {esc(r.workload_name)}">{label}</button>'
        for a, label in allowed
    )


def _select(
    name: str, label: str, options: list[str], chosen: str, any_label: str = "any", labels: dict[str, str] | None = None
) -> str:
    shown = labels or {}
    opts = f'<option value="">{any_label}</option>' if any_label else ""
    opts += "".join(
        f'<option value="{esc(o)}"{" selected" if o == chosen else ""}>{esc(shown.get(o, o))}</option>' for o in options
    )
    return f'<label>{esc(label)} <select name="{name}" id="filter-{name}">{opts}</select></label>'


def _filters(sites: list[str], site: str, cls: str, act: str, state: str) -> str:
    states = ["open", "all", *(s.value for s in RecState)]
    return (
        '<form class="filters" method="get" action="/recommendations" aria-label="Filter recommendations">'
        + _select("site", "Site", sites, site)
        + _select("class", "Class", [c.value for c in WorkloadClass], cls)
        + _select("action", "Action", list(KINDS), act, labels=KINDS)
        + _select("state", "State", states, state, any_label="")
        + '<button type="submit">Filter</button></form>'
    )


def _token_box() -> str:
    return (
        '<form id="token-form" class="token" aria-label="API token">'
        '<label>API token <input type="password" id="token" autocomplete="off" '
        'placeholder="needed to decide; kept for this browser session"></label>'
        '<button type="submit">Use token</button> <button type="button" id="token-forget">Forget</button> '
        '<span id="token-state"></span></form>'
    )
