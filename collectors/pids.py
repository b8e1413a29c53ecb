"""GPU process ids as vendor libraries report them, checked and turned into workloads.

Vendor libraries report host PIDs; some report garbage (NVML's struct mismatch on 535.43–535.86). A PID is
attributed only when it is a possible PID and, where the agent sees the host's /proc, a live process there. An
agent in a container without the host PID namespace cannot look host PIDs up at all: it reports each process by
its host PID and says why in the birth.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from agent.protocol import WorkloadKind, WorkloadRef
from collectors.attribution import Attributor, Owner, OwnerReader, host_pid_namespace, unresolved_owner

DEFAULT_PID_MAX = 4_194_304  # the kernel's ceiling for pid_max on 64-bit
MAX_PROCESS_MIB = 2**24  # 16 TiB: a per-process memory figure above it is garbage (a struct read wrong)
NO_HOST_PIDS = (
    "the agent does not share the host PID namespace (run it with hostPID: true or --pid=host): "
    "GPU processes are reported by host PID, not by workload"
)


class PidResolver:
    def __init__(self, attributor: Attributor) -> None:
        self._attributor = attributor
        root = attributor.procfs_root
        try:
            self._pid_max = int((root / "sys" / "kernel" / "pid_max").read_text())
        except (OSError, ValueError):
            self._pid_max = DEFAULT_PID_MAX
        self.host_pids = host_pid_namespace(root) is not False
        self._root = str(root)
        self.invalid = 0  # PIDs dropped, over the agent's life
        self._owners = OwnerReader(root)  # who pays: a pod's namespace, a Slurm account and user

    def valid(self, pid: object) -> bool:
        ok = isinstance(pid, int) and 0 < pid <= self._pid_max
        if ok and self.host_pids:
            ok = os.path.isdir(f"{self._root}/{pid}")
        if not ok:
            self.invalid += 1
        return ok

    def owner(self, pid: int) -> Owner:
        if self.host_pids:
            return self._attributor.owner(pid)
        return unresolved_owner(pid, self._attributor.node)

    def workloads(
        self,
        pids_by_device: Iterable[tuple[int, Iterable[object]]],
        memory: Mapping[tuple[int, int], object] | None = None,
    ) -> list[WorkloadRef]:
        """Workloads from (device index, PIDs on it) pairs; PIDs that fail the checks are dropped and counted.

        ``memory``: bytes each process holds on a device ((device index, PID) → the vendor's figure, None where it
        is not available); each workload then reports what its processes hold on each of its GPUs."""
        owners: dict[str, tuple[WorkloadKind, str, str | None, set[int]]] = {}
        teams: dict[str, tuple[str | None, str | None, bool | None]] = {}
        held: dict[str, dict[int, float | None]] = {}
        for index, pids in pids_by_device:
            for pid in dict.fromkeys(pids):  # a PID listed twice on one device holds its memory once
                if not self.valid(pid):
                    continue
                assert isinstance(pid, int)
                owner = self.owner(pid)
                entry = owners.setdefault(owner.id, (owner.kind, owner.name, owner.hint, set()))
                entry[3].add(index)
                if owner.id not in teams:
                    teams[owner.id] = self._owners.of(pid, owner)
                if memory is not None:
                    mine = held.setdefault(owner.id, {})
                    mib = _mib(memory.get((index, pid)))
                    before = mine.get(index, 0.0)
                    mine[index] = None if mib is None or before is None else before + mib
        return [
            WorkloadRef(
                id=wid,
                kind=kind,
                name=name,
                gpus=sorted(gpus),
                hint=hint,
                owner=teams[wid][0],
                owner_user=teams[wid][1],
                owner_claimed=teams[wid][2],
                gpu_mem_mib=_figures(held.get(wid), sorted(gpus)),
            )
            for wid, (kind, name, hint, gpus) in sorted(owners.items())
        ]

    def warning(self) -> str | None:
        return None if self.host_pids else NO_HOST_PIDS


def _mib(used: object) -> float | None:
    """A process's memory figure in MiB; None when the vendor has none (NVML_VALUE_NOT_AVAILABLE, which the
    binding returns as None) or it cannot be true."""
    if not isinstance(used, int) or isinstance(used, bool) or used < 0 or used / 2**20 > MAX_PROCESS_MIB:
        return None
    return used / 2**20


def _figures(held: dict[int, float | None] | None, gpus: list[int]) -> list[float | None] | None:
    """One figure per GPU in ``gpus`` order; a sum past what any GPU holds is no figure."""
    figures = [None if (mib := (held or {}).get(g)) is None or mib > MAX_PROCESS_MIB else round(mib, 1) for g in gpus]
    return None if all(f is None for f in figures) else figures
