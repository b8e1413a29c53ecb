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
from itertools import pairwise

import numpy as np

from agent.protocol import (
    FLOAT32_MAX,
    MAX_GPU_INDEX,
    MAX_POWER_LIMIT_W,
    SCHEMA_VERSION,
    Stats,
    WorkloadKind,
    printable,
)

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
# Throttling (none of these is among dcgm-exporter's default counters: etc/default-counters.csv leaves the two
# violation counters commented out and lists neither the reasons nor the limits). Field 112 (dcgm_fields.h), a
# bitmask of NVML's clocks-event reasons, renamed from CLOCK_THROTTLE_REASONS in DCGM 3.3; either name is read.
CLOCK_EVENTS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
THROTTLE_REASONS = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
POWER_VIOLATION = "DCGM_FI_DEV_POWER_VIOLATION"  # field 240: microseconds clocks were held by power, a counter
THERMAL_VIOLATION = "DCGM_FI_DEV_THERMAL_VIOLATION"  # field 241: the same for heat
# The reasons that cost a workload speed, as the agent counts them (collectors/gpu.py, from nvml.h
# nvmlClocksEventReason*): SW power cap 0x4 and HW power brake 0x80, SW thermal 0x20 and HW thermal 0x40, HW slowdown
# 0x8. GPU idle 0x1, applications clocks 0x2, sync boost 0x10 and display clocks 0x100 slow no work.
REASON_BITS = (
    ("power_capped_pct", 0x4 | 0x80),
    ("thermal_slowdown_pct", 0x20 | 0x40),
    ("hw_slowdown_pct", 0x8),
)
VIOLATIONS = ((POWER_VIOLATION, "power_violation_pct"), (THERMAL_VIOLATION, "thermal_violation_pct"))
THROTTLE_METRICS = (CLOCK_EVENTS, THROTTLE_REASONS, POWER_VIOLATION, THERMAL_VIOLATION)

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
METRICS = (*FIELDS, *INVENTORY_ONLY, *THROTTLE_METRICS)
# Read point by point (a sampled second each; a bitmask and counters, which no mean summarises); every other series
# is read as one figure a window, its mean, or for these its most (memory held, the GPU's memory and power limits).
RAW = frozenset({GPU_UTIL, GR_ENGINE, *THROTTLE_METRICS})
# Kept in the windows (and the store) but read by no feature: an import for a snapshot leaves them out.
STORE_ONLY = frozenset({MEM_COPY_UTIL, GPU_TEMP, SM_CLOCK, SM_ACTIVE})
PEAKS = frozenset({FB_USED, FB_FREE, FB_RESERVED, POWER_LIMIT, ENFORCED_LIMIT})
PERCENT = frozenset({"util", "mem_util", "sm_active", "tensor_active", "dram_active", "gr_engine"})
PROFILING = frozenset({SM_ACTIVE, TENSOR, DRAM, GR_ENGINE})

# What cAdvisor gives of a pod, as the agent's window fields (bytes/s): its own network namespace in and out, its
# cgroup's storage reads and writes.
POD_RATES = ("net_rx_bps", "net_tx_bps", "disk_read_bps", "disk_write_bps")

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


# The key of a Slurm job's entry among the pods' (namespace, pod): no Kubernetes namespace is empty, so a job's
# (SLURM_JOBS, job id) never meets a pod's.
SLURM_JOBS = ""


@dataclass(frozen=True, slots=True)
class PodMeta:
    """What kube-state-metrics says of a pod: the controller a capacity team would move, and the owner; or, under
    (``SLURM_JOBS``, job id), what squeue says of a Slurm job: its name and account."""

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
    # per pod (namespace, pod): per field of POD_RATES, the times and bytes/s cAdvisor gave for it
    pod_rates: dict[tuple[str, str], dict[str, _Points]] = field(default_factory=dict)


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
        meta = pods.get((SLURM_JOBS, job), PodMeta())  # the scheduler's own word, where it was asked
        name = _clean(meta.name, MAX_ID) or f"job {job}"
        return WorkloadKey(wid, WorkloadKind.SLURM_JOB, name, _clean(meta.owner, 128))
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
    if values and min(values) >= 0 and max(values) <= FLOAT32_MAX:  # every honest series: no copy
        kept_times, kept_values = times, values
    else:
        kept = [(t, v) for t, v in zip(times, values, strict=True) if 0 <= v <= FLOAT32_MAX]
        if len(kept) < len(times):
            tally.skip("value_out_of_range")
        kept_times, kept_values = [t for t, _ in kept], [v for _, v in kept]
    device = into.devices.get((gpu, instance))
    if device is None:
        device = into.devices[(gpu, instance)] = Device(gpu, instance)
    device.uuid = _clean(_label(labels, UUID_LABELS), 96) or device.uuid
    device.model = _clean(_label(labels, MODEL_LABELS), 96) or device.model
    if instance is not None:
        device.profile = _clean(labels.get("GPU_I_PROFILE"), 32) or device.profile
    into.driver = _clean(labels.get("DCGM_FI_DRIVER_VERSION"), 32) or into.driver
    device.metrics.setdefault(name, _Points()).merge(kept_times, kept_values)
    if name in (GPU_UTIL, FB_USED, GR_ENGINE):
        holder = workload_of(labels, pods, tally)
        if holder is not None:
            device.holders.setdefault(holder, []).extend(kept_times)


