"""dcgm-exporter's series as births and windows (optimizer/ingest/dcgm.py), label by label, without a server: MIG
instances, a GPU written once per pod, label spellings, NVLink throughput, and hostile label values."""

from __future__ import annotations

import msgspec
import pytest

from agent.protocol import Birth, TopicKind, node_topic
from optimizer.ingest.dcgm import NodeSeries, PodMeta, Tally, add_series, birth, valid_node, windows
from optimizer.ingest.fleet import Fleet

T0 = 1_796_400_000.0
TIMES = [T0 + 30 * i for i in range(20)]  # ten minutes at a 30 s scrape


def _gpu(gpu: int, **extra: str) -> dict[str, str]:
    return {"gpu": str(gpu), "UUID": f"GPU-{gpu}", "modelName": "NVIDIA A100-SXM4-80GB", "Hostname": "a100-001",
            **extra}  # fmt: skip


def _add(node: NodeSeries, metric: str, labels: dict[str, str], value: float, tally: Tally | None = None) -> None:
    add_series(node, {"__name__": metric, **labels}, TIMES, [value] * len(TIMES), {}, tally or Tally())


def _ingest(node: NodeSeries) -> Fleet:
    fleet = Fleet("t", horizon_windows=10)
    b = birth(node, "s", T0)
    assert fleet.ingest(node_topic("t", "s", node.node, TopicKind.BIRTH), msgspec.json.encode(b))
    for w in windows(node, "s", T0, T0 + 600, 300):
        assert fleet.ingest(node_topic("t", "s", node.node, TopicKind.TELEMETRY), msgspec.json.encode(w)), w
    return fleet


def test_mig_instances_follow_their_gpus_with_the_graphics_engine_for_utilisation() -> None:
    """NVML gives no utilisation for a MIG instance; dcgm-exporter's GR_ENGINE_ACTIVE (0-1) stands for it."""
    node = NodeSeries("a100-001")
    for gpu in (0, 1):
        _add(node, "DCGM_FI_DEV_POWER_USAGE", _gpu(gpu), 200)
    _add(node, "DCGM_FI_DEV_GPU_UTIL", _gpu(1), 50)
    _add(node, "DCGM_FI_DEV_FB_USED", _gpu(1), 30000)
    for instance, profile, busy in (("1", "3g.40gb", 0.35), ("2", "3g.40gb", 0.0)):
        labels = _gpu(0, GPU_I_ID=instance, GPU_I_PROFILE=profile, namespace="ml", pod=f"p{instance}")
        _add(node, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, busy)
        _add(node, "DCGM_FI_DEV_FB_USED", labels, 10000)
        _add(node, "DCGM_FI_DEV_FB_FREE", labels, 30000)
    fleet = _ingest(node)
    record = fleet.record("s", "a100-001")
    assert record is not None and record.birth is not None
    gpus = {g.index: g for g in record.birth.gpus}
    # two physical GPUs by their own index, the instances after them, each naming its parent
    assert (gpus[0].mig_mode, gpus[1].mig_mode) == (True, False)
    assert {(g.parent, g.mig_profile, g.memory_mib) for g in gpus.values() if g.parent is not None} == {
        (0, "3g.40gb", 40000)
    } and sorted(i for i, g in gpus.items() if g.parent is not None) == [2, 3]
    window = record.windows[-1]
    by_pod = {w.id: list(w.gpus) for w in window.workloads}
    # GPU 1 busy with no pod on it: something outside Kubernetes, one workload for the node's such GPUs
    assert by_pod == {"k8s/ml/p1": [2], "k8s/ml/p2": [3], "gpus/a100-001": [1]}
    util = dict(zip(window.gpu_rows.column(0), window.gpu_rows.column(1), strict=True))
    assert util[2.0] == pytest.approx(35.0) and util[3.0] == 0.0 and util[1.0] == pytest.approx(50.0)


