"""A hostile node against the optimizer: every attack is rejected and counted by reason, and the other sites'
plans do not change. The first part drives the optimizer's ingest and planning directly; the second goes
through a real Mosquitto running the shipped configuration, ACL and ``mint`` credentials."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import aiomqtt
import pytest
from conftest import EXAMPLES, FLEETFIT, Shipped, fault_size, free_port, recent, shipped_broker, wait_until
from webhook_server import webhook_server

from agent.config import MqttSettings
from agent.mqtt import Link, make_client
from agent.notify import Notifier
from agent.protocol import (
    Birth,
    GpuInfo,
    NodeStatus,
    Plan,
    State,
    Telemetry,
    TopicKind,
    WorkloadKind,
    WorkloadRef,
    encode,
    node_topic,
)
from agent.simulate import offline_windows
from agent.spool import MemoryQueue
from collectors.sim.scenarios import build_scenario
from optimizer.decide.catalog import load_catalog
from optimizer.ingest.fleet import Fleet
from optimizer.ingest.window import Window, as_window
from optimizer.serve.config import ApiSettings, OptimizerConfig, OptimizerSettings, SiteSettings
from optimizer.serve.lifecycle import Lifecycle, Offloaded
from optimizer.serve.report import Ledger
from optimizer.serve.selfmetrics import optimizer_metrics
from optimizer.serve.service import Optimizer, ingest_limits
from optimizer.serve.store import Store, StoreSettings
from optimizer.serve.web.app import WebServer

pytestmark = pytest.mark.fault

P = "fleetfit/v1"


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def node_data(index: int, site: str, windows: int = 6, name: str | None = None) -> tuple[Birth, list[Telemetry]]:
    """A demo node's birth and recent windows, in ``site``, optionally renamed."""
    template = build_scenario("demo", 8)[index]
    birth, telemetry = offline_windows(template, windows, site=site, seed=index)
    telemetry = recent(telemetry)
    if name is not None:
        birth = birth.model_copy(update={"node": name})
        telemetry = [w.model_copy(update={"node": name}) for w in telemetry]
    return birth, telemetry


def topic(site: str, node: str, kind: TopicKind) -> str:
    return node_topic(P, site, node, kind)


def mutated(message: Birth | Telemetry, change: Callable[[dict[str, Any]], None]) -> bytes:
    raw = json.loads(encode(message))
    change(raw)
    return json.dumps(raw).encode()


def live_fleet(clock: Clock, **limits: Any) -> Fleet:
    """A fleet with the live optimizer's limits (``limits`` overriding some)."""
    defaults = ingest_limits(OptimizerConfig(), load_catalog())
    return Fleet(P, 60, dataclasses.replace(defaults, **limits), clock=clock)


# ------------------------------------------------------------------------------------------ bad values


