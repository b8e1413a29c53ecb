"""The fleet simulator: statistical signatures per pattern, reproducibility, scenarios, and labels kept out of
published payloads."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics

from conftest import MosquittoServer, wait_until

from agent.clock import Clock
from agent.protocol import encode
from agent.simulate import ManualClock, SimulatedFleet, offline_windows
from collectors.base import Entity, Sample
from collectors.sim.node import SimulatedNode
from collectors.sim.profiles import PROFILES
from collectors.sim.scenarios import SCENARIOS, ScenarioNode, build_scenario
from collectors.sim.spec import Pattern, WorkloadSpec


def _spec(pattern: Pattern, gpus: int = 8, **kw: object) -> WorkloadSpec:
    base: dict[str, object] = {
        "id": "w",
        "name": "w",
        "pattern": pattern,
        "gpus": tuple(range(gpus)),
        "hint": "x",
        "level": 0.9,
        "mem_fraction": 0.8,
    }
    base.update(kw)
    return WorkloadSpec(**base)  # type: ignore[arg-type]


def _run(node: SimulatedNode, clock: ManualClock, seconds: int, step: float = 1.0) -> list[list[Sample]]:
    out = []
    for _ in range(int(seconds / step)):
        clock.now += step
        out.append(node.sample())
    return out


def _rate(samples: list[list[Sample]], entity: Entity, prefix: str, field: str) -> list[float]:
    """Per-second rate of a counter summed over the entities whose key starts with ``prefix``."""
    totals = [
        sum(s.counters.get(field, 0) for s in tick if s.entity is entity and s.key.startswith(prefix))
        for tick in samples
    ]
    return [b - a for a, b in itertools.pairwise(totals)]


def test_training_is_synchronised_busy_and_checkpoints_on_schedule() -> None:
    clock = ManualClock()
    spec = _spec(
        Pattern.TRAINING, level=0.9, checkpoint_period_s=120.0, checkpoint_seconds=10.0, multi_node=True, stall_rate=0.0
    )
    node = SimulatedNode("n", PROFILES["h100"], [spec], clock, seed=4)
    ticks = _run(node, clock, 600)
    utils = [[s.gauges["util"] for s in t if s.entity is Entity.GPU] for t in ticks]
    means = [statistics.fmean(u) for u in utils]
    assert 85 <= statistics.fmean(means) <= 95
    assert statistics.fmean(max(u) - min(u) for u in utils) < 8  # GPUs in lockstep
    writes = _rate(ticks, Entity.DISK, "nvme", "write_bps")
    starts = [i for i in range(1, len(writes)) if writes[i] > 1e9 and writes[i - 1] < 1e9]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps and all(abs(g - 120) <= 1 for g in gaps), gaps
    east = statistics.fmean(_rate(ticks, Entity.NIC, "ib", "tx_bps"))
    north = statistics.fmean(_rate(ticks, Entity.NIC, "eth", "tx_bps"))
    assert east > 10e9 and east > 50 * north  # all-reduce on the fabric, little front-end traffic
    assert statistics.fmean(_rate(ticks, Entity.GPU, "0", "nvlink_tx_bps")) > 50e9


def test_online_inference_follows_a_tenfold_daily_cycle_north_south() -> None:
    clock = ManualClock()
    spec = _spec(Pattern.INFERENCE, level=0.35, burst_sigma=0.3, diurnal_phase=0.0)
    node = SimulatedNode("n", PROFILES["l40s"], [spec], clock, seed=2)
    ticks = _run(node, clock, 86_400, step=60.0)  # a day, once a minute
    load = [statistics.fmean(s.gauges["util"] for s in t if s.entity is Entity.GPU) for t in ticks]
    hourly = [statistics.fmean(load[h * 60 : (h + 1) * 60]) for h in range(24)]
    assert max(hourly) < 40
    assert 7 <= max(hourly) / min(hourly) <= 14, hourly
    north = _rate(ticks, Entity.NIC, "eth", "tx_bps")
    busiest, quietest = hourly.index(max(hourly)), hourly.index(min(hourly))
    assert statistics.fmean(north[busiest * 60 : busiest * 60 + 59]) > 5 * statistics.fmean(
        north[quietest * 60 : quietest * 60 + 59]
    )
    assert sum(_rate(ticks, Entity.NIC, "ib", "tx_bps")) == 0  # L40S nodes have no fabric, inference needs none


def test_batch_inference_is_busy_without_gradients_or_checkpoints() -> None:
    clock = ManualClock()
    node = SimulatedNode("n", PROFILES["h100"], [_spec(Pattern.BATCH_INFERENCE, level=0.85)], clock, seed=1)
    ticks = _run(node, clock, 300)
    util = statistics.fmean(s.gauges["util"] for t in ticks for s in t if s.entity is Entity.GPU)
    assert 80 <= util <= 90
    assert max(_rate(ticks, Entity.DISK, "nvme", "write_bps")) == 0
    assert max(_rate(ticks, Entity.GPU, "0", "nvlink_tx_bps")) == 0


def test_same_seed_same_fleet_other_seed_other_fleet() -> None:
    def payloads(seed: int) -> list[bytes]:
        node = build_scenario("mixed", 6, seed=seed)[0]
        birth, windows = offline_windows(node, 3, seed=seed)
        return [encode(birth)] + [encode(w) for w in windows]

    assert payloads(7) == payloads(7)
    assert payloads(7) != payloads(8)
    assert [n.workloads for n in build_scenario("hard", 12, 3)] == [n.workloads for n in build_scenario("hard", 12, 3)]


def test_scenarios() -> None:
    for name in SCENARIOS:
        nodes = build_scenario(name, 50, seed=1)
        assert len({n.name for n in nodes}) == len(nodes)
    mixed = build_scenario("mixed", 100, seed=1)
    workloads = [w for n in mixed for w in n.workloads]
    misplaced = [w for n in mixed for w in n.workloads if w.id in n.misplaced]
    assert 0.12 <= len(misplaced) / len(workloads) <= 0.3
    assert not any(n.misplaced for n in build_scenario("well-placed", 100, seed=1))
    hard = {w.name for n in build_scenario("hard", 60, seed=1) for w in n.workloads}
    assert {"stalling-pretrain", "peak-serving", "batch-on-h100"} <= hard
    heavy = [w.pattern for n in build_scenario("training-heavy", 60, seed=1) for w in n.workloads]
    assert heavy.count(Pattern.TRAINING) > len(heavy) / 2


async def test_published_payloads_carry_no_ground_truth(mosquitto: MosquittoServer, prefix: str) -> None:
    import aiomqtt

    mqtt = mosquitto.settings(prefix)
    received: list[bytes] = []
    async with aiomqtt.Client(mosquitto.host, mosquitto.port) as client:
        await client.subscribe(f"{prefix}/#", qos=1)

        async def pump() -> None:
            async for m in client.messages:
                received.append(bytes(m.payload))  # type: ignore[arg-type]

        task = asyncio.create_task(pump())
        stop = asyncio.Event()
        fleet = SimulatedFleet(build_scenario("hard", 6, seed=2), mqtt, clock=Clock(20.0))
        run = asyncio.create_task(fleet.run(stop))
        await wait_until(lambda: sum(b'"seq"' in p for p in received) >= 12, 30, "windows")
        stop.set()
        await run
        task.cancel()
    truth = {p.value for p in Pattern} | {"misplaced", "label", "pattern"}
    for payload in received:
        keys = json.dumps(json.loads(payload))
        assert not any(f'"{word}"' in keys for word in truth), keys[:300]


def test_a_workload_in_the_hosts_network_namespace_has_sockets_but_no_counters_of_its_own() -> None:
    """Slurm jobs and host-network pods share the node's namespace: the agent reads their listening sockets and
    clients, but the only traffic counters are the node's."""
    server = _spec(Pattern.LLM_SERVING, gpus=2, listen_ports=(8000,), peers=12, program="vllm")
    windows = {}
    for quirks in (frozenset(), frozenset({"host_network"})):
        node = ScenarioNode("n", "h100", (server,), frozenset(), quirks, schema=2)
        _, ws = offline_windows(node, 4, seed=3)
        windows[bool(quirks)] = [w.workloads[0] for w in ws[1:]]
    assert all(w.net_tx_bps is not None and w.listen_ports == [8000] for w in windows[False])
    assert all(w.net_tx_bps is None and w.net_rx_bps is None for w in windows[True])
    assert all(w.listen_ports == [8000] and (w.inbound_connections or 0) >= 1 for w in windows[True])
