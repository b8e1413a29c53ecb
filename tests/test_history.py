"""The day-long digests: a diurnal cycle is recognised, and a placement must carry the daily peak."""

from __future__ import annotations

import math

from agent.protocol import (
    Birth,
    GpuInfo,
    GpuWindow,
    NicInfo,
    NicKind,
    NicRole,
    NicWindow,
    Stats,
    Telemetry,
    TopicKind,
    WorkloadClass,
    WorkloadKind,
    WorkloadRef,
    encode,
    node_topic,
)
from optimizer.decide.catalog import load_catalog
from optimizer.decide.classify import classify
from optimizer.decide.features import workload_features
from optimizer.ingest.fleet import Fleet
from optimizer.ingest.history import DIGESTS_KEPT
from optimizer.plan.recommend import PlanSettings, build_plan

P, SITE, DAY = "p", "s", 86_400


def _birth(node: str, model: str, memory_mib: int) -> bytes:
    return encode(
        Birth(
            node=node, site=SITE, session=1, agent_version="t", hostname=node, timestamp=0,
            gpus=[GpuInfo(index=i, uuid=f"{node}-{i}", model=model, memory_mib=memory_mib) for i in range(8)],
            nics=[NicInfo(name="eth0", kind=NicKind.ETHERNET, role=NicRole.NORTH_SOUTH)],
        )
    )  # fmt: skip


def _serving_day(fleet: Fleet, hours: float, end_at_trough: bool = True) -> None:
    """An 8-GPU service on an L40S node, 10-minute windows, peaking at 45 % and bottoming out near 4 %."""
    start = 1_700_000_000.0
    steps = int(hours * 6)
    for i in range(steps):
        t = i * 600
        phase = 2 * math.pi * (t - (steps * 600 if end_at_trough else 0)) / DAY
        level = 4 + 41 * (0.5 + 0.5 * math.cos(phase + math.pi))  # trough at the end of the day
        series = [level * (0.7 + 0.6 * (k % 2)) for k in range(10)]
        window = Telemetry(
            node="l40s-1", site=SITE, session=1, seq=i, start=start + t, end=start + t + 600, samples=10,
            gpus=[GpuWindow(index=g, util=Stats.of(series), util_series=series, mem_used_mib=Stats.of([20_000.0]),
                            workload="k8s/serve") for g in range(8)],
            nics=[NicWindow(name="eth0", tx_bps=Stats.of([level * 2e7]), rx_bps=Stats.of([level * 1e6]))],
            workloads=[WorkloadRef(id="k8s/serve", kind=WorkloadKind.KUBERNETES_POD, name="serve",
                                   gpus=list(range(8)), hint="vllm")],
        )  # fmt: skip
        assert fleet.ingest(node_topic(P, SITE, "l40s-1", TopicKind.TELEMETRY), encode(window))


def test_a_day_of_serving_shows_its_cycle_and_is_not_moved_at_the_trough() -> None:
    fleet = Fleet(P, horizon_windows=6)  # the last hour in full, the day in digests
    fleet.ingest(node_topic(P, SITE, "l40s-1", TopicKind.BIRTH), _birth("l40s-1", "NVIDIA L40S", 46068))
    fleet.ingest(node_topic(P, SITE, "l4-1", TopicKind.BIRTH), _birth("l4-1", "NVIDIA L4", 23034))
    _serving_day(fleet, hours=24)
    (f,) = workload_features(fleet, SITE)
    assert f.mean_util < 10  # the last hour alone looks nearly idle...
    assert f.history_hours >= 23 and f.diurnal_ratio is not None and f.diurnal_ratio >= 8
    assert f.daily_peak_p95 > 50  # ...but the day peaked far higher
    result = classify(f)
    assert result.workload_class is WorkloadClass.INFERENCE
    assert any("daily cycle" in e for e in result.evidence)
    plan = build_plan(fleet, SITE, load_catalog(), PlanSettings())
    assert plan.recommendations == [], "an L4 cannot carry the daily peak"
    assert len(fleet.nodes[(SITE, "l40s-1")].history.of("k8s/serve")) <= DIGESTS_KEPT


def test_more_than_a_day_of_telemetry_shows_the_day_that_resizing_and_releasing_wait_for() -> None:
    fleet = Fleet(P, horizon_windows=6)
    fleet.ingest(node_topic(P, SITE, "l40s-1", TopicKind.BIRTH), _birth("l40s-1", "NVIDIA L40S", 46068))
    _serving_day(fleet, hours=26)
    (f,) = workload_features(fleet, SITE)
    assert f.history_hours >= PlanSettings().history_min_hours


def test_half_a_day_is_not_enough_to_call_a_cycle() -> None:
    fleet = Fleet(P, horizon_windows=6)
    fleet.ingest(node_topic(P, SITE, "l40s-1", TopicKind.BIRTH), _birth("l40s-1", "NVIDIA L40S", 46068))
    _serving_day(fleet, hours=8)
    (f,) = workload_features(fleet, SITE)
    assert f.diurnal_ratio is None and f.history_hours < 12
