"""What dcgm-exporter, kube-state-metrics, cAdvisor and node_exporter would publish for a simulated fleet.

The series follow dcgm-exporter 4.x as its source writes them (internal/pkg/rendermetrics/render_metrics.go:
``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, the MIG labels, the host name, then the label fields
and the pod or job attributes, each group in Go's sorted key order), with the field names, types and help texts of
its etc/default-counters.csv. A GPU held by several pods or jobs is written once per holder, as its pod mapper
(internal/pkg/transformation/kubernetes.go) and HPC mapper (hpc.go) do.

Every figure comes from the node's last sample (:attr:`collectors.sim.node.SimulatedNode.latest`), the one its
agent was given, so the same fleet reads the same through MQTT and through Prometheus. docs/simulator.md says
what each field is derived from.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from collectors.base import Entity
from collectors.sim.names import FieldSet
from collectors.sim.node import Latest, SimulatedNode, activity, simulated_namespace
from collectors.sim.spec import Pattern, WorkloadSpec

# A driver of the R550 data-centre branch, as DCGM_FI_DRIVER_VERSION carries it: any version reads the same here.
DRIVER_VERSION = "550.54.15"
# PCI buses of the eight GPUs of an HGX baseboard as one server maker numbers them; an estimate, since every
# server model numbers its own.
_PCI_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
# Framebuffer the driver keeps for itself, as a share of the total: an estimate (about 550 MiB on an 80 GB card).
RESERVED_SHARE = 0.0068


@dataclass(frozen=True, slots=True)
class Holder:
    """Who a GPU is attributed to: a pod (``pod`` set) or a Slurm job (``hpc_job`` set)."""

    workload: str
    namespace: str = ""
    pod: str = ""
    container: str = ""
    pod_uid: str = ""
    hpc_job: str = ""

    def attributes(self) -> str:
        """The attributes dcgm-exporter appends, in Go's sorted order of their names."""
        if self.hpc_job:
            return f',hpc_job="{_escape(self.hpc_job)}"'
        return (
            f',container="{_escape(self.container)}",namespace="{_escape(self.namespace)}",'
            f'pod="{_escape(self.pod)}",pod_uid="{_escape(self.pod_uid)}"'
        )


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU (or MIG instance) as DCGM reads it; activities are ratios 0-1, traffic in bytes per second."""

    index: int
    uuid: str
    pci_bus_id: str
    model: str
    util: float  # %
    mem_copy_util: float  # %
    fb_used_mib: float
    fb_total_mib: int
    power_w: float
    power_limit_w: float
    sm_clock_mhz: float
    temp_c: float
    gr_engine_active: float
    sm_active: float
    tensor_active: float
    dram_active: float
    pcie_tx_bps: float
    pcie_rx_bps: float
    nvlink_tx_bps: float | None  # None: the GPU has no NVLink
    nvlink_rx_bps: float | None
    holders: tuple[Holder, ...] = ()
    mig: tuple[str, int] | None = None  # (GPU_I_PROFILE, GPU_I_ID) of a MIG instance
    clock_events: int = 0  # NVML's clocks-event reasons, a bitmask (DCGM_FI_DEV_CLOCKS_EVENT_REASONS)


@dataclass(frozen=True, slots=True)
class PodView:
    """A pod as kube-state-metrics and cAdvisor see it."""

    workload: str
    namespace: str
    pod: str
    uid: str
    container: str
    owner_kind: str  # "<none>" for a bare pod, as kube-state-metrics writes it
    owner_name: str
    deployment: str  # the Deployment owning a ReplicaSet owner; "" otherwise
    team: str
    app: str
    gpus: int
    net_bytes: tuple[float, float] | None  # received, transmitted on eth0; None in the host's network namespace
    # per block device its cgroup's I/O reached: the device as cAdvisor names it, bytes read, bytes written
    disk_bytes: tuple[tuple[str, float, float], ...] = ()


@dataclass(frozen=True, slots=True)
class NodeView:
    node: str
    dcgm: bool  # an NVIDIA node: dcgm-exporter runs on it
    gpus: tuple[GpuView, ...]
    pods: tuple[PodView, ...]
    nics: tuple[tuple[str, int, int], ...]  # device, bytes received, bytes transmitted (node_exporter)


@dataclass(frozen=True, slots=True)
class ExporterOptions:
    fields: FieldSet = "default"
    hostname_label: Literal["Hostname", "hostname"] = "Hostname"  # dcgm-exporter renamed it after 4.8.2
    hostname_from: Literal["node", "pod"] = "node"  # pod: the DaemonSet pod's name, as on Kubernetes
    node_label: str = "kubernetes_node"  # with hostname_from="pod": the label naming the node
    kubernetes: bool = True  # pod attributes on GPUs and the kube-state-metrics / cAdvisor series
    driver_version: str = DRIVER_VERSION


# ----------------------------------------------------------------------------------------- the fields


def _int(value: float) -> str:
    return str(round(value))


def _double(value: float) -> str:
    return f"{value:f}"  # dcgm-exporter formats DCGM doubles with Go's %f


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    kind: Literal["gauge", "counter"]
    help: str
    sets: frozenset[FieldSet]
    value: Callable[[GpuView], str | None]
    on_mig: bool = True  # NVML gives no utilisation for a MIG instance, so DCGM reports none


_BASIC: frozenset[FieldSet] = frozenset(("basic", "default", "all"))
_DEFAULT: frozenset[FieldSet] = frozenset(("default", "all"))
_ALL: frozenset[FieldSet] = frozenset(("all",))


def _nvlink(value: float | None) -> str | None:
    return None if value is None else _int(value)


def _fb_reserved(g: GpuView) -> float:
    return round(g.fb_total_mib * RESERVED_SHARE)


def _fb_used(g: GpuView) -> float:
    return min(g.fb_used_mib, g.fb_total_mib - _fb_reserved(g))


# In default-counters.csv's order; the help texts are its own where it lists the field, and say the same of the
# fields it leaves commented out or out.
FIELDS: tuple[Field, ...] = (
    Field("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", _BASIC, lambda g: _int(g.sm_clock_mhz)),
    Field("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", _BASIC, lambda g: _int(g.temp_c)),
    Field("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", _BASIC, lambda g: _double(g.power_w)),
    Field(
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "gauge",
        "Effective power limit that the driver enforces (in W).",
        _ALL,
        lambda g: _double(g.power_limit_w),
        on_mig=False,
    ),
    Field(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "gauge",
        "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*).",
        _ALL,
        lambda g: str(g.clock_events),
        on_mig=False,
    ),
    Field(
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "gauge",
        "Power management limit (in W).",
        _ALL,
        lambda g: _double(g.power_limit_w),
    ),
    Field("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", _BASIC, lambda g: _int(g.util), on_mig=False),
    Field(
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "Memory utilization (in %).",
        _BASIC,
        lambda g: _int(g.mem_copy_util),
        on_mig=False,
    ),
    Field("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", _BASIC, lambda g: "0"),
    Field(
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "Framebuffer memory free (in MiB).",
        _BASIC,
        lambda g: _int(g.fb_total_mib - _fb_reserved(g) - _fb_used(g)),
    ),
    Field("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", _BASIC, lambda g: _int(_fb_used(g))),
    Field(
        "DCGM_FI_DEV_FB_RESERVED",
        "gauge",
        "Framebuffer memory reserved (in MiB).",
        _BASIC,
        lambda g: _int(_fb_reserved(g)),
    ),
    Field(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
        _DEFAULT,
        lambda g: _double(g.gr_engine_active),
    ),
    Field(
        "DCGM_FI_PROF_SM_ACTIVE",
        "gauge",
        "The ratio of cycles an SM has at least 1 warp assigned.",
        _ALL,
        lambda g: _double(g.sm_active),
    ),
    Field(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        _DEFAULT,
        lambda g: _double(g.tensor_active),
    ),
    Field(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        _DEFAULT,
        lambda g: _double(g.dram_active),
    ),
    Field(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in "
        "bytes per second.",
        _DEFAULT,
        lambda g: _int(g.pcie_tx_bps),
    ),
    Field(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in "
        "bytes per second.",
        _DEFAULT,
        lambda g: _int(g.pcie_rx_bps),
    ),
    Field(
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "gauge",
        "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.",
        _ALL,
        lambda g: _nvlink(g.nvlink_tx_bps),
    ),
    Field(
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "gauge",
        "The rate of data received over NVLink, not including protocol headers, in bytes per second.",
        _ALL,
        lambda g: _nvlink(g.nvlink_rx_bps),
    ),
    # Among the default counters without profiling: both directions of every link, in MB/s (DCGM's field table,
    # dcgmlib/src/dcgm_fields.cpp: DCGM_FIELD_UNIT_BW_MBPS), though default-counters.csv declares a counter.
    Field(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
        _BASIC,
        lambda g: (
            None
            if g.nvlink_tx_bps is None or g.nvlink_rx_bps is None
            else _int((g.nvlink_tx_bps + g.nvlink_rx_bps) / 1e6)
        ),
    ),
)


def fields(field_set: FieldSet) -> tuple[Field, ...]:
    """The fields of ``field_set``: ``basic`` has no profiling (DCGM_FI_PROF_*) field, ``default`` what
    default-counters.csv enables, ``all`` adds the SM, NVLink, power-limit and clock event reason fields."""
    return tuple(f for f in FIELDS if field_set in f.sets)


# ----------------------------------------------------------------------------------------- the fleet's objects

# Kubernetes' alphabet for generated name suffixes (apimachinery's rand.String and SafeEncodeString).
_ALPHANUMS = "bcdfghjklmnpqrstvwxz2456789"
_SERVING = (Pattern.INFERENCE, Pattern.LLM_SERVING)


@functools.lru_cache(maxsize=1 << 16)  # asked for every pod at every step of a history
def _suffix(seed: str, n: int) -> str:
    digest = hashlib.sha256(seed.encode()).digest()
    return "".join(_ALPHANUMS[b % len(_ALPHANUMS)] for b in digest[:n])


def pod_view(
    spec: WorkloadSpec,
    net_bytes: tuple[float, float] | None,
    disk_bytes: tuple[tuple[str, float, float], ...] = (),
) -> PodView:
    """The pod running ``spec``: online services from a Deployment's ReplicaSet, notebooks from a StatefulSet (as
    Kubeflow runs them), an idle allocation as a bare pod (a debugging pod left running), the rest from a Job."""
    uid = spec.id.removeprefix("k8s/")
    namespace = simulated_namespace(spec.name)
    deployment = ""
    if spec.pattern in _SERVING:
        deployment = spec.name
        kind, owner = "ReplicaSet", f"{spec.name}-{_suffix(uid + ':rs', 10)}"
        pod = f"{owner}-{_suffix(uid, 5)}"
    elif spec.pattern is Pattern.INTERACTIVE:
        # names are unique in a namespace: two simulated notebooks of one name are two StatefulSets
        owner = f"{spec.name}-{_suffix(uid + ':sts', 4)}"
        kind, pod = "StatefulSet", f"{owner}-0"
    elif spec.pattern is Pattern.IDLE:
        kind, owner, pod = "<none>", "<none>", f"{spec.name}-{_suffix(uid, 5)}"
    else:
        kind, owner, pod = "Job", spec.name, f"{spec.name}-{_suffix(uid, 5)}"
    return PodView(
        workload=spec.id,
        namespace=namespace,
        pod=pod,
        uid=uid,
        container=spec.name,
        owner_kind=kind,
        owner_name=owner,
        deployment=deployment,
        team=namespace.removeprefix("team-"),
        app=spec.name,
        gpus=len(spec.gpus),
        net_bytes=net_bytes,
        disk_bytes=disk_bytes,
    )


def exporter_pod(node: str) -> str:
    """The name of the dcgm-exporter DaemonSet's pod on ``node``."""
    return f"dcgm-exporter-{_suffix(node, 5)}"


