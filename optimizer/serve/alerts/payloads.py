"""Message bodies per platform, each fitted under its size limit by listing fewer moves and saying
"and N more". What agents name (workload ids and names, nodes, the site) is set apart for each platform: in code
spans for Slack (with every mrkdwn object ``verbatim``) and Mattermost, escaped with its URLs broken for Teams, as
data for the generic webhook (:mod:`optimizer.serve.alerts.escape`).

- Slack: incoming webhook with Block Kit (``blocks`` + ``text`` fallback; at most 50 blocks).
- Mattermost: its Slack-compatible ``attachments``.
- Microsoft Teams Workflows: an Adaptive Card in a message attachment.
- Generic: :class:`GenericAlert`, a documented and versioned JSON schema (docs/alerts.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from agent.protocol import Finding, Recommendation
from optimizer.plan.render import (
    action_text,
    finding_text,
    kind_of,
    savings_by_kind,
    total_text,
    waits,
    waves_of,
)
from optimizer.serve.alerts import escape
from optimizer.serve.alerts.notice import Item, Notice
from optimizer.serve.alerts.settings import ReceiverKind, Severity

Json = dict[str, Any]

SLACK_MAX_BLOCKS = 50
SLACK_MAX_ITEMS = 44  # header, summary, 44 moves, resolved, waiting on their node, footer with "more": 49 blocks
SECTION_CHARS = 3000  # Slack's limits on a section's text and on a field
FIELD_CHARS = 2000
COLOURS = {Severity.CRITICAL: "#d00000", Severity.WARNING: "#e8a200", Severity.INFO: "#439fe0"}
RESOLVED_COLOUR = "#2eb67d"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _same(text: str) -> str:
    return text


Escape = Callable[[str], str]
# What a recommendation carries from agents: the workload's id and name and the nodes, which are set apart as
# names (``name``); the hardware is the catalog's, escaped as text.
_NAMED = ("workload", "workload_name", "from_node", "to_node", "via_node")


def _named(r: Recommendation, name: Escape, esc: Escape) -> Recommendation:
    """``r`` with what agents named set apart by ``name`` and the hardware escaped by ``esc``, to be put into words
    by ``action_text`` (the one place an action is worded)."""
    update: dict[str, object] = {f: name(v) for f in _NAMED if isinstance(v := getattr(r, f), str) and v}
    update |= {"from_hardware": esc(r.from_hardware), "to_hardware": esc(r.to_hardware)}
    return r.model_copy(update=update)


def _headline(item: Item, number: int, name: Escape = _same, esc: Escape = _same) -> str:
    """The action as every listing of a plan words it, numbered in the order to carry it out."""
    tag = " (reminder)" if item.status == "reminder" else ""
    return f"{number}. {action_text(_named(item.recommendation, name, esc))}{tag}"


def _facts(item: Item, numbers: dict[str, int], esc: Callable[[str], str] = _same) -> list[tuple[str, str]]:
    r = item.recommendation
    wave = str(r.wave or 1)
    if waiting := waits(r, numbers):
        wave += f", {esc(waiting)}"
    return [
        ("Wave", wave),
        ("Saving", f"${r.monthly_savings_usd:,.0f}/month"),
        ("Class", f"{r.workload_class.value}, {r.confidence:.0%} sure"),
        ("Risk", f"{esc(r.risk)} · {item.severity.value}"),
        ("Impact", esc(_clip(r.performance_impact or "none expected", 300))),
    ]


def _resolved_line(item: Item, name: Escape = _same, esc: Escape = _same) -> str:
    r = item.recommendation
    if item.status == "carried_out":
        how = f"carried out: {esc(_clip(item.detail, 300))}"
    elif item.status == "failed":
        how = f"failed: {esc(_clip(item.detail, 300))}"
    else:
        how = f"applied: now on {esc(r.to_hardware)}" if item.status == "applied" else "expired: no longer proposed"
    return f"{action_text(_named(r, name, esc))}: {how}"


WAITING_TITLE = "GPUs waiting on their node"
# A finding's evidence and fix as chat shows them: a line stays a few hundred characters, so five fit one Slack
# section (3000) and the moves keep the rest of a message
WAITING_DETAIL_CHARS = 400
WAITING_FIX_CHARS = 300


def _waiting_lines(notice: Notice, name: Escape, esc: Escape) -> list[str]:
    """Each waiting finding in the words the plan's text uses (``finding_text``), its evidence and fix clipped."""
    out = []
    for f in notice.waiting:
        short = f.model_copy(
            update={
                "detail": _clip(f.detail, WAITING_DETAIL_CHARS),
                "fix": None if f.fix is None else _clip(f.fix, WAITING_FIX_CHARS),
            }
        )
        out.append(finding_text(short, name, esc))
    return out


