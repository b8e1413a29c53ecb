"""The fleet snapshot: what the planner needs to know, as a documented JSON format (docs/snapshot.md).

The live optimizer builds one from telemetry every solve (and writes it to its state directory);
``fleetfit plan FLEET.json`` plans from one written by hand or edited for a what-if question.
"""

from __future__ import annotations

import fnmatch
import math
from collections import Counter
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agent.protocol import Birth, Ident, NicKind, WorkloadClass
from optimizer.decide.catalog import Catalog, GpuType
from optimizer.decide.classify import classify
from optimizer.decide.costs import Demand
from optimizer.decide.features import WorkloadFeatures, workload_features
from optimizer.decide.nodefit import NodeFit, cores_needed, measure, storage_starved
from optimizer.decide.shape import measured_shape
from optimizer.ingest.dcgm import SOURCE as PROMETHEUS
from optimizer.ingest.fleet import Fleet
from optimizer.ingest.shares import MIG_SLICES, SHARE_FLOOR, layout, parts_of


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class SnapshotNode(_Strict):
    name: str = Field(min_length=1, max_length=128)
    hardware: str = Field(min_length=1, description="a catalog key (h100) or the GPU name NVML reports")
    gpus: int = Field(ge=1, le=64)
    # Measured on the node (by its agent); when present they replace the catalog's typical values.
    nvlink: bool | None = Field(default=None, description="every GPU reaches the others over NVLink")
    fabric: Literal["infiniband", "roce", "ethernet"] | None = Field(default=None, description="RDMA NICs seen")
    pci_id: str | None = Field(default=None, max_length=16, description="PCI id the catalog matches first")
    # The rest of the node (agents' births, node_exporter, or written by hand); None: not known.
    cpu_cores: int | None = Field(default=None, ge=1, le=4096, description="logical CPUs")
    memory_gib: float | None = Field(default=None, gt=0, description="host memory")
    local_nvme_tb: float | None = Field(default=None, ge=0, description="local NVMe capacity, TB")
    local_nvme_read_gbps: float | None = Field(
        default=None, ge=0, description="local NVMe sequential read, GB/s (an estimate from its PCIe links)"
    )
    network_storage: bool | None = Field(default=None, description="reads data over a network file system")


class WorkloadNeeds(_Strict):
    """What a workload needs of its node beside its GPUs, where its findings show it waiting on the rest of the node
    (training starved by its input pipeline). The planner moves it only to nodes known to meet every need given."""

    cpu_cores_per_gpu: float | None = Field(
        default=None, gt=0, le=512, description="logical CPUs per GPU its data loaders need on the target"
    )
    local_nvme: bool = Field(default=False, description="its data read from local NVMe rather than over the network")


class Throttling(_Strict):
    """What held a workload's GPUs below their clocks, each a share of its GPU time (the reasons may overlap)."""

    share: float = Field(ge=0, le=1, description="held down by any reason (at least the largest below)")
    power: float = Field(default=0.0, ge=0, le=1, description="at a power limit lowered below the board's TDP")
    thermal: float = Field(default=0.0, ge=0, le=1, description="by heat (thermal slowdown)")
    hw_slowdown: float = Field(
        default=0.0, ge=0, le=1, description="by the hardware slowdown signal: the power brake, a power supply"
    )
    power_limit_w: float | None = Field(default=None, gt=0, description="the lowered power limit it ran under, W")


