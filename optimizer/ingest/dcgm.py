"""dcgm-exporter's series as fleetfit's own messages: a node's inventory (a birth) and its telemetry windows.

A node read through Prometheus enters the fleet the way an agent's node does, through the same protocol and the same
validation (``Fleet.ingest``), so the same digests, features, classifier and planner serve both. What this module
assumes of dcgm-exporter, from its source (``etc/default-counters.csv``, ``internal/pkg/rendermetrics``,
``internal/pkg/transformation``):

* Each GPU's series carry ``gpu`` (the index), ``UUID``, ``pci_bus_id``, ``device``, ``modelName`` and the node's
  name in ``Hostname`` (``hostname`` since dcgm-exporter renamed it); on Kubernetes the DaemonSet pod's name is
  ``Hostname``, so fleets relabel the node's name into another label (``--node-label``).
* A MIG instance's series add ``GPU_I_ID`` and ``GPU_I_PROFILE``; NVML gives no utilisation for MIG instances, so
  ``DCGM_FI_DEV_GPU_UTIL`` is absent there and ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (the share of time the graphics
  engine was busy, 0-1) stands for it.
* With Kubernetes mapping on, a GPU a pod holds carries ``namespace``, ``pod`` and ``container`` (``pod_namespace``,
  ``pod_name``, ``container_name`` with the old names), and ``pod_uid`` where enabled; a GPU several pods share
  (time-slicing) is written once per pod, the same values under each. With HPC job mapping, ``hpc_job`` names the
  Slurm job the same way. A GPU nobody holds carries neither.
* ``DCGM_FI_DEV_GPU_UTIL`` is NVML's utilisation, sampled by DCGM at its update interval (the share of the last
  1/6-1 s a kernel ran): a scrape's value is one sampled second, so the points of a window are a sample of its
  seconds: their share at 0 %, their spread and their p95 estimate the agent's per-second figures. Their spacing
  (the scrape interval, 15-60 s) is far longer than a training step (0.2-10 s): no step period can be read from them,
  and the features do not look for one in a window this sparse (optimizer/decide/features.py).
* ``DCGM_FI_PROF_*`` activities are ratios (0-1) over DCGM's sampling interval; PCIe and NVLink byte fields are
  rates in bytes/s. Framebuffer figures are MiB, power W, clocks MHz.

Every label value comes from a server and is checked here before it names anything: a node name that is no
protocol id, a workload id too long, text with control characters are left out, counted per reason.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from agent.protocol import FLOAT32_MAX, MAX_GPU_INDEX, SCHEMA_VERSION, Stats, WorkloadKind, printable, series

# Births of nodes read through Prometheus carry this as their agent version: the optimizer tells them apart (the
# console's source column; NVLink and fabric unknown rather than measured absent).
SOURCE = "prometheus"

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
MEM_COPY_UTIL = "DCGM_FI_DEV_MEM_COPY_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
FB_RESERVED = "DCGM_FI_DEV_FB_RESERVED"
POWER = "DCGM_FI_DEV_POWER_USAGE"
POWER_LIMIT = "DCGM_FI_DEV_POWER_MGMT_LIMIT"  # field 157, W; not among dcgm-exporter's default counters
ENFORCED_LIMIT = "DCGM_FI_DEV_ENFORCED_POWER_LIMIT"  # field 164, W
SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"
GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"
GR_ENGINE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"
TENSOR = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
DRAM = "DCGM_FI_PROF_DRAM_ACTIVE"
PCIE_TX = "DCGM_FI_PROF_PCIE_TX_BYTES"
PCIE_RX = "DCGM_FI_PROF_PCIE_RX_BYTES"
NVLINK_TX = "DCGM_FI_PROF_NVLINK_TX_BYTES"
NVLINK_RX = "DCGM_FI_PROF_NVLINK_RX_BYTES"
# Among dcgm-exporter's default counters: NVLink throughput of all links, both directions, in MB/s (DCGM's own field
# table, dcgmlib/src/dcgm_fields.cpp, gives it DCGM_FIELD_UNIT_BW_MBPS), though default-counters.csv calls it a counter.
NVLINK_TOTAL = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"

# Every series read, and what each becomes in a window's GPU: (field, scale to the protocol's unit).
FIELDS: dict[str, tuple[str, float]] = {
    GPU_UTIL: ("util", 1.0),
    MEM_COPY_UTIL: ("mem_util", 1.0),
    FB_USED: ("mem_used_mib", 1.0),
    POWER: ("power_w", 1.0),
    GPU_TEMP: ("temp_c", 1.0),
    SM_CLOCK: ("sm_clock_mhz", 1.0),
    PCIE_TX: ("pcie_tx_bps", 1.0),
    PCIE_RX: ("pcie_rx_bps", 1.0),
    NVLINK_TX: ("nvlink_tx_bps", 1.0),
    NVLINK_RX: ("nvlink_rx_bps", 1.0),
    NVLINK_TOTAL: ("nvlink_total", 1e6),  # read where the profiling NVLink fields are not exported
    SM_ACTIVE: ("sm_active", 100.0),
    TENSOR: ("tensor_active", 100.0),
    DRAM: ("dram_active", 100.0),
    GR_ENGINE: ("gr_engine", 100.0),  # utilisation where NVML has none (MIG instances)
}
INVENTORY_ONLY = (FB_FREE, FB_RESERVED, POWER_LIMIT, ENFORCED_LIMIT)
METRICS = (*FIELDS, *INVENTORY_ONLY)
PERCENT = frozenset({"util", "mem_util", "sm_active", "tensor_active", "dram_active", "gr_engine"})
PROFILING = frozenset({SM_ACTIVE, TENSOR, DRAM, GR_ENGINE})

# Labels, each with the spelling older or newer dcgm-exporters use.
NODE_LABELS = ("Hostname", "hostname")
UUID_LABELS = ("UUID", "uuid")
MODEL_LABELS = ("modelName", "model_name")
NAMESPACE_LABELS = ("namespace", "pod_namespace")
POD_LABELS = ("pod", "pod_name")
CONTAINER_LABELS = ("container", "container_name")

# A GPU whose framebuffer holds more than this has a process on it (a CUDA context alone takes 300-600 MiB; a GPU
# with none reads a few MiB, what the driver keeps with persistence mode on). An estimate from how the driver
# behaves, not a vendor figure.
CONTEXT_MIB = 256.0
MAX_ID = 200
_IDENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _label(labels: Mapping[str, str], names: Iterable[str]) -> str | None:
    for name in names:
        value = labels.get(name)
        if value:
            return value
    return None


def valid_node(name: str) -> bool:
    """Whether ``name`` can name a node in the protocol (a topic level and an account name)."""
    return bool(_IDENT.match(name))


@dataclass(frozen=True, slots=True)
class PodMeta:
    """What kube-state-metrics says of a pod: the controller a capacity team would move, and the owner."""

    name: str | None = None  # the controller's name (a Deployment's, past its ReplicaSet), else None
    kind: str | None = None  # Deployment, StatefulSet, Job, LeaderWorkerSet...
    owner: str | None = None  # the value of the configured owner label, else None (the namespace is used)
    uid: str | None = None


@dataclass(frozen=True, slots=True)
class WorkloadKey:
    id: str
    kind: WorkloadKind
    name: str
    owner: str | None = None
    hint: str | None = None
    pod: tuple[str, str] | None = None  # (namespace, pod) of a Kubernetes pod


@dataclass(slots=True)
class _Points:
    times: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def merge(self, times: list[float], values: list[float]) -> None:
        if not self.times:
            self.times, self.values = list(times), list(values)
            return
        # copies of one GPU's series under each pod sharing it: the same values at the same times
        seen = dict(zip(self.times, self.values, strict=True))
        seen.update(zip(times, values, strict=True))
        ordered = sorted(seen.items())
        self.times = [t for t, _ in ordered]
        self.values = [v for _, v in ordered]

    def between(self, start: float, end: float) -> list[float]:
        return self.values[bisect_left(self.times, start) : bisect_left(self.times, end)]


@dataclass(slots=True)
class Device:
    gpu: int
    instance: int | None
    uuid: str = ""
    model: str = "unknown"
    profile: str | None = None
    metrics: dict[str, _Points] = field(default_factory=dict)
    # workload -> the times its labels were on this device's series
    holders: dict[WorkloadKey, list[float]] = field(default_factory=dict)


@dataclass(slots=True)
class NodeSeries:
    """One node's dcgm-exporter series over a stretch of time, grouped by device."""

    node: str
    devices: dict[tuple[int, int | None], Device] = field(default_factory=dict)
    driver: str | None = None
    # per pod (namespace, pod): the times and bytes/s of its own network namespace, in and out (cAdvisor)
    pod_network: dict[tuple[str, str], tuple[_Points, _Points]] = field(default_factory=dict)