# The clocks-event reasons a planted throttle sets (collectors/sim/node.py THROTTLE_QUIRKS), as nvml.h numbers them:
# SW power cap, SW thermal slowdown, HW slowdown; and GPU idle, which a healthy GPU with no work shows.
_EVENT_BITS = (("power_capped_pct", 0x4), ("thermal_slowdown_pct", 0x20), ("hw_slowdown_pct", 0x8))
_IDLE = 0x1


def node_view(
    sim: SimulatedNode, latest: Latest | None = None, specs: Sequence[WorkloadSpec] | None = None
) -> NodeView:
    """``sim`` as the exporters read it from its last sample; pass ``latest`` and ``specs`` taken together when
    another thread may be sampling."""
    latest = latest if latest is not None else sim.latest
    specs = list(sim.specs) if specs is None else list(specs)
    p = sim.profile
    host_network = "host_network" in sim.quirks
    # The devices a pod's storage traffic reaches, each with its share, as the kernel's cgroup counts them
    # (collectors/sim/node.py puts a workload's files on the node's one disk): an md RAID 0 counts each byte on
    # md127 and again on the member it lands on, half on each.
    devices: tuple[tuple[str, float], ...]
    if "md_raid" in sim.quirks:
        devices = (("/dev/md127", 1.0), ("/dev/nvme0n1", 0.5), ("/dev/nvme1n1", 0.5))
    else:
        devices = (("/dev/sda" if "thin_host" in sim.quirks else "/dev/nvme0n1", 1.0),)
    pods: list[PodView] = []
    holders: dict[int, list[Holder]] = {}
    for w in specs:
        if w.id.startswith("slurm/"):
            holder = Holder(w.id, hpc_job=w.id.removeprefix("slurm/"))
        else:
            net = None if host_network else sim.netns_bytes.get(w.id, (0.0, 0.0))
            read, written = sim.io_bytes.get(w.id, (0.0, 0.0))
            disk = tuple((device, read * part, written * part) for device, part in devices)
            pod = pod_view(w, None if net is None else (net[1], net[0]), disk)
            pods.append(pod)
            holder = Holder(w.id, pod.namespace, pod.pod, pod.container, pod.uid)
        for g in w.gpus:
            holders.setdefault(g, []).append(holder)
    gpus: list[GpuView] = []
    nics: list[tuple[str, int, int]] = []
    if latest is not None:
        by_key = {(s.entity, s.key): s for s in latest.samples}
        for i, state in enumerate(latest.gpus):
            sample = by_key[(Entity.GPU, str(i))]
            util = min(max(state.util, 0.0), 100.0)
            sm, tensor, dram = activity(util, state)
            nvlink = state.nvlink_bps if p.nvlink_links else None
            events = _IDLE if util <= 1 else 0
            for gauge, bit in _EVENT_BITS:
                if sample.gauges.get(gauge, 0.0) > 0:
                    events |= bit
            gpus.append(
                GpuView(
                    index=i,
                    uuid=f"GPU-sim-{sim.node}-{i}",  # the agent's inventory names it so too
                    pci_bus_id=f"00000000:{_PCI_BUSES[i % len(_PCI_BUSES)]}:00.0",
                    model=p.gpu_model,
                    util=sample.gauges["util"],
                    mem_copy_util=sample.gauges["mem_util"],
                    fb_used_mib=sample.gauges["mem_used_mib"],
                    fb_total_mib=p.memory_mib,
                    power_w=sample.gauges["power_w"],
                    power_limit_w=sample.latest.get("power_limit_w", p.power_limit_w),  # a planted cap lowers it
                    sm_clock_mhz=sample.gauges["sm_clock_mhz"],
                    temp_c=sample.gauges["temp_c"],
                    gr_engine_active=util / 100,
                    sm_active=sm / 100,
                    tensor_active=tensor / 100,
                    dram_active=dram / 100,
                    pcie_tx_bps=state.pcie_bps,
                    pcie_rx_bps=state.pcie_bps,
                    nvlink_tx_bps=nvlink,
                    nvlink_rx_bps=nvlink,
                    holders=tuple(holders.get(i, ())),
                    clock_events=events,
                )
            )
        nics = [(s.key, s.counters["rx_bps"], s.counters["tx_bps"]) for s in latest.samples if s.entity is Entity.NIC]
    return NodeView(sim.node, p.gpu_model.startswith("NVIDIA"), tuple(gpus), tuple(pods), tuple(nics))