def add_pod_rate(
    into: NodeSeries, namespace: str, pod: str, name: str, times: list[float], values: list[float]
) -> None:
    """A pod's own traffic from cAdvisor (bytes/s) as the window's workload field ``name``, one of POD_RATES."""
    if name not in POD_RATES:
        raise ValueError(f"{name!r} is no pod rate")
    kept = [(t, v) for t, v in zip(times, values, strict=True) if 0 <= v <= FLOAT32_MAX]
    points = into.pod_rates.setdefault((namespace, pod), {}).setdefault(name, _Points())
    points.merge([t for t, _ in kept], [v for _, v in kept])


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


def _limit(points: _Points | None) -> float | None:
    """The highest power limit a series reported, W; None without one, or where it is none a GPU has (a driver's
    sentinel such as 4,294,967 W, which the birth would refuse, taking the node's GPUs with it)."""
    limit = _max(points)
    return limit if limit is not None and 0 < limit <= MAX_POWER_LIMIT_W else None


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
            limit = _limit(device.metrics.get(ENFORCED_LIMIT)) or _limit(device.metrics.get(POWER_LIMIT))
            if limit is None and power_limit is not None:
                limit = power_limit(device.model)
            if limit is not None and 0 < limit <= MAX_POWER_LIMIT_W:
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
    """A window's summary of ``values``; one value (a figure the server summed up for the window) is its own."""
    if len(values) == 1:
        v = values[0]
        return [v, v, v, 0.0]
    return list(Stats.of(values)) if values else None


def _cut(times: list[float], bounds: list[float]) -> list[int]:
    """Where each of ``bounds`` falls in ``times`` (sorted): window j's points are [cut[j], cut[j + 1])."""
    return [bisect_left(times, b) for b in bounds]


def _util_stats(values: list[float], cut: list[int]) -> list[list[float] | None]:
    """Each window's utilisation summary: the windows with the same number of points (most of them: a point a
    scrape) at once as arrays (mean, p95 as ``Stats.of`` ranks it, max, population deviation), the rest one by one."""
    out: list[list[float] | None] = [None] * (len(cut) - 1)
    by_count: dict[int, list[int]] = defaultdict(list)
    for j, (a, b) in enumerate(pairwise(cut)):
        by_count[b - a].append(j)
    data = np.asarray(values, dtype=np.float64)
    for n, js in by_count.items():
        if n < 2 or len(js) < 4:
            for j in js:
                out[j] = _stats(values[cut[j] : cut[j + 1]])
            continue
        starts = np.asarray([cut[j] for j in js])
        block = data[starts[:, None] + np.arange(n)]
        ordered = np.sort(block, axis=1)
        top = ordered[:, -1]
        # a mean of equal values can land a bit above them in floating point: never above the window's max
        mean = np.minimum(block.mean(axis=1), top)
        rank = max(0, math.ceil(0.95 * n) - 1)
        rows = np.stack([mean, ordered[:, rank], top, block.std(axis=1)], axis=1).tolist()
        for j, row in zip(js, rows, strict=True):
            out[j] = row
    return out


def _summaries(values: list[float], cut: list[int]) -> list[list[float] | None]:
    """Each window's summary of a figure; one value (what the server summed up for the window) is its own."""
    return [
        [values[a], values[a], values[a], 0.0] if b - a == 1 else _stats(values[a:b]) if b > a else None
        for a, b in pairwise(cut)
    ]


