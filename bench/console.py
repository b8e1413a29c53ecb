"""The console at fleet scale: 2,000 nodes and 5,000 workloads, each with a day of history digests.

Serves the console on a free port and times every page over HTTP (first request: caches cold; then the median
of warm requests), beside ``/healthz`` as the baseline (the cost of a request that does nothing), and prints
each page's size. The target: every page in <= 300 ms, <= 300 KB.

    .venv/bin/python bench/console.py [--nodes 2000] [--workloads 5000] [--rounds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections import deque
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import free_port

from agent.config import MqttSettings
from agent.protocol import (
    Birth,
    Blocked,
    Finding,
    FindingKind,
    GpuInfo,
    Plan,
    Recommendation,
    SolverReport,
    Telemetry,
    TopicKind,
    WorkloadClass,
    WorkloadKind,
    WorkloadRef,
    WorkloadView,
    encode,
    node_topic,
)
from optimizer.decide.catalog import load_catalog
from optimizer.ingest.history import DIGEST_SECONDS, DIGESTS_KEPT, Digest
from optimizer.serve.config import ApiSettings, OptimizerConfig
from optimizer.serve.lifecycle import Lifecycle
from optimizer.serve.service import Optimizer
from optimizer.serve.web.app import WebServer

PREFIX = "fleetfit/v1"
SITES = ("east", "west")
MODELS = (
    ("NVIDIA H100 80GB HBM3", 81559),
    ("NVIDIA L40S", 46068),
    ("NVIDIA L4", 23034),
    ("NVIDIA A100-SXM4-80GB", 81920),
)
HARDWARE = {
    "NVIDIA H100 80GB HBM3": "H100 80GB SXM",
    "NVIDIA L40S": "L40S 48GB",
    "NVIDIA L4": "L4 24GB",
    "NVIDIA A100-SXM4-80GB": "A100 80GB SXM",
}
CLASSES = (WorkloadClass.TRAINING, WorkloadClass.INFERENCE, WorkloadClass.BATCH_INFERENCE, WorkloadClass.IDLE)


def build(optimizer: Optimizer, nodes: int, workloads: int, rng: random.Random) -> None:
    now = time.time()
    per_node = [workloads // nodes + (1 if i < workloads % nodes else 0) for i in range(nodes)]
    views: dict[str, list[WorkloadView]] = {s: [] for s in SITES}
    findings: dict[str, list[Finding]] = {s: [] for s in SITES}
    for i in range(nodes):
        site, name = SITES[i % len(SITES)], f"gpu-{i:05d}"
        model, mem = MODELS[i % len(MODELS)]
        gpus = [GpuInfo(index=g, uuid=f"GPU-{i}-{g}", model=model, memory_mib=mem) for g in range(8)]
        birth = Birth(node=name, site=site, session=1, agent_version="bench", hostname=name, timestamp=now, gpus=gpus)
        optimizer.fleet.ingest(node_topic(PREFIX, site, name, TopicKind.BIRTH), encode(birth))
        refs = []
        for w in range(per_node[i]):
            share = 8 // max(per_node[i], 1)
            refs.append(
                WorkloadRef(
                    id=f"k8s/{i:05d}-{w}",
                    kind=WorkloadKind.KUBERNETES_POD,
                    name=f"svc-{i:05d}-{w}",
                    gpus=list(range(w * share, (w + 1) * share)),
                    owner=f"team-{rng.randrange(40):02d}",
                )
            )
        window = Telemetry(node=name, site=site, session=1, seq=0, start=now - 10, end=now, samples=10, workloads=refs)
        optimizer.fleet.ingest(node_topic(PREFIX, site, name, TopicKind.TELEMETRY), encode(window))
        record = optimizer.fleet.record(site, name)
        assert record is not None
        for ref in refs:
            level = rng.uniform(5, 95)
            record.history.digests[ref.id] = deque(
                (
                    Digest(now - (DIGESTS_KEPT - k) * DIGEST_SECONDS, level, min(level * 1.2, 100), mem * 0.5)
                    for k in range(DIGESTS_KEPT)
                ),
                maxlen=DIGESTS_KEPT,
            )
            cls = CLASSES[rng.randrange(len(CLASSES))]
            view = WorkloadView(
                id=ref.id,
                name=ref.name,
                workload_class=cls,
                confidence=0.9,
                nodes=[name],
                hardware=HARDWARE[model],
                gpus=len(ref.gpus),
                mean_util=level,
            )
            views[site].append(view)
            if rng.random() < 0.1:
                findings[site].append(
                    Finding(
                        workload=ref.id,
                        workload_name=ref.name,
                        kind=FindingKind.IDLE_ALLOCATION,
                        hardware=view.hardware,
                        nodes=[name],
                        wasted_usd_per_hour=rng.uniform(1, 9),
                        confidence=0.9,
                        detail="held at low utilisation",
                    )
                )
    for site in SITES:
        recs = [
            Recommendation(
                id=f"{site}-{n:04d}",
                workload=v.id,
                workload_name=v.name,
                workload_class=v.workload_class,
                confidence=0.9,
                gpus=max(v.gpus, 1),
                from_node=v.nodes[0],
                from_hardware=v.hardware,
                to_node="gpu-00001",
                to_hardware="L40S 48GB",
                monthly_savings_usd=rng.uniform(100, 9000),
                reason="cheaper",
                performance_impact="none",
                risk="low",
            )
            for n, v in enumerate(views[site][:20])
        ]
        blocked = [
            Blocked(
                workload=v.id,
                workload_name=v.name,
                node=v.nodes[0],
                hardware=v.hardware,
                reason="no free L40S 48GB capacity in site " + site,
                monthly_savings_usd=500.0,
            )
            for v in views[site][20:120]
        ]
        plan = Plan(
            site=site,
            generated_at=now,
            solver=SolverReport(status="OPTIMAL", objective=0, best_bound=0, gap=0, solve_seconds=1),
            workloads=views[site],
            findings=findings[site],
            recommendations=recs,
            blocked=blocked,
            monthly_savings_usd=sum(r.monthly_savings_usd for r in recs),
        )
        optimizer.plans[site] = plan
        assert optimizer.tracker is not None
        optimizer.tracker.lifecycle.record(plan, {})
    optimizer.plans_made += 1


async def time_page(http: aiohttp.ClientSession, url: str) -> tuple[float, int]:
    started = time.perf_counter()
    async with http.get(url) as r:
        body = await r.read()
        assert r.status == 200 or url.endswith("/healthz"), (url, r.status)  # no broker here: 503
    return time.perf_counter() - started, len(body)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--workloads", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as state:
        config = OptimizerConfig(mqtt=MqttSettings(port=free_port()))
        optimizer = Optimizer(config, load_catalog(), lifecycle=Lifecycle.in_state_dir(Path(state)))
        t0 = time.perf_counter()
        build(optimizer, args.nodes, args.workloads, random.Random(1))
        print(
            f"fleet: {args.nodes} nodes, {args.workloads} workloads, {DIGESTS_KEPT} digests each "
            f"(built in {time.perf_counter() - t0:.1f} s)"
        )
        server = WebServer(optimizer, ApiSettings(port=0))
        await server.start()
        base = f"http://127.0.0.1:{server.port}"
        some = next(iter(optimizer.plans.values())).workloads[0].id
        pages = ["/healthz", "/", "/recommendations", "/findings", f"/workload?id={some}", "/owners"]
        try:
            async with aiohttp.ClientSession() as http:
                cold = await time_page(http, base + "/")  # right after start: waits for the first overview
                first = {p: await time_page(http, base + p) for p in pages}
                optimizer.plans_made += 1  # a new plan: the overview is refreshed off the loop meanwhile
                after_plan = await time_page(http, base + "/")
                warm: dict[str, list[float]] = {p: [] for p in pages}
                for _ in range(args.rounds):
                    for p in pages:
                        warm[p].append((await time_page(http, base + p))[0])
        finally:
            await server.stop()
        baseline = statistics.median(warm["/healthz"])
        print(f"{'page':24} {'first ms':>9} {'median ms':>10} {'x healthz':>10} {'KB':>7}")
        for p in pages:
            med = statistics.median(warm[p])
            print(
                f"{p[:24]:24} {first[p][0] * 1000:9.1f} {med * 1000:10.1f} {med / baseline:10.1f} "
                f"{first[p][1] / 1000:7.1f}"
            )
        worst = max(max(first[p][0], statistics.median(warm[p])) for p in pages)
        heaviest = max(first[p][1] for p in pages)
        print(f"overview right after start (computing the first day trend): {cold[0] * 1000:.0f} ms")
        print(f"overview just after a new plan (the previous one served meanwhile): {after_plan[0] * 1000:.0f} ms")
        print(f"slowest page once started {worst * 1000:.0f} ms (target 300), heaviest {heaviest / 1000:.0f} KB (300)")


if __name__ == "__main__":
    asyncio.run(main())
