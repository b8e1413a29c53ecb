"""Chat messages for what `fleetfit apply --execute` did: carried out with the scheduler's command, failed with its
answer, posted to a real local HTTP server as each receiver kind shapes it."""

from __future__ import annotations

import pytest
from apply_recs import slurm_move
from webhook_server import webhook_server

from optimizer.act.backend import Result, Status
from optimizer.commands.apply import Done, _post, post_items
from optimizer.serve.alerts.payloads import GenericAlert
from optimizer.serve.config import OptimizerConfig
from optimizer.serve.lifecycle import RecState, Tracked


def tracked(n: int) -> Tracked:
    rec = slurm_move(n, id=f"rec-{n}", workload_name=f"job {n}", monthly_savings_usd=1000.0 * n)
    return Tracked(rec, "eu-1", RecState.ACKNOWLEDGED, 0.0, 0.0, 0.0)


DONE = [
    Done(tracked(1), Result("rec-1", "slurm", Status.APPLIED, ("scontrol update JobId=1 Partition=l40s",), "$ …")),
    Done(
        tracked(2),
        Result(
            "rec-2",
            "slurm",
            Status.FAILED,
            ("scontrol update JobId=2 Partition=l40s",),
            "$ scontrol update JobId=2 Partition=l40s\nslurm_update error: Invalid job id specified\n"
            "failed (exit status 1)",
        ),
    ),
    Done(tracked(3), Result("rec-3", "slurm", Status.NOTIFIED, ("scontrol requeuehold 3",), "job 3 is running")),
]


def test_applied_and_failed_actions_are_posted_with_command_and_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """One message per site: the action carried out with its command, the failed one with the scheduler's answer,
    the one only printed for its owner left out (deliberate bug caught: a failure posted with its last line, "failed
    (exit status 1)", in place of what Slurm said)."""
    with webhook_server() as server:
        monkeypatch.setenv("TEST_APPLY_HOOK", server.url("/hooks/apply"))
        config = OptimizerConfig.model_validate(
            {"alerts": {"receivers": [{"name": "ops", "kind": "generic", "url_env": "TEST_APPLY_HOOK"}]}}
        )
        _post(config, DONE)
        (got,) = server.wait_for(1, timeout=10)
    alert = GenericAlert.model_validate(got.json())
    assert alert.title == "fleetfit · eu-1: 1 carried out, 1 failed"
    assert [(m.id, m.status, m.detail) for m in alert.resolved] == [
        ("rec-1", "carried_out", "slurm: scontrol update JobId=1 Partition=l40s"),
        ("rec-2", "failed", "slurm: slurm_update error: Invalid job id specified"),
    ]
    assert alert.firing == []


def test_slack_words_a_failure_with_the_schedulers_answer() -> None:
    """Slack's message says "failed:" with the answer beside the action (deliberate bug caught: the failed status
    worded as "expired: no longer proposed")."""
    from optimizer.serve.alerts.notice import Item, Notice
    from optimizer.serve.alerts.notice import Status as ChatStatus
    from optimizer.serve.alerts.payloads import render
    from optimizer.serve.alerts.settings import Severity

    ((_, items),) = post_items(DONE).items()
    notice = Notice("eu-1", 0.0)
    for d, detail in items:
        status = ChatStatus.CARRIED_OUT if d.result.status == Status.APPLIED else ChatStatus.FAILED
        notice.items.append(Item(d.tracked.recommendation, status, Severity.INFO, detail))
    text = render("slack", notice, 40_000).decode()
    assert "failed: slurm: slurm_update error: Invalid job id specified" in text
    assert "carried out: slurm: scontrol update JobId=1 Partition=l40s" in text
    assert "expired" not in text