def _gpu0(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    return lambda raw: change(raw["gpus"][0])


BAD_WINDOWS: dict[str, Callable[[dict[str, Any]], None]] = {
    "negative utilisation": _gpu0(lambda g: g.update(util=[-5, 10, 20, 1])),
    "utilisation above 100": _gpu0(lambda g: g.update(util=[150, 160, 170, 1])),
    "p95 above max": _gpu0(lambda g: g.update(util=[50, 90, 80, 1])),
    "negative memory": _gpu0(lambda g: g.update(mem_used_mib=[-100, -50, -10, 1])),
    "series beyond float32": _gpu0(lambda g: g.update(util_series=[3.5e38] * 3)),
    "series above 100": _gpu0(lambda g: g.update(util_series=[101.0] * 3)),
    "infinite power": _gpu0(lambda g: g.update(power_w=[1, 1, 1e400, 0])),
    "series longer than the window": lambda raw: raw["gpus"][0].update(util_series=[5.0] * (raw["samples"] + 1)),
    "duplicate GPU": lambda raw: raw["gpus"].append(raw["gpus"][0]),
    "GPU index 70": _gpu0(lambda g: g.update(index=70)),
    "a workload holding GPU 0 64 times": lambda raw: raw["workloads"][0].update(gpus=[0] * 64),
    "timestamp 1e15": lambda raw: raw.update(end=1e15),
    "memory figures for GPUs it does not hold": lambda raw: raw["workloads"][0].update(gpu_mem_mib=[1.0] * 9),
    "negative process memory": lambda raw: raw["workloads"][0].update(
        gpu_mem_mib=[-1.0] * len(raw["workloads"][0]["gpus"])
    ),
    "process memory of 1e30 MiB": lambda raw: raw["workloads"][0].update(
        gpu_mem_mib=[1e30] * len(raw["workloads"][0]["gpus"])
    ),
}


@pytest.mark.parametrize("attack", sorted(BAD_WINDOWS))
def test_values_no_agent_sends_are_rejected_at_ingest(attack: str) -> None:
    fleet = live_fleet(Clock())
    birth, windows = node_data(0, "aaa")
    assert fleet.ingest(topic("aaa", birth.node, TopicKind.BIRTH), encode(birth))
    assert fleet.ingest(topic("aaa", birth.node, TopicKind.TELEMETRY), mutated(windows[0], BAD_WINDOWS[attack])) is None
    assert fleet.rejected == {"schema": 1}
    assert fleet.node_rejections == {("aaa", birth.node, "schema"): 1}
    assert fleet.ingest(topic("aaa", birth.node, TopicKind.TELEMETRY), encode(windows[1]))  # the next one is fine


def test_ingest_checks_what_the_model_cannot() -> None:
    clock = Clock()
    fleet = live_fleet(clock)
    birth, windows = node_data(3, "aaa")  # an L40S node with 8 GPUs, one workload on 0-3
    node = birth.node
    assert fleet.ingest(topic("aaa", node, TopicKind.BIRTH), encode(birth))
    attacks = {
        "timestamp": encode(
            windows[0].model_copy(update={"start": clock.now - 3 * 86400, "end": clock.now - 2 * 86400})
        ),
        "gpu_index": mutated(windows[0], lambda r: r["workloads"][0].update(gpus=[8, 9])),
        "schema": mutated(windows[0], lambda r: r.update(samples=10_000)),  # 10,000 samples in a 10 s window
    }
    for reason, payload in attacks.items():
        assert fleet.ingest(topic("aaa", node, TopicKind.TELEMETRY), payload) is None, reason
    future = birth.model_copy(update={"timestamp": clock.now + 2 * 86400, "session": 5})
    assert fleet.ingest(topic("aaa", node, TopicKind.BIRTH), encode(future)) is None
    huge = mutated(birth, lambda r: r.update(session=2**70))
    assert fleet.ingest(topic("aaa", node, TopicKind.BIRTH), huge) is None
    assert fleet.rejected == {"timestamp": 2, "gpu_index": 1, "schema": 2}
    # a retained birth days old is a node up for days, not an attack
    old = birth.model_copy(update={"timestamp": clock.now - 5 * 86400, "session": 2})
    assert fleet.ingest(topic("aaa", node, TopicKind.BIRTH), encode(old))
    assert fleet.ingest(topic("aaa", node, TopicKind.TELEMETRY), encode(windows[2]))


def test_one_tenants_process_name_costs_only_that_field() -> None:
    """A process may name itself anything (prctl): ESC sequences, U+202E. The window of the node it runs on is
    taken with every other pod's data; only the bad fields are left out, and counted."""
    fleet = live_fleet(Clock())
    birth, windows = node_data(5, "aaa")  # l4-001: two workloads
    assert fleet.ingest(topic("aaa", birth.node, TopicKind.BIRTH), encode(birth))
    names = {
        0: {"name": "ok\u001b[2Jowned", "hint": "\u202egnp.exe", "program": "x" * 300, "owner": "team\u0007"},
        1: {"hint": "a\u200bb"},
    }

    def poison(raw: dict[str, Any]) -> None:
        for i, fields in names.items():
            raw["workloads"][i].update(fields)

    window = fleet.ingest(topic("aaa", birth.node, TopicKind.TELEMETRY), mutated(windows[0], poison))
    assert isinstance(window, Window)
    assert [w.id for w in window.workloads] == [w.id for w in windows[0].workloads]  # every workload kept
    assert window.gpus == as_window(windows[0]).gpus  # and every GPU
    first, second = window.workloads
    assert (first.name, first.hint, first.program, first.owner) == ("", None, None, None)
    assert second.hint is None and second.owner == windows[0].workloads[1].owner
    assert fleet.dropped_fields == {
        ("workloads.name", "control_character"): 1,
        ("workloads.hint", "control_character"): 2,
        ("workloads.owner", "control_character"): 1,
        ("workloads.program", "schema"): 1,
    }
    assert fleet.node_rejections == {("aaa", birth.node, "field_dropped"): 5} and not fleet.rejected
    # a workload whose id holds one is dropped from the window; the window is still taken
    bad_id = mutated(windows[1], lambda r: r["workloads"][0].update(id="k8s/\u202eevil"))
    window = fleet.ingest(topic("aaa", birth.node, TopicKind.TELEMETRY), bad_id)
    assert isinstance(window, Window) and [w.id for w in window.workloads] == [windows[1].workloads[1].id]
    assert fleet.dropped_fields[("workloads.id", "control_character")] == 1


def test_a_control_character_in_a_short_json_escape_is_found_too() -> None:
    """JSON writes a newline or a tab as ``\\n`` or ``\\t``, not ``\\u000a``: those escapes decode to control
    characters just the same, in a window's text and in a birth's."""
    fleet = live_fleet(Clock())
    birth, windows = node_data(5, "aaa")
    hostile_birth = mutated(birth, lambda r: r.update(hostname="host\nname"))
    assert b"\\n" in hostile_birth
    assert fleet.ingest(topic("aaa", birth.node, TopicKind.BIRTH), hostile_birth) is None
    assert fleet.rejected == {"control_character": 1}
    assert fleet.ingest(topic("aaa", birth.node, TopicKind.BIRTH), encode(birth))

    def poison(raw: dict[str, Any]) -> None:
        raw["workloads"][0].update(hint="a\tb", name="x\ry")
        raw["gpus"][0]["workload"] = "k8s/\bz"

    window = fleet.ingest(topic("aaa", birth.node, TopicKind.TELEMETRY), mutated(windows[0], poison))
    assert isinstance(window, Window) and window.gpus[0].workload is None
    assert (window.workloads[0].hint, window.workloads[0].name) == (None, "")
    assert fleet.dropped_fields == {
        ("workloads.hint", "control_character"): 1,
        ("workloads.name", "control_character"): 1,
        ("gpus.workload", "control_character"): 1,
    }


def test_the_plan_topic_level_is_no_node_name() -> None:
    fleet = live_fleet(Clock())
    birth, _ = node_data(0, "aaa", name="recommendations")
    assert fleet.ingest(topic("aaa", "recommendations", TopicKind.BIRTH), encode(birth)) is None
    assert fleet.rejected == {"reserved_name": 1} and not fleet.nodes


def _with_gpus(birth: Birth, count: int, memory_mib: int | None = None) -> Birth:
    first = birth.gpus[0]
    gpus = [
        first.model_copy(update={"index": i, "uuid": f"GPU-{i}", "memory_mib": memory_mib or first.memory_mib})
        for i in range(count)
    ]
    return birth.model_copy(update={"gpus": gpus})


def test_implausible_hardware_claims_are_rejected() -> None:
    fleet = live_fleet(Clock())
    birth, _ = node_data(3, "aaa")  # L40S
    assert birth.gpus[0].model.startswith("NVIDIA L40S")
    for claim in (_with_gpus(birth, 64), _with_gpus(birth, 8, memory_mib=400_000)):
        assert fleet.ingest(topic("aaa", birth.node, TopicKind.BIRTH), encode(claim)) is None
    mig_only = birth.model_copy(
        update={"gpus": [GpuInfo(index=0, uuid="MIG-0", model="NVIDIA L40S", memory_mib=10_000, parent=3)]}
    )
    assert fleet.ingest(topic("aaa", birth.node, TopicKind.BIRTH), encode(mig_only)) is None  # an L40S has no MIG
    assert fleet.rejected == {"implausible_inventory": 3}
    assert fleet.ingest(topic("aaa", birth.node, TopicKind.BIRTH), encode(birth))  # the truth is accepted


def test_a_node_cannot_hijack_another_nodes_pod() -> None:
    clock = Clock()
    fleet = live_fleet(clock)
    # longer than TAKEOVER_SECONDS: the pod's node keeps it by reporting it, window after window
    b1, w1 = node_data(1, "aaa", windows=14)  # chat-serving on h100-002
    b2, w2 = node_data(2, "aaa", windows=14)  # h100-003, idle
    pod = w1[0].workloads[0]
    for b in (b1, b2):
        assert fleet.ingest(topic("aaa", b.node, TopicKind.BIRTH), encode(b))
    for a, b in zip(w1, w2, strict=True):
        assert fleet.ingest(topic("aaa", b1.node, TopicKind.TELEMETRY), encode(a))
        forged = b.model_copy(update={"workloads": [pod]})
        assert fleet.ingest(topic("aaa", b2.node, TopicKind.TELEMETRY), encode(forged))  # the GPU data stays
        clock.now += 10
    from optimizer.decide.features import workload_features

    features = {f.id: f for f in workload_features(fleet, "aaa")}
    assert features[pod.id].nodes == [b1.node]
    assert fleet.dropped_refs == {"workload_conflict": len(w2)}
    assert fleet.node_rejections[("aaa", b2.node, "workload_conflict")] == len(w2)


def test_a_slurm_job_spans_nodes_and_a_silent_pods_node_hands_it_over() -> None:
    from optimizer.decide.features import workload_features

    clock = Clock()
    fleet = live_fleet(clock)
    b1, w1 = node_data(1, "aaa")
    b2, w2 = node_data(2, "aaa")
    job = w1[0].workloads[0].model_copy(update={"id": "slurm/4242", "kind": WorkloadKind.SLURM_JOB})
    for b in (b1, b2):
        fleet.ingest(topic("aaa", b.node, TopicKind.BIRTH), encode(b))
    fleet.ingest(topic("aaa", b1.node, TopicKind.TELEMETRY), encode(w1[0].model_copy(update={"workloads": [job]})))
    fleet.ingest(topic("aaa", b2.node, TopicKind.TELEMETRY), encode(w2[0].model_copy(update={"workloads": [job]})))
    assert not fleet.dropped_refs  # multi-node training: one workload on both nodes
    spans = {f.id: f.nodes for f in workload_features(fleet, "aaa")}
    assert sorted(spans["slurm/4242"]) == sorted([b1.node, b2.node])

    pod = w1[0].workloads[0]  # a pod lives on one node
    b1_topic, b2_topic = topic("aaa", b1.node, TopicKind.TELEMETRY), topic("aaa", b2.node, TopicKind.TELEMETRY)
    fleet.ingest(b1_topic, encode(w1[1].model_copy(update={"workloads": [pod]})))
    clock.now += 60  # b2 claims it while b1 still reports it: refused
    fleet.ingest(b2_topic, encode(w2[1].model_copy(update={"workloads": [pod]})))
    assert fleet.dropped_refs == {"workload_conflict": 1}
    clock.now += 200  # b1 went quiet about it: it was rescheduled, and b2 takes it over
    fleet.ingest(b2_topic, encode(w2[2].model_copy(update={"workloads": [pod]})))
    assert fleet.dropped_refs == {"workload_conflict": 1}
    clock.now += 10  # now b1 is the one refused
    fleet.ingest(b1_topic, encode(w1[2].model_copy(update={"workloads": [pod]})))
    assert fleet.dropped_refs == {"workload_conflict": 2}
    assert fleet.node_rejections[("aaa", b1.node, "workload_conflict")] == 1
    assert fleet.node_rejections[("aaa", b2.node, "workload_conflict")] == 1


def test_one_nodes_flood_never_hides_anothers_refusal_from_the_log(caplog: pytest.LogCaptureFixture) -> None:
    fleet = live_fleet(Clock())
    evil, evil_windows = node_data(5, "aaa")
    honest, honest_windows = node_data(3, "aaa")
    for b in (evil, honest):
        fleet.ingest(topic("aaa", b.node, TopicKind.BIRTH), encode(b))
    for _ in range(200):
        fleet.ingest(
            topic("aaa", evil.node, TopicKind.TELEMETRY), mutated(evil_windows[0], BAD_WINDOWS["GPU index 70"])
        )
    caplog.clear()
    with caplog.at_level("WARNING", logger="optimizer.ingest.fleet"):
        bad = mutated(honest_windows[0], BAD_WINDOWS["GPU index 70"])
        assert fleet.ingest(topic("aaa", honest.node, TopicKind.TELEMETRY), bad) is None
    assert [r for r in caplog.records if f"/{honest.node}/" in r.getMessage()], "the honest node's refusal is logged"


def _consecutive(template: Telemetry, count: int, first_seq: int = 0, length: float = 10.0) -> list[Telemetry]:
    """``count`` back-to-back windows of ``length`` seconds ending now, in order."""
    end = template.end
    return [
        template.model_copy(
            update={"seq": first_seq + i, "start": end - (count - i) * length, "end": end - (count - i - 1) * length}
        )
        for i in range(count)
    ]


def test_windows_are_limited_by_the_time_they_cover_and_refused_ones_are_awaited() -> None:
    clock = Clock()
    fleet = live_fleet(clock, replay_seconds=100.0)
    birth, windows = node_data(5, "aaa", windows=1)
    tele = topic("aaa", birth.node, TopicKind.TELEMETRY)
    fleet.ingest(topic("aaa", birth.node, TopicKind.BIRTH), encode(birth))
    sent = _consecutive(windows[0], 20)  # 200 s of 10 s windows, all at once, against 100 s of budget
    for w in sent:
        fleet.ingest(tele, encode(w))
    assert fleet.accepted["telemetry"] == 10 and fleet.rejected == {"time_budget": 10}
    record = fleet.record("aaa", birth.node)
    assert record is not None and not record.missing  # refused at the tail: nothing after them yet
    clock.now += 10 / 1.25  # the budget refills at 1.25 s of window a second: one more window
    assert fleet.ingest(tele, encode(_consecutive(windows[0], 1, first_seq=20)[0]))
    assert fleet.ingest(tele, encode(_consecutive(windows[0], 1, first_seq=21)[0])) is None
    # the refused windows are now a gap before 20: awaited, and asked for once they have been missing a while
    assert fleet.awaited(delay=0.0, give_up=3600.0) == {("aaa", birth.node): [(sent[0].session, 10, 19)]}
    clock.now += 100 / 1.25
    for w in sent[10:]:
        assert fleet.ingest(tele, encode(w)), w.seq  # sent again, each fills its place once
    assert record.refilled == 10 and not fleet.awaited(0.0, 3600.0)
    assert fleet.ingest(tele, encode(sent[12])) is None and fleet.rejected["duplicate"] == 1


def test_a_replay_arriving_at_once_is_taken_whole() -> None:
    """An agent back after two hours, or an optimizer back after two hours to the broker's backlog: 720 windows
    at once, all taken (an arrival limit of 360, the old one, refused half)."""
    fleet = live_fleet(Clock())
    birth, windows = node_data(5, "aaa", windows=1)
    fleet.ingest(topic("aaa", birth.node, TopicKind.BIRTH), encode(birth))
    for w in _consecutive(windows[0], 720):
        fleet.ingest(topic("aaa", birth.node, TopicKind.TELEMETRY), encode(w))
    assert fleet.accepted["telemetry"] == 720 and not fleet.rejected


def test_a_flood_of_refused_messages_is_refused_unread_and_costs_only_its_node() -> None:
    clock = Clock()
    fleet = live_fleet(clock, refusal_burst=5.0, refusal_rate=1.0)
    evil, evil_windows = node_data(5, "aaa", windows=2)
    good, good_windows = node_data(3, "aaa", windows=3)
    for b in (evil, good):
        fleet.ingest(topic("aaa", b.node, TopicKind.BIRTH), encode(b))
    evil_topic = topic("aaa", evil.node, TopicKind.TELEMETRY)
    assert fleet.ingest(evil_topic, encode(evil_windows[0]))
    for _ in range(50):  # the same window again and again: each read, found a duplicate, refused
        fleet.ingest(evil_topic, encode(evil_windows[0]))
    assert fleet.rejected == {"duplicate": 5, "rate_limited": 45}  # past 5 refusals: refused unread
    assert fleet.ingest(evil_topic, encode(evil_windows[1])) is None  # its good windows too, until it refills
    for w in good_windows:  # another node's windows are untouched
        assert fleet.ingest(topic("aaa", good.node, TopicKind.TELEMETRY), encode(w))
    clock.now += 1.0
    assert fleet.ingest(evil_topic, encode(evil_windows[1]))
    assert fleet.node_rejections[("aaa", evil.node, "rate_limited")] == 46
    assert not [k for k in fleet.node_rejections if k[1] == good.node]


def test_births_and_states_are_limited_per_node() -> None:
    clock = Clock()
    fleet = live_fleet(clock)
    evil, _ = node_data(5, "aaa")
    good, good_windows = node_data(3, "aaa")
    state = State(node=evil.node, session=1, status=NodeStatus.ONLINE, timestamp=clock.now)
    flood = [(topic("aaa", evil.node, TopicKind.BIRTH), encode(evil.model_copy(update={"session": i})))
             for i in range(20)]  # fmt: skip
    flood += [(topic("aaa", evil.node, TopicKind.STATE), encode(state.model_copy(update={"session": 20 + i})))
              for i in range(20)]  # fmt: skip
    for t, payload in flood:
        fleet.ingest(t, payload)
    burst = OptimizerSettings().node_birth_burst
    assert fleet.accepted["birth"] + fleet.accepted["state"] == burst
    assert fleet.rejected == {"rate_limited": 40 - burst}
    assert fleet.ingest(topic("aaa", good.node, TopicKind.BIRTH), encode(good))  # another node's birth is taken
    for w in good_windows:
        assert fleet.ingest(topic("aaa", good.node, TopicKind.TELEMETRY), encode(w))
    clock.now += 1 / OptimizerSettings().node_birth_rate
    assert fleet.ingest(topic("aaa", evil.node, TopicKind.BIRTH), encode(evil.model_copy(update={"session": 99})))


def test_workload_cap_per_node() -> None:
    fleet = live_fleet(Clock(), workloads_per_node=3)
    birth, windows = node_data(5, "aaa", windows=1)  # l4-001: two workloads
    fleet.ingest(topic("aaa", birth.node, TopicKind.BIRTH), encode(birth))
    ref = windows[0].workloads[0]
    for i, w in enumerate(_consecutive(windows[0], 5)):
        refs = [ref.model_copy(update={"id": f"k8s/fake-{i}-{j}", "gpus": [j]}) for j in range(2)]
        fleet.ingest(topic("aaa", birth.node, TopicKind.TELEMETRY), encode(w.model_copy(update={"workloads": refs})))
    record = fleet.record("aaa", birth.node)
    assert record is not None and fleet.accepted["telemetry"] == 5
    assert len({r.id for d in record.windows for r in d.workloads}) == 3  # the cap, the rest dropped
    assert fleet.dropped_refs == {"workload_cap": 7}


def test_workloads_gone_longer_than_the_horizon_are_forgotten() -> None:
    fleet = Fleet(P, horizon_windows=5)
    birth, windows = node_data(5, "aaa", windows=40)
    fleet.ingest(topic("aaa", birth.node, TopicKind.BIRTH), encode(birth))
    ref = windows[0].workloads[0]
    for i, w in enumerate(windows):
        churned = [ref.model_copy(update={"id": f"k8s/job-{i}"})]  # a new short job every window
        fleet.ingest(topic("aaa", birth.node, TopicKind.TELEMETRY), encode(w.model_copy(update={"workloads": churned})))
    record = fleet.record("aaa", birth.node)
    assert record is not None
    assert len(record.history.digests) + len(record.history._open) <= 2 * 5
    assert len(record.workload_seen) <= 2 * 5 and len(record.known_workloads) <= 2 * 5


# --------------------------------------------------------------------------------------- planning isolation


def _optimizer(tmp_path: Path, **settings: Any) -> Optimizer:
    config = OptimizerConfig(
        mqtt=MqttSettings(port=free_port()),
        optimizer=OptimizerSettings(state_dir=tmp_path, solve_interval=3600, **settings),
    )
    return Optimizer(config, load_catalog(), lifecycle=Lifecycle.in_state_dir(tmp_path))


def _feed(optimizer: Optimizer, site: str, indices: range, prefix: str = "") -> None:
    for i in indices:
        birth, windows = node_data(i, site, name=prefix + build_scenario("demo", 8)[i].name)
        assert optimizer.fleet.ingest(topic(site, birth.node, TopicKind.BIRTH), encode(birth))
        for w in windows:
            assert optimizer.fleet.ingest(topic(site, birth.node, TopicKind.TELEMETRY), encode(w))


def _moves(plan: Plan) -> list[tuple[str, str, str]]:
    return sorted((r.workload, r.from_node, r.to_hardware) for r in plan.recommendations)


async def test_a_node_that_breaks_planning_is_left_out_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    optimizer = _optimizer(tmp_path)
    _feed(optimizer, "good", range(8))
    _feed(optimizer, "aaa", range(8), prefix="a-")
    baseline = {p.site: _moves(p) for p in await optimizer.plan_once()}
    assert baseline["good"] and baseline["aaa"]
    # Births that slipped past ingest (built without validation, as a bug would let one through): one with
    # only MIG instances, and one whose node breaks the snapshot in a way nobody foresaw.
    mig = optimizer.fleet.record("aaa", "a-h100-003")
    assert mig is not None and mig.birth is not None
    only_mig = GpuInfo.model_construct(index=0, uuid="MIG-0", model="NVIDIA H100", memory_mib=10_000, parent=7)
    mig.birth = Birth.model_construct(**{**dict(mig.birth), "gpus": [only_mig]})
    import optimizer.decide.snapshot as snapshot_module

    original = snapshot_module.SnapshotNode

    def node_breaks(**kw: Any) -> Any:
        if kw["name"] == "a-l40s-002":
            raise ZeroDivisionError("division by zero")
        return original(**kw)

    monkeypatch.setattr(snapshot_module, "SnapshotNode", node_breaks)
    plans = {p.site: p for p in await optimizer.plan_once()}
    assert _moves(plans["good"]) == baseline["good"]
    assert plans["aaa"].solver.status in ("OPTIMAL", "FEASIBLE") and {v.id for v in plans["aaa"].workloads}
    excluded = optimizer.excluded_nodes["aaa"]
    # The MIG-only birth is planned as the GPU its instance sits on; the node that breaks the snapshot is left out.
    assert set(excluded) == {"a-l40s-002"} and not optimizer.excluded_nodes["good"]
    assert excluded["a-l40s-002"].startswith("error: ZeroDivision")
    server = WebServer(optimizer, ApiSettings(port=0))
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{server.port}"
            async with http.get(f"{base}/healthz") as r:
                health = await r.json()
            async with http.get(f"{base}/metrics") as r:
                metrics = await r.text()
    finally:
        await server.stop()
    assert health["excluded_nodes"] == {"aaa": excluded}  # (no broker here: the status says so first)
    assert 'fleetfit_nodes_excluded{site="aaa",node="a-l40s-002",reason="error"} 1' in metrics


async def test_a_site_that_fails_to_plan_does_not_stop_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    optimizer = _optimizer(tmp_path)
    for site in ("aaa", "good", "zzz"):
        _feed(optimizer, site, range(8))
    import optimizer.serve.service as service_module

    original = service_module.plan_snapshot

    def fails_for_aaa(snapshot: Any, *args: Any, **kwargs: Any) -> Plan:
        if snapshot.site == "aaa":
            raise ValueError("solver crashed")
        return original(snapshot, *args, **kwargs)

    monkeypatch.setattr(service_module, "plan_snapshot", fails_for_aaa)
    plans = await optimizer.plan_once()
    await optimizer.plan_once()
    monkeypatch.undo()
    assert [p.site for p in plans] == ["good", "zzz"]
    assert optimizer.plan_failures == {"aaa": 2}
    health = optimizer.health()
    assert health["failing_sites"] == {"aaa": "ValueError: solver crashed"}
    from agent.metrics import render

    text = render(optimizer_metrics(optimizer))
    assert 'fleetfit_plan_failures_total{site="aaa"} 2' in text
    assert 'fleetfit_site_planning_failed{site="aaa"} 1' in text
    await optimizer.plan_once()
    assert optimizer.health()["failing_sites"] == {}


async def test_an_overcommitted_node_is_planned_without(tmp_path: Path) -> None:
    optimizer = _optimizer(tmp_path)
    _feed(optimizer, "good", range(8))
    baseline = _moves((await optimizer.plan_once())[0])
    # l4-002 (8 GPUs, asr-api on all 8) then reports another workload alone on its GPUs 0-3: with asr-api's own
    # last window they claim 12 GPUs. (Two workloads reported together on a GPU share it: that is no overcommit.)
    birth, windows = node_data(6, "good", windows=7)
    extra = windows[0].workloads[0].model_copy(update={"id": "k8s/squatter", "gpus": [0, 1, 2, 3]})
    last = windows[-1].model_copy(update={"seq": 100, "workloads": [extra]})
    assert optimizer.fleet.ingest(topic("good", birth.node, TopicKind.TELEMETRY), encode(last))
    plan = (await optimizer.plan_once())[0]
    assert optimizer.excluded_nodes["good"] == {
        "l4-002": "overcommitted: its workloads hold more GPUs than its inventory lists"
    }
    assert plan.solver.status in ("OPTIMAL", "FEASIBLE")
    assert {m for m in _moves(plan)} >= {m for m in baseline if m[1] != "l4-002"}


async def test_the_same_move_in_two_sites_is_two_recommendations(tmp_path: Path) -> None:
    optimizer = _optimizer(tmp_path)
    _feed(optimizer, "lab", range(8))
    _feed(optimizer, "s2", range(8))  # the same node names and workload ids
    plans = {p.site: p for p in await optimizer.plan_once()}
    assert _moves(plans["lab"]) == _moves(plans["s2"]) and plans["lab"].recommendations
    assert optimizer.lifecycle is not None
    for site in ("lab", "s2"):
        tracked = optimizer.lifecycle.list(site)
        assert {t.recommendation.id for t in tracked} == {r.id for r in plans[site].recommendations}


# ---------------------------------------------------------------------------------------------- the store


async def test_a_batch_the_store_refuses_is_dropped_and_counted() -> None:
    with webhook_server([(400, {}), (503, {})]) as server:
        store = Store(StoreSettings(url=f"http://127.0.0.1:{server.port}", batch_size=2, flush_interval=0.05))
        store._backoff.base = 0.05
        from optimizer.serve.lineproto import encode_line

        lines = [encode_line("m", {"t": "a"}, {"v": float(i)}, time.time()) for i in range(4)]
        store.add(line for line in lines if line is not None)
        task = asyncio.create_task(store.run())
        try:
            await wait_until(lambda: store.written == 2, 10, "the second batch")
        finally:
            task.cancel()
            store.close()
    assert store.rejected == 2 and store.failures == 1 and len(store) == 0
    assert [r.status for r in server.received] == [400, 503, 200]


# ------------------------------------------------------------------------- through the shipped broker


GOOD = [build_scenario("demo", 8)[i].name for i in range(8)]
READER = "fleetfit-optimizer-2"  # a second optimizer account: tests read with it, never with the optimizer's own


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shipped]:
    directory = tmp_path_factory.mktemp("shipped-broker")
    broker = shipped_broker(directory, {"good": GOOD, "aaa": ["evil"]}, optimizers=(READER,))
    broker.server.start()
    yield broker
    broker.server.stop()


