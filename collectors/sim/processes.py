"""Simulated GPUs run by real local processes: the GPUs' telemetry is simulated, but the processes on them are
real ones of this machine, attributed and described through /proc exactly as on a node with GPUs.

Where a vendor library lists (device, PID) pairs, this collector lists the given PIDs, PID ``i`` on GPU ``i``
modulo the GPU count; from there on the path is the real one: :class:`collectors.pids.PidResolver` checks each
PID and finds its workload (collectors/attribution.py), and :class:`collectors.workload_facts.WithFacts`, which
the agent puts around it, adds the facts of its processes. It lets attribution and the process facts be tried,
and their cost measured, on a machine without GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.protocol import WorkloadRef
from collectors.attribution import Attributor
from collectors.base import Collector, Inventory, Sample
from collectors.pids import PidResolver


class ProcessBackedGpus:
    """``inner``'s GPU telemetry, with ``pids`` as the processes on its GPUs."""

    def __init__(self, inner: Collector, pids: Sequence[int], attributor: Attributor) -> None:
        if not pids:
            raise ValueError("at least one process id is needed")
        self._inner = inner
        self._pids = list(pids)
        self._gpus = [g.index for g in inner.inventory().gpus]  # a simulated node's GPUs never change
        if not self._gpus:
            raise ValueError("no simulated GPU to run the processes on")
        self._resolver = PidResolver(attributor)
        self.name = inner.name

    def inventory(self) -> Inventory:
        inventory = self._inner.inventory()
        inventory.attribution_warning = inventory.attribution_warning or self._resolver.warning()
        return inventory

    def sample(self) -> list[Sample]:
        return self._inner.sample()

    def workloads(self) -> list[WorkloadRef]:
        by_device: dict[int, list[object]] = {g: [] for g in self._gpus}
        for i, pid in enumerate(self._pids):
            by_device[self._gpus[i % len(self._gpus)]].append(pid)
        return self._resolver.workloads(by_device.items())

    def close(self) -> None:
        self._inner.close()
