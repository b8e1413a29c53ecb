"""Chat alert hooks against a real local HTTP server: retries, rate limits, grouping, deduplication across
restarts, resolved notices, filters, payload shapes and size limits, and webhook URLs kept out of logs."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import FLEETFIT, free_port, simulated_fleet, three_actions
from webhook_server import WebhookServer, webhook_server

from agent.protocol import Finding, FindingKind, Plan, Recommendation, SolverReport, WorkloadClass
from optimizer.decide.catalog import load_catalog
from optimizer.plan.recommend import PlanSettings, plan_snapshot
from optimizer.plan.render import render_table
from optimizer.serve.alerts.alerter import Alerter
from optimizer.serve.alerts.delivery import Webhook, redact, retry_after
from optimizer.serve.alerts.journal import Journal
from optimizer.serve.alerts.notice import Item, Notice, Status, sample_notice
from optimizer.serve.alerts.payloads import GenericAlert, render
from optimizer.serve.alerts.settings import AlertSettings, ReceiverSettings, Severity
from optimizer.serve.lifecycle import Lifecycle, RecState
from optimizer.serve.selfmetrics import optimizer_metrics

SLACK_BLOCK_TYPES = {"header", "section", "context", "divider", "actions", "image"}
CARD_ELEMENT_TYPES = {"TextBlock", "Container", "FactSet", "ColumnSet", "Image"}


def rec(n: int, savings: float = 2_000.0, cls: WorkloadClass = WorkloadClass.INFERENCE) -> Recommendation:
    return Recommendation(
        id=f"rec-{n:04d}",
        workload=f"k8s/w{n}",
        workload_name=f"service-{n} <api> & co",
        workload_class=cls,
        confidence=0.9,
        gpus=2,
        from_node=f"h100-{n:03d}",
        from_hardware="H100-SXM5-80GB",
        to_node=f"l40s-{n:03d}",
        to_hardware="L40S",
        monthly_savings_usd=savings,
        reason="inference at 25 % utilisation holding H100s with NVLink and InfiniBand " * 3,
        performance_impact="about 10 % lower peak throughput",
        risk="low",
        evidence=["steady serving traffic", "25 % SM busy"],
    )


def plan_of(recs: list[Recommendation], site: str = "eu-1", at: float = 1_700_000_000.0) -> Plan:
    solver = SolverReport(status="OPTIMAL", objective=0, best_bound=0, gap=0, solve_seconds=0.1)
    return Plan(site=site, generated_at=at, solver=solver, recommendations=recs)


def receiver(server: WebhookServer, name: str = "chat", kind: str = "generic", **kw: Any) -> ReceiverSettings:
    import os

    variable = f"TEST_WEBHOOK_{name.upper().replace('-', '_')}"
    os.environ[variable] = server.url(f"/hooks/{name}/s3cr3t-token")
    return ReceiverSettings(name=name, kind=kind, url_env=variable, **kw)  # type: ignore[arg-type]


def settings(*receivers: ReceiverSettings, **kw: Any) -> AlertSettings:
    """Alert settings for a test: no group wait and, unless a test sets them, no settle period."""
    base: dict[str, Any] = {
        "group_wait": 0.0,
        "retry_initial": 0.2,
        "retry_max": 5.0,
        "max_attempts": 4,
        "settle_seconds": 0.0,
        "settle_plans": 1,
    }
    return AlertSettings(receivers=list(receivers), **(base | kw))


# ------------------------------------------------------------------------------------------ delivery


async def test_429_with_retry_after_then_500_then_200_delivers_exactly_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    with webhook_server([(429, {"Retry-After": "2"}), (500, {})]) as server:
        r = receiver(server, kind="slack")
        webhook = Webhook(r, settings(r))
        assert await webhook.post(b'{"text":"hello"}')
        await webhook.close()
        got = server.received
    assert [g.status for g in got] == [429, 500, 200]
    assert got[1].at - got[0].at >= 2.0  # Retry-After honoured
    assert (webhook.sent, webhook.retries, sum(webhook.failed.values())) == (1, 2, 0)
    assert "s3cr3t-token" not in caplog.text and str(server.port) not in caplog.text


async def test_gives_up_after_a_bound_and_counts_it_without_leaking_the_url(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    with webhook_server([(503, {})] * 10) as server:
        r = receiver(server, name="down")
        webhook = Webhook(r, settings(r, max_attempts=3))
        assert not await webhook.post(b"{}")
        await webhook.close()
        assert len(server.received) == 3
    assert webhook.failed == {"server_error": 1}
    # nothing listens on the port any more: network errors, whose texts name the host, are redacted too
    assert not await webhook.post(b"{}")
    assert webhook.failed["network"] == 1
    await webhook.close()
    assert "s3cr3t-token" not in caplog.text and f"127.0.0.1:{server.port}" not in caplog.text
    assert "failed after 3 attempts" in caplog.text


async def test_a_4xx_other_than_429_is_not_retried() -> None:
    with webhook_server([(404, {})]) as server:
        r = receiver(server, name="gone")
        webhook = Webhook(r, settings(r))
        assert not await webhook.post(b"{}")
        await webhook.close()
        assert len(server.received) == 1 and webhook.failed == {"rejected": 1}


async def test_rate_limit_spaces_messages_to_one_receiver() -> None:
    with webhook_server() as server:
        r = receiver(server, name="slow", rate_per_second=4.0)
        webhook = Webhook(r, settings(r))
        for _ in range(5):
            assert await webhook.post(b"{}")
        await webhook.close()
        times = [g.at for g in server.received]
    # 4 gaps of 0.25 s at the sender; timed where they arrive, the first may come late (a new connection), so 3
    assert times[-1] - times[0] >= 3 * 0.25


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after("7") == 7.0
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == pytest.approx(10.0)
    assert retry_after("soon") is None and retry_after(None) is None
    assert "token" not in redact("Cannot connect to https://hooks.example/T/B/token", "https://hooks.example/T/B/token")


# ------------------------------------------------------------------------------------------ semantics


async def test_a_restart_posts_nothing_twice_and_resolutions_once(tmp_path: Path) -> None:
    plan = plan_of([rec(1), rec(2)])
    with webhook_server() as server:
        r = receiver(server)
        alerter = Alerter(settings(r), Journal(tmp_path / "fleetfit.db"))
        alerter.observe(plan, {})
        alerter.observe(plan, {})  # the next solve proposes the same moves
        await alerter.flush()
        await alerter.close()
        first = server.wait_for(1)[0].json()
        assert [m["id"] for m in first["firing"]] == ["rec-0001", "rec-0002"]

        alerter = Alerter(settings(r), Journal(tmp_path / "fleetfit.db"))  # the optimizer restarted
        alerter.observe(plan, {})
        await alerter.flush()
        assert len(server.received) == 1

        later = plan_of([rec(2)])
        alerter.observe(later, {}, resolved=[(rec(1), RecState.APPLIED)])
        alerter.observe(later, {}, resolved=[(rec(1), RecState.APPLIED)])
        await alerter.flush()
        await alerter.close()
        second = server.wait_for(2)[1].json()
        assert second["firing"] == [] and [(m["id"], m["status"]) for m in second["resolved"]] == [
            ("rec-0001", "applied")
        ]
        await asyncio.sleep(0.2)
        assert len(server.received) == 2


async def test_repeat_interval_reminds_of_unacknowledged_moves_only(tmp_path: Path) -> None:
    now = [1000.0]
    plan = plan_of([rec(1), rec(2)])
    with webhook_server() as server:
        r = receiver(server)
        alerter = Alerter(settings(r, repeat_interval=3600), Journal(tmp_path / "a.db"), clock=lambda: now[0])
        alerter.observe(plan, {})
        await alerter.flush()
        now[0] += 1800
        alerter.observe(plan, {})
        await alerter.flush()
        assert len(server.received) == 1  # within repeat_interval: silence
        now[0] += 1801
        alerter.observe(plan, {"rec-0001": RecState.ACKNOWLEDGED, "rec-0002": RecState.NEW})
        await alerter.flush()
        await alerter.close()
        reminder = server.wait_for(2)[1].json()
    assert [(m["id"], m["status"]) for m in reminder["firing"]] == [("rec-0002", "reminder")]


async def test_group_wait_gathers_a_sites_moves_into_one_message(tmp_path: Path) -> None:
    with webhook_server() as server:
        r = receiver(server)
        alerter = Alerter(settings(r, group_wait=1.0), Journal(tmp_path / "a.db"))
        task = asyncio.create_task(alerter.run())
        alerter.observe(plan_of([rec(1)]), {})
        await asyncio.sleep(0.3)
        alerter.observe(plan_of([rec(1), rec(2)]), {})
        alerter.observe(plan_of([rec(9)], site="us-2"), {})
        await asyncio.to_thread(server.wait_for, 2, 10.0)
        task.cancel()
        await alerter.close()
        bodies = sorted((g.json() for g in server.received), key=lambda b: b["site"])
    assert [b["site"] for b in bodies] == ["eu-1", "us-2"]
    assert [m["id"] for m in bodies[0]["firing"]] == ["rec-0001", "rec-0002"]


async def test_each_receiver_gets_what_its_filters_let_through(tmp_path: Path) -> None:
    plan = plan_of(
        [rec(1, 500.0), rec(2, 5_000.0), rec(3, 50_000.0, WorkloadClass.TRAINING), rec(4, 20_000.0)], site="eu-1"
    )
    with webhook_server() as server:
        everything = receiver(server, name="all")
        big = receiver(server, name="big", min_severity=Severity.CRITICAL)
        training = receiver(server, name="training", classes=[WorkloadClass.TRAINING])
        us_only = receiver(server, name="us", sites=["us-1"])
        costly = receiver(server, name="costly", min_monthly_savings=4_000)
        alerter = Alerter(settings(everything, big, training, us_only, costly), Journal(tmp_path / "a.db"))
        alerter.observe(plan, {})
        await alerter.flush()
        await alerter.close()
        got = {g.path.split("/")[2]: [m["id"] for m in g.json()["firing"]] for g in server.received}
    assert got == {
        "all": ["rec-0003", "rec-0004", "rec-0002", "rec-0001"],
        "big": ["rec-0003", "rec-0004"],
        "training": ["rec-0003"],
        "costly": ["rec-0003", "rec-0004", "rec-0002"],
    }


async def test_optimizer_lifecycle_drives_alerts_and_a_dismissed_move_stays_quiet(tmp_path: Path) -> None:
    plan = plan_snapshot(three_actions("s"), load_catalog(), PlanSettings())
    life = Lifecycle.in_state_dir(tmp_path)
    life.record(plan, {w.id: w.hardware for w in plan.workloads})
    idle = next(r for r in plan.recommendations if r.workload_name == "forgotten-notebook-alloc")
    life.set_state(idle.id, RecState.DISMISSED)
    states = life.states(r.id for r in plan.recommendations)
    with webhook_server() as server:
        r = receiver(server, kind="generic")
        alerter = Alerter.in_state_dir(settings(r), tmp_path)
        alerter.observe(plan, states)
        await alerter.flush()
        await alerter.close()
        body = server.wait_for(1)[0].json()
    GenericAlert.model_validate(body)
    assert {m["workload_name"] for m in body["firing"]} == {"image-gen", "vision-finetune-ddp"}


# ------------------------------------------------------------------------------------------ settling


@pytest.mark.parametrize(
    ("settle_plans", "times"),
    [(2, [0.0, 299.0, 300.0]), (3, [0.0, 400.0, 401.0])],  # the last plan is the first that may post
    ids=["too-soon", "too-few-plans"],
)
async def test_a_new_move_is_posted_only_once_enough_plans_over_enough_time_proposed_it(
    tmp_path: Path, settle_plans: int, times: list[float]
) -> None:
    now = [1000.0]
    with webhook_server() as server:
        r = receiver(server)
        alerter = Alerter(
            settings(r, settle_seconds=300, settle_plans=settle_plans), Journal(tmp_path / "a.db"), clock=lambda: now[0]
        )
        for at in times:
            assert len(server.received) == 0, f"posted before {at} s"
            now[0] = 1000.0 + at
            alerter.observe(plan_of([rec(1)], at=now[0]), {})
            alerter.observe(plan_of([rec(1)], at=now[0]), {})  # the same plan seen twice counts once
            await alerter.flush()
        await alerter.close()
        body = server.wait_for(1)[0].json()
    assert [(m["id"], m["status"]) for m in body["firing"]] == [("rec-0001", "new")]


async def test_a_move_withdrawn_while_settling_is_never_posted_nor_resolved(tmp_path: Path) -> None:
    now = [1000.0]

    async def plan(at: float, recs: list[Recommendation], resolved: tuple[Recommendation, ...] = ()) -> None:
        now[0] = 1000.0 + at
        alerter.observe(plan_of(recs, at=now[0]), {}, resolved=[(x, RecState.EXPIRED) for x in resolved])
        await alerter.flush()

    with webhook_server() as server:
        r = receiver(server)
        alerter = Alerter(
            settings(r, settle_seconds=300, settle_plans=2), Journal(tmp_path / "a.db"), clock=lambda: now[0]
        )
        await plan(0, [rec(1), rec(2)])
        await plan(100, [rec(2)], resolved=(rec(1),))  # withdrawn a minute and a half after it was proposed
        await plan(200, [rec(1), rec(2)])  # back: it settles from here
        await plan(350, [rec(1), rec(2)])
        first = server.wait_for(1)[0].json()
        assert [m["id"] for m in first["firing"]] == ["rec-0002"] and first["resolved"] == []
        await plan(450, [rec(2)], resolved=(rec(1),))  # withdrawn again before it settled: nothing to say
        await plan(520, [rec(1), rec(2)])
        await plan(900, [rec(2)], resolved=(rec(1),))
        await alerter.close()
        await asyncio.sleep(0.2)
        assert len(server.received) == 1


async def test_settling_survives_a_restart(tmp_path: Path) -> None:
    now = [1000.0]
    with webhook_server() as server:
        r = receiver(server)
        alerter = Alerter(settings(r, settle_seconds=300), Journal(tmp_path / "a.db"), clock=lambda: now[0])
        alerter.observe(plan_of([rec(1)], at=now[0]), {})
        await alerter.flush()
        await alerter.close()
        now[0] += 400
        alerter = Alerter(settings(r, settle_seconds=300), Journal(tmp_path / "a.db"), clock=lambda: now[0])
        alerter.observe(plan_of([rec(1)], at=now[0]), {})  # the restarted optimizer's first plan: the second
        await alerter.flush()
        await alerter.close()
        assert [m["id"] for m in server.wait_for(1)[0].json()["firing"]] == ["rec-0001"]


async def test_the_optimizer_posts_a_settled_move_and_never_one_it_withdrew(tmp_path: Path) -> None:
    """A real optimizer (lifecycle, planning, alert hooks) plans three times; between the first two plans a move
    is withdrawn (its workload pinned). Only the moves every plan proposed are posted, with no resolution for
    the withdrawn one, and a restarted optimizer posts nothing twice."""
    from optimizer.serve.config import OptimizerConfig, OptimizerSettings
    from optimizer.serve.service import Optimizer

    fleet, _ = simulated_fleet("demo", 8, windows=8, site="s")
    now = [1000.0]
    with webhook_server() as server:

        def start() -> tuple[Optimizer, Alerter]:
            config = OptimizerConfig(optimizer=OptimizerSettings(state_dir=tmp_path))
            alerter = Alerter.in_state_dir(settings(receiver(server), settle_seconds=120, settle_plans=2), tmp_path)
            alerter.clock = lambda: now[0]
            optimizer = Optimizer(config, load_catalog(), lifecycle=Lifecycle.in_state_dir(tmp_path), alerter=alerter)
            optimizer.fleet = fleet
            return optimizer, alerter

        async def plan(optimizer: Optimizer, alerter: Alerter, at: float) -> Plan:
            now[0] = 1000.0 + at
            (made,) = await optimizer.plan_once()
            await alerter.flush()
            return made

        optimizer, alerter = start()
        first = await plan(optimizer, alerter, 0)
        assert len(first.recommendations) >= 2
        withdrawn = next(r for r in first.recommendations if r.workload_name == "vision-finetune-ddp")
        optimizer.config.plan.pinned.append(withdrawn.workload)
        second = await plan(optimizer, alerter, 60)
        assert withdrawn.id not in {r.id for r in second.recommendations}
        third = await plan(optimizer, alerter, 130)
        assert optimizer.tracker is not None
        await asyncio.to_thread(optimizer.tracker.close)
        await alerter.close()
        optimizer, alerter = start()  # restarted: its first plan finds the moves posted already
        optimizer.config.plan.pinned.append(withdrawn.workload)
        await plan(optimizer, alerter, 200)
        await alerter.close()
        assert optimizer.tracker is not None
        await asyncio.to_thread(optimizer.tracker.close)
        await asyncio.sleep(0.2)
        bodies = [d.json() for d in server.delivered]
    assert len(bodies) == 1
    posted = [m["id"] for m in bodies[0]["firing"]]
    assert sorted(posted) == sorted(r.id for r in third.recommendations) and withdrawn.id not in posted
    assert bodies[0]["resolved"] == []


# ------------------------------------------------------------------------------------------ payloads


def notice_of(n: int, resolved: int = 0) -> Notice:
    items = [Item(rec(i, 1_000.0 + i), Status.NEW, Severity.WARNING) for i in range(n)]
    items += [Item(rec(10_000 + i), Status.EXPIRED, Severity.INFO) for i in range(resolved)]
    return Notice("eu-1", 1_700_000_000.0, items, link="https://fleetfit.example/")


def _more(text: str) -> int:
    import re

    found = re.search(r"and (\d+) more", text)
    return int(found.group(1)) if found else 0


def test_slack_block_kit_shape_and_limits() -> None:
    for n in (1, 120):
        body = json.loads(render("slack", notice_of(n, resolved=3), 40_000))
        blocks = body["blocks"]
        assert isinstance(body["text"], str) and body["text"]  # the notification fallback
        assert 2 <= len(blocks) <= 50
        assert blocks[0]["type"] == "header" and blocks[0]["text"]["type"] == "plain_text"
        assert len(blocks[0]["text"]["text"]) <= 150
        for block in blocks:
            assert block["type"] in SLACK_BLOCK_TYPES
            if block["type"] == "section":
                assert block["text"]["type"] == "mrkdwn" and len(block["text"]["text"]) <= 3000
                assert len(block.get("fields", [])) <= 10
                assert all(f["type"] == "mrkdwn" and len(f["text"]) <= 2000 for f in block.get("fields", []))
                assert "<api>" not in block["text"]["text"]  # escaped for mrkdwn
            if block["type"] == "context":
                assert 1 <= len(block["elements"]) <= 10
        shown = sum(1 for b in blocks if b["type"] == "section" and "fields" in b)
        resolved = sum(b["text"]["text"].count("•") for b in blocks if b["type"] == "section")
        assert shown + resolved + _more(json.dumps(body)) == n + 3  # every move listed or counted
        assert resolved == 3 and (shown == n if n == 1 else 0 < shown < n)


def test_mattermost_attachments_shape_and_limit() -> None:
    body = render("mattermost", notice_of(200), 16_000)
    data = json.loads(body)
    assert len(body) <= 16_000 and data["text"].startswith("**fleetfit")
    assert _more(data["text"]) == 200 - len(data["attachments"])
    for a in data["attachments"]:
        assert {"fallback", "color", "title", "text", "fields"} <= set(a)
        assert all(set(f) == {"short", "title", "value"} for f in a["fields"])


def test_teams_adaptive_card_shape_and_28kb_limit() -> None:
    body = render("teams", notice_of(500, resolved=5), 28_000)
    data = json.loads(body)
    assert len(body) <= 28_000
    assert data["type"] == "message" and len(data["attachments"]) == 1
    attachment = data["attachments"][0]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = attachment["content"]
    assert card["type"] == "AdaptiveCard" and card["version"] == "1.4" and "$schema" in card
    assert {b["type"] for b in card["body"]} <= CARD_ELEMENT_TYPES
    assert card["actions"][0]["type"] == "Action.OpenUrl"
    shown = sum(1 for b in card["body"] if b["type"] == "Container")
    assert 0 < shown < 500 and shown + _more(json.dumps(card)) == 505


def test_generic_payload_is_versioned_and_says_what_it_left_out() -> None:
    """400 moves of about 850 bytes each overflow the 256 KB body by about a hundred: those and both resolved
    ones are left out and counted, and the total still counts every move. Deliberate bug caught: the total
    summed over the moves shown only."""
    data = json.loads(render("generic", notice_of(400, resolved=2), 256_000))
    alert = GenericAlert.model_validate(data)
    assert (alert.schema_, alert.version, alert.site) == ("fleetfit.alert", 1, "eu-1")
    assert len(alert.firing) + len(alert.resolved) + alert.omitted == 402
    assert 50 <= alert.omitted <= 200 and alert.resolved == []
    assert alert.monthly_savings_usd == pytest.approx(sum(1_000.0 + i for i in range(400)))
    assert alert.firing[0].monthly_savings_usd == max(m.monthly_savings_usd for m in alert.firing)


HOSTILE = (
    "x `tick @channel <!channel> @here [click me](https://evil.example/x) ![pic](https://evil.example/p.png) "
    "~town-square www.evil.example evil.com ``two``"
)
SCHEMA = json.loads((Path(__file__).parent / "data" / "adaptive-card-1.4" / "adaptive-card.json").read_text())


def hostile_notice(resolved: int = 1) -> Notice:
    """Every name an agent supplies made hostile: the workload's name, the nodes, the staging node, the site, and a
    workload with no name, named by its id."""
    bad = rec(1).model_copy(
        update={
            "workload_name": HOSTILE,
            "from_node": "<http://evil.example|n1>",
            "to_node": "@all",
            "via_node": "https://evil.example/via",
            "via_wave": 1,
        }
    )
    items = [Item(bad, Status.NEW, Severity.WARNING)]
    items += [
        Item(rec(10_000 + i).model_copy(update={"workload_name": HOSTILE}), Status.APPLIED, Severity.INFO)
        for i in range(resolved)
    ]
    unnamed = rec(20_000).model_copy(update={"workload_name": "", "workload": "https://evil.example/id @here"})
    items.append(Item(unnamed, Status.EXPIRED, Severity.INFO))
    return Notice("evil.com", 1_700_000_000.0, items)


def _strings(node: object, skip: str = "") -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for k, v in node.items() if k != skip for s in _strings(v, skip)]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v, skip)]
    return []


def _outside_code(text: str) -> str:
    """``text`` with its code spans blanked, as CommonMark (and Slack, whose spans hold no backtick) reads them: a
    run of backticks opens one, the next run of the same length closes it; a backslash-escaped one opens none."""
    import re

    out, i = [], 0
    while i < len(text):
        if text[i] == "\\":
            out.append(text[i : i + 2])
            i += 2
            continue
        run = re.match(r"`+", text[i:])
        if run:
            close = re.compile(rf"(?<!`){run.group()}(?!`)").search(text, i + len(run.group()))
            if close:
                out.append(" ")
                i = close.end()
                continue
            out.append(run.group())
            i += len(run.group())
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


LINKISH = r"://|www\.|evil\.|@(channel|here|all)\b|(?<!\\)<|(?<!\\)\]\(|(?<!\\)~town"


def test_mattermost_shows_names_from_agents_only_in_code_spans() -> None:
    """Every name an agent supplies sits in a code span (literal in CommonMark, and Mattermost's server reads
    mentions outside code alone): outside them no URL, bare domain, mention, Slack-style <!channel> or <url|text>,
    [text](url), image or ~channel; the notification fallback, plain text, breaks URLs and mentions without any
    zero-width character. Deliberate bugs caught: a name left out of its code span (the staging node, the site, a
    workload named by its id), a backtick in a name ending its span early, URLs kept in the fallback."""
    import re

    body = json.loads(render("mattermost", hostile_notice(), 40_000))
    texts = _strings(body, skip="fallback")
    assert HOSTILE in "\n".join(texts)  # the names are shown as they are...
    for text in texts:
        assert not re.search(LINKISH, _outside_code(text)), text  # ...but only as code
    fallback = "\n".join(a["fallback"] for a in body["attachments"])
    assert "evil.example" in fallback and not re.search(r"://|www\.|@|<", fallback)
    assert not re.search("[\u200b-\u200d\u2060\ufeff]", json.dumps(body, ensure_ascii=False))


def test_teams_cards_carry_no_link_or_markup_from_a_name() -> None:
    """Adaptive Card Markdown has no code span: names are escaped, and ``://`` and ``www.`` written ``[:]//`` and
    ``www[.]``. Deliberate bugs caught: a name not escaped, or a URL left whole (Teams makes it a link)."""
    import re

    body = json.loads(render("teams", hostile_notice(), 40_000))
    body["attachments"][0]["content"].pop("$schema")
    text = "\n".join(_strings(body))
    assert "evil.example" in text and "https[:]//evil.example" in text.replace("\\", "")
    assert not re.search(r"://|www\.|(?<!\\)<|(?<!\\)\]\(|(?<!\\)~town", text)
    assert not re.search("[\u200b-\u200d\u2060\ufeff]", json.dumps(body, ensure_ascii=False))


def test_slack_shows_names_from_agents_only_in_verbatim_code_spans() -> None:
    """Every mrkdwn text object is ``verbatim`` (Slack makes no link of a URL, bare domain or channel name in it,
    and parses no mention), every name an agent supplies sits in a code span, <, > and & are escaped everywhere,
    and no link is unfurled. Deliberate bugs caught: ``verbatim`` left off an object, a name outside its code
    span, a backtick in a name ending its span, ``unfurl_links``/``unfurl_media`` missing."""
    import re

    body = json.loads(render("slack", hostile_notice(), 40_000))
    assert body["unfurl_links"] is False and body["unfurl_media"] is False
    objects = [b["text"] for b in body["blocks"][1:] if "text" in b]
    objects += [f for b in body["blocks"] for f in b.get("fields", []) + b.get("elements", [])]
    assert objects and all(o["type"] == "mrkdwn" and o["verbatim"] is True for o in objects)
    texts = [body["text"], *(o["text"] for o in objects)]
    assert any("&lt;!channel&gt;" in t for t in texts)
    for text in texts:
        assert not re.search(r"<(!|http)", text), text
        assert not re.search(LINKISH, _outside_code(text)), text
    assert not re.search("[\u200b-\u200d\u2060\ufeff]", json.dumps(body, ensure_ascii=False))


def _entities_whole(text: str) -> bool:
    import re

    return all(re.match(r"&(amp|lt|gt);", text[m.start() :]) for m in re.finditer("&", text))


@pytest.mark.parametrize("shift", range(6))
def test_slack_clipping_never_cuts_an_escape_in_two(shift: int) -> None:
    # the reason (in the section) and what the action waits for (in a field), escaped, cross the section (3,000)
    # and field (2,000) limits at every offset
    base = rec(1)
    long = base.model_copy(
        update={
            "reason": "r" * (2900 - len(base.workload_name) * 2 + shift) + "&&&&&&&&&&&&",
            "after": ["n" * (1985 + shift) + "<<<<<<<<"],
        }
    )
    body = json.loads(render("slack", Notice("eu-1", 1.7e9, [Item(long, Status.NEW, Severity.WARNING)]), 40_000))
    clipped = 0
    for block in body["blocks"]:
        for part in [block.get("text", {}), *block.get("fields", [])]:
            if part.get("type") == "mrkdwn":
                assert _entities_whole(part["text"]), part["text"][-12:]
                clipped += part["text"].endswith("…")
    assert clipped == 2  # the section and the Wave field were both cut


def test_the_configured_link_cannot_break_out_of_its_markup() -> None:
    notice = notice_of(1)
    notice.link = "https://fleetfit.example/recs?site=a&view=<all>|pwned) [x](https://evil.example)"
    slack_body = json.loads(render("slack", notice, 40_000))
    footer = slack_body["blocks"][-1]["elements"][-1]["text"]
    assert footer.startswith("<https://fleetfit.example/recs?site=a&amp;view=&lt;all&gt;%7Cpwned")
    assert footer.count("|") == 1 and footer.endswith("|all recommendations>")
    mm = json.loads(render("mattermost", notice, 40_000))["text"]
    url = mm[mm.index("[all recommendations](") + len("[all recommendations](") :]
    assert url.endswith(")") and not any(c in url[:-1] for c in " ()[]<>")


@pytest.mark.parametrize(("kind", "limit"), [("generic", 256_000), ("teams", 200_000), ("mattermost", 200_000)])
def test_resolved_moves_are_listed_as_many_as_fit(kind: str, limit: int) -> None:
    body = render(kind, notice_of(2, resolved=120), limit)  # type: ignore[arg-type]
    assert len(body) <= limit
    assert _more(body.decode()) == 0
    assert body.decode().count("expired") >= 120


def _cards(body: bytes) -> list[dict[str, Any]]:
    data = json.loads(body)
    cards = []
    for attachment in data["attachments"]:
        card = dict(attachment["content"])
        card.pop("msteams", None)  # Teams' own extension, outside the Adaptive Card schema
        cards.append(card)
    return cards


@pytest.mark.parametrize(
    ("notice", "limit"),
    [
        (notice_of(1), 28_000),
        (notice_of(500, resolved=40), 28_000),
        (notice_of(0, resolved=3), 28_000),
        (hostile_notice(resolved=5), 28_000),
        (notice_of(3, resolved=2), 200),  # nothing fits but the headline
        (sample_notice(), 28_000),  # what `fleetfit alerts test` sends
    ],
    ids=["one", "many", "resolved-only", "hostile", "tiny-limit", "sample"],
)
def test_every_teams_card_validates_against_the_adaptive_card_1_4_schema(notice: Notice, limit: int) -> None:
    import jsonschema

    validator = jsonschema.Draft6Validator(SCHEMA)
    for card in _cards(render("teams", notice, limit)):
        errors = sorted(validator.iter_errors(card), key=lambda e: list(e.path))
        assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:3]]


# ------------------------------------------------------------------------------------------ commands


def _optimizer_config(tmp_path: Path, server: WebhookServer) -> Path:
    config = tmp_path / "optimizer.toml"
    (tmp_path / "hook-url").write_text(server.url("/hooks/test/s3cr3t-token") + "\n")
    config.write_text(
        f"""