async def _publish(settings: MqttSettings, messages: list[tuple[str, bytes, bool]]) -> None:
    async with make_client(settings, f"pub-{settings.username}-{time.monotonic_ns()}") as client:
        for t, payload, retain in messages:
            await client.publish(t, payload, qos=1, retain=retain)


@contextlib.asynccontextmanager
async def running(optimizer: Optimizer, fresh: bool = True) -> AsyncIterator[Optimizer]:
    """``optimizer`` running and subscribed; stopped (and flushed) on the way out. ``fresh``: what an earlier
    test's optimizer left queued in its persistent session is discarded first."""
    if fresh:
        clean = optimizer.config.mqtt.model_copy(update={"session_expiry": 0})
        async with make_client(clean, optimizer.config.optimizer.client_id):
            pass
    task = asyncio.create_task(optimizer.run())
    try:
        await wait_until(lambda: optimizer.connected.is_set() or task.done(), 15, "the optimizer to subscribe")
        yield optimizer
    finally:
        optimizer.should_exit.set()
        await asyncio.wait_for(task, 30)


def optimizer_on(shipped: Shipped, tmp_path: Path, port: int | None = None, **settings: Any) -> Optimizer:
    config = OptimizerConfig(
        mqtt=shipped.settings("fleetfit-optimizer", port).model_copy(update={"session_expiry": 3600}),
        optimizer=OptimizerSettings(solve_interval=3600, state_dir=tmp_path, **settings),
    )
    return Optimizer(config, load_catalog())


