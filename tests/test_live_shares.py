"""Fractional GPUs in the live optimizer: MIG instances, AMD compute partitions and GPUs shared by several
workloads, from the GPU collector (fake NVML) through the wire protocol and ingest to the snapshot and the plan."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pynvml
from conftest import MosquittoServer, free_port, wait_until, write_agent_config
from fake_nvml import FakeGpu, make_fake_nvml

from agent.config import AgentConfig, MqttSettings, load_config
from agent.metrics import render
from agent.protocol import Birth, GpuInfo, Telemetry, WorkloadClass, WorkloadKind, WorkloadRef, encode
from agent.service import Agent
from agent.spool import MemoryQueue
from agent.window import WindowBuilder
from collectors.attribution import Attributor
from collectors.base import Entity, Sample
from collectors.gpu import NvmlGpuCollector, open_gpu_collector
from optimizer.decide.catalog import load_catalog
from optimizer.decide.costs import Demand, fit_problem, monthly_cost
from optimizer.decide.snapshot import Snapshot, from_fleet, resolve
from optimizer.ingest.fleet import Fleet
from optimizer.ingest.shares import layout, mig_profile, partition_share
from optimizer.plan.recommend import PlanSettings, plan_snapshot
from optimizer.serve.config import OptimizerConfig, OptimizerSettings
from optimizer.serve.lifecycle import Lifecycle
from optimizer.serve.selfmetrics import optimizer_metrics
from optimizer.serve.service import Optimizer

PREFIX = "fleetfit/v1"
NOT_AVAILABLE = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
SITE = "s1"
WINDOWS = 12
TICKS = 10


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _unit(root: Path, pid: int, unit: str) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cgroup").write_text(f"0::/system.slice/{unit}.service\n")
    (d / "comm").write_text("python3\n")
    (d / "stat").write_text(f"{pid} (python3) S 1 {pid} {pid} 0 -1\n")


def _record(fleet: Fleet, collector: NvmlGpuCollector, node: str) -> None:
    """What the node's agent publishes: its birth, then WINDOWS windows of TICKS one-second samples."""
    start = time.time() - WINDOWS * TICKS
    inv = collector.inventory()
    birth = Birth(
        node=node,
        site=SITE,
        session=1,
        agent_version="test",
        hostname=node,
        timestamp=start,
        gpus=inv.gpus,
        driver_version=inv.driver_version,
    )
    assert fleet.ingest(f"{PREFIX}/{SITE}/{node}/birth", encode(birth)) is not None
    builder = WindowBuilder(node, SITE, 1)
    for seq in range(WINDOWS):
        for t in range(TICKS):
            builder.add(collector.sample(), float(seq * TICKS + t))
        window = builder.close(seq, start + seq * TICKS, start + (seq + 1) * TICKS, collector.workloads())
        assert fleet.ingest(f"{PREFIX}/{SITE}/{node}/telemetry", encode(window)) is not None, fleet.node_rejections


def _open(gpus: list[FakeGpu], root: Path) -> NvmlGpuCollector:
    collector = open_gpu_collector(make_fake_nvml(gpus), Attributor(root, node="n1"), Clock())
    assert isinstance(collector, NvmlGpuCollector)
    return collector


def _l4_node(tmp_path: Path, node: str) -> NvmlGpuCollector:
    """A node of eight L4s, nothing on them: somewhere to move to."""
    gpus = [FakeGpu(name="NVIDIA L4", memory_total=24 * 2**30, memory_used=0, util=0, nvlink_links=0) for _ in range(8)]
    return _open(gpus, tmp_path / f"proc-{node}")


# ---------------------------------------------------------------- MIG