[optimizer]
state_dir = "{tmp_path}"

[[alerts.receivers]]
name = "team-chat"
kind = "slack"
url_file = "hook-url"
"""
    )
    return config


def _alerts_test(receiver: str, config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [FLEETFIT, "alerts", "test", "--receiver", receiver, "--config", str(config)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, check=False)


def test_alerts_test_sends_a_sample_through_a_credential_file(tmp_path: Path) -> None:
    with webhook_server() as server:
        config = _optimizer_config(tmp_path, server)
        env = {"CREDENTIALS_DIRECTORY": str(tmp_path), "PATH": "/usr/bin:/bin"}
        result = _alerts_test("team-chat", config, env)
        assert result.returncode == 0, result.stderr
        body = server.wait_for(1)[0].json()
        assert body["blocks"][0]["type"] == "header" and "sample" in json.dumps(body)
        assert "s3cr3t-token" not in result.stdout + result.stderr
        missing = _alerts_test("nope", config, env)
    assert missing.returncode == 2 and "team-chat" in missing.stderr


def test_alerts_test_reports_a_refusing_receiver(tmp_path: Path) -> None:
    port = free_port()  # nothing listens here
    config = tmp_path / "optimizer.toml"
    config.write_text(
        """
[alerts]
max_attempts = 2
retry_initial = 0.1