# ----------------------------------------------------------------------------------------- rendering


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def gpu_label_sets(view: NodeView, gpu: GpuView, options: ExporterOptions) -> list[str]:
    """The label sets (inside the braces) of ``gpu``'s series: one per holder, or one without attributes."""
    host = exporter_pod(view.node) if options.hostname_from == "pod" else view.node
    base = (
        f'gpu="{gpu.index}",UUID="{gpu.uuid}",pci_bus_id="{gpu.pci_bus_id}",device="nvidia{gpu.index}",'
        f'modelName="{_escape(gpu.model)}"'
    )
    if gpu.mig is not None:
        base += f',GPU_I_PROFILE="{_escape(gpu.mig[0])}",GPU_I_ID="{gpu.mig[1]}"'
    base += f',{options.hostname_label}="{_escape(host)}",DCGM_FI_DRIVER_VERSION="{_escape(options.driver_version)}"'
    tail = f',{options.node_label}="{_escape(view.node)}"' if options.hostname_from == "pod" else ""
    holders = [h for h in gpu.holders if h.hpc_job or options.kubernetes]
    if not holders:
        return [base + tail]
    return [base + h.attributes() + tail for h in holders]


@dataclass(frozen=True, slots=True)
class Family:
    """A metric family beside dcgm-exporter's: its name as written, its type, and its help."""

    name: str
    kind: Literal["gauge", "counter"]
    help: str


