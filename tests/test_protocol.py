"""The wire protocol: topics, round trips, rejections, size."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from agent.protocol import (
    SCHEMA_VERSION,
    Birth,
    DiskInfo,
    DiskWindow,
    GpuInfo,
    GpuWindow,
    HostWindow,
    NicInfo,
    NicKind,
    NicRole,
    NicWindow,
    NodeStatus,
    Plan,
    ProtocolError,
    SolverReport,
    State,
    Stats,
    Telemetry,
    TopicKind,
    WorkloadKind,
    WorkloadRef,
    decode,
    encode,
    node_topic,
    parse_topic,
    recommendations_topic,
    series,
    subscription_filters,
)

PREFIX = "fleetfit/v1"


def test_topics_round_trip() -> None:
    for kind in (TopicKind.BIRTH, TopicKind.STATE, TopicKind.TELEMETRY):
        topic = node_topic(PREFIX, "eu-1", "gpu-node-07", kind)
        assert topic == f"fleetfit/v1/eu-1/gpu-node-07/{kind}"
        parsed = parse_topic(PREFIX, topic)
        assert (parsed.site, parsed.node, parsed.kind) == ("eu-1", "gpu-node-07", kind)
    rec = parse_topic(PREFIX, recommendations_topic(PREFIX, "eu-1"))
    assert rec.kind is TopicKind.RECOMMENDATIONS and rec.node is None
    assert subscription_filters(PREFIX) == [f"{PREFIX}/+/+/birth", f"{PREFIX}/+/+/state", f"{PREFIX}/+/+/telemetry"]


@pytest.mark.parametrize(
    "topic",
    [
        "other/v1/eu-1/n1/telemetry",
        "fleetfit/v1/eu-1/telemetry",
        "fleetfit/v1/eu-1/n1/telemetry/extra",
        "fleetfit/v1/eu-1/n1/firmware",
        "fleetfit/v1/eu 1/n1/telemetry",
        "fleetfit/v1/eu-1/+/telemetry",
        "fleetfit/v1/eu-1//telemetry",
    ],
)
def test_malformed_topics_are_rejected(topic: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_topic(PREFIX, topic)
    assert info.value.reason == "bad_topic"


def test_node_ids_must_be_topic_safe() -> None:
    with pytest.raises(ProtocolError):
        node_topic(PREFIX, "eu-1", "node/../x", TopicKind.BIRTH)


def _eight_gpu_window() -> Telemetry:
    util = [91.2, 90.8, 92.1, 89.9, 90.3, 91.7, 90.0, 92.4, 91.1, 90.6]
    s = Stats.of(util)
    big = Stats.of([123_456_789_012.0 + i * 1_234_567 for i in range(10)])
    gpus = [
        GpuWindow(
            index=i,
            util=s,
            mem_util=s,
            mem_used_mib=Stats.of([73_210.0] * 10),
            power_w=Stats.of([612.3] * 10),
            temp_c=Stats.of([64.2] * 10),
            sm_clock_mhz=Stats.of([1980.0] * 10),
            pcie_tx_bps=big,
            pcie_rx_bps=big,
            nvlink_tx_bps=big,
            nvlink_rx_bps=big,
            util_series=series(util),
            workload="k8s/3f6b2a1c-0d4e-4c55-9a77-1e2f3a4b5c6d",
        )
        for i in range(8)
    ]
    nics = [NicWindow(name=f"ib{i}", rx_bps=big, tx_bps=big, errors=0, drops=0) for i in range(4)]
    disks = [DiskWindow(name=f"nvme{i}n1", read_bps=big, write_bps=big, read_iops=s, write_iops=s) for i in range(2)]
    return Telemetry(
        node="h100-node-0042",
        site="eu-west-1",
        session=12,
        seq=123_456,
        start=1_764_000_000.0,
        end=1_764_000_010.0,
        samples=10,
        gpus=gpus,
        nics=nics,
        disks=disks,
        host=HostWindow(cpu_util=s, mem_used_pct=s),
        workloads=[
            WorkloadRef(
                id="k8s/3f6b2a1c-0d4e-4c55-9a77-1e2f3a4b5c6d",
                kind=WorkloadKind.KUBERNETES_POD,
                name="pod 3f6b2a1c-0d4e-4c55-9a77-1e2f3a4b5c6d",
                gpus=list(range(8)),
                hint="torchrun",
            )
        ],
    )


def test_eight_gpu_window_fits_in_8_kb_and_round_trips() -> None:
    window = _eight_gpu_window()
    payload = encode(window)
    assert len(payload) < 8 * 1024, len(payload)
    assert json.loads(payload)["schema"] == SCHEMA_VERSION == 2
    assert decode(TopicKind.TELEMETRY, payload) == window


def test_birth_state_and_plan_round_trip() -> None:
    birth = Birth(
        node="n1",
        site="s1",
        session=3,
        agent_version="0.1.0",
        hostname="n1.example",
        timestamp=1.0,
        gpus=[GpuInfo(index=0, uuid="GPU-1", model="NVIDIA L4", memory_mib=23034, pcie_gen=4)],
        nics=[NicInfo(name="eth0", kind=NicKind.ETHERNET, role=NicRole.NORTH_SOUTH, speed_mbps=100_000)],
    )
    state = State(node="n1", session=3, status=NodeStatus.OFFLINE, timestamp=2.0)
    plan = Plan(
        site="s1",
        generated_at=3.0,
        solver=SolverReport(status="OPTIMAL", objective=1, best_bound=1, gap=0, solve_seconds=0.1),
    )
    for kind, message in ((TopicKind.BIRTH, birth), (TopicKind.STATE, state), (TopicKind.RECOMMENDATIONS, plan)):
        assert decode(kind, encode(message)) == message


def _integers(schema: object, at: str = "") -> list[tuple[str, object]]:
    """(where, its bound) for every integer in a JSON schema that is not one of a fixed set of values."""
    found: list[tuple[str, object]] = []
    if isinstance(schema, dict):
        if schema.get("type") == "integer" and "enum" not in schema and "const" not in schema:
            found.append((at, schema.get("maximum")))
        for key, value in schema.items():
            found += _integers(value, f"{at}.{key}")
    elif isinstance(schema, list):
        for value in schema:
            found += _integers(value, at)
    return found


def test_every_integer_of_the_wire_protocol_has_an_upper_bound() -> None:
    """Every message's schema, every integer in it (counts, indices, sizes, speeds) with a maximum. Deliberate
    bug caught: a field without ``le=`` (``inbound_connections`` took 10**300, shown in evidence)."""
    models = [Birth, State, Telemetry, Plan]
    integers = [(f"{m.__name__}{at}", bound) for m in models for at, bound in _integers(m.model_json_schema())]
    assert len(integers) > 30
    assert [at for at, bound in integers if bound is None] == []


def _birth_with(path: tuple[str | int, ...], value: object) -> bytes:
    birth = Birth(
        node="n1", site="s1", session=3, agent_version="0.1.0", hostname="n1", timestamp=1.0,
        gpus=[GpuInfo(index=0, uuid="GPU-1", model="NVIDIA H100", memory_mib=81559, nvlink_links=18, pcie_gen=5,
                      pcie_width=16),
              GpuInfo(index=1, uuid="MIG-1", model="NVIDIA H100 MIG 3g.40gb", memory_mib=40192, parent=0)],
        nics=[NicInfo(name="ib0", kind=NicKind.INFINIBAND, role=NicRole.EAST_WEST, speed_mbps=400_000)],
        disks=[DiskInfo(name="nvme0n1", size_bytes=3_840_000_000_000)],
    )  # fmt: skip
    raw = json.loads(encode(birth))
    target = raw
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return json.dumps(raw).encode()


@pytest.mark.parametrize(
    ("path", "bound"),
    [
        (("gpus", 0, "memory_mib"), 2**24),  # 16 TiB
        (("gpus", 0, "nvlink_links"), 64),
        (("gpus", 0, "pcie_gen"), 15),
        (("gpus", 0, "pcie_width"), 63),
        (("nics", 0, "speed_mbps"), 2**32 - 1),
        (("disks", 0, "size_bytes"), 2**60),
        (("gpus", 1, "index"), 63),
        (("gpus", 1, "parent"), 63),  # past 63 no parent can be listed; the bound is the field's own
    ],
)
def test_a_birth_with_an_integer_past_its_bound_is_refused(path: tuple[str | int, ...], bound: int) -> None:
    """At its bound a figure is kept (the parent and index checks across GPUs aside); one past, or 10**300, the
    birth is refused as ``schema``. Deliberate bug caught: the bound moved or left off."""
    if path[-1] not in ("index", "parent"):
        assert isinstance(decode(TopicKind.BIRTH, _birth_with(path, bound)), Birth)
    for value in (bound + 1, 10**300):
        with pytest.raises(ProtocolError) as info:
            decode(TopicKind.BIRTH, _birth_with(path, value))
        assert info.value.reason == "schema" and str(path[-1]) in info.value.detail


def test_a_schema_1_agent_is_still_understood() -> None:
    """Schema 2 only adds optional fields: windows and births of agents not yet upgraded keep validating."""
    window = json.loads(encode(_eight_gpu_window()))
    window["schema"] = 1
    decoded = decode(TopicKind.TELEMETRY, json.dumps(window).encode())
    assert isinstance(decoded, Telemetry) and decoded.schema_ == 1


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"not json", "bad_json"),
        (b"[1, 2]", "schema"),
        (b'{"schema": 3, "node": "n1"}', "unknown_schema"),
        (b'{"node": "n1"}', "unknown_schema"),
        (b'{"schema": true, "node": "n1", "session": 1, "status": "online", "timestamp": 1}', "unknown_schema"),
        (b'{"schema": 1, "node": "n1", "session": 1, "status": "sleeping", "timestamp": 1}', "schema"),
        (b'{"schema": 1, "node": "n1", "session": 1, "status": "online", "timestamp": 1, "x": 1}', "schema"),
        (b'{"schema": 1, "node": "n1", "session": -1, "status": "online", "timestamp": 1}', "schema"),
        (b'{"schema": 1, "node": "n1", "session": 1, "status": "online", "timestamp": NaN}', "schema"),
        (b"\xff\xfe", "bad_json"),
    ],
)
def test_malformed_payloads_are_rejected_with_a_reason(payload: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(TopicKind.STATE, payload)
    assert info.value.reason == reason


def test_oversize_payload_is_rejected_before_parsing() -> None:
    with pytest.raises(ProtocolError) as info:
        decode(TopicKind.TELEMETRY, b" " * (512 * 1024))
    assert info.value.reason == "oversize"


def test_window_must_not_end_before_it_starts() -> None:
    raw = json.loads(encode(_eight_gpu_window()))
    raw["end"] = raw["start"] - 1
    with pytest.raises(ProtocolError):
        decode(TopicKind.TELEMETRY, json.dumps(raw).encode())


def _close(value: float, expected: float) -> bool:
    """Equal but for the wire's rounding to 4 significant digits (at most half a unit in the 4th digit)."""
    return math.isclose(value, expected, rel_tol=5e-4, abs_tol=1e-300)


