"""`fleetfit demo` as a capacity team meets it, from one run: the plan it prints reads the same (kinds, order,
waits, totals) in the console, in every chat payload, in the API and in `fleetfit recommendations` from another
terminal; the console walks from the overview through the waves to a decision, the workload's page and the
owners; `fleetfit report` and `fleetfit recommendations` find the demo's state; Ctrl-C ends it, state kept.

Run with FLEETFIT_SCREENSHOTS=1 (`make screenshots`) to retake the pictures in docs/."""

from __future__ import annotations

import asyncio
import html
import json
import os
import queue
import re
import shlex
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import FLEETFIT
from test_console import _page_ok, _until, chromium, screenshot
from webhook_server import webhook_server

TOKEN_LINE = re.compile(r"console: (http://127\.0\.0\.1:\d+)/  \(token for its buttons: (\S+)\)")
KINDS = ("slack", "mattermost", "teams", "generic")


@dataclass
class DemoRun:
    proc: subprocess.Popen[str]
    base: str
    token: str
    state_line: str
    commands: list[str]
    terminal: list[str]  # stdout up to the end of the final plan
    posts: dict[str, Any]  # receiver kind -> the body it received
    env: dict[str, str]
    errors: list[str] = field(default_factory=list)  # stderr, once the demo has ended


def _lines(stream: Any, into: queue.Queue[str | None]) -> None:
    for line in stream:
        into.put(line.rstrip("\n"))
    into.put(None)


def _next(lines: queue.Queue[str | None], deadline: float) -> str:
    line = lines.get(timeout=max(deadline - time.monotonic(), 0.1))
    assert line is not None, "the demo ended early"
    return line


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoRun]:
    """One demo run of the full fleet, posting to a webhook of every kind, its console kept up."""
    tmp = tmp_path_factory.mktemp("demo")
    # the demo's own state directory under a home of this test's, and an optimizer state directory that holds
    # nothing, as on a machine where only the demo ran
    env = dict(os.environ, XDG_STATE_HOME=str(tmp / "state"), FLEETFIT_OPTIMIZER_STATE_DIR=str(tmp / "none"))
    with webhook_server() as hooks:
        (tmp / "hooks").write_text("".join(f"{kind}={hooks.url(f'/{kind}/s3cr3t')}\n" for kind in KINDS))
        command = [FLEETFIT, "demo", "--duration", "8", "--keep-serving", "--alert-webhook-file", str(tmp / "hooks")]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_lines, args=(proc.stdout, lines), daemon=True).start()
        try:
            deadline = time.monotonic() + 150
            found = TOKEN_LINE.fullmatch(_next(lines, deadline))  # the first line: where the console is
            assert found, "the console's address is not the first line"
            state_line = _next(lines, deadline)
            commands = [_next(lines, deadline), _next(lines, deadline)]
            terminal: list[str] = []
            while "final plan:" not in terminal or not terminal[-1].startswith("bound: "):  # the final plan's end
                terminal.append(_next(lines, deadline))
            posted = hooks.wait_for(len(KINDS), timeout=30)
            posts = {p.path.split("/")[1]: p.json() for p in posted}
            run = DemoRun(proc, found.group(1), found.group(2), state_line, commands, terminal, posts, env)
            yield run
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)


# ------------------------------------------------------------------------------ the plan, read everywhere


@dataclass(frozen=True)
class Listing:
    """A plan as one place lists it: (number, action in words, US$/month, what it waits for), and its total."""

    actions: list[tuple[int, str, int, str]]
    total: str


def _money(text: str) -> int:
    return int(text.replace("$", "").replace(",", "").split("/")[0].split(".")[0])


def _terminal(lines: list[str]) -> Listing:
    final = lines[max(i for i, line in enumerate(lines) if line == "final plan:") :]
    header = next(line for line in final if line.startswith("recommended actions, saving "))
    total = re.fullmatch(r"recommended actions, saving (.+), in \d+ wave\(s\) .*", header)
    assert total
    actions = []
    for i, line in enumerate(final):
        if m := re.fullmatch(r"\s+(\d+)\. (.+)  (\$[\d,]+)/month", line):
            waits = final[i + 1].strip() if not final[i + 1].strip().startswith("why: ") else ""
            actions.append((int(m.group(1)), m.group(2), _money(m.group(3)), waits))
    return Listing(actions, total.group(1))


