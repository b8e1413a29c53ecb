"""How much of a physical GPU each device of a node's birth is, and how the workloads on a device share it.

The live optimizer plans in GPUs, and a device an agent lists is not always one:

* an NVIDIA MIG instance (``parent`` set) holds its compute slices out of seven: ``3g.40gb`` is 3/7 of its GPU;
  a compute instance inside a GPU instance (``1c.3g.40gb``) holds its own compute slices (1/7), since the
  instance's other compute instances hold the rest;
* an AMD compute partition (``mig_profile`` "DPX", "QPX", "CPX" on a device without a parent) is one of the
  logical GPUs the partition mode splits a physical GPU into (see ``partition_share``); agents that name each
  partition's GPU (``physical``) have their GPUs counted from it, so a mode that does not parse or a partition
  missing from the birth does not change how many GPUs a node has;
* a device listed by several workloads (time-slicing, MPS) is shared among them: by the memory each pins where
  the agent reports it (``WorkloadRef.gpu_mem_mib``), equally otherwise.

A profile that does not parse is counted (``Layout.fallbacks``) and estimated, never fatal: from the instance's
memory against its GPU's, or failing that as an equal part of its GPU among that GPU's instances.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.protocol import Birth, GpuInfo, WorkloadRef

MIG_SLICES = 7  # compute slices of a MIG-capable GPU (A100, H100, H200, B200)
SHARE_FLOOR = 0.01  # a tenant's share is never counted as less than a hundredth of its GPU
# "3g.40gb", "1g.10gb+me", "1g.12gb-me", "1g.24gb+gfx", "1g.10gb+me.all", and compute instances "1c.3g.40gb".
_PROFILE = re.compile(r"^(?:(?P<ci>[1-7])c\.)?(?P<gi>[1-7])g\.(?P<mem>\d{1,4})gb(?:[+-][a-z]+(?:\.[a-z]+)?)?$")
# AMD compute partition modes: the physical GPU's XCDs split into this many logical GPUs (AMD Instinct docs:
# "GPU partitioning", MI300X has 8 XCDs, MI300A 6). SPX is the whole GPU; CPX is one partition per XCD.
_AMD_PARTS = {"SPX": 1, "DPX": 2, "TPX": 3, "QPX": 4}
_XCDS = {"MI300A": 6}  # every other partitionable Instinct GPU (MI300X, MI325X, MI350X, MI355X) has 8
DEFAULT_XCDS = 8
_NO_PARTITION = {"N/A", "NA", "NONE", "SPX"}  # amdsmi's words for a GPU that is not partitioned, or cannot be


def mig_profile(name: str | None) -> tuple[str, float] | None:
    """A MIG profile as NVML names it → (the snapshot's ``Ng.Mgb`` form, share of its GPU); None if unreadable.

    Media-engine variants (``+me``, ``-me``, ``+gfx``) hold the same slices as the plain profile. A compute
    instance smaller than its GPU instance (``1c.3g.40gb``) holds its own compute slices only."""
    if not name:
        return None
    m = _PROFILE.match(name.strip().lower())
    if m is None:
        return None
    gi, ci = int(m["gi"]), int(m["ci"]) if m["ci"] else None
    if ci is not None and ci > gi:
        return None
    slices = ci if ci is not None else gi
    return f"{gi}g.{int(m['mem'])}gb", slices / MIG_SLICES


def partition_share(mode: str | None, model: str) -> float | None:
    """The share of its physical GPU an AMD compute partition is; None when ``mode`` is not a known mode.

    Assumes every partition of a GPU has the same number of XCDs, as AMD's modes do (CPX on MI300X: 8 logical
    GPUs of one XCD each; QPX: 4 of two; DPX: 2 of four)."""
    if not mode:
        return None
    key = mode.strip().upper()
    if key == "CPX":
        xcds = next((n for name, n in _XCDS.items() if name in model.upper()), DEFAULT_XCDS)
        return 1 / xcds
    parts = _AMD_PARTS.get(key)
    return None if parts is None else 1 / parts


@dataclass(frozen=True, slots=True)
class Device:
    """One device of a birth as a part of a physical GPU."""

    index: int
    gpu: int  # the physical GPU it is part of: its parent for a MIG instance, itself otherwise
    unit: float  # the share of that GPU it is: 1 for a whole GPU
    profile: str | None = None  # a MIG GPU instance's profile, normalised ("1g.10gb")
    physical: int | None = None  # an AMD partition: its GPU's first partition, as the agent names it


@dataclass(slots=True)
class Layout:
    """The devices of one node's birth, and the MIG and partition names it could not read."""

    devices: dict[int, Device] = field(default_factory=dict)
    fallbacks: Counter[str] = field(default_factory=Counter)  # reason -> devices estimated

    @property
    def gpus(self) -> float:
        """Physical GPUs: whole devices and MIG parents count one each; AMD partitions one per GPU the agent names
        (``physical``), else their share (from agents that do not name it)."""
        devices = self.devices.values()
        named = {d.physical for d in devices if d.physical is not None}
        return len(named) + sum(d.unit for d in devices if d.gpu == d.index and d.physical is None)

    @property
    def node_gpus(self) -> int:
        """The GPUs the node is planned as having (at least one): its physical GPUs, rounded (eight CPX partitions
        are one MI300X); for a node that lists only MIG instances, the GPUs they are parts of."""
        devices = self.devices.values()
        if any(d.gpu == d.index for d in devices):
            return max(1, round(self.gpus))
        return max(1, len({d.gpu for d in devices}))

    def effective(self, gpus: Sequence[int]) -> tuple[int, ...]:
        """A workload's devices without a MIG-mode GPU that it also holds an instance of: NVML lists a process
        on its instance and, for a privileged caller, on the parent GPU as well."""
        parents = {self.devices[i].gpu for i in gpus if i in self.devices and self.devices[i].gpu != i}
        return tuple(i for i in gpus if i not in parents)


