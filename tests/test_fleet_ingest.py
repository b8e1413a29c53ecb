"""Ingest: bad messages are rejected, counted by reason, and never disturb good data."""

from __future__ import annotations

import json

from agent.protocol import NodeStatus, State, TopicKind, encode, node_topic
from agent.simulate import offline_windows
from collectors.sim.scenarios import build_scenario
from optimizer.ingest.fleet import Fleet

P = "fleetfit/v1"


def _node() -> tuple[str, bytes, list[bytes]]:
    node = build_scenario("demo", 8)[0]
    birth, windows = offline_windows(node, 4, site="s1")
    return node.name, encode(birth), [encode(w) for w in windows]


def test_good_and_bad_messages_interleaved() -> None:
    fleet = Fleet(P)
    name, birth, windows = _node()
    tele = node_topic(P, "s1", name, TopicKind.TELEMETRY)
    assert fleet.ingest(node_topic(P, "s1", name, TopicKind.BIRTH), birth)
    assert fleet.ingest(tele, windows[0])
    bad = [
        (tele, b"{"),  # bad json
        (tele, json.dumps({**json.loads(windows[1]), "schema": 9}).encode()),  # unknown schema
        (node_topic(P, "s1", "other-node", TopicKind.TELEMETRY), windows[1]),  # node mismatch
        (node_topic(P, "s2", name, TopicKind.TELEMETRY), windows[1]),  # site mismatch
        (tele, windows[0]),  # duplicate
        (f"{P}/s1/{name}/telemetry/x", windows[1]),  # bad topic
        (tele, b"x" * 300_000),  # oversize
    ]
    for topic, payload in bad:
        assert not fleet.ingest(topic, payload)
    assert fleet.ingest(tele, windows[1])
    assert fleet.ingest(tele, windows[3])  # a gap: window 2 was lost upstream, and is awaited
    record = fleet.nodes[("s1", name)]
    assert {s: sorted(m) for s, m in record.missing.items()} == {1: [2]}
    assert fleet.ingest(tele, windows[2])  # sent again, it fills the gap
    assert not fleet.ingest(tele, windows[2])  # and only once
    assert [w.seq for w in record.windows] == [0, 1, 3, 2] and record.refilled == 1 and not record.missing[1]
    assert dict(fleet.rejected) == {
        "bad_json": 1,
        "unknown_schema": 1,
        "node_mismatch": 1,
        "site_mismatch": 1,
        "duplicate": 2,
        "bad_topic": 1,
        "oversize": 1,
    }
    assert fleet.accepted == {"birth": 1, "telemetry": 4}


def test_windows_spooled_before_a_restart_are_accepted_once() -> None:
    fleet = Fleet(P)
    name, birth, windows = _node()  # session 1
    tele = node_topic(P, "s1", name, TopicKind.TELEMETRY)
    state_topic = node_topic(P, "s1", name, TopicKind.STATE)
    fleet.ingest(node_topic(P, "s1", name, TopicKind.BIRTH), birth)
    assert fleet.ingest(tele, windows[0])
    # the agent restarts (session 2) and replays windows 1..3 of session 1 from its spool
    assert fleet.ingest(state_topic, encode(State(node=name, session=2, status=NodeStatus.ONLINE, timestamp=1)))
    assert fleet.ingest(tele, windows[1])
    assert not fleet.ingest(tele, windows[1])
    assert fleet.ingest(tele, windows[3])
    assert fleet.ingest(tele, windows[2])  # late, it fills the gap before window 3
    assert not fleet.ingest(tele, windows[2])
    assert fleet.rejected == {"duplicate": 2}
    record = fleet.nodes[("s1", name)]
    assert record.session == 2
    # a retained state of an older session arriving late does not overwrite the newer one
    assert not fleet.ingest(state_topic, encode(State(node=name, session=1, status=NodeStatus.OFFLINE, timestamp=0)))
    assert record.status is NodeStatus.ONLINE
    assert fleet.rejected["stale_session"] == 1


def test_long_superseded_sessions_are_refused() -> None:
    fleet = Fleet(P)
    name, _, windows = _node()
    tele = node_topic(P, "s1", name, TopicKind.TELEMETRY)
    for session in range(10, 30):
        raw = json.loads(windows[0])
        raw["session"] = session
        assert fleet.ingest(tele, json.dumps(raw).encode())
    raw = json.loads(windows[0])
    raw["session"] = 3
    assert not fleet.ingest(tele, json.dumps(raw).encode())
    assert fleet.rejected == {"stale_session": 1}
    assert len(fleet.nodes[("s1", name)].last_seq) == 8


def test_history_is_bounded() -> None:
    fleet = Fleet(P, horizon_windows=3)
    node = build_scenario("demo", 8)[0]
    birth, windows = offline_windows(node, 6, site="s1")
    fleet.ingest(node_topic(P, "s1", node.name, TopicKind.BIRTH), encode(birth))
    for w in windows:
        fleet.ingest(node_topic(P, "s1", node.name, TopicKind.TELEMETRY), encode(w))
    assert [w.seq for w in fleet.nodes[("s1", node.name)].windows] == [3, 4, 5]
