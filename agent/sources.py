"""The collectors a real node runs, registered explicitly."""

from __future__ import annotations

import dataclasses
import re
import time

from agent.config import AgentSettings
from collectors.attribution import Attributor
from collectors.base import Collector
from collectors.gpu import open_gpu_collector
from collectors.host import HostCollector
from collectors.nic import NicCollector
from collectors.profiles import PROFILES
from collectors.simulated import Pattern, SimulatedNode, WorkloadSpec
from collectors.storage import StorageCollector
from collectors.workload_facts import WithFacts

_SPEC = re.compile(r"^(?P<model>[a-z0-9]+)x(?P<count>\d+)(?::(?P<pattern>[a-z_]+))?$")


def simulated_gpus(spec: str, node: str) -> SimulatedNode:
    """``h100x8`` or ``l4x4:inference``: N simulated GPUs of a profile running one workload of a pattern."""
    m = _SPEC.match(spec.lower())
    if not m:
        raise ValueError(f"--simulate {spec!r}: expected MODELxN[:PATTERN], e.g. h100x8 or l4x4:inference")
    model, count, pattern = m["model"], int(m["count"]), m["pattern"] or "training"
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
    return SimulatedNode(node, profile, [workload], time.time, gpu_only=True)


def node_collectors(settings: AgentSettings, simulate: str | None = None) -> list[Collector]:
    """GPU (real, simulated, or a null collector saying why there is none), NICs, block devices and host."""
    gpu: Collector
    if simulate:
        gpu = simulated_gpus(simulate, settings.node)
    else:
        attributor = Attributor(node=settings.node)
        gpu = WithFacts(open_gpu_collector(attributor=attributor), attributor)
    return [
        gpu,
        NicCollector(fabric_patterns=settings.fabric_interfaces),
        StorageCollector(mounts=settings.mounts),
        HostCollector(),
    ]
