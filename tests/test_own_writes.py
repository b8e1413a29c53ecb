"""A workload's own storage writes (schema 2: its processes' /proc/<pid>/io, or its pod's cAdvisor counters) tell
a fine-tuning job's saves from the results a batch job beside it writes steadily, which the node's disks mix.

The node is an 8-GPU A100 server as the simulator runs it (collectors/sim/workloads.py): a LoRA fine-tuning job
on one GPU saving a 120 MB adapter every 120 s, and batch encoding on four GPUs writing its embeddings at
38 MB/s, flushed by the page cache every 5 s (190 MB at a time). The adapter save (120 MB in one second) is below
any second the encoder's flushes write, so nothing on the node's disks shows it."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import FLEET_PREFIX

from agent.protocol import TopicKind, WorkloadClass, encode, node_topic
from agent.simulate import offline_windows
from collectors.sim.scenarios import ScenarioNode
from collectors.sim.spec import Pattern, WorkloadSpec
from optimizer.decide import features
from optimizer.decide.classify import classify
from optimizer.decide.features import OWN_SAVE_BYTES, WorkloadFeatures, _own_saves, workload_features
from optimizer.ingest.fleet import Fleet

WINDOWS = 36  # six minutes, sampled at 1 to 360 s: saves at 120, 240 and 360 s


def spec(wid: str, pattern: Pattern, gpus: tuple[int, ...], **fields: object) -> WorkloadSpec:
    base: dict[str, object] = {"hint": "python3", "level": 0.85, "mem_fraction": 0.5, "noise": 1.5}
    return WorkloadSpec(id=wid, name=wid, pattern=pattern, gpus=gpus, **(base | fields))  # type: ignore[arg-type]


ADAPTER = spec(
    "k8s/lora", Pattern.LORA_FINE_TUNING, (0,), level=0.8, power_intensity=0.9, save_bytes=120e6,
    checkpoint_period_s=120.0, stall_rate=0.0,
)  # fmt: skip
ENCODER = spec(
    "k8s/embed", Pattern.EMBEDDING_BATCH, (3, 4, 5, 6), input_bps=40e6, output_bps=38e6, power_intensity=0.85,
    tensor_share=0.55, dram_share=0.4,
)  # fmt: skip


def features_of(schema: int) -> dict[str, WorkloadFeatures]:
    node = ScenarioNode("a100-1", "a100", (ADAPTER, ENCODER), frozenset(), schema=schema)
    fleet = Fleet(FLEET_PREFIX, horizon_windows=60)
    birth, telemetry = offline_windows(node, WINDOWS, site="s", seed=5)
    fleet.ingest(node_topic(FLEET_PREFIX, "s", node.name, TopicKind.BIRTH), encode(birth))
    for w in telemetry:
        fleet.ingest(node_topic(FLEET_PREFIX, "s", node.name, TopicKind.TELEMETRY), encode(w))
    return {f.id: f for f in workload_features(fleet, "s")}


def test_an_adapter_save_beside_steady_results_is_the_fine_tuning_jobs() -> None:
    """With each workload's own writes, the adapter's three saves are its own and the encoder's steady writes its
    own: one is training, the other batch, both at acting confidence. Deliberate bugs caught: a window's own
    writes ignored in favour of the node's bursts (the adapter reads no save and stays unknown), and the
    encoder's writes still shared by load across the node (its steady results fall to the adapter too)."""
    seen = features_of(schema=2)
    adapter, encoder = seen["k8s/lora"], seen["k8s/embed"]
    assert adapter.own_writes and encoder.own_writes
    assert adapter.write_bursts == 3, adapter
    assert encoder.write_bursts == 0, encoder
    # 38 MB/s over its four GPUs, per GPU as write_bps counts it: ~9.5 MB/s (the simulator's 15 % jitter aside)
    assert 7e6 <= encoder.write_bps <= 12e6, encoder.write_bps
    assert adapter.write_bps < 1e6, adapter.write_bps  # its median window has no save in it
    lora, batch = classify(adapter), classify(encoder)
    assert lora.workload_class is WorkloadClass.TRAINING and lora.confidence >= 0.6, lora
    assert batch.workload_class is WorkloadClass.BATCH_INFERENCE and batch.confidence >= 0.6, batch


