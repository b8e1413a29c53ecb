"""The fleetfit wire protocol: MQTT topics and the payload models both the agent and the optimizer use.

Every payload is JSON, carries ``schema`` (the protocol version) and validates itself on the way in.
Nothing else in the code base declares topics or payload shapes.

Topics, under a configurable prefix (default ``fleetfit/v1``):

* ``{prefix}/{site}/{node}/birth``      inventory, retained, QoS 1
* ``{prefix}/{site}/{node}/state``      ``online`` / ``offline`` (the last will), retained, QoS 1
* ``{prefix}/{site}/{node}/telemetry``  one window, QoS 1
* ``{prefix}/{site}/recommendations``   the optimizer's current plan, retained, QoS 1
* ``{prefix}/{site}/{node}/resend``     the optimizer asks a node for windows that never reached it, QoS 1
* ``{prefix}/_optimizers/{optimizer}``  an optimizer's presence: the sites it plans and stands by for, retained
* ``{prefix}/{site}/handover``          what the site's owner posted and what people decided, retained, QoS 1
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import chain
from operator import attrgetter, itemgetter, le
from types import MethodType
from typing import Annotated, Any, Literal, NamedTuple, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    ValidationError,
    model_validator,
)
from pydantic_core import CoreSchema, core_schema

SCHEMA_VERSION = 2
# Versions a receiver accepts: schema 2 only adds optional fields, so a schema-1 agent keeps working.
ACCEPTED_SCHEMAS = (1, 2)
DEFAULT_PREFIX = "fleetfit/v1"
MAX_PAYLOAD_BYTES = 256 * 1024

# Node and site ids become topic levels and (for nodes) MQTT usernames, so they are restricted to a
# character set that needs no escaping anywhere.
Ident = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
# A namespace, account, user or unit name: printable, no control characters (names reach pages and chat).
OwnerName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]+$")]
Quantity = Annotated[float, Field(strict=True, allow_inf_nan=False)]


def _not_a_bool(value: object) -> object:
    """JSON's true is no version number, though Python's True equals 1 (a Literal alone would take it)."""
    if isinstance(value, bool):
        raise ValueError("a schema version is a number")
    return value


Version = BeforeValidator(_not_a_bool)


# Numbers are JSON numbers: strict, so that a string ("9") is refused rather than read as one.
# Bounds on values no honest agent sends (schema 2 tightens them; schema-1 agents never sent such values).
FLOAT32_MAX = 3.4028234663852886e38  # the optimizer keeps per-second series as float32
MAX_GPU_INDEX = 63  # a birth lists at most 64 devices (physical GPUs and MIG instances)
LATEST_TIMESTAMP = 9.0e9  # seconds; nanoseconds past this overflow the int64 a time-series store keeps
# Sessions and sequence numbers: an agent counts starts and windows; 2**53 is where JSON readers (JavaScript,
# float parsers) stop telling integers apart, and far beyond any count an agent reaches.
MAX_COUNTER = 2**53
# The shortest sampling interval an agent may be configured with (agent.sample_interval): a window holds at
# most its length divided by this, plus the samples at both of its ends.
MIN_SAMPLE_INTERVAL = 0.1
Count = Annotated[int, Field(strict=True, ge=0, le=MAX_COUNTER)]
# Upper bounds on the rest of the integers, each past anything an honest agent sends, so that a node cannot put
# 10**300 in front of the optimizer, its store or a chat channel:
# a window's samples: a day at the shortest interval, plus both ends (publish_interval is at most an hour)
MAX_SAMPLES = 864_002
# a GPU's memory: 2**24 MiB (16 TiB), over 50x the largest GPU's (288 GB: B300, MI355X datasheets)
MAX_GPU_MEMORY_MIB = 2**24
# NVLink (or Infinity Fabric) links of one GPU: NVML_NVLINK_MAX_LINKS is 18 (nvml.h)
MAX_LINKS = 64
# PCIe link generation and width: the Link Capabilities register holds them in 4 and 6 bits (PCIe base spec 7.5.3.6)
MAX_PCIE_GEN, MAX_PCIE_WIDTH = 15, 63
# a NIC's speed in Mb/s: ethtool's speed field is 32 bits (linux/ethtool.h); 1.6 TbE is 1,600,000
MAX_SPEED_MBPS = 2**32 - 1
# a disk's bytes: 1 EiB, 8,000x the largest SSD (122.88 TB)
MAX_DISK_BYTES = 2**60
# connections to a workload's ports, and their peers: every TCP socket holds kernel memory (an estimate: 2 KiB
# or more), so 2**32 of them would need 8 TiB
MAX_CONNECTIONS = 2**32
# NVLink-C2C bandwidth of one GPU in bytes/s: 10 TB/s, over 10x Grace Hopper's and Grace Blackwell's 900 GB/s
# (NVIDIA GH200 and GB200 datasheets)
MAX_C2C_BPS = 10e12
# compute partitions of one GPU: 8, CPX on an Instinct GPU of 8 XCDs (AMD Instinct docs, "GPU partitioning")
MAX_PARTITIONS = 8
# A node's host, as a birth may say it (HostInfo); the agent and the Prometheus source leave a figure outside unread.
MAX_CPUS = 4096  # logical CPUs online: an estimate over the largest single-system servers sold
MAX_MEMORY_MIB = 2**32  # MemTotal: 4 PiB, an estimate over any one node's memory
MAX_MOUNTS = 64  # network file systems listed, the first found: a birth stays small
MAX_MOUNT_PATH, MAX_FSTYPE = 255, 32  # characters of a mount point and of its type (fuse.mountpoint-s3)
# a GPU's power limit in W: 10 kW, over 7x the largest accelerator's (1,400 W: AMD MI355X datasheet)
MAX_POWER_LIMIT_W = 10_000
# a workload's GPUs across nodes and a plan's actions and waves: 100,000 GPUs, the largest single clusters built
MAX_FLEET_GPUS = 100_000
PERCENT_FIELDS = ("util", "mem_util", "sm_active", "tensor_active", "dram_active", "sm_occupancy")
HOST_PERCENT_FIELDS = ("cpu_util", "mem_used_pct")
# What a stats array summarises is never negative, and the optimizer keeps some of it as float32.
Measured = Annotated[float, Field(strict=True, ge=0, le=FLOAT32_MAX, allow_inf_nan=False)]
Percent = Annotated[float, Field(strict=True, ge=0, le=100, allow_inf_nan=False)]
Spread = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
# What the check of every window reads of a GPU and of the host, by C calls on the models' __dict__ (an
# attribute of a pydantic model costs twice a dict lookup: BaseModel defines __getattr__).
_fields_of = attrgetter("__dict__")
_gpu_percent = itemgetter(*PERCENT_FIELDS)
_index, _util_series = itemgetter("index"), itemgetter("util_series")
_mean, _p95, _max = itemgetter(0), itemgetter(1), itemgetter(2)  # of a Stats
_host_checked = itemgetter(*HOST_PERCENT_FIELDS)


# Control characters (C0, DEL, C1), zero-width and bidirectional overrides: names end up in terminals, chat
# messages and spreadsheets, where these hide or rewrite text. A process can give itself any name (prctl), so the
# agent strips them from what it reads, and the optimizer drops a field that still holds one.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def printable(text: str) -> str:
    """``text`` without control, zero-width and bidirectional-override characters."""
    return CONTROL.sub("", text)


def _check_percent(section: BaseModel, names: tuple[str, ...]) -> None:
    """Percentages stay within 0-100 and every summary is ordered (mean and p95 at most max); the bounds on
    each value are checked by the validator itself. Words the rejection once a window's check found one."""
    values = section.__dict__
    for name in names:
        s = values[name]
        if s is not None and (s[2] > 100.0 or s[0] > s[2] or s[1] > s[2]):
            raise ValueError(f"{name}: {list(s)} is no percentage summary an agent computes")