[[alerts.receivers]]
name = "ops"
kind = "teams"
url_env = "OPS_WEBHOOK"
"""
    )
    result = _alerts_test(
        "ops", config, {"OPS_WEBHOOK": f"http://127.0.0.1:{port}/workflows/s3cr3t-token", "PATH": "/usr/bin:/bin"}
    )
    assert result.returncode == 1 and "not accepted" in result.stderr  # a receiver that refused: data, not usage
    assert "s3cr3t-token" not in result.stderr and f"127.0.0.1:{port}" not in result.stderr


async def test_optimizer_metrics_count_alerts_per_receiver(tmp_path: Path) -> None:
    from agent.metrics import render as render_metrics
    from optimizer.serve.config import OptimizerConfig
    from optimizer.serve.service import Optimizer

    with webhook_server([(500, {})] * 4) as server:
        ok, broken = receiver(server, name="ok"), receiver(server, name="broken")
        alerter = Alerter(settings(ok, broken, max_attempts=2), Journal(tmp_path / "a.db"))
        optimizer = Optimizer(OptimizerConfig(), load_catalog(), alerter=alerter)
        alerter.observe(plan_of([rec(1)]), {})
        await alerter.flush()
        text = render_metrics(optimizer_metrics(optimizer))
        await alerter.close()
    # two attempts each, four 500s: both receivers gave up, counted by reason
    assert 'fleetfit_alerts_sent_total{receiver="ok"} 0' in text
    assert 'fleetfit_alerts_failed_total{receiver="broken",reason="server_error"} 1' in text
    assert 'fleetfit_alerts_failed_total{receiver="ok",reason="server_error"} 1' in text
    assert 'fleetfit_alert_retries_total{receiver="ok"} 1' in text
    assert "fleetfit_alerts_pending 0" in text


# ------------------------------------------------------------------------------------------ shutdown


async def _demo_with_a_hook_that_never_answers(signals: list[signal.Signals]) -> tuple[float, int, str]:
    """Run a short demo posting to a server that accepts and never replies; once its post is in flight (the demo
    posts once, after its final plan), send ``signals``. Returns (seconds from then to exit, code, stderr)."""
    connected = asyncio.Event()
    held: list[asyncio.StreamWriter] = []

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        connected.set()

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        FLEETFIT,
        "demo",
        "--duration",
        "8",
        "--no-console",
        "--alert-webhook",
        f"generic=http://127.0.0.1:{port}/hook",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    errors = asyncio.create_task(proc.stderr.read())
    try:
        await asyncio.wait_for(connected.wait(), 150)  # the run is over; its alert is being posted and will hang
        loop = asyncio.get_running_loop()
        start = loop.time()
        for sig in signals:
            proc.send_signal(sig)
        code = await asyncio.wait_for(proc.wait(), 40)
        return loop.time() - start, code, (await errors).decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for w in held:
            w.close()
        server.close()


@pytest.mark.slow
async def test_demo_with_an_unreachable_hook_ends_within_its_flush_timeout() -> None:
    seconds, code, stderr = await _demo_with_a_hook_that_never_answers([])
    print(f"demo exited {seconds:.1f} s after its alert post started hanging")
    assert code == 0 and "Traceback" not in stderr
    assert seconds < 10  # at most the demo's 5 s for the last alerts
    assert re.search(r"alerts still unsent at shutdown: [1-9]\d* action", stderr)  # said, and counted


@pytest.mark.slow
async def test_a_signal_during_the_demos_last_post_ends_it_at_once() -> None:
    seconds, code, stderr = await _demo_with_a_hook_that_never_answers([signal.SIGINT])
    assert code != 0 and "Traceback" not in stderr and "demo interrupted" in stderr
    assert seconds < 3


@pytest.mark.slow
def test_the_demo_posts_no_move_a_later_plan_withdrew_to_hooks_from_the_environment_and_a_file(
    tmp_path: Path,
) -> None:
    """The demo as a user runs it, posting to real webhooks named in the environment and in a file (never on the
    command line, where any user could read them): each hook gets one message, after the final plan, naming only
    moves of that plan, and no resolution (nothing it posted was withdrawn); the URLs' secrets are never printed.
    One run serves both: reading the hooks and posting the final plan are the same run's work."""
    import os

    with webhook_server() as hooks:
        hook_file = tmp_path / "hooks"
        hook_file.write_text(f"# the team's channel\nslack={hooks.url('/slack/s3cr3t')}\n")
        env = os.environ | {"FLEETFIT_ALERT_WEBHOOK": f"generic={hooks.url('/generic/s3cr3t')}"}
        command = [FLEETFIT, "demo", "--no-console", "--format", "json", "--alert-webhook-file", str(hook_file)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=True)
        final = Plan.model_validate_json(result.stdout)
        delivered = list(hooks.delivered)
    assert sorted(d.path.split("/")[1] for d in delivered) == ["generic", "slack"]  # one message each
    assert "s3cr3t" not in result.stdout + result.stderr and "warning" not in result.stderr
    bodies = [d.json() for d in delivered if d.path.startswith("/generic/")]
    posted = [m["id"] for body in bodies for m in body["firing"]]
    assert [m for body in bodies for m in body["resolved"]] == []  # nothing posted was withdrawn
    assert set(posted) <= {r.id for r in final.recommendations}
    assert len(bodies) == 1 and len(posted) >= 3


