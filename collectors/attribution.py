"""Which workload owns a GPU process: pid → cgroup → Kubernetes pod, Slurm job, systemd unit, container,
or failing those the process group. Only the executable name is read as a hint, never the command line
(command lines carry tokens and passwords).

A cgroup names a pod, a job or a unit only where the kubelet, slurmstepd or systemd put it: under the kubelet's
root, under slurmstepd's, under a system slice. Users can make cgroups of their own (systemd delegates
``/user.slice/.../user@UID.service`` to them), and one named ``job_4242`` there is no Slurm job. Everything read
from a process (its name, its environment) is the process's to choose: control and bidirectional characters are
stripped, and an owner taken from its environment is marked as claimed unless the scheduler confirms it."""

from __future__ import annotations

import logging
import os
import pwd
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from agent.protocol import WorkloadKind, printable
from collectors.procfs import read_text

log = logging.getLogger(__name__)

# The kubelet's cgroup root: /kubepods (cgroupfs driver), /kubepods.slice (systemd driver), or a kubelet in a
# container (kind) under /kubelet.slice/kubelet-kubepods.slice.
_KUBE_ROOT = re.compile(r"^/(?:kubepods(?:\.slice)?|kubelet\.slice/kubelet-kubepods\.slice)(?:/|$)")
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
# Static pods (kubelet manifests) carry the manifest's 32-hex hash as their UID, without dashes.
_STATIC_POD = re.compile(r"pod([0-9a-f]{32})(?:\.slice|/|$)")
# slurmstepd's: /slurm[_NODE]/uid_UID/job_ID (cgroup v1) or /system.slice/[NODE_]slurmstepd.scope/job_ID (v2)
_SLURM = re.compile(r"^/(?:slurm(?:_[^/]+)?/uid_\d+|system\.slice/(?:[^/]+_)?slurmstepd\.scope)/job_(\d+)(?:/|$)")
# systemd's system units, in system.slice or a slice of the operator's (Slice=); never under user.slice
_UNIT = re.compile(r"^/(?!user\.slice/)(?:[^/]+\.slice/)*([^/]+\.service)(?:/|$)")
# A user's own services, under the systemd instance that systemd delegates to the user: named within that user
# (user@1000.service/jupyter.service), so no user's cgroup can speak for a system unit or another user's.
_USER_UNIT = re.compile(
    r"^/user\.slice/user-(\d+)\.slice/(user@\1\.service)(?:/(?:[^/]+\.slice/)*([^/]+\.service))?(?:/|$)"
)
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
    kube = _KUBE_ROOT.match(cgroup_path) is not None
    if kube and (m := _POD.search(cgroup_path)):
        uid = m.group(1).replace("_", "-")
        return f"k8s/{uid}", WorkloadKind.KUBERNETES_POD, f"pod {uid}"
    if kube and (m := _STATIC_POD.search(cgroup_path)):
        return f"k8s/{m.group(1)}", WorkloadKind.KUBERNETES_POD, f"static pod {m.group(1)}"
    if m := _SLURM.match(cgroup_path):
        return f"slurm/{m.group(1)}", WorkloadKind.SLURM_JOB, f"slurm job {m.group(1)}"
    if m := _CONTAINER.search(cgroup_path) or _CONTAINERD.search(cgroup_path):
        cid = m.group(1)[:12]
        return f"container/{cid}", WorkloadKind.CONTAINER, f"container {cid}"
    if m := _UNIT.match(cgroup_path):
        return f"systemd/{m.group(1)}", WorkloadKind.SYSTEMD_UNIT, m.group(1)
    if m := _USER_UNIT.match(cgroup_path):
        uid, manager, unit = m.groups()
        if unit is None:
            return f"systemd/{manager}", WorkloadKind.SYSTEMD_UNIT, manager
        return f"systemd/{manager}/{unit}", WorkloadKind.SYSTEMD_UNIT, f"{unit} (user {uid})"
    return None


def owner_of_cgroups(cgroup: str) -> tuple[str, WorkloadKind, str] | None:
    """The owner a process's /proc/PID/cgroup names (one line per hierarchy), the most specific of several."""
    best: tuple[str, WorkloadKind, str] | None = None
    for line in cgroup.splitlines():
        path = line.split(":", 2)[-1]
        found = owner_from_cgroup(path)
        if found and (best is None or _RANK.get(found[1], 9) < _RANK.get(best[1], 9)):
            best = found
    return best


class Attributor:
    """Resolves pids through an injectable procfs root so tests run on fixture trees."""

    def __init__(self, procfs_root: Path = Path("/proc"), node: str = "") -> None:
        self._proc = procfs_root
        self._root = str(procfs_root)
        self._node = node
        self._pids: dict[str, list[int]] = {}  # resolved since the last take_pids(), by workload id
        # a cgroup file's text → the owner it names: every process of a workload has the same text, and it is
        # read again every window
        self._by_cgroup: dict[str, tuple[str, WorkloadKind, str] | None] = {}

    def _read(self, pid: int, name: str) -> str | None:
        return read_text(f"{self._root}/{pid}/{name}")

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
        hint = printable(comm).strip()[:64] or None if comm else None  # prctl(PR_SET_NAME) takes any bytes
        cgroup = self._read(pid, "cgroup") or ""
        if cgroup in self._by_cgroup:
            best = self._by_cgroup[cgroup]
        else:
            best = owner_of_cgroups(cgroup)
            if len(self._by_cgroup) >= OWNER_CACHE:
                self._by_cgroup.clear()
            self._by_cgroup[cgroup] = best
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


