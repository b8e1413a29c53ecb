"""Workloads whose telemetry sits near a classification threshold, written from how the systems behave and sent
through the whole way a window travels (telemetry into the fleet, its digest, the features, the classifier), so
that a threshold moved, or a figure read from the wrong column of a digest, changes what a user is told.

A node here is an 8-GPU H100 SXM server (80 GB HBM3, 81,559 MiB as NVML reports it; 700 W board power limit per
NVIDIA's H100 datasheet) that reports 12 windows of 10 one-second samples, as an agent does in two minutes."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from conftest import FLEET_PREFIX

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
from optimizer.decide.classify import Classification, classify
from optimizer.decide.features import WorkloadFeatures, workload_features
from optimizer.ingest.fleet import Fleet

NODE, SITE = "h100-1", "s"
MODEL, MEMORY_MIB, POWER_LIMIT_W = "NVIDIA H100 80GB HBM3", 81_559, 700.0
T0 = 1_700_000_000.0
WINDOWS, SECONDS = 12, 10


@dataclass(frozen=True)
class Busy:
    """How each of a workload's GPUs behaves, second by second and window by window."""

    level: float  # utilisation, %
    jitter: float  # +- this many points from second to second
    power_w: float
    tensor: float  # GPM tensor-pipe activity as a share of utilisation
    dram: float  # GPM DRAM bandwidth utilisation as a share of utilisation
    mem_mib: float
    link_bps: float = 0.0  # NVLink bytes/s per GPU, both directions together


def observe(
    ref: WorkloadRef, busy: Busy, windows: int = WINDOWS, seed: int = 1
) -> tuple[WorkloadFeatures, Classification]:
    """``ref`` on the node's GPUs it names, the others idle, as the optimizer sees it after ``windows`` windows."""
    rng = random.Random(seed)
    fleet = Fleet(FLEET_PREFIX, horizon_windows=60)
    gpus = [
        GpuInfo(
            index=i,
            uuid=f"GPU-{i}",
            model=MODEL,
            memory_mib=MEMORY_MIB,
            nvlink_links=18,
            nvswitch=True,
            power_limit_w=POWER_LIMIT_W,
        )
        for i in range(8)
    ]
    birth = Birth(node=NODE, site=SITE, session=1, agent_version="t", hostname=NODE, timestamp=T0, gpus=gpus)
    assert fleet.ingest(node_topic(FLEET_PREFIX, SITE, NODE, TopicKind.BIRTH), encode(birth))
    for seq in range(windows):
        gpu_windows = []
        for i in range(8):
            if i not in ref.gpus:
                idle = [0.0] * SECONDS
                gpu_windows.append(
                    GpuWindow(
                        index=i, util=Stats.of(idle), util_series=idle, mem_used_mib=Stats.of([0.0]),
                        power_w=Stats.of([70.0]),
                    )
                )  # fmt: skip
                continue
            series = [round(busy.level + rng.uniform(-busy.jitter, busy.jitter), 1) for _ in range(SECONDS)]
            util = Stats.of(series)
            gpu_windows.append(
                GpuWindow(
                    index=i,
                    util=util,
                    util_series=series,
                    mem_used_mib=Stats.of([busy.mem_mib]),
                    power_w=Stats.of([busy.power_w]),
                    nvlink_tx_bps=Stats.of([busy.link_bps / 2]),
                    nvlink_rx_bps=Stats.of([busy.link_bps / 2]),
                    tensor_active=Stats.of([busy.tensor * util.mean]),
                    dram_active=Stats.of([busy.dram * util.mean]),
                    workload=ref.id,
                )
            )
        start = T0 + seq * SECONDS
        window = Telemetry(
            node=NODE, site=SITE, session=1, seq=seq, start=start, end=start + SECONDS, samples=SECONDS,
            gpus=gpu_windows, workloads=[ref],
        )  # fmt: skip
        assert fleet.ingest(node_topic(FLEET_PREFIX, SITE, NODE, TopicKind.TELEMETRY), encode(window))
    (features,) = workload_features(fleet, SITE)
    return features, classify(features)


def test_data_parallel_training_exchanging_21_gb_a_second_per_gpu_is_training() -> None:
    """A 7B-parameter model trained data-parallel on 8 GPUs: its bf16 gradients (14 GB) are all-reduced every
    step, and a ring all-reduce sends and receives 2 x 7/8 of them per GPU (24.5 GB each way); at a step of about
    2.3 s (an estimate for this size) that is ~21 GB/s per GPU over NVLink, both ways together. Dense matmuls keep
    it at 93 % and near the power limit. At 1 Hz its step does not show, it saved no checkpoint in these two
    minutes and its name says nothing: the gradient exchange alone tells it from batch scoring, which is just as
    dense and busy. Deliberate bug caught: the gradient-exchange threshold moved up by 20 % (24 GB/s), which
    leaves this job a lean towards training held below the planner's acting confidence."""
    ref = WorkloadRef(id="k8s/ml/ddp-7b", kind=WorkloadKind.KUBERNETES_POD, name="ddp-7b", gpus=list(range(8)),
                      hint="python3")  # fmt: skip
    busy = Busy(level=93.0, jitter=2.0, power_w=620.0, tensor=0.55, dram=0.35, mem_mib=62_000.0, link_bps=21e9)
    features, result = observe(ref, busy)
    # nothing else only training does was seen: no step period, no save, one node, no launcher's name
    assert features.period_s is None and features.write_bursts == 0 and not features.multi_node
    assert result.workload_class is WorkloadClass.TRAINING and result.confidence >= 0.6, result
    assert any("gradient synchronisation" in line for line in result.evidence), result.evidence


@pytest.mark.parametrize("windows", [WINDOWS, 3])
def test_memory_bound_decode_is_inference_with_that_evidence(windows: int) -> None:
    """An LLM server decoding for a dozen clients on one GPU: continuous batching keeps kernels running 90 % of
    the time, but decode reads the weights and KV cache for every token, so the DRAM is busy 70 % of that time and
    the tensor pipes only a quarter of it, at 380 W of the 700 W limit; its KV cache holds 90 % of the memory,
    flat. Told as inference, with the memory-bound GPM activity among its reasons, after two minutes (windows
    folded together as arrays) as after the first three (folded one by one). Deliberate bug caught: the digest's
    tensor and DRAM activity columns swapped, when packed or when read back, which reads decode as dense matmuls
    (70 % tensor pipes)."""
    ref = WorkloadRef(
        id="k8s/chat/llm-0", kind=WorkloadKind.KUBERNETES_POD, name="llm-0", gpus=[0], hint="python3",
        listen_ports=[8000], inbound_connections=40, inbound_peers=12, net_rx_bps=0.5e6, net_tx_bps=3e6,
    )  # fmt: skip
    busy = Busy(level=90.0, jitter=4.0, power_w=380.0, tensor=0.25, dram=0.70, mem_mib=0.9 * MEMORY_MIB)
    _, result = observe(ref, busy, windows)
    assert result.workload_class is WorkloadClass.INFERENCE and result.confidence >= 0.6, result
    text = " ".join(result.evidence)
    assert "DRAM 70%" in text and "tensor pipes 25%" in text, result.evidence
    assert "dense matmuls" not in text, result.evidence