def _cells(row: str) -> list[str]:
    return [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]


def _console(base: str) -> Listing:
    page = _get(f"{base}/recommendations")
    body = page[page.index('<table id="recommendations"') :]
    rows = [_cells(r) for r in re.findall(r"<tr>(.*?)</tr>", body[: body.index("</table>")], re.S)]
    actions = [(int(r[0]), r[4], _money(r[7]), f"waits for {r[2]}" if r[2] else "") for r in rows if r]
    summary = re.search(r'<p id="summary">\d+ action\(s\) shown, in \d+ wave\(s\), (.+?) in all\.', page)
    assert summary
    return Listing(actions, html.unescape(summary.group(1)))


def _cli(run: DemoRun) -> Listing:
    out = subprocess.run(
        shlex.split(run.commands[0]), capture_output=True, text=True, timeout=60, check=True, env=run.env
    ).stdout.splitlines()
    total = re.fullmatch(r"site demo: \d+ open action\(s\) in \d+ wave\(s\), saving (.+)", out[0])
    assert total, out[0]
    head = out[1]
    at = {h: head.index(h) for h in ("#", "WAVE", "WAITS FOR", "ID", "SAVING/MONTH", "RISK", "ACTION")}
    actions = []
    for line in out[2:]:
        waits = line[at["WAITS FOR"] : at["ID"]].strip()
        saving = line[at["SAVING/MONTH"] : at["RISK"]]
        actions.append(
            (
                int(line[: at["WAVE"]]),
                line[at["ACTION"] :],
                _money(saving.strip()),
                f"waits for {waits}" if waits else "",
            )
        )
    return Listing(actions, total.group(1))


def _unmarkdown(text: str) -> str:
    """Markdown as it reads: code spans' backticks gone (names from agents are set in them), escapes undone."""
    return re.sub(r"\\(.)", r"\1", re.sub(r"(?<!\\)`", "", text))


def _wave_field(value: str) -> str:
    return value.split(", ", 1)[1] if ", " in value else ""


def _chat(kind: str, body: dict[str, Any]) -> Listing:
    actions = []
    if kind == "slack":
        summary = body["blocks"][1]["text"]["text"]
        for block in body["blocks"]:
            if "fields" in block:
                number, action = block["text"]["text"].split("\n")[0].strip("*").split(". ", 1)
                facts = dict(f["text"].split("\n", 1) for f in block["fields"])
                actions.append(
                    (
                        int(number),
                        html.unescape(action.replace("`", "")),  # names from agents are set in code spans
                        _money(facts["*Saving*"]),
                        _wave_field(facts["*Wave*"]),
                    )
                )
    elif kind == "mattermost":
        summary = _unmarkdown(body["text"].split("\n")[1])
        for a in (a for a in body["attachments"] if "fields" in a):  # the actions, not what waits on its node
            number, action = _unmarkdown(a["title"]).split(". ", 1)
            facts = {f["title"]: _unmarkdown(f["value"]) for f in a["fields"]}
            actions.append((int(number), action, _money(facts["Saving"]), _wave_field(facts["Wave"])))
    elif kind == "teams":
        card = body["attachments"][0]["content"]
        summary = _unmarkdown(card["body"][2]["text"])
        for c in (b for b in card["body"] if b["type"] == "Container"):
            number, action = _unmarkdown(c["items"][0]["text"]).split(". ", 1)
            facts = {f["title"]: _unmarkdown(f["value"]) for f in c["items"][2]["facts"]}
            actions.append((int(number), action, _money(facts["Saving"]), _wave_field(facts["Wave"])))
    else:
        numbers = {m["id"]: m["number"] for m in body["firing"]}
        for m in body["firing"]:
            waits = f"waits for {', '.join(f'#{numbers[i]}' for i in m['after'])}" if m["after"] else ""
            actions.append((m["number"], m["action"], round(m["monthly_savings_usd"]), waits))
        by_kind = body["savings_by_kind"]
        parts = ", ".join(f"{k.replace('_', '-')} ${v:,.0f}" for k, v in by_kind.items())
        summary = f"${body['monthly_savings_usd']:,.0f}/month ({parts}) in all"
    found = re.search(r"(\$[\d,]+/month(?: \([^)]*\))?) in all", summary)
    assert found, summary
    return Listing(actions, found.group(1))