def test_without_its_own_writes_the_adapter_save_is_hidden_by_its_neighbour() -> None:
    """An agent before schema 2 sends only the node's disks: the encoder's flushes hide the adapter's saves, so
    the adapter is not taken for training at acting confidence (and nothing of the encoder is called a save)."""
    seen = features_of(schema=1)
    adapter = seen["k8s/lora"]
    assert not adapter.own_writes and adapter.write_bursts == 0
    result = classify(adapter)
    assert result.workload_class is not WorkloadClass.TRAINING or result.confidence < 0.6, result


@dataclass(frozen=True)
class Io:
    workload: str
    disk_read_bps: float | None
    disk_write_bps: float | None


def windows_of(writes: list[float], seconds: float = 10.0) -> list[Any]:
    """Windows of ``seconds`` in which one workload wrote ``writes`` bytes/s (its own counts), as the digest keeps
    them: only the fields the save rule reads."""
    return [
        SimpleNamespace(start=i * seconds, end=(i + 1) * seconds, volatile=[Io("k8s/w", 0.0, bps)])
        for i, bps in enumerate(writes)
    ]


@pytest.mark.parametrize(
    ("bytes_in_window", "usual_bps", "saved"),
    [
        (31e6, 0.0, True),  # an adapter's save over a trickle of logs
        (29e6, 0.0, False),  # under the 30 MB a save is counted from
        (8.1 * 1e6 * 10, 1e6, True),  # 8.1x its usual window
        (7.9 * 1e6 * 10, 1e6, False),  # 7.9x: results written faster for a while, not a save
    ],
)
def test_a_save_is_30_mb_or_more_and_8x_its_usual_window(bytes_in_window: float, usual_bps: float, saved: bool) -> None:
    """Deliberate bugs caught: the 30 MB floor moved to 32 MB or 28 MB (the first two rows), the factor over its
    usual window moved from 8 to 7.5 or 8.5 (the last two), and the window's bytes taken as its rate (a 10 s
    window's 31 MB read as 3.1 MB)."""
    assert OWN_SAVE_BYTES == 30e6
    writes = [usual_bps] * 9 + [bytes_in_window / 10.0]
    seen = _own_saves(windows_of(writes))["k8s/w"]
    assert seen[9][2] is saved
    assert not any(seen[i][2] for i in range(9))


def test_a_window_without_its_own_counts_is_not_a_measured_zero() -> None:
    """An agent that could not read /proc/<pid>/io for a window (EACCES, the process gone) sends nothing for it:
    that window is left to the node's disks, not taken for a window that wrote nothing. Deliberate bug caught: a
    missing reading counted as 0 B/s, which would halve the usual window and turn ordinary writes into saves."""
    windows = windows_of([5e6] * 6)
    windows[2] = SimpleNamespace(start=20.0, end=30.0, volatile=[Io("k8s/w", None, None)])
    seen = _own_saves(windows)["k8s/w"]
    assert 2 not in seen and not any(v[2] for v in seen.values())


def test_steady_own_writes_on_a_shared_node_are_what_batch_alone_does() -> None:
    """Results written steadily are batch's own evidence where they are the workload's (its processes' counts),
    whatever share of the node's GPU work it does; shared out of the node's disks by load they are not. Its pod's
    write counters come from cAdvisor where no socket was read (the Prometheus import), so no client facts here.
    Deliberate bug caught: _defining(BAT) without the own-writes clause (the first case holds at 0.55)."""
    base = features_of(schema=2)["k8s/embed"]
    shared = replace(base, node_share=0.4, inbound_connections=None, inbound_peers=None, listen_ports=())
    assert classify(shared).workload_class is WorkloadClass.BATCH_INFERENCE, classify(shared)
    assert classify(shared).confidence >= 0.6, classify(shared)
    # the same figures read from the node's disks, with the job doing under three quarters of its GPU work
    guess = replace(shared, own_writes=False)
    assert not (classify(guess).workload_class is WorkloadClass.BATCH_INFERENCE and classify(guess).confidence >= 0.6)