def windows(node: NodeSeries, site: str, start: float, end: float, length: float) -> list[dict[str, object]]:
    """The node's telemetry windows from ``start`` to ``end``, ``length`` seconds each, as payloads; windows with no
    GPU figure are left out. A window's ``seq`` is its place since the epoch, so windows read again (an overlapping
    refresh) are the same window, refused by the fleet as a duplicate. Device by device: each series is cut at
    the windows' bounds once."""
    places = layout(node)
    mig_parents = {gpu for gpu, instance in node.devices if instance is not None}
    # only whole windows: a part would read as a quiet stretch
    ks = [k for k in range(math.floor(start / length), math.ceil(end / length))
          if k * length >= start - 1e-6 and (k + 1) * length <= end + 1e-6]  # fmt: skip
    if not ks:
        return []
    bounds = [k * length for k in ks] + [(ks[-1] + 1) * length]
    count = len(ks)
    gpus: list[list[dict[str, object]]] = [[] for _ in ks]
    samples = [0] * count
    held: list[dict[WorkloadKey, list[int]]] = [defaultdict(list) for _ in ks]
    unclaimed: list[list[int]] = [[] for _ in ks]
    for key, device in node.devices.items():
        at = places.index.get(key)
        if at is None:
            continue
        fields: dict[str, tuple[list[float], list[int]]] = {}
        for metric, points in device.metrics.items():
            spec = FIELDS.get(metric)
            if spec is None or not points.values:
                continue
            target, scale = spec
            values = points.values if scale == 1.0 else [v * scale for v in points.values]
            if target in PERCENT and max(values) > 100.0:
                values = [min(v, 100.0) for v in values]
            fields[target] = (values, _cut(points.times, bounds))
        for target, (times, values) in _throttle_series(device).items():
            fields[target] = (values, _cut(times, bounds))
        source = fields.pop("util", None) or fields.get("gr_engine")
        fields.pop("gr_engine", None)
        if source is None:
            continue  # no utilisation at all: nothing to classify from
        total = fields.pop("nvlink_total", None)
        if total is not None and "nvlink_tx_bps" not in fields and "nvlink_rx_bps" not in fields:
            # both directions in one figure: half each way keeps their sum, which is what features read
            fields["nvlink_tx_bps"] = fields["nvlink_rx_bps"] = ([v / 2 for v in total[0]], total[1])
        util, util_cut = source
        util_stats = _util_stats(util, util_cut)
        summaries = [(name, _summaries(values, cut)) for name, (values, cut) in fields.items()]
        claims = [(holder, _cut(times, bounds)) for holder, times in device.holders.items()]
        memory = device.metrics.get(FB_USED)
        memory_cut = _cut(memory.times, bounds) if memory is not None else None
        own_gpu = key[1] is None and key[0] not in mig_parents
        for j in range(count):
            a, b = util_cut[j], util_cut[j + 1]
            if a == b:
                continue
            samples[j] = max(samples[j], b - a)
            # dcgm-exporter writes utilisation as whole percentages: nothing to round for the wire
            gpu: dict[str, object] = {"index": at, "util": util_stats[j], "util_series": util[a : min(b, a + 3600)]}
            for name, per_window in summaries:
                summary = per_window[j]
                if summary is not None:
                    gpu[name] = summary
            gpus[j].append(gpu)
            claimed = False
            for holder, cut in claims:
                if cut[j] < cut[j + 1]:
                    held[j][holder].append(at)
                    claimed = True
            if not claimed and own_gpu:
                busy = max(util[a:b]) > 0
                if not busy and memory is not None and memory_cut is not None:
                    busy = any(v > CONTEXT_MIB for v in memory.values[memory_cut[j] : memory_cut[j + 1]])
                if busy:
                    unclaimed[j].append(at)
    out: list[dict[str, object]] = []
    for j, k in enumerate(ks):
        if not gpus[j]:
            continue
        w0, w1 = bounds[j], bounds[j + 1]
        refs = [_ref(h, sorted(set(indices)), node, w0, w1) for h, indices in held[j].items()]
        if unclaimed[j]:
            refs.append(
                {
                    "id": f"gpus/{node.node}",
                    "kind": WorkloadKind.PROCESS_GROUP.value,
                    "name": f"{node.node}: GPUs in use outside any pod or job"[:MAX_ID],
                    "gpus": sorted(unclaimed[j]),
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
                "samples": samples[j],
                "gpus": sorted(gpus[j], key=lambda g: int(str(g["index"]))),
                "workloads": refs[:64],
            }
        )
    return out


def _throttle_series(device: Device) -> dict[str, tuple[list[float], list[float]]]:
    """The device's throttle figures as the agent's window fields, each (times, % values): 100 where a reason held
    at a scrape, else 0; a violation counter as the share of each interval between two points it grew by."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    reasons = device.metrics.get(CLOCK_EVENTS) or device.metrics.get(THROTTLE_REASONS)
    if reasons is not None and reasons.values:
        masks = [int(v) for v in reasons.values]
        for target, bits in REASON_BITS:
            out[target] = (reasons.times, [100.0 if m & bits else 0.0 for m in masks])
    for metric, target in VIOLATIONS:
        points = device.metrics.get(metric)
        if points is None:
            continue
        times, shares = [], []
        for (t0, v0), (t1, v1) in pairwise(zip(points.times, points.values, strict=True)):
            if t1 > t0 and v1 >= v0:  # a counter that fell was reset (a driver reload): that interval is unknown
                times.append(t1)
                shares.append(min(100.0, (v1 - v0) / ((t1 - t0) * 1e6) * 100.0))
        if shares:
            out[target] = (times, shares)
    return out


def _ref(holder: WorkloadKey, gpus: list[int], node: NodeSeries, w0: float, w1: float) -> dict[str, object]:
    ref: dict[str, object] = {"id": holder.id, "kind": holder.kind.value, "name": holder.name, "gpus": gpus}
    if holder.owner:
        ref["owner"] = holder.owner
    if holder.hint:
        ref["hint"] = holder.hint
    rates = node.pod_rates.get(holder.pod, {}) if holder.pod is not None else {}
    for name in POD_RATES:
        points = rates.get(name)
        got = points.between(w0, w1) if points is not None else []
        if got:  # a series cAdvisor does not give (or not for this window) leaves the field out, not 0
            ref[name] = round(sum(got) / len(got), 1)
    return ref