def honest_link(shipped: Shipped, index: int, port: int | None = None) -> tuple[Link, list[Telemetry]]:
    """Good node ``index``'s broker link (its own account and client id), over a queue that keeps what it sent,
    and the windows it will send."""
    name = GOOD[index]
    birth, windows = node_data(index, "good", windows=60)
    queue = MemoryQueue(1000, keep_sent=1000)
    link = Link(shipped.settings(name, port), "good", name, birth.session, lambda: birth, queue, time.time)
    return link, windows


def test_mint_refuses_the_plan_topic_level_as_a_node(tmp_path: Path) -> None:
    subprocess.run([str(EXAMPLES / "mint"), "ca", str(tmp_path)], check=True, capture_output=True, timeout=60)
    done = subprocess.run(
        [str(EXAMPLES / "mint"), "node", str(tmp_path), "lab", "recommendations"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "reserved" in done.stderr and not (tmp_path / "clients").exists()


def test_mint_keeps_a_nodes_credentials_unless_told_to_rotate_them(tmp_path: Path) -> None:
    """Minting a node again would lock its running agent out with a new password. Deliberate bug it catches: the
    check for an existing node dropped, so the second `mint node` silently rotates the password."""
    mint = str(EXAMPLES / "mint")
    subprocess.run([mint, "ca", str(tmp_path)], check=True, capture_output=True, timeout=60)
    subprocess.run([mint, "node", str(tmp_path), "lab", "n1"], check=True, capture_output=True, timeout=60)
    password = (tmp_path / "clients" / "n1" / "mqtt-password").read_text()
    hashed = (tmp_path / "passwd").read_text()
    again = subprocess.run(
        [mint, "node", str(tmp_path), "lab", "n1"], check=False, capture_output=True, text=True, timeout=60
    )
    assert again.returncode != 0 and again.stdout == ""
    assert again.stderr.count("\n") == 1 and "already has credentials" in again.stderr and "--rotate" in again.stderr
    assert (tmp_path / "clients" / "n1" / "mqtt-password").read_text() == password
    assert (tmp_path / "passwd").read_text() == hashed
    rotated = subprocess.run(
        [mint, "node", str(tmp_path), "lab", "n1", "--rotate"], check=False, capture_output=True, text=True, timeout=60
    )
    assert rotated.returncode == 0 and "rotated n1" in rotated.stdout
    assert (tmp_path / "clients" / "n1" / "mqtt-password").read_text() != password


def test_mint_never_puts_a_password_on_a_command_line(tmp_path: Path) -> None:
    """mosquitto_passwd -b PASSWORD shows it to every local user (ps, /proc/PID/cmdline): a spy in front of the
    real mosquitto_passwd records every command line mint runs."""
    spy = tmp_path / "bin"
    spy.mkdir()
    real = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
    (spy / "mosquitto_passwd").write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/argv\nexec {real} "$@"\n')
    (spy / "mosquitto_passwd").chmod(0o755)
    env = {"PATH": f"{spy}:/usr/bin:/bin"}
    creds = tmp_path / "creds"
    for args in (["ca"], ["node", "lab", "n1"], ["node", "lab", "n1", "--rotate"], ["optimizer"]):
        subprocess.run([str(EXAMPLES / "mint"), args[0], str(creds), *args[1:]], check=True, capture_output=True,
                       timeout=60, env=env)  # fmt: skip
    passwords = [(creds / "clients" / u / "mqtt-password").read_text() for u in ("n1", "fleetfit-optimizer")]
    argv = (tmp_path / "argv").read_text()
    assert argv.count("-U") == 3 and not any(p in argv for p in passwords)
    users = [line.split(":", 1)[0] for line in (creds / "passwd").read_text().splitlines()]
    assert users == ["n1", "fleetfit-optimizer"]  # minted twice, n1 has one entry: the newer password
    assert not list(creds.glob("passwd.*"))  # no plain-text password left behind


async def test_no_account_takes_over_another_client_id(shipped: Shipped, tmp_path: Path) -> None:
    """A node connecting with the optimizer's client id, or another node's, gets its own (its username): the
    owner of that id is not disconnected, and the honest node's windows all arrive."""
    async with running(optimizer_on(shipped, tmp_path)) as optimizer:
        link, windows = honest_link(shipped, 0)
        publisher = asyncio.create_task(link.run())
        await wait_until(link.connected.is_set, 10, "the honest node to connect")
        evil = shipped.settings("evil")
        try:
            for i, w in enumerate(windows[:40]):
                link.queue.put(encode(w))
                stolen = ("fleetfit-optimizer", GOOD[0])[i % 2]  # 40 takeover attempts in all
                async with make_client(evil, stolen):
                    pass
            await wait_until(lambda: optimizer.fleet.accepted["telemetry"] >= 40, 15, "the honest windows")
            record = optimizer.fleet.record("good", GOOD[0])
            assert record is not None and record.status is NodeStatus.ONLINE
        finally:
            publisher.cancel()
            await asyncio.gather(publisher, return_exceptions=True)
        assert optimizer.connects == 1 and link.connects == 1  # neither was ever disconnected
        assert optimizer.fleet.accepted["telemetry"] == 40 and not optimizer.fleet.rejected


async def test_a_flood_that_fills_the_optimizers_queue_costs_the_honest_nodes_nothing(
    shipped: Shipped, tmp_path: Path
) -> None:
    """The broker's queue for an absent optimizer is one per client, shared by every node. A node fills it while
    the optimizer is away, and the broker drops the honest windows that come after. Back, the optimizer finds
    them missing from the honest nodes' sequences and asks for them; the agents send again what they kept.
    (The queue is the shipped one in --full-faults; a tenth of it otherwise, so that the flood takes a second.)"""
    queue = fault_size(2_000, 120_000)
    broker = shipped.broker(tmp_path / "broker", max_queued_messages=str(queue))
    broker.start()
    links = [honest_link(shipped, i, broker.port) for i in (0, 1)]
    tasks: list[asyncio.Task[None]] = []
    try:
        async with running(optimizer_on(shipped, tmp_path, broker.port)):
            pass  # subscribed with a persistent session: the broker now queues for it
        tasks = [asyncio.create_task(link.run()) for link, _ in links]
        await wait_until(lambda: all(link.connected.is_set() for link, _ in links), 10, "the honest nodes")
        for link, windows in links:
            for w in windows[:5]:
                link.queue.put(encode(w))
        await wait_until(lambda: all(not len(link.queue) for link, _ in links), 10, "the first windows")
        junk = [(topic("aaa", "evil", TopicKind.TELEMETRY), b"x" * 100, False)] * (queue + 100)
        await _publish(shipped.settings("evil", broker.port), junk)  # the queue is full
        for link, windows in links:  # these the broker acknowledges, and drops for the optimizer
            for w in windows[5:30]:
                link.queue.put(encode(w))
        await wait_until(lambda: all(link.published >= 30 for link, _ in links), 15, "the honest windows acknowledged")
        optimizer = optimizer_on(shipped, tmp_path, broker.port)
        optimizer.resend_interval, optimizer.resend_delay = 0.5, 0.5
        back = time.monotonic()
        async with running(optimizer, fresh=False):
            for link, windows in links:  # live windows after the gap: the optimizer sees what is missing
                for w in windows[30:35]:
                    link.queue.put(encode(w))
            # the queue's junk comes first: read or refused unread, at the MQTT client's pace (about 1,500 a second
            # over TLS on the test machine), before the live windows show the gap
            await wait_until(
                lambda: optimizer.fleet.accepted["telemetry"] >= 70, 30 + queue / 400, "every honest window"
            )
            fleet = optimizer.fleet
            assert fleet.accepted["telemetry"] == 70
            for link, _ in links:
                assert link.resent >= 20  # what the full queue dropped, sent again on request
            assert optimizer.resend_requests >= 2
            assert fleet.rejected.keys() <= {"bad_json", "rate_limited"}  # the junk: read, or refused unread
            # read until 360 were refused (one more a second refills while it goes on), the rest refused unread
            settings = OptimizerSettings()
            burst, rate = settings.node_refusal_burst, settings.node_refusal_rate
            read = fleet.node_rejections[("aaa", "evil", "bad_json")]
            assert burst <= read <= burst + rate * (time.monotonic() - back) + 5
            assert not [k for k in fleet.node_rejections if k[0] == "good"]
            print(f"queue {queue}: {sum(lk.resent for lk, _ in links)} honest windows sent again on request")
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        broker.stop()


async def test_a_hostile_node_on_the_shipped_broker(shipped: Shipped, tmp_path: Path) -> None:
    """Everything a node account can send, through the shipped broker to a real optimizer: what the ACL lets
    through is refused or contained, and counted by reason; the other site's plans, retained plans and owners
    stay as the honest nodes made them."""
    optimizer = optimizer_on(shipped, tmp_path, node_replay_seconds=200)
    optimizer.lifecycle = Lifecycle.in_state_dir(tmp_path / "state", repair=True)
    optimizer.tracker = Offloaded(optimizer.lifecycle)
    optimizer.ledger = Ledger(optimizer.lifecycle.path)
    async with running(optimizer):
        for i, name in enumerate(GOOD):
            birth, windows = node_data(i, "good")
            honest = [(topic("good", name, TopicKind.BIRTH), encode(birth), True)]
            honest += [(topic("good", name, TopicKind.TELEMETRY), encode(w), False) for w in windows]
            await _publish(shipped.settings(name), honest)
        await wait_until(lambda: optimizer.fleet.accepted["telemetry"] == 48, 15, "the honest windows")
        baseline = _moves(next(p for p in await optimizer.plan_once() if p.site == "good"))
        assert baseline

        evil = shipped.settings("evil")
        birth, windows = node_data(3, "aaa", windows=40, name="evil")  # 8 x L40S
        pod = node_data(1, "good")[1][0].workloads[0]  # chat-serving, of team-serving in site good
        forged = pod.model_copy(update={"owner": "evil-team", "owner_claimed": True, "gpus": [0, 1, 2, 3]})
        # 400 s of windows against a 200 s budget, each reporting another site's workload id with its own owner
        flood = [w.model_copy(update={"workloads": [forged]}) for w in _consecutive(windows[-1], 40, first_seq=100)]
        state = State(node="evil", session=1, status=NodeStatus.ONLINE, timestamp=time.time())
        attacks = [
            # outside its site or its node: the ACL drops these at the broker
            (topic("good", "evil", TopicKind.BIRTH), encode(birth.model_copy(update={"site": "good"})), True),
            (topic("good", GOOD[0], TopicKind.TELEMETRY), encode(windows[0].model_copy(update={"site": "good"})),
             False),
            (f"{P}/good/recommendations", b'{"schema": 2}', True),
            (f"{P}/aaa/recommendations", b'{"schema": 2}', True),
            (f"{P}/good/{GOOD[0]}/resend", b'{"schema": 2, "node": "x", "windows": [[1, 0, 9]]}', False),
            # its own topics, with lies the optimizer refuses
            (topic("aaa", "evil", TopicKind.BIRTH), encode(_with_gpus(birth, 64)), True),
            (topic("aaa", "evil", TopicKind.BIRTH), mutated(birth, lambda r: r.update(session=2**70)), True),
            (topic("aaa", "evil", TopicKind.BIRTH), encode(birth), True),
            *[(topic("aaa", "evil", TopicKind.STATE), encode(state), True)] * 60,  # a state flood
            (topic("aaa", "evil", TopicKind.TELEMETRY), mutated(windows[0], BAD_WINDOWS["negative utilisation"]),
             False),
            (topic("aaa", "evil", TopicKind.TELEMETRY), mutated(windows[1], BAD_WINDOWS["series beyond float32"]),
             False),
            (topic("aaa", "evil", TopicKind.TELEMETRY), mutated(windows[2], lambda r: r.update(samples=50_000)),
             False),
            (topic("aaa", "evil", TopicKind.TELEMETRY),
             mutated(windows[3], lambda r: r["workloads"][0].update(name="\u001b]8;;http://x\u0007click")), False),
            (topic("aaa", "evil", TopicKind.TELEMETRY), b"x" * (1024 * 1024), False),  # never forwarded
            # another site's workload id, with its own team as owner: a workload of its own site, not that one
            (topic("aaa", "evil", TopicKind.TELEMETRY),
             encode(windows[4].model_copy(update={"workloads": [forged]})), False),
            *[(topic("aaa", "evil", TopicKind.TELEMETRY), encode(w), False) for w in flood],
        ]  # fmt: skip
        await _publish(evil, attacks)
        await wait_until(lambda: optimizer.fleet.rejected["time_budget"] >= 1, 15, "the flood to be limited")
        # 200 s of budget: the window with a control character, the forged one, and 18 of the flood
        await wait_until(lambda: optimizer.fleet.accepted["telemetry"] >= 48 + 20, 15, "the evil node's windows")
        await asyncio.sleep(0.5)
        fleet = optimizer.fleet
        assert ("good", "evil") not in fleet.nodes and ("aaa", "evil") in fleet.nodes
        burst = OptimizerSettings().node_birth_burst
        assert dict(fleet.rejected) == {
            "implausible_inventory": 1,
            "schema": 4,  # the session past 2**53, negative utilisation, a float32 overflow, 50,000 samples
            "rate_limited": 3 + 60 - burst,  # births and states past the burst, refused unread
            "time_budget": 22,  # the flood: 180 s of its 400 s taken
        }
        evil_record = fleet.record("aaa", "evil")
        assert evil_record is not None and evil_record.birth is not None and evil_record.birth.session == birth.session
        assert fleet.dropped_fields == {("workloads.name", "control_character"): 1}
        node = {r: n for (s_, n_, r), n in fleet.node_rejections.items() if (s_, n_) == ("aaa", "evil")}
        assert node == {**fleet.rejected, "field_dropped": 1}  # every refusal is the evil node's
        plans = {p.site: p for p in await optimizer.plan_once()}
        assert _moves(plans["good"]) == baseline
        assert optimizer.plans["aaa"].workloads  # the forged id is planned in its own site
        await optimizer.plan_once()  # owners must not alternate from one plan to the next
        # the same id in two sites is two workloads, each charged to its own site's owner
        server = WebServer(optimizer, ApiSettings(port=0))
        await server.start()
        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{server.port}/api/v1/workloads") as r:
                    listed = {(w["site"], w["id"]): w["owner"] for w in await r.json()}
                async with http.get(f"http://127.0.0.1:{server.port}/owners") as r:
                    owners_page = await r.text()
        finally:
            await server.stop()
        assert listed[("good", pod.id)] == "team-serving"
        assert listed[("aaa", pod.id)] == "evil-team (claimed)"
        assert "evil-team (claimed)" in owners_page
        assert optimizer.tracker is not None
        ledger = await optimizer.tracker.read(
            lambda db: db._db.execute(
                "SELECT site, owner FROM workload_owners WHERE workload = ?", (pod.id,)
            ).fetchall()
        )
        assert sorted(ledger) == [("aaa", "evil-team (claimed)"), ("good", "team-serving")]
        # the forged plans and requests never reached anyone: the retained plans are the optimizer's, and the
        # reader (which may read plans) receives them
        seen: dict[str, bytes] = {}
        async with make_client(shipped.settings("fleetfit-reader"), "plan-reader") as reader:
            await reader.subscribe(f"{P}/+/recommendations", qos=1)

            async def collect() -> None:
                async for m in reader.messages:
                    seen[str(m.topic).split("/")[2]] = bytes(m.payload)  # type: ignore[arg-type]
                    if len(seen) == 2:
                        return

            await asyncio.wait_for(collect(), 10)
        for site in ("good", "aaa"):
            assert Plan.model_validate_json(seen[site]).generated_at == optimizer.plans[site].generated_at

    # the node leaves a poisoned birth retained (a MIG instance naming a parent GPU the birth does not list beside
    # the one it does), and the optimizer restarts: the birth comes back and is refused, every other site plans
    poisoned = mutated(birth, lambda r: r.update(gpus=[r["gpus"][0], dict(r["gpus"][0], index=1, parent=3)]))
    await _publish(evil, [(topic("aaa", "evil", TopicKind.BIRTH), poisoned, True)])
    async with running(optimizer_on(shipped, tmp_path / "again")) as again:
        await wait_until(lambda: again.fleet.accepted["birth"] >= 8 and again.fleet.rejected, 15, "the retained births")
        assert again.fleet.rejected == {"schema": 1}
        plans = {p.site: p for p in await again.plan_once()}
        assert "good" in plans  # planned from the retained births (no windows yet)
        assert "aaa" not in plans or not plans["aaa"].workloads  # the evil node is only a retained state now


async def test_the_broker_refuses_what_exceeds_its_message_size_limit(shipped: Shipped) -> None:
    """The limit sits near the largest honest message, a large site's plan (about 750 bytes a workload)."""
    got: list[int] = []
    async with make_client(shipped.settings(READER), READER) as reader:
        await reader.subscribe(f"{P}/aaa/evil/telemetry", qos=1)
        await reader.subscribe(f"{P}/aaa/recommendations", qos=1)
        with contextlib.suppress(aiomqtt.MqttError):  # the broker may also drop the connection that sent it
            async with make_client(shipped.settings("evil"), "evil") as client:
                await client.publish(topic("aaa", "evil", TopicKind.TELEMETRY), b"y" * (4 * 2**20 + 1), qos=0)
        await _publish(shipped.settings("evil"), [(topic("aaa", "evil", TopicKind.TELEMETRY), b"small", False)])
        plan = b"p" * (3 * 2**20)  # a plan of 4,000 workloads: through
        await _publish(shipped.settings("fleetfit-optimizer"), [(f"{P}/aaa/recommendations", plan, False)])
        async with asyncio.timeout(5):
            async for m in reader.messages:
                if not m.retain:  # (a plan an earlier test left retained)
                    got.append(len(m.payload))  # type: ignore[arg-type]
                if len(got) == 2:
                    break
    assert got == [5, 3 * 2**20]


def test_the_shipped_acl_names_no_node_wildcard() -> None:
    lines = [line for line in (EXAMPLES / "acl").read_text().splitlines() if line and not line.startswith("#")]
    assert not [line for line in lines if line.startswith("pattern")]  # a pattern's + would span sites


# ------------------------------------------------------------------------------------- supervision


async def test_a_reconnect_outlives_a_ca_file_missing_for_a_while(
    shipped: Shipped, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The CA file unreadable while the optimizer and an agent reconnect: each logs it, keeps trying, and is
    back once the file is; the optimizer then stops cleanly."""
    ca = tmp_path / "ca.crt"
    shutil.copy(shipped.credentials / "ca.crt", ca)
    optimizer = optimizer_on(shipped, tmp_path)
    optimizer.config.mqtt.ca_file = ca
    link, windows = honest_link(shipped, 2)
    link._settings = link._settings.model_copy(update={"ca_file": ca})
    async with running(optimizer):
        publisher = asyncio.create_task(link.run())
        try:
            await wait_until(link.connected.is_set, 10, "the agent to connect")
            ca.rename(tmp_path / "away")
            # their own accounts connecting elsewhere (a second process of each) end both sessions
            for user in ("fleetfit-optimizer", GOOD[2]):
                async with make_client(shipped.settings(user), user):
                    pass
            await wait_until(lambda: not optimizer.connected.is_set() and not link.connected.is_set(), 10, "both cut")
            await asyncio.sleep(2.0)
            assert not optimizer.connected.is_set() and not link.connected.is_set()
            (tmp_path / "away").rename(ca)
            await wait_until(lambda: optimizer.connected.is_set() and link.connected.is_set(), 15, "both back")
            for w in windows[:3]:
                link.queue.put(encode(w))
            await wait_until(lambda: optimizer.fleet.accepted["telemetry"] >= 3, 10, "windows after the outage")
        finally:
            publisher.cancel()
            await asyncio.gather(publisher, return_exceptions=True)
    assert optimizer.failed is None and optimizer.connects >= 2 and link.connects >= 2
    said = [r.getMessage() for r in caplog.records if "No such file" in r.getMessage()]
    assert any(m.startswith("broker 127.0.0.1") for m in said)  # the optimizer's
    assert any(m.startswith("cannot connect to the broker") for m in said)  # the agent's


async def test_a_task_that_dies_stops_the_optimizer_and_shutdown_still_flushes(tmp_path: Path) -> None:
    """No long-lived task should ever end; one that does (a bug) is logged, stops the watchdog pings and the
    daemon (exit 1, so that systemd restarts it), and the alerts and store are flushed on the way out."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(tmp_path / "notify"))
    server.setblocking(False)
    config = OptimizerConfig(mqtt=MqttSettings(port=free_port()), optimizer=OptimizerSettings(solve_interval=0.5))
    optimizer = Optimizer(config, load_catalog())
    optimizer.notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "400000"})
    flushed: list[str] = []

    class Store:
        async def run(self) -> None:
            await asyncio.Event().wait()

        async def flush(self, limit: float) -> None:
            flushed.append("store")

        def close(self) -> None:
            flushed.append("closed")

    optimizer.store = Store()  # type: ignore[assignment]

    async def fails() -> list[Plan]:
        raise RuntimeError("a bug")

    async def planning_dies() -> None:
        await asyncio.sleep(1.5)
        raise KeyError("a bug past the planning loop's guard")

    optimizer.plan_once = fails  # type: ignore[method-assign]  # caught, logged, retried by the loop
    optimizer._planning = planning_dies  # type: ignore[method-assign]
    try:
        await asyncio.wait_for(optimizer.run(), 15)
        messages = []
        with contextlib.suppress(BlockingIOError):
            while True:
                messages.append(server.recv(64))
    finally:
        server.close()
    assert optimizer.failed is not None and "optimizer-planning died: KeyError" in optimizer.failed
    assert messages[0] == b"READY=1" and messages[-1] == b"STOPPING=1" and messages.count(b"WATCHDOG=1") >= 2
    assert flushed == ["store", "closed"]


async def test_a_dead_broker_link_stops_the_agents_watchdog(tmp_path: Path) -> None:
    from agent.config import AgentConfig, AgentSettings
    from agent.service import Agent
    from collectors.sim.scenarios import simulated_node

    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(tmp_path / "notify"))
    server.setblocking(False)
    node = build_scenario("demo", 8)[0]
    config = AgentConfig(
        agent=AgentSettings(node=node.name, site="lab", publish_interval=1.0, state_dir=tmp_path),
        mqtt=MqttSettings(port=free_port()),
    )
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "200000"})
    agent = Agent(config, [simulated_node(node, time.time, 0)], session=1, queue=MemoryQueue(10), notifier=notifier)

    async def link_dies() -> None:
        await asyncio.sleep(1.0)
        raise RuntimeError("a bug the link's own retries did not catch")

    agent.link.run = link_dies  # type: ignore[method-assign]
    task = asyncio.create_task(agent.run())
    pings: list[float] = []
    try:
        deadline = time.monotonic() + 2.8
        while time.monotonic() < deadline:
            with contextlib.suppress(BlockingIOError):
                while True:
                    if server.recv(64) == b"WATCHDOG=1":
                        pings.append(time.monotonic())
            await asyncio.sleep(0.05)
    finally:
        agent.should_exit.set()
        await asyncio.wait_for(task, 15)
        server.close()
    started = pings[0]
    assert pings and all(p - started < 1.6 for p in pings)  # pings stopped once the link died (at 1 s)
    assert agent.link_died is not None and "a bug" in agent.link_died