# ------------------------------------------------------------------------------------------ secrets


def test_broker_password_comes_from_a_file_or_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from optimizer.commands.cliargs import broker_settings

    secret = tmp_path / "broker-password"
    secret.write_text("from-the-file\n")
    from_file = broker_settings("mqtts://node-7@broker.example:8883", "5", secret, {})
    assert from_file.username == "node-7" and from_file.password is not None
    assert from_file.password.get_secret_value() == "from-the-file" and from_file.tls
    from_env = broker_settings("mqtt://u@127.0.0.1", "5", None, {"FLEETFIT_BROKER_PASSWORD": "from-env"})
    assert from_env.password is not None and from_env.password.get_secret_value() == "from-env"
    assert capsys.readouterr().err == ""
    in_url = broker_settings("mqtt://u:p%40ss@127.0.0.1", "5", None, {})
    assert in_url.password is not None and in_url.password.get_secret_value() == "p@ss"
    assert "visible to every user" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ GPUs waiting on their node


def waiting(n: int, usd: float, detail: str = "its GPUs at 40 % while the node reads at a flat 1.5 GB/s") -> Finding:
    return Finding(
        workload=f"slurm/{n}",
        workload_name=f"train-{n}",
        kind=FindingKind.INPUT_STARVED_TRAINING,
        hardware="H100-SXM5-80GB",
        nodes=[f"h100-{n:03d}"],
        wasted_usd_per_hour=usd,
        confidence=0.9,
        detail=detail,
        fix="stage the dataset on local NVMe",
    )