def _check_timestamp(name: str, value: float) -> None:
    if not 0 <= value <= LATEST_TIMESTAMP:
        raise ValueError(f"{name} {value} is not a plausible Unix time")


def values_agree(
    start: float,
    end: float,
    samples: int,
    gpu_count: int,
    indices: set[int],
    series_longest: int,
    percentages: Sequence[Sequence[float]],
) -> bool:
    """The checks a telemetry window needs across its values, beyond each value's own bounds: its times, its
    samples against its length, its GPUs' indices and series, and every percentage summary ordered (``percentages``:
    the GPUs' and the host's present ones). ``Telemetry`` words a refusal when this fails; the optimizer's window
    reader (optimizer/ingest/window.py) sends a window that fails it to ``decode``. By C calls: runs for every window.
    """
    return (
        0 <= start <= end <= LATEST_TIMESTAMP
        and samples <= (end - start) / MIN_SAMPLE_INTERVAL + 2
        and (not gpu_count or (len(indices) == gpu_count and max(indices) <= MAX_GPU_INDEX))
        and series_longest <= samples
        and all(map(le, map(_mean, percentages), map(_max, percentages)))
        and all(map(le, map(_p95, percentages), map(_max, percentages)))
    )


def gpus_listed_agree(gpus: Sequence[int], memory: Sequence[float | None] | None) -> bool:
    """A workload's GPUs: each listed once, each a device index, and at most one memory figure for each."""
    return (
        len(set(gpus)) == len(gpus)
        and all(0 <= g <= MAX_GPU_INDEX for g in gpus)
        and (memory is None or len(memory) == len(gpus))
    )