def _summary(notice: Notice) -> str:
    recs = [i.recommendation for i in notice.firing]
    return f"{len(recs)} recommended action(s) in {waves_of(recs)} wave(s), {total_text(recs)} in all"


def _title(notice: Notice, name: Escape) -> str:
    """The notice's title with the (agent-reported) site name set apart by ``name``."""
    return notice.title().replace(f"· {notice.site}:", f"· {name(notice.site)}:", 1)


def _more(n: int) -> str:
    return f"and {n} more"


def _mrkdwn(text: str) -> Json:
    """A Slack mrkdwn text object that Slack sends as written: no URL or channel name made a link, no mention
    parsed from plain text (``verbatim``); fleetfit's own link is written as ``<url|label>``, which it still reads."""
    return {"type": "mrkdwn", "text": text, "verbatim": True}


def slack(notice: Notice, firing: list[Item], resolved: list[Item], omitted: int) -> Json:
    md, code, clip = escape.slack, escape.slack_code, escape.slack_clip
    blocks: list[Json] = [
        {"type": "header", "text": {"type": "plain_text", "text": _clip(notice.title(), 150)}},
    ]
    numbers = notice.numbers
    if notice.firing:
        blocks.append({"type": "section", "text": _mrkdwn(f"{md(_summary(notice))} (site {code(notice.site)}).")})
    for item in firing:
        r = item.recommendation
        headline = _headline(item, numbers[item.id], code, md)
        blocks.append(
            {
                "type": "section",
                "text": _mrkdwn(clip(f"*{headline}*\n{md(r.reason)}", SECTION_CHARS)),
                "fields": [_mrkdwn(clip(f"*{k}*\n{v}", FIELD_CHARS)) for k, v in _facts(item, numbers, md)],
            }
        )
    if resolved:
        lines = ["*Resolved*"]
        for i in resolved:  # as many lines as the section holds; the rest count as "more"
            line = f"• {_resolved_line(i, code, md)}"
            if len("\n".join([*lines, line])) > SECTION_CHARS:
                break
            lines.append(line)
        omitted += len(resolved) - (len(lines) - 1)
        blocks.append({"type": "section", "text": _mrkdwn("\n".join(lines))})
    if notice.waiting:
        lines = [f"*{WAITING_TITLE}*"]
        for line in _waiting_lines(notice, code, md):  # as many as the section holds
            if len("\n".join([*lines, f"– {line}"])) > SECTION_CHARS - 20:
                lines.append(f"_{_more(len(notice.waiting) - len(lines) + 1)}_")
                break
            lines.append(f"– {line}")
        blocks.append({"type": "section", "text": _mrkdwn("\n".join(lines))})
    footer = [_mrkdwn(f"fleetfit plan of {_when(notice.generated_at)}")]
    if omitted:
        footer.insert(0, _mrkdwn(f"*{_more(omitted)}*"))
    if notice.link:
        footer.append(_mrkdwn(escape.slack_link(notice.link, "all recommendations")))
    blocks.append({"type": "context", "elements": footer})
    # no previews fetched from any link in the message: fleetfit's own link needs none
    return {"text": _title(notice, code), "blocks": blocks, "unfurl_links": False, "unfurl_media": False}


