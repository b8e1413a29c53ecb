"""Fault injection: a broker outage under 50 sampling nodes, an optimizer restart with alerts switched on, and a
storm of malformed telemetry. Short in the everyday suite; ``pytest -m fault --full-faults`` runs the full
lengths (120 s outage, 10,000 messages). Each test prints what it measured.

The other faults live beside the code they exercise and carry the same mark: SIGKILL during an outage
(test_agent_durability.py) and a time-series server outage (test_store.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from conftest import FLEETFIT, durable_subscriber, fault_size, free_port, private_broker, wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from webhook_server import webhook_server

from agent.clock import Clock
from agent.protocol import MAX_PAYLOAD_BYTES, TopicKind, encode, node_topic
from agent.simulate import SimulatedFleet, offline_windows
from collectors.scenarios import build_scenario
from optimizer.fleet import Fleet

pytestmark = pytest.mark.fault


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@pytest.mark.slow
async def test_broker_outage_under_50_sampling_nodes_loses_no_window(tmp_path: Path, prefix: str) -> None:
    outage = fault_size(15, 120)  # seconds of real time without a broker
    broker = private_broker(tmp_path, persistent=True)
    broker.start()
    received: list[bytes] = []
    collector = asyncio.create_task(durable_subscriber(broker.port, f"{prefix}/+/+/telemetry", received))
    await asyncio.sleep(0.5)
    # 10 s windows at 10x: every node closes a window each real second, outage or not
    fleet = SimulatedFleet(
        build_scenario("mixed", 50, seed=7), broker.settings(prefix), site="faults", clock=Clock(10.0), seed=7
    )
    stop = asyncio.Event()
    running = asyncio.create_task(fleet.run(stop))
    try:
        await wait_until(lambda: len(received) >= 100, 60, "windows before the outage")
        rss_before = _rss_mib()
        broker.stop()
        await asyncio.sleep(outage)
        queued = sum(len(a.queue) for a in fleet.agents)
        rss_during = _rss_mib()
        broker.start()
        await wait_until(lambda: all(len(a.queue) == 0 for a in fleet.agents), 120, "the queues to drain")
        stop.set()
        await running
        closed = sum(a.windows_closed for a in fleet.agents)
        await wait_until(lambda: len({_key(p) for p in received}) >= closed, 60, "every window")
    finally:
        stop.set()
        collector.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await collector
        broker.stop()
    windows = [json.loads(p) for p in received]
    unique = {(w["node"], w["session"], w["seq"]) for w in windows}
    print(
        f"{outage} s outage, 50 nodes: {queued} windows queued during it (RSS {rss_before:.0f} -> "
        f"{rss_during:.0f} MiB); windows closed {closed}, received {len(unique)} ({len(windows) - len(unique)} "
        f"duplicate deliveries)"
    )
    assert len(unique) == closed and queued >= 50 * (outage - 2)
    for node in {w["node"] for w in windows}:
        first_seen: list[int] = []
        for w in windows:
            if w["node"] == node and w["seq"] not in first_seen:
                first_seen.append(w["seq"])
        assert first_seen == list(range(first_seen[0], first_seen[0] + len(first_seen))), node  # in order
    assert all(len(a.queue) <= a.settings.spool_max_windows for a in fleet.agents)
    # the queued windows are the only growth: about 6 KB each, far from unbounded
    assert rss_during - rss_before < 32 + queued * 24 / 1024


def _key(payload: bytes) -> tuple[str, int, int]:
    w = json.loads(payload)
    return w["node"], w["session"], w["seq"]


# ------------------------------------------------------------------------------------------ optimizer restart


def _optimizer_config(tmp_path: Path, port: int, api_port: int) -> Path:
    config = tmp_path / "optimizer.toml"
    config.write_text(
        f"""