KUBE_FAMILIES = (
    Family("kube_pod_info", "gauge", "Information about pod."),
    Family("kube_pod_owner", "gauge", "Information about the Pod's owner."),
    Family("kube_replicaset_owner", "gauge", "Information about the ReplicaSet's owner."),
    Family("kube_pod_labels", "gauge", "Kubernetes labels converted to Prometheus labels."),
    Family(
        "kube_pod_container_resource_requests",
        "gauge",
        "The number of requested request resource by a container.",
    ),
    Family(
        "container_network_receive_bytes_total", "counter", "Cumulative count of bytes received"
    ),  # cAdvisor's help texts
    Family("container_network_transmit_bytes_total", "counter", "Cumulative count of bytes transmitted"),
    Family("container_fs_reads_bytes_total", "counter", "Cumulative count of bytes read"),
    Family("container_fs_writes_bytes_total", "counter", "Cumulative count of bytes written"),
)
NODE_FAMILIES = (
    Family("node_network_receive_bytes_total", "counter", "Network device statistic receive_bytes."),
    Family("node_network_transmit_bytes_total", "counter", "Network device statistic transmit_bytes."),
)


def kube_series(view: NodeView) -> Iterator[tuple[int, str, str]]:
    """(index in KUBE_FAMILIES, label set, value) of the node's pods."""
    for p in view.pods:
        ns, pod, uid = _escape(p.namespace), _escape(p.pod), p.uid
        yield (
            0,
            (
                f'namespace="{ns}",pod="{pod}",uid="{uid}",host_ip="",pod_ip="",node="{_escape(view.node)}",'
                f'created_by_kind="{p.owner_kind}",created_by_name="{_escape(p.owner_name)}",priority_class="",'
                f'host_network="{"true" if p.net_bytes is None else "false"}"'
            ),
            "1",
        )
        controller = "<none>" if p.owner_kind == "<none>" else "true"
        yield (
            1,
            (
                f'namespace="{ns}",pod="{pod}",uid="{uid}",owner_kind="{p.owner_kind}",'
                f'owner_name="{_escape(p.owner_name)}",owner_is_controller="{controller}"'
            ),
            "1",
        )
        if p.deployment:
            yield (
                2,
                (
                    f'namespace="{ns}",replicaset="{_escape(p.owner_name)}",owner_kind="Deployment",'
                    f'owner_name="{_escape(p.deployment)}",owner_is_controller="true"'
                ),
                "1",
            )
        yield 3, f'namespace="{ns}",pod="{pod}",uid="{uid}",label_app="{_escape(p.app)}",label_team="{p.team}"', "1"
        yield (
            4,
            (
                f'namespace="{ns}",pod="{pod}",uid="{uid}",container="{_escape(p.container)}",'
                f'node="{_escape(view.node)}",resource="nvidia_com_gpu",unit="integer"'
            ),
            str(p.gpus),
        )
        if p.net_bytes is not None:
            rx, tx = p.net_bytes
            yield 5, f'namespace="{ns}",pod="{pod}",interface="eth0"', str(int(rx))
            yield 6, f'namespace="{ns}",pod="{pod}",interface="eth0"', str(int(tx))
        for device, read, written in p.disk_bytes:  # its one container's cgroup, as cAdvisor labels it
            labels = f'namespace="{ns}",pod="{pod}",container="{_escape(p.container)}",device="{device}"'
            yield 7, labels, str(int(read))
            yield 8, labels, str(int(written))