class SnapshotWorkload(_Strict):
    id: str = Field(min_length=1, max_length=200)
    name: str = ""
    workload_class: WorkloadClass = Field(alias="class")
    confidence: float = Field(default=1.0, ge=0, le=1)
    nodes: list[str] = Field(min_length=1, description="one node, or several for multi-node training")
    gpus: int = Field(ge=1, description="in all, across its nodes")
    mem_mib_per_gpu: float = Field(default=0.0, ge=0)
    mean_util: float = Field(default=0.0, ge=0, le=100)
    p95_util: float | None = Field(default=None, ge=0, le=100, description="default: mean_util")
    pinned: bool = False
    evidence: list[str] = Field(default_factory=list)
    history_hours: float | None = Field(
        default=None, ge=0, description="hours of load history behind the utilisation; None: a day or more"
    )
    gpu_share: float | None = Field(default=None, gt=0, le=1, description="a share of its one GPU (time-slicing, MPS)")
    mig_profile: str | None = Field(default=None, pattern=r"^[1-7]g\.\d+gb$", description="a MIG slice: 1g.10gb")
    shape: Literal["compute", "memory"] | Annotated[float, Field(ge=0, le=1)] | None = Field(
        default=None,
        description="memory-bound share of its GPU time: compute (0), memory (1), or between; None: unknown",
    )
    owner: str | None = Field(
        default=None,
        max_length=128,
        description="who showback charges it to: a Kubernetes namespace or team label, a Slurm account; informative",
    )
    throttling: Throttling | None = Field(default=None, description="its GPUs held below their clocks; None: not seen")
    util_unavailable: str | None = Field(
        default=None,
        max_length=200,
        description="why no utilisation was read (an A100 in MIG mode): mean_util and p95_util are then unmeasured",
    )
    needs: WorkloadNeeds | None = Field(
        default=None, description="what it needs of its node beside GPUs; a move goes only where a node meets it"
    )
    node_fit: NodeFit | None = Field(
        default=None, description="what its node showed beside its GPUs: CPU, saves, cold starts, neighbours"
    )
    scales_with_load: bool = Field(
        default=False,
        description="an online service that starts replicas as its load rises: moves prefer nodes with local NVMe, "
        "whose cold starts are seconds rather than tens of seconds",
    )

    @model_validator(mode="after")
    def _one_share(self) -> SnapshotWorkload:
        if self.gpu_share is not None and self.mig_profile is not None:
            raise ValueError("give gpu_share or mig_profile, not both")
        if self.share < 1 and (self.gpus != 1 or len(self.nodes) != 1):
            raise ValueError("a share of a GPU (gpu_share, mig_profile) needs gpus 1 on one node")
        return self

    @property
    def share(self) -> float:
        """The share of its GPU(s) it holds: a MIG profile's compute slices out of seven, or ``gpu_share``."""
        if self.mig_profile is not None:
            return int(self.mig_profile[0]) / MIG_SLICES
        return 1.0 if self.gpu_share is None else self.gpu_share

    @property
    def memory_share(self) -> float | None:
        """The shape as a number: 0 compute-bound, 1 memory-bound, None unknown."""
        if isinstance(self.shape, str):
            return 0.0 if self.shape == "compute" else 1.0
        return self.shape

    @property
    def demand(self) -> Demand:
        p95 = self.p95_util if self.p95_util is not None else self.mean_util
        return Demand(
            self.workload_class, self.gpus, self.mem_mib_per_gpu, self.mean_util, p95, self.share, self.memory_share
        )


class Snapshot(_Strict):
    schema_: Literal[1] = Field(default=1, alias="schema")
    site: Ident
    nodes: list[SnapshotNode]
    workloads: list[SnapshotWorkload] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> Snapshot:
        names = {n.name for n in self.nodes}
        if len(names) != len(self.nodes):
            raise ValueError("node names must be unique")
        ids = set()
        for w in self.workloads:
            if w.id in ids:
                raise ValueError(f"workload {w.id} listed twice")
            ids.add(w.id)
            missing = set(w.nodes) - names
            if missing:
                raise ValueError(f"workload {w.id} runs on unknown node {', '.join(sorted(missing))}")
        return self

    def overcommitted(self) -> list[str]:
        """Nodes whose workloads hold more GPUs than they have (GPU sharing, or a snapshot typed wrong)."""
        used = {n.name: 0.0 for n in self.nodes}
        for w in self.workloads:
            for node in w.nodes:
                used[node] += w.gpus // len(w.nodes) * w.share
        return [n.name for n in self.nodes if used[n.name] > n.gpus + 1e-9]


@dataclass(frozen=True, slots=True)
class Resolved:
    """A snapshot workload with its hardware looked up in the catalog."""

    w: SnapshotWorkload
    hardware: GpuType | None

    @property
    def node(self) -> str:
        return self.w.nodes[0]

    @property
    def multi_node(self) -> bool:
        return len(self.w.nodes) > 1

    @property
    def mem_fraction(self) -> float:
        if self.hardware is None:
            return 0.0
        return self.w.mem_mib_per_gpu / (self.hardware.memory_gib * 1024)