@dataclass(slots=True)
class Tally:
    """What was left out of the series read, per reason: one bad label costs its series only."""

    skipped: Counter[str] = field(default_factory=Counter)

    def skip(self, reason: str) -> None:
        self.skipped[reason] += 1


def _clean(value: str | None, limit: int) -> str | None:
    if value is None:
        return None
    text = printable(value).strip()
    return text[:limit] or None


def workload_of(labels: Mapping[str, str], pods: Mapping[tuple[str, str], PodMeta], tally: Tally) -> WorkloadKey | None:
    """The workload a series' labels name: a Kubernetes pod, a Slurm job, or None (nobody holds the GPU)."""
    namespace, pod = _label(labels, NAMESPACE_LABELS), _label(labels, POD_LABELS)
    if namespace and pod:
        meta = pods.get((namespace, pod), PodMeta())
        uid = labels.get("pod_uid") or meta.uid
        wid = f"k8s/{uid}" if uid else f"k8s/{namespace}/{pod}"
        if len(wid) > MAX_ID or printable(wid) != wid:
            tally.skip("workload_id")
            return None
        name = _clean(meta.name or pod, MAX_ID) or pod[:MAX_ID]
        owner = _clean(meta.owner or namespace, 128)
        hint = _clean(_label(labels, CONTAINER_LABELS), 64)
        return WorkloadKey(wid, WorkloadKind.KUBERNETES_POD, name, owner, hint, (namespace, pod))
    job = labels.get("hpc_job")
    if job:
        wid = f"slurm/{job}"
        if len(wid) > MAX_ID or printable(wid) != wid:
            tally.skip("workload_id")
            return None
        return WorkloadKey(wid, WorkloadKind.SLURM_JOB, f"job {job}")
    return None


