"""Facts about a workload's processes that tell serving from training, read once per window from /proc.

* ``program``: what the command line runs — the executable, or an interpreter's ``-m`` module or script name.
  Nothing after it is kept: arguments carry tokens and passwords.
* ``listen_ports``, ``inbound_connections``, ``inbound_peers``: a server listens and clients connect to it. For a
  process in its own network namespace (a Kubernetes pod) every socket of the namespace is the pod's; in the
  host's namespace only the sockets the process holds count (matched by inode through /proc/<pid>/fd). Ports in
  the ephemeral range (NCCL's bootstrap, clients) and distributed training's rendezvous ports are left out.
* ``net_rx_bps``, ``net_tx_bps``: a pod's own interface counters (/proc/<pid>/net/dev), so its traffic needs no
  guess from the node's; absent in the host's namespace, where the counters are the node's.
* ``disk_read_bps``, ``disk_write_bps``: the processes' own storage traffic from /proc/<pid>/io (proc(5)), so a
  job's checkpoint saves are told from a neighbour's steady writes on the same disks. ``read_bytes`` counts what the
  process caused to be read from storage (page-cache hits are not counted); ``write_bytes`` counts bytes when the
  process dirties page-cache pages, so a ``torch.save`` shows in the window it is made in, not when writeback
  reaches the disk; ``cancelled_write_bytes`` (dirty pages truncated before writeback, charged to whoever truncates)
  is taken off the writes. The counters cover every thread of the process and the children it has reaped: a worker
  that holds no GPU (a DataLoader worker) is not among the pids read, and what it read shows only when its parent
  reaps it, all in that window. Another user's file is mode 0400 behind the ptrace read check: root, or
  ``CAP_DAC_READ_SEARCH`` with ``CAP_SYS_PTRACE`` (either alone gets EACCES), as the fd scan needs; and the kernel
  needs task IO accounting. Where none of a workload's processes' files can be read, the fields come from its
  cgroup's ``io.stat`` (cgroup v2, mode 0444: no privileges), as cAdvisor and the kubelet read them: the shallowest
  cgroup on its main process's path that still names the workload (a pod's, a Slurm job's, a unit's, a container's;
  never a process group's, whose session scope holds other programs). What differs: io.stat counts bytes when the
  block layer issues them. Cgroup v2 writeback charges a dirtied page to the cgroup that dirtied it when it is
  flushed, within ``vm.dirty_expire_centisecs`` (30 s by default), so a save shows in the window its pages are
  flushed in, perhaps split over two or three, at the same time as the node's disk counters show it. It counts every
  process of the cgroup (a DataLoader's workers as they read, a sidecar), block devices only (NFS, Lustre, GPFS and
  FUSE traffic is not there), and no discards. The cgroup is charged again on each layer of a stacked volume, so a
  device that another listed device is built on (sysfs ``slaves``: md RAID members, a device-mapper volume's disks,
  followed down to the drive a member partition is on) is left out; a job that also wrote to a member drive's other
  partition directly is read short of that. A loop device's file is counted again on the disk holding it. Rates are
  per cgroup path between windows: first sight is a baseline, a counter that went down or another inode is a new
  cgroup, a cgroup gone is forgotten. /proc/<pid>/io stays preferred wherever one process's file can be read (a save
  counted when it is made). Without a ``0::`` line (cgroup v1 alone), with a path outside the agent's cgroup
  namespace (``/..``), or without ``io.stat`` (no io controller enabled on that cgroup) both fields are absent
  (unknown).
* ``sched_step``: the Slurm step from the cgroup path (``step_batch``, ``step_interactive``, ``step_0``).

Cost: a handful of small reads per workload per window, one fd scan (bounded) for host-namespace processes, and
each network namespace's TCP table once per ``socket_interval`` (10 minutes): the kernel walks its whole
connection hash to produce it, which takes milliseconds on a large host, and a busy server's table can hold
hundreds of thousands of sockets (60,000 in TIME_WAIT took 1.9 s to parse whole). So the agent reads it on a
thread of its own, never on the sampling loop, line by line, keeping only listening sockets and connections to
ports below the ephemeral range (at most ``MAX_SOCKETS_KEPT``, from the first ``MAX_TABLE_LINES`` lines).
/proc/<pid>/io is read for at most ``MAX_PIDS`` processes of a workload, every window: 10-17 µs a read of a real
process's file (the kernel sums its threads). Where none of them can be read, the cgroup's io.stat stands in: one
file a window, and its devices' sysfs ``slaves`` once per ``LAYERS_INTERVAL_S``. On a fixture tree
(``.venv/bin/python bench/workload_facts_io.py``: one 8-process Slurm job, five devices, md RAID under LVM on two
NVMe drives and a boot disk) either source took a window to 1.1-1.9 times what the rest of its facts cost (133-225
µs a window there; medians, three runs on a shared 2-core machine whose load moves them from run to run).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from agent.protocol import WorkloadRef
from collectors.attribution import Attributor, owner_from_cgroup
from collectors.base import Collector, Inventory, Sample
from collectors.procfs import read_bytes, read_text, read_with_inode

INTERPRETERS = re.compile(r"^(python[0-9.]*|pypy[0-9.]*|bash|sh|node|ruby|perl|java|uv|conda|env)$")
SOCKET_INTERVAL_S = 600.0  # how often a network namespace's TCP table is read again
RENDEZVOUS_PORTS = frozenset({29400, 29500})  # torchrun's c10d store and PyTorch's MASTER_PORT default
MAX_FDS = 4096
MAX_TABLE_LINES = 1_000_000  # lines of one TCP table read at most
MAX_SOCKETS_KEPT = 65_536  # sockets of one table kept at most
TCP_LISTEN, TCP_ESTABLISHED = "0A", "01"
_WANTED_STATES = (b"0A", b"01")
_STEP = re.compile(r"/step_([A-Za-z0-9]+)(?:/|$)")
_PRINTABLE = re.compile(r"[^A-Za-z0-9._:+@-]")
MAX_PIDS = 16  # processes of one workload whose sockets and io are read each window
_IO_FIELDS = (b"read_bytes", b"write_bytes", b"cancelled_write_bytes")
LAYERS_INTERVAL_S = 600.0  # how often a block device's members (md RAID, device-mapper) are read again
MAX_LAYERS = 64  # members of one stacked device read at most
# An io.stat line (cgroup-v2.rst): the device, then rbytes and wbytes together (first, as blk-cgroup.c prints them)
# or neither, then other keys (rios, io.latency's use_delay, io.cost's cost.*). One pattern: this runs every window.
# The kernel's counters are u64 (at most 20 digits): a longer number is no count, and read whole it would overflow a
# rate's float (or pass Python's 4,300-digit limit) and take every workload's facts out of the window.
_COUNT_DIGITS = 20
_IO_STAT_LINE = re.compile(
    rb" *(\d+:\d+)(?: +rbytes=(\d{1,20}) +wbytes=(\d{1,20}))?(?: +(?!rbytes=|wbytes=)[^\s=]+=\S*)* *"
)


def program_of(cmdline: bytes) -> str | None:
    """The program a command line runs, without its arguments or environment assignments, whatever separates
    them: a process may rewrite its command line into one string with spaces (setproctitle), and ``env`` puts
    ``NAME=value`` before the program."""
    argv = [word for arg in cmdline.split(b"\0") for word in arg.decode(errors="replace").split()]
    name: str | None = None
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if "=" in word and not word.startswith("-"):
            continue  # NAME=value: an environment assignment (env, a shell's prefix)
        if name is not None and word.startswith("-"):
            if word == "-m" and i < len(argv):
                name = argv[i]  # python -m module
                break
            if word.startswith("-m") and len(word) > 2 and name.startswith("python"):
                name = word[2:]
                break
            if word in ("-c", "-"):
                break
            continue  # an interpreter's own option
        name = os.path.basename(word)
        if not INTERPRETERS.match(name):
            break  # the program itself; what follows are its arguments
    if name is None or "=" in name:
        return None
    cleaned = _PRINTABLE.sub("", name)[:64]
    return cleaned or None


@dataclass(frozen=True, slots=True)
class _Socket:
    local_port: int
    remote: str
    state: str
    inode: str


def io_counters(data: bytes | None) -> tuple[int, int, int] | None:
    """``read_bytes``, ``write_bytes`` and ``cancelled_write_bytes`` of a /proc/<pid>/io file; None when the file
    could not be read or one of them is missing or not a count."""
    if data is None:
        return None
    found: dict[bytes, int] = {}
    for line in data.split(b"\n"):
        name, _, value = line.partition(b":")
        if name in _IO_FIELDS:
            value = value.strip()
            if not value.isdigit() or len(value) > _COUNT_DIGITS:
                return None
            found[name] = int(value)
    if len(found) < len(_IO_FIELDS):
        return None
    return found[b"read_bytes"], found[b"write_bytes"], found[b"cancelled_write_bytes"]


def cgroup_io(data: bytes | None) -> dict[str, tuple[int, int]] | None:
    """Per device (``MAJ:MIN``), ``rbytes`` and ``wbytes`` of a cgroup v2 ``io.stat`` file (the kernel's
    Documentation/admin-guide/cgroup-v2.rst: ``8:16 rbytes=1459200 wbytes=314773504 rios=192 wios=353 dbytes=0
    dios=0``). A device the cgroup has done no I/O on yet may be listed bare, or with other controllers' keys only
    (io.latency's ``use_delay=``, io.cost's ``cost.*=``): zeros. None when the file could not be read or a line is
    not one the kernel writes."""
    if data is None:
        return None
    out: dict[str, tuple[int, int]] = {}
    for line in data.split(b"\n"):
        if not line:
            continue
        m = _IO_STAT_LINE.fullmatch(line)
        if m is None:
            return None
        out[m.group(1).decode()] = (int(m.group(2) or 0), int(m.group(3) or 0))
    return out


def cgroup_v2_path(cgroup: str) -> str | None:
    """The cgroup v2 path of a /proc/PID/cgroup file (its ``0::`` line); None without one (cgroup v1 alone), or
    where it does not lie under the reader's cgroup root: a process outside the agent's cgroup namespace shows
    ``/..`` components, and a cgroup removed under a zombie shows `` (deleted)``."""
    for line in cgroup.splitlines():
        if line.startswith("0::/"):
            path = line[3:].rstrip("/") or "/"
            parts = path.split("/")
            if ".." in parts or "." in parts or path.endswith(" (deleted)"):
                return None
            return path
    return None


def read_table(path: Path, below_port: int) -> list[_Socket]:
    """The listening and established sockets of a /proc/PID/net/tcp table whose local port is below
    ``below_port``, read line by line (bounded: ``MAX_TABLE_LINES`` read, ``MAX_SOCKETS_KEPT`` kept). The rest,
    TIME_WAIT above all, is skipped without being parsed."""
    kept: list[_Socket] = []
    try:
        with path.open("rb") as table:
            table.readline()  # the header
            for count, line in enumerate(table):
                if count >= MAX_TABLE_LINES or len(kept) >= MAX_SOCKETS_KEPT:
                    break
                fields = line.split(None, 10)
                if len(fields) < 10 or fields[3] not in _WANTED_STATES:
                    continue
                try:
                    port = int(fields[1].rsplit(b":", 1)[1], 16)
                except (IndexError, ValueError):
                    continue
                if port < below_port:
                    remote = fields[2].rsplit(b":", 1)[0].decode()
                    kept.append(_Socket(port, remote, fields[3].decode(), fields[9].decode()))
    except OSError:
        pass
    return kept


class WorkloadFacts:
    """Reads the facts above through an injectable procfs root; rates are kept per workload between windows."""

    def __init__(
        self,
        procfs_root: Path = Path("/proc"),
        clock: Callable[[], float] = time.monotonic,
        socket_interval: float = SOCKET_INTERVAL_S,
        background: bool = False,
        cgroupfs_root: Path = Path("/sys/fs/cgroup"),
        sysfs_root: Path = Path("/sys"),
    ) -> None:
        """``background``: read TCP tables on a thread of their own (the agent); a window then carries what the
        latest finished read found. Without, they are read when asked (tests, one-shot runs). ``cgroupfs_root``
        (cgroup v2) and ``sysfs_root``: where a workload's ``io.stat`` and its devices' layers are read."""
        self._proc = procfs_root
        self._cgroupfs = str(cgroupfs_root)
        self._sysfs = str(sysfs_root)
        self._root = str(procfs_root)  # string paths: a Path per read costs more than the read on the fast path
        self._clock = clock
        self._socket_interval = socket_interval
        self._tables: dict[str, tuple[float, list[_Socket]]] = {}  # network namespace → (read at, its sockets)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="fleetfit-tcp") if background else None
        self._reading: dict[str, Future[list[_Socket]]] = {}
        self._held: dict[int, tuple[float, int | None, set[str]]] = {}  # pid → (read at, its start, socket inodes)
        # pid → (its start, facts, its cgroup v2 path)
        self._identities: dict[int, tuple[int | None, dict[str, object], str | None]] = {}
        # (namespace, pids) → (what it was computed from, the server facts): the sockets change only when the
        # table or the held inodes are read again, so the filtering is not redone every window
        self._served: dict[tuple[str, tuple[int, ...]], tuple[object, dict[str, object]]] = {}
        # The host's network namespace is PID 1's where the agent sees host PIDs: an agent pod with hostPID but
        # without hostNetwork has a namespace of its own, which would make every host process look like a pod.
        self._host_netns = self._link("1/ns/net") or self._link("self/ns/net")
        self._ephemeral = self._ephemeral_low()
        self._net: dict[str, tuple[float, int, int]] = {}  # workload → (time, rx bytes, tx bytes)
        # pid → (its start, read at, read_bytes, write_bytes, cancelled_write_bytes)
        self._io: dict[int, tuple[int | None, float, int, int, int]] = {}
        # (workload, its main process's cgroup path) → the workload's own cgroup (None: the path names no workload)
        self._own_cgroup: dict[tuple[str, str], str | None] = {}
        # cgroup path → (its io.stat's inode, read at, per device rbytes and wbytes); paths read this round
        self._cgroup_io: dict[str, tuple[int, float, dict[str, tuple[int, int]]]] = {}
        self._cgroups_read: set[str] = set()
        self._members: dict[str, tuple[float, frozenset[str]]] = {}  # device → (read at, the devices it is built on)

    def _read(self, relative: str) -> str | None:
        return read_text(f"{self._root}/{relative}")

    def _link(self, relative: str) -> str | None:
        try:
            return os.readlink(f"{self._root}/{relative}")
        except OSError:
            return None

    def _started(self, pid: int) -> int | None:
        """When ``pid`` started (clock ticks after boot; None: gone). A pid the kernel gives to a new process
        has a later start, so what was read of the old one is not taken for the new one's."""
        stat = read_bytes(f"{self._root}/{pid}/stat")
        if stat is None:
            return -1 if os.path.isdir(f"{self._root}/{pid}") else None  # a procfs without stat: by pid alone
        fields = stat.rpartition(b")")[2].split()
        try:
            return int(fields[19])  # field 22 of proc(5); the fields after the command's ")" start at 3
        except (IndexError, ValueError):
            return -1  # alive, start unreadable (a procfs that lacks it): identity by pid alone

    def _ephemeral_low(self) -> int:
        text = self._read("sys/net/ipv4/ip_local_port_range")
        try:
            return int(text.split()[0]) if text else 32768
        except ValueError:
            return 32768

    def enrich(self, refs: list[WorkloadRef], pids: dict[str, list[int]]) -> list[WorkloadRef]:
        """``refs`` with the facts of their processes; a workload whose processes are gone keeps its reference."""
        out = []
        for ref in refs:
            # a process on several GPUs was resolved once per GPU: each is looked at once
            starts = {p: self._started(p) for p in dict.fromkeys(pids.get(ref.id, []))}
            alive = [p for p, start in starts.items() if start is not None]
            out.append(ref.model_copy(update=self.facts(ref.id, alive, starts)) if alive else ref)
        live = set(pids)
        for gone in [w for w in self._net if w not in live]:
            del self._net[gone]
        if len(self._tables) > 4 * max(len(refs), 8):  # namespaces of pods long gone
            self._tables.clear()
            self._reading = {k: f for k, f in self._reading.items() if not f.done()}
        seen = {p for group in pids.values() for p in group}
        for pid in [p for p in self._identities if p not in seen]:  # a pid may be reused by another program
            del self._identities[pid]
        for pid in [p for p in self._held if p not in seen]:
            del self._held[pid]
        for pid in [p for p in self._io if p not in seen]:
            del self._io[pid]
        for path in [p for p in self._cgroup_io if p not in self._cgroups_read]:  # a job ended, a pod deleted
            del self._cgroup_io[path]
        self._cgroups_read.clear()
        if len(self._served) > 4 * max(len(refs), 8):
            self._served.clear()
        return out

    def facts(self, workload: str, pids: list[int], starts: dict[int, int | None] | None = None) -> dict[str, object]:
        """The facts of a workload's live ``pids`` (``starts``: each one's start, if read already)."""
        starts = starts if starts is not None else {p: self._started(p) for p in pids}
        main = min(pids)
        identity, cgroup = self._identity(main, starts.get(main))
        facts = dict(identity)
        # read every window: a process may enter another network namespace (setns) at any time
        netns = self._link(f"{main}/ns/net")
        own = netns is not None and self._host_netns is not None and netns != self._host_netns
        facts.update(self._server(pids, netns, own, starts))
        if own:
            facts.update(self._rates(workload, main))
        storage = self._storage(pids[:MAX_PIDS], starts)
        if storage is None and cgroup is not None:
            storage = self._cgroup_storage(workload, cgroup)
        facts.update(storage or {})
        return facts

    def _identity(self, pid: int, start: int | None) -> tuple[dict[str, object], str | None]:
        """Program, Slurm step and cgroup v2 path: fixed for a process's life (a GPU's process is placed in its
        pod's or job's cgroup before it starts), so read once per process (pid and start)."""
        known = self._identities.get(pid)
        if known is not None and known[0] == start:
            return known[1], known[2]
        facts: dict[str, object] = {}
        with contextlib.suppress(OSError):
            facts["program"] = program_of((self._proc / str(pid) / "cmdline").read_bytes())
        cgroup = self._read(f"{pid}/cgroup") or ""
        if m := _STEP.search(cgroup):
            facts["sched_step"] = m.group(1)[:32]
        if len(self._identities) >= 4096:
            self._identities.clear()
        path = cgroup_v2_path(cgroup)
        self._identities[pid] = (start, facts, path)
        return facts, path

    def _table(self, pid: int, netns: str | None) -> list[_Socket]:
        """The TCP sockets of ``pid``'s network namespace, read at most once per interval per namespace: the
        kernel walks its whole connection hash for every read (milliseconds on a large host), and what a server
        listens on changes rarely."""
        key = netns or f"pid:{pid}"
        now = self._clock()
        cached = self._tables.get(key)
        if cached is not None and now - cached[0] < self._socket_interval:
            return cached[1]
        if self._pool is None:
            sockets = self._read_tables(pid)
            self._tables[key] = (now, sockets)
            return sockets
        reading = self._reading.get(key)
        if reading is None:
            self._reading[key] = self._pool.submit(self._read_tables, pid)
        elif reading.done():
            del self._reading[key]
            sockets = reading.result() if reading.exception() is None else []
            self._tables[key] = (now, sockets)
            return sockets
        return cached[1] if cached is not None else []  # until the read in progress is done

    def _read_tables(self, pid: int) -> list[_Socket]:
        return [
            s for name in ("tcp", "tcp6") for s in read_table(self._proc / str(pid) / "net" / name, self._ephemeral)
        ]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _server(
        self, pids: list[int], netns: str | None, own_namespace: bool, starts: dict[int, int | None]
    ) -> dict[str, object]:
        key = netns or f"pid:{pids[0]}"
        held_by = [] if own_namespace else [self._inodes(pid, starts.get(pid)) for pid in pids[:MAX_PIDS]]
        if not own_namespace and not any(held_by):
            # holds no socket, so serves nothing: the namespace's table (the host's, the dearest) is not read
            return {"listen_ports": [], "inbound_connections": 0, "inbound_peers": 0}
        sockets = self._table(pids[0], netns)
        if own_namespace:
            source: object = (self._tables.get(key, (None,))[0], len(sockets))
        else:
            source = (self._tables.get(key, (None,))[0], len(sockets), tuple(self._held[p][:2] for p in pids[:16]
                                                                              if p in self._held))  # fmt: skip
        served = self._served.get((key, tuple(pids[:16])))
        if served is not None and served[0] == source:
            return served[1]
        if not own_namespace:
            held = set().union(*held_by)
            sockets = [s for s in sockets if s.inode in held]
        ports = sorted(
            {
                s.local_port
                for s in sockets
                if s.state == TCP_LISTEN and s.local_port < self._ephemeral and s.local_port not in RENDEZVOUS_PORTS
            }
        )[:16]
        inbound = [s for s in sockets if s.state == TCP_ESTABLISHED and s.local_port in ports]
        facts: dict[str, object] = {
            "listen_ports": ports,
            "inbound_connections": len(inbound),
            "inbound_peers": len({s.remote for s in inbound}),
        }
        self._served[key, tuple(pids[:16])] = (source, facts)
        return facts

    def _inodes(self, pid: int, start: int | None) -> set[str]:
        """The socket inodes ``pid`` holds, refreshed with the namespace's table (and for a new process)."""
        now = self._clock()
        cached = self._held.get(pid)
        if cached is not None and now - cached[0] < self._socket_interval and cached[1] == start:
            return cached[2]
        held: set[str] = set()
        try:
            entries = os.scandir(f"{self._root}/{pid}/fd")
        except OSError:
            return held
        with entries:
            for count, entry in enumerate(entries):
                if count >= MAX_FDS:
                    break
                try:
                    target = os.readlink(entry.path)
                except OSError:
                    continue
                if target.startswith("socket:["):
                    held.add(target[8:-1])
        self._held[pid] = (now, start, held)
        return held

    def _storage(self, pids: list[int], starts: dict[int, int | None]) -> dict[str, object] | None:
        """Bytes/s the processes read from storage and wrote for it since each one's last reading. A process seen
        for the first time is only a baseline (its counters hold its whole life), and so is one whose pid now
        belongs to another process (another start, or a counter lower than before). Nothing when no process had a
        baseline (unknown, not zero); None when none could be read."""
        if len(self._io) > 4096:  # callers that never pass through enrich(), which forgets gone pids
            self._io.clear()
        now = self._clock()
        read = written = 0.0
        measured = readable = False
        for pid in dict.fromkeys(pids):
            counters = io_counters(read_bytes(f"{self._root}/{pid}/io"))
            if counters is None:
                self._io.pop(pid, None)  # read again from a fresh baseline once it can be
                continue
            readable = True
            start = starts.get(pid)
            before = self._io.get(pid)
            if before is not None and before[0] == start and now <= before[1]:
                continue  # asked twice at one instant: the baseline stays
            self._io[pid] = (start, now, *counters)
            if (
                before is None
                or before[0] != start
                or counters[0] < before[2]
                or counters[1] < before[3]
                or counters[2] < before[4]
            ):
                continue
            elapsed = now - before[1]
            measured = True
            read += (counters[0] - before[2]) / elapsed
            # cancelled bytes are charged to the process that truncates, which may not be the one that wrote
            written += ((counters[1] - before[3]) - (counters[2] - before[4])) / elapsed
        if not measured:
            return {} if readable else None
        return {"disk_read_bps": round(read, 1), "disk_write_bps": round(max(written, 0.0), 1)}

    def _cgroup_storage(self, workload: str, cgroup: str) -> dict[str, object]:
        """Bytes/s the workload's cgroup read from and wrote to block devices since the last reading of its
        ``io.stat``, each byte once: a device another listed device is built on (an md RAID member, a
        device-mapper volume's disk) is left out, since the cgroup is charged again on each layer. First sight is
        a baseline; a counter that went down, or another inode under the same path, is a new cgroup: a baseline
        again. Nothing where the path names no cgroup of the workload's own or has no readable ``io.stat``."""
        own = self._own(workload, cgroup)
        if own is None:
            return {}
        if len(self._cgroup_io) > 4096:  # callers that never pass through enrich(), which forgets gone cgroups
            self._cgroup_io.clear()
            self._cgroups_read.clear()
        self._cgroups_read.add(own)
        read = read_with_inode(f"{self._cgroupfs}{own}/io.stat")
        counts = cgroup_io(read[1]) if read is not None else None
        if read is None or counts is None:
            self._cgroup_io.pop(own, None)  # cgroup v1, no io controller there, gone, or garbled
            return {}
        now = self._clock()
        before = self._cgroup_io.get(own)
        if before is not None and before[0] == read[0] and now <= before[1]:
            return {}  # asked twice at one instant: the baseline stays
        self._cgroup_io[own] = (read[0], now, counts)
        if before is None or before[0] != read[0]:
            return {}
        layered = self._layered(counts)
        rbytes = wbytes = 0
        for device, (r, w) in counts.items():
            # a device listed for the first time holds only what was charged to it since the last reading
            old = before[2].get(device, (0, 0))
            if r < old[0] or w < old[1]:
                return {}
            if device not in layered:
                rbytes += r - old[0]
                wbytes += w - old[1]
        elapsed = now - before[1]
        return {"disk_read_bps": round(rbytes / elapsed, 1), "disk_write_bps": round(wbytes / elapsed, 1)}

    def _own(self, workload: str, cgroup: str) -> str | None:
        """The workload's own cgroup: the shallowest one on ``cgroup``'s path that still names the workload (a
        pod's, not a container's; a Slurm job's, not a step's or a task's), since io.stat counts its descendants
        too. None where no cgroup on the path names it: a process group's session scope or the root cgroup holds
        other programs, and their I/O is not the workload's."""
        key = (workload, cgroup)
        if key in self._own_cgroup:
            return self._own_cgroup[key]
        found = None
        end = 0
        while end >= 0:
            end = cgroup.find("/", end + 1)
            prefix = cgroup if end < 0 else cgroup[:end]
            owner = owner_from_cgroup(prefix)
            if owner is not None and owner[0] == workload:
                found = prefix
                break
        if len(self._own_cgroup) >= 4096:
            self._own_cgroup.clear()
        self._own_cgroup[key] = found
        return found

    def _layered(self, devices: dict[str, tuple[int, int]]) -> set[str]:
        """The devices among ``devices`` that another of them is built on."""
        layered: set[str] = set()
        for device in devices:
            layered.update(self._built_on(device))
        return layered

    def _built_on(self, device: str) -> frozenset[str]:
        """The whole disks and volumes ``device`` (``MAJ:MIN``) is built on, from sysfs's ``slaves`` (empty for a
        plain disk). One level is enough: each layer below is charged too, so listed, with its own members. Read
        again every ``LAYERS_INTERVAL_S``, since arrays and volumes are assembled rarely."""
        now = self._clock()
        cached = self._members.get(device)
        if cached is not None and now - cached[0] < LAYERS_INTERVAL_S:
            return cached[1]
        found: set[str] = set()
        slaves = f"{self._sysfs}/dev/block/{device}/slaves"
        try:
            names = os.listdir(slaves)[:MAX_LAYERS]
        except OSError:
            names = []
        for name in names:
            member = os.path.realpath(f"{slaves}/{name}")
            if os.path.exists(f"{member}/partition"):
                member = os.path.dirname(member)  # io.stat lists the whole disk, never its partitions
            number = (read_text(f"{member}/dev") or "").strip()
            if number and number != device:
                found.add(number)
        if len(self._members) >= 4096:
            self._members.clear()
        members = self._members[device] = (now, frozenset(found))
        return members[1]

    def _rates(self, workload: str, pid: int) -> dict[str, object]:
        rx = tx = 0
        for line in (self._read(f"{pid}/net/dev") or "").splitlines()[2:]:
            name, _, data = line.partition(":")
            fields = data.split()
            if name.strip() == "lo" or len(fields) < 9:
                continue
            try:
                rx, tx = rx + int(fields[0]), tx + int(fields[8])
            except ValueError:
                continue
        now = self._clock()
        before = self._net.get(workload)
        self._net[workload] = (now, rx, tx)
        if before is None or now <= before[0] or rx < before[1] or tx < before[2]:
            return {}  # first sight, or the namespace was recreated: no rate this window
        elapsed = now - before[0]
        return {"net_rx_bps": round((rx - before[1]) / elapsed, 1), "net_tx_bps": round((tx - before[2]) / elapsed, 1)}


class WithFacts:
    """A GPU collector whose workload references carry the facts of the processes it attributed."""

    def __init__(self, inner: Collector, attributor: Attributor, facts: WorkloadFacts | None = None) -> None:
        self._inner = inner
        self._attributor = attributor
        self._facts = facts or WorkloadFacts(background=True)
        self.name = inner.name

    def inventory(self) -> Inventory:
        return self._inner.inventory()

    def sample(self) -> list[Sample]:
        return self._inner.sample()

    def workloads(self) -> list[WorkloadRef]:
        refs = self._inner.workloads()
        return self._facts.enrich(refs, self._attributor.take_pids())

    def close(self) -> None:
        self._inner.close()
        self._facts.close()

    def __getattr__(self, name: str) -> object:
        # What a collector may offer beyond the protocol (its hardware generation, its self-metrics).
        return getattr(self._inner, name)