def test_a_save_uploaded_to_object_storage_is_still_a_save() -> None:
    """A training job that uploads its checkpoints to object storage writes nothing to disk (its /proc/<pid>/io
    counts no socket), but the upload leaves by the front end as a burst: with its own storage counts known, that
    burst is still its save. 8 GPUs saving 20 GB every 120 s at 2 GB/s, alone on its node. Deliberate bug caught:
    a workload with its own counts judged by them alone (no save seen, and its class left to the rest)."""
    trainer = spec(
        "k8s/pretrain", Pattern.TRAINING, tuple(range(8)), level=0.93, power_intensity=0.9, save_bytes=20e9,
        checkpoint_period_s=120.0, save_to_network=True, input_bps=0.2e9,
    )  # fmt: skip
    node = ScenarioNode("h100-1", "h100", (trainer,), frozenset(), schema=2)
    fleet = Fleet(FLEET_PREFIX, horizon_windows=60)
    birth, telemetry = offline_windows(node, WINDOWS, site="s", seed=5)
    fleet.ingest(node_topic(FLEET_PREFIX, "s", node.name, TopicKind.BIRTH), encode(birth))
    for w in telemetry:
        fleet.ingest(node_topic(FLEET_PREFIX, "s", node.name, TopicKind.TELEMETRY), encode(w))
    (f,) = workload_features(fleet, "s")
    assert f.own_writes and f.write_bps < 1e6, f.write_bps  # nothing of the save reached its disks
    assert f.write_bursts >= 2, f.write_bursts


@pytest.mark.parametrize(("seconds", "read"), [(60.0, True), (61.0, False), (300.0, False)])
def test_own_counts_are_read_only_from_windows_short_enough_to_show_a_save(seconds: float, read: bool) -> None:
    """A save lasts seconds to a minute: in the Prometheus import's 5-minute windows a fine-tuning job that saves
    every few minutes writes in every window, and its own counts read as steady results, so there they are left
    to the node's rules. Deliberate bugs caught: the 60 s bound moved either way, or dropped (the last two rows)."""
    seen = _own_saves(windows_of([5e6] * 6, seconds=seconds))
    assert ("k8s/w" in seen) is read