def add_series(
    into: NodeSeries,
    labels: Mapping[str, str],
    times: list[float],
    values: list[float],
    pods: Mapping[tuple[str, str], PodMeta],
    tally: Tally,
) -> None:
    """Take one dcgm-exporter series into its node's devices."""
    name = labels.get("__name__", "")
    if name not in METRICS:
        tally.skip("unknown_metric")
        return
    try:
        gpu = int(labels.get("gpu", ""))
        instance = int(labels["GPU_I_ID"]) if labels.get("GPU_I_ID") else None
    except ValueError:
        tally.skip("gpu_label")
        return
    if not 0 <= gpu <= MAX_GPU_INDEX or (instance is not None and not 0 <= instance <= 64):
        tally.skip("gpu_label")
        return
    kept = [(t, v) for t, v in zip(times, values, strict=True) if 0 <= v <= FLOAT32_MAX]
    if len(kept) < len(times):
        tally.skip("value_out_of_range")
    device = into.devices.get((gpu, instance))
    if device is None:
        device = into.devices[(gpu, instance)] = Device(gpu, instance)
    device.uuid = _clean(_label(labels, UUID_LABELS), 96) or device.uuid
    device.model = _clean(_label(labels, MODEL_LABELS), 96) or device.model
    if instance is not None:
        device.profile = _clean(labels.get("GPU_I_PROFILE"), 32) or device.profile
    into.driver = _clean(labels.get("DCGM_FI_DRIVER_VERSION"), 32) or into.driver
    kept_times, kept_values = [t for t, _ in kept], [v for _, v in kept]
    device.metrics.setdefault(name, _Points()).merge(kept_times, kept_values)
    if name in (GPU_UTIL, FB_USED, GR_ENGINE):
        holder = workload_of(labels, pods, tally)
        if holder is not None:
            device.holders.setdefault(holder, []).extend(kept_times)


