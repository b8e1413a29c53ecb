"""Throttling read from dcgm-exporter's series (optimizer/ingest/dcgm.py), without a server: the clock event
reasons bitmask under either of its names and the violation counters become the window's throttle shares, and a
throttled GPU read through Prometheus is named as one read from an agent."""

from __future__ import annotations

import dataclasses
import re

import msgspec
import pytest

from agent.protocol import FindingKind, TopicKind, node_topic
from agent.simulate import ManualClock
from collectors.sim.exporter import ExporterOptions, node_view, render
from collectors.sim.names import FieldSet
from collectors.sim.scenarios import build_scenario, simulated_node
from optimizer.decide.catalog import load_catalog
from optimizer.decide.findings import detect
from optimizer.decide.snapshot import from_fleet, resolve
from optimizer.ingest.dcgm import NodeSeries, Tally, add_series, birth, windows
from optimizer.ingest.fleet import Fleet

T0 = 1_796_400_000.0
TIMES = [T0 + 30 * i for i in range(40)]  # twenty minutes at a 30 s scrape: four 300 s windows
LABELS = {"gpu": "0", "UUID": "GPU-0", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "h100-001",
          "namespace": "ml", "pod": "train-0"}  # fmt: skip


def _node(series: dict[str, list[float]]) -> NodeSeries:
    """A busy H100 training pod's GPU, with ``series`` (metric -> a value a scrape) beside its usual fields."""
    node = NodeSeries("h100-001")
    base = {"DCGM_FI_DEV_GPU_UTIL": [97.0] * 40, "DCGM_FI_DEV_FB_USED": [70_000.0] * 40,
            "DCGM_FI_DEV_POWER_USAGE": [650.0] * 40}  # fmt: skip
    for metric, values in {**base, **series}.items():
        add_series(node, {"__name__": metric, **LABELS}, TIMES, values, {}, Tally())
    return node


def _gpu_windows(node: NodeSeries) -> list[dict[str, object]]:
    return [w["gpus"][0] for w in windows(node, "s", T0, T0 + 1200, 300)]  # type: ignore[index]


def _throttle_findings(node: NodeSeries) -> list[str]:
    fleet = Fleet("t", horizon_windows=10)
    assert fleet.ingest(node_topic("t", "s", node.node, TopicKind.BIRTH), msgspec.json.encode(birth(node, "s", T0)))
    for w in windows(node, "s", T0, T0 + 1200, 300):
        assert fleet.ingest(node_topic("t", "s", node.node, TopicKind.TELEMETRY), msgspec.json.encode(w)), w
    catalog = load_catalog()
    found = detect(catalog, resolve(catalog, from_fleet(fleet, "s", [])))
    return [f.detail for f in found if f.kind is FindingKind.THROTTLED_GPU]


@pytest.mark.parametrize("name", ["DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"])
def test_a_gpu_held_down_by_heat_is_named_from_its_clock_event_reasons(name: str) -> None:
    """Deliberate bugs caught: the reasons field not mapped (a fleet read from Prometheus never shows throttling);
    the older name (DCGM before 3.3) not read; the thermal bits (0x20 SW, 0x40 HW) taken for the power cap."""
    # SW thermal slowdown (0x20) with the GPU also on its application clocks (0x2) in half the scrapes
    node = _node({name: [float(0x20 | (0x2 if i % 2 else 0)) for i in range(40)]})
    for gpu in _gpu_windows(node):
        assert gpu["thermal_slowdown_pct"][0] == pytest.approx(100.0)  # type: ignore[index]
        assert gpu["power_capped_pct"][0] == 0.0 and gpu["hw_slowdown_pct"][0] == 0.0  # type: ignore[index]
    (detail,) = _throttle_findings(node)
    assert "held down by heat" in detail


def test_reasons_that_slow_no_work_are_no_throttle() -> None:
    """Deliberate bug caught: any bit of the mask counted as throttling; GPU idle (0x1), application clocks (0x2),
    sync boost (0x10) and display clocks (0x100) are set on healthy GPUs all day."""
    node = _node({"DCGM_FI_DEV_CLOCKS_EVENT_REASONS": [float(0x1 | 0x2 | 0x10 | 0x100)] * 40})
    for gpu in _gpu_windows(node):
        shares = [gpu[k][0] for k in ("power_capped_pct", "thermal_slowdown_pct", "hw_slowdown_pct")]  # type: ignore[index]
        assert shares == [0.0, 0.0, 0.0]
    assert _throttle_findings(node) == []