def test_a_burst_on_the_disks_after_a_jobs_own_save_is_that_save(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two jobs computing hard on one node; k8s/own's processes' counts are read (schema 2), k8s/other's are not
    (a process group). k8s/own saves 150 MB in window 3 (30-40 s), counted as its pages are dirtied; the node's
    disks show it when writeback flushes it, within 35 s (vm.dirty_expire_centisecs 30 s and the flusher's 5 s
    wake-up): the burst in window 7 (70-80 s) is that save, nobody else's. A burst in window 9 (90-100 s), 50 s
    on, is not: k8s/other, the one job whose counts are unknown, made it. Deliberate bugs caught: only the burst's
    own window searched for an own save (window 7 handed to k8s/other as a save it never made), and the look-back
    moved to 25 s (the same) or to 50 s (window 9 explained away too)."""
    monkeypatch.setattr(features, "_trains_hard", lambda window, gpus: True)
    monkeypatch.setattr(features, "_servers", lambda window: set())
    refs = [SimpleNamespace(id="k8s/own", gpus=(0,)), SimpleNamespace(id="k8s/other", gpus=(1,))]
    writes = [0.1e6] * 10
    writes[3] = 15e6  # 150 MB in a 10 s window
    windows = [
        SimpleNamespace(start=i * 10.0, end=(i + 1) * 10.0, volatile=[Io("k8s/own", 0.0, bps)], workloads=refs)
        for i, bps in enumerate(writes)
    ]
    disk = [i in (7, 9) for i in range(10)]
    devices = SimpleNamespace(effective=lambda gpus: gpus)
    own_io = _own_saves(windows)
    assert [i for i, v in own_io["k8s/own"].items() if v[2]] == [3]
    hard = features._claimants(windows, devices, disk, [False] * 10, own_io)  # type: ignore[arg-type]
    assert hard[7] == [], hard[7]
    assert hard[9] == ["k8s/other"], hard[9]


def test_a_disk_burst_one_jobs_own_counts_explain_is_no_other_jobs() -> None:
    """Two steady jobs on one node, only one of them with its own counts read (the other's /proc/<pid>/io and
    io.stat unreadable, say): the adapter's saves show in its own counts and on the node's disks, and the other job,
    left alone as the node's claimant, must not take them for its saves. Deliberate bug caught: claimants filtered
    without the burst being explained (the other job reads three saves of its own)."""
    quiet = spec(
        "k8s/other", Pattern.LORA_FINE_TUNING, (1,), level=0.8, power_intensity=0.9, save_bytes=120e6,
        checkpoint_period_s=1e9, stall_rate=0.0,
    )  # fmt: skip
    node = ScenarioNode("a100-1", "a100", (ADAPTER, quiet), frozenset(), schema=2)
    fleet = Fleet(FLEET_PREFIX, horizon_windows=60)
    birth, telemetry = offline_windows(node, WINDOWS, site="s", seed=5)
    fleet.ingest(node_topic(FLEET_PREFIX, "s", node.name, TopicKind.BIRTH), encode(birth))
    unread = {"disk_read_bps": None, "disk_write_bps": None}
    for w in telemetry:
        refs = [r.model_copy(update=unread) if r.id == "k8s/other" else r for r in w.workloads]
        sent = w.model_copy(update={"workloads": refs})
        fleet.ingest(node_topic(FLEET_PREFIX, "s", node.name, TopicKind.TELEMETRY), encode(sent))
    seen = {f.id: f for f in workload_features(fleet, "s")}
    assert seen["k8s/lora"].write_bursts == 3, seen["k8s/lora"]
    assert not seen["k8s/other"].own_writes and seen["k8s/other"].write_bursts == 0, seen["k8s/other"]


def test_a_few_windows_of_own_counts_do_not_make_a_neighbours_writes_its_own() -> None:
    """The agent was upgraded to schema 2 a minute ago: of 36 windows only the last 6 carry the workloads' own
    counts. The adapter does about a sixth of the node's GPU work, and the node's steady writes, shared by load,
    are mostly the encoder's: with so few of its own windows, its write figure is still that share, so it is no
    write of its own and not batch's evidence. Deliberate bug caught: one window of own counts marking every
    window's writes as its own (the adapter credited some of the encoder's results, whatever its node share)."""
    node = ScenarioNode("a100-1", "a100", (ADAPTER, ENCODER), frozenset(), schema=2)
    fleet = Fleet(FLEET_PREFIX, horizon_windows=60)
    birth, telemetry = offline_windows(node, WINDOWS, site="s", seed=5)
    fleet.ingest(node_topic(FLEET_PREFIX, "s", node.name, TopicKind.BIRTH), encode(birth))
    unknown = {"disk_read_bps": None, "disk_write_bps": None}
    for n, w in enumerate(telemetry):
        before = n < WINDOWS - 6  # sent before the upgrade
        sent = w.model_copy(update={"workloads": [r.model_copy(update=unknown) for r in w.workloads]}) if before else w
        fleet.ingest(node_topic(FLEET_PREFIX, "s", node.name, TopicKind.TELEMETRY), encode(sent))
    adapter = {f.id: f for f in workload_features(fleet, "s")}["k8s/lora"]
    assert adapter.node_share < 0.75, adapter.node_share
    assert adapter.write_bps >= 2e6, adapter.write_bps  # its load's share of the encoder's flushes
    assert not adapter.own_writes


def test_a_storage_rate_past_float32_is_a_counted_rejection() -> None:
    """A window whose workload claims 1e300 bytes/s written (a garbled or hostile agent) is refused whole and
    counted, as any measured figure past float32 is, and the node's other windows still count. Deliberate bug
    caught: the rate left unbounded in the optimizer's window reader (accepted: the adapter's median window reads
    5e299 bytes/s, results written at an impossible rate, batch evidence out of one bad number; at 1e308 the median
    of two such windows is infinite)."""
    node = ScenarioNode("a100-1", "a100", (ADAPTER, ENCODER), frozenset(), schema=2)
    fleet = Fleet(FLEET_PREFIX, horizon_windows=60)
    birth, telemetry = offline_windows(node, WINDOWS, site="s", seed=5)
    fleet.ingest(node_topic(FLEET_PREFIX, "s", node.name, TopicKind.BIRTH), encode(birth))
    refused = []
    for n, w in enumerate(telemetry):
        payload = encode(w)
        if n % 2:  # every other window, so that the bad rate would be the adapter's median
            sent = json.loads(payload)
            (adapter,) = [r for r in sent["workloads"] if r["id"] == "k8s/lora"]
            adapter["disk_write_bps"] = 1e300
            payload = json.dumps(sent).encode()
        accepted = fleet.ingest(node_topic(FLEET_PREFIX, "s", node.name, TopicKind.TELEMETRY), payload)
        refused.append(accepted is None)
    assert refused == [n % 2 == 1 for n in range(WINDOWS)]
    assert sum(fleet.rejected.values()) == WINDOWS // 2, fleet.rejected
    adapter_features = {f.id: f for f in workload_features(fleet, "s")}["k8s/lora"]
    assert adapter_features.write_bps < 1e6, adapter_features.write_bps