def add_pod_network(
    into: NodeSeries, namespace: str, pod: str, direction: str, times: list[float], values: list[float]
) -> None:
    """A pod's own network traffic (cAdvisor, bytes/s); ``direction`` "rx" or "tx"."""
    rx, tx = into.pod_network.setdefault((namespace, pod), (_Points(), _Points()))
    kept = [(t, v) for t, v in zip(times, values, strict=True) if 0 <= v <= FLOAT32_MAX]
    (rx if direction == "rx" else tx).merge([t for t, _ in kept], [v for _, v in kept])


@dataclass(frozen=True, slots=True)
class Layout:
    """A node's devices as a birth lists them: physical GPUs by their index, MIG instances after them."""

    index: dict[tuple[int, int | None], int]
    parents: dict[int, int]  # a MIG instance's index -> its GPU's


def layout(node: NodeSeries) -> Layout:
    physical = sorted({gpu for gpu, _ in node.devices})
    index: dict[tuple[int, int | None], int] = {(gpu, None): gpu for gpu in physical}
    parents: dict[int, int] = {}
    following = (max(physical) + 1) if physical else 0
    for gpu, instance in sorted((k for k in node.devices if k[1] is not None), key=lambda k: (k[0], k[1] or 0)):
        if following > MAX_GPU_INDEX:
            break
        index[(gpu, instance)] = following
        parents[following] = gpu
        following += 1
    return Layout(index, parents)


def _max(points: _Points | None) -> float | None:
    return max(points.values) if points is not None and points.values else None


def birth(
    node: NodeSeries, site: str, timestamp: float, power_limit: Callable[[str], float | None] | None = None
) -> dict[str, object]:
    """The node's inventory as a birth payload. A GPU's memory is the most its framebuffer figures add up to; its
    power limit DCGM's where exported, else ``power_limit(model)`` (the catalog's TDP: an estimate)."""
    places = layout(node)
    gpus: list[dict[str, object]] = []
    mig_parents = {gpu for gpu, instance in node.devices if instance is not None}
    for (gpu, instance), at in sorted(places.index.items(), key=lambda kv: kv[1]):
        device = node.devices.get((gpu, instance))
        if device is None:  # a MIG-mode GPU listed only by its instances
            sibling = next(d for (g, _), d in node.devices.items() if g == gpu)
            device = Device(gpu, None, uuid=sibling.uuid, model=sibling.model)
        total = sum(v for v in (_max(device.metrics.get(m)) for m in (FB_USED, FB_FREE, FB_RESERVED)) if v is not None)
        entry: dict[str, object] = {
            "index": at,
            "uuid": device.uuid or f"GPU-{node.node}-{gpu}",
            "model": device.model if instance is None else f"{device.model} MIG {device.profile or '?'}"[:96],
            "memory_mib": int(min(total, 2**31)),
            "mig_mode": instance is None and gpu in mig_parents,
        }
        if instance is not None:
            entry["parent"] = gpu
            if device.profile:
                entry["mig_profile"] = device.profile
        else:
            limit = _max(device.metrics.get(ENFORCED_LIMIT)) or _max(device.metrics.get(POWER_LIMIT))
            if limit is None and power_limit is not None:
                limit = power_limit(device.model)
            if limit is not None and limit > 0:
                entry["power_limit_w"] = float(limit)
        gpus.append(entry)
    out: dict[str, object] = {
        "schema": SCHEMA_VERSION,
        "node": node.node,
        "site": site,
        "session": 1,
        "agent_version": SOURCE,
        "hostname": node.node,
        "timestamp": timestamp,
        "gpus": gpus,
    }
    if node.driver:
        out["driver_version"] = node.driver
    return out


def _stats(values: list[float]) -> list[float] | None:
    return list(Stats.of(values)) if values else None


