"""The collectors a real node runs, registered explicitly."""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from agent.config import AgentSettings
from collectors.attribution import Attributor
from collectors.base import Collector
from collectors.host import HostCollector
from collectors.nic import NicCollector
from collectors.partitioned import PARTITIONS, PartitionedNode
from collectors.pci import AMD_VENDOR_ID, NVIDIA_VENDOR_ID, VENDORS, accelerators
from collectors.storage import StorageCollector
from collectors.vendors import GpuVendors
from collectors.workload_facts import WithFacts

if TYPE_CHECKING:
    from collectors.sim.node import SimulatedNode

log = logging.getLogger(__name__)
LIBRARIES = {"NVIDIA": "NVML", "AMD": "amdsmi", "Habana": "HLML"}

_SPEC = re.compile(r"^(?P<model>[a-z0-9]+)x(?P<count>\d+)(?P<options>(?::[a-z_]+){0,2})$")


def simulated_gpus(spec: str, node: str) -> SimulatedNode | PartitionedNode:
    """``h100x8``, ``l4x4:inference`` or ``mi300x8:cpx``: N simulated GPUs of a profile running one workload of a
    pattern, AMD GPUs optionally in a compute partition mode (each GPU then listed as its partitions)."""
    # the simulator stays out of a real node's agent: its modules hold 1.5 MiB of the 40 MiB budget
    from collectors.sim.node import SimulatedNode
    from collectors.sim.profiles import PROFILES
    from collectors.sim.spec import Pattern, WorkloadSpec

    m = _SPEC.match(spec.lower())
    if not m:
        raise ValueError(
            f"--simulate {spec!r}: expected MODELxN[:PATTERN][:PARTITION], e.g. h100x8, l4x4:inference or mi300x8:cpx"
        )
    model, count = m["model"], int(m["count"])
    options = [o for o in m["options"].split(":") if o]
    modes = [o.upper() for o in options if o.upper() in PARTITIONS]
    patterns = [o for o in options if o.upper() not in PARTITIONS]
    if len(modes) > 1 or len(patterns) > 1:
        raise ValueError(f"--simulate {spec!r}: at most one pattern and one partition mode")
    pattern = patterns[0] if patterns else "training"
    if model not in PROFILES and f"{model}x" in PROFILES:  # "mi300x8" reads as mi300 x 8
        model = f"{model}x"
    if model not in PROFILES:
        raise ValueError(f"--simulate: unknown model {model!r}; choose from {', '.join(sorted(PROFILES))}")
    profile = dataclasses.replace(PROFILES[model], gpus=count)
    if not 1 <= count <= PROFILES[model].gpus:
        raise ValueError(f"--simulate: a {model} node has 1 to {PROFILES[model].gpus} GPUs")
    try:
        kind = Pattern(pattern)
    except ValueError:
        raise ValueError(f"--simulate: unknown pattern {pattern!r}; choose from {', '.join(Pattern)}") from None
    level = {Pattern.INFERENCE: 0.3, Pattern.IDLE: 0.0, Pattern.INTERACTIVE: 0.5}.get(kind, 0.9)
    workload = WorkloadSpec(
        id=f"sim/{node}",
        name=f"simulated {kind.value}",
        pattern=kind,
        gpus=tuple(range(count)),
        hint="simulated",
        level=level,
        mem_fraction=0.8,
    )
    sim = SimulatedNode(node, profile, [workload], time.time, gpu_only=True)
    if not modes:
        return sim
    if not profile.gpu_model.startswith("AMD Instinct MI3"):
        raise ValueError(f"--simulate: compute partition modes are for AMD Instinct MI300 series GPUs, not {model}")
    return PartitionedNode(sim, modes[0])


def _open_vendor(vendor: int, attributor: Attributor) -> Collector | str:
    """One vendor's collector, or why there is none (its library is absent, it found no device)."""
    # Imported here: a simulated node never loads the vendor collectors, a node loads only its vendors'.
    if vendor == NVIDIA_VENDOR_ID:
        from collectors.gpu import NullGpuCollector, open_gpu_collector

        nvidia = open_gpu_collector(attributor=attributor)
        return nvidia.reason if isinstance(nvidia, NullGpuCollector) else nvidia
    if vendor == AMD_VENDOR_ID:
        from collectors.amd import open_amd_collector

        found = open_amd_collector(attributor=attributor)
        return found or "amdsmi not installed, not started or found no GPU (log above)"
    from collectors.gaudi import open_gaudi_collector

    gaudi = open_gaudi_collector(attributor=attributor)
    return gaudi or "HLML not installed, not started or found no Gaudi (log above)"