# --------------------------------------------------------------------------------------------------- HTTP


async def test_a_thousand_slow_clients_cost_the_api_nothing(
    shipped: Shipped, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """1,030 clients that open a connection and send half a request (the default descriptor limit is 1,024):
    /healthz still answers at once, the half-sent requests are closed after the header timeout, and the log
    stays quiet."""
    async with running(optimizer_on(shipped, tmp_path)) as optimizer:
        settings = ApiSettings(port=0, header_timeout=5.0, max_connections=256)
        server = WebServer(optimizer, settings)
        await server.start()
        slow: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            for _ in range(1030):
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                slow.append((reader, writer))
            async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{server.port}/healthz") as r:
                assert r.status == 200 and (await r.json())["status"] == "ok"
            assert server.refused["header_timeout"] == 0  # answered before any slow client timed out
            assert server.refused["connection_cap"] >= 1030 - 256
            # every slow client is closed by the header timeout, or was pushed out at the cap
            closed = await asyncio.wait_for(asyncio.gather(*(r.read() for r, _ in slow)), 20)
            assert all(data == b"" or data.startswith(b"HTTP/1.1 4") for data in closed)
        finally:
            for _, writer in slow:
                writer.close()
            await server.stop()
    noisy = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not noisy and sum(len(r.getMessage()) for r in caplog.records) < 20_000


async def test_every_response_carries_the_security_headers_and_bad_requests_are_4xx(tmp_path: Path) -> None:
    config = OptimizerConfig(mqtt=MqttSettings(port=free_port()), optimizer=OptimizerSettings(state_dir=tmp_path))
    optimizer = Optimizer(config, load_catalog())
    server = WebServer(optimizer, ApiSettings(port=0, token="t0ken", hosts=["fleetfit.example.com"]))  # type: ignore[arg-type]
    await server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        async with aiohttp.ClientSession() as http:
            for path in ("/no-such-page", "/static/none.css", "/workload?id=x"):
                async with http.get(base + path) as r:
                    assert r.status == 404, path
                    assert r.headers["X-Content-Type-Options"] == "nosniff"
                    assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
            # a page served by DNS rebinding (evil.example resolving to this address) names its own Host
            # /healthz: 503 here (no broker), from any name the server answers to; a page served by DNS rebinding
            # (evil.example resolving to this address) names its own Host, and is refused
            for host, status in (("evil.example:8470", 421), ("fleetfit.example.com", 503), ("localhost:80", 503)):
                async with http.get(f"{base}/healthz", headers={"Host": host}) as r:
                    assert r.status == status, host
                    assert r.headers["X-Content-Type-Options"] == "nosniff"
        # an Authorization header that is no UTF-8 at all: 400, not a 500 and a traceback
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(
            b"POST /api/v1/recommendations/abc/ack HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer \xff\xfe\x80\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 400"), answer[:60]
        assert b"nosniff" in answer
    finally:
        await server.stop()
    assert server.refused["host"] == 1


# ---------------------------------------------------------------------------------------------- inventory


async def test_a_node_claiming_more_than_the_site_inventory_is_planned_from_the_inventory(
    shipped: Shipped, tmp_path: Path
) -> None:
    """An 8 x L40S node says it holds 16 H100s: with the site's inventory of record it is flagged, and planned
    as the 8 L40S it is; its windows for GPUs it does not have are refused."""
    inventory = tmp_path / "aaa.csv"
    inventory.write_text("node,hardware,gpus\nevil,l40s,8\n")
    optimizer = optimizer_on(shipped, tmp_path)
    optimizer.config.sites = {"aaa": SiteSettings(inventory=inventory)}
    optimizer.fleet.limits = ingest_limits(optimizer.config, optimizer.catalog)
    birth, windows = node_data(3, "aaa", name="evil")  # 8 x L40S
    h100 = birth.gpus[0].model_copy(update={"model": "NVIDIA H100 80GB HBM3", "memory_mib": 81_559,
                                             "pci_device_id": "0x233010de"})  # fmt: skip
    lie = birth.model_copy(
        update={"gpus": [h100.model_copy(update={"index": i, "uuid": f"GPU-{i}"}) for i in range(16)]}
    )
    high = mutated(windows[1], lambda r: r["workloads"][0].update(gpus=[12, 13]))
    async with running(optimizer):
        await _publish(
            shipped.settings("evil"),
            [(topic("aaa", "evil", TopicKind.BIRTH), encode(lie), True)]
            + [(topic("aaa", "evil", TopicKind.TELEMETRY), encode(w), False) for w in windows[:1] + windows[2:]]
            + [(topic("aaa", "evil", TopicKind.TELEMETRY), high, False)],
        )
        await wait_until(lambda: optimizer.fleet.accepted["telemetry"] >= 5, 15, "the windows")
        await wait_until(lambda: optimizer.fleet.rejected["gpu_index"] >= 1, 5, "the window on GPUs it lacks")
        record = optimizer.fleet.record("aaa", "evil")
        assert record is not None and record.birth is not None
        assert [g.model for g in record.birth.gpus] == ["NVIDIA L40S"] * 8
        assert optimizer.health()["inventory_mismatch"] == {
            "aaa": {"evil": "claims 16 × NVIDIA H100 80GB HBM3; the inventory lists 8 × L40S 48GB"}
        }
        plan = next(p for p in await optimizer.plan_once() if p.site == "aaa")
        assert {w.hardware for w in plan.workloads} == {"L40S 48GB"}
        from agent.metrics import render

        assert 'fleetfit_inventory_mismatch{site="aaa",node="evil"} 1' in render(optimizer_metrics(optimizer))


# -------------------------------------------------------------------------------------- the state directory


async def test_a_corrupt_state_file_is_moved_aside_and_the_optimizer_plans_and_alerts(
    shipped: Shipped, tmp_path: Path
) -> None:
    """`fleetfit optimizer` as systemd runs it, on the shipped broker, with a fleetfit.db that is not a database:
    it starts, moves the file aside, plans, posts its alerts, and says what it did (log, /healthz, metrics)."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "fleetfit.db").write_bytes(b"\x00garbage, not SQLite\xff" * 400)
    api_port = free_port()
    config = tmp_path / "optimizer.toml"
    config.write_text(
        f'[optimizer]\nstate_dir = "{state}"\nsolve_interval = 1.0\n'
        f'[mqtt]\nhost = "127.0.0.1"\nport = {shipped.server.port}\ntls = true\n'
        f'ca_file = "{shipped.credentials / "ca.crt"}"\nusername = "fleetfit-optimizer"\n'
        f'password_file = "{shipped.credentials / "clients" / "fleetfit-optimizer" / "mqtt-password"}"\n'
        f"[api]\nport = {api_port}\n[alerts]\ngroup_wait = 0.0\nsettle_seconds = 0.0\nsettle_plans = 1\n"
        '[[alerts.receivers]]\nname = "ops"\nkind = "generic"\nurl_env = "OPS_WEBHOOK"\n'
    )
    with webhook_server() as hooks:
        env = {"OPS_WEBHOOK": hooks.url("/ops"), "PATH": "/usr/bin:/bin"}
        proc = await asyncio.create_subprocess_exec(
            FLEETFIT, "optimizer", "--config", str(config), env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            async with aiohttp.ClientSession() as http:

                async def health() -> dict[str, Any]:
                    try:
                        async with http.get(f"http://127.0.0.1:{api_port}/healthz") as r:
                            return dict(await r.json())
                    except aiohttp.ClientError:
                        return {}

                for _ in range(100):
                    if (await health()).get("status") not in (None, "broker unreachable"):
                        break
                    await asyncio.sleep(0.2)
                for i, name in enumerate(GOOD):
                    birth, windows = node_data(i, "good")
                    await _publish(shipped.settings(name), [(topic("good", name, TopicKind.BIRTH), encode(birth), True)]
                                   + [(topic("good", name, TopicKind.TELEMETRY), encode(w), False) for w in windows])  # fmt: skip
                await asyncio.to_thread(hooks.wait_for, 1, 30)
                said = await health()
                async with http.get(f"http://127.0.0.1:{api_port}/metrics") as r:
                    metrics = await r.text()
        finally:
            proc.send_signal(signal.SIGTERM)
            _, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0
    aside = list(state.glob("fleetfit.db.damaged-*"))
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"\x00garbage")
    assert said["status"] == "degraded" and "moved aside" in said["state"] and aside[0].name in said["state"]
    assert 'fleetfit_state_problems_total{reason="damaged"} 1' in metrics
    assert b"moved aside" in stderr
    assert [m["id"] for d in hooks.delivered for m in d.json()["firing"]]  # it planned and alerted
    # the fresh file holds what the daemon did: its recommendations
    import sqlite3

    with contextlib.closing(sqlite3.connect(state / "fleetfit.db")) as db:
        assert db.execute("SELECT COUNT(*) FROM recommendations").fetchone()[0] >= 1


def _state_optimizer(state_dir: Path, hooks_url: str) -> Optimizer:
    from optimizer.serve.alerts.alerter import Alerter
    from optimizer.serve.alerts.settings import AlertSettings, ReceiverSettings

    os.environ["FLEETFIT_TEST_HOOK"] = hooks_url
    lifecycle = Lifecycle.in_state_dir(state_dir, repair=True)
    alerts = AlertSettings(  # posted from the first plan that proposes a move (settling has its own tests)
        group_wait=0.0,
        settle_seconds=0.0,
        settle_plans=1,
        receivers=[ReceiverSettings(name="ops", kind="generic", url_env="FLEETFIT_TEST_HOOK")],
    )
    alerter = Alerter.in_state_dir(alerts, lifecycle.path.parent)
    config = OptimizerConfig(
        mqtt=MqttSettings(port=free_port()), optimizer=OptimizerSettings(state_dir=state_dir, solve_interval=3600)
    )
    optimizer = Optimizer(config, load_catalog(), lifecycle=lifecycle, alerter=alerter)
    _feed(optimizer, "lab", range(8))
    return optimizer


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: the real kernel's ENOSPC and read-only mounts (needs root for ``mount``)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)],
                          capture_output=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


async def test_a_read_only_state_directory_degrades_the_optimizer_and_never_stops_it(small_disk: Path) -> None:
    Lifecycle.in_state_dir(small_disk).close()  # a sound state file, on a file system then mounted read-only
    remount = await asyncio.create_subprocess_exec("mount", "-o", "remount,ro", str(small_disk))
    assert await remount.wait() == 0
    with webhook_server() as hooks:
        optimizer = _state_optimizer(small_disk, hooks.url("/ops"))
        alerts = asyncio.create_task(optimizer.alerter.run()) if optimizer.alerter else None
        try:
            plans = await optimizer.plan_once()
            await asyncio.to_thread(hooks.wait_for, 1, 15)
        finally:
            if alerts is not None:
                alerts.cancel()
    assert plans and plans[0].recommendations and not optimizer.failing_sites
    problem = optimizer.health()["state"]
    assert isinstance(problem, str) and "read_only" in problem and "until the optimizer stops" in problem


async def test_a_full_state_disk_never_stops_planning_or_alerts(small_disk: Path) -> None:
    with webhook_server() as hooks:
        optimizer = _state_optimizer(small_disk, hooks.url("/ops"))
        filler = small_disk / "filler"
        with filler.open("wb") as f, contextlib.suppress(OSError):
            f.write(b"\0" * (2 << 20))  # more than the disk holds: every free byte taken
        alerts = asyncio.create_task(optimizer.alerter.run()) if optimizer.alerter else None
        try:
            plans = await optimizer.plan_once()
            await asyncio.to_thread(hooks.wait_for, 1, 15)
            await asyncio.sleep(0.2)
            problem = optimizer.health()["state"]
            failures = optimizer.state_write_failures
            assert alerts is not None and not alerts.done()  # the alert loop outlived the failed log write
            filler.unlink()  # space again: states and the alert log are written again, and the daemon says so
            await optimizer.plan_once()
        finally:
            if alerts is not None:
                alerts.cancel()
    assert plans and plans[0].recommendations and not optimizer.failing_sites  # planned regardless
    assert isinstance(problem, str) and "states" in problem and "alert log" in problem and "full" in problem
    assert failures == 1
    assert optimizer.health()["state"] is None
    assert optimizer.lifecycle is not None and optimizer.lifecycle.list("lab")
    assert optimizer.alerter is not None
    posted = [m["id"] for d in hooks.delivered for m in d.json()["firing"]]
    assert posted and all(optimizer.alerter.journal.sent("ops", rec) is not None for rec in posted)  # caught up


# ------------------------------------------------------------------------- what a node's own users control


def _process(root: Path, pid: int, cgroup: str, comm: str = "python3", environ: bytes = b"", uid: int = 0) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cgroup").write_text(f"0::{cgroup}\n")
    (d / "comm").write_text(comm + "\n")
    (d / "environ").write_bytes(environ)
    (d / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")


def test_a_users_own_cgroup_names_no_job_pod_or_unit(tmp_path: Path) -> None:
    """systemd delegates /user.slice/.../user@UID.service to the user, who can make any cgroup there; only where
    slurmstepd, the kubelet or systemd's system slices put a process does its cgroup name a workload."""
    from collectors.attribution import Attributor, owner_from_cgroup

    user = "/user.slice/user-1000.slice/user@1000.service/app.slice"
    pod = "pod0a1b2c3d-0000-4000-8000-000000000001"
    for path in (f"{user}/job_4242/step_0", f"{user}/slurm/uid_1000/job_4242", f"{user}/kubepods/{pod}",
                 f"{user}/finance.service", "/home/job_4242", "/system.slice/ssh.service/job_4242"):  # fmt: skip
        found = owner_from_cgroup(path)
        assert found is None or found[1] not in (WorkloadKind.SLURM_JOB, WorkloadKind.KUBERNETES_POD), path
        # at most the user's own unit, named within the user: never a system unit or another user's
        assert found is None or found[0] == "systemd/ssh.service" or found[0].startswith("systemd/user@1000.service"), (
            path
        )
    # the real layouts still name theirs
    assert owner_from_cgroup("/slurm/uid_1000/job_4242/step_0/task_0")[:2] == ("slurm/4242", WorkloadKind.SLURM_JOB)  # type: ignore[index]
    assert owner_from_cgroup("/system.slice/node7_slurmstepd.scope/job_4242/step_0")[0] == "slurm/4242"  # type: ignore[index]
    assert owner_from_cgroup(f"/kubepods/burstable/{pod}/abc")[1] is WorkloadKind.KUBERNETES_POD  # type: ignore[index]
    assert owner_from_cgroup("/inference.slice/vllm.service")[0] == "systemd/vllm.service"  # type: ignore[index]
    # a job's own nested cgroup is its job, not the one its name claims
    nested = "/system.slice/slurmstepd.scope/job_77/step_0/user/job_4242/task_0"
    assert owner_from_cgroup(nested)[0] == "slurm/77"  # type: ignore[index]
    _process(tmp_path, 10, f"{user}/job_4242", comm="\x1b[31mpython\u202e")
    owner = Attributor(tmp_path, node="n1").owner(10)
    # the user's own systemd instance at most, never the job its name claims
    assert owner.id == "systemd/user@1000.service" and owner.hint == "[31mpython"


def test_an_account_a_job_gives_itself_is_claimed_unless_the_scheduler_confirms_it(tmp_path: Path) -> None:
    """SLURM_JOB_ACCOUNT is the job's own environment: a job may set it to any team. scontrol (the scheduler's
    record) confirms or corrects it; without scontrol it is reported as claimed. The user is the process's uid."""
    from collectors.attribution import Attributor, OwnerReader, SlurmJobs

    job = "/system.slice/slurmstepd.scope/job_4242/step_0"
    env = b"SLURM_JOB_ACCOUNT=finance-team\0SLURM_JOB_USER=ceo\0"
    _process(tmp_path / "proc", 7, job, environ=env, uid=0)
    # scontrol as Slurm ships it answers `show job -o ID`; this machine has no Slurm, so a stand-in answers the
    # same way: one line of Key=Value, or exit 1 with "Invalid job id specified"
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(
        "#!/bin/sh\n"
        'if [ "$4" = 4242 ]; then echo "JobId=4242 JobName=train UserId=ada(1000) GroupId=ada(1000) '
        'Account=physics QOS=normal JobState=RUNNING"; exit 0; fi\n'
        'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1\n'
    )
    scontrol.chmod(0o755)
    attributor = Attributor(tmp_path / "proc", node="n1")
    owner = attributor.owner(7)
    unconfirmed = OwnerReader(tmp_path / "proc", tmp_path / "pods", slurm=SlurmJobs(scontrol=""))
    assert unconfirmed.of(7, owner) == ("finance-team", "root", True)  # claimed, and the user is the uid's
    jobs = SlurmJobs(scontrol=str(scontrol))
    reader = OwnerReader(tmp_path / "proc", tmp_path / "pods", slurm=jobs)
    assert reader.of(7, owner) == ("finance-team", "root", True)  # asked on a thread: not yet answered
    deadline = time.monotonic() + 10
    while reader.of(7, owner)[2] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert reader.of(7, owner) == ("physics", "root", None)  # the scheduler's account wins
    jobs.close()
    # through the optimizer: a claimed owner is charged apart, never to the team it names
    fleet = live_fleet(Clock())
    birth, windows = node_data(1, "aaa")
    claimed = windows[0].workloads[0].model_copy(update={"owner": "finance-team", "owner_claimed": True})
    fleet.ingest(topic("aaa", birth.node, TopicKind.BIRTH), encode(birth))
    fleet.ingest(
        topic("aaa", birth.node, TopicKind.TELEMETRY), encode(windows[0].model_copy(update={"workloads": [claimed]}))
    )
    from optimizer.serve.report import owners_of

    assert owners_of(fleet, "aaa") == {claimed.id: "finance-team (claimed)"}


@pytest.mark.parametrize(
    ("cmdline", "program"),
    [
        (b"python train.py --api-key=hf_SECRET\0\0\0\0", "train.py"),  # setproctitle: one string, spaces
        (b"python\0train.py\0--api-key=hf_SECRET\0", "train.py"),
        (
            b"env\0HF_TOKEN=hf_SECRET\0python\0-m\0vllm.entrypoints.openai.api_server\0--port=8000\0",
            "vllm.entrypoints.openai.api_server",
        ),
        (b"/usr/bin/env HF_TOKEN=hf_SECRET torchrun --nproc-per-node=8 train.py", "torchrun"),
        (b"HF_TOKEN=hf_SECRET", None),
        (b"--api-key=hf_SECRET", None),
        (b"python\ttrain.py\n--token\thf_SECRET", "train.py"),
    ],
)
def test_program_never_carries_arguments_or_assignments(cmdline: bytes, program: str | None) -> None:
    from collectors.workload_facts import program_of

    assert program_of(cmdline) == program


def test_a_huge_tcp_table_is_read_bounded_and_off_the_sampling_loop(tmp_path: Path) -> None:
    """A busy server's table: 200,000 sockets in TIME_WAIT (the kernel lists them all) around one listening
    socket and its connections. Reading it keeps only those, and the window never waits for it."""
    from collectors.workload_facts import MAX_SOCKETS_KEPT, WorkloadFacts, read_table

    proc = tmp_path / "proc"
    netns = "net:[4026532000]"
    pid = proc / "50"
    (pid / "net").mkdir(parents=True)
    (pid / "ns").mkdir()
    (pid / "ns" / "net").symlink_to(netns)
    (proc / "1" / "ns").mkdir(parents=True)
    (proc / "1" / "ns" / "net").symlink_to("net:[4026531840]")  # the host's: the pod has its own
    (pid / "cmdline").write_bytes(b"vllm\0serve\0")
    (pid / "cgroup").write_text("0::/kubepods/pod1/abc\n")
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    rows = [f"{i:5d}: 0A00000A:1F90 0B00000A:{40000 + i % 20000:04X} 06 00000000:00000000 03:00000000 00000000     0        0 0 3 0000000000000000\n" for i in range(200_000)]  # fmt: skip
    rows.append(
        "    0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0000000000000000\n"
    )
    rows += [f"    0: 0A00000A:1F90 0C{i:06X}:9C40 01 00000000:00000000 00:00000000 00000000     0        0 {200 + i} 1 0000000000000000\n" for i in range(3)]  # fmt: skip
    (pid / "net" / "tcp").write_text(header + "".join(rows))
    (pid / "net" / "tcp6").write_text(header)
    kept = read_table(pid / "net" / "tcp", 32768)
    assert len(kept) == 4 and len(kept) <= MAX_SOCKETS_KEPT  # the listener and its three connections
    facts = WorkloadFacts(proc, background=True)
    ref = WorkloadRef(id="k8s/x", kind=WorkloadKind.KUBERNETES_POD, name="x", gpus=[0])
    first = facts.enrich([ref], {"k8s/x": [50]})[0]
    assert first.listen_ports == []  # the window did not wait: the table is being read meanwhile
    deadline = time.monotonic() + 20
    while (later := facts.enrich([ref], {"k8s/x": [50]})[0]).listen_ports == [] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert later.listen_ports == [8080] and later.inbound_connections == 3 and later.inbound_peers == 3
    facts.close()


# ------------------------------------------------------------------------------ the agent keeps what it sent


def test_sent_windows_are_kept_and_queued_again_on_request(tmp_path: Path) -> None:
    from agent.spool import DiskSpool

    _, windows = node_data(0, "lab", windows=12)
    spool = DiskSpool(tmp_path / "spool", max_windows=100, max_bytes=1 << 20, keep_sent_bytes=1 << 20)
    for w in windows:
        spool.put(encode(w))
    while (head := spool.peek()) is not None:
        spool.pop(head[0])  # the broker acknowledged each
    assert len(spool) == 0 and len(list((tmp_path / "sent").glob("*.window"))) == 12
    session = windows[0].session
    # a restart in between: what was kept is still there
    again = DiskSpool(tmp_path / "spool", max_windows=100, max_bytes=1 << 20, keep_sent_bytes=1 << 20)
    assert again.resend([(session, 3, 5), (session, 40, 41), (session + 1, 0, 9)]) == 3
    replayed = []
    while (head := again.peek()) is not None:
        replayed.append(json.loads(head[1])["seq"])
        again.pop(head[0])
    assert replayed == [3, 4, 5]
    assert again.resend([(session, 3, 5)]) == 3  # sent again, and kept again
    small = DiskSpool(
        tmp_path / "small", max_windows=100, max_bytes=1 << 20, keep_sent_bytes=3 * len(encode(windows[0]))
    )
    for w in windows:
        small.put(encode(w))
        small.pop(small.peek()[0])  # type: ignore[index]
    assert small.resend([(session, 0, 11)]) <= 3  # bounded: the oldest sent go first


def test_a_foreign_database_in_the_state_directory_is_set_aside(tmp_path: Path) -> None:
    """A SQLite file of something else under fleetfit's name (a restore gone wrong): moved aside, not written into
    and not fatal; a sound one is used as it is."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(tmp_path / "fleetfit.db")) as db:
        db.execute("CREATE TABLE recommendations (name TEXT, price REAL)")
        db.execute("INSERT INTO recommendations VALUES ('keep me', 1.0)")
        db.commit()
    lifecycle = Lifecycle.in_state_dir(tmp_path, repair=True)
    assert lifecycle.problem is not None and "foreign" in lifecycle.problem and "lacks" in lifecycle.problem
    assert lifecycle.path == tmp_path / "fleetfit.db" and not lifecycle.list()
    (aside,) = tmp_path.glob("fleetfit.db.damaged-*")
    with contextlib.closing(sqlite3.connect(aside)) as db:
        assert db.execute("SELECT name FROM recommendations").fetchall() == [("keep me",)]
    lifecycle.close()
    again = Lifecycle.in_state_dir(tmp_path, repair=True)  # now sound: used as it is
    assert again.problem is None and again.path == tmp_path / "fleetfit.db"
    again.close()


async def test_an_optimizer_stopped_in_the_middle_of_a_backlog_loses_none_of_it(
    shipped: Shipped, tmp_path: Path
) -> None:
    """The broker hands a returning optimizer its backlog as fast as the socket goes, faster than ingest. What the
    optimizer received but had not taken in when it stopped is delivered again to the next one: it acknowledges a
    message once it has taken it in, not on receipt."""
    name = GOOD[3]
    birth, windows = node_data(3, "good", windows=1)
    backlog = _consecutive(windows[0], 3000)  # 8 h of windows, inside the day a node may replay at once
    async with running(optimizer_on(shipped, tmp_path)):
        pass  # its session is kept while it is away
    await _publish(shipped.settings(name), [(topic("good", name, TopicKind.BIRTH), encode(birth), True)]
                   + [(topic("good", name, TopicKind.TELEMETRY), encode(w), False) for w in backlog])  # fmt: skip
    taken: Counter[int] = Counter()

    def counting(optimizer: Optimizer, stop_at: int | None = None) -> Optimizer:
        ingest = optimizer.fleet.ingest

        def counted(t: str, payload: bytes | bytearray) -> Birth | State | Window | None:
            message = ingest(t, payload)
            if isinstance(message, Window):
                taken[message.seq] += 1
                if len(taken) == stop_at:  # stopped from within: the backlog is still streaming in
                    optimizer.should_exit.set()
            return message

        optimizer.fleet.ingest = counted  # type: ignore[method-assign]
        return optimizer

    async with running(counting(optimizer_on(shipped, tmp_path), stop_at=300), fresh=False):
        await wait_until(lambda: len(taken) >= 300, 15, "the backlog to start arriving")
    first = len(taken)
    async with running(counting(optimizer_on(shipped, tmp_path)), fresh=False):
        await wait_until(lambda: len(taken) >= 3000, 30, "the rest of the backlog")
    assert first < 3000 and sorted(taken) == [w.seq for w in backlog]