@settings(deadline=None)  # a loaded machine's pause is no failure of the property
@given(st.lists(st.floats(min_value=0, max_value=1e12, allow_nan=False), min_size=1, max_size=120))
def test_stats_summarise_like_the_definitions_and_survive_the_wire(values: list[float]) -> None:
    s = Stats.of(values)
    n = len(values)
    # the exact mean, in rationals: no float sum to share an error with
    exact_mean = sum(map(Fraction, values)) / n
    assert _close(s.mean, float(exact_mean))
    # nearest rank: the smallest value that at least 95 % of the values do not exceed (integers: no 0.95 * n)
    p95 = min(v for v in values if 20 * sum(u <= v for u in values) >= 19 * n)
    assert _close(s.p95, p95)
    assert _close(s.max, max(values))
    spread = float(sum((Fraction(v) - exact_mean) ** 2 for v in values) / n) ** 0.5
    assert math.isclose(s.std, spread, rel_tol=1e-3, abs_tol=1e-9 * max(values))
    assert min(values) * (1 - 5e-4) <= s.mean <= s.max * (1 + 1e-12)
    assert s.p95 <= s.max
    assert TypeAdapter(Stats).validate_json(json.dumps(s)) == s


def _with(change: dict[str, object], where: str = "gpu") -> bytes:
    raw = json.loads(encode(_eight_gpu_window()))
    (raw["gpus"][3] if where == "gpu" else raw["host"] if where == "host" else raw).update(change)
    return json.dumps(raw).encode()