class ProtocolError(ValueError):
    """A topic or payload that does not follow the protocol; ``reason`` is a short metric label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class _Model(BaseModel):
    # Validators are built on first use: an agent never builds the plan models, which saves it memory.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


# --------------------------------------------------------------------------------------------- topics


class TopicKind(StrEnum):
    BIRTH = "birth"
    STATE = "state"
    TELEMETRY = "telemetry"
    RECOMMENDATIONS = "recommendations"
    RESEND = "resend"  # optimizer to node: windows it never received


NODE_TOPIC_KINDS = (TopicKind.BIRTH, TopicKind.STATE, TopicKind.TELEMETRY)


@dataclass(frozen=True, slots=True)
class Topic:
    """A parsed fleetfit topic; ``node`` is None for site-level topics."""

    prefix: str
    site: str
    node: str | None
    kind: TopicKind

    def __str__(self) -> str:
        if self.node is None:
            return f"{self.prefix}/{self.site}/{self.kind}"
        return f"{self.prefix}/{self.site}/{self.node}/{self.kind}"


def _check_ident(value: str, what: str) -> str:
    if not value or len(value) > 128 or not (value[0].isalnum() and value.isascii()):
        raise ProtocolError("bad_topic", f"invalid {what} {value!r}")
    if any(not (c.isalnum() or c in "._-") for c in value):
        raise ProtocolError("bad_topic", f"invalid {what} {value!r}")
    return value


def node_topic(prefix: str, site: str, node: str, kind: TopicKind) -> str:
    """The topic a node publishes ``kind`` on."""
    if kind not in NODE_TOPIC_KINDS:
        raise ValueError(f"{kind} is not a node topic")
    return str(Topic(prefix, _check_ident(site, "site"), _check_ident(node, "node"), kind))


def recommendations_topic(prefix: str, site: str) -> str:
    return str(Topic(prefix, _check_ident(site, "site"), None, TopicKind.RECOMMENDATIONS))


def resend_topic(prefix: str, site: str, node: str) -> str:
    """The topic on which the optimizer asks ``node`` for windows that never reached it (the node reads it)."""
    return str(Topic(prefix, _check_ident(site, "site"), _check_ident(node, "node"), TopicKind.RESEND))


def subscription_filters(prefix: str, shared_group: str | None = None, sites: Sequence[str] = ()) -> list[str]:
    """The topic filters the optimizer subscribes to: every site's nodes, or those of ``sites`` only; with a
    group, as an MQTT shared subscription (``$share/{group}/...``) so that several optimizer processes split one
    stream between them."""
    share = f"$share/{shared_group}/" if shared_group else ""
    levels = [_check_ident(site, "site") for site in sites] or ["+"]
    return [f"{share}{prefix}/{site}/+/{kind}" for site in levels for kind in NODE_TOPIC_KINDS]


def parse_topic(prefix: str, topic: str) -> Topic:
    """Parse ``topic`` under ``prefix``; raise ProtocolError(reason="bad_topic") otherwise."""
    head = prefix + "/"
    if not topic.startswith(head):
        raise ProtocolError("bad_topic", f"topic {topic!r} is not under {prefix!r}")
    parts = topic[len(head) :].split("/")
    if len(parts) == 2 and parts[1] == TopicKind.RECOMMENDATIONS:
        return Topic(prefix, _check_ident(parts[0], "site"), None, TopicKind.RECOMMENDATIONS)
    if len(parts) != 3:
        raise ProtocolError("bad_topic", f"topic {topic!r} has {len(parts)} levels under the prefix")
    site, node, kind = parts
    try:
        parsed_kind = TopicKind(kind)
    except ValueError:
        raise ProtocolError("bad_topic", f"unknown message kind {kind!r}") from None
    if parsed_kind not in NODE_TOPIC_KINDS:
        raise ProtocolError("bad_topic", f"{kind!r} is not a node topic")
    return Topic(prefix, _check_ident(site, "site"), _check_ident(node, "node"), parsed_kind)


# ------------------------------------------------------------------------------------------- inventory


class NicKind(StrEnum):
    INFINIBAND = "infiniband"
    ROCE = "roce"
    ETHERNET = "ethernet"
    LOOPBACK = "loopback"
    VIRTUAL = "virtual"


class NicRole(StrEnum):
    EAST_WEST = "east_west"  # the training fabric: all-reduce traffic between GPU nodes
    NORTH_SOUTH = "north_south"  # the front end: clients, storage, the internet
    OTHER = "other"


class GpuInfo(_Model):
    index: int = Field(strict=True, ge=0, le=MAX_GPU_INDEX)
    uuid: str = Field(max_length=96)
    model: str = Field(min_length=1, max_length=96)
    memory_mib: int = Field(strict=True, ge=0, le=MAX_GPU_MEMORY_MIB)
    nvlink_links: int = Field(strict=True, default=0, ge=0, le=MAX_LINKS)
    pcie_gen: int | None = Field(strict=True, default=None, ge=1, le=MAX_PCIE_GEN)
    pcie_width: int | None = Field(strict=True, default=None, ge=1, le=MAX_PCIE_WIDTH)
    mig_mode: bool = False
    parent: int | None = Field(
        strict=True, default=None, ge=0, le=MAX_GPU_INDEX, description="for a MIG instance: the index of its GPU"
    )
    mig_profile: str | None = Field(default=None, max_length=32, description='for a MIG instance, e.g. "3g.40gb"')
    # bounded as a window's power_limit_w is: the optimizer falls back on this one to divide a window's power by
    power_limit_w: Quantity | None = Field(default=None, ge=0, le=MAX_POWER_LIMIT_W)
    # Real-hardware fields (schema 2):
    pcie_source: Literal["nvml-fields", "gpm"] | None = Field(
        default=None, description="where the PCIe byte rates come from; None: this GPU reports none"
    )
    pci_device_id: str | None = Field(default=None, max_length=16, description='PCI vendor+device id, "0x233010de"')
    nvswitch: bool | None = Field(default=None, description="an NVSwitch at the far end of its NVLink links")
    util_unavailable: str | None = Field(
        default=None, max_length=120, description="why this GPU reports no utilisation (an A100 in MIG mode)"
    )
    c2c_links: int | None = Field(
        strict=True,
        default=None,
        ge=0,
        le=MAX_LINKS,
        description="NVLink-C2C links up between the GPU and its Grace CPU (GH200, GB200); 0: none; None: not known",
    )
    c2c_max_bps: Quantity | None = Field(
        default=None, ge=0, le=MAX_C2C_BPS, description="the C2C links' maximum bandwidth together, bytes/s"
    )
    memory_partition: str | None = Field(
        default=None, max_length=16, description='AMD memory partition mode: "NPS1" (one NUMA domain), "NPS4"...'
    )
    physical: int | None = Field(
        strict=True,
        default=None,
        ge=0,
        le=MAX_GPU_INDEX,
        description="for an AMD compute partition: the index of its physical GPU's first partition (shared by all)",
    )


class GpuFailure(_Model):
    """A GPU the driver lists but the agent cannot read, and why (it costs that GPU only)."""

    index: int = Field(strict=True, ge=0, le=MAX_GPU_INDEX)
    error: str = Field(max_length=120)


class NicInfo(_Model):
    name: str = Field(min_length=1, max_length=64)
    kind: NicKind
    role: NicRole
    speed_mbps: int | None = Field(strict=True, default=None, ge=0, le=MAX_SPEED_MBPS)


class DiskInfo(_Model):
    name: str = Field(min_length=1, max_length=64)
    size_bytes: int | None = Field(strict=True, default=None, ge=0, le=MAX_DISK_BYTES)
    member_of: str | None = Field(
        default=None,
        max_length=64,
        description="the md RAID or device-mapper device this disk belongs to: its I/O is counted again there",
    )


class NetworkMount(_Model):
    """A file system the node reads over the network (NFS, Lustre, GPFS, CephFS, BeeGFS, WekaFS, ...)."""

    path: str = Field(min_length=1, max_length=MAX_MOUNT_PATH)
    fstype: str = Field(min_length=1, max_length=MAX_FSTYPE)


class HostInfo(_Model):
    """What the rest of the node offers its GPUs: CPU cores for data loading, memory, local NVMe for data and
    weight caches, network storage. Read by the agent from /proc and sysfs (or from node_exporter's series);
    every field is optional: None means not read, never zero."""

    cpu_cores: int | None = Field(strict=True, default=None, ge=1, le=MAX_CPUS, description="logical CPUs online")
    memory_mib: int | None = Field(strict=True, default=None, ge=1, le=MAX_MEMORY_MIB, description="MemTotal")
    local_nvme_bytes: int | None = Field(
        strict=True, default=None, ge=0, le=MAX_DISK_BYTES, description="capacity of local NVMe namespaces"
    )
    local_nvme_read_bps: Quantity | None = Field(
        default=None,
        ge=0,
        description="sequential read bandwidth of the local NVMe in all, bytes/s: an estimate from each "
        "controller's PCIe link (sysfs current_link_speed × width), never a measurement",
    )
    network_mounts: list[NetworkMount] = Field(default_factory=list, max_length=MAX_MOUNTS)


class Birth(_Model):
    """Retained inventory a node publishes each time it (re)connects."""

    schema_: Annotated[Literal[1, 2], Version] = Field(default=2, alias="schema")
    node: Ident
    site: Ident
    session: Count = Field(description="increments on every agent start")
    agent_version: str = Field(max_length=32)
    hostname: str = Field(max_length=255)
    timestamp: Quantity
    gpus: list[GpuInfo] = Field(default_factory=list, max_length=64)
    gpu_unavailable: str | None = Field(default=None, max_length=300)
    nics: list[NicInfo] = Field(default_factory=list, max_length=64)
    disks: list[DiskInfo] = Field(default_factory=list, max_length=64)
    driver_version: str | None = Field(default=None, max_length=32)
    cuda_version: str | None = Field(default=None, max_length=32)
    # Real-hardware fields (schema 2):
    gpu_failures: list[GpuFailure] = Field(default_factory=list, max_length=64)
    attribution_warning: str | None = Field(
        default=None, max_length=300, description="why GPU processes cannot be attributed to workloads here"
    )
    host: HostInfo | None = Field(default=None, description="CPU, memory and storage beside the GPUs")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, defer_build=True)

    @model_validator(mode="after")
    def _inventory(self) -> Birth:
        _check_timestamp("timestamp", self.timestamp)
        indices = [g.index for g in self.gpus]
        if len(set(indices)) != len(indices) or any(i > MAX_GPU_INDEX for i in indices):
            raise ValueError(f"gpus: indices must be unique and at most {MAX_GPU_INDEX}")
        failed = {f.index for f in self.gpu_failures}
        if failed & set(indices):
            raise ValueError("gpu_failures: a GPU listed as unreadable is also listed as read")
        # A GPU the agent cannot read leaves a gap in the indices; a birth may list only MIG instances (their
        # parent in MIG mode reports nothing of its own). Where parents are listed, an instance names one of them.
        physical = {g.index for g in self.gpus if g.parent is None} | failed
        if physical and any(g.parent is not None and g.parent not in physical for g in self.gpus):
            raise ValueError("gpus: a MIG instance names a parent GPU that is not listed")
        # An AMD compute partition names its GPU's first partition, listed or unreadable, and no GPU is split into
        # more than MAX_PARTITIONS: the optimizer counts GPUs by these names.
        named = [g.physical for g in self.gpus if g.physical is not None]
        if any(p not in physical or named.count(p) > MAX_PARTITIONS for p in set(named)):
            raise ValueError(
                f"gpus: a partition names a GPU not listed, or more than {MAX_PARTITIONS} partitions name one GPU"
            )
        return self


class NodeStatus(StrEnum):
    ONLINE = "online"
    OFFLINE = "offline"


class State(_Model):
    schema_: Annotated[Literal[1, 2], Version] = Field(default=2, alias="schema")
    node: Ident
    session: Count
    status: NodeStatus
    timestamp: Quantity

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, defer_build=True)

    @model_validator(mode="after")
    def _bounded(self) -> State:
        _check_timestamp("timestamp", self.timestamp)
        return self


# ------------------------------------------------------------------------------------------- telemetry


def _round(value: float) -> float:
    """Round for the wire: 4 significant digits keep windows small and lose nothing a classifier needs."""
    if value == 0 or not math.isfinite(value):
        return 0.0
    digits = 3 - math.floor(math.log10(abs(value)))
    return round(value, max(digits, 0)) if digits > 0 else float(round(value, digits))


class Stats(NamedTuple):
    """Summary of one signal over a window. On the wire: ``[mean, p95, max, std]``.

    A named tuple rather than a model, validated as a plain tuple of four bounded floats in pydantic-core:
    ~100 of these per window and thousands of windows a second at the optimizer.
    """

    mean: Measured
    p95: Measured
    max: Measured
    std: Spread

    @classmethod
    def __get_pydantic_core_schema__(cls, source: object, handler: GetCoreSchemaHandler) -> CoreSchema:
        return _stats_schema(handler, Measured)

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        """Summarise per-second values (at least one, all finite)."""
        if not values:
            raise ValueError("no values to summarise")
        ordered = sorted(values)
        n = len(ordered)
        if not math.isfinite(ordered[-1]) or not math.isfinite(ordered[0]):
            raise ValueError("stats of non-finite values")
        mean = math.fsum(ordered) / n
        # Plain float arithmetic: statistics.pstdev is exact but works in fractions, too slow for a 1 Hz agent.
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in ordered) / n) if n > 1 else 0.0
        rank = max(0, math.ceil(0.95 * n) - 1)
        return cls(_round(mean), _round(ordered[rank]), _round(ordered[-1]), _round(std))


def _stats_schema(handler: GetCoreSchemaHandler, value: object) -> CoreSchema:
    """A stats array whose mean, p95 and max are of type ``value``: four floats checked in pydantic-core, then
    made a Stats by C calls alone. pydantic's own NamedTuple schema calls the class, a Python-level __new__;
    tuple.__new__ bound to Stats as a method takes the tuple without the argument tuple a partial builds."""
    bounded = handler.generate_schema(value)
    items = core_schema.tuple_schema([bounded, bounded, bounded, handler.generate_schema(Spread)])
    return core_schema.no_info_after_validator_function(MethodType(tuple.__new__, Stats), items)


class _PercentStats:
    """Marks a Stats of percentages: its mean, p95 and max at most 100, checked in pydantic-core."""

    def __get_pydantic_core_schema__(self, source: object, handler: GetCoreSchemaHandler) -> CoreSchema:
        return _stats_schema(handler, Percent)


Percentages = Annotated[Stats, _PercentStats()]


def series(values: Sequence[float]) -> list[float]:
    """A per-second series as it travels: rounded like Stats."""
    return [_round(v) for v in values]


class GpuWindow(_Model):
    """One GPU over one window. Utilisation in %, memory in MiB, power in W, byte rates in bytes/s."""

    index: int = Field(strict=True, ge=0, le=MAX_GPU_INDEX)
    util: Percentages | None = None
    mem_util: Percentages | None = None
    mem_used_mib: Stats | None = None
    power_w: Stats | None = None
    temp_c: Stats | None = None
    sm_clock_mhz: Stats | None = None
    pcie_tx_bps: Stats | None = None
    pcie_rx_bps: Stats | None = None
    nvlink_tx_bps: Stats | None = None
    nvlink_rx_bps: Stats | None = None
    c2c_tx_bps: Stats | None = Field(default=None, description="GPM: NVLink-C2C payload to the Grace CPU, bytes/s")
    c2c_rx_bps: Stats | None = Field(default=None, description="GPM: NVLink-C2C payload from the Grace CPU, bytes/s")
    sm_active: Percentages | None = Field(default=None, description="GPM (Hopper and newer): SM activity, %")
    tensor_active: Percentages | None = Field(default=None, description="GPM: tensor-core activity, %")
    dram_active: Percentages | None = Field(default=None, description="GPM: DRAM bandwidth utilisation, %")
    sm_occupancy: Percentages | None = Field(
        default=None, description="GPM: warps resident on the SMs against the most they can hold, %"
    )
    util_series: list[Percent] = Field(default_factory=list, max_length=3600)
    workload: str | None = Field(default=None, max_length=200)
    xid_events: int = Field(
        strict=True, default=0, ge=0, le=MAX_COUNTER, description="XID errors reported in the window"
    )
    last_xid: int | None = Field(strict=True, default=None, ge=0, le=MAX_COUNTER)
    ecc_uncorrected: int | None = Field(
        strict=True, default=None, ge=0, le=MAX_COUNTER, description="volatile uncorrected ECC errors"
    )
    remapped_rows: int | None = Field(
        strict=True, default=None, ge=0, le=MAX_COUNTER, description="rows remapped for uncorrectable errors"
    )
    power_limit_w: Quantity | None = Field(
        default=None,
        ge=0,
        le=MAX_POWER_LIMIT_W,
        description="the power limit the GPU enforced at the window's end, W (an operator or the BMC may lower it)",
    )
    power_capped_pct: Percentages | None = Field(
        default=None, description="seconds whose clocks the power cap or the power brake held down, % of the window"
    )
    thermal_slowdown_pct: Percentages | None = Field(
        default=None, description="seconds whose clocks a thermal slowdown held down, % of the window"
    )
    hw_slowdown_pct: Percentages | None = Field(
        default=None, description="seconds with the hardware slowdown asserted (heat, power brake), % of the window"
    )
    power_violation_pct: Stats | None = Field(
        default=None, description="NVML's power violation time, % of each second (counts capping between samples)"
    )
    thermal_violation_pct: Stats | None = Field(
        default=None, description="NVML's thermal violation time, % of each second"
    )
    row_remap_pending: int | None = Field(
        strict=True, default=None, ge=0, le=1, description="1: a row remap waits for a GPU reset"
    )
    row_remap_failure: int | None = Field(
        strict=True, default=None, ge=0, le=1, description="1: a row remap failed (the GPU needs service)"
    )
    util_unavailable: int | None = Field(
        strict=True, default=None, ge=0, le=1, description="1: no utilisation could be read (the birth says why)"
    )
    lost: bool = Field(default=False, description="the GPU stopped answering (fallen off the bus)")


class NicWindow(_Model):
    name: str = Field(min_length=1, max_length=64)
    rx_bps: Stats | None = None
    tx_bps: Stats | None = None
    errors: int = Field(strict=True, default=0, ge=0, le=MAX_COUNTER)
    drops: int = Field(strict=True, default=0, ge=0, le=MAX_COUNTER)


class DiskWindow(_Model):
    name: str = Field(min_length=1, max_length=64)
    read_bps: Stats | None = None
    write_bps: Stats | None = None
    read_iops: Stats | None = None
    write_iops: Stats | None = None


class HostWindow(_Model):
    cpu_util: Percentages | None = None
    mem_used_pct: Percentages | None = None


class MountWindow(_Model):
    """Usage of a configured mount point at the end of the window."""

    path: str = Field(min_length=1, max_length=255)
    used_pct: float = Field(strict=True, ge=0, le=100)
    free_bytes: int = Field(strict=True, ge=0, le=MAX_COUNTER)


class WorkloadKind(StrEnum):
    KUBERNETES_POD = "k8s_pod"
    SLURM_JOB = "slurm_job"
    SYSTEMD_UNIT = "systemd_unit"
    CONTAINER = "container"
    PROCESS_GROUP = "process_group"


class WorkloadRef(_Model):
    """A workload the agent saw on this node's GPUs: what a capacity team would move."""

    id: str = Field(min_length=1, max_length=200)
    kind: WorkloadKind
    name: str = Field(max_length=200)
    gpus: list[Annotated[int, Field(strict=True, ge=0, le=MAX_GPU_INDEX)]] = Field(max_length=64)
    hint: str | None = Field(default=None, max_length=64, description="executable name, never a command line")
    # Schema 2: facts about the workload's processes, read once per window (collectors/workload_facts.py).
    program: str | None = Field(
        default=None,
        max_length=64,
        description="what the command line runs: the executable, or an interpreter's module or script; no arguments",
    )
    listen_ports: list[Annotated[int, Field(strict=True, ge=1, le=65535)]] = Field(
        default_factory=list, max_length=16, description="TCP ports below the ephemeral range it listens on"
    )
    inbound_connections: int | None = Field(
        strict=True, default=None, ge=0, le=MAX_CONNECTIONS, description="established connections to them"
    )
    inbound_peers: int | None = Field(
        strict=True, default=None, ge=0, le=MAX_CONNECTIONS, description="distinct remote addresses among those"
    )
    net_rx_bps: Quantity | None = Field(default=None, ge=0, description="its own network namespace, bytes/s in")
    net_tx_bps: Quantity | None = Field(default=None, ge=0, description="its own network namespace, bytes/s out")
    # Bounded like every measured figure (float32, as the optimizer keeps them): an unbounded rate such as 1e308 would
    # pass the schema and turn to infinity in the first median or product the classifier takes of it.
    disk_read_bps: Measured | None = Field(
        default=None, description="bytes/s its processes had read from storage (/proc/<pid>/io read_bytes)"
    )
    disk_write_bps: Measured | None = Field(
        default=None, description="bytes/s its processes wrote for storage (/proc/<pid>/io write_bytes)"
    )
    sched_step: str | None = Field(
        default=None, max_length=32, description='the Slurm step it runs in: "batch", "interactive", "extern", "0"…'
    )
    # Owners (schema 2): who showback charges the workload to. Optional; printable text only.
    owner: OwnerName | None = Field(
        default=None, description="Kubernetes namespace, Slurm account or systemd unit: the team that pays"
    )
    owner_user: OwnerName | None = Field(default=None, description="Slurm user who submitted the job")
    owner_claimed: bool | None = Field(
        default=None,
        description="true: `owner` comes from the workload's own environment (SLURM_JOB_ACCOUNT), which its user can "
        "set, and no source the scheduler owns confirmed it; showback keeps it apart from the team's confirmed use",
    )
    # Shared GPUs (schema 2): what its processes pin on each GPU, so tenants of one GPU share it by memory held.
    gpu_mem_mib: list[Annotated[Quantity, Field(ge=0, le=2**24)] | None] | None = Field(
        default=None,
        max_length=64,
        description="MiB its processes hold on each GPU of `gpus`, in that order (NVML usedGpuMemory); None: unknown",
    )

    @model_validator(mode="after")
    def _gpus_listed(self) -> WorkloadRef:
        if gpus_listed_agree(self.gpus, self.gpu_mem_mib):
            return self
        if len(set(self.gpus)) != len(self.gpus):
            raise ValueError("gpus: an index is listed twice")
        if any(not 0 <= g <= MAX_GPU_INDEX for g in self.gpus):
            raise ValueError(f"gpus: indices run from 0 to {MAX_GPU_INDEX}")
        raise ValueError("gpu_mem_mib: one figure per GPU of gpus")


def _check_gpus(gpus: list[GpuWindow], samples: int) -> None:
    """Word why a window's GPUs are refused, GPU by GPU in order (the window's check found something)."""
    indices = set()
    for g in gpus:
        _check_percent(g, PERCENT_FIELDS)
        # a sample can fail (a driver hiccup), so a series may be shorter than the window, never longer
        if len(g.util_series) > samples:
            raise ValueError(f"gpus.{g.index}.util_series: more values than samples")
        indices.add(g.index)
    if len(indices) != len(gpus) or max(indices) > MAX_GPU_INDEX:
        raise ValueError(f"gpus: indices must be unique and at most {MAX_GPU_INDEX}")


class Telemetry(_Model):
    """One window of a node's telemetry."""

    schema_: Annotated[Literal[1, 2], Version] = Field(default=2, alias="schema")
    node: Ident
    site: Ident
    session: Count
    seq: Count = Field(description="increments per window within a session")
    start: Quantity
    end: Quantity
    samples: int = Field(strict=True, ge=0, le=MAX_SAMPLES, description="1 Hz samples that went into the window")
    gpus: list[GpuWindow] = Field(default_factory=list, max_length=64)
    gpu_unavailable: str | None = Field(default=None, max_length=300)
    nics: list[NicWindow] = Field(default_factory=list, max_length=64)
    disks: list[DiskWindow] = Field(default_factory=list, max_length=64)
    host: HostWindow = Field(default_factory=HostWindow)
    mounts: list[MountWindow] = Field(default_factory=list, max_length=32)
    workloads: list[WorkloadRef] = Field(default_factory=list, max_length=64)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, defer_build=True)

    @model_validator(mode="after")
    def _bounded(self) -> Telemetry:
        # pydantic-core checks the bounds of each value; what needs more than one value is checked by
        # values_agree, and only a window that fails it is looked at again, check by check, for the words.
        start, end, samples, gpus = self.start, self.end, self.samples, self.gpus
        sections = list(map(_fields_of, gpus))
        percentages = list(
            filter(None, chain(chain.from_iterable(map(_gpu_percent, sections)), _host_checked(self.host.__dict__)))
        )
        indices = set(map(_index, sections))
        longest = max(map(len, map(_util_series, sections)), default=0)
        if values_agree(start, end, samples, len(gpus), indices, longest, percentages):
            return self
        if end < start:
            raise ValueError("window end precedes its start")
        _check_timestamp("start", start)
        _check_timestamp("end", end)
        if samples > (end - start) / MIN_SAMPLE_INTERVAL + 2:
            # what the optimizer keeps of a window grows with its samples: they are bounded by its length
            raise ValueError(f"samples: {samples} in a window of {end - start:g} s")
        if gpus:
            _check_gpus(gpus, samples)
        _check_percent(self.host, HOST_PERCENT_FIELDS)
        raise ValueError("values that do not agree")  # values_agree refused what no check above words


