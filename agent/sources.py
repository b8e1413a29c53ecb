"""The collectors a real node runs, registered explicitly."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Sequence

from agent.config import AgentSettings
from collectors.attribution import Attributor
from collectors.base import Collector
from collectors.host import HostCollector
from collectors.nic import NicCollector
from collectors.partitioned import PARTITIONS, PartitionedNode
from collectors.sim.node import SimulatedNode
from collectors.sim.processes import ProcessBackedGpus
from collectors.sim.profiles import PROFILES
from collectors.sim.spec import Pattern, WorkloadSpec
from collectors.storage import StorageCollector
from collectors.workload_facts import WithFacts

_SPEC = re.compile(r"^(?P<model>[a-z0-9]+)x(?P<count>\d+)(?P<options>(?::[a-z_]+){0,2})$")


def simulated_gpus(spec: str, node: str) -> SimulatedNode | PartitionedNode:
    """``h100x8``, ``l4x4:inference`` or ``mi300x8:cpx``: N simulated GPUs of a profile running one workload of a
    pattern, AMD GPUs optionally in a compute partition mode (each GPU then listed as its partitions)."""
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


def gpu_collector(settings: AgentSettings) -> Collector:
    """NVIDIA through NVML; where there is no NVIDIA driver, AMD through amdsmi, then Gaudi through HLML."""
    # Imported here: a simulated node never loads the vendor collectors, an NVIDIA node never the other vendors'.
    from collectors.gpu import NullGpuCollector, open_gpu_collector

    attributor = Attributor(node=settings.node)
    nvidia = open_gpu_collector(attributor=attributor)
    if not isinstance(nvidia, NullGpuCollector):
        return WithFacts(nvidia, attributor)  # the processes it attributes, described once per window
    from collectors.amd import open_amd_collector
    from collectors.gaudi import open_gaudi_collector

    found = open_amd_collector(attributor=attributor) or open_gaudi_collector(attributor=attributor)
    return WithFacts(found, attributor) if found is not None else nvidia


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
        attributor = Attributor(node=settings.node)
        gpu = WithFacts(ProcessBackedGpus(gpu, simulate_pids, attributor), attributor)
    return [
        gpu,
        NicCollector(fabric_patterns=settings.fabric_interfaces),
        StorageCollector(mounts=settings.mounts),
        HostCollector(),
    ]
