"""Offline classification of recordings, its scoring, and misplacement findings."""

from __future__ import annotations

import json

import pytest
from conftest import simulated_fleet

from agent.protocol import FindingKind, WorkloadClass, encode
from agent.simulate import offline_windows
from collectors.sim.scenarios import build_scenario
from optimizer.commands.offline import RecordingError, classify_all, load, score
from optimizer.decide.catalog import load_catalog
from optimizer.plan.recommend import PlanSettings, build_plan

T, INF, B = WorkloadClass.TRAINING, WorkloadClass.INFERENCE, WorkloadClass.BATCH_INFERENCE
REST_OF_NODE = {
    FindingKind.INPUT_STARVED_TRAINING,
    FindingKind.CHECKPOINT_STALL,
    FindingKind.SLOW_COLD_START,
    FindingKind.MIXED_NODE,
}


def test_macro_f1_by_hand() -> None:
    s = score([(T, T), (T, T), (T, B), (INF, INF), (B, B)])
    # F1: training 2*2/(4+0+1)=0.8, inference 1.0, batch 2*1/(2+1+0)=0.667
    assert s.macro_f1 == pytest.approx((0.8 + 1.0 + 2 / 3) / 3)
    assert s.accuracy == pytest.approx(0.8)
    assert s.confusion[(T, B)] == 1


def test_bare_windows_without_births_still_classify() -> None:
    node = build_scenario("demo", 8, seed=2)[0]  # 8-GPU training with InfiniBand
    _, windows = offline_windows(node, 8, site="s")
    lines = [json.dumps(json.loads(encode(w))) for w in windows]
    rec = load(lines)
    (result,) = classify_all(rec)
    assert result.result.workload_class is WorkloadClass.TRAINING
    assert result.truth is None


def test_labelled_recording_scores_itself_and_bad_lines_are_reported() -> None:
    lines = []
    truth = {}
    for node in build_scenario("demo", 8, seed=3):
        birth, windows = offline_windows(node, 6, site="s")
        labels = {w.id: w.pattern.value for w in node.workloads}
        truth.update(labels)
        lines.append(json.dumps({"birth": json.loads(encode(birth)), "labels": labels}))
        lines += [json.dumps({"window": json.loads(encode(w)), "labels": labels}) for w in windows]
    lines.append(json.dumps({"window": {"schema": 1, "seq": "x"}}))
    rec = load(lines)
    assert rec.rejected == 1 and len(rec.labels) == len(truth)
    results = classify_all(rec)
    # every workload is matched to its label; how well the classifier does is tested where it is built
    assert {r.features.id for r in results if r.truth is not None} == set(truth)
    with pytest.raises(RecordingError, match="line 2"):
        load(["{}", "not json"])
    with pytest.raises(RecordingError, match="line 2: JSON nested too deeply"):
        load(["{}", '{"window": ' + "[" * 100_000])


def test_findings_name_each_planted_misplacement_with_its_waste() -> None:
    fleet, _ = simulated_fleet("demo", 8, windows=12, site="s")
    plan = build_plan(fleet, "s", load_catalog(), PlanSettings(pinned=["*"]))  # nothing may move...
    assert plan.recommendations == []
    # ...yet the misplacements are reported (the GPUs waiting on the rest of their node are tests/test_nodefit.py's)
    kinds = {f.workload_name: f.kind for f in plan.findings if f.kind not in REST_OF_NODE}
    assert kinds == {
        "chat-serving": FindingKind.SERVING_ON_TRAINING_HARDWARE,
        "vision-finetune-ddp": FindingKind.TRAINING_WITHOUT_NVLINK,
        "forgotten-notebook-alloc": FindingKind.IDLE_ALLOCATION,
    }
    idle = next(f for f in plan.findings if f.kind is FindingKind.IDLE_ALLOCATION)
    assert idle.wasted_usd_per_hour == pytest.approx(4 * 1.50)  # four A100s at the catalog's price
    assert all(f.wasted_usd_per_hour > 0 and f.confidence > 0.5 for f in plan.findings)
    wastes = [f.wasted_usd_per_hour for f in plan.findings]
    assert wastes == sorted(wastes, reverse=True)