# ------------------------------------------------------------------------------------- recommendations


class WorkloadClass(StrEnum):
    TRAINING = "training"
    INFERENCE = "inference"
    BATCH_INFERENCE = "batch_inference"
    INTERACTIVE = "interactive"
    IDLE = "idle"
    UNKNOWN = "unknown"


class WorkloadView(_Model):
    """How the optimizer sees one workload."""

    id: str = Field(max_length=200)
    name: str = Field(max_length=200)
    workload_class: WorkloadClass
    confidence: float = Field(ge=0, le=1)
    nodes: list[str]
    hardware: str
    gpus: int = Field(ge=0, le=MAX_FLEET_GPUS)
    mean_util: float = Field(ge=0)
    evidence: list[str] = Field(default_factory=list)


class FindingKind(StrEnum):
    SERVING_ON_TRAINING_HARDWARE = "serving_on_training_hardware"
    TRAINING_WITHOUT_NVLINK = "training_without_nvlink"
    MULTI_NODE_WITHOUT_RDMA = "multi_node_training_without_rdma"
    OVERSIZED_GPU_MEMORY = "oversized_gpu_memory"
    IDLE_ALLOCATION = "idle_allocation"
    UNCATALOGUED_HARDWARE = "uncatalogued_hardware"
    PROJECTION_MISSED = "projection_missed"  # an applied move whose observed load is far from its projection
    # The rest of the node: GPUs paid for while they wait on CPU, storage or a neighbour.
    INPUT_STARVED_TRAINING = "input_starved_training"
    CHECKPOINT_STALL = "checkpoint_stall"
    SLOW_COLD_START = "slow_cold_start"
    MIXED_NODE = "mixed_node"
    # A GPU slowed by power or thermal limits, not by its model.
    THROTTLED_GPU = "throttled_gpu"