class SlurmJobs:
    """Each job's account as the scheduler records it (``scontrol show job -o ID``), asked once per job on a
    thread of its own (scontrol talks to slurmctld: milliseconds, or seconds when it is busy), so that sampling
    never waits on it. Until the answer is in, or where scontrol is not installed, a job's account is unknown."""

    RETRY_S = 600.0  # a job scontrol could not tell of is asked about again after this long
    TIMEOUT_S = 10.0

    def __init__(self, scontrol: str | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._scontrol = scontrol if scontrol is not None else shutil.which("scontrol")
        self._clock = clock
        self._accounts: dict[str, str] = {}
        self._failed: dict[str, float] = {}  # job -> when scontrol last could not tell
        self._asking: dict[str, Future[str | None]] = {}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="fleetfit-scontrol") if self._scontrol else None

    def account(self, job: str) -> str | None:
        """The scheduler's account for ``job`` (digits), or None while unknown."""
        if job in self._accounts:
            return self._accounts[job]
        pending = self._asking.get(job)
        if pending is not None and pending.done():
            del self._asking[job]
            found = pending.result()
            if found is not None:
                if len(self._accounts) >= OWNER_CACHE:
                    self._accounts.clear()
                self._accounts[job] = found
                return found
            self._failed[job] = self._clock()
        elif (
            pending is None
            and self._pool is not None
            and self._clock() - self._failed.get(job, float("-inf")) >= self.RETRY_S
        ):
            if len(self._failed) >= OWNER_CACHE:
                self._failed.clear()
            self._asking[job] = self._pool.submit(self._ask, job)
        return None

    def _ask(self, job: str) -> str | None:
        assert self._scontrol is not None
        try:
            done = subprocess.run(
                [self._scontrol, "show", "job", "-o", job],
                capture_output=True,
                timeout=self.TIMEOUT_S,
                check=False,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"},
            )
        except (OSError, subprocess.SubprocessError) as exc:
            log.info("scontrol show job %s: %s", job, exc)
            return None
        if done.returncode != 0:
            return None  # "Invalid job id specified": gone already, or not Slurm's
        m = re.search(rb"(?:^|\s)Account=(\S+)", done.stdout)
        account = printable(m.group(1).decode(errors="replace"))[:128] if m else ""
        return account if account and account != "(null)" else None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


class OwnerReader:
    """Who pays for a workload, read cheaply: the team a showback report charges it to, and for Slurm the user.

    * Kubernetes: the cgroup holds only the pod's uid. The kubelet keeps each pod's logs under
      ``/var/log/pods/<namespace>_<pod name>_<uid>/``, so one directory listing maps every uid on the node to
      its namespace with no API server call and no credentials. (A kubelet with another ``--pod-logs-dir``
      needs ``pods_log_root`` set; without the directory the namespace stays unset.)
    * Slurm: the account as the scheduler records it (``scontrol``, see :class:`SlurmJobs`); failing that,
      ``SLURM_JOB_ACCOUNT`` from the process's environment, marked as claimed: a job may set its environment to
      anything. The user is the one the kernel says owns the process (its real uid), whatever ``SLURM_JOB_USER``
      says. Reading another user's ``environ`` needs root or CAP_SYS_PTRACE; without it the account stays unset.
    * systemd: the unit itself.
    """

    def __init__(
        self,
        procfs_root: Path = Path("/proc"),
        pods_log_root: Path = Path("/var/log/pods"),
        clock: Callable[[], float] = time.monotonic,
        slurm: SlurmJobs | None = None,
    ) -> None:
        self._proc = procfs_root
        self._pods = pods_log_root
        self._clock = clock
        self._namespaces: dict[str, str] = {}
        self._scanned = float("-inf")
        self._slurm: dict[tuple[int, str], tuple[str | None, str | None]] = {}
        self._jobs = slurm if slurm is not None else SlurmJobs(clock=clock)

    def of(self, pid: int, owner: Owner) -> tuple[str | None, str | None, bool | None]:
        """(owner, user, claimed) of ``pid``, whose workload is ``owner``; owner and user may be None, claimed is
        True for an owner only the process's own environment names."""
        if owner.kind is WorkloadKind.KUBERNETES_POD:
            return self._namespace(owner.id.removeprefix("k8s/")), None, None
        if owner.kind is WorkloadKind.SLURM_JOB:
            claimed, user = self._slurm_owner(pid, owner.id)
            confirmed = self._jobs.account(owner.id.removeprefix("slurm/"))
            if confirmed is not None:
                return confirmed, user, None
            return claimed, user, True if claimed else None
        if owner.kind is WorkloadKind.SYSTEMD_UNIT:
            return owner.name, None, None
        return None, None, None

    def close(self) -> None:
        self._jobs.close()

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
        """(account from the environment, user from the kernel) of a Slurm job's process, read once per pid."""
        key = (pid, job)
        if key not in self._slurm:
            if len(self._slurm) >= OWNER_CACHE:
                self._slurm.clear()
            account = None
            try:
                environ = (self._proc / str(pid) / "environ").read_bytes()
            except OSError:
                environ = b""
            for item in environ.split(b"\0"):
                name, _, value = item.partition(b"=")
                if name == b"SLURM_JOB_ACCOUNT":
                    account = printable(value.decode(errors="replace"))[:128].strip() or None
            self._slurm[key] = (account, self._user(pid))
        return self._slurm[key]

    def _user(self, pid: int) -> str | None:
        """The name of the real uid that owns ``pid`` (the kernel's word, not the environment's)."""
        try:
            status = (self._proc / str(pid) / "status").read_text(errors="replace")
        except OSError:
            return None
        for line in status.splitlines():
            if line.startswith("Uid:"):
                fields = line.split()
                if len(fields) > 1 and fields[1].isdigit():
                    try:
                        return printable(pwd.getpwuid(int(fields[1])).pw_name)[:128] or None
                    except KeyError:
                        return f"uid {fields[1]}"
        return None
