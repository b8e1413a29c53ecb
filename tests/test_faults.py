"""Fault injection: a broker outage under 50 sampling nodes, an optimizer restart with alerts switched on, a spool
replay through agent restarts followed by a two-hour optimizer outage, and a storm of malformed telemetry. Short in
the everyday suite; ``pytest -m fault --full-faults`` runs the full lengths (120 s outage, two hours of replay and
of optimizer outage in simulated time, 10,000 messages). Each test prints what it measured.

The other faults live beside the code they exercise and carry the same mark: SIGKILL during an outage
(test_agent_durability.py) and a time-series server outage (test_store.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import FLEETFIT, durable_subscriber, fault_size, free_port, private_broker, shipped_broker, wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from webhook_server import webhook_server

from agent.clock import Clock
from agent.config import AgentConfig, AgentSettings
from agent.protocol import MAX_PAYLOAD_BYTES, Birth, State, Telemetry, TopicKind, encode, node_topic
from agent.service import Agent
from agent.session import next_session
from agent.simulate import SimulatedFleet, offline_windows
from agent.spool import DiskSpool, window_key
from collectors.sim.scenarios import build_scenario, simulated_node
from optimizer.decide.catalog import load_catalog
from optimizer.ingest.fleet import Fleet
from optimizer.ingest.window import Window
from optimizer.serve.config import OptimizerConfig, OptimizerSettings
from optimizer.serve.service import Optimizer

pytestmark = pytest.mark.fault


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@pytest.mark.slow
async def test_broker_outage_under_50_sampling_nodes_loses_no_window(tmp_path: Path, prefix: str) -> None:
    outage = fault_size(8, 120)  # seconds of real time without a broker (50 windows queue up each second)
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
settle_seconds = 0.0  # each move with the first plan that proposes it: this is about restarts, not settling
settle_plans = 1
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
    # the idle allocation and the training job on L4s (chat-serving's load fits no cheaper card of the site)
    assert len(posted) == len(set(posted)) >= 2
    assert len(hooks.delivered) == deliveries  # the restart posted nothing again
    assert after[acked] == "acknowledged"
    assert {k: v for k, v in after.items() if k != acked and k in states} == {
        k: v for k, v in states.items() if k != acked
    }


# ----------------------------------------------------------------------------- replays and a long outage


def _stamped(windows: list[Telemetry], session: int, end: float) -> list[Telemetry]:
    """``windows`` as an earlier run of the agent (``session``) left them in its spool, the last ending at
    ``end``."""
    shift = end - windows[-1].end
    return [w.model_copy(update={"session": session, "start": w.start + shift, "end": w.end + shift}) for w in windows]


@pytest.mark.slow
async def test_replays_through_agent_restarts_and_an_optimizer_outage_lose_no_acknowledged_window(
    tmp_path: Path,
) -> None:
    """A node comes back with two hours of windows in its spool and is restarted three times while replaying
    them (once as if killed); then the optimizer is away for two hours and gets the broker's backlog at once.
    Not one window the broker acknowledged is lost, and none is refused for arriving fast.

    Everything runs on one simulated clock (120x with --full-faults): the windows' 10 s, the agent's pacing
    (300 at once, then 0.9 a second), the optimizer's time budget (a day, then 1.25 s of window a second), its
    clock-skew check and its resend delay are the shipped ones, in simulated seconds. The broker is the shipped
    configuration. The everyday suite runs shorter, with a pacing burst of 20
    so that the replay is paced there too: 30 minutes of spool and 15 of outage at 240x."""
    full = os.environ.get("FLEETFIT_FULL_FAULTS") == "1"
    spool_s, outage_s = (7200.0, 7200.0) if full else (1800.0, 900.0)
    scale = 120.0 if full else 240.0
    burst = AgentSettings().publish_burst if full else 20
    clock = Clock(scale)
    started = time.monotonic()
    template = build_scenario("mixed", 1, seed=5)[0]
    name = template.name
    shipped = shipped_broker(tmp_path / "broker", {"lab": [name]})
    shipped.server.start()
    state = tmp_path / "agent"
    old = next_session(state, clock.wall)
    _, history = offline_windows(template, int(spool_s / 10), site="lab", seed=5)
    spool = DiskSpool(state / "spool", 8640, 256 << 20)
    for w in _stamped(history, old, clock.wall()):
        spool.put(encode(w))
    acked: set[tuple[int, int]] = set()  # (session, seq) the broker acknowledged
    accepted: Counter[tuple[int, int]] = Counter()  # and what the optimizers took in
    refused: Counter[str] = Counter()

    def new_agent() -> Agent:
        config = AgentConfig(
            agent=AgentSettings(node=name, site="lab", publish_interval=10.0, sample_interval=5.0, state_dir=state,
                                publish_burst=burst),
            mqtt=shipped.settings(name),
        )  # fmt: skip
        agent = Agent(config, [simulated_node(template, clock.wall, 5)], next_session(state, clock.wall), clock=clock)
        queue, pop = agent.queue, agent.queue.pop

        def acknowledged(token: int) -> None:  # the link lets a window go once the broker acknowledged it
            head = queue.peek()
            if head is not None and head[0] == token and (key := window_key(head[1])) is not None:
                acked.add(key)
            pop(token)

        queue.pop = acknowledged  # type: ignore[method-assign]
        return agent

    def new_optimizer() -> Optimizer:
        config = OptimizerConfig(
            mqtt=shipped.settings("fleetfit-optimizer").model_copy(update={"session_expiry": 3600}),
            optimizer=OptimizerSettings(state_dir=tmp_path / "optimizer", solve_interval=3600),
        )
        optimizer = Optimizer(config, load_catalog(), clock=clock.wall)
        optimizer.resend_interval = 10.0 / scale
        ingest = optimizer.fleet.ingest

        def counted(topic: str, payload: bytes | bytearray) -> Birth | State | Window | None:
            message = ingest(topic, payload)
            if isinstance(message, Window):
                accepted[(message.session, message.seq)] += 1
            return message

        optimizer.fleet.ingest = counted  # type: ignore[method-assign]
        return optimizer

    optimizer = new_optimizer()
    optimizer_task = asyncio.create_task(optimizer.run())
    agent = new_agent()
    agent_task = asyncio.create_task(asyncio.sleep(0))
    try:
        # subscribed first, as an optimizer long deployed is: a broker drops what no session subscribes to
        await wait_until(optimizer.connected.is_set, 15, "the optimizer")
        agent_task = asyncio.create_task(agent.run())
        spooled = len(agent.queue)
        in_spool_at_restart = []
        for n, left in enumerate((0.75, 0.5, 0.25)):
            current = agent
            deadline = time.monotonic() + 120
            while len(current.queue) > spooled * left:  # polled finely: a simulated minute is a quarter second
                assert not agent_task.done(), "the agent stopped"
                assert time.monotonic() < deadline, f"the replay stalled at {len(current.queue)} windows"
                await asyncio.sleep(0.005)
            in_spool_at_restart.append(len(agent.queue))
            if n == 1:  # as if killed: no drain, no goodbye, the window in flight never acknowledged
                agent._drain = _no_drain  # type: ignore[method-assign]
                agent.link.say_goodbye = _no_goodbye  # type: ignore[method-assign]
                agent_task.cancel()
            else:
                agent.should_exit.set()
            await asyncio.gather(agent_task, return_exceptions=True)
            agent = new_agent()
            agent_task = asyncio.create_task(agent.run())
        await wait_until(lambda: len(agent.queue) == 0, 120, "the replay to end")
        # the optimizer is away; the broker keeps its queue, and the node goes on publishing
        optimizer.should_exit.set()
        await optimizer_task
        refused.update(optimizer.fleet.rejected)
        away = len(accepted)
        await clock.sleep_until(clock.monotonic() + outage_s)
        optimizer = new_optimizer()
        optimizer_task = asyncio.create_task(optimizer.run())
        await wait_until(optimizer.connected.is_set, 15, "the optimizer to return")
        await clock.sleep_until(clock.monotonic() + 300.0)
        backlog = len(accepted) - away
        agent.should_exit.set()
        await asyncio.gather(agent_task, return_exceptions=True)
        with contextlib.suppress(AssertionError):  # what is still missing then is reported below
            await wait_until(lambda: acked <= set(accepted), 60, "every acknowledged window")
    finally:
        for a_task in (agent_task, optimizer_task):
            if not a_task.done():
                if a_task is optimizer_task:
                    optimizer.should_exit.set()
                else:
                    agent.should_exit.set()
        await asyncio.gather(agent_task, optimizer_task, return_exceptions=True)
        shipped.server.stop()
    refused.update(optimizer.fleet.rejected)
    lost = acked - set(accepted)
    print(
        f"{spool_s / 3600:g} h of spool replayed through 3 agent restarts (spool at each: {in_spool_at_restart}), "
        f"the optimizer away {outage_s / 3600:g} h: {len(acked)} windows acknowledged by the broker, "
        f"{len(acked & set(accepted))} taken in, {len(lost)} lost; {sum(accepted.values()) - len(accepted)} sent "
        f"twice; {backlog} delivered at once on the optimizer's return; refused {dict(refused)}; "
        f"{time.monotonic() - started:.0f} s real at {scale:g}x"
    )
    assert not lost, sorted(lost)
    assert len(in_spool_at_restart) == 3 and all(n > 0 for n in in_spool_at_restart)  # restarted mid-replay
    assert refused["rate_limited"] == 0 and refused["time_budget"] == 0
    assert backlog >= outage_s / 10 * 0.9  # the outage's windows came as one backlog, all taken
    assert len(acked) >= spool_s / 10 + outage_s / 10


async def _no_drain(limit: float) -> None:
    return None


async def _no_goodbye() -> None:
    return None


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
        assert outcome in expect and sum(new.values()) == (0 if accepted else 1), (
            kind,
            outcome,
            expect,
            {k: v for k, v in json.loads(payload).items() if GOOD.get(k) != v} if kind == "mutated" else payload[:80],
        )
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


@pytest.mark.parametrize(
    ("path", "text"),
    [
        (("start",), "9"),
        (("samples",), "10"),
        (("session",), "1"),
        (("gpus", 0, "util"), ["1", "2", "3", "0.5"]),
        (("workloads", 0, "gpus"), ["0"]),  # a GPU index as text: the workload would claim nothing real
        (("gpus", 0, "xid_events"), 2**64),  # a count past 2**53, which the store cannot write as a float field
        (("gpus", 0, "ecc_uncorrected"), 10**400),
        (("nics", 0, "errors"), 2**60),
    ],
)
def test_a_number_sent_as_text_is_refused_as_schema(path: tuple[str | int, ...], text: object) -> None:
    """JSON numbers only: a string that reads as a number ("9") is what no agent sends, and refused whole. A field
    the simulated window leaves out (``ecc_uncorrected``: no ECC errors read) is first sent as an honest 0 and
    taken, so its refusal is the value's, not an unknown key's."""
    raw = json.loads(json.dumps(GOOD))
    where = raw
    for key in path[:-1]:
        where = where[key]
    fleet = Fleet(P)
    assert fleet.ingest(node_topic(P, "s", NODE.name, TopicKind.BIRTH), encode(BIRTH))
    if path[-1] not in where:
        honest = json.loads(json.dumps(raw))
        inner = honest
        for key in path[:-1]:
            inner = inner[key]
        inner[path[-1]] = 0
        honest["seq"] = GOOD["seq"] - 1  # before the honest window taken at the end
        assert fleet.ingest(TELEMETRY_TOPIC, json.dumps(honest).encode()) is not None
    where[path[-1]] = text
    assert fleet.ingest(TELEMETRY_TOPIC, json.dumps(raw).encode()) is None
    assert fleet.rejected == {"schema": 1}
    assert fleet.ingest(TELEMETRY_TOPIC, json.dumps(GOOD).encode()) is not None  # the honest window still is