class Finding(_Model):
    """A misplacement, whether or not a move was planned for it."""

    workload: str = Field(max_length=200)
    workload_name: str = Field(max_length=200)
    kind: FindingKind
    hardware: str
    nodes: list[str]
    wasted_usd_per_hour: float = Field(ge=0)
    confidence: float = Field(ge=0, le=1)
    detail: str
    fix: str | None = Field(
        default=None,
        max_length=300,
        description="a change of configuration that fixes it where no move is needed (more data-loader workers, "
        "asynchronous checkpointing, a local model cache, a cooling or power-limit check)",
    )


class Projection(_Model):
    """What an action expects of its workload on the target hardware (schema 2): the load before, the relative
    speed the plan assumed, and the load it projects per GPU there (docs/decisions.md, "Performance model")."""

    shape: float | None = Field(default=None, ge=0, le=1, description="memory-bound share; None: unknown")
    speed: float = Field(gt=0, le=100, description="one target GPU against one current GPU, as planned")
    catalog_speed: float = Field(gt=0, le=100, description="the same from the catalog alone, before learned factors")
    gpus_before: float = Field(gt=0, le=100_000)
    gpus_after: float = Field(gt=0, le=100_000)
    before_mean_util: float = Field(ge=0, le=100)
    before_p95_util: float = Field(ge=0, le=100)
    mean_util: float = Field(ge=0, le=10_000, description="per GPU on the target (of its share, for a share)")
    p95_util: float = Field(ge=0, le=10_000)