def hardware_of(catalog: Catalog, name: str, pci_id: str | None = None) -> GpuType | None:
    """A catalog entry by key, by the display name plans carry ("A100 80GB SXM"), or by the name and PCI id a
    vendor tool reports."""
    try:
        return catalog.by_key(name)
    except KeyError:
        pass
    shown = next((g for g in catalog.gpu if g.name == name), None)
    return shown if shown is not None else catalog.lookup(name, pci_id)


def node_hardware(catalog: Catalog, node: SnapshotNode) -> GpuType | None:
    """The node's catalog entry with NVLink and fabric as the node measured them, where it did."""
    hw = hardware_of(catalog, node.hardware, node.pci_id)
    if hw is None:
        return None
    update: dict[str, object] = {}
    if node.nvlink is not None:
        update["nvlink"] = node.nvlink
    if node.fabric is not None:
        update["fabric"] = node.fabric
    return hw.model_copy(update=update) if update else hw


def unknown_hardware(catalog: Catalog, snapshot: Snapshot) -> list[tuple[int, str]]:
    """(index, hardware) of each node whose hardware is neither a catalog key nor a GPU the catalog matches."""
    return [(i, n.hardware) for i, n in enumerate(snapshot.nodes) if hardware_of(catalog, n.hardware, n.pci_id) is None]


def resolve(catalog: Catalog, snapshot: Snapshot) -> list[Resolved]:
    hw = {n.name: node_hardware(catalog, n) for n in snapshot.nodes}
    return [Resolved(w, hw[w.nodes[0]]) for w in snapshot.workloads]


def measured(birth: Birth) -> tuple[bool | None, Literal["infiniband", "roce", "ethernet"] | None]:
    """NVLink and fabric as a node's birth shows them; None where it says nothing."""
    physical = [g for g in birth.gpus if g.parent is None]
    nvlink: bool | None = None
    if physical and birth.agent_version != PROMETHEUS:  # dcgm-exporter's default series say nothing of links
        linked = all(g.nvlink_links > 0 for g in physical)
        # Links without an NVSwitch behind them are bridges between pairs: no NVLink across more than two GPUs.
        bridged = len(physical) > 2 and all(g.nvswitch is False for g in physical)
        nvlink = linked and not bridged
    kinds = {n.kind for n in birth.nics}
    fabric: Literal["infiniband", "roce", "ethernet"] | None = None
    if NicKind.INFINIBAND in kinds:
        fabric = "infiniband"
    elif NicKind.ROCE in kinds:
        fabric = "roce"
    elif NicKind.ETHERNET in kinds:
        fabric = "ethernet"
    return nvlink, fabric


def host_fields(birth: Birth) -> dict[str, object]:
    """The snapshot node's fields for the rest of the node, from the birth's host (an agent's reads, or
    node_exporter's series read by the Prometheus source); none where the birth has no host."""
    host = birth.host
    if host is None:
        return {}
    return {
        "cpu_cores": host.cpu_cores,
        # to the MiB (three places): any MemTotal the wire accepts (1 MiB and up) stays above 0, as the field wants
        "memory_gib": None if host.memory_mib is None else round(host.memory_mib / 1024, 3),
        "local_nvme_tb": None if host.local_nvme_bytes is None else round(host.local_nvme_bytes / 1e12, 3),
        "local_nvme_read_gbps": None if host.local_nvme_read_bps is None else round(host.local_nvme_read_bps / 1e9, 2),
        "network_storage": bool(host.network_mounts),
    }


def _quantised(share: float) -> float:
    """A share as the planner can count it exactly: a fraction of up to eight parts as it is (a partition, an
    equal split), anything else rounded down to hundredths, so tenants' shares never sum past their GPU."""
    parts = parts_of(share)
    if parts is not None:
        return round(share * parts) / parts
    return max(SHARE_FLOOR, math.floor(share * 100 + 1e-9) / 100)


def _throttling(f: WorkloadFeatures) -> Throttling | None:
    """What held its GPUs down, to three places; None where nothing did."""
    if round(f.throttled_share, 3) <= 0:
        return None
    return Throttling(
        share=round(f.throttled_share, 3),
        power=round(f.throttle_power, 3),
        thermal=round(f.throttle_thermal, 3),
        hw_slowdown=round(f.throttle_hw, 3),
        power_limit_w=f.power_limit_w,
    )