def _run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=True, env=env)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def test_the_plan_reads_the_same_in_the_terminal_console_chat_api_and_cli(demo: DemoRun) -> None:
    terminal = _terminal(demo.terminal)
    # the demo's story: every kind of action, in two waves, the second waiting on the first
    assert {a[1].split(" ", 1)[0] for a in terminal.actions} == {"move", "reclaim", "right-size"}
    assert [a[0] for a in terminal.actions] == list(range(1, len(terminal.actions) + 1))
    assert any(a[3].startswith("waits for #") for a in terminal.actions)
    assert re.fullmatch(r"\$[\d,]+/month \(move \$[\d,]+, reclaim \$[\d,]+, right-size \$[\d,]+\)", terminal.total)
    assert abs(_money(terminal.total) - sum(a[2] for a in terminal.actions)) <= len(terminal.actions)  # rounding
    seen = {"console": _console(demo.base), "recommendations": _cli(demo)}
    seen |= {kind: _chat(kind, demo.posts[kind]) for kind in KINDS}
    api = json.loads(_get(f"{demo.base}/api/v1/recommendations"))
    numbers = {r["id"]: r["number"] for r in api}
    seen["api"] = Listing(
        sorted((r["number"], r["action"], round(r["monthly_savings_usd"]), r["waits"]) for r in api),
        terminal.total,
    )
    assert all(
        r["waits"] == (f"waits for {', '.join(f'#{numbers[i]}' for i in r['after'])}" if r["after"] else "")
        for r in api
    )
    for where, listing in seen.items():
        assert listing.actions == terminal.actions, where
        assert listing.total == terminal.total, where


# ------------------------------------------------------------------------------ the console, walked


async def test_a_capacity_team_walks_the_demos_console(demo: DemoRun, tmp_path: Path) -> None:
    base = demo.base
    async with chromium(tmp_path) as browser:
        await browser.open(f"{base}/")
        await _page_ok(browser, base)
        await screenshot(browser, "console.png")
        cards = await browser.js(
            "Object.fromEntries([...document.querySelectorAll('.card')].map(c => [c.id, "
            "c.querySelector('.value').textContent]))"
        )
        # the run is over: its agents stopped and said so, and a node offline wastes nothing now (each node's offline
        # state follows its last window, so the walk may come before every one is in)
        nodes = re.fullmatch(r"13(?: \((\d+) offline\))?", cards["card-nodes"])
        assert nodes is not None and int(cards["card-gpus"]) > 13
        assert (cards["card-waste"] == "$0.00/hour") == (nodes.group(1) == "13")
        problems = await browser.js("[...document.querySelectorAll('#problems li')].map(li => li.textContent)")
        # the five most wasteful findings, the planted serving on training hardware and idle allocation among them
        assert len(problems) == 5 and all(
            any(n in p for p in problems) for n in ("chat-serving", "forgotten-notebook-alloc")
        )

        # the recommendations, in waves: a wave's actions go in parallel, a later wave's name what they wait for
        await browser.open(f"{base}/recommendations")
        await _page_ok(browser, base)
        await screenshot(browser, "console-recommendations.png")
        rows = await browser.js(
            "[...document.querySelectorAll('#recommendations tbody tr')].map(tr => "
            "[...tr.querySelectorAll('td')].map(td => td.textContent))"
        )
        wave = {int(r[0]): int(r[1]) for r in rows}
        assert min(wave.values()) == 1 and max(wave.values()) >= 2
        for r in rows:
            waits = [int(n) for n in re.findall(r"#(\d+)", r[2])]
            assert (wave[int(r[0])] > 1) == bool(waits), r  # only a later wave waits, and it says for what
            assert all(wave[n] < wave[int(r[0])] for n in waits), r

        # a decision with the printed token, on a move the plan projects a load for
        first = "document.querySelector('#recommendations tbody tr')"
        assert (await browser.js(f"{first}.querySelector('td:nth-child(5)').textContent")).startswith("move ")
        await browser.js(f"document.querySelector('#token').value = {json.dumps(demo.token)}")
        await browser.js("document.querySelector('#token-form button[type=submit]').click()")
        await browser.js(f"{first}.querySelector('button[data-action=ack]').click()")
        await _until(browser, f"{first}.querySelector('.state').textContent === 'acknowledged'")
        rec_id = await browser.js(f"{first}.querySelector('button.decide').dataset.id")
        listed = (await asyncio.to_thread(_run, shlex.split(demo.commands[0]), demo.env)).stdout
        assert re.search(rf"{rec_id}\s+acknowledged", listed)  # the command line sees the same decision

        # its workload's page: what the plan projects there, and what was observed (nothing yet: not applied)
        link = await browser.js(f"{first}.querySelector('td:nth-child(5) a').href")
        await browser.open(link)
        await _page_ok(browser, base)
        await screenshot(browser, "console-workload.png")
        headers = await browser.js("[...document.querySelectorAll('#history th')].map(th => th.textContent)")
        assert {"projected load", "observed load"} <= set(headers)
        history = await browser.js(
            "[...document.querySelectorAll('#history tbody tr')].map(tr => "
            "Object.fromEntries([...tr.querySelectorAll('td')].map((td, i) => "
            "[document.querySelectorAll('#history th')[i].textContent, td.textContent])))"
        )
        (acted,) = [h for h in history if h["state"] == "acknowledged"]
        assert re.match(r"\d+ % \(p95 \d+ %\) at [\d.]+× the speed", acted["projected load"])
        assert acted["observed load"] == "not applied yet"
        address = await browser.js("document.querySelector('#address').textContent")
        assert "name=" in address and _get(f"{base}{address}")  # the page answers to its site and name

        await browser.open(f"{base}/owners")
        await _page_ok(browser, base)
        await screenshot(browser, "console-owners.png")
        owners = await browser.js(
            "[...document.querySelectorAll('#owners tbody tr td:first-child')].map(td => td.textContent)"
        )
        assert {"team-research", "team-serving", "team-data-science"} <= set(owners)


