"""Validated ingest rate of the optimizer against a bare aiomqtt subscriber, same stream, same broker, same run.

The broker queues the same telemetry stream for each subscriber's persistent session while it is away; then the
subscriber connects and drains it as fast as it can. The bare subscriber only counts messages; the optimizer
validates every payload against the protocol, checks sequence numbers and keeps per-node state. Rounds
alternate; medians are printed with the ratio and the fleet size the optimizer's rate sustains at 10 s windows.

    .venv/bin/python bench/ingest.py [--nodes 100] [--windows 60] [--rounds 3] [--validation-only]

Each step of a window's way in is timed against json.loads of the same bytes, in alternating slices of the stream,
on the thread's CPU clock, so that other load on the machine falls on both alike; each ratio is the median of
passes. The steps: validation alone, by the protocol's pydantic model and by the optimizer's window reader
(msgspec, ``optimizer/ingest/window.py``); the ingest itself (``Fleet.ingest``: decode, validate, check and
digest); and the ingest with the window's lines for the store written too. A node's memory is traced with
``--windows`` windows held (60, the default horizon, for the steady state).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import free_port, mosquitto_command

from agent.config import MqttSettings
from agent.mqtt import make_client
from agent.protocol import Birth, Telemetry, TopicKind, encode, node_topic
from agent.simulate import offline_windows, shift_to_now
from collectors.sim.scenarios import build_scenario
from optimizer.decide.catalog import load_catalog
from optimizer.ingest.fleet import Fleet, NodeRecord
from optimizer.ingest.window import Window, read_window
from optimizer.serve.config import OptimizerConfig, OptimizerSettings
from optimizer.serve.service import Optimizer, tune_gc
from optimizer.serve.store import window_points

PREFIX = "fleetfit/v1"
HORIZON = 60  # windows a node keeps: the optimizer's default horizon_windows


async def publish(settings: MqttSettings, messages: list[tuple[str, bytes]]) -> None:
    async with make_client(settings, "bench-publisher") as client:
        for topic, payload in messages:
            await client.publish(topic, payload, qos=1)


async def bare(settings: MqttSettings, expected: int, stream: list[tuple[str, bytes]]) -> float:
    """Messages per second a subscriber that only counts drains from its queue."""
    filt = f"{PREFIX}/+/+/telemetry"
    async with make_client(settings, "bench-bare") as c:
        await c.subscribe(filt, qos=1)
    await publish(settings, stream)
    count, first = 0, 0.0
    async with make_client(settings, "bench-bare") as c:
        await c.subscribe(filt, qos=1)
        async for _ in c.messages:
            count += 1
            if count == 1:
                first = time.perf_counter()
            if count == expected:
                break
    return (expected - 1) / (time.perf_counter() - first)


async def optimizer(
    settings: MqttSettings, expected: int, stream: list[tuple[str, bytes]], births: list[tuple[str, bytes]]
) -> float:
    """Messages per second the optimizer validates and applies, draining the same queue."""
    config = OptimizerConfig(
        mqtt=settings, optimizer=OptimizerSettings(client_id="bench-optimizer", solve_interval=3600)
    )
    opt = Optimizer(config, load_catalog())
    task = asyncio.create_task(opt.run())
    await asyncio.wait_for(opt.connected.wait(), 10)
    opt.should_exit.set()
    await task
    async with make_client(settings, "bench-births") as c:
        for topic, payload in births:
            await c.publish(topic, payload, qos=1, retain=True)
    await publish(settings, stream)
    opt = Optimizer(config, load_catalog())
    task = asyncio.create_task(opt.run())
    first = None
    while opt.fleet.accepted["telemetry"] + sum(opt.fleet.rejected.values()) < expected:
        if first is None and opt.fleet.accepted["telemetry"]:
            first = (time.perf_counter(), opt.fleet.accepted["telemetry"])
        await asyncio.sleep(0.02)
    elapsed = time.perf_counter() - (first[0] if first else 0.0)
    done = opt.fleet.accepted["telemetry"] - (first[1] if first else 0)
    rejected = sum(opt.fleet.rejected.values())
    opt.should_exit.set()
    await task
    if rejected:
        print(f"  optimizer rejected {rejected} message(s): {dict(opt.fleet.rejected)}")
    return done / elapsed


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--windows", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--validation-only", action="store_true", help="skip the MQTT rounds")
    args = parser.parse_args()
    tune_gc()  # as `fleetfit optimizer` does at start
    nodes = build_scenario("mixed", args.nodes, seed=3)
    births, windows_by_node = [], []
    for n in nodes:
        birth, ws = offline_windows(n, args.windows, site="ingest")
        ws = shift_to_now(ws)  # the live optimizer takes windows of the last day only
        births.append((node_topic(PREFIX, "ingest", n.name, TopicKind.BIRTH), birth))
        windows_by_node.append([(node_topic(PREFIX, "ingest", n.name, TopicKind.TELEMETRY), w) for w in ws])
    if args.validation_only:
        where_it_goes(births, windows_by_node, args.rounds)
        return 0
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        command = mosquitto_command(Path(tmp), port, "max_queued_messages 0", "max_inflight_messages 0")
        broker = await asyncio.create_subprocess_exec(*command, stderr=asyncio.subprocess.DEVNULL)
        await asyncio.sleep(0.5)
        settings = MqttSettings(host="127.0.0.1", port=port, session_expiry=3600, protocol="5")
        rates: dict[str, list[float]] = {"bare": [], "optimizer": []}
        try:
            for r in range(args.rounds):
                # Each round sends fresh windows (a new session), so the optimizer never sees duplicates.
                stream = []
                for per_node in windows_by_node:
                    stream += [(topic, encode(w.model_copy(update={"session": r + 1}))) for topic, w in per_node]
                bare_rate = await bare(settings, len(stream), stream)
                round_births = [(t, encode(b.model_copy(update={"session": r + 1}))) for t, b in births]
                opt_rate = await optimizer(settings, len(stream), stream, round_births)
                rates["bare"].append(bare_rate)
                rates["optimizer"].append(opt_rate)
                print(
                    f"round {r + 1}: bare {bare_rate:,.0f} msg/s, optimizer {opt_rate:,.0f} msg/s "
                    f"({len(stream)} windows, {sum(len(p) for _, p in stream) / len(stream) / 1024:.1f} KiB each)"
                )
        finally:
            broker.terminate()
            await broker.wait()
    b, o = statistics.median(rates["bare"]), statistics.median(rates["optimizer"])
    print()
    print(f"median: bare subscriber {b:,.0f} msg/s, optimizer ingest {o:,.0f} msg/s, ratio {o / b:.2f}")
    print(f"at 10 s windows the optimizer's ingest rate sustains about {o * 10:,.0f} nodes on one core")
    print(f"per message: bare subscriber {1e6 / b:.0f} µs, optimizer {1e6 / o:.0f} µs")
    where_it_goes(births, windows_by_node, args.rounds)
    return 0


def against_parsing(
    payloads: list[tuple[str, bytes]], make: Callable[[], Callable[[str, bytes], object]], passes: int
) -> tuple[float, float, float]:
    """Median µs per window of a step and of json.loads of the same bytes, and the median of their per-pass
    ratios. ``make`` gives the step afresh for each pass (a new fleet: the same windows again are duplicates)."""
    parse = json.loads
    slices = [payloads[i : i + 50] for i in range(0, len(payloads), 50)]
    passes_us: list[tuple[float, float]] = []
    for n in range(max(passes, 3)):
        step = make()
        spent = [0.0, 0.0]
        for i, chunk in enumerate(slices):
            for which in (0, 1) if (i + n) % 2 else (1, 0):
                started = time.thread_time()
                if which == 0:
                    for topic, payload in chunk:
                        step(topic, payload)
                else:
                    for _, payload in chunk:
                        parse(payload)
                spent[which] += time.thread_time() - started
        passes_us.append((spent[0] / len(payloads) * 1e6, spent[1] / len(payloads) * 1e6))
    return (
        statistics.median(v for v, _ in passes_us),
        statistics.median(p for _, p in passes_us),
        statistics.median(v / p for v, p in passes_us),
    )


def whole_ingest(births: list[tuple[str, Birth]], lines: bool = True) -> Callable[[str, bytes], object]:
    """What the optimizer does with each window it reads besides MQTT: decode, validate, check and digest it
    (``Fleet.ingest``) and, with ``lines``, write its lines for the store."""
    fleet = Fleet(PREFIX, horizon_windows=HORIZON)
    for topic, birth in births:
        fleet.ingest(topic, encode(birth))
    records: dict[str, NodeRecord | None] = {}

    def step(topic: str, payload: bytes) -> object:
        window = fleet.ingest(topic, payload)
        if lines and isinstance(window, Window):
            record = records.get(topic) or records.setdefault(topic, fleet.record(window.site, window.node))
            return window_points(record.birth if record else None, window)
        return None

    return step


def where_it_goes(
    births: list[tuple[str, Birth]], windows_by_node: list[list[tuple[str, Telemetry]]], passes: int
) -> None:
    """Each step of a window's way in against json.loads, and the memory a node costs, outside MQTT."""
    payloads = [(topic, encode(w)) for per_node in windows_by_node for topic, w in per_node]
    Telemetry.model_validate_json(payloads[0][1])  # the validator is built on first use
    steps: list[tuple[str, Callable[[], Callable[[str, bytes], object]]]] = [
        ("validation alone, by the protocol's model (pydantic)", lambda: lambda _, p: Telemetry.model_validate_json(p)),
        ("validation alone, by the optimizer's window reader (msgspec)", lambda: lambda _, p: read_window(p)),
        ("ingest: decode, validate, check and digest (Fleet.ingest)", lambda: whole_ingest(births, lines=False)),
        ("ingest and the window's lines for the store", lambda: whole_ingest(births)),
    ]
    for label, make in steps:
        step_us, parse_us, ratio = against_parsing(payloads, make, passes)
        target = " (target <= 2x)" if label.startswith("ingest:") else ""
        print(f"{label}: {step_us:.0f} µs per window, json.loads {parse_us:.0f} µs: {ratio:.2f}x{target}")
    gc.collect()
    tracemalloc.start()
    decoded = [read_window(p) for _, p in payloads]
    decoded_kib = tracemalloc.get_traced_memory()[0] / len(decoded) / 1024
    del decoded
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    fleet = Fleet(PREFIX, horizon_windows=HORIZON)
    for topic, birth in births:
        fleet.ingest(topic, encode(birth))
    for topic, payload in payloads:
        fleet.ingest(topic, payload)
    gc.collect()
    per_node_kib = (tracemalloc.get_traced_memory()[0] - before) / len(births) / 1024
    tracemalloc.stop()
    held = statistics.median(len(r.windows) for r in fleet.nodes.values())
    print(
        f"(medians of {max(passes, 3)} passes)\na decoded window holds {decoded_kib:.1f} KiB; a node's whole state "
        f"with {held:.0f} windows held (of a horizon of {HORIZON}): {per_node_kib:.1f} KiB"
    )


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
