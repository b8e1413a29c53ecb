"""Classification of simulated fleets where the money is: idle allocations on nodes that send traffic of their own,
batch inference apart from training, and whole scenarios with every process named ``python3``."""

from __future__ import annotations

import math
import random

import pytest
from conftest import FLEET_PREFIX, simulated_fleet

from agent.protocol import TopicKind, WorkloadClass, encode, node_topic
from agent.simulate import offline_windows
from collectors.sim.scenarios import ScenarioNode
from collectors.sim.spec import Pattern, WorkloadSpec
from collectors.sim.workloads import Background
from optimizer.commands.offline import PATTERN_CLASS, score
from optimizer.decide.classify import classify
from optimizer.decide.features import WorkloadFeatures, gpu_lockstep, workload_features
from optimizer.ingest.fleet import Fleet

# A chatty node: 0.9 MB/s of logs shipped, 0.5 MB of exporters scraped every 15 s, kubelet, journald.
LOUD = Background(
    logs_bps=0.9e6, scrape_bytes=0.5e6, scrape_s=15.0, scrape_offset=3.0, control_bps=20e3, journal_bps=0.8e6
)


def spec(wid: str, pattern: Pattern, gpus: tuple[int, ...], **fields: object) -> WorkloadSpec:
    base: dict[str, object] = {"hint": "python3", "level": 0.9, "mem_fraction": 0.5, "noise": 1.5}
    return WorkloadSpec(id=wid, name=wid, pattern=pattern, gpus=gpus, **(base | fields))  # type: ignore[arg-type]


def fleet_of(nodes: list[ScenarioNode], windows: int = 30) -> list[WorkloadFeatures]:
    fleet = Fleet(FLEET_PREFIX, horizon_windows=60)
    for node in nodes:
        birth, telemetry = offline_windows(node, windows, site="s", seed=3)
        fleet.ingest(node_topic(FLEET_PREFIX, "s", node.name, TopicKind.BIRTH), encode(birth))
        for w in telemetry:
            fleet.ingest(node_topic(FLEET_PREFIX, "s", node.name, TopicKind.TELEMETRY), encode(w))
    return workload_features(fleet, "s")


def node(name: str, profile: str, *workloads: WorkloadSpec, schema: int = 2) -> ScenarioNode:
    return ScenarioNode(name, profile, workloads, frozenset(), schema=schema, background=LOUD)


HELD = spec("k8s/held", Pattern.IDLE, (0, 1, 2, 3))  # 40 GB of each A100 80 GB held, nothing run


@pytest.mark.parametrize("schema", [1, 2])
@pytest.mark.parametrize(
    "layout",
    ["alone, no node without workloads", "alone, beside an empty node", "beside busy batch encoding"],
)
def test_an_idle_allocation_on_a_chatty_node_is_idle(schema: int, layout: str) -> None:
    nodes = [node("a100-1", "a100", HELD, schema=schema)]
    if layout == "alone, beside an empty node":
        nodes.append(ScenarioNode("l40s-1", "l40s", (), frozenset(), background=LOUD))
    if layout == "beside busy batch encoding":
        encoder = spec("k8s/enc", Pattern.EMBEDDING_BATCH, (4, 5, 6, 7), input_bps=40e6, output_bps=20e6)
        nodes = [node("a100-1", "a100", HELD, encoder, schema=schema)]
    (held,) = [f for f in fleet_of(nodes) if f.id == HELD.id]
    assert held.egress_bps < 20e3  # the node's 1 MB/s is its own, not the allocation's
    result = classify(held)
    assert result.workload_class is WorkloadClass.IDLE and result.confidence >= 0.6, result


def test_the_node_baseline_is_measured_in_windows_without_gpu_work() -> None:
    (held,) = fleet_of([node("a100-1", "a100", HELD)])
    assert held.baseline_from == "node"
    # LOUD sends 0.9 MB/s of logs, 20 KB/s to the API server and 0.5 MB per 15 s of scrapes, and takes in ~50 KB/s:
    # about 1 MB/s, per GPU of an 8-GPU A100 node
    assert held.front_baseline_bps == pytest.approx(1.0e6 / 8, rel=0.15)


