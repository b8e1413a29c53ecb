"""GPUs held below their clocks (heat, a lowered power limit, the power brake): named with their cause, the fix
to check and the GPU time paid while slowed, and never taken for slow hardware by the classifier or the planner."""

from __future__ import annotations

import dataclasses

import pytest

from agent.protocol import FindingKind, Stats, Telemetry, TopicKind, WorkloadClass, encode, node_topic
from agent.simulate import offline_windows, shift_to_now
from collectors.sim.scenarios import ScenarioNode, build_scenario
from optimizer.decide.catalog import load_catalog
from optimizer.decide.classify import THROTTLED_LOAD_CONFIDENCE, classify
from optimizer.decide.features import workload_features
from optimizer.decide.findings import detect
from optimizer.decide.snapshot import Snapshot, from_fleet, resolve
from optimizer.ingest.fleet import Fleet
from optimizer.ingest.history import Digest, DigestRing

NODES = build_scenario("mixed", 6, seed=3)
L4_SERVING = NODES[0]  # eight L4s serving requests, about half busy
H100_TRAINING = NODES[2]  # eight H100s training


def _windows(node: ScenarioNode, quirks: frozenset[str] = frozenset(), count: int = 8) -> list[Telemetry]:
    return offline_windows(dataclasses.replace(node, quirks=quirks), count, site="s")[1]


def _fleet(node: ScenarioNode, windows: list[Telemetry]) -> Fleet:
    birth, _ = offline_windows(node, 1, site="s")
    fleet = Fleet("p")
    assert fleet.ingest(node_topic("p", "s", node.name, TopicKind.BIRTH), encode(birth))
    for w in shift_to_now(windows):
        assert fleet.ingest(node_topic("p", "s", node.name, TopicKind.TELEMETRY), encode(w))
    return fleet


def _snapshot(node: ScenarioNode, windows: list[Telemetry]) -> Snapshot:
    return from_fleet(_fleet(node, windows), "s", [])


@pytest.mark.parametrize(
    ("quirk", "named", "fix"),
    [
        ("throttle_thermal", "held down by heat", "airflow"),
        ("throttle_power", "held at a power limit of 420 W, 60% of its 700 W TDP", "nvidia-smi -pl"),
        ("throttle_hw", "HW_SLOWDOWN", "power supplies"),
    ],
)
def test_a_throttled_node_is_named_with_its_cause_its_fix_and_what_it_costs(quirk: str, named: str, fix: str) -> None:
    """Deliberate bugs caught: throttle reasons kept in the windows but never reaching a finding; the hardware
    slowdown folded into heat (and named so); the cost priced on the whole allocation rather than its throttled
    share."""
    # held down in every second it computed in its last four windows of eight: half its GPU time
    windows = _windows(H100_TRAINING)[:4] + _windows(H100_TRAINING, frozenset({quirk}))[4:]
    snapshot = _snapshot(H100_TRAINING, windows)
    (w,) = snapshot.workloads
    assert w.throttling is not None and 0.4 <= w.throttling.share <= 0.5
    catalog = load_catalog()
    (finding,) = [f for f in detect(catalog, resolve(catalog, snapshot)) if f.kind is FindingKind.THROTTLED_GPU]
    assert named in finding.detail and "an estimate" in finding.detail
    assert finding.fix is not None and fix in finding.fix
    h100 = catalog.by_key("h100")
    # the GPU-hours paid while slowed: its throttled share of 8 H100s at the catalog's price
    assert finding.wasted_usd_per_hour == pytest.approx(w.throttling.share * 8 * h100.price_per_gpu_hour, abs=1e-3)


def test_a_power_cap_at_the_boards_own_limit_is_no_throttle() -> None:
    """Deliberate bug caught: every power-capped second counted as a throttle, whatever the limit. Dense training
    meets its cap at the default limit (the TDP) as designed, and the catalog's speeds were measured so: every busy
    H100 would be named throttled."""
    windows = _windows(H100_TRAINING)
    capped = Stats.of([100.0])
    windows = [
        w.model_copy(update={"gpus": [g.model_copy(update={"power_capped_pct": capped, "power_limit_w": 700.0})
                                      for g in w.gpus]})
        for w in windows
    ]  # fmt: skip
    snapshot = _snapshot(H100_TRAINING, windows)
    assert [w.throttling for w in snapshot.workloads] == [None]
    catalog = load_catalog()
    assert not [f for f in detect(catalog, resolve(catalog, snapshot)) if f.kind is FindingKind.THROTTLED_GPU]


def test_load_seen_while_throttled_does_not_make_a_service_look_busier() -> None:
    """Deliberate bugs caught: windows on GPUs held down by heat kept among the load figures (the same requests on
    a GPU at 70 % of its clock keep kernels running 1/0.7 as long, so the service's load reads higher, and the
    planner would want more or faster GPUs to carry it); a class read from load seen only while throttled acted on
    at full confidence; the ten-minute digest the hot windows fall in kept, whose peak is the projection's p95."""
    clean = _windows(L4_SERVING)
    hot = _windows(L4_SERVING, frozenset({"throttle_thermal"}))
    # the same requests, the last three windows on an overheating node
    fleet = _fleet(L4_SERVING, clean[:5] + hot[5:])
    record = fleet.record("s", L4_SERVING.name)
    assert record is not None
    first, last = record.windows[0], record.windows[-1]
    wid = first.workloads[0].id
    # ten minutes earlier at a 50 % peak, and the ten minutes that hold the hot windows at a 100 % peak
    record.history.digests[wid] = DigestRing([Digest(first.start - 1, 40.0, 50.0, 0.0), Digest(last.end, 60, 100, 0)])
    features = workload_features(fleet, "s")
    unthrottled = workload_features(_fleet(L4_SERVING, clean[:5]), "s")
    throttled = workload_features(_fleet(L4_SERVING, hot), "s")
    (f,), (expected,), (slowed,) = features, unthrottled, throttled
    assert slowed.mean_util > expected.mean_util * 1.2  # what the heat would have added
    # every window held down: its load is kept (there is no other), and no move may be sized on it
    hot_only = classify(slowed)
    assert hot_only.workload_class is WorkloadClass.INFERENCE and hot_only.confidence <= THROTTLED_LOAD_CONFIDENCE
    assert f.mean_util == pytest.approx(expected.mean_util) and f.p95_util == pytest.approx(expected.p95_util)
    assert f.daily_peak_p95 == 50.0
    assert f.throttled_left_out == 3 and f.throttle_thermal == pytest.approx(3 / 8, abs=0.05)
    assert any("3 window(s) on GPUs held below their clocks" in e for e in classify(f).evidence)