def test_a_mig_node_full_of_1g_slices_is_planned_with_each_workloads_profile(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    slices = []
    for n in range(7):
        _unit(root, 100 + n, f"svc-{n}")
        name = "NVIDIA H100 80GB HBM3 MIG 1g.10gb" + ("+me" if n == 0 else "")
        slices.append(FakeGpu(name=name, memory_total=10 * 2**30, memory_used=4 * 2**30, gpu_instance_id=n + 1))
        slices[-1].gpm = {1: 35.0}
        slices[-1].pids = [100 + n]
        # without privileges NVML has no per-process figure in MIG mode; the instance's memory in use stands in
        slices[-1].proc_memory = {100 + n: NOT_AVAILABLE if n % 2 else 3 * 2**30}
    # A privileged agent sees each process on the MIG-mode GPU as well as on its instance.
    parent = FakeGpu(mig=slices, gpm={2: 20.0}, pids=[100 + n for n in range(7)])
    fleet = Fleet(PREFIX)
    _record(fleet, _open([parent], root), "mig-01")
    excluded: dict[str, str] = {}
    snapshot = from_fleet(fleet, SITE, [], excluded)

    assert excluded == {}
    (node,) = snapshot.nodes
    assert (node.hardware, node.gpus) == ("NVIDIA H100 80GB HBM3", 1)
    assert sorted(w.id for w in snapshot.workloads) == [f"systemd/svc-{n}.service" for n in range(7)]
    for w in snapshot.workloads:
        assert (w.gpus, w.mig_profile, w.gpu_share) == (1, "1g.10gb", None)
        # 35 % of a 1g instance is 5 % of the GPU; the planner's figures are of whole GPUs
        assert abs(w.mean_util - 35 / 7) < 0.01
        assert w.mem_mib_per_gpu == (4096 if int(w.id[-9]) % 2 else 3072)
    assert snapshot.overcommitted() == []
    plan = plan_snapshot(snapshot, load_catalog(), PlanSettings())
    assert plan.solver.status in ("OPTIMAL", "FEASIBLE")


def test_mig_profile_names_as_nvml_gives_them() -> None:
    assert mig_profile("3g.40gb") == ("3g.40gb", 3 / 7)
    assert mig_profile("1g.10gb+me") == ("1g.10gb", 1 / 7)
    assert mig_profile("1g.12gb") == ("1g.12gb", 1 / 7)
    assert mig_profile("1G.24GB+GFX") == ("1g.24gb", 1 / 7)
    assert mig_profile("7g.141gb") == ("7g.141gb", 1.0)
    assert mig_profile("1c.3g.40gb") == ("3g.40gb", 1 / 7)  # a compute instance holds its own slice
    for garbage in ("", "8g.80gb", "3c.1g.10gb", "1g.10gb; rm -rf /", "banana", "1g.gb", None):
        assert mig_profile(garbage) is None


def test_amd_compute_partitions_count_as_their_share_of_one_gpu() -> None:
    assert partition_share("CPX", "AMD Instinct MI300X") == 1 / 8
    assert partition_share("QPX", "AMD Instinct MI300X") == 1 / 4
    assert partition_share("DPX", "AMD Instinct MI300X") == 1 / 2
    assert partition_share("CPX", "AMD Instinct MI300A") == 1 / 6
    assert partition_share("NPS4", "AMD Instinct MI300X") is None
    mi210 = GpuInfo(index=0, uuid="AMD-0", model="AMD Instinct MI210", memory_mib=65_536, mig_profile="N/A")
    odd = GpuInfo(index=1, uuid="AMD-1", model="AMD Instinct MI300X", memory_mib=65_536, mig_profile="HEXPX")
    lay = layout(
        Birth(node="n", site=SITE, session=1, agent_version="t", hostname="h", timestamp=1.0, gpus=[mi210, odd])
    )
    assert (lay.gpus, dict(lay.fallbacks)) == (2.0, {"partition_unknown": 1})
    birth = Birth(
        node="mi-01",
        site=SITE,
        session=1,
        agent_version="t",
        hostname="h",
        timestamp=time.time(),
        gpus=[
            GpuInfo(index=i, uuid=f"AMD-{i}", model="AMD Instinct MI300X", memory_mib=24_576, mig_profile="CPX")
            for i in range(8)
        ],
    )
    fleet = Fleet(PREFIX)
    assert fleet.ingest(f"{PREFIX}/{SITE}/mi-01/birth", encode(birth)) is not None
    builder = WindowBuilder("mi-01", SITE, 1)
    refs = [
        WorkloadRef(id=f"k8s/pod-{i}", kind=WorkloadKind.KUBERNETES_POD, name=f"pod {i}", gpus=[i]) for i in range(8)
    ]
    now = time.time()
    for seq in range(3):
        for t in range(TICKS):
            gauges = {"util": 40.0, "mem_used_mib": 6000.0}
            builder.add([Sample(Entity.GPU, str(i), gauges=gauges) for i in range(8)], float(seq * TICKS + t))
        window = builder.close(seq, now + seq * TICKS, now + (seq + 1) * TICKS, refs)
        assert fleet.ingest(f"{PREFIX}/{SITE}/mi-01/telemetry", encode(window)) is not None
    snapshot = from_fleet(fleet, SITE, [])
    (node,) = snapshot.nodes
    assert node.gpus == 1  # eight CPX partitions are one MI300X
    assert [w.gpu_share for w in snapshot.workloads] == [1 / 8] * 8
    # a partition at 40 % is 5 % of its GPU; its memory is its own
    assert {(w.mean_util, w.mem_mib_per_gpu) for w in snapshot.workloads} == {(5.0, 6000.0)}
    assert snapshot.overcommitted() == []


# ---------------------------------------------------------------- time-slicing and MPS


def test_two_services_time_sliced_on_one_l4_each_pay_their_share(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    _unit(root, 201, "chat-a")
    _unit(root, 202, "chat-b")
    shared = FakeGpu(name="NVIDIA L4", memory_total=24 * 2**30, memory_used=12 * 2**30, util=40, nvlink_links=0)
    shared.pids = [201, 202]
    shared.proc_memory = {201: 3 * 2**30, 202: 9 * 2**30}
    fleet = Fleet(PREFIX)
    _record(fleet, _open([shared], root), "l4-shared")
    _record(fleet, _l4_node(tmp_path, "l4-spare"), "l4-spare")
    excluded: dict[str, str] = {}
    snapshot = from_fleet(fleet, SITE, [], excluded)

    assert excluded == {}
    tenants = {w.id: w for w in snapshot.workloads}
    assert sorted(tenants) == ["systemd/chat-a.service", "systemd/chat-b.service"]
    # shared by the memory each pins; the GPU's 40 % is the sum of its tenants' load
    a, b = tenants["systemd/chat-a.service"], tenants["systemd/chat-b.service"]
    assert (a.gpus, a.gpu_share, a.mig_profile, a.mem_mib_per_gpu, a.mean_util) == (1, 0.25, None, 3072, 10)
    assert (b.gpus, b.gpu_share, b.mig_profile, b.mem_mib_per_gpu, b.mean_util) == (1, 0.75, None, 9216, 30)
    catalog = load_catalog()
    l4 = catalog.by_key("l4")
    whole = l4.price_per_gpu_hour * catalog.defaults.hours_per_month
    costs = [monthly_cost(catalog, r.w.demand, l4, l4) for r in resolve(catalog, snapshot) if r.w.id in tenants]
    assert abs(sum(costs) - whole) < 0.01  # one L4 between them, not two
    plan = plan_snapshot(snapshot, catalog, PlanSettings())
    assert plan.solver.status in ("OPTIMAL", "FEASIBLE")


def test_tenants_without_a_memory_figure_share_their_gpu_equally(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    for pid, unit in ((301, "a"), (302, "b"), (303, "c")):
        _unit(root, pid, unit)
    shared = FakeGpu(name="NVIDIA L4", memory_total=24 * 2**30, memory_used=12 * 2**30, util=60, nvlink_links=0)
    shared.pids = [301, 302, 303]
    shared.proc_memory = {302: NOT_AVAILABLE}
    fleet = Fleet(PREFIX)
    _record(fleet, _open([shared], root), "l4-mps")
    snapshot = from_fleet(fleet, SITE, [])
    assert [(w.gpu_share, w.mean_util) for w in snapshot.workloads] == [(1 / 3, 20.0)] * 3
    assert snapshot.overcommitted() == []


def test_the_agent_publishes_what_each_workload_pins_on_each_gpu(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    for pid, unit in ((401, "a"), (402, "a"), (403, "b"), (404, "c"), (405, "d")):
        if not (root / str(pid)).exists():
            _unit(root, pid, unit)
    gpu0 = FakeGpu(name="NVIDIA L4", nvlink_links=0)
    gpu0.pids = [401, 402, 401, 403, 404, 405]  # 401 listed twice: its memory counts once
    gpu0.proc_memory = {401: 2 * 2**30, 402: 2**30, 403: NOT_AVAILABLE, 404: 1 << 62, 405: 5 * 2**20}
    gpu1 = FakeGpu(name="NVIDIA L4", nvlink_links=0, pids=[402], proc_memory={402: 2**29})
    # two processes each just under the garbage line: their sum is no figure, and the window is not lost
    _unit(root, 406, "e")
    _unit(root, 407, "e")
    gpu1.pids += [406, 407]
    gpu1.proc_memory |= {406: 2**44 - 1, 407: 2**44 - 1}
    refs = {r.name: r for r in _open([gpu0, gpu1], root).workloads()}
    assert (refs["a.service"].gpus, refs["a.service"].gpu_mem_mib) == ([0, 1], [3072.0, 512.0])
    assert refs["b.service"].gpu_mem_mib is None  # NVML_VALUE_NOT_AVAILABLE
    assert refs["c.service"].gpu_mem_mib is None  # 4 EiB cannot be true
    assert refs["d.service"].gpu_mem_mib == [5.0]
    assert refs["e.service"].gpu_mem_mib is None
    # and it survives the wire
    window = WindowBuilder("n1", SITE, 1).close(0, 0.0, 10.0, list(refs.values()))
    again = Telemetry.model_validate_json(encode(window))
    assert [w.gpu_mem_mib for w in again.workloads] == [[3072.0, 512.0], None, None, [5.0], None]


# ---------------------------------------------------------------- hostile agents


def _ingest(fleet: Fleet, node: str, gpus: list[GpuInfo], refs: list[WorkloadRef]) -> None:
    """A birth as given, and three windows of the given GPUs at 30 % with the given workload references."""
    now = time.time()
    birth = Birth(node=node, site=SITE, session=1, agent_version="t", hostname=node, timestamp=now, gpus=gpus)
    assert fleet.ingest(f"{PREFIX}/{SITE}/{node}/birth", encode(birth)) is not None
    builder = WindowBuilder(node, SITE, 1)
    for seq in range(3):
        for t in range(TICKS):
            gauges = {"util": 30.0, "mem_used_mib": 8000.0}
            builder.add([Sample(Entity.GPU, str(g.index), gauges=gauges) for g in gpus], float(seq * TICKS + t))
        window = builder.close(seq, now + seq * TICKS, now + (seq + 1) * TICKS, refs)
        assert fleet.ingest(f"{PREFIX}/{SITE}/{node}/telemetry", encode(window)) is not None


def _ref(wid: str, gpus: list[int]) -> WorkloadRef:
    return WorkloadRef(id=f"systemd/{wid}.service", kind=WorkloadKind.SYSTEMD_UNIT, name=wid, gpus=gpus)


def _h100(index: int = 0, **kw: object) -> GpuInfo:
    return GpuInfo(
        index=index, uuid=f"GPU-{index}", model="NVIDIA H100 80GB HBM3", memory_mib=81_559, mig_mode=True, **kw
    )  # type: ignore[arg-type]


def _slice(index: int, profile: str, memory_mib: int = 10_000) -> GpuInfo:
    model = f"NVIDIA H100 80GB HBM3 MIG {profile}"[:96]
    return GpuInfo(index=index, uuid=f"MIG-{index}", model=model, memory_mib=memory_mib, parent=0, mig_profile=profile)


def test_hostile_shares_are_counted_and_cost_only_their_node() -> None:
    fleet = Fleet(PREFIX)
    # Garbage MIG profiles: estimated from memory (20 GB of 80 GB: a quarter), counted, and planned.
    _ingest(fleet, "garbage", [_h100(), _slice(1, "zz;DROP TABLE", 20_390), _slice(2, "9g.1tb")], [_ref("g", [1])])
    # Instances that claim more than their GPU has (three 7g instances on one H100): overcommitted, left out.
    over = [_h100(), _slice(1, "7g.80gb"), _slice(2, "7g.80gb"), _slice(3, "7g.80gb")]
    _ingest(fleet, "greedy", over, [_ref(f"o{i}", [i]) for i in (1, 2, 3)])
    # One GPU reported under two workloads (the same process attributed to both): they share it.
    _ingest(fleet, "twice", [_h100()], [_ref("t1", [0]), _ref("t2", [0])])
    # A tenant pinning nearly all the memory beside three pinning nothing: each holds at least a hundredth, and
    # the shares still fit the GPU.
    lopsided = [_ref("big", [0]).model_copy(update={"gpu_mem_mib": [79_000.0]})]
    lopsided += [_ref(f"tiny{i}", [0]).model_copy(update={"gpu_mem_mib": [0.0]}) for i in range(3)]
    _ingest(fleet, "lopsided", [_h100()], lopsided)
    excluded: dict[str, str] = {}
    estimated: Counter[tuple[str, str]] = Counter()
    snapshot = from_fleet(fleet, SITE, [], excluded, estimated)

    assert excluded == {"greedy": "overcommitted: its workloads hold more GPUs than its inventory lists"}
    assert estimated == Counter({("garbage", "mig_profile"): 2})
    held = {w.id.split("/")[1]: (w.gpus, w.gpu_share, w.mig_profile) for w in snapshot.workloads}
    assert held.pop("big.service") == (1, 0.97, None)
    assert [held.pop(f"tiny{i}.service") for i in range(3)] == [(1, 0.01, None)] * 3
    assert held == {"g.service": (1, 0.25, None), "t1.service": (1, 0.5, None), "t2.service": (1, 0.5, None)}
    assert sorted(n.name for n in snapshot.nodes) == ["garbage", "lopsided", "twice"]
    plan = plan_snapshot(snapshot, load_catalog(), PlanSettings())
    assert plan.solver.status in ("OPTIMAL", "FEASIBLE")


async def test_the_optimizer_exports_which_nodes_shares_it_estimated(tmp_path: Path) -> None:
    config = OptimizerConfig(
        mqtt=MqttSettings(port=free_port()),
        optimizer=OptimizerSettings(state_dir=tmp_path, solve_interval=3600),
    )
    optimizer = Optimizer(config, load_catalog(), lifecycle=Lifecycle.in_state_dir(tmp_path))
    _ingest(optimizer.fleet, "garbage", [_h100(), _slice(1, "banana", 20_390)], [_ref("g", [1])])
    (plan,) = await optimizer.plan_once()
    assert plan.solver.status in ("OPTIMAL", "FEASIBLE")
    text = render(optimizer_metrics(optimizer))
    assert 'fleetfit_gpu_shares_estimated{site="s1",node="garbage",reason="mig_profile"} 1' in text


# ---------------------------------------------------------------- over a real broker


async def test_agents_on_mig_and_shared_gpus_are_planned_by_the_live_optimizer(
    mosquitto: MosquittoServer, prefix: str, tmp_path: Path
) -> None:
    root = tmp_path / "proc"
    slices = []
    for n in range(7):
        _unit(root, 500 + n, f"mig-{n}")
        slice_ = FakeGpu(name="NVIDIA H100 80GB HBM3 MIG 1g.10gb", memory_total=10 * 2**30, gpu_instance_id=n + 1)
        slice_.memory_used, slice_.gpm, slice_.pids = 4 * 2**30, {1: 35.0}, [500 + n]
        slices.append(slice_)
    _unit(root, 601, "tts-a")
    _unit(root, 602, "tts-b")
    l4 = FakeGpu(name="NVIDIA L4", memory_total=24 * 2**30, memory_used=12 * 2**30, util=40, nvlink_links=0)
    l4.pids, l4.proc_memory = [601, 602], {601: 3 * 2**30, 602: 9 * 2**30}
    nodes = {"mig-01": [FakeGpu(mig=slices, gpm={2: 20.0})], "l4-01": [l4]}
    agents = []
    for name, gpus in nodes.items():
        (tmp_path / name).mkdir()
        config = load_config(AgentConfig, write_agent_config(tmp_path / name, mosquitto.port, prefix, name), environ={})
        agents.append(Agent(config, [_open(gpus, root)], session=1, queue=MemoryQueue(100)))
    config = OptimizerConfig(
        mqtt=mosquitto.settings(prefix), optimizer=OptimizerSettings(solve_interval=1.0, state_dir=tmp_path)
    )
    optimizer = Optimizer(config, load_catalog(), lifecycle=Lifecycle.in_state_dir(tmp_path))
    tasks = [asyncio.create_task(optimizer.run())]
    await asyncio.wait_for(optimizer.connected.wait(), 10)
    tasks += [asyncio.create_task(a.run()) for a in agents]
    exported = tmp_path / "snapshot-lab.json"

    def planned() -> bool:
        if not exported.exists():
            return False
        return len(Snapshot.model_validate_json(exported.read_bytes()).workloads) == 9

    try:
        await wait_until(planned, 30, "a plan of all nine workloads")
        snapshot = Snapshot.model_validate_json(exported.read_bytes())
        assert optimizer.excluded_nodes.get("lab", {}) == {}
        assert {n.name: n.gpus for n in snapshot.nodes} == {"l4-01": 1, "mig-01": 1}
        held = {w.name: (w.mig_profile, w.gpu_share) for w in snapshot.workloads}
        assert held == {
            **{f"mig-{n}.service": ("1g.10gb", None) for n in range(7)},
            "tts-a.service": (None, 0.25),
            "tts-b.service": (None, 0.75),
        }
        assert optimizer.fleet.rejected == {}
    finally:
        for a in agents:
            a.should_exit.set()
        optimizer.should_exit.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 20)


def test_a_slice_too_big_for_a_share_of_the_target_says_so() -> None:
    catalog = load_catalog()
    h100, l4 = catalog.by_key("h100"), catalog.by_key("l4")
    demand = Demand(WorkloadClass.INFERENCE, 1, 5_000, 3.0, 5.0, share=1 / 7)
    assert fit_problem(catalog, demand, h100, l4) == "needs 4.9 GiB; a 14% share of L4 24GB has 3.4"
