"""MIG on GPUs before Hopper (A100, A30): NVML has no utilisation per instance, and the agent says so. Such
workloads are classified from memory held, processes and traffic, below acting confidence; dcgm-exporter's
graphics-engine activity, where a node runs it, still classifies them as any other."""

from __future__ import annotations

import time

import msgspec

from agent.protocol import (
    Birth,
    GpuInfo,
    GpuWindow,
    Stats,
    Telemetry,
    TopicKind,
    WorkloadClass,
    WorkloadKind,
    WorkloadRef,
    encode,
    node_topic,
)
from collectors.gpu import MIG_WITHOUT_GPM
from optimizer.decide.catalog import load_catalog
from optimizer.decide.classify import UTIL_UNAVAILABLE_CONFIDENCE, classify
from optimizer.decide.features import workload_features
from optimizer.decide.findings import detect
from optimizer.decide.snapshot import from_fleet, resolve
from optimizer.ingest.dcgm import NodeSeries, Tally, add_series, birth, windows
from optimizer.ingest.fleet import Fleet

MIB = 40_960  # a 3g.40gb instance


def _a100_in_mig_mode(windows: int = 6, hot: bool = False) -> Fleet:
    """An A100 in MIG mode as the agent reports it: two 3g.40gb instances, no utilisation for any of them. A vLLM
    server with four clients holds 90 % of one instance; a scoring batch nobody connects to holds a tenth of the other.
    ``hot``: the GPU held down by heat all the while (the agent reads clock events for the GPU, not its instances)."""
    now = time.time() - windows * 10
    gpus = [
        GpuInfo(index=0, uuid="GPU-0", model="NVIDIA A100-SXM4-80GB", memory_mib=81_920, mig_mode=True,
                util_unavailable=MIG_WITHOUT_GPM),
        *(GpuInfo(index=i, uuid=f"MIG-{i}", model="NVIDIA A100-SXM4-80GB MIG 3g.40gb", memory_mib=MIB, parent=0,
                  mig_profile="3g.40gb", util_unavailable=MIG_WITHOUT_GPM) for i in (1, 2)),
    ]  # fmt: skip
    b = Birth(node="a100-001", site="s", session=1, agent_version="t", hostname="a100-001", timestamp=now, gpus=gpus)
    fleet = Fleet("t")
    assert fleet.ingest(node_topic("t", "s", "a100-001", TopicKind.BIRTH), encode(b))
    server = WorkloadRef(id="k8s/ml/llm", kind=WorkloadKind.KUBERNETES_POD, name="llm", gpus=[1], hint="python3",
                         program="vllm", listen_ports=[8000], inbound_connections=16, inbound_peers=4)  # fmt: skip
    other = WorkloadRef(id="k8s/ml/job", kind=WorkloadKind.KUBERNETES_POD, name="job", gpus=[2], hint="python3",
                        program="score_batch.py", listen_ports=[], inbound_connections=0, inbound_peers=0)  # fmt: skip
    for seq in range(windows):
        start = now + 10 * seq
        gpu_windows = [
            GpuWindow(
                index=0,
                power_w=Stats.of([250.0]),
                util_unavailable=1,
                thermal_slowdown_pct=Stats.of([100.0 if hot else 0.0]),
            ),
            GpuWindow(index=1, mem_used_mib=Stats.of([0.9 * MIB]), util_unavailable=1),
            GpuWindow(index=2, mem_used_mib=Stats.of([0.1 * MIB]), util_unavailable=1),
        ]
        t = Telemetry(node="a100-001", site="s", session=1, seq=seq, start=start, end=start + 10, samples=10,
                      gpus=gpu_windows, workloads=[server, other])  # fmt: skip
        assert fleet.ingest(node_topic("t", "s", "a100-001", TopicKind.TELEMETRY), encode(t))
    return fleet