PERCENTAGES = [("gpu", f) for f in ("util", "mem_util", "sm_active", "tensor_active", "dram_active")] + [
    ("host", f) for f in ("cpu_util", "mem_used_pct")
]


@pytest.mark.parametrize(("where", "field"), PERCENTAGES)
@pytest.mark.parametrize(
    "summary",
    [[50, 60, 100.5, 1], [101, 101, 101, 0], [80, 60, 70, 1], [50, 95, 90, 1], [-1, 0, 0, 0], [1, 2, 3, -1]],
)
def test_every_percentage_summary_is_bounded_and_ordered(where: str, field: str, summary: list[float]) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(TopicKind.TELEMETRY, _with({field: summary}, where))
    assert info.value.reason == "schema"
    fine = decode(TopicKind.TELEMETRY, _with({field: [50, 95, 100, 20]}, where))
    assert isinstance(fine, Telemetry)


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"util_series": [50.0] * 11}, "gpu"),  # the window has 10 samples
        ({"util_series": [50.0, 100.1]}, "gpu"),
        ({"power_w": [1, 2, 3.5e38, 0]}, "gpu"),
        ({"power_w": {"mean": 1, "p95": 2, "max": 3, "std": 0}}, "gpu"),  # a stats array is an array
        ({"power_w": [1, 2, 3]}, "gpu"),
        ({"index": 5}, "gpu"),  # GPU 5 listed twice
        ({"start": -1.0}, "window"),
        ({"end": 9.1e9}, "window"),
    ],
)
def test_window_bounds_are_rejected(change: dict[str, object], where: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(TopicKind.TELEMETRY, _with(change, where))
    assert info.value.reason == "schema"


def test_decoded_summaries_are_stats() -> None:
    window = decode(TopicKind.TELEMETRY, encode(_eight_gpu_window()))
    assert isinstance(window, Telemetry)
    gpu = window.gpus[0]
    assert type(gpu.util) is Stats and type(gpu.power_w) is Stats and type(window.host.cpu_util) is Stats
    assert gpu.util.max == 92.4 and gpu.power_w._asdict()["mean"] == 612.3
    assert GpuWindow(index=0, util=[1, 2, 3, 0]).util == Stats(1.0, 2.0, 3.0, 0.0)  # type: ignore[arg-type]