async def test_chat_says_the_gpus_waiting_on_their_node_in_the_plans_words(tmp_path: Path) -> None:
    """A plan with one move, seven trainings waiting on their node at $1-7/hour and a misplacement finding: Slack,
    Mattermost, Teams and the generic webhook each say the five costliest ($7 down to $3), costliest first, with
    their fix, in the words ``fleetfit plan`` prints; the misplacement is not among them. Deliberate bugs: the
    alerter not handing the plan's findings to the notice (no section anywhere), ``waiting_on_node`` sorted
    cheapest first ($1 and $2 shown), the generic payload worded apart from the plan's text."""
    misplaced = waiting(99, 50.0).model_copy(update={"kind": FindingKind.SERVING_ON_TRAINING_HARDWARE, "fix": None})
    plan = plan_of([rec(1)]).model_copy(update={"findings": [waiting(i, float(i)) for i in range(1, 8)] + [misplaced]})
    with webhook_server() as server:
        kinds = ("slack", "mattermost", "teams", "generic")
        alerter = Alerter(settings(*(receiver(server, k, k) for k in kinds)), Journal(tmp_path / "a.db"))
        task = asyncio.create_task(alerter.run())
        alerter.observe(plan, {})
        got = await asyncio.to_thread(server.wait_for, 4, 10.0)
        task.cancel()
        await alerter.close()
    bodies = {r.path.split("/")[2]: r.json() for r in got}
    printed = [line.strip() for line in render_table(plan).splitlines() if "input starved training" in line]
    costliest = [next(line for line in printed if line.startswith(f"train-{n} on")) for n in (7, 6, 5, 4, 3)]
    assert [w["text"] for w in bodies["generic"]["waiting"]] == costliest
    assert costliest[0].startswith("train-7 on h100-007") and printed[0].endswith(
        "fix: stage the dataset on local NVMe"
    )
    for kind in kinds:
        text = json.dumps(bodies[kind], ensure_ascii=False)
        assert "GPUs waiting on their node" in text or kind == "generic", kind
        shown = [f"${n}.00/hour" for n in range(1, 8) if f"${n}.00/hour" in text]
        assert shown == ["$3.00/hour", "$4.00/hour", "$5.00/hour", "$6.00/hour", "$7.00/hour"], kind
        assert text.index("$7.00/hour") < text.index("$3.00/hour"), kind
        assert text.count("fix: stage the dataset on local NVMe") == 5 and "train-99" not in text, kind


