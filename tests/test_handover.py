"""The handover record between optimizers: its bounds, what a receiver refuses, and which side wins a merge."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from conftest import three_actions

from agent.protocol import (
    MAX_HANDOVER_BYTES,
    MAX_HANDOVER_ENTRIES,
    HandedPost,
    HandedSettling,
    HandedState,
    Handover,
    NodeStatus,
    Plan,
    Presence,
    ProtocolError,
    encode,
    handover_topic,
    move_fingerprint,
    parse_handover,
)
from optimizer.decide.catalog import load_catalog
from optimizer.plan.recommend import PlanSettings, plan_snapshot
from optimizer.serve.alerts.journal import Journal, Sent
from optimizer.serve.handover import MAX_SKEW, Handovers
from optimizer.serve.lifecycle import DB_NAME, Lifecycle, RecState
from optimizer.serve.ownership import Ownership

PREFIX = "fleetfit/v1"
NOW = 1_800_000_000.0


@pytest.fixture(scope="module")
def plan() -> Plan:
    """A move of a service, a move of a training job and a reclaim (conftest.three_actions)."""
    return plan_snapshot(three_actions("s"), load_catalog(), PlanSettings())


def record(**fields: object) -> Handover:
    return Handover.model_validate({"site": "s", "optimizer": "opt-a", "written_at": NOW} | fields)


# ------------------------------------------------------------------------------------------ the wire


def test_the_largest_record_fits_a_message_the_optimizer_takes_in() -> None:
    """Every list full, every name and time at its longest: the optimizer's client refuses packets over
    MAX_PAYLOAD_BYTES (plus headers), so a record the owner may publish must stay under that, or none arrives."""
    name, t = "o" * 128, 1_799_999_999.123456789
    full = Handover(
        site="s" * 128,
        optimizer=name,
        written_at=NOW,
        states=[
            HandedState(id=f"{i:064d}", state="acknowledged", changed=t, by=name) for i in range(MAX_HANDOVER_ENTRIES)
        ],
        posted=[
            HandedPost(
                id=f"{i:064d}", receiver="c" * 64, fingerprint="f" * 16, first_sent=t, last_sent=t, resolved_sent=t
            )
            for i in range(MAX_HANDOVER_ENTRIES)
        ],
        settling=[
            HandedSettling(id=f"{i:064d}", first_proposed=t, last_plan=t, plans=2**53)
            for i in range(MAX_HANDOVER_ENTRIES)
        ],
    )
    body = encode(full)
    assert len(body) <= MAX_HANDOVER_BYTES
    assert parse_handover(PREFIX, handover_topic(PREFIX, "s" * 128), body) == full


@pytest.mark.parametrize(
    ("topic", "payload", "reason"),
    [
        ("fleetfit/v1/s/handover", b"not json", "schema"),
        ("fleetfit/v1/s/handover", b"[]", "schema"),
        ("fleetfit/v1/s/handover", b"x" * (MAX_HANDOVER_BYTES + 1), "oversize"),
        ("fleetfit/v1/other/handover", encode(record()), "site_mismatch"),
        ("fleetfit/v1/-bad/handover", encode(record()), "bad_topic"),
        ("fleetfit/v1/s/recommendations", encode(record()), "bad_topic"),
        # a number as a string, an unknown state, an unknown field, a time after the record's, an entry twice
        ("fleetfit/v1/s/handover", encode(record()).replace(f"{NOW}".encode(), f'"{NOW}"'.encode()), "schema"),
        ("fleetfit/v1/s/handover", json.dumps({"schema": 1, "site": "s", "optimizer": "o", "written_at": 1,
                                                "states": [{"id": "a", "state": "applied", "changed": 1}]}).encode(),
         "schema"),
        ("fleetfit/v1/s/handover", json.dumps({"schema": 1, "site": "s", "optimizer": "o", "written_at": 1,
                                                "trusted": True}).encode(), "schema"),
        ("fleetfit/v1/s/handover", json.dumps({"schema": 1, "site": "s", "optimizer": "o", "written_at": 1,
                                                "states": [{"id": "a", "state": "new", "changed": 2}]}).encode(),
         "schema"),
        ("fleetfit/v1/s/handover", json.dumps({"schema": 1, "site": "s", "optimizer": "o", "written_at": 9,
                                                "settling": [{"id": "a", "first_proposed": 1, "last_plan": 1,
                                                              "plans": 1}] * 2}).encode(), "schema"),
        ("fleetfit/v1/s/handover", json.dumps({"schema": 1, "site": "s", "optimizer": "o", "written_at": 9,
                                                "posted": [{"id": "a", "receiver": "c", "fingerprint": "0" * 16,
                                                            "first_sent": 5, "last_sent": 4}]}).encode(), "schema"),
        ("fleetfit/v1/s/handover", json.dumps({"schema": 1, "site": "s", "optimizer": "o", "written_at": 9,
                                                "posted": [{"id": "a", "receiver": "c\n", "fingerprint": "0" * 16,
                                                            "first_sent": 4, "last_sent": 4}]}).encode(), "schema"),
    ],
)  # fmt: skip
def test_a_malformed_record_is_refused_with_its_reason(topic: str, payload: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_handover(PREFIX, topic, payload)
    assert caught.value.reason == reason


def test_too_many_entries_are_refused() -> None:
    states = [{"id": f"m{i}", "state": "new", "changed": 1.0} for i in range(MAX_HANDOVER_ENTRIES + 1)]
    body = json.dumps({"schema": 1, "site": "s", "optimizer": "o", "written_at": 2.0, "states": states}).encode()
    with pytest.raises(ProtocolError, match="schema"):
        parse_handover(PREFIX, "fleetfit/v1/s/handover", body)


# ------------------------------------------------------------------------------------------ trust


def handovers(clock: float = NOW) -> Handovers:
    """Optimizer opt-b standing by for s; opt-a lists s (offline now), opt-c lists another site only."""
    ownership = Ownership(PREFIX, "opt-b", standby=["s"])
    for name, sites, status in (("opt-a", ["s"], NodeStatus.OFFLINE), ("opt-c", ["t"], NodeStatus.ONLINE)):
        ownership.presences[name] = Presence(optimizer=name, status=status, started=1.0, sites=sites)
    return Handovers(PREFIX, ownership, clock=lambda: clock)


def test_only_an_optimizer_of_the_site_is_trusted_and_never_from_the_future() -> None:
    held = handovers()
    topic = handover_topic(PREFIX, "s")
    held.observe(topic, encode(record(optimizer="n1")))  # a node's name: no presence at all
    held.observe(topic, encode(record(optimizer="opt-c")))  # an optimizer, of another site
    held.observe(topic, encode(record(written_at=NOW + MAX_SKEW + 1)))
    held.observe(topic, b"{")
    assert held.held == {}
    assert held.rejected == {"not_site_optimizer": 2, "future": 1, "schema": 1}
    held.observe(topic, encode(record(written_at=NOW + MAX_SKEW - 1)))  # within the clocks' skew
    held.observe(topic, encode(record(optimizer="opt-b")))  # its own, from before a restart
    assert sorted(held.held["s"]) == ["opt-a", "opt-b"] and held.accepted == 2
    held.observe(topic, encode(record(written_at=NOW - 10, states=[{"id": "m", "state": "new", "changed": 1.0}])))
    assert held.held["s"]["opt-a"].written_at == NOW + MAX_SKEW - 1  # a late, older record changes nothing
    held.observe(topic, b"")  # an operator cleared it
    assert "s" not in held.held


def test_a_post_is_taken_in_only_for_a_move_named_alike(plan: Plan) -> None:
    held = handovers()
    first, second = plan.recommendations[:2]
    posted = [
        {"id": first.id, "receiver": "chat", "fingerprint": move_fingerprint(first), "first_sent": 1, "last_sent": 2},
        {"id": second.id, "receiver": "chat", "fingerprint": move_fingerprint(first), "first_sent": 1, "last_sent": 2},
        {"id": "gone", "receiver": "chat", "fingerprint": "0" * 16, "first_sent": 1, "last_sent": 2},
    ]
    held.observe(handover_topic(PREFIX, "s"), encode(record(posted=posted)))
    assert held.posts(plan) == [("chat", first.id, Sent(1.0, 2.0, None))]
    assert held.mismatched == 1  # the second names another move; "gone" waits for a plan that proposes it


# ------------------------------------------------------------------------------------------ merging


def test_the_later_decision_wins_on_either_side(tmp_path: Path, plan: Plan) -> None:
    life = Lifecycle.in_state_dir(tmp_path)
    life.record(plan, {w.id: w.hardware for w in plan.workloads}, now=100.0)
    a, b, c = (r.id for r in plan.recommendations)
    life.set_state(a, RecState.ACKNOWLEDGED, now=200.0)
    theirs = [
        (a, RecState.DISMISSED, 150.0, "opt-a"),  # earlier than the acknowledgement here: ignored
        (b, RecState.DISMISSED, 150.0, "opt-a"),  # here only proposed, never decided: theirs holds
        (c, RecState.ACKNOWLEDGED, 50.0, "opt-a"),  # older than its proposal here, still a decision
        ("unknown", RecState.ACKNOWLEDGED, 150.0, "opt-a"),
    ]
    assert sorted(life.adopt("s", theirs)) == sorted([b, c])
    assert {i: life.get(i).state for i in (a, b, c)} == {  # type: ignore[union-attr]
        a: RecState.ACKNOWLEDGED,
        b: RecState.DISMISSED,
        c: RecState.ACKNOWLEDGED,
    }
    assert life.adopt("s", theirs) == []  # offered again with the next plan: nothing changes
    assert life.adopt("s", [(a, RecState.NEW, 250.0, "opt-a")]) == [a]  # reopened there, later
    assert life.get(a).state is RecState.NEW  # type: ignore[union-attr]
    assert (a, RecState.NEW, 250.0, "opt-a") in life.decisions("s", 10)  # and handed on as theirs
    # a move the plans have since withdrawn (expired) is not reopened by a decision made on it before
    life.record(plan.model_copy(update={"recommendations": []}), {w.id: w.hardware for w in plan.workloads}, 5000.0)
    assert life.get(a).state is RecState.EXPIRED  # type: ignore[union-attr]
    assert life.adopt("s", [(a, RecState.ACKNOWLEDGED, 9000.0, "opt-a")]) == []


def test_decisions_from_before_they_were_dated_count_from_their_last_change(tmp_path: Path, plan: Plan) -> None:
    """A state file of an earlier version has no decision columns: they are added, and its acknowledged moves count
    as decided when they last changed."""
    life = Lifecycle.in_state_dir(tmp_path)
    life.record(plan, {w.id: w.hardware for w in plan.workloads}, now=100.0)
    a = plan.recommendations[0].id
    life.set_state(a, RecState.ACKNOWLEDGED, now=300.0)
    life.close()
    db = sqlite3.connect(tmp_path / DB_NAME)
    with db:
        db.execute("ALTER TABLE recommendations DROP COLUMN decided")
        db.execute("ALTER TABLE recommendations DROP COLUMN decided_by")
    db.close()
    life = Lifecycle.in_state_dir(tmp_path)
    assert life.decisions("s", 10) == [(a, RecState.ACKNOWLEDGED, 300.0, None)]
    assert life.adopt("s", [(a, RecState.DISMISSED, 299.0, "opt-a")]) == []
    assert life.adopt("s", [(a, RecState.DISMISSED, 301.0, "opt-a")]) == [a]


def test_the_later_post_wins(tmp_path: Path) -> None:
    journal = Journal(tmp_path / DB_NAME)
    journal.mark_firing("chat", "s", ["m1", "m2"], 100.0)
    journal.mark_resolved("chat", ["m2"], 300.0)
    changed = journal.adopt_posts(
        "s",
        [
            ("chat", "m1", Sent(50.0, 90.0, None)),  # older than the post here
            ("chat", "m2", Sent(100.0, 400.0, None)),  # posted again there after the resolution here
            ("ops", "m1", Sent(60.0, 60.0, None)),  # a receiver this side never posted to
        ],
    )
    assert changed == 2
    assert journal.sent("chat", "m1") == Sent(100.0, 100.0, None)
    assert journal.sent("chat", "m2") == Sent(100.0, 400.0, None)
    assert journal.sent("ops", "m1") == Sent(60.0, 60.0, None)
    assert [p[:2] for p in journal.posts("s", 2)] == [("chat", "m2"), ("chat", "m1")]  # the latest first, bounded
