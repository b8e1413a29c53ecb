"""A simulated node whose AMD GPUs are in a compute partition mode, listed as a real one lists them.

In CPX mode a MI300X is eight devices, each a partition with its own memory and processes: eight such GPUs are 64
devices. This wraps a simulated node and lists each of its GPUs as its partitions the way collectors/amd.py does:
consecutive indices, every partition carrying the mode (``mig_profile``) and its GPU's first partition
(``physical``), the GPU's readings of the whole board (power, temperature, clocks, xGMI and PCIe bytes) on its
first partition only, memory split evenly.
"""

from __future__ import annotations

import logging

from agent.protocol import WorkloadRef
from collectors.base import Collector, Entity, Inventory, Sample

log = logging.getLogger(__name__)

# Partitions per GPU of each mode on an 8-XCD Instinct GPU (AMD Instinct docs, "GPU partitioning").
PARTITIONS = {"SPX": 1, "DPX": 2, "QPX": 4, "CPX": 8}
_BOARD = frozenset({"power_w", "temp_c", "sm_clock_mhz", "mem_util"})


class PartitionedNode:
    """``inner``'s GPUs, each listed as ``PARTITIONS[mode]`` devices."""

    def __init__(self, inner: Collector, mode: str) -> None:
        self._inner = inner
        self.mode = mode.upper()
        self.parts = PARTITIONS[self.mode]
        self.name = inner.name

    def inventory(self) -> Inventory:
        inv = self._inner.inventory()
        gpus = [
            g.model_copy(
                update={
                    "index": g.index * self.parts + p,
                    "uuid": f"{g.uuid}-{p}"[:96],
                    "memory_mib": g.memory_mib // self.parts,
                    "mig_profile": self.mode if self.parts > 1 else None,
                    "physical": g.index * self.parts if self.parts > 1 else None,
                    "power_limit_w": g.power_limit_w if p == 0 else None,
                }
            )
            for g in inv.gpus
            for p in range(self.parts)
        ]
        if inv.gpus:
            log.info(
                "simulated: %d %s in %s mode, listed as %d devices", len(inv.gpus), inv.gpus[0].model, self.mode,
                len(gpus),
            )  # fmt: skip
        inv.gpus = gpus
        return inv

    def sample(self) -> list[Sample]:
        out = []
        for s in self._inner.sample():
            if s.entity is not Entity.GPU:
                out.append(s)
                continue
            for p in range(self.parts):
                gauges = {k: v for k, v in s.gauges.items() if p == 0 or k not in _BOARD}
                if "mem_used_mib" in gauges:
                    gauges["mem_used_mib"] = round(gauges["mem_used_mib"] / self.parts, 0)
                out.append(
                    Sample(
                        Entity.GPU,
                        str(int(s.key) * self.parts + p),
                        gauges=gauges,
                        counters=dict(s.counters) if p == 0 else {},
                        latest=dict(s.latest) if p == 0 else {},
                    )
                )
        return out

    def workloads(self) -> list[WorkloadRef]:
        refs = []
        for ref in self._inner.workloads():
            gpus = [g * self.parts + p for g in ref.gpus for p in range(self.parts)]
            figures = None
            if ref.gpu_mem_mib is not None:
                figures = [None if f is None else f / self.parts for f in ref.gpu_mem_mib for _ in range(self.parts)]
            refs.append(ref.model_copy(update={"gpus": gpus, "gpu_mem_mib": figures}))
        return refs

    def close(self) -> None:
        self._inner.close()
