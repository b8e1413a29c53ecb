"""What one node flooding at 100x its window rate costs the optimizer's ingest, against the same fleet without
the flood, in the same run.

A fleet of honest nodes sends a window every 10 s for ``--minutes`` of simulated time; in the flood run one of
them sends 100x as many (every 0.1 s) during the first half, each window naming 64 new workloads, then goes
back to normal. Both runs feed the optimizer's ingest (validation, the per-node limits, per-node state) the
messages in timestamp order under a simulated clock, so the rate limit sees the rates a real fleet would.
Printed: CPU seconds of each run (medians over ``--rounds``, runs alternating), the extra CPU the flood
costs, and the memory the fleet state holds at the end of each run (traced in a separate pass), when the
flood has been over for longer than the horizon.

    .venv/bin/python bench/flood.py [--nodes 100] [--minutes 60] [--rounds 3]

The MQTT client's per-message cost is not included: it is the same for a message the optimizer rejects.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.protocol import TopicKind, encode, node_topic
from agent.simulate import offline_windows
from collectors.sim.scenarios import build_scenario
from optimizer.decide.catalog import load_catalog
from optimizer.ingest.fleet import Fleet
from optimizer.serve.config import OptimizerConfig
from optimizer.serve.service import ingest_limits, tune_gc

PREFIX = "fleetfit/v1"
SITE = "bench"
INTERVAL = 10.0
FLOOD_FACTOR = 100

Message = tuple[float, str, bytes]  # (arrival time, topic, payload)


class SimClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def streams(nodes: int, minutes: float) -> tuple[list[Message], list[Message], list[Message]]:
    """Births, the honest windows, and the flood, each message stamped with the time it arrives."""
    templates = build_scenario("demo", 8)
    per_node = int(minutes * 60 / INTERVAL)
    births: list[Message] = []
    honest: list[Message] = []
    flood: list[Message] = []
    prepared = [
        offline_windows(t, per_node, publish_interval=INTERVAL, site=SITE, seed=i) for i, t in enumerate(templates)
    ]
    t0 = prepared[0][1][0].start
    for n in range(nodes):
        birth, windows = prepared[n % len(templates)]
        name = f"node-{n:04d}"
        births.append(
            (t0, node_topic(PREFIX, SITE, name, TopicKind.BIRTH), encode(birth.model_copy(update={"node": name})))
        )
        offset = (n % 100) * INTERVAL / 100  # nodes do not all publish at the same instant
        topic = node_topic(PREFIX, SITE, name, TopicKind.TELEMETRY)
        for w in windows:
            refs = [r.model_copy(update={"id": f"{r.id}-{n}"}) for r in w.workloads]  # one pod, one node
            honest.append((w.end + offset, topic, encode(w.model_copy(update={"node": name, "workloads": refs}))))
    # node-0000 floods during the first half: a window every INTERVAL/100 s, each naming 64 new workloads
    birth, windows = prepared[0]
    topic = node_topic(PREFIX, SITE, "node-0000", TopicKind.TELEMETRY)
    template = json.loads(encode(windows[0].model_copy(update={"node": "node-0000"})))
    ref = template["workloads"][0]
    step = INTERVAL / FLOOD_FACTOR
    count = int(minutes * 60 / 2 / step)
    for i in range(count):
        at = t0 + i * step
        template.update(
            session=2,
            seq=i,
            start=at - step,
            end=at,
            workloads=[dict(ref, id=f"k8s/flood-{i}-{j}", gpus=[j % 8]) for j in range(64)],
        )
        flood.append((at, topic, json.dumps(template, separators=(",", ":")).encode()))
    return births, honest, flood


def live_fleet(clock: SimClock) -> Fleet:
    """A fleet with the live optimizer's default limits."""
    config = OptimizerConfig()
    return Fleet(PREFIX, config.optimizer.horizon_windows, ingest_limits(config, load_catalog()), clock=clock)


def run(births: list[Message], stream: list[Message]) -> tuple[float, Fleet]:
    clock = SimClock()
    fleet = live_fleet(clock)
    for at, topic, payload in births:
        clock.now = at
        fleet.ingest(topic, payload)
    gc.collect()
    started = time.process_time()
    for at, topic, payload in stream:
        clock.now = at
        fleet.ingest(topic, payload)
    return time.process_time() - started, fleet


def held_mib(births: list[Message], stream: list[Message]) -> float:
    gc.collect()
    tracemalloc.start()
    _, fleet = run(births, stream)
    gc.collect()
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del fleet
    return current / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--minutes", type=float, default=60.0, help="simulated; the flood lasts the first half")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the flood's rejections are counted below, not logged line by line
    tune_gc()  # as the daemon does at start

    births, honest, flood = streams(args.nodes, args.minutes)
    flooded = sorted(honest + flood, key=lambda m: m[0])
    honest.sort(key=lambda m: m[0])
    base_cpu, flood_cpu = [], []
    for _ in range(args.rounds):
        cpu, fleet = run(births, honest)
        base_cpu.append(cpu)
        cpu, fleet = run(births, flooded)
        flood_cpu.append(cpu)
    base, with_flood = statistics.median(base_cpu), statistics.median(flood_cpu)
    print(f"fleet: {args.nodes} nodes, a window every {INTERVAL:g} s, {args.minutes:g} simulated minutes")
    print(f"flood: node-0000 at {FLOOD_FACTOR}x for the first half, {len(flood)} windows naming 64 new workloads each")
    flood_accepted = fleet.accepted["telemetry"] - len(honest)
    print(
        f"  accepted: {flood_accepted} flood windows (the burst, then the sustained rate); "
        f"rejected: {dict(fleet.rejected)}"
    )
    print(f"  workload references dropped: {dict(fleet.dropped_refs)}")
    print(f"ingest CPU, median of {args.rounds}: {base:.2f} s without the flood, {with_flood:.2f} s with it")
    print(f"  extra CPU of the flood: {100 * (with_flood / base - 1):+.1f} % (target <= 5 %)")
    base_mem, flood_mem = held_mib(births, honest), held_mib(births, flooded)
    print(f"fleet state at the end (flood over for {args.minutes / 2:g} min): {base_mem:.1f} MiB without the flood,")
    print(f"  {flood_mem:.1f} MiB with it: {100 * (flood_mem / base_mem - 1):+.1f} %")


if __name__ == "__main__":
    main()
