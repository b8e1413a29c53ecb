"""Chat alert hooks against a real local HTTP server: retries, rate limits, grouping, deduplication across
restarts, resolved notices, filters, payload shapes and size limits, and webhook URLs kept out of logs."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import FLEETFIT, free_port, simulated_fleet
from webhook_server import WebhookServer, webhook_server

from agent.protocol import Plan, Recommendation, SolverReport, WorkloadClass
from optimizer.alerts.alerter import Alerter
from optimizer.alerts.delivery import Webhook, redact, retry_after
from optimizer.alerts.journal import Journal
from optimizer.alerts.notice import Item, Notice, Status
from optimizer.alerts.payloads import GenericAlert, render
from optimizer.alerts.settings import AlertSettings, ReceiverSettings, Severity
from optimizer.catalog import load_catalog
from optimizer.lifecycle import Lifecycle, RecState
from optimizer.recommend import PlanSettings, build_plan

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
    base: dict[str, Any] = {"group_wait": 0.0, "retry_initial": 0.2, "retry_max": 5.0, "max_attempts": 4}
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
    assert times[-1] - times[0] >= 4 * 0.25 - 0.02


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
    fleet, _ = simulated_fleet("demo", 8, windows=8, site="s")
    plan = build_plan(fleet, "s", load_catalog(), PlanSettings())
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
    assert {m["workload_name"] for m in body["firing"]} == {"chat-serving", "vision-finetune-ddp"}


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
    data = json.loads(render("generic", notice_of(3000, resolved=2), 256_000))
    alert = GenericAlert.model_validate(data)
    assert (alert.schema_, alert.version, alert.site) == ("fleetfit.alert", 1, "eu-1")
    assert len(alert.firing) + len(alert.resolved) + alert.omitted == 3002
    assert alert.monthly_savings_usd == pytest.approx(sum(1_000.0 + i for i in range(3000)))
    assert alert.firing[0].monthly_savings_usd == max(m.monthly_savings_usd for m in alert.firing)


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
    assert result.returncode == 2 and "not accepted" in result.stderr
    assert "s3cr3t-token" not in result.stderr and f"127.0.0.1:{port}" not in result.stderr


async def test_optimizer_metrics_count_alerts_per_receiver(tmp_path: Path) -> None:
    from agent.metrics import render as render_metrics
    from optimizer.config import OptimizerConfig
    from optimizer.service import Optimizer

    with webhook_server([(500, {})] * 4) as server:
        ok, broken = receiver(server, name="ok"), receiver(server, name="broken")
        alerter = Alerter(settings(ok, broken, max_attempts=2), Journal(tmp_path / "a.db"))
        optimizer = Optimizer(OptimizerConfig(), load_catalog(), alerter=alerter)
        alerter.observe(plan_of([rec(1)]), {})
        await alerter.flush()
        text = render_metrics(optimizer.self_metrics())
        await alerter.close()
    # two attempts each, four 500s: both receivers gave up, counted by reason
    assert 'fleetfit_alerts_sent_total{receiver="ok"} 0' in text
    assert 'fleetfit_alerts_failed_total{receiver="broken",reason="server_error"} 1' in text
    assert 'fleetfit_alerts_failed_total{receiver="ok",reason="server_error"} 1' in text
    assert 'fleetfit_alert_retries_total{receiver="ok"} 1' in text
    assert "fleetfit_alerts_pending 0" in text