class Recommendation(_Model):
    id: str = Field(max_length=64, description="stable across solves for the same move")
    workload: str = Field(max_length=200)
    workload_name: str = Field(max_length=200)
    workload_class: WorkloadClass
    confidence: float = Field(ge=0, le=1)
    gpus: int = Field(ge=1, le=MAX_FLEET_GPUS)
    from_node: str
    from_hardware: str
    to_node: str
    to_hardware: str
    monthly_savings_usd: float
    reason: str
    performance_impact: str = ""
    risk: Literal["low", "medium", "high"] = "medium"
    evidence: list[str] = Field(default_factory=list)
    # schema 2: the kind of action, and where it stands in an executable order (docs/protocol.md)
    kind: Literal["move", "reclaim", "right_size", "consolidate"] | None = Field(
        default=None, description="None: a move (schema 1)"
    )
    wave: int | None = Field(
        default=None, ge=1, le=MAX_FLEET_GPUS, description="actions of one wave may run in parallel"
    )
    after: list[str] = Field(default_factory=list, description="ids of the actions this one waits for")
    via_node: str | None = Field(default=None, description="staged through this node's free room first")
    via_wave: int | None = Field(default=None, ge=1, le=MAX_FLEET_GPUS, description="the wave of the staging hop")
    swap: list[str] = Field(default_factory=list, description="ids carried out together with this one")
    gpus_after: float | None = Field(default=None, ge=0, description="GPUs held afterwards (right_size, reclaim)")
    blocked_by: list[str] = Field(default_factory=list, description="dismissed actions this one waits for")
    gpu_share: float | None = Field(default=None, gt=0, le=1, description="the share of one GPU it holds")
    projection: Projection | None = Field(default=None, description="the load it expects on the target")


class Blocked(_Model):
    """A misplacement the plan does not move, and why: capacity teams plan purchases from these."""

    workload: str = Field(max_length=200)
    workload_name: str = Field(max_length=200)
    node: str
    hardware: str
    reason: str
    monthly_savings_usd: float = Field(ge=0, description="what moving it would save")


class Purchase(_Model):
    """Nodes of one hardware type worth buying: what they cost and the savings they unlock (schema 2)."""

    hardware: str = Field(max_length=200)
    gpus_per_node: int = Field(ge=1, le=MAX_GPU_INDEX + 1)  # as many as a birth may list
    nodes: int = Field(ge=1, le=MAX_FLEET_GPUS)
    monthly_cost_usd: float = Field(ge=0, description="the nodes at the catalog's amortised price")
    monthly_savings_usd: float = Field(description="what the plan with them saves beyond the plan without them")
    payback_months: float | None = Field(default=None, ge=0, description="cost x amortisation months / savings")
    workloads: list[str] = Field(default_factory=list, description="the workloads that would run on them")


class SolverReport(_Model):
    status: str
    objective: float
    best_bound: float
    gap: float = Field(ge=0)
    solve_seconds: float = Field(ge=0)
    # schema 2: the plan's monthly savings against an upper bound on any plan's (docs/protocol.md)
    savings_usd: float | None = None
    bound_savings_usd: float | None = Field(default=None, description="no plan can save more a month")
    bound_method: str | None = None


class Plan(_Model):
    """The optimizer's current plan for one site, published retained."""

    schema_: Annotated[Literal[1, 2], Version] = Field(default=2, alias="schema")
    site: Ident
    generated_at: Quantity
    solver: SolverReport
    workloads: list[WorkloadView] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    recommendations: list[Recommendation] = Field(default_factory=list)
    blocked: list[Blocked] = Field(default_factory=list)
    monthly_savings_usd: float = 0.0
    # schema 2: what buying capacity returns (None: not evaluated; empty: nothing pays)
    purchases: list[Purchase] | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, defer_build=True)


# ----------------------------------------------------------------------------------- optimizer presence

# Optimizers that share a broker say which sites they plan on ``{prefix}/_optimizers/{name}`` (retained; their
# last will says offline). The level cannot be a site (a site id starts with a letter or digit), so the topic
# never reads as a node's or a site's.
PRESENCE_LEVEL = "_optimizers"


def presence_topic(prefix: str, optimizer: str) -> str:
    """Where optimizer ``optimizer`` (its MQTT client id, which the broker binds to its account) says it is up."""
    return f"{prefix}/{PRESENCE_LEVEL}/{_check_ident(optimizer, 'optimizer')}"


def presence_filter(prefix: str) -> str:
    return f"{prefix}/{PRESENCE_LEVEL}/+"


_Parsed = TypeVar("_Parsed", bound=BaseModel)