def test_a_quiet_service_with_clients_on_a_chatty_node_is_still_a_service() -> None:
    """At its nightly trough (a tenth of its peak) a service runs a little work every second for its clients."""
    trough = -math.pi / 2  # sin() at its minimum when the simulation starts
    service = spec(
        "k8s/api", Pattern.INFERENCE, (0, 1), level=0.15, diurnal_phase=trough, listen_ports=(8000,), peers=12
    )
    (api,) = fleet_of([node("l4-1", "l4", service)])
    assert api.mean_util < 2 and api.p95_util < 10
    assert classify(api).workload_class is WorkloadClass.INFERENCE


def test_a_trickle_of_work_keeps_a_quiet_service_out_of_reclaim_without_any_facts() -> None:
    trough = -math.pi / 2
    # responses of a few KB, lost in the node's own traffic, which cannot be measured: the node is never quiet
    service = spec("k8s/api", Pattern.INFERENCE, (0, 1), level=0.15, diurnal_phase=trough, client_scale=0.001)
    (api,) = fleet_of([node("l4-1", "l4", service, schema=1)])
    assert api.mean_util < 2 and api.p95_util < 10 and api.zero_seconds < 0.8
    assert api.front_baseline_bps is None
    assert classify(api).workload_class is not WorkloadClass.IDLE


def test_batch_encoding_on_independent_replicas_is_batch_without_names() -> None:
    encoder = spec(
        "k8s/enc", Pattern.EMBEDDING_BATCH, (0, 1, 2, 3), stall_rate=0.01, stall_seconds=(1.0, 4.0),
        input_bps=60e6, output_bps=40e6, power_intensity=0.9, tensor_share=0.55, dram_share=0.35,
    )  # fmt: skip
    training = spec("k8s/ddp", Pattern.TRAINING, (0, 1, 2, 3), stall_rate=0.01, stall_seconds=(5.0, 15.0))
    (enc,) = fleet_of([node("h100-1", "h100", encoder)], windows=36)
    (ddp,) = fleet_of([node("h100-2", "h100", training)], windows=36)
    assert enc.lockstep is not None and enc.lockstep <= 0.3  # each replica dips on its own
    assert ddp.lockstep is not None and ddp.lockstep >= 0.7  # ranks stall together
    assert classify(enc).workload_class is WorkloadClass.BATCH_INFERENCE
    assert classify(ddp).workload_class is WorkloadClass.TRAINING


def test_lockstep_is_the_correlation_of_each_gpu_with_the_others() -> None:
    rng = random.Random(2)
    common = [rng.choice((95.0, 95.0, 95.0, 10.0)) for _ in range(300)]
    together = {g: [v + rng.gauss(0, 1) for v in common] for g in range(4)}
    apart = {g: [rng.choice((95.0, 95.0, 95.0, 10.0)) for _ in range(300)] for g in range(4)}
    flat = {g: [97.0 + rng.gauss(0, 1) for _ in range(300)] for g in range(4)}
    assert (gpu_lockstep(together) or 0) > 0.9
    assert abs(gpu_lockstep(apart) or 1) < 0.2
    assert gpu_lockstep(flat) is None  # noise around 97 % says nothing
    assert gpu_lockstep({0: common}) is None


@pytest.mark.parametrize(("scenario", "seed"), [("mixed", 41), ("hard", 42), ("demo", 43)])
def test_scenarios_without_names_are_classified_by_behaviour(scenario: str, seed: int) -> None:
    """Every process python3 with no program: only behaviour is left to tell workloads apart."""
    fleet, truth = simulated_fleet(scenario, 12, windows=36, seed=seed, names=False)
    pairs, confident_wrong = [], []
    for f in workload_features(fleet, "s1"):
        result = classify(f)
        expected = PATTERN_CLASS[truth[f.id].value]
        pairs.append((expected, result.workload_class))
        if result.workload_class is not expected and result.confidence >= 0.6:
            confident_wrong.append((f.name, result))
    assert not confident_wrong
    assert score(pairs).macro_f1 >= 0.9, score(pairs)


