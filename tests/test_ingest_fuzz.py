"""Whatever arrives on the wire, ingest never raises: each bad message is rejected for the reason the protocol
gives it, and counted, and good messages around it are still applied."""

from __future__ import annotations

import json
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.protocol import MAX_PAYLOAD_BYTES, TopicKind, encode, node_topic
from agent.simulate import offline_windows
from collectors.sim.scenarios import build_scenario
from optimizer.ingest.fleet import Fleet

P = "fleetfit/v1"
NODE = build_scenario("demo", 8)[0]
BIRTH, WINDOWS = offline_windows(NODE, 2, site="s")
GOOD = json.loads(encode(WINDOWS[1]))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


def _mutated(draw: st.DrawFn) -> bytes:
    raw = json.loads(json.dumps(GOOD))
    for _ in range(draw(st.integers(1, 3))):
        # seq and session left alone: an accepted window numbered past the late one below would rightly make it
        # a duplicate (tests/test_faults.py storms those two)
        key = draw(st.sampled_from(sorted(set(raw) - {"seq", "session"})))
        raw[key] = draw(json_values)
    return json.dumps(raw).encode()


payloads = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.composite(_mutated)(),
    # a good window under a schema version this build does not speak: refused as such, never taken
    (st.integers() | st.text(max_size=3)).map(lambda v: json.dumps({**GOOD, "schema": v}).encode()),
)
topics = st.one_of(
    st.just(node_topic(P, "s", NODE.name, TopicKind.TELEMETRY)),
    st.just(node_topic(P, "s", NODE.name, TopicKind.STATE)),
    st.text(max_size=60),
    st.lists(st.sampled_from(["fleetfit", "v1", "s", NODE.name, "telemetry", "+", "#", "", "x/y"]), max_size=6).map(
        "/".join
    ),
)


# The protocol's rules, written out here rather than taken from the code that applies them (docs/protocol.md)
_TOPIC = re.compile(
    r"^fleetfit/v1/([A-Za-z0-9][A-Za-z0-9._-]{0,127})/([A-Za-z0-9][A-Za-z0-9._-]{0,127})/(birth|state|telemetry)$"
)
READ_AND_REFUSED = {"schema", "node_mismatch", "site_mismatch", "duplicate", "gpu_index", "stale_session", "timestamp"}


def expected(topic: str, payload: bytes) -> set[str]:
    """What ingest may make of a message: "accepted", "cleared_retained", or the rejection reasons allowed."""
    m = _TOPIC.match(topic)
    if m is None or m.group(2) == "recommendations":
        return {"bad_topic", "reserved_name"}
    if not payload and m.group(3) != "telemetry":
        return {"cleared_retained"}
    if len(payload) > MAX_PAYLOAD_BYTES:
        return {"oversize"}
    try:
        raw = json.loads(payload)
    except ValueError:
        return {"bad_json"}
    if not isinstance(raw, dict):
        return {"schema"}
    if raw.get("schema") not in (1, 2) or isinstance(raw.get("schema"), bool):
        return {"unknown_schema"}
    return {"accepted", *READ_AND_REFUSED}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(topics, payloads), min_size=1, max_size=10))
def test_garbage_is_counted_and_good_data_survives(messages: list[tuple[str, bytes]]) -> None:
    fleet = Fleet(P)
    tele = node_topic(P, "s", NODE.name, TopicKind.TELEMETRY)
    assert fleet.ingest(node_topic(P, "s", NODE.name, TopicKind.BIRTH), encode(BIRTH))
    assert fleet.ingest(tele, encode(WINDOWS[0]))
    applied = 0
    for topic, payload in messages:
        before = sum(fleet.rejected.values()), dict(fleet.rejected), dict(fleet.ignored)
        accepted = fleet.ingest(topic, payload) is not None
        applied += accepted
        counted = {k for k, v in fleet.rejected.items() if v > before[1].get(k, 0)}
        counted |= {k for k, v in fleet.ignored.items() if v > before[2].get(k, 0)}
        outcome = {"accepted"} if accepted else counted
        assert len(outcome) == 1 and outcome <= expected(topic, payload), (topic, payload[:60], outcome)
    assert applied + sum(fleet.rejected.values()) + sum(fleet.ignored.values()) == len(messages)
    record = fleet.nodes[("s", NODE.name)]
    assert (record.windows[0].session, record.windows[0].seq) == (WINDOWS[0].session, WINDOWS[0].seq)
    # a good window after the storm is still accepted
    late = WINDOWS[1].model_copy(update={"seq": 10**9})
    assert fleet.ingest(tele, encode(late)) is not None