def _bounded_model(model: type[_Parsed], payload: bytes | bytearray, limit: int) -> _Parsed:
    """``payload`` as ``model``, at most ``limit`` bytes; ProtocolError ``oversize`` or ``schema`` (its first
    error, worded) otherwise. For the optimizers' own messages (presence, handover), read whole or not at all."""
    if len(payload) > limit:
        raise ProtocolError("oversize", f"{len(payload)} bytes exceeds {limit}")
    try:
        return model.model_validate_json(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "payload"
        raise ProtocolError("schema", f"{where}: {first['msg']}"[:300]) from None


def parse_presence(prefix: str, topic: str, payload: bytes | bytearray) -> Presence:
    """The presence on ``topic``; ProtocolError when the topic or payload is bad or they name different
    optimizers (an account may write only its own topic, so the topic is what vouches for the name)."""
    head = f"{prefix}/{PRESENCE_LEVEL}/"
    if not topic.startswith(head):
        raise ProtocolError("bad_topic", f"topic {topic!r} is not a presence topic")
    name = _check_ident(topic[len(head) :], "optimizer")
    presence = _bounded_model(Presence, payload, MAX_PRESENCE_BYTES)
    if presence.optimizer != name:
        raise ProtocolError("node_mismatch", f"payload says optimizer {presence.optimizer!r}, topic says {name!r}")
    return presence


MAX_PRESENCE_BYTES = 1 << 20
MAX_PRESENCE_SITES = 10_000


class Presence(_Model):
    """An optimizer's claim on sites: it plans each site of ``sites`` while it is online, and each of ``standby``
    while no optimizer online lists that site in its ``sites``. One that lists neither plans every site no
    scoped optimizer claims. ``started`` orders one process's messages before its successor's."""

    schema_: Annotated[Literal[1], Version] = Field(default=1, alias="schema")
    optimizer: Ident
    status: NodeStatus
    started: Quantity
    sites: list[Ident] = Field(default_factory=list, max_length=MAX_PRESENCE_SITES)
    standby: list[Ident] = Field(default_factory=list, max_length=MAX_PRESENCE_SITES)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, defer_build=True)


# ---------------------------------------------------------------------------------------------- handover

# A site's owner hands the site's alert and lifecycle state to whichever optimizer plans the site next, retained on
# ``{prefix}/{site}/handover``: the moves it posted to each chat receiver, people's decisions on its moves, and how
# long each proposed move has been settling. Only optimizer accounts may write the topic (the ACL ``mint`` writes);
# a receiver still treats the record as hostile: bounded, strictly typed, no time after the record's own.
HANDOVER_LEVEL = "handover"
MAX_HANDOVER_BYTES = MAX_PAYLOAD_BYTES
# Per list. A site's open moves number in the tens (a plan proposes what a capacity team can act on); what is
# beyond this is the oldest, which an owner leaves out before it publishes. At every name and time's longest, three
# full lists encode to 214 kB, within MAX_PAYLOAD_BYTES (the packets an optimizer takes in; tests/test_handover.py).
MAX_HANDOVER_ENTRIES = 300
Stamp = Annotated[float, Field(strict=True, ge=0, le=LATEST_TIMESTAMP, allow_inf_nan=False)]
RecId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")]
ReceiverName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")]
Fingerprint = Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]


def handover_topic(prefix: str, site: str) -> str:
    """Where the owner of ``site`` hands its alert and lifecycle state on (retained)."""
    return f"{prefix}/{_check_ident(site, 'site')}/{HANDOVER_LEVEL}"


def handover_filters(prefix: str, sites: Sequence[str] = ()) -> list[str]:
    """The handover topics of ``sites`` (every site's when empty)."""
    return [handover_topic(prefix, site) for site in sites] or [f"{prefix}/+/{HANDOVER_LEVEL}"]


def handover_site(prefix: str, topic: str) -> str | None:
    """The site whose handover ``topic`` is, or None when it is not a handover topic (the site is not checked)."""
    head, tail = prefix + "/", "/" + HANDOVER_LEVEL
    if not (topic.startswith(head) and topic.endswith(tail)):
        return None
    site = topic[len(head) : -len(tail)]
    return site if site and "/" not in site else None


def move_fingerprint(rec: Recommendation) -> str:
    """What names a move in a chat message (its kind, the workload, where it runs, the hardware it goes to): the
    new owner of a site trusts a handed-over post only for a move that it plans under the same id and names alike."""
    said = "|".join((rec.kind or "move", rec.workload, rec.workload_name, rec.from_node, rec.from_hardware))
    return hashlib.sha256(f"{said}|{rec.to_hardware}".encode()).hexdigest()[:16]


class HandedState(_Model):
    """A person's decision on a move (``new`` again: reopened): when, and on which optimizer (the lifecycle knows
    no person: the API's token and the CLI's state directory are the optimizer's)."""

    id: RecId
    state: Literal["new", "acknowledged", "dismissed"]
    changed: Stamp
    by: Ident | None = None


class HandedPost(_Model):
    """A move posted to one chat receiver: when first and last (a reminder), and when its resolution was."""

    id: RecId
    receiver: ReceiverName
    fingerprint: Fingerprint
    first_sent: Stamp
    last_sent: Stamp
    resolved_sent: Stamp | None = None

    @model_validator(mode="after")
    def _ordered(self) -> HandedPost:
        if self.first_sent > self.last_sent:
            raise ValueError("first_sent is after last_sent")
        return self


class HandedSettling(_Model):
    """How long a proposed move has been proposed without a break (alerts post a move once it has settled)."""

    id: RecId
    first_proposed: Stamp
    last_plan: Stamp
    plans: Annotated[int, Field(strict=True, ge=1, le=MAX_COUNTER)]


class Handover(_Model):
    """One site's alert and lifecycle state, as its owner ``optimizer`` held it at ``written_at``."""

    schema_: Annotated[Literal[1], Version] = Field(default=1, alias="schema")
    site: Ident
    optimizer: Ident
    written_at: Stamp
    states: list[HandedState] = Field(default_factory=list, max_length=MAX_HANDOVER_ENTRIES)
    posted: list[HandedPost] = Field(default_factory=list, max_length=MAX_HANDOVER_ENTRIES)
    settling: list[HandedSettling] = Field(default_factory=list, max_length=MAX_HANDOVER_ENTRIES)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, defer_build=True)

    @model_validator(mode="after")
    def _consistent(self) -> Handover:
        latest = max(
            [s.changed for s in self.states]
            + [max(p.last_sent, p.resolved_sent or 0.0) for p in self.posted]
            + [max(s.first_proposed, s.last_plan) for s in self.settling],
            default=0.0,
        )
        if latest > self.written_at:  # a time after the record's own would win every comparison forever
            raise ValueError(f"an entry is dated {latest}, after the record's written_at {self.written_at}")
        states, settling = [s.id for s in self.states], [s.id for s in self.settling]
        posted = [(p.id, p.receiver) for p in self.posted]
        if len(set(states)) != len(states) or len(set(posted)) != len(posted) or len(set(settling)) != len(settling):
            raise ValueError("an entry appears twice")
        return self


def parse_handover(prefix: str, topic: str, payload: bytes | bytearray) -> Handover:
    """The handover record on ``topic``; ProtocolError when the topic or payload is bad or they name different
    sites."""
    site = handover_site(prefix, topic)
    if site is None:
        raise ProtocolError("bad_topic", f"topic {topic!r} is not a handover topic")
    _check_ident(site, "site")
    record = _bounded_model(Handover, payload, MAX_HANDOVER_BYTES)
    if record.site != site:
        raise ProtocolError("site_mismatch", f"payload says site {record.site!r}, topic says {site!r}")
    return record


# ------------------------------------------------------------------------------------------------ resend

MAX_RESEND_RANGES = 64