def test_the_waiting_section_stays_within_each_platforms_limits() -> None:
    """120 moves beside seven waiting findings with 5000-character evidence: Slack keeps 50 blocks and 3000
    characters a section, the waiting section listing what fits and counting the rest; Teams stays under 28 KB.
    Deliberate bugs: the evidence not clipped (WAITING_DETAIL_CHARS at 10 000: the section over 3000 or no line
    shown), the Slack section's length check dropped."""
    notice = notice_of(120, resolved=3)
    notice.waiting = [waiting(i, float(10 - i), detail="x" * 5000) for i in range(7)]
    body = json.loads(render("slack", notice, 40_000))
    assert len(body["blocks"]) <= 50
    (section,) = [b for b in body["blocks"] if "GPUs waiting on their node" in b.get("text", {}).get("text", "")]
    text = section["text"]["text"]
    assert len(text) <= 3000
    lines = text.count("\n– ")
    assert 1 <= lines < 7 and f"and {7 - lines} more" in text
    assert len(render("teams", notice, 28_000)) <= 28_000


def test_waiting_findings_on_hundreds_of_nodes_leave_the_moves_their_message() -> None:
    """One move beside five trainings each starved on 300 nodes (about 13 kB of node names a line): Mattermost's
    body stays within its 16 kB, still says the move, and keeps the costliest waiting finding that fits. Deliberate
    bugs: render fitting the moves alone (the body over 16 kB, which Mattermost refuses, losing the move too), the
    waiting findings cut to none (the costliest no longer shown)."""
    notice = notice_of(1)
    many = [f"gpu-node-{i:04d}.rack-17.cluster.example.com" for i in range(300)]
    notice.waiting = [waiting(i, float(10 - i)).model_copy(update={"nodes": many}) for i in range(5)]
    text = render("mattermost", notice, 16_000).decode()
    assert len(text.encode()) <= 16_000
    assert "service-0" in text and "l40s-000" in text
    assert "$10.00/hour" in text and "$9.00/hour" not in text
