"""A small fleet as dcgm-exporter, kube-state-metrics and cAdvisor would have left it in Prometheus: history in the
text exposition format with timestamps, written from those exporters' formats (labels and units), not from
fleetfit's reader.

What each workload does, from how the real systems behave:

* ``chat-api`` (a Deployment, vLLM-like, tensor-parallel on 4 × H100, requests in flight 60-90 % of the time): the
  engine runs kernels on all four GPUs whenever a request is in flight, so a sampled second reads 85-99 % or ~0 as
  requests come and go; KV cache preallocated (memory flat; gpu_memory_utilization lowered to 0.45 to share the node); decode
  is memory-bound (DRAM busy, tensor pipes lightly used, well under the power limit); text responses, a few MB/s out
  of its pod's own network namespace.
* ``llama-pretrain`` (a PyTorchJob worker, 4 × H100): data-parallel training, 95-100 % busy, dense matmuls near the
  power limit, gradients all-reduced over NVLink at tens of GB/s per GPU.
* ``jupyter-alice`` (a StatefulSet, 2 × L40S): a notebook holding 12 GB per GPU that ran nothing for hours.
* Slurm job 4242 (4 × L40S, ``hpc_job`` label): batch encoding, one independent replica per GPU, each dipping on its
  own when its next batch is late; dense; nothing exchanged between GPUs.
* ``tts-a`` and ``tts-b`` share one L40S by time-slicing: dcgm-exporter writes that GPU's series once per pod.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

H100 = ("NVIDIA H100 80GB HBM3", 81559, 700.0)
L40S = ("NVIDIA L40S", 46068, 350.0)


@dataclass
class Pod:
    namespace: str
    pod: str
    container: str
    uid: str
    owner_kind: str
    owner_name: str
    team: str
    replicaset: str | None = None


@dataclass
class Holder:
    """What runs on some GPUs of a node, and how it loads them each sampled second."""

    gpus: list[int]
    kind: str  # serving, training, idle, batch, light
    pod: Pod | None = None
    job: str | None = None
    extra_pods: list[Pod] = field(default_factory=list)  # time-slicing tenants of the same GPUs


CHAT = Pod("team-serving", "chat-api-7d9f8c6b5-x2k4p", "main", "0b6f2a51-1f0e-4c55-9d59-4c2a7f0b1a01",
           "ReplicaSet", "chat-api-7d9f8c6b5", "serving", replicaset="chat-api")  # fmt: skip
TRAIN = Pod("team-research", "llama-pretrain-worker-0", "pytorch", "0b6f2a51-1f0e-4c55-9d59-4c2a7f0b1a02",
            "PyTorchJob", "llama-pretrain", "research")  # fmt: skip
NOTEBOOK = Pod("team-data-science", "jupyter-alice-0", "notebook", "0b6f2a51-1f0e-4c55-9d59-4c2a7f0b1a03",
               "StatefulSet", "jupyter-alice", "data-science")  # fmt: skip
TTS_A = Pod("team-serving", "tts-a-0", "tts", "0b6f2a51-1f0e-4c55-9d59-4c2a7f0b1a04", "StatefulSet", "tts-a", "serving")
TTS_B = Pod("team-serving", "tts-b-0", "tts", "0b6f2a51-1f0e-4c55-9d59-4c2a7f0b1a05", "StatefulSet", "tts-b", "serving")

NODES: dict[str, tuple[tuple[str, int, float], list[Holder]]] = {
    "h100-001": (H100, [Holder([0, 1, 2, 3], "serving", CHAT), Holder([4, 5, 6, 7], "training", TRAIN)]),
    "l40s-001": (L40S, [Holder([0, 1], "idle", NOTEBOOK), Holder([7], "light", TTS_A, extra_pods=[TTS_B])]),
    "l40s-002": (L40S, [Holder([0, 1, 2, 3], "batch", job="4242")]),
}
# cAdvisor's storage counters, one per container and device: (pod, container, device, bytes/s read, bytes/s written).
# The chat server writes its logs; the trainer its logs and metrics on two drives while a data-loader sidecar reads
# shards from an md RAID 0 (as a DGX's /raid), whose two members carry the same bytes again, half each (every figure
# well under what the classifier reads as results written or input fetched); the notebook's pod has no storage
# series at all (cAdvisor without its diskIO metrics).
DISK = [
    (CHAT, "main", "/dev/nvme0n1", 0.0, 2e5),
    (TRAIN, "pytorch", "/dev/nvme0n1", 0.0, 8e5),
    (TRAIN, "pytorch", "/dev/nvme1n1", 0.0, 4e5),
    (TRAIN, "loader", "/dev/nvme1n1", 0.0, 3e5),
    (TRAIN, "loader", "/dev/md0", 6e6, 0.0),
    (TRAIN, "loader", "/dev/nvme2n1", 3e6, 0.0),
    (TRAIN, "loader", "/dev/nvme3n1", 3e6, 0.0),
]
# The trainer's container restarts this many seconds into the history (mid-window): its counters start again, at its
# first scrape from what the new container wrote since the old one's last.
RESTART = 3750

# What each workload is, as a capacity planner would label it, by the id an agent would give it.
TRUTH = {
    "k8s/" + CHAT.uid: "inference",
    "k8s/" + TRAIN.uid: "training",
    "k8s/" + NOTEBOOK.uid: "idle",
    "slurm/4242": "batch_inference",
}


def _sample(kind: str, rng: random.Random, t: float, together: float, shared: float) -> dict[str, float]:
    """One sampled second of one GPU: utilisation %, memory MiB, power fraction of the limit, DCGM activities.
    ``together`` is one draw for all of a workload's GPUs in that second (a tensor-parallel engine steps on all its
    GPUs at once)."""
    if kind == "serving":
        load = 0.75 + 0.15 * math.sin(t / 1800)  # share of seconds with a request in flight
        busy = together < load
        util = rng.uniform(85, 99) if busy else rng.uniform(0, 2)
        return {"util": util, "mem": 0.45, "power": 0.1 + 0.9 * util / 100 * 0.5, "tensor": 0.12 * util / 100,
                "dram": 0.7 * util / 100, "nvlink": 0.0, "pcie": 2e7}  # fmt: skip
    if kind == "training":
        util = rng.uniform(95, 100)
        return {"util": util, "mem": 0.85, "power": 0.1 + 0.9 * util / 100 * 0.95, "tensor": 0.62 * util / 100,
                "dram": 0.35 * util / 100, "nvlink": 6e10, "pcie": 2e9}  # fmt: skip
    if kind == "idle":
        return {
            "util": 0.0,
            "mem": 12000 / 46068,
            "power": 0.09,
            "tensor": 0.0,
            "dram": 0.0,
            "nvlink": 0.0,
            "pcie": 0.0,
        }
    if kind == "batch":
        util = rng.uniform(82, 98) if rng.random() > 0.12 else rng.uniform(20, 50)
        return {"util": util, "mem": 0.6, "power": 0.1 + 0.9 * util / 100 * 0.9, "tensor": 0.55 * util / 100,
                "dram": 0.3 * util / 100, "nvlink": 0.0, "pcie": 5e7}  # fmt: skip
    util = rng.uniform(20, 60) if rng.random() < 0.5 else 0.0  # two light services on one GPU
    return {"util": util, "mem": shared, "power": 0.12 + 0.5 * util / 100, "tensor": 0.3 * util / 100,
            "dram": 0.3 * util / 100, "nvlink": 0.0, "pcie": 1e6}  # fmt: skip


def _labels(pairs: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in pairs.items())


def exposition(
    start: float, end: float, step: float = 30.0, seed: int = 7, hostname_label: str = "Hostname"
) -> Iterator[str]:
    """Every series of the fleet from ``start`` to ``end`` every ``step`` s, one sample a line, with timestamps in
    milliseconds (VictoriaMetrics' ``/api/v1/import/prometheus`` format)."""
    rng = random.Random(seed)
    t = start
    while t < end:
        ms = int(t * 1000)
        for node, ((model, memory, limit), holders) in NODES.items():
            by_gpu = {g: h for h in holders for g in h.gpus}
            draws = {id(h): rng.random() for h in holders}
            for gpu in range(8):
                holder = by_gpu.get(gpu)
                kind = holder.kind if holder else "free"
                if holder is None:
                    s = {"util": 0.0, "mem": 1 / memory, "power": 0.08, "tensor": 0.0, "dram": 0.0, "nvlink": 0.0,
                         "pcie": 0.0}  # fmt: skip
                else:
                    s = _sample(kind, rng, t, draws[id(holder)], 0.4)
                base = {"gpu": str(gpu), "UUID": f"GPU-{node}-{gpu:02d}", "pci_bus_id": f"00000000:{0x18 + gpu:02X}:00.0",
                        "device": f"nvidia{gpu}", "modelName": model, hostname_label: node,
                        "DCGM_FI_DRIVER_VERSION": "550.54.15"}  # fmt: skip
                owners: list[dict[str, str]] = [{}]
                if holder is not None and holder.pod is not None:
                    owners = [
                        {"container": p.container, "namespace": p.namespace, "pod": p.pod, "pod_uid": p.uid}
                        for p in [holder.pod, *holder.extra_pods]
                    ]
                elif holder is not None and holder.job is not None:
                    owners = [{"hpc_job": holder.job}]
                used = s["mem"] * memory
                values = {
                    "DCGM_FI_DEV_GPU_UTIL": round(s["util"]),
                    "DCGM_FI_DEV_MEM_COPY_UTIL": round(s["dram"] * 60),
                    "DCGM_FI_DEV_FB_USED": round(used),
                    "DCGM_FI_DEV_FB_FREE": memory - round(used) - 500,
                    "DCGM_FI_DEV_FB_RESERVED": 500,
                    "DCGM_FI_DEV_POWER_USAGE": round(s["power"] * limit, 3),
                    "DCGM_FI_DEV_GPU_TEMP": 40 + round(s["util"] / 3),
                    "DCGM_FI_DEV_SM_CLOCK": 1980 if s["util"] > 5 else 345,
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(s["util"] / 100, 4),
                    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": round(s["tensor"], 4),
                    "DCGM_FI_PROF_DRAM_ACTIVE": round(s["dram"], 4),
                    "DCGM_FI_PROF_PCIE_TX_BYTES": round(s["pcie"] * rng.uniform(0.9, 1.1)),
                    "DCGM_FI_PROF_PCIE_RX_BYTES": round(s["pcie"] * rng.uniform(0.9, 1.1)),
                    "DCGM_FI_PROF_NVLINK_TX_BYTES": round(s["nvlink"] * rng.uniform(0.9, 1.1)),
                    "DCGM_FI_PROF_NVLINK_RX_BYTES": round(s["nvlink"] * rng.uniform(0.9, 1.1)),
                }
                for owner in owners:
                    labels = _labels({**base, **owner})
                    for metric, value in values.items():
                        yield f"{metric}{{{labels}}} {value} {ms}"
        # cAdvisor: a pod's own network namespace, as counters (bytes since it started)
        elapsed = t - start
        for pod, (tx, rx) in ((CHAT, (3e6, 0.8e6)), (TRAIN, (2e4, 2e4)), (NOTEBOOK, (0.0, 0.0))):
            for metric, rate in (
                ("container_network_transmit_bytes_total", tx),
                ("container_network_receive_bytes_total", rx),
            ):
                labels = _labels({"namespace": pod.namespace, "pod": pod.pod, "interface": "eth0", "container": "POD"})
                yield f"{metric}{{{labels}}} {round(rate * elapsed)} {ms}"
        # cAdvisor: storage per container and device, and the chat pod's own cgroup (container="", holding its
        # containers) with its sandbox's (no I/O); the trainer's pod has its containers' series only
        restarted = math.ceil(RESTART / step) * step  # the first scrape of the new container
        since = elapsed if elapsed < restarted else elapsed - (restarted - step)
        pod_level: dict[tuple[str, str], list[float]] = {}
        for pod, container, device, read, write in DISK:
            seconds = since if (pod, container) == (TRAIN, "pytorch") else elapsed
            labels = _labels({"namespace": pod.namespace, "pod": pod.pod, "container": container, "device": device})
            yield f"container_fs_reads_bytes_total{{{labels}}} {round(read * seconds)} {ms}"
            yield f"container_fs_writes_bytes_total{{{labels}}} {round(write * seconds)} {ms}"
            if pod is CHAT:
                total = pod_level.setdefault((pod.pod, device), [0.0, 0.0])
                total[0] += read * seconds
                total[1] += write * seconds
        for (name, device), (read, write) in pod_level.items():
            for container, scale in (("", 1.0), ("POD", 0.0)):
                labels = _labels({"namespace": CHAT.namespace, "pod": name, "container": container, "device": device})
                yield f"container_fs_reads_bytes_total{{{labels}}} {round(read * scale)} {ms}"
                yield f"container_fs_writes_bytes_total{{{labels}}} {round(write * scale)} {ms}"
        # kube-state-metrics
        for pod in (CHAT, TRAIN, NOTEBOOK, TTS_A, TTS_B):
            ns_pod = {"namespace": pod.namespace, "pod": pod.pod}
            yield f"kube_pod_owner{{{_labels({**ns_pod, 'owner_kind': pod.owner_kind, 'owner_name': pod.owner_name, 'owner_is_controller': 'true'})}}} 1 {ms}"
            yield f"kube_pod_labels{{{_labels({**ns_pod, 'label_team': pod.team})}}} 1 {ms}"
            yield f"kube_pod_info{{{_labels({**ns_pod, 'uid': pod.uid, 'node': 'x'})}}} 1 {ms}"
            if pod.replicaset:
                rs = {"namespace": pod.namespace, "replicaset": pod.owner_name, "owner_kind": "Deployment",
                      "owner_name": pod.replicaset, "owner_is_controller": "true"}  # fmt: skip
                yield f"kube_replicaset_owner{{{_labels(rs)}}} 1 {ms}"
        t += step