def test_power_violation_microseconds_under_a_lowered_limit_are_a_power_throttle() -> None:
    """Deliberate bugs caught: the violation counter read as a share without its microseconds (1e6 a second), or
    as its level rather than its growth; a counter reset read as a negative share."""
    # 15 s of every 30 s held by power: 15e6 us a scrape, reset to 0 once (a driver reload) at scrape 20
    grown = [15e6 * i if i < 20 else 15e6 * (i - 20) for i in range(40)]
    node = _node({"DCGM_FI_DEV_POWER_VIOLATION": grown, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": [350.0] * 40})
    for gpu in _gpu_windows(node):
        assert gpu["power_violation_pct"][0] == pytest.approx(50.0)  # type: ignore[index]
    (detail,) = _throttle_findings(node)
    # 350 W is half the H100 SXM's 700 W TDP (the catalog's datasheet figure): under the 95 % the rule allows
    assert "held at a power limit of 350 W, 50% of its 700 W TDP" in detail


def test_a_sentinel_power_limit_is_passed_over_for_the_next_figure_not_the_node_s_birth() -> None:
    """DCGM's enforced limit reading 4,294,967.295 W (the driver's 0xFFFFFFFF mW for "not available") beside a
    700 W management limit. Deliberate bug caught: taking the first limit found whatever it says: the birth is
    refused (a GPU's limit is 0-10,000 W) and the node's windows with it."""
    node = _node(
        {"DCGM_FI_DEV_ENFORCED_POWER_LIMIT": [4_294_967.295] * 40, "DCGM_FI_DEV_POWER_MGMT_LIMIT": [700.0] * 40}
    )
    fleet = Fleet("t")
    assert fleet.ingest(node_topic("t", "s", node.node, TopicKind.BIRTH), msgspec.json.encode(birth(node, "s", T0)))
    record = fleet.nodes[("s", node.node)]
    assert record.birth is not None and record.birth.gpus[0].power_limit_w == 700.0 and not fleet.rejected


_LINE = re.compile(r"^(\w+)\{(.*)\} (\S+)$")
_PAIR = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@pytest.mark.parametrize(("fields", "held"), [("all", 100.0), ("default", None)])
def test_the_simulated_exporter_shows_a_planted_thermal_throttle_with_all_its_fields(
    fields: FieldSet, held: float | None
) -> None:
    """Scrapes of a simulated H100 node held down by heat, read back as dcgm-exporter's series: with every field
    its windows carry the thermal share; with default-counters.csv's fields (no clock event reasons there) none.
    Deliberate bugs caught: the simulator's bitmask left at 0 under a planted throttle; the reasons emitted by
    default, where a real exporter has none."""
    clock = ManualClock()
    scenario = build_scenario("mixed", 6, seed=3)[2]  # eight H100s training
    sim = simulated_node(dataclasses.replace(scenario, quirks=frozenset({"throttle_thermal"})), clock, 3)
    node = NodeSeries(scenario.name)
    points: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[list[float], list[float]]] = {}
    clock.now = T0
    for _ in range(40):
        clock.now += 30
        sim.sample()
        for line in render([node_view(sim)], ExporterOptions(fields=fields)).splitlines():
            match = _LINE.match(line)
            if match and match[1].startswith("DCGM_"):
                times, values = points.setdefault((match[1], tuple(_PAIR.findall(match[2]))), ([], []))
                times.append(clock.now)
                values.append(float(match[3]))
    for (name, labels), (times, values) in points.items():
        add_series(node, {"__name__": name, **dict(labels)}, times, values, {}, Tally())
    gpus = [g for w in windows(node, "s", T0, T0 + 1200, 300) for g in w["gpus"]]  # type: ignore[attr-defined]
    busy = [g for g in gpus if g["util"][0] > 50]
    assert busy
    assert [g.get("thermal_slowdown_pct", [None])[0] for g in busy] == [held] * len(busy)
