"""Fleet simulator at scale: can one process keep 1,000 simulated nodes on schedule at time-scale 1?

Runs a local Mosquitto, a subscriber that counts windows and their lag, and ``fleetfit simulate --nodes N``
(10 s windows, real time). Beside it, in the same run and against the same broker, a transport-only baseline:
one process holding N MQTT connections that publishes pre-encoded windows at the same rate, with no sampling.
Prints windows expected / received, lag, CPU (share of one core) and RSS of each, and the ratio.

    .venv/bin/python bench/simulate_scale.py [--nodes 1000] [--duration 120] [--warmup 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiomqtt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cpu_seconds, free_port, mosquitto_command, raise_open_files_limit, rss_mib


async def transport_only(port: int, nodes: int, duration: float) -> None:
    """The baseline: N connections publishing one pre-encoded window each every 10 s."""
    from agent.protocol import TopicKind, encode, node_topic
    from agent.simulate import offline_windows
    from collectors.sim.scenarios import build_scenario

    fleet = build_scenario("mixed", nodes, seed=1)
    payloads = {n.name: encode(offline_windows(n, 1, site="base")[1][0]) for n in fleet[:20]}
    sample = list(payloads.values())

    async def node(i: int, name: str) -> None:
        topic = node_topic("fleetfit/v1", "base", name, TopicKind.TELEMETRY)
        async with aiomqtt.Client("127.0.0.1", port, identifier=f"base-{i}") as client:
            await asyncio.sleep(10 * i / nodes)
            end = time.monotonic() + duration
            while time.monotonic() < end:
                await client.publish(topic, sample[i % len(sample)], qos=1)
                await asyncio.sleep(10)

    await asyncio.gather(*(node(i, n.name) for i, n in enumerate(fleet[:nodes])))


async def count(port: int, topic: str, seen: list[float], stop: asyncio.Event) -> None:
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"counter-{topic}", max_queued_incoming_messages=0) as c:
        await c.subscribe(topic, qos=1)
        async for m in c.messages:
            end = json.loads(m.payload)["end"]  # type: ignore[arg-type]
            seen.append(time.time() - end)
            if stop.is_set():
                return


async def measure(name: str, cmd: list[str], port: int, topic: str, warmup: float, duration: float) -> dict[str, float]:
    seen: list[float] = []
    stop = asyncio.Event()
    counter = asyncio.create_task(count(port, topic, seen, stop))
    await asyncio.sleep(0.5)
    proc = await asyncio.create_subprocess_exec(*cmd, stderr=asyncio.subprocess.PIPE)
    await asyncio.sleep(warmup)
    cpu0, t0, n0 = cpu_seconds(proc.pid), time.monotonic(), len(seen)
    await asyncio.sleep(duration)
    cpu1, t1, n1 = cpu_seconds(proc.pid), time.monotonic(), len(seen)
    rss = rss_mib(proc.pid)
    lags = sorted(seen[n0:n1]) or [0.0]
    proc.terminate()
    _, raw_err = await asyncio.wait_for(proc.communicate(), 120)
    err = raw_err.decode(errors="replace")
    stop.set()
    counter.cancel()
    summary = next((line for line in err.splitlines() if "simulated" in line and "ticks missed" in line), "")
    return {
        "name": name,  # type: ignore[dict-item]
        "cpu": (cpu1 - cpu0) / (t1 - t0),
        "rss": rss,
        "windows": n1 - n0,
        "lag_p50": statistics.median(lags),
        "lag_p95": lags[int(0.95 * (len(lags) - 1))],
        "summary": summary,  # type: ignore[dict-item]
    }


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=120.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=30.0)
    parser.add_argument("--transport-only", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    raise_open_files_limit()
    if args.transport_only:
        await transport_only(args.transport_only, args.nodes, args.warmup + args.duration + 30)
        return 0
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        command = mosquitto_command(Path(tmp), port, "max_connections -1", "max_queued_messages 100000")
        broker = await asyncio.create_subprocess_exec(*command, stderr=asyncio.subprocess.DEVNULL)
        try:
            await asyncio.sleep(0.5)
            fleetfit = str(Path(sys.executable).parent / "fleetfit")
            sim = await measure(
                "fleetfit simulate",
                [
                    fleetfit,
                    "simulate",
                    "--broker",
                    f"mqtt://127.0.0.1:{port}",
                    "--nodes",
                    str(args.nodes),
                    "--scenario",
                    "mixed",
                    "--site",
                    "sim",
                ],
                port,
                "fleetfit/v1/sim/+/telemetry",
                args.warmup,
                args.duration,
            )
            base = await measure(
                "transport only",
                [
                    sys.executable,
                    __file__,
                    "--nodes",
                    str(args.nodes),
                    "--warmup",
                    str(args.warmup),
                    "--duration",
                    str(args.duration),
                    "--transport-only",
                    str(port),
                ],
                port,
                "fleetfit/v1/base/+/telemetry",
                args.warmup,
                args.duration,
            )
        finally:
            broker.terminate()
            await asyncio.wait_for(broker.wait(), 30)
    from collectors.sim.scenarios import build_scenario

    sim_nodes = len(build_scenario("mixed", args.nodes, seed=0))  # the scenario adds a few spare nodes
    expected = sim_nodes * args.duration / 10
    print(
        f"{sim_nodes} simulated nodes, 10 s windows, time-scale 1, {args.duration:g} s measured after {args.warmup:g} s"
    )
    print(f"{'':20}{'windows':>10}{'expected':>10}{'lag p50':>9}{'lag p95':>9}{'CPU':>8}{'RSS MiB':>9}")
    for r, exp in ((sim, expected), (base, args.nodes * args.duration / 10)):
        # the baseline replays recorded windows, whose timestamps are old: its lag means nothing
        lag = f"{r['lag_p50']:>8.2f}s{r['lag_p95']:>8.2f}s" if r is sim else f"{'-':>9}{'-':>9}"
        print(f"{r['name']:20}{r['windows']:>10.0f}{exp:>10.0f}{lag}{r['cpu']:>7.0%}{r['rss']:>9.0f}")
    ratio = (sim["cpu"] / sim_nodes) / (base["cpu"] / args.nodes)
    print(f"CPU per node, simulate / transport only: {ratio:.2f}")
    print(sim["summary"])
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