[optimizer]
state_dir = "{tmp_path / "state"}"
solve_interval = 2.0
[mqtt]
host = "127.0.0.1"
port = {port}
session_expiry = 600
[api]
port = {api_port}
[alerts]
group_wait = 0.0
[[alerts.receivers]]
name = "ops"
kind = "generic"
url_env = "OPS_WEBHOOK"
"""
    )
    (tmp_path / "state").mkdir()
    return config


async def _plans_made(api_port: int) -> float:
    import aiohttp

    try:
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{api_port}/metrics") as r:
            text = await r.text()
    except aiohttp.ClientError:
        return 0
    return next((float(line.split()[1]) for line in text.splitlines() if line.startswith("fleetfit_plans_total")), 0)


async def _recommendations(state: Path) -> dict[str, str]:
    proc = await asyncio.create_subprocess_exec(
        FLEETFIT, "recommendations", "--all", "--format", "json", "--state-dir", str(state),
        stdout=subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    return {r["id"]: r["state"] for r in json.loads(out)}


@pytest.mark.slow
async def test_optimizer_restart_keeps_states_and_posts_nothing_twice(tmp_path: Path) -> None:
    broker = private_broker(tmp_path, persistent=True)
    broker.start()
    api_port = free_port()
    config = _optimizer_config(tmp_path, broker.port, api_port)
    with webhook_server() as hooks:
        env = {"OPS_WEBHOOK": hooks.url("/ops"), "PATH": "/usr/bin:/bin"}
        optimizer = await asyncio.create_subprocess_exec(
            FLEETFIT, "optimizer", "--config", str(config), env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        simulator = await asyncio.create_subprocess_exec(
            FLEETFIT, "simulate", "--broker", f"mqtt://127.0.0.1:{broker.port}", "--nodes", "8", "--scenario",
            "demo", "--site", "lab", "--time-scale", "10", "--seed", "1", stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            await wait_until(lambda: len(hooks.delivered) >= 1, 60, "the first alert")
            await asyncio.sleep(3)  # a plan or two more: nothing new to post
            posted = [m["id"] for d in hooks.delivered for m in d.json()["firing"]]
            states = await _recommendations(tmp_path / "state")
            acked = posted[0]
            ack = await asyncio.create_subprocess_exec(
                FLEETFIT, "recommendations", "ack", acked, "--state-dir", str(tmp_path / "state"),
                stdout=subprocess.DEVNULL,
            )  # fmt: skip
            assert await ack.wait() == 0
            optimizer.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(optimizer.wait(), 60) == 0
            deliveries = len(hooks.delivered)
            optimizer = await asyncio.create_subprocess_exec(
                FLEETFIT, "optimizer", "--config", str(config), env=env, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            for _ in range(300):
                if await _plans_made(api_port) >= 3:
                    break
                await asyncio.sleep(0.2)
            assert await _plans_made(api_port) >= 3, "the restarted optimizer did not plan"
            after = await _recommendations(tmp_path / "state")
        finally:
            for proc in (simulator, optimizer):
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
                    await asyncio.wait_for(proc.wait(), 60)
            broker.stop()
        print(
            f"before restart: {len(posted)} move(s) posted in {deliveries} message(s), states {Counter(states.values())}; "
            f"after restart and 3 plans: {len(hooks.delivered)} message(s), states {Counter(after.values())}"
        )
    assert len(posted) == len(set(posted)) >= 3
    assert len(hooks.delivered) == deliveries  # the restart posted nothing again
    assert after[acked] == "acknowledged"
    assert {k: v for k, v in after.items() if k != acked and k in states} == {
        k: v for k, v in states.items() if k != acked
    }


# ------------------------------------------------------------------------------------------ malformed storm

P = "fleetfit/v1"
NODE = build_scenario("demo", 8)[0]
BIRTH, WINDOWS = offline_windows(NODE, 2, site="s")
TELEMETRY_TOPIC = node_topic(P, "s", NODE.name, TopicKind.TELEMETRY)
GOOD = json.loads(encode(WINDOWS[1]))
MESSAGES_PER_EXAMPLE = 10
KINDS = ("mutated", "schema", "oversize", "topic", "bytes", "truncated")
# A node topic as the protocol defines it (docs/protocol.md), written out here rather than taken from the code
_NODE_TOPIC = re.compile(
    r"^fleetfit/v1/[A-Za-z0-9][A-Za-z0-9._-]{0,127}/[A-Za-z0-9][A-Za-z0-9._-]{0,127}/(birth|state|telemetry)$"
)
_IDENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
ACCEPTED = "accepted"


def _random_value(rng: random.Random) -> object:
    pick = rng.randrange(4)
    if pick == 0:
        return None
    if pick == 1:
        return rng.choice([0, 1, 2, 3, -1, 7, 10**6, -(10**12), 2**70])
    if pick == 2:
        return "".join(rng.choice("ab.-_9é\u202e\x1b") for _ in range(rng.randrange(9)))
    return [rng.randrange(-5, 100) for _ in range(rng.randrange(4))]


def malformed(rng: random.Random) -> tuple[str, str, bytes, frozenset[str]]:
    """(kind, topic, payload, what ingest may make of it), the expectation worked out from the protocol's
    rules, not from the code that applies them."""
    kind = rng.choice(KINDS)
    raw = json.loads(json.dumps(GOOD))
    if kind == "mutated":
        key = rng.choice(sorted(set(raw) - {"seq", "session"}))  # (those make a later window stale)
        value = _random_value(rng)
        raw[key] = value
        expect = {"schema"}
        if key == "schema" and value not in (1, 2):
            expect = {"unknown_schema"}
        elif key == "schema" or (key in ("start", "end", "samples") and isinstance(value, int)):
            expect = {ACCEPTED, "schema"}  # a number that may still make a window
        elif key in ("node", "site") and isinstance(value, str) and _IDENT.match(value):
            expect = {ACCEPTED} if value == GOOD[key] else {f"{key}_mismatch"}
        elif key == "gpu_unavailable" and (value is None or isinstance(value, str)):
            expect = {ACCEPTED}  # optional text: a control character in it is left out, not the window
        elif key in ("gpus", "nics", "disks", "mounts", "workloads") and value == []:
            expect = {ACCEPTED}
        if ACCEPTED in expect:
            expect.add("duplicate")  # a valid window keeps seq 1: taken once, then a duplicate
        return kind, TELEMETRY_TOPIC, json.dumps(raw).encode(), frozenset(expect)
    if kind == "schema":
        raw["schema"] = rng.choice([0, 3, 9, -1, 2**40, "2", "v2", ""])
        return kind, TELEMETRY_TOPIC, json.dumps(raw).encode(), frozenset({"unknown_schema"})
    if kind == "oversize":
        return (
            kind,
            TELEMETRY_TOPIC,
            b'{"pad":"' + b"x" * (MAX_PAYLOAD_BYTES + rng.randint(1, 1000)) + b'"}',
            frozenset({"oversize"}),
        )
    if kind == "topic":
        while True:
            parts = [rng.choice(["fleetfit", "v1", "s", NODE.name, "telemetry", "+", "#", "", "..", "é"])
                     for _ in range(rng.randrange(8))]  # fmt: skip
            topic = "/".join(parts)
            if not _NODE_TOPIC.match(topic):
                return kind, topic, encode(WINDOWS[1]), frozenset({"bad_topic"})
    if kind == "truncated":
        body = encode(WINDOWS[1])
        return kind, TELEMETRY_TOPIC, body[: rng.randrange(len(body))], frozenset({"bad_json"})
    payload = rng.randbytes(rng.randrange(200))
    try:
        value = json.loads(payload)
    except ValueError:
        return kind, TELEMETRY_TOPIC, payload, frozenset({"bad_json"})
    if not isinstance(value, dict):
        return kind, TELEMETRY_TOPIC, payload, frozenset({"schema"})
    return (
        kind,
        TELEMETRY_TOPIC,
        payload,
        frozenset({"unknown_schema"} if value.get("schema") not in (1, 2) else {"schema"}),
    )


def storm(messages: list[tuple[str, str, bytes, frozenset[str]]]) -> Counter[tuple[str, str]]:
    """Ingest ``messages`` with a good window after each; every good one is applied, and each bad one is
    refused for a reason its kind allows. Counts (kind, outcome)."""
    fleet = Fleet(P)
    assert fleet.ingest(node_topic(P, "s", NODE.name, TopicKind.BIRTH), encode(BIRTH))
    outcomes: Counter[tuple[str, str]] = Counter()
    for i, (kind, topic, payload, expect) in enumerate(messages):
        before = Counter(fleet.rejected) + Counter(fleet.ignored)
        accepted = fleet.ingest(topic, payload) is not None
        new = (Counter(fleet.rejected) + Counter(fleet.ignored)) - before
        outcome = ACCEPTED if accepted else next(iter(new), "none")
        assert outcome in expect and sum(new.values()) == (0 if accepted else 1), (kind, outcome, expect, payload[:80])
        outcomes[(kind, outcome)] += 1
        window = WINDOWS[0].model_copy(update={"seq": 1000 + i})  # a good window between every bad one
        assert fleet.ingest(TELEMETRY_TOPIC, encode(window)) is not None
    return outcomes


@settings(
    max_examples=fault_size(200, 1000),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.randoms(use_true_random=False))
def test_a_storm_of_malformed_messages_is_rejected_by_reason(rng: random.Random) -> None:
    storm([malformed(rng) for _ in range(MESSAGES_PER_EXAMPLE)])


def test_storm_summary() -> None:
    """A storm of its own (whatever ran before): what it threw, and how each kind was refused."""
    rng = random.Random(2024)
    total = fault_size(600, 10_000)
    outcomes = storm([malformed(rng) for _ in range(total)])
    by_kind: dict[str, Counter[str]] = {}
    for (kind, outcome), n in outcomes.items():
        by_kind.setdefault(kind, Counter())[outcome] += n
    print(f"{total} malformed messages: " + "; ".join(f"{k} {dict(v)}" for k, v in sorted(by_kind.items())))
    assert sum(outcomes.values()) == total
    for kind, reason in (("oversize", "oversize"), ("schema", "unknown_schema"), ("topic", "bad_topic"),
                         ("truncated", "bad_json"), ("bytes", "bad_json"), ("mutated", "schema")):  # fmt: skip
        assert by_kind[kind][reason] > 0, (kind, reason)
