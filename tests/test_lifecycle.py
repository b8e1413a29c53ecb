"""Recommendation lifecycle in SQLite, and the CLI that reads and changes it."""

from __future__ import annotations

import csv
import io
import json
import subprocess
from pathlib import Path

import pytest
from conftest import FLEETFIT, three_actions

from agent.protocol import Plan
from optimizer.decide.catalog import load_catalog
from optimizer.plan.recommend import PlanSettings, plan_snapshot
from optimizer.serve.lifecycle import Lifecycle, LifecycleError, RecState


@pytest.fixture(scope="module")
def plan() -> Plan:
    """A move of a service, a move of a training job and a reclaim (conftest.three_actions)."""
    return plan_snapshot(three_actions("s"), load_catalog(), PlanSettings())


def _placements(plan: Plan) -> dict[str, str]:
    return {w.id: w.hardware for w in plan.workloads}


def test_states_survive_replanning_and_restarts(tmp_path: Path, plan: Plan) -> None:
    life = Lifecycle.in_state_dir(tmp_path)
    life.record(plan, _placements(plan), now=100.0)
    ids = [r.id for r in plan.recommendations]
    assert len(ids) == 3 and {t.state for t in life.list()} == {RecState.NEW}
    serving = next(r for r in plan.recommendations if r.workload_name == "image-gen")
    life.set_state(serving.id, RecState.ACKNOWLEDGED)
    life.close()
    life = Lifecycle.in_state_dir(tmp_path)  # an optimizer restart
    life.record(plan, _placements(plan), now=200.0)
    tracked = life.get(serving.id)
    assert tracked is not None and tracked.state is RecState.ACKNOWLEDGED
    assert (tracked.first_seen, tracked.last_seen) == (100.0, 200.0)
    idle = next(r for r in plan.recommendations if r.workload_name == "forgotten-notebook-alloc")
    life.set_state(idle.id, RecState.DISMISSED)
    life.record(plan, _placements(plan), now=300.0)
    assert life.get(idle.id).state is RecState.DISMISSED  # type: ignore[union-attr]
    with pytest.raises(LifecycleError, match="no recommendation"):
        life.set_state("nope", RecState.DISMISSED)


def test_applied_when_the_workload_reached_its_target_else_expired(tmp_path: Path, plan: Plan) -> None:
    life = Lifecycle.in_state_dir(tmp_path)
    life.record(plan, _placements(plan))
    serving = next(r for r in plan.recommendations if r.workload_name == "image-gen")
    later = plan.model_copy(update={"recommendations": []})
    placements = _placements(plan) | {serving.workload: serving.to_hardware}  # it moved as recommended
    life.record(later, placements)
    states = {t.recommendation.workload_name: t.state for t in life.list(states=list(RecState))}
    assert states["image-gen"] is RecState.APPLIED
    assert states["vision-finetune-ddp"] is RecState.EXPIRED
    assert life.list() == []  # nothing open
    with pytest.raises(LifecycleError, match="is expired"):
        life.set_state(
            next(r.id for r in plan.recommendations if r.workload_name == "vision-finetune-ddp"), RecState.ACKNOWLEDGED
        )


def test_cli_lists_and_changes_states(tmp_path: Path, plan: Plan) -> None:
    life = Lifecycle.in_state_dir(tmp_path)
    life.record(plan, _placements(plan))
    life.close()
    base = [FLEETFIT, "recommendations", "--state-dir", str(tmp_path)]
    rows = json.loads(subprocess.run([*base, "--format", "json"], capture_output=True, check=True, timeout=60).stdout)
    assert [r["state"] for r in rows] == ["new"] * 3
    assert rows[0]["monthly_savings_usd"] >= rows[-1]["monthly_savings_usd"]
    out = subprocess.run([*base, "dismiss", rows[0]["id"]], capture_output=True, check=True, timeout=60).stdout
    assert out.decode().split() == [rows[0]["id"], "dismissed"]
    text = subprocess.run([*base, "--format", "csv"], capture_output=True, check=True, timeout=60).stdout.decode()
    table = list(csv.DictReader(io.StringIO(text)))
    assert len(table) == 2 and rows[0]["id"] not in {r["id"] for r in table}
    everything = subprocess.run([*base, "--all", "--format", "csv"], capture_output=True, check=True, timeout=60)
    assert len(list(csv.DictReader(io.StringIO(everything.stdout.decode())))) == 3
    bad = subprocess.run([*base, "ack", "0000"], capture_output=True, check=False, timeout=60)
    assert bad.returncode == 1 and b"no recommendation 0000" in bad.stderr
    missing = subprocess.run(
        [FLEETFIT, "recommendations", "--state-dir", str(tmp_path / "none")],
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert missing.returncode == 1 and b"no recommendations yet" in missing.stderr


def test_a_move_whose_workload_is_not_seen_stays_open_for_an_hour(tmp_path: Path, plan: Plan) -> None:
    """After a restart the first plans see no workload yet: their moves are not withdrawn, only unseen."""
    life = Lifecycle.in_state_dir(tmp_path)
    life.record(plan, _placements(plan), now=1000.0)
    ids = {r.id for r in plan.recommendations}
    empty = plan.model_copy(update={"recommendations": [], "workloads": []})
    assert life.record(empty, {}, now=1060.0) == []
    assert {t.recommendation.id for t in life.list()} == ids
    resolved = life.record(empty, {}, now=1000.0 + 3601)
    # an hour unseen: the moves were not carried out (their workloads are not on the target hardware), while
    # the idle allocation to release is gone, which is what its reclaim asked for
    assert {r.workload_name: state for r, state in resolved} == {
        "image-gen": RecState.EXPIRED,
        "vision-finetune-ddp": RecState.EXPIRED,
        "forgotten-notebook-alloc": RecState.APPLIED,
    }