def layout(birth: Birth) -> Layout:
    out = Layout()
    listed = {g.index: g for g in birth.gpus}
    instances: Counter[int] = Counter(g.parent for g in birth.gpus if g.parent is not None)
    members: Counter[int] = Counter(g.physical for g in birth.gpus if g.parent is None and g.physical is not None)
    for g in birth.gpus:
        if g.parent is not None:
            out.devices[g.index] = _instance(g, listed.get(g.parent), instances[g.parent], out.fallbacks)
            continue
        unit = 1.0
        partitioned = bool(g.mig_profile and g.mig_profile.strip().upper() not in _NO_PARTITION)
        share = partition_share(g.mig_profile, g.model) if partitioned else None
        if partitioned and share is None:
            out.fallbacks["partition_unknown"] += 1
        if g.physical is not None:
            # The agent names the GPU, so its partitions are counted; the mode says how large each is unless its
            # partitions outnumber what the mode allows (a GPU with fewer XCDs than the model's guess).
            siblings = members[g.physical]
            unit = share if share is not None and share * siblings <= 1 + 1e-9 else 1 / siblings
        elif share is not None:
            unit = share
        out.devices[g.index] = Device(g.index, g.index, unit, physical=g.physical)
    return out


def _instance(g: GpuInfo, parent: GpuInfo | None, siblings: int, fallbacks: Counter[str]) -> Device:
    assert g.parent is not None
    profile = g.mig_profile or (g.model.rsplit(" MIG ", 1)[1] if " MIG " in g.model else None)
    parsed = mig_profile(profile)
    if parsed is not None:
        name, share = parsed
        # a compute instance smaller than its GPU instance is a share, not the GPU instance's profile
        whole_instance = math.isclose(share, int(name[0]) / MIG_SLICES)
        return Device(g.index, g.parent, share, name if whole_instance else None)
    fallbacks["mig_profile"] += 1
    if parent is not None and parent.memory_mib > 0 and 0 < g.memory_mib <= parent.memory_mib:
        share = g.memory_mib / parent.memory_mib
    else:
        share = 1 / max(siblings, 1)
    return Device(g.index, g.parent, min(1.0, max(1 / MIG_SLICES, share)))


def tenancy(
    refs: Iterable[WorkloadRef], lay: Layout, memory: Mapping[str, Mapping[int, float | None]]
) -> dict[str, dict[int, float]]:
    """For each workload of one window: the share of each of its devices it holds (device index → 0-1).

    Tenants of one device split it by the memory each pins (``memory``: workload → device → MiB) when every one
    of them reports it and some is pinned, equally otherwise: NVML measures a shared GPU's utilisation, not a
    process's, and what a process pins is the one per-tenant figure it gives."""
    held: dict[str, dict[int, float]] = {}
    by_device: dict[int, list[tuple[str, float | None]]] = {}
    for ref in refs:
        mem = memory.get(ref.id, {})
        for i in lay.effective(ref.gpus):
            by_device.setdefault(i, []).append((ref.id, mem.get(i)))
    for i, tenants in by_device.items():
        figures = [m for _, m in tenants]
        total = sum(m for m in figures if m is not None)
        weighed = all(m is not None for m in figures) and total > 0
        parts = [(m or 0.0) / total if weighed else 1 / len(tenants) for m in figures]
        for (wid, _), part in zip(tenants, _lifted(parts), strict=True):
            held.setdefault(wid, {})[i] = part if len(tenants) > 1 else 1.0
    return held


def _lifted(parts: list[float]) -> list[float]:
    """Parts that sum to one with none below a hundredth (while there are at most a hundred): the small ones
    are lifted to it and the others give up the difference in proportion."""
    floor = min(SHARE_FLOOR, 1 / len(parts))
    low = [p < floor for p in parts]
    others = sum(p for p, lo in zip(parts, low, strict=True) if not lo)
    if not any(low) or others <= 0:
        return parts
    rest = 1 - floor * sum(low)
    return [floor if lo else p * rest / others for p, lo in zip(parts, low, strict=True)]


def pinned(gpus: Sequence[int], figures: Sequence[float | None] | None) -> dict[int, float | None]:
    """MiB a workload's processes pin on each of its devices, where the agent reports it (None: NVML could not
    say); nothing when the figures do not match its devices."""
    if not figures or len(figures) != len(gpus):
        return {}
    return dict(zip(gpus, figures, strict=True))


def parts_of(share: float) -> int | None:
    """The fewest equal parts, two to eight, of which ``share`` is a whole number (a MIG slice, an AMD partition,
    an equal split); None for any other share."""
    return next((n for n in range(2, 9) if abs(share * n - round(share * n)) < 1e-6), None)


def share_units(shares: Iterable[float], base: int = 100) -> int:
    """Capacity units per GPU that count every share exactly: ``base`` (hundredths), and the halves to eighths of
    MIG slices, AMD partitions and equal splits where the snapshot has them (at most 42 times ``base``).

    Counting a seventh in hundredths rounds it up to 15, and seven 1g slices would not fit their own GPU; the
    fewest units that suffice keep the solver's numbers small (at 4200 units a GPU a 1,000-node plan took half
    as long again)."""
    per_gpu = base
    for share in shares:
        if 0 < share < 1:
            per_gpu = math.lcm(per_gpu, parts_of(share) or base)
    return per_gpu


def units(parts: dict[int, float], lay: Layout) -> float:
    """GPUs' worth a workload holds: each device's share of its GPU times the workload's part of the device."""
    return sum(lay.devices[i].unit * p if i in lay.devices else p for i, p in parts.items())