def _needs(cls: WorkloadClass, fit: NodeFit | None) -> WorkloadNeeds | None:
    """What its node-fit findings ask of a target: the cores a CPU-starved loader needs, or local NVMe for input
    starved by its storage."""
    cores, storage = cores_needed(cls, fit), storage_starved(cls, fit)
    return WorkloadNeeds(cpu_cores_per_gpu=cores, local_nvme=storage) if cores or storage else None


def from_fleet(
    fleet: Fleet,
    site: str,
    pinned: list[str],
    excluded: dict[str, str] | None = None,
    estimated: Counter[tuple[str, str]] | None = None,
) -> Snapshot:
    """The live fleet as a snapshot: every node with an inventory, every workload classified.

    A node the planner cannot trust is left out, with the reason in ``excluded`` (node -> "reason: detail").
    Devices whose share of a GPU had to be estimated (a MIG profile or a partition mode that does not parse) are
    counted in ``estimated`` ((node, reason) -> devices)."""
    excluded = {} if excluded is None else excluded
    nodes = []
    for (rec_site, name), record in sorted(fleet.nodes.items()):
        if rec_site == site and record.birth is not None and record.birth.gpus:
            devices = layout(record.birth)
            if estimated is not None:
                for reason, count in devices.fallbacks.items():
                    estimated[(name, reason)] += count
            physical = [g for g in record.birth.gpus if g.parent is None]
            if not physical:  # only MIG instances listed: count their GPUs, name the model without the slice
                slices = record.birth.gpus
                model = slices[0].model.split(" MIG ", 1)[0]
                nodes.append(
                    SnapshotNode(name=name, hardware=model, gpus=devices.node_gpus, **host_fields(record.birth))
                )
                continue
            nvlink, fabric = measured(record.birth)
            nodes.append(
                SnapshotNode(
                    name=name,
                    hardware=physical[0].model,
                    # AMD compute partitions are devices of their own: eight CPX partitions are one MI300X
                    gpus=devices.node_gpus,
                    nvlink=nvlink,
                    fabric=fabric,
                    pci_id=physical[0].pci_device_id,
                    **host_fields(record.birth),
                )
            )
    known = {n.name for n in nodes}
    owners = {
        ref.id: ref.owner
        for (rec_site, _), record in sorted(fleet.nodes.items())
        if rec_site == site and record.windows
        for ref in record.windows[-1].workloads
        if ref.owner
    }
    workloads = []
    fits = measure(fleet, site)
    for f in workload_features(fleet, site):
        if not set(f.nodes) <= known:
            continue
        result = classify(f)
        gpus, share, profile = f.allotment
        gpu_share = _quantised(share) if share < 1 and profile is None else None
        # Features are of what the workload holds (a MIG instance's own utilisation, a shared GPU's); the snapshot
        # counts whole GPUs' worth of load and, for a share, the memory that share pins.
        scale = gpu_share if gpu_share is not None else share if profile else f.held / gpus
        memory = f.held_mem_mib if share < 1 or profile else f.mem_used_mib
        workloads.append(
            SnapshotWorkload(
                id=f.id,
                name=f.name,
                workload_class=result.workload_class,
                confidence=result.confidence,
                nodes=f.nodes,
                gpus=gpus,
                mem_mib_per_gpu=round(memory, 1),
                mean_util=round(min(f.mean_util * scale, 100.0), 2),
                p95_util=round(min(max(f.p95_util, f.daily_peak_p95) * scale, 100.0), 2),
                pinned=any(fnmatch.fnmatchcase(f.id, p) for p in pinned),
                evidence=list(result.evidence),
                history_hours=round(f.history_hours, 2),
                gpu_share=gpu_share,
                mig_profile=profile,
                shape=measured_shape(f),
                owner=owners.get(f.id),
                node_fit=fits.get(f.id),
                needs=_needs(result.workload_class, fits.get(f.id)),
                throttling=_throttling(f),
                util_unavailable=f.util_unavailable,
            )
        )
    snapshot = Snapshot(site=site, nodes=nodes, workloads=workloads)
    over = set(snapshot.overcommitted())
    if not over:
        return snapshot
    # Its workloads claim more GPUs than it has: planning around it would make the whole site infeasible.
    excluded.update({n: "overcommitted: its workloads hold more GPUs than its inventory lists" for n in over})
    return Snapshot(
        site=site,
        nodes=[n for n in nodes if n.name not in over],
        workloads=[w for w in workloads if not over & set(w.nodes)],
    )
