"""The console says each finding in the words the plan's text and chat say it (optimizer/plan/render.py), on
the overview, the findings page and the workload page, with every part escaped; the API carries the fix."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote

import aiohttp
from test_console import TOKEN, console

from agent.protocol import Finding, FindingKind
from optimizer.plan.render import FindingWords, finding_text, finding_words

VOID = {"br", "img", "meta", "link", "input", "hr", "col", "wbr", "source"}


class Texts(HTMLParser):
    """The text of every element as a browser shows it, with its attributes, and each table row's cells."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[tuple[str, dict[str, str], list[str], list[str]]] = []
        self.elements: list[tuple[str, dict[str, str], str]] = []
        self.rows: list[list[str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in VOID:
            self.open.append((tag, {k: v or "" for k, v in attrs}, [], []))

    def handle_data(self, data: str) -> None:
        for _, _, text, _ in self.open:
            text.append(data)

    def handle_endtag(self, tag: str) -> None:
        while self.open:
            name, attrs, text, cells = self.open.pop()
            self.elements.append((name, attrs, "".join(text)))
            if name == "td":
                row = next((c for n, _, _, c in reversed(self.open) if n == "tr"), None)
                if row is not None:
                    row.append("".join(text))
            if name == "tr" and cells:
                self.rows.append(cells)
            if name == tag:
                return

    def having(self, tag: str, **attrs: str) -> list[str]:
        return [t for n, a, t in self.elements if n == tag and all(a.get(k) == v for k, v in attrs.items())]


def parsed(page: str) -> Texts:
    texts = Texts()
    texts.feed(page)
    texts.close()
    return texts


HOSTILE = '<script>alert("x")</script> & '
# What each kind is called everywhere, and its cost as written: the kind's words and "$ an hour" with thousands.
CASES = [
    (FindingKind.INPUT_STARVED_TRAINING, 4004.5, "input starved training", "$4,004.50/hour", "add loader workers"),
    (FindingKind.CHECKPOINT_STALL, 3003.25, "checkpoint stall", "$3,003.25/hour", "checkpoint asynchronously"),
    (FindingKind.SLOW_COLD_START, 2002.0, "slow cold start", "$2,002.00/hour", "cache the model on local NVMe"),
    (FindingKind.MIXED_NODE, 1001.75, "mixed node", "$1,001.75/hour", None),
    (FindingKind.THROTTLED_GPU, 1500.0, "throttled gpu", "$1,500.00/hour", "check the cooling and power limit"),
]


async def test_the_console_says_each_finding_in_the_words_of_the_plan_and_chat(tmp_path: Path) -> None:
    """Four rest-of-node findings and a throttled GPU, with markup in their detail and fix: the overview's problem
    list, the findings table and the workload page show each one's kind, cost, detail and fix in the words
    ``finding_text`` (plan text, chat) uses, escaped (the text parsed out equals the words), the fix marked up on its
    own, and ``/api/v1/plans`` carries the fix.
    Deliberate bugs caught: the console writing a kind in its own words (``f.kind.value`` with its underscores,
    as pages.py once did beside render.py), the cost without thousands separators, and a fix dropped from a page."""
    async with console(tmp_path) as (optimizer, base), aiohttp.ClientSession() as http:
        plan = optimizer.plans["lab"]
        w = plan.workloads[0]
        findings = [
            Finding(
                workload=w.id,
                workload_name=w.name,
                kind=kind,
                hardware=w.hardware,
                nodes=w.nodes,
                wasted_usd_per_hour=cost,
                confidence=0.9,
                detail=f"{HOSTILE}{said} detail",
                fix=f"{HOSTILE}{fix}" if fix else None,
            )
            for kind, cost, said, _, fix in CASES
        ]
        optimizer.plans["lab"] = plan.model_copy(update={"findings": findings})
        for f, (_, _, said, cost, fix) in zip(findings, CASES, strict=True):
            words = finding_words(f)
            assert words == FindingWords(said, cost, f"{HOSTILE}{said} detail", f"{HOSTILE}{fix}" if fix else "")
            # the plan's text and chat say the same parts
            assert f": {said}, {cost} ({words.detail})" in finding_text(f)
            assert (f"; fix: {words.fix}" in finding_text(f)) == bool(fix)

        async with http.get(base + "/") as r:
            page = await r.text()
        overview = parsed(page.split('id="problems"')[1].split("</ol>")[0])
        items = overview.having("li")
        fixes = overview.having("span", **{"class": "fix"})
        assert len(items) == 5
        for item, f in zip(items, sorted(findings, key=lambda f: -f.wasted_usd_per_hour), strict=True):
            words = finding_words(f)
            head = f"{w.name} on {', '.join(w.nodes)} [{w.hardware}]: {words.kind}, {words.cost} — {words.detail}."
            assert item.startswith(head + (f" Fix: {words.fix}." if words.fix else " ")), item
        assert fixes == [
            f"Fix: {finding_words(f).fix}" for f in sorted(findings, key=lambda f: -f.wasted_usd_per_hour) if f.fix
        ]

        async with http.get(base + "/findings") as r:
            table = parsed(await r.text())
        rows = {row[3]: row for row in table.rows if len(row) == 8}
        for f in findings:
            words = finding_words(f)
            row = rows[words.kind]
            assert row[5] == words.cost and row[7] == words.detail + (f"Fix: {words.fix}" if words.fix else "")
        assert table.having("small", **{"class": "fix"}) == [f"Fix: {finding_words(f).fix}" for f in findings if f.fix]

        async with http.get(f"{base}/workload?id={quote(w.id)}") as r:
            shown = parsed(await r.text())
        lines = [t for t in shown.having("p", **{"class": "finding"}) if t.startswith("Finding: ")]
        expected = [
            f"Finding: {x.kind}, {x.cost} — {x.detail}" + (f" Fix: {x.fix}" if x.fix else "")
            for x in map(finding_words, findings)
        ]
        assert lines == expected
        assert shown.having("span", **{"class": "fix"}) == [f"Fix: {finding_words(f).fix}" for f in findings if f.fix]

        async with http.get(base + "/api/v1/plans", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
            served = await r.json()
        (lab,) = [p for p in served if p["site"] == "lab"]
        assert [x.get("fix") for x in lab["findings"]] == [f.fix for f in findings]