def windows(node: NodeSeries, site: str, start: float, end: float, length: float) -> list[dict[str, object]]:
    """The node's telemetry windows from ``start`` to ``end``, ``length`` seconds each, as payloads; windows with no
    GPU figure are left out. A window's ``seq`` is its place since the epoch, so windows read again (an overlapping
    refresh) are the same window, refused by the fleet as a duplicate."""
    places = layout(node)
    mig_parents = {gpu for gpu, instance in node.devices if instance is not None}
    for device in node.devices.values():
        for times in device.holders.values():
            times.sort()
    out: list[dict[str, object]] = []
    first = math.floor(start / length)
    last = math.ceil(end / length)
    for k in range(first, last):
        w0, w1 = k * length, (k + 1) * length
        if w0 < start - 1e-6 or w1 > end + 1e-6:
            continue  # only whole windows: a part would read as a quiet stretch
        gpus: list[dict[str, object]] = []
        samples = 0
        held: dict[WorkloadKey, list[int]] = defaultdict(list)
        used_unclaimed: list[int] = []
        for key, device in node.devices.items():
            at = places.index.get(key)
            if at is None:
                continue
            entry: dict[str, list[float]] = {}
            for metric, points in device.metrics.items():
                spec = FIELDS.get(metric)
                if spec is None:
                    continue
                values = points.between(w0, w1)
                if not values:
                    continue
                target, scale = spec
                if scale != 1.0:
                    values = [v * scale for v in values]
                if target in PERCENT:
                    values = [min(v, 100.0) for v in values]
                entry[target] = values
            util = entry.pop("util", None) or entry.get("gr_engine")
            entry.pop("gr_engine", None)
            total = entry.pop("nvlink_total", None)
            if total and "nvlink_tx_bps" not in entry and "nvlink_rx_bps" not in entry:
                # both directions in one figure: half each way keeps their sum, which is what features read
                entry["nvlink_tx_bps"] = entry["nvlink_rx_bps"] = [v / 2 for v in total]
            if not util:
                continue  # no utilisation at all in this window: nothing to classify from
            samples = max(samples, len(util))
            gpu: dict[str, object] = {"index": at, "util": _stats(util), "util_series": series(util[:3600])}
            for name, values in entry.items():
                gpu[name] = _stats(values)
            gpus.append(gpu)
            claimed = False
            for holder, times in device.holders.items():
                if bisect_left(times, w0) < bisect_left(times, w1):
                    held[holder].append(at)
                    claimed = True
            memory = device.metrics.get(FB_USED)
            busy = max(util) > 0 or (memory is not None and any(v > CONTEXT_MIB for v in memory.between(w0, w1)))
            if not claimed and busy and key[1] is None and key[0] not in mig_parents:
                used_unclaimed.append(at)
        if not gpus:
            continue
        refs = [_ref(h, sorted(set(indices)), node, w0, w1) for h, indices in held.items()]
        if used_unclaimed:
            refs.append(
                {
                    "id": f"gpus/{node.node}",
                    "kind": WorkloadKind.PROCESS_GROUP.value,
                    "name": f"{node.node}: GPUs in use outside any pod or job"[:MAX_ID],
                    "gpus": sorted(used_unclaimed),
                }
            )
        out.append(
            {
                "schema": SCHEMA_VERSION,
                "node": node.node,
                "site": site,
                "session": 1,
                "seq": k,
                "start": w0,
                "end": w1,
                "samples": samples,
                "gpus": sorted(gpus, key=lambda g: int(str(g["index"]))),
                "workloads": refs[:64],
            }
        )
    return out


def _ref(holder: WorkloadKey, gpus: list[int], node: NodeSeries, w0: float, w1: float) -> dict[str, object]:
    ref: dict[str, object] = {"id": holder.id, "kind": holder.kind.value, "name": holder.name, "gpus": gpus}
    if holder.owner:
        ref["owner"] = holder.owner
    if holder.hint:
        ref["hint"] = holder.hint
    if holder.pod is not None and holder.pod in node.pod_network:
        rx, tx = node.pod_network[holder.pod]
        ins, outs = rx.between(w0, w1), tx.between(w0, w1)
        if ins:
            ref["net_rx_bps"] = round(sum(ins) / len(ins), 1)
        if outs:
            ref["net_tx_bps"] = round(sum(outs) / len(outs), 1)
    return ref