def test_a_gpu_written_once_per_pod_is_one_gpu_held_by_both() -> None:
    node = NodeSeries("l4-001")
    for pod in ("a", "b"):
        labels = {**_gpu(0), "Hostname": "l4-001", "namespace": "web", "pod": pod}
        _add(node, "DCGM_FI_DEV_GPU_UTIL", labels, 40)
        _add(node, "DCGM_FI_DEV_FB_USED", labels, 5000)
    w = windows(node, "s", T0, T0 + 600, 300)[0]
    assert len(w["gpus"]) == 1  # type: ignore[arg-type]
    assert sorted((r["id"], r["gpus"]) for r in w["workloads"]) == [("k8s/web/a", [0]), ("k8s/web/b", [0])]  # type: ignore[union-attr]


def test_nvlink_throughput_total_is_megabytes_a_second_both_ways() -> None:
    """DCGM's field table gives DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL in MB/s; the profiling fields win where both are."""
    node = NodeSeries("a100-001")
    _add(node, "DCGM_FI_DEV_GPU_UTIL", _gpu(0), 95)
    _add(node, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", _gpu(0), 60_000)  # 60 GB/s
    gpu = windows(node, "s", T0, T0 + 600, 300)[0]["gpus"][0]  # type: ignore[index]
    assert gpu["nvlink_tx_bps"][0] + gpu["nvlink_rx_bps"][0] == pytest.approx(60e9)
    _add(node, "DCGM_FI_PROF_NVLINK_TX_BYTES", _gpu(0), 1e9)
    _add(node, "DCGM_FI_PROF_NVLINK_RX_BYTES", _gpu(0), 1e9)
    gpu = windows(node, "s", T0, T0 + 600, 300)[0]["gpus"][0]  # type: ignore[index]
    assert gpu["nvlink_tx_bps"][0] == pytest.approx(1e9)


def test_labels_from_a_hostile_server_cost_their_series_only() -> None:
    tally = Tally()
    node = NodeSeries("a100-001")
    _add(node, "DCGM_FI_DEV_GPU_UTIL", _gpu(0, namespace="ml", pod="x\x1b[31m" + "y" * 300), 90, tally)
    _add(node, "DCGM_FI_DEV_GPU_UTIL", {**_gpu(0), "gpu": "99"}, 90, tally)
    _add(node, "DCGM_FI_DEV_GPU_UTIL", {**_gpu(1), "gpu": "one"}, 90, tally)
    _add(node, "DCGM_FI_DEV_GPU_UTIL", _gpu(2), -5, tally)
    _add(node, "DCGM_FI_DEV_GPU_UTIL", _gpu(3), 1e300, tally)
    _add(node, "DCGM_FI_DEV_FB_USED", _gpu(4, modelName="A" * 500), 1000, tally)
    add_series(node, {"__name__": "not_a_dcgm_metric", **_gpu(5)}, TIMES, [1.0] * 20, {}, tally)
    assert tally.skipped == {"workload_id": 1, "gpu_label": 2, "value_out_of_range": 2, "unknown_metric": 1}
    fleet = _ingest(node)  # what is left goes in whole
    record = fleet.record("s", "a100-001")
    assert record is not None and record.birth is not None
    assert isinstance(record.birth, Birth) and len(record.birth.gpus[-1].model) <= 96
    assert not valid_node("gpu 001") and not valid_node("../x") and valid_node("gpu-001.dc1")


def test_pod_metadata_names_the_controller_and_the_owner() -> None:
    node = NodeSeries("a100-001")
    pods = {("ml", "chat-7d9f-x"): PodMeta(name="chat", kind="Deployment", owner="serving", uid="u-1")}
    add_series(node, {"__name__": "DCGM_FI_DEV_GPU_UTIL", **_gpu(0, namespace="ml", pod="chat-7d9f-x")}, TIMES,
               [30.0] * 20, pods, Tally())  # fmt: skip
    (ref,) = windows(node, "s", T0, T0 + 600, 300)[0]["workloads"]  # type: ignore[misc]
    assert (ref["id"], ref["name"], ref["owner"]) == ("k8s/u-1", "chat", "serving")