def test_mig_instances_without_utilisation_are_classified_from_memory_processes_and_traffic() -> None:
    """Deliberate bugs caught: the digest dropping a GPU's row when it has no utilisation (the server on the MIG
    instance was never classified at all); the confidence cap left out (a class nobody measured the load of would
    be acted on at 0.9); rules that read utilisation run on its unmeasured 0 % (a service "at work in 100 % of
    seconds", or the unnamed job called idle and its allocation reclaimed)."""
    fleet = _a100_in_mig_mode()
    features = {f.id: f for f in workload_features(fleet, "s")}
    assert set(features) == {"k8s/ml/llm", "k8s/ml/job"}
    server = features["k8s/ml/llm"]
    assert server.util_unavailable == MIG_WITHOUT_GPM and server.windows == 6
    assert round(server.mem_fraction, 2) == 0.9  # of its instance's memory, not of the GPU's
    result = classify(server)
    assert result.workload_class is WorkloadClass.INFERENCE
    assert 0 < result.confidence <= UTIL_UNAVAILABLE_CONFIDENCE < 0.6  # the planner acts from 0.6
    assert any("utilisation unavailable" in e and "before Hopper" in e for e in result.evidence)
    assert not any("% busy" in e or "of seconds" in e for e in result.evidence), result.evidence
    job = classify(features["k8s/ml/job"])
    assert job.workload_class is WorkloadClass.BATCH_INFERENCE and job.confidence <= UTIL_UNAVAILABLE_CONFIDENCE
    snapshot = from_fleet(fleet, "s", [])
    by_id = {w.id: w for w in snapshot.workloads}
    assert by_id["k8s/ml/llm"].util_unavailable == MIG_WITHOUT_GPM and by_id["k8s/ml/llm"].mig_profile == "3g.40gb"
    catalog = load_catalog()
    findings = detect(catalog, resolve(catalog, snapshot))
    # nothing sized on a load nobody measured: the batch's tenth of memory at an unmeasured 0 % is not "oversized"
    assert [f.kind for f in findings if f.workload.startswith("k8s/ml/")] == []


T0 = 1_796_400_000.0
TIMES = [T0 + 30 * i for i in range(20)]  # ten minutes at a 30 s scrape


def test_mig_instances_read_through_dcgm_exporter_keep_their_utilisation() -> None:
    """Deliberate bug caught: every MIG instance taken for one without utilisation (the birth's MIG mode read as
    "no utilisation"), which would cap a workload dcgm-exporter measures through GR_ENGINE_ACTIVE as if blind."""
    node = NodeSeries("a100-001")
    labels = {"gpu": "0", "UUID": "GPU-0", "modelName": "NVIDIA A100-SXM4-80GB", "Hostname": "a100-001",
              "GPU_I_ID": "1", "GPU_I_PROFILE": "3g.40gb", "namespace": "ml", "pod": "p1"}  # fmt: skip
    for metric, value in (("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.35), ("DCGM_FI_DEV_FB_USED", 10000.0)):
        add_series(node, {"__name__": metric, **labels}, TIMES, [value] * len(TIMES), {}, Tally())
    fleet = Fleet("t", horizon_windows=10)
    assert fleet.ingest(node_topic("t", "s", "a100-001", TopicKind.BIRTH), msgspec.json.encode(birth(node, "s", T0)))
    for w in windows(node, "s", T0, T0 + 600, 100):
        assert fleet.ingest(node_topic("t", "s", "a100-001", TopicKind.TELEMETRY), msgspec.json.encode(w))
    (f,) = workload_features(fleet, "s")
    assert f.util_unavailable is None and round(f.mean_util) == 35 and f.windows >= 3
    assert not any("utilisation unavailable" in e for e in classify(f).evidence)


def test_a_throttled_gpu_in_mig_mode_holds_down_every_instance_on_it() -> None:
    """Deliberate bug caught: a MIG instance's throttle looked up under its own index only. Clock event reasons are
    read for the physical GPU, so a workload on an instance of an overheating A100 would never be named."""
    features = {f.id: f for f in workload_features(_a100_in_mig_mode(hot=True), "s")}
    assert {wid: f.throttle_thermal for wid, f in features.items()} == {"k8s/ml/llm": 1.0, "k8s/ml/job": 1.0}