def node_series(view: NodeView) -> Iterator[tuple[int, str, str]]:
    """(index in NODE_FAMILIES, label set, value): node_exporter's interface counters, ``instance`` the node."""
    for device, rx, tx in view.nics:
        labels = f'device="{_escape(device)}",instance="{_escape(view.node)}"'
        yield 0, labels, str(rx)
        yield 1, labels, str(tx)


def render(views: Iterable[NodeView], options: ExporterOptions) -> str:
    """The Prometheus text exposition (0.0.4) of ``views``: every family once, its series from every node."""
    views = list(views)
    chosen = fields(options.fields)
    out: list[str] = []
    for f in chosen:
        lines: list[str] = []
        for view in views:
            if not view.dcgm:
                continue
            for g in view.gpus:
                if g.mig is not None and not f.on_mig:
                    continue
                value = f.value(g)
                if value is None:
                    continue
                lines.extend(f"{f.name}{{{labels}}} {value}" for labels in gpu_label_sets(view, g, options))
        if lines:
            out += [f"# HELP {f.name} {f.help}", f"# TYPE {f.name} {f.kind}", *lines]
    groups: list[tuple[Sequence[Family], Callable[[NodeView], Iterator[tuple[int, str, str]]]]] = [
        (NODE_FAMILIES, node_series)
    ]
    if options.kubernetes:
        groups.insert(0, (KUBE_FAMILIES, kube_series))
    for families, series in groups:
        per_family: list[list[str]] = [[] for _ in families]
        for view in views:
            for i, labels, value in series(view):
                per_family[i].append(f"{families[i].name}{{{labels}}} {value}")
        for fam, lines in zip(families, per_family, strict=True):
            if lines:
                out += [f"# HELP {fam.name} {fam.help}", f"# TYPE {fam.name} {fam.kind}", *lines]
    return "\n".join(out) + "\n" if out else ""


def ground_truth(views: Iterable[tuple[NodeView, Sequence[WorkloadSpec]]]) -> Mapping[str, str]:
    """Workload id (``k8s/<pod_uid>``, ``slurm/<jobid>``) → simulated pattern, for the workloads on GPUs that
    dcgm-exporter reads (NVIDIA nodes)."""
    return {w.id: w.pattern.value for view, specs in views if view.dcgm for w in specs}