def mattermost(notice: Notice, firing: list[Item], resolved: list[Item], omitted: int) -> Json:
    md, code, plain = escape.markdown, escape.markdown_code, escape.plain
    attachments: list[Json] = []
    numbers = notice.numbers
    for item in firing:
        r = item.recommendation
        attachments.append(
            {
                "fallback": f"{_headline(item, numbers[item.id], plain, plain)}, ${r.monthly_savings_usd:,.0f}/month",
                "color": COLOURS[item.severity],
                "title": _headline(item, numbers[item.id], code, md),  # Mattermost renders a title's links
                "text": md(_clip(r.reason, 2000)),
                "fields": [{"short": k != "Impact", "title": k, "value": v} for k, v in _facts(item, numbers, md)],
            }
        )
    if resolved:
        attachments.append(
            {
                "fallback": f"{len(resolved)} resolved",
                "color": RESOLVED_COLOUR,
                "title": "Resolved",
                "text": "\n".join(f"- {_resolved_line(i, code, md)}" for i in resolved),
            }
        )
    if notice.waiting:
        attachments.append(
            {
                "fallback": f"{len(notice.waiting)} {WAITING_TITLE}",
                "title": WAITING_TITLE,
                "text": "\n".join(f"- {line}" for line in _waiting_lines(notice, code, md)),
            }
        )
    text = f"**{_title(notice, code)}**"
    if notice.firing:
        text += f"\n{md(_summary(notice))}"
    if omitted:
        text += f"\n_{_more(omitted)}_"
    if notice.link:
        text += f"\n[all recommendations]({escape.markdown_url(notice.link)})"
    return {"username": "fleetfit", "text": text, "attachments": attachments}


def teams(notice: Notice, firing: list[Item], resolved: list[Item], omitted: int) -> Json:
    md = escape.markdown
    body: list[Json] = [
        {"type": "TextBlock", "text": _title(notice, md), "size": "Large", "weight": "Bolder", "wrap": True},
        {"type": "TextBlock", "text": f"fleetfit plan of {_when(notice.generated_at)}", "isSubtle": True},
    ]
    if notice.firing:
        body.append({"type": "TextBlock", "text": md(_summary(notice)), "wrap": True})
    numbers = notice.numbers
    for item in firing:
        headline = _headline(item, numbers[item.id], md, md)
        body.append(
            {
                "type": "Container",
                "separator": True,
                "items": [
                    {"type": "TextBlock", "text": headline, "weight": "Bolder", "wrap": True},
                    {"type": "TextBlock", "text": md(_clip(item.recommendation.reason, 1000)), "wrap": True},
                    {"type": "FactSet", "facts": [{"title": k, "value": v} for k, v in _facts(item, numbers, md)]},
                ],
            }
        )
    if resolved:
        lines = "\n".join(f"- {_resolved_line(i, md, md)}" for i in resolved)
        body.append({"type": "TextBlock", "text": f"**Resolved**\n\n{lines}", "wrap": True, "separator": True})
    if notice.waiting:
        lines = "\n".join(f"- {line}" for line in _waiting_lines(notice, md, md))
        body.append({"type": "TextBlock", "text": f"**{WAITING_TITLE}**\n\n{lines}", "wrap": True, "separator": True})
    if omitted:
        body.append({"type": "TextBlock", "text": _more(omitted), "isSubtle": True})
    card: Json = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "msteams": {"width": "Full"},
        "body": body,
    }
    if notice.link:
        card["actions"] = [{"type": "Action.OpenUrl", "title": "All recommendations", "url": notice.link}]
    return {
        "type": "message",
        "attachments": [
            {"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": None, "content": card}
        ],
    }


class GenericMove(BaseModel):
    id: str
    status: Literal["new", "reminder", "applied", "expired", "carried_out", "failed"]
    severity: Severity
    workload: str
    workload_name: str
    workload_class: str
    confidence: float
    gpus: int
    from_node: str
    from_hardware: str
    to_node: str
    to_hardware: str
    monthly_savings_usd: float
    risk: str
    reason: str
    performance_impact: str
    evidence: list[str]
    # within version 1, only added (docs/alerts.md): the kind of action and its place in the plan's order
    kind: str = "move"
    wave: int | None = None
    after: list[str] = Field(default_factory=list)
    swap: list[str] = Field(default_factory=list)
    gpus_after: float | None = None
    blocked_by: list[str] = Field(default_factory=list)
    number: int | None = Field(default=None, description="its place in the order to carry the actions out (firing)")
    action: str = Field(default="", description="the action in words, as the console and the command line put it")
    detail: str = Field(default="", description="carried_out or failed: the backend and its command, or its output")


class GenericWaiting(BaseModel):
    """GPUs waiting on the rest of their node: a finding of the plan, fixed on its node rather than by a move."""

    workload: str
    workload_name: str
    kind: str
    hardware: str
    nodes: list[str]
    wasted_usd_per_hour: float
    detail: str
    fix: str | None = None
    text: str = Field(description="the finding in words, as the plan's text (fleetfit plan, the demo) says it")