# ------------------------------------------------------------------------------ another terminal


def test_report_and_recommendations_find_the_running_demo(demo: DemoRun) -> None:
    assert re.fullmatch(
        r"state: (\S+) \(kept after the run, until the next demo\); from another terminal:", demo.state_line
    )
    state_dir = demo.state_line.split()[1]
    assert demo.commands[0].split()[1:] == ["recommendations", "--state-dir", state_dir]
    assert demo.commands[1].split()[1:] == ["report", "--state-dir", state_dir]
    for command, shown in (("recommendations", "site demo: "), ("report", "GPU use and waste per owner since ")):
        printed = subprocess.run(
            shlex.split(demo.commands[0 if command == "recommendations" else 1]),
            capture_output=True, text=True, timeout=60, check=True, env=demo.env,
        )  # fmt: skip
        plain = subprocess.run(
            [FLEETFIT, command], capture_output=True, text=True, timeout=60, check=True, env=demo.env
        )
        # the same state (the ledger grows between the two: the optimizer goes on planning while the console is up)
        assert printed.stdout.startswith(shown) and plain.stdout.startswith(shown), command
        assert [line.split()[0] for line in plain.stdout.splitlines()[1:]] == [
            line.split()[0] for line in printed.stdout.splitlines()[1:]
        ], command
        assert f"reading the running demo's, in {state_dir}" in plain.stderr
    report = subprocess.run(
        [FLEETFIT, "report", "--state-dir", state_dir], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert re.search(r"over the \d+ (s|min) the optimizer watched", report)
    assert {"team-serving", "team-research", "team-data-science"} <= {
        line.split()[0] for line in report.splitlines()[2:]
    }


def test_ctrl_c_ends_the_demo_and_its_console_and_keeps_its_state(demo: DemoRun) -> None:
    assert demo.proc.poll() is None  # the run is over, the console still up
    _get(demo.base)
    demo.proc.send_signal(signal.SIGINT)
    _, stderr = demo.proc.communicate(timeout=60)
    assert demo.proc.returncode == 0, stderr[-2000:]
    assert "Traceback" not in stderr and "s3cr3t" not in stderr
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        _get(demo.base)
    state_dir = Path(demo.state_line.split()[1])
    assert (state_dir / "fleetfit.db").exists()  # for `fleetfit report` after the run, until the next one
    after = _run([FLEETFIT, "recommendations"], demo.env)
    assert after.returncode == 0 and "reading the last demo's" in after.stderr