class Resend(_Model):
    """The optimizer's request for windows it never received (a gap in a node's sequence numbers: the broker
    dropped them from a full queue, or they were lost on the way). The node publishes again what it still has of
    each (session, first seq, last seq) range."""

    schema_: Annotated[Literal[2], Version] = Field(default=2, alias="schema")
    node: Ident
    windows: list[tuple[Count, Count, Count]] = Field(default_factory=list, max_length=MAX_RESEND_RANGES)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, defer_build=True)

    @model_validator(mode="after")
    def _ranges(self) -> Resend:
        if any(first > last or last - first > 100_000 for _, first, last in self.windows):
            raise ValueError("windows: each range runs from its first to its last seq, at most 100,000 long")
        return self


# ------------------------------------------------------------------------------------------- encoding

Message = Birth | State | Telemetry | Plan

_MODELS: dict[TopicKind, type[Birth] | type[State] | type[Telemetry] | type[Plan]] = {
    TopicKind.BIRTH: Birth,
    TopicKind.STATE: State,
    TopicKind.TELEMETRY: Telemetry,
    TopicKind.RECOMMENDATIONS: Plan,
}


def encode(message: Message | Resend | Handover) -> bytes:
    """Serialise a message for the wire (compact JSON, schema field included)."""
    return message.model_dump_json(by_alias=True, exclude_none=True).encode()


# Text fields of a window that can be left out when they are bad (a control character, too long, not the
# pattern), so that one tenant's process name does not cost the node's whole window. How each is left out:
# "field" deletes it, "item" drops the list entry that holds it (a NIC, disk, mount or workload is nothing without
# its name or id), "blank" empties it. "*" stands for a list index.
_DROPPABLE: dict[tuple[str, ...], str] = {
    ("gpu_unavailable",): "field",
    ("gpus", "*", "workload"): "field",
    ("nics", "*", "name"): "item",
    ("disks", "*", "name"): "item",
    ("mounts", "*", "path"): "item",
    ("workloads", "*", "id"): "item",
    ("workloads", "*", "name"): "blank",
    ("workloads", "*", "hint"): "field",
    ("workloads", "*", "program"): "field",
    ("workloads", "*", "sched_step"): "field",
    ("workloads", "*", "owner"): "field",
    ("workloads", "*", "owner_user"): "field",
}
DroppedField = tuple[str, str]  # (field, e.g. "workloads.hint"; reason: "control_character" or "schema")


def _droppable(loc: tuple[int | str, ...]) -> tuple[tuple[int | str, ...], str] | None:
    """The droppable field ``loc`` points into (its own location and how it goes), or None."""
    for pattern, how in _DROPPABLE.items():
        n = len(pattern)
        if len(loc) >= n and all(
            (p == "*" and isinstance(v, int)) or p == v for p, v in zip(pattern, loc, strict=False)
        ):
            return loc[:n], how
    return None


def _field_name(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc if not isinstance(p, int))


def _apply_drops(raw: dict[str, Any], drops: list[tuple[tuple[int | str, ...], str]]) -> None:
    """Leave out each field in ``drops``; list entries last to first, so the indices stay right."""
    items: dict[tuple[int | str, ...], set[int]] = {}
    for loc, how in drops:
        parent: Any = raw
        for part in loc[:-1]:
            parent = parent[part]
        if how == "item":
            items.setdefault(loc[:-2], set()).add(int(loc[-2]))
        elif how == "blank":
            parent[loc[-1]] = ""
        else:
            parent.pop(loc[-1], None)
    for where, indices in items.items():
        container: Any = raw
        for part in where:
            container = container[part]
        for index in sorted(indices, reverse=True):
            del container[index]


def _control_drops(raw: dict[str, Any]) -> list[tuple[tuple[int | str, ...], str]]:
    """The droppable text fields of a raw window that hold a control character."""
    found: list[tuple[tuple[int | str, ...], str]] = []

    def walk(value: Any, pattern: tuple[str, ...], loc: tuple[int | str, ...], how: str) -> None:
        if not pattern:
            if isinstance(value, str) and CONTROL.search(value):
                found.append((loc, how))
            return
        head, rest = pattern[0], pattern[1:]
        if head == "*":
            if isinstance(value, list):
                for i, item in enumerate(value):
                    walk(item, rest, (*loc, i), how)
        elif isinstance(value, dict) and head in value:
            walk(value[head], rest, (*loc, head), how)

    for pattern, how in _DROPPABLE.items():
        walk(raw, pattern, (), how)
    return found


def clean_bytes(payload: bytes | bytearray) -> bool:
    """No control character can hide in ``payload``: JSON refuses raw control bytes, so only escapes (``\\u001b``
    and the short ones, ``\\n``, ``\\t``...), DEL and non-ASCII text need a look. A backslash is looked for
    alone: one byte is found by memchr, ten times faster than ``\\u``, and honest windows hold none."""
    return payload.isascii() and b"\\" not in payload and b"\x7f" not in payload


def decode(kind: TopicKind, payload: bytes | bytearray, dropped: list[DroppedField] | None = None) -> Message:
    """Validate ``payload`` as the model for ``kind``; raise ProtocolError with a reason label otherwise.

    With ``dropped`` (a list), a window's bad text fields (a control character, or not what the schema allows:
    see ``_DROPPABLE``) are left out rather than the window refused, and each is appended as (field, reason)."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ProtocolError("oversize", f"{len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    lenient = dropped is not None and kind is TopicKind.TELEMETRY
    try:
        # The fast path, JSON parsed and validated in one pass by pydantic-core; a failure is diagnosed below.
        message = _MODELS[kind].model_validate_json(payload)
        if not lenient or clean_bytes(payload):
            return message
    except ValidationError:
        pass
    try:
        raw = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError("bad_json", str(exc)) from None
    except RecursionError:  # arrays or objects nested past the interpreter's limit: a few KB can do it
        raise ProtocolError("bad_json", "nested too deeply") from None
    if not isinstance(raw, dict):
        raise ProtocolError("schema", "payload is not a JSON object")
    version = raw.get("schema")
    if isinstance(version, bool) or version not in ACCEPTED_SCHEMAS:  # true == 1 in Python, not in JSON
        raise ProtocolError(
            "unknown_schema", f"schema version {version!r}, this build speaks {', '.join(map(str, ACCEPTED_SCHEMAS))}"
        )
    if lenient:
        assert dropped is not None
        drops = _control_drops(raw)
        _apply_drops(raw, drops)
        dropped.extend((_field_name(loc), "control_character") for loc, _ in drops)
    for attempt in range(3):
        try:
            return _MODELS[kind].model_validate(raw)
        except ValidationError as exc:
            errors = exc.errors()
            if lenient and attempt < 2:
                assert dropped is not None
                fixes = [_droppable(tuple(e["loc"])) for e in errors]
                if all(f is not None for f in fixes):
                    unique = list(dict.fromkeys(f for f in fixes if f is not None))
                    _apply_drops(raw, unique)
                    dropped.extend((_field_name(loc), "schema") for loc, _ in unique)
                    continue
            first = errors[0]
            where = ".".join(str(p) for p in first["loc"]) or "payload"
            raise ProtocolError("schema", f"{where}: {first['msg']} ({exc.error_count()} error(s))") from None
    raise AssertionError("unreachable")  # the loop returns or raises
