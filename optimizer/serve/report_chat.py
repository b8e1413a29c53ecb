"""The showback report as a chat message, for a weekly digest per owner (opt-in):
``fleetfit report --since 7d --post RECEIVER`` from a timer, through the alert receivers already configured.

Owner names come from agents. In chat they are reduced to the characters real namespaces, Slurm accounts and
units use, ``@`` is defused, and the table sits in a code block, so a name can neither mention a channel nor
smuggle in a link; the generic JSON carries them as data.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from optimizer.serve.report import By, Showback

MAX_ROWS = 20
SLACK_SECTION = 2900  # of Slack's 3,000 characters per section, after escaping
_UNSAFE = re.compile(r"[^A-Za-z0-9._:/()+ -]")

Json = dict[str, Any]


def safe_name(key: str) -> str:
    """An owner name reduced to plain characters (others become ``?``), at most 40 of them."""
    return _UNSAFE.sub("?", key)[:40]


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def _line(r: Showback) -> str:
    hours = sum(r.gpus.values())
    return (
        f"{safe_name(r.key):<24} {hours:>9,.0f} GPU-h {r.held_usd:>11,.0f} $ held {r.wasted_total:>9,.0f} $ wasted "
        f"{r.open_savings_usd_month:>9,.0f} $/month open"
    )


def _title(by: By, since: float, now: float) -> str:
    return f"GPU showback per {by}, {_when(since)} to {_when(now)}"


def _totals(rows: list[Showback]) -> str:
    return (
        f"{len(rows)} {'entry' if len(rows) == 1 else 'entries'}: {sum(sum(r.gpus.values()) for r in rows):,.0f} "
        f"GPU-hours, ${sum(r.held_usd for r in rows):,.0f} held, ${sum(r.wasted_total for r in rows):,.0f} wasted, "
        f"${sum(r.open_savings_usd_month for r in rows):,.0f}/month of open savings"
    )


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _table(rows: list[Showback], shown: int) -> str:
    lines = [_line(r) for r in rows[:shown]]
    if len(rows) > shown:
        lines.append(f"… and {len(rows) - shown} more (fleetfit report)")
    return "\n".join(lines) or "nothing accounted in this period"


def _slack(rows: list[Showback], by: By, since: float, now: float, shown: int) -> Json:
    table = _slack_escape(_table(rows, shown))
    while len(table) > SLACK_SECTION and shown > 1:  # whole lines only: never cut inside an escape
        shown -= 1
        table = _slack_escape(_table(rows, shown))
    title = _title(by, since, now)
    return {
        "text": title,
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": title[:150]}},
            {"type": "section", "text": {"type": "mrkdwn", "text": f"```{table}```"}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": _slack_escape(_totals(rows))}]},
        ],
    }


def _mattermost(rows: list[Showback], by: By, since: float, now: float, shown: int) -> Json:
    return {"text": f"#### {_title(by, since, now)}\n```\n{_table(rows, shown)}\n```\n{_totals(rows)}"}


def _teams(rows: list[Showback], by: By, since: float, now: float, shown: int) -> Json:
    facts = [
        {
            "title": safe_name(r.key),
            "value": f"{sum(r.gpus.values()):,.0f} GPU-h · ${r.held_usd:,.0f} held · ${r.wasted_total:,.0f} wasted · "
            f"${r.open_savings_usd_month:,.0f}/month open",
        }
        for r in rows[:shown]
    ]
    body: list[Json] = [
        {"type": "TextBlock", "text": _title(by, since, now), "size": "Large", "weight": "Bolder", "wrap": True},
        {"type": "TextBlock", "text": _totals(rows), "wrap": True, "isSubtle": True},
    ]
    if facts:
        body.append({"type": "FactSet", "facts": facts})
    if len(rows) > shown:
        body.append({"type": "TextBlock", "text": f"and {len(rows) - shown} more (fleetfit report)", "wrap": True})
    card = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": body,
    }
    return {
        "type": "message",
        "attachments": [
            {"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": None, "content": card}
        ],
    }


def _generic(rows: list[Showback], by: By, since: float, now: float, shown: int) -> Json:
    return {
        "kind": "fleetfit.showback",
        "version": 1,
        "by": by,
        "since": since,
        "until": now,
        "rows": [r.as_json() for r in rows[:shown]],
        "omitted": max(len(rows) - shown, 0),
    }


_RENDER = {"slack": _slack, "mattermost": _mattermost, "teams": _teams, "generic": _generic}


def render(kind: str, rows: list[Showback], by: By, since: float, max_bytes: int, now: float | None = None) -> bytes:
    """The message for a receiver of ``kind``, at most ``max_bytes``: fewer rows (and "and N more") until it fits."""
    now = time.time() if now is None else now
    shown = min(len(rows), MAX_ROWS)
    while True:
        body = json.dumps(_RENDER[kind](rows, by, since, now, shown), ensure_ascii=False).encode()
        if len(body) <= max_bytes or shown == 0:
            return body
        shown -= 1
