"""GPUs of several vendors on one node, read as one GPU collector.

Each vendor's collector numbers its devices from 0; here the second vendor's devices follow the first's (its
indices shifted by the first's highest index plus one), so every device keeps one index in the birth, the samples
and the workloads. The shift is taken again whenever a vendor re-reads its inventory.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.metrics import Family
from agent.protocol import GpuFailure, WorkloadRef
from collectors.base import Collector, Entity, Inventory, Sample


def _span(inventory: Inventory) -> int:
    indices = [g.index for g in inventory.gpus] + [f.index for f in inventory.gpu_failures]
    return max(indices) + 1 if indices else 0


class GpuVendors:
    name = "gpu"
    blocking = True

    def __init__(self, members: Sequence[tuple[str, Collector]]) -> None:
        """``members``: (vendor name, its collector), in index order."""
        self.members = list(members)
        self._offsets = [0] * len(self.members)
        self.inventory()

    @property
    def generation(self) -> int:
        return sum(getattr(c, "generation", 0) for _, c in self.members)

    @property
    def restart_required(self) -> str | None:
        for _, c in self.members:
            reason = getattr(c, "restart_required", None)
            if isinstance(reason, str) and reason:
                return reason
        return None

    def inventory(self) -> Inventory:
        merged = Inventory()
        offset = 0
        for k, (_, c) in enumerate(self.members):
            inv = c.inventory()
            self._offsets[k] = offset
            gpus = [
                g.model_copy(
                    update={
                        "index": g.index + offset,
                        "parent": None if g.parent is None else g.parent + offset,
                        "physical": None if g.physical is None else g.physical + offset,
                    }
                )
                for g in inv.gpus
            ]
            failures = [GpuFailure(index=f.index + offset, error=f.error) for f in inv.gpu_failures]
            merged = merged.merge(
                Inventory(
                    gpus=gpus,
                    gpu_unavailable=inv.gpu_unavailable,
                    driver_version=inv.driver_version,
                    cuda_version=inv.cuda_version,
                    gpu_failures=failures,
                    attribution_warning=inv.attribution_warning,
                )
            )
            offset += _span(inv)
        return merged

    def sample(self) -> list[Sample]:
        out: list[Sample] = []
        for (_, c), offset in zip(self.members, self._offsets, strict=True):
            for s in c.sample():
                if s.entity == Entity.GPU and offset:
                    s.key = str(int(s.key) + offset)
                out.append(s)
        return out

    def workloads(self) -> list[WorkloadRef]:
        out: list[WorkloadRef] = []
        for (_, c), offset in zip(self.members, self._offsets, strict=True):
            for w in c.workloads():
                out.append(w.model_copy(update={"gpus": [i + offset for i in w.gpus]}) if offset else w)
        return out

    def metrics(self) -> list[Family]:
        """Each vendor's self-metrics, labelled with its vendor, one family per name."""
        families: dict[str, Family] = {}
        for vendor, c in self.members:
            extra = getattr(c, "metrics", None)
            for f in extra() if callable(extra) else []:
                merged = families.setdefault(f.name, Family(f.name, f.kind, f.help))
                merged.samples.extend(({**labels, "vendor": vendor}, v) for labels, v in f.samples)
        return list(families.values())

    def close(self) -> None:
        for _, c in self.members:
            c.close()