def _answers(c: Collector) -> bool:
    """Whether a collector read devices, as opposed to waiting for a driver that is not loaded."""
    inv = c.inventory()
    return bool(inv.gpus or inv.gpu_failures) and inv.gpu_unavailable is None


def gpu_collector(settings: AgentSettings, sysfs_root: Path | None = None) -> Collector:
    """Every accelerator vendor on the PCI bus read through its library: NVIDIA through NVML, AMD through amdsmi,
    Intel Gaudi through HLML. A vendor whose devices are there but whose driver is not loaded yet is waited for.
    Where the bus cannot be read, each library is tried and every one that finds devices is kept. ``sysfs_root``:
    where sysfs is (default: the settings')."""
    from collectors.gpu import NullGpuCollector

    attributor = Attributor(node=settings.node)
    sysfs_root = settings.sysfs_root if sysfs_root is None else sysfs_root
    on_bus = accelerators(sysfs_root)
    if on_bus is None:
        log.info("PCI bus not readable under %s: trying every GPU library", sysfs_root)
        vendors = list(VENDORS)
    else:
        log.info(
            "accelerators on the PCI bus: %s",
            ", ".join(f"{VENDORS[v]} x{len(a)}" for v, a in sorted(on_bus.items())) or "none",
        )
        vendors = [v for v in VENDORS if v in on_bus]
        if not vendors:
            reason = "no NVIDIA, AMD or Habana accelerator on the PCI bus: NVML, amdsmi and HLML left unloaded"
            log.info("GPU collector disabled: %s", reason)
            return NullGpuCollector(reason)
    opened: list[tuple[str, Collector]] = []
    reasons: list[str] = []
    for vendor in vendors:
        found = _open_vendor(vendor, attributor)
        if isinstance(found, str):
            reasons.append(f"{VENDORS[vendor]}: {found}")
            if on_bus is not None:
                log.warning("%s devices are on the PCI bus but cannot be read: %s", VENDORS[vendor], found)
            continue
        opened.append((VENDORS[vendor], found))
    if on_bus is None:  # guessing: a library waiting for a driver on a node without that vendor's devices is noise
        kept = [(v, c) for v, c in opened if _answers(c)] or opened[:1]
        for _, c in opened:
            if all(c is not k for _, k in kept):
                c.close()
        opened = kept
    for name, c in opened:
        inv = c.inventory()
        log.info(
            "%s devices read through %s: %d%s",
            name,
            LIBRARIES[name],
            len(inv.gpus),
            f" (waiting: {inv.gpu_unavailable})" if inv.gpu_unavailable else "",
        )
    if not opened:
        log.info("GPU collector disabled: %s", "; ".join(reasons))
        return NullGpuCollector("; ".join(reasons)[:300])
    gpu = opened[0][1] if len(opened) == 1 else GpuVendors(opened)
    return WithFacts(gpu, attributor)  # the processes it attributes, described once per window


def node_collectors(
    settings: AgentSettings, simulate: str | None = None, simulate_pids: Sequence[int] = ()
) -> list[Collector]:
    """GPU (real, simulated, or a null collector saying why there is none), NICs, block devices and host.

    ``simulate_pids``: local processes to take for those on the simulated GPUs, attributed and described
    through /proc as a real node's (collectors/sim/processes.py)."""
    if simulate_pids and not simulate:
        raise ValueError("--simulate-pids: only with --simulate")
    gpu: Collector = simulated_gpus(simulate, settings.node) if simulate else gpu_collector(settings)
    if simulate_pids:
        from collectors.sim.processes import ProcessBackedGpus

        attributor = Attributor(node=settings.node)
        gpu = WithFacts(ProcessBackedGpus(gpu, simulate_pids, attributor), attributor)
    return [
        gpu,
        NicCollector(settings.sysfs_root, fabric_patterns=settings.fabric_interfaces),
        StorageCollector(settings.sysfs_root, mounts=settings.mounts),
        HostCollector(sysfs_root=settings.sysfs_root),
    ]