def test_sockets_not_read_are_not_taken_for_no_clients() -> None:
    """An agent that reports its pod's traffic but did not read its sockets says nothing about clients; zero
    connections read from the table say a busy workload is no server."""
    encoder = spec("k8s/enc", Pattern.EMBEDDING_BATCH, (0, 1), input_bps=40e6, output_bps=20e6)
    scenario = node("h100-1", "h100", encoder)
    fleet = Fleet(FLEET_PREFIX, horizon_windows=60)
    birth, telemetry = offline_windows(scenario, 12, site="s", seed=3)
    fleet.ingest(node_topic(FLEET_PREFIX, "s", "h100-1", TopicKind.BIRTH), encode(birth))
    unread = {"inbound_connections": None, "inbound_peers": None}
    for w in telemetry:
        stripped = w.model_copy(update={"workloads": [r.model_copy(update=unread) for r in w.workloads]})
        fleet.ingest(node_topic(FLEET_PREFIX, "s", "h100-1", TopicKind.TELEMETRY), encode(stripped))
    (f,) = workload_features(fleet, "s")
    assert f.own_network and f.inbound_connections is None
    (read,) = fleet_of([scenario], windows=12)
    assert read.inbound_connections == 0


def test_a_save_burst_beside_a_busy_server_is_the_fine_tuning_jobs() -> None:
    """A continuous-batching server computes as steadily as training, but a server writes logs, not checkpoints."""
    adapter = spec(
        "k8s/lora", Pattern.LORA_FINE_TUNING, (0,), level=0.8, power_intensity=0.9, save_bytes=120e6,
        checkpoint_period_s=120.0, stall_rate=0.0,
    )  # fmt: skip
    server = spec(
        "k8s/chat", Pattern.LLM_SERVING, (1, 2, 3, 4), mem_fraction=0.9, rps_peak=30.0, request_s=10.0,
        diurnal_phase=math.pi / 2, listen_ports=(8000,), peers=20,
    )  # fmt: skip
    features = {f.id: f for f in fleet_of([node("l40s-1", "l40s", adapter, server)], windows=36)}
    assert features["k8s/lora"].write_bursts >= 2 and features["k8s/chat"].write_bursts == 0
    assert classify(features["k8s/lora"]).workload_class is WorkloadClass.TRAINING
    assert classify(features["k8s/chat"]).workload_class is WorkloadClass.INFERENCE


@pytest.mark.parametrize("schema", [1, 2])
def test_two_adapter_fine_tunings_on_one_node_share_its_save_bursts(schema: int) -> None:
    """Node-level disks cannot tell which of two steady jobs saved; each is as likely, and both are training. With
    each job's own writes (schema 2) each save is its own job's: sampled at 1 to 360 s, the first saves at 120, 240
    and 360 s, the second at 150 and 300 s."""

    def adapter(wid: str, gpu: int, period: float) -> WorkloadSpec:
        return spec(
            wid, Pattern.LORA_FINE_TUNING, (gpu,), level=0.8, power_intensity=0.9, save_bytes=120e6,
            checkpoint_period_s=period, stall_rate=0.0,
        )  # fmt: skip

    pair = node("l40s-1", "l40s", adapter("k8s/a", 0, 120.0), adapter("k8s/b", 1, 150.0), schema=schema)
    features = fleet_of([pair], windows=36)
    for f in features:
        if schema == 1:
            assert f.write_bursts == 0 and f.shared_bursts >= 1, f
        else:
            assert f.write_bursts == {"k8s/a": 3, "k8s/b": 2}[f.id] and f.shared_bursts == 0, f
        assert classify(f).workload_class is WorkloadClass.TRAINING, classify(f)
