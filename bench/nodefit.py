"""Rest-of-node findings priced on simulated fleets: planted against found, $ found against $ planted, and
findings on workloads where nothing was planted.

Each seed runs the demo's four planted nodes, and a fifth whose training waits on NFS bandwidth instead of its
CPUs (counted under input_starved_training), with their parameters drawn afresh (how long a step waits for its
batch, a checkpoint's size and period, a model's size and where it is read from, how often a neighbour exchanges
gradients) and a realistic fleet with nothing planted (collectors/sim/scenarios.py), through the agent's window
code and the optimizer's ingest, snapshot and findings (optimizer/decide/nodefit.py). The baseline, measured in the
same run, is what utilisation alone would say: every training under 85 % starved, every window of a service at
0 % a cold start, which is what a GPU dashboard shows.

$ planted is the GPU time the simulator's model loses, at the catalog's price: starved training, ``level x
input_wait`` of its GPUs; a synchronous save, ``level x save_s / period``; a cold start, ``load_s / restart_s x
(1 - rate / local NVMe)``. A service beside training costs latency, which no GPU price measures: its $ is not
compared.

    .venv/bin/python bench/nodefit.py [--seeds 3] [--windows 60] [--clean-nodes 16]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.protocol import Finding, FindingKind, TopicKind, WorkloadClass, encode, node_topic
from agent.simulate import offline_windows
from collectors.sim.profiles import PROFILES
from collectors.sim.scenarios import ScenarioNode, build_scenario, rest_of_node
from collectors.sim.spec import WorkloadSpec
from optimizer.decide.catalog import Catalog, load_catalog
from optimizer.decide.features import workload_features
from optimizer.decide.findings import detect
from optimizer.decide.nodefit import FINDING_KINDS, LOCAL_NVME_READ_BPS, TRAINING_BUSY_PCT, measure
from optimizer.decide.snapshot import Snapshot, from_fleet, hardware_of, resolve
from optimizer.ingest.fleet import Fleet

PREFIX = "fleetfit/v1"
KINDS = FINDING_KINDS
PLANTED_NODES = (0, 5, 9, 12)  # the demo's: llm-pretrain, the l4 node of ocr-api, llm-sft, translate-api
STARVED_NODE = 9  # llm-sft again, its loader waiting on NFS instead (storage_bound)


def redrawn(spec: WorkloadSpec, rng: random.Random) -> WorkloadSpec:
    """A planted spec with its problem's parameters drawn afresh."""
    if spec.input_wait > 0:
        return replace(spec, input_wait=rng.uniform(0.3, 0.7))
    if spec.sync_save:
        # this node's share of the model and Adam state, 16 bytes a parameter spread over the job's nodes: a 13B
        # model alone on a node (208 GB) or a 70B model over eight nodes (140 GB each), down to 50 GB
        return replace(
            spec,
            save_bytes=rng.uniform(50e9, 300e9),
            save_write_bps=rng.uniform(2e9, 8e9),
            checkpoint_period_s=rng.choice((330.0, 430.0, 530.0)),
            checkpoint_offset_s=rng.uniform(0, 100),
        )
    if spec.restart_s > 0:
        return replace(
            spec,
            weights_bytes=rng.choice((16e9, 68e9, 140e9)),  # 8B, 34B, 70B in FP16
            weights_read_bps=rng.uniform(1e9, 5e9),
            restart_s=rng.choice((190.0, 250.0, 310.0)),
            restart_offset_s=rng.uniform(0, 60),
        )
    if spec.exchange_every_s > 0:
        return replace(spec, exchange_every_s=rng.choice((25.0, 35.0, 45.0)), exchange_s=rng.uniform(8, 15))
    return spec


def storage_bound(node: ScenarioNode, rng: random.Random) -> ScenarioNode:
    """The demo's starved fine-tuning as if its loader waited on NFS instead of the CPUs: its dataset read at the
    mount's limit (1-2 GB/s), the host's CPUs at the GPUs' own level (collectors/sim/workloads.py)."""
    specs = tuple(
        replace(
            w,
            id=f"{w.id}-nfs",
            name=f"{w.name}-nfs",
            loader_cpu_bound=False,
            storage_read_bps=rng.uniform(1e9, 2e9),
            input_wait=rng.uniform(0.3, 0.7),
        )
        for w in node.workloads
    )
    return replace(node, name=f"{node.name}-nfs", workloads=specs)


def planted_nodes(seed: int) -> list[ScenarioNode]:
    rng = random.Random(f"nodefit:{seed}")
    demo = build_scenario("demo", 13, seed)
    nodes = [
        replace(n, workloads=tuple(redrawn(w, rng) for w in n.workloads)) for n in (demo[i] for i in PLANTED_NODES)
    ]
    return [*nodes, storage_bound(demo[STARVED_NODE], rng)]


def fleet_of(nodes: list[ScenarioNode], windows: int, seed: int) -> Fleet:
    fleet = Fleet(PREFIX, horizon_windows=windows)
    for node in nodes:
        birth, telemetry = offline_windows(node, windows, site="s", seed=seed)
        fleet.ingest(node_topic(PREFIX, "s", node.name, TopicKind.BIRTH), encode(birth))
        for w in telemetry:
            fleet.ingest(node_topic(PREFIX, "s", node.name, TopicKind.TELEMETRY), encode(w))
    return fleet


