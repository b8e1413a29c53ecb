"""Which workload owns a GPU process: pid → cgroup → Kubernetes pod, Slurm job, systemd unit, container,
or failing those the process group. Only the executable name is read as a hint, never the command line
(command lines carry tokens and passwords)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.protocol import WorkloadKind

_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
# Static pods (kubelet manifests) carry the manifest's 32-hex hash as their UID, without dashes.
_STATIC_POD = re.compile(r"pod([0-9a-f]{32})(?:\.slice|/|$)")
_SLURM = re.compile(r"/job_(\d+)(?:/|$)")
_UNIT = re.compile(r"/([^/]+\.service)(?=/|$)")
# A user's systemd instance: its services run below it (user@1000.service/app.slice/jupyter.service).
_USER_MANAGER = re.compile(r"^user@(\d+)\.service$")
_CONTAINER = re.compile(r"(?:docker|cri-containerd|crio|libpod|nerdctl)[-/]([0-9a-f]{12,64})")
# Plain containerd (ctr) and nerdctl on cgroupfs put a container at /<containerd namespace>/<64-hex id>.
_CONTAINERD = re.compile(r"^/[A-Za-z0-9._-]+/([0-9a-f]{64})$")
# When several cgroup v1 hierarchies name different owners, the most specific wins: controllers Slurm does not
# manage stay under slurmd.service, in an order that varies per machine.
_RANK = {
    WorkloadKind.KUBERNETES_POD: 0,
    WorkloadKind.SLURM_JOB: 1,
    WorkloadKind.CONTAINER: 2,
    WorkloadKind.SYSTEMD_UNIT: 3,
}


@dataclass(frozen=True, slots=True)
class Owner:
    id: str
    kind: WorkloadKind
    name: str
    hint: str | None


def owner_from_cgroup(cgroup_path: str) -> tuple[str, WorkloadKind, str] | None:
    """Map a cgroup path to (workload id, kind, display name), or None when it names no workload."""
    if m := _POD.search(cgroup_path):
        uid = m.group(1).replace("_", "-")
        return f"k8s/{uid}", WorkloadKind.KUBERNETES_POD, f"pod {uid}"
    if m := _STATIC_POD.search(cgroup_path):
        return f"k8s/{m.group(1)}", WorkloadKind.KUBERNETES_POD, f"static pod {m.group(1)}"
    if m := _SLURM.search(cgroup_path):
        return f"slurm/{m.group(1)}", WorkloadKind.SLURM_JOB, f"slurm job {m.group(1)}"
    if m := _CONTAINER.search(cgroup_path) or _CONTAINERD.search(cgroup_path):
        cid = m.group(1)[:12]
        return f"container/{cid}", WorkloadKind.CONTAINER, f"container {cid}"
    if units := _UNIT.findall(cgroup_path):
        unit = units[-1]  # the innermost: a user's service, not the user's whole systemd instance
        manager = next((m for u in units[:-1] if (m := _USER_MANAGER.match(u))), None)
        if manager is not None:
            return f"systemd/{manager.group(0)}/{unit}", WorkloadKind.SYSTEMD_UNIT, f"{unit} (user {manager.group(1)})"
        return f"systemd/{unit}", WorkloadKind.SYSTEMD_UNIT, unit
    return None


class Attributor:
    """Resolves pids through an injectable procfs root so tests run on fixture trees."""

    def __init__(self, procfs_root: Path = Path("/proc"), node: str = "") -> None:
        self._proc = procfs_root
        self._node = node
        self._pids: dict[str, list[int]] = {}  # resolved since the last take_pids(), by workload id

    def _read(self, pid: int, name: str) -> str | None:
        try:
            return (self._proc / str(pid) / name).read_text(errors="replace")
        except OSError:
            return None

    def owner(self, pid: int) -> Owner:
        found = self._owner(pid)
        self._pids.setdefault(found.id, []).append(pid)
        return found

    def take_pids(self) -> dict[str, list[int]]:
        """The pids resolved since the last call, by workload id (for collectors/workload_facts.py)."""
        pids, self._pids = self._pids, {}
        return pids

    def _owner(self, pid: int) -> Owner:
        comm = self._read(pid, "comm")
        hint = comm.strip()[:64] if comm else None
        best: tuple[str, WorkloadKind, str] | None = None
        for line in (self._read(pid, "cgroup") or "").splitlines():
            path = line.split(":", 2)[-1]
            found = owner_from_cgroup(path)
            if found and (best is None or _RANK.get(found[1], 9) < _RANK.get(best[1], 9)):
                best = found
        if best:
            return Owner(best[0], best[1], best[2], hint)
        pgid = self._pgid(pid)
        return Owner(f"pgid/{self._node}/{pgid}", WorkloadKind.PROCESS_GROUP, f"process group {pgid}", hint)

    def _pgid(self, pid: int) -> int:
        stat = self._read(pid, "stat")
        if stat:
            # The command name in field 2 may hold spaces and parentheses: split after the last ')'.
            fields = stat.rsplit(")", 1)[-1].split()
            if len(fields) > 2 and fields[2].isdigit():
                return int(fields[2])
        try:
            return os.getpgid(pid)
        except OSError:
            return pid

    @property
    def procfs_root(self) -> Path:
        return self._proc

    @property
    def node(self) -> str:
        return self._node


def host_pid_namespace(procfs_root: Path = Path("/proc")) -> bool | None:
    """Whether this process sees the host's PIDs (NVML reports host PIDs); None when the kernel cannot say.

    ``NSpid`` in ``/proc/self/status`` lists this process's PID in each nested namespace: more than one entry
    means a container with its own PID namespace, whose /proc cannot resolve the PIDs NVML returns.
    """
    try:
        status = (procfs_root / "self" / "status").read_text(errors="replace")
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return len(line.split()) <= 2
    return None


def unresolved_owner(pid: int, node: str) -> Owner:
    """The owner of a host PID this agent cannot look up: the process itself, named by its host PID."""
    return Owner(f"pid/{node}/{pid}", WorkloadKind.PROCESS_GROUP, f"host pid {pid}", None)


# ------------------------------------------------------------------------------------------- owners

_POD_LOG_DIR = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)_[^_]+_([0-9a-f-]{36})$")
OWNER_CACHE = 4096  # pids (or pods) remembered; beyond that the cache starts afresh
POD_RESCAN_SECONDS = 30.0


class OwnerReader:
    """Who pays for a workload, read cheaply: the team a showback report charges it to, and for Slurm the user.

    * Kubernetes: the cgroup holds only the pod's uid. The kubelet keeps each pod's logs under
      ``/var/log/pods/<namespace>_<pod name>_<uid>/``, so one directory listing maps every uid on the node to
      its namespace with no API server call and no credentials. (A kubelet with another ``--pod-logs-dir``
      needs ``pods_log_root`` set; without the directory the namespace stays unset.)
    * Slurm: ``SLURM_JOB_ACCOUNT`` and ``SLURM_JOB_USER`` from the process's environment, read once per pid
      (``scontrol`` per window would be far too costly). Reading another user's ``environ`` needs root or
      CAP_SYS_PTRACE; without it the owner stays unset.
    * systemd: the unit itself.
    """

    def __init__(
        self,
        procfs_root: Path = Path("/proc"),
        pods_log_root: Path = Path("/var/log/pods"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._proc = procfs_root
        self._pods = pods_log_root
        self._clock = clock
        self._namespaces: dict[str, str] = {}
        self._scanned = float("-inf")
        self._slurm: dict[tuple[int, str], tuple[str | None, str | None]] = {}

    def of(self, pid: int, owner: Owner) -> tuple[str | None, str | None]:
        """(owner, user) of ``pid``, whose workload is ``owner``; either may be None."""
        if owner.kind is WorkloadKind.KUBERNETES_POD:
            return self._namespace(owner.id.removeprefix("k8s/")), None
        if owner.kind is WorkloadKind.SLURM_JOB:
            return self._slurm_owner(pid, owner.id)
        if owner.kind is WorkloadKind.SYSTEMD_UNIT:
            return owner.name, None
        return None, None

    def _namespace(self, uid: str) -> str | None:
        if uid not in self._namespaces and self._clock() - self._scanned >= POD_RESCAN_SECONDS:
            self._scanned = self._clock()
            found: dict[str, str] = {}
            try:
                with os.scandir(self._pods) as entries:
                    for entry in entries:
                        if m := _POD_LOG_DIR.match(entry.name):
                            found[m.group(3)] = m.group(1)
            except OSError:
                pass
            self._namespaces = found  # pods gone from the node drop out here
        return self._namespaces.get(uid)

    def _slurm_owner(self, pid: int, job: str) -> tuple[str | None, str | None]:
        key = (pid, job)
        if key not in self._slurm:
            if len(self._slurm) >= OWNER_CACHE:
                self._slurm.clear()
            account = user = None
            try:
                environ = (self._proc / str(pid) / "environ").read_bytes()
            except OSError:
                environ = b""
            for item in environ.split(b"\0"):
                name, _, value = item.partition(b"=")
                text = value.decode(errors="replace")[:128]
                if not text.isprintable() or not text:
                    continue
                if name == b"SLURM_JOB_ACCOUNT":
                    account = text
                elif name == b"SLURM_JOB_USER":
                    user = text
            self._slurm[key] = (account, user)
        return self._slurm[key]
