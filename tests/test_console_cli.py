"""The command line as a newcomer meets it: help that explains every option, output that lines up and says
what it does, one-line refusals, and `agent --once` output that `classify` reads back."""

from __future__ import annotations

import argparse
import asyncio
import logging
import subprocess
import time
from pathlib import Path

import pytest
from conftest import FLEETFIT, free_port, three_actions

from agent.config import MqttSettings
from agent.protocol import WorkloadClass
from collectors.sim.scenarios import SCENARIOS
from optimizer.commands.cli import build_parser
from optimizer.commands.offline import Score, render_score
from optimizer.decide.catalog import load_catalog
from optimizer.plan.recommend import PlanSettings, plan_snapshot
from optimizer.serve.config import OptimizerConfig
from optimizer.serve.lifecycle import Lifecycle
from optimizer.serve.service import Optimizer


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += _subparsers(sub)
    return out


def test_every_option_has_a_description_and_scenarios_are_listed() -> None:
    missing = [
        f"{p.prog} {'/'.join(a.option_strings) or a.dest}"
        for p in _subparsers(build_parser())
        for a in p._actions
        if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction) and not a.help
    ]
    assert missing == []
    simulate = subprocess.run([FLEETFIT, "simulate", "--help"], capture_output=True, text=True, check=True)
    assert all(name in simulate.stdout for name in SCENARIOS) and "spare" in simulate.stdout
    demo = subprocess.run([FLEETFIT, "demo", "--help"], capture_output=True, text=True, check=True)
    assert "at least 8" in demo.stdout and "console" in demo.stdout


def test_agent_once_jsonl_is_read_back_by_classify(tmp_path: Path) -> None:
    recording = tmp_path / "windows.jsonl"
    with recording.open("w") as out:
        for _ in range(3):  # classify wants three windows of a workload; each run is a session of its own
            time.sleep(1.1)  # the session is the clock in seconds
            subprocess.run(
                [FLEETFIT, "agent", "--once", "--jsonl", "--simulate", "h100x2", "--window", "1"],
                stdout=out,
                stderr=subprocess.DEVNULL,
                timeout=60,
                check=True,
            )
    lines = recording.read_text().splitlines()
    assert len(lines) == 3 and all(line.startswith("{") and line.endswith("}") for line in lines)
    result = subprocess.run(
        [FLEETFIT, "classify", str(recording)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0 and result.stdout.startswith("1 workload(s) from 3 line(s), 0 rejected")
    assert "3 needed" not in result.stdout  # all three windows counted


def test_confusion_matrix_header_names_every_class_whole() -> None:
    classes = [WorkloadClass.BATCH_INFERENCE, WorkloadClass.INTERACTIVE, WorkloadClass.TRAINING]
    score = Score(
        classes=classes,
        confusion={(c, c): 2 for c in classes},
        macro_f1=1.0,
        accuracy=1.0,
        support=6,
    )
    lines = render_score(score).splitlines()
    assert "batch_inference" in lines[1].split()
    # the counts sit under their class names
    header = lines[1]
    row = next(line for line in lines if line.startswith("training"))
    assert header.index("training") + len("training") == row.rindex("2") + 1


def test_recommendations_savings_column_lines_up(tmp_path: Path) -> None:
    plan = plan_snapshot(three_actions("s1"), load_catalog(), PlanSettings())  # $9,636, $4,380 and $540.20
    life = Lifecycle.in_state_dir(tmp_path)
    life.record(plan, {})
    life.close()
    out = subprocess.run(
        [FLEETFIT, "recommendations", "--state-dir", str(tmp_path)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0].startswith("site s1: 3 open action(s)") and out[1].split()[:3] == ["#", "WAVE", "WAITS"]
    assert len(out) == 5
    column = out[1].index("SAVING/MONTH")
    assert all(line[column] == "$" for line in out[2:])  # the savings column lines up under its header


def test_simulate_says_it_adds_spare_nodes(mosquitto: object) -> None:
    from conftest import MosquittoServer

    assert isinstance(mosquitto, MosquittoServer)
    result = subprocess.run(
        [FLEETFIT, "simulate", "--broker", f"mqtt://127.0.0.1:{mosquitto.port}", "--nodes", "10",
         "--scenario", "mixed", "--duration", "1", "--time-scale", "20"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "simulating 11 nodes: the 10 asked for and 1 spare node(s)" in result.stderr


def test_alerts_test_refuses_a_malformed_url_at_once(tmp_path: Path) -> None:
    config = tmp_path / "optimizer.toml"
    config.write_text('[[alerts.receivers]]\nname = "ops"\nkind = "slack"\nurl_env = "OPS_WEBHOOK"\n')
    for url in ("hooks.slack.com/services/T0/B0/s3cr3t", "http://", "ftp://example.com/x"):
        started = time.monotonic()
        result = subprocess.run(
            [FLEETFIT, "alerts", "test", "--receiver", "ops", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            env={"OPS_WEBHOOK": url, "PATH": "/usr/bin:/bin"},
            check=False,
        )
        assert result.returncode == 1 and time.monotonic() - started < 10
        assert result.stderr.strip().count("\n") == 0 and "not an http(s) URL" in result.stderr
        assert "s3cr3t" not in result.stderr


async def test_optimizer_names_the_broker_it_lost(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()  # nothing listens here
    config = OptimizerConfig(mqtt=MqttSettings(host="127.0.0.1", port=port, reconnect_max_delay=0.2))
    optimizer = Optimizer(config, load_catalog())
    with caplog.at_level(logging.WARNING, logger="optimizer.serve.service"):
        task = asyncio.create_task(optimizer.run())
        for _ in range(100):
            if any("connection lost" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.05)
        optimizer.should_exit.set()
        await task
    lost = [r.getMessage() for r in caplog.records if "connection lost" in r.getMessage()]
    assert lost and f"127.0.0.1:{port}" in lost[0]