def snapshot_of(nodes: list[ScenarioNode], windows: int, seed: int) -> Snapshot:
    return from_fleet(fleet_of(nodes, windows, seed), "s", [])


def planted_usd(catalog: Catalog, node: ScenarioNode, spec: WorkloadSpec, kind: FindingKind) -> float | None:
    """US$ an hour the simulator's model loses to the planted problem (None: a cost in latency, not GPU time)."""
    hw = hardware_of(catalog, PROFILES[node.profile].gpu_model)
    if hw is None:
        return None
    hourly = len(spec.gpus) * hw.price_per_gpu_hour
    if kind is FindingKind.INPUT_STARVED_TRAINING:
        return hourly * spec.level * spec.input_wait
    if kind is FindingKind.CHECKPOINT_STALL:
        return hourly * spec.level * spec.save_bytes / spec.save_write_bps / spec.checkpoint_period_s
    if kind is FindingKind.SLOW_COLD_START:
        load = spec.weights_bytes / spec.weights_read_bps
        return hourly * load / spec.restart_s * (1 - spec.weights_read_bps / LOCAL_NVME_READ_BPS)
    return None


def baseline(snapshot: Snapshot) -> Counter[FindingKind]:
    """What utilisation alone flags: training under 85 % as starved, and every service that idles as starting."""
    out: Counter[FindingKind] = Counter()
    for w in snapshot.workloads:
        if w.workload_class is WorkloadClass.TRAINING and w.mean_util < TRAINING_BUSY_PCT:
            out[FindingKind.INPUT_STARVED_TRAINING] += 1
        elif w.workload_class is WorkloadClass.INFERENCE and w.mean_util < 10:
            out[FindingKind.SLOW_COLD_START] += 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--windows", type=int, default=60)
    parser.add_argument("--clean-nodes", type=int, default=16)
    args = parser.parse_args()
    catalog = load_catalog()
    planted: Counter[FindingKind] = Counter()
    found: Counter[FindingKind] = Counter()
    false: Counter[FindingKind] = Counter()
    usd_planted: dict[FindingKind, float] = dict.fromkeys(KINDS, 0.0)
    usd_found: dict[FindingKind, float] = dict.fromkeys(KINDS, 0.0)
    naive_false: Counter[FindingKind] = Counter()
    clean_workloads = 0
    reading = [0.0, 0.0]  # seconds: nodefit's measure, the features it sits beside (the baseline of its cost)
    started = time.perf_counter()
    for seed in range(1, args.seeds + 1):
        nodes = planted_nodes(seed)
        truth = {wid: (kind, node) for node in nodes for wid, kind in rest_of_node(node).items()}
        specs = {w.id: w for node in nodes for w in node.workloads}
        snapshot = snapshot_of(nodes, args.windows, seed)
        findings: list[Finding] = [f for f in detect(catalog, resolve(catalog, snapshot)) if f.kind in KINDS]
        for wid, (kind, node) in truth.items():
            planted[kind] += 1
            usd = planted_usd(catalog, node, specs[wid], kind)
            hit = next((f for f in findings if f.workload == wid and f.kind is kind), None)
            if hit is not None:
                found[kind] += 1
            if usd is not None:
                usd_planted[kind] += usd
                usd_found[kind] += hit.wasted_usd_per_hour if hit is not None else 0.0
        for f in findings:
            if truth.get(f.workload, (None,))[0] is not f.kind:
                false[f.kind] += 1
        clean = build_scenario("realistic", args.clean_nodes, seed)
        fleet = fleet_of(clean, args.windows, seed)
        t0 = time.perf_counter()
        measure(fleet, "s")
        t1 = time.perf_counter()
        workload_features(fleet, "s")
        reading[0] += t1 - t0
        reading[1] += time.perf_counter() - t1
        clean_snapshot = from_fleet(fleet, "s", [])
        clean_workloads += len(clean_snapshot.workloads)
        for f in detect(catalog, resolve(catalog, clean_snapshot)):
            if f.kind in KINDS:
                false[f.kind] += 1
        naive_false += baseline(clean_snapshot)
    print(f"{args.seeds} seed(s), {args.windows} windows a node, {clean_workloads} workloads in clean fleets")
    print(f"{'kind':24} {'planted':>7} {'found':>6} {'$ found / $ planted':>20} {'false':>6} {'false, util only':>17}")
    for kind in KINDS:
        ratio = f"{usd_found[kind] / usd_planted[kind]:.2f}" if usd_planted[kind] else "latency"
        print(
            f"{kind.value:24} {planted[kind]:7d} {found[kind]:6d} {ratio:>20} {false[kind]:6d} {naive_false[kind]:17d}"
        )
    print(
        f"reading the clean fleets: nodefit {reading[0] * 1000:.0f} ms, workload features {reading[1] * 1000:.0f} ms "
        f"({reading[0] / reading[1]:.2f}x)"
    )
    print(f"in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
