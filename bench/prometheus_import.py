"""The same simulated fleet read two ways: through agents (1 Hz samples in 10 s windows, as the optimizer ingests
them) and through Prometheus (the fleet's dcgm-exporter, kube-state-metrics and cAdvisor history in a real
VictoriaMetrics, read by ``fleetfit import prometheus``). Prints how often the two agree on a workload's class and
the plans' savings, then, with ``--scale``, the import's wall time and peak memory for a large fleet.

    .venv/bin/python bench/prometheus_import.py                        # agreement: 3 seeds of 40 mixed nodes
    .venv/bin/python bench/prometheus_import.py --scale --nodes 1000   # 1,000 nodes x 24 h against VictoriaMetrics

The agent path's windows cover the last 15 minutes (the live optimizer's horizon); the Prometheus path reads
``--hours`` of history at ``--step`` (the scrape interval), in 5-minute windows. The targets: classes agree on
>= 95 % of workloads, plan savings within 10 %; an import of 1,000 nodes x 24 h <= 60 s wall and <= 1 GiB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.protocol import TopicKind, encode, node_topic
from agent.simulate import offline_windows
from bench.common import free_port
from collectors.sim.backfill import write_history
from collectors.sim.exporter import ExporterOptions
from collectors.sim.scenarios import build_scenario
from optimizer.commands.importer import read_snapshot
from optimizer.decide.catalog import load_catalog
from optimizer.decide.snapshot import Snapshot, from_fleet
from optimizer.ingest.fleet import Fleet
from optimizer.ingest.promapi import Endpoint
from optimizer.ingest.promsource import ReadSettings
from optimizer.plan.recommend import PlanSettings, plan_snapshot

SITE = "bench"


class Victoria:
    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            ["victoria-metrics", f"-httpListenAddr=127.0.0.1:{self.port}", f"-storageDataPath={directory / 'vm'}",
             "-search.latencyOffset=0s", "-retentionPeriod=100y", "-loggerLevel=ERROR"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=1).read()
                return
            except OSError:
                time.sleep(0.1)
        raise SystemExit("VictoriaMetrics did not start")

    def load(self, path: Path) -> None:
        with path.open("rb") as body:
            request = urllib.request.Request(f"{self.url}/api/v1/import/prometheus", data=body, method="POST")
            request.add_header("Content-Length", str(path.stat().st_size))
            urllib.request.urlopen(request, timeout=3600).read()
        urllib.request.urlopen(f"{self.url}/internal/force_flush", timeout=600).read()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


def agent_snapshot(scenario: str, nodes: int, seed: int) -> Snapshot:
    fleet = Fleet("bench", horizon_windows=90)
    for node in build_scenario(scenario, nodes, seed):
        birth, windows = offline_windows(node, 90, site=SITE, seed=seed)
        fleet.ingest(node_topic("bench", SITE, node.name, TopicKind.BIRTH), encode(birth))
        for w in windows:
            fleet.ingest(node_topic("bench", SITE, node.name, TopicKind.TELEMETRY), encode(w))
    return from_fleet(fleet, SITE, [])


def prometheus_snapshot(url: str, end: float, hours: float, step: float) -> Snapshot:
    settings = ReadSettings(site=SITE, step=step, window=max(300.0, 2 * step))
    snapshot, _ = asyncio.run(read_snapshot(Endpoint(url), settings, hours * 3600, end, load_catalog(), []))
    return snapshot


def savings(snapshot: Snapshot) -> float:
    plan = plan_snapshot(snapshot, load_catalog(), PlanSettings(time_limit=10))
    return sum(r.monthly_savings_usd for r in plan.recommendations)


def agreement(args: argparse.Namespace, work: Path) -> None:
    rows = []
    for seed in range(args.seed, args.seed + args.seeds):
        vm = Victoria(work / f"agree-{seed}")
        try:
            end = (time.time() // 300) * 300 - 300
            nodes = build_scenario(args.scenario, args.nodes, seed)
            history = work / f"history-{seed}.txt"
            write_history(nodes, history, end=end, span=args.hours * 3600, step=args.step,
                          options=ExporterOptions(), fmt="victoriametrics", seed=seed, sample_every=1.0)  # fmt: skip
            vm.load(history)
            time.sleep(2)
            through_prom = prometheus_snapshot(vm.url, end, args.hours, args.step)
        finally:
            vm.stop()
        through_agents = agent_snapshot(args.scenario, args.nodes, seed)
        a = {w.id: w.workload_class.value for w in through_agents.workloads}
        p = {w.id: w.workload_class.value for w in through_prom.workloads}
        both = sorted(set(a) & set(p))
        agree = sum(a[w] == p[w] for w in both) / max(1, len(both))
        sa, sp = savings(through_agents), savings(through_prom)
        ratio = sp / sa if sa else float("nan")
        rows.append((seed, len(a), len(p), len(both), agree, sa, sp, ratio))
        counts = f"workloads agents {len(a)}, prometheus {len(p)}, both {len(both)}"
        plans = f"plan savings agents ${sa:,.0f}/month, prometheus ${sp:,.0f}/month ({ratio:.2f}x)"
        print(f"seed {seed}: {counts}; classes agree {agree:.1%}; {plans}")
        if args.verbose:
            for w in both:
                if a[w] != p[w]:
                    print(f"    {w}: agents {a[w]}, prometheus {p[w]}")
    print(f"median over {len(rows)} seeds: classes agree {statistics.median(r[4] for r in rows):.1%}, "
          f"savings ratio {statistics.median(r[7] for r in rows):.2f}x")  # fmt: skip


def scale(args: argparse.Namespace, work: Path) -> None:
    vm = Victoria(work / "scale")
    try:
        end = (time.time() // 600) * 600 - 600
        nodes = build_scenario(args.scenario, args.nodes, args.seed)
        history = work / "history-scale.txt"
        made = loaded = 0.0
        samples = size = 0
        # written and imported a hundred nodes at a time: a day of 1,000 nodes is ~55 GB of text
        for first in range(0, len(nodes), 100):
            t0 = time.monotonic()
            stats = write_history(nodes[first : first + 100], history, end=end, span=args.hours * 3600,
                                  step=args.step, options=ExporterOptions(), fmt="victoriametrics", seed=args.seed,
                                  jobs=2)  # fmt: skip
            made += time.monotonic() - t0
            samples, size = samples + stats.lines, size + stats.bytes
            t0 = time.monotonic()
            vm.load(history)
            history.unlink()
            loaded += time.monotonic() - t0
        print(
            f"history: {samples:,} samples, {size / 2**20:,.0f} MiB written in {made:.0f} s, imported in {loaded:.0f} s"
        )
        time.sleep(5)
        walls: list[float] = []
        # the import in a process of its own that reports its own peak memory (RUSAGE_SELF)
        run = "\n".join(
            [
                "import resource, sys",
                "from optimizer.commands.cli import main",
                "code = main(sys.argv[1:])",
                "print(f'maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}', file=sys.stderr)",
                "sys.exit(code)",
            ]
        )
        for _ in range(args.rounds):
            t0 = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-c", run, "import", "prometheus", vm.url, "--since", f"{args.hours}h", "--until",
                 str(end), "--step", f"{args.step:g}", "--site", SITE],
                capture_output=True, text=True, check=False, cwd=Path(__file__).resolve().parent.parent,
            )  # fmt: skip
            wall = time.monotonic() - t0
            if done.returncode != 0:
                raise SystemExit(done.stderr[-2000:])
            lines = done.stderr.strip().splitlines()
            peak = int(lines[-1].split()[1]) / 1024
            snapshot = json.loads(done.stdout)
            walls.append(wall)
            read = f"{len(snapshot['nodes'])} nodes, {len(snapshot['workloads'])} workloads in {wall:.1f} s"
            print(f"import: {read}, peak RSS {peak:,.0f} MiB ({lines[-2].removeprefix('fleetfit: ')})")
        print(f"median import wall {statistics.median(walls):.1f} s over {len(walls)} round(s)")
    finally:
        vm.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="mixed")
    parser.add_argument("--nodes", type=int, default=40)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--step", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--scale", action="store_true", help="time a large import instead of comparing the paths")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleetfit-bench-") as tmp:
        (scale if args.scale else agreement)(args, Path(tmp))


if __name__ == "__main__":
    main()