class GenericAlert(BaseModel):
    """The generic webhook body (``schema`` ``fleetfit.alert``, ``version`` 1)."""

    schema_: Literal["fleetfit.alert"] = Field(default="fleetfit.alert", alias="schema")
    version: Literal[1] = 1
    site: str
    generated_at: datetime
    title: str
    severity: Severity = Field(description="the highest severity among the firing moves")
    monthly_savings_usd: float = Field(description="all firing moves together, including omitted ones")
    savings_by_kind: dict[str, float] = Field(
        default_factory=dict, description="the same, per kind of action (move, reclaim, right_size, consolidate)"
    )
    firing: list[GenericMove]
    resolved: list[GenericMove]
    omitted: int = Field(ge=0, description="moves left out to stay under the receiver's size limit")
    link: str | None = None
    waiting: list[GenericWaiting] = Field(
        default_factory=list, description="the plan's costliest GPUs waiting on their node (added within version 1)"
    )


def _generic_waiting(f: Finding) -> GenericWaiting:
    return GenericWaiting(
        workload=f.workload,
        workload_name=f.workload_name,
        kind=f.kind.value,
        hardware=f.hardware,
        nodes=f.nodes,
        wasted_usd_per_hour=f.wasted_usd_per_hour,
        detail=f.detail,
        fix=f.fix,
        text=finding_text(f),
    )


def _generic_move(item: Item, number: int | None = None) -> GenericMove:
    fields = item.recommendation.model_dump(mode="json")
    fields["kind"] = kind_of(item.recommendation)
    return GenericMove(
        **fields,
        status=item.status.value,
        severity=item.severity,
        number=number,
        action=action_text(item.recommendation),
        detail=item.detail,
    )


def generic(notice: Notice, firing: list[Item], resolved: list[Item], omitted: int) -> Json:
    numbers = notice.numbers  # sorts every firing action: once per message, not once per action
    alert = GenericAlert(
        site=notice.site,
        generated_at=datetime.fromtimestamp(notice.generated_at, UTC),
        title=notice.title(),
        severity=notice.severity,
        monthly_savings_usd=round(notice.monthly_savings, 2),
        savings_by_kind={k: round(v, 2) for k, v in savings_by_kind(i.recommendation for i in notice.firing).items()},
        firing=[_generic_move(i, numbers[i.id]) for i in firing],
        resolved=[_generic_move(i) for i in resolved],
        omitted=omitted,
        link=notice.link,
        waiting=[_generic_waiting(f) for f in notice.waiting],
    )
    return alert.model_dump(mode="json", by_alias=True)


Renderer = Callable[[Notice, list[Item], list[Item], int], Json]
RENDERERS: dict[str, Renderer] = {"slack": slack, "mattermost": mattermost, "teams": teams, "generic": generic}


def _encode(body: Json) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def render(kind: ReceiverKind, notice: Notice, max_bytes: int) -> bytes:
    """The body for ``kind``, listing as many moves (firing first, then resolved) as fit in ``max_bytes``."""
    renderer = RENDERERS[kind]
    firing, resolved = notice.firing, notice.resolved
    cap_firing = SLACK_MAX_ITEMS if kind == "slack" else len(firing)

    def build(shown: int, waiting: int = len(notice.waiting)) -> bytes:
        f = firing[: min(shown, cap_firing)]
        r = resolved[: max(0, shown - len(f))]
        said = notice if waiting == len(notice.waiting) else replace(notice, waiting=notice.waiting[:waiting])
        return _encode(renderer(said, f, r, len(firing) + len(resolved) - len(f) - len(r)))

    lo, hi = 0, len(firing) + len(resolved)
    best = build(hi)
    if len(best) <= max_bytes:
        return best
    # GPUs waiting on their node ride along with the moves: a finding on hundreds of nodes can say more than the
    # receiver takes, so the costliest are kept only as far as they leave room for the first move
    keep = len(notice.waiting)
    while keep and len(build(min(1, hi), keep)) > max_bytes:
        keep -= 1
    best = build(0, keep)
    while lo < hi:  # the most moves that fit
        mid = (lo + hi + 1) // 2
        body = build(mid, keep)
        if len(body) <= max_bytes:
            lo, best = mid, body
        else:
            hi = mid - 1
    return best
