"""A simulated GPU node: N GPUs of one profile running workloads of known patterns.

It implements the collector interface for GPUs, NICs, disks and host at once, so a simulated node goes through
the agent's real code path (rates, windows, protocol, MQTT). Time comes from an injected clock, which lets a
simulation run faster than real time. The pattern of each workload is ground truth kept here; it never enters
a telemetry payload.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from agent.protocol import DiskInfo, GpuInfo, NicInfo, NicKind, NicRole, WorkloadKind, WorkloadRef
from collectors.base import Entity, Inventory, Sample
from collectors.sim import workloads as realistic
from collectors.sim.profiles import HOSTS, NodeProfile, thin_host
from collectors.sim.spec import GpuState, Pattern, WorkloadSpec

GB = 1e9
DIURNAL_FLOOR = 0.1  # trough / peak of online inference over a day: about 10x
# A planted throttle: the clock it holds a working GPU to, of the clock it would run at (an estimate: a thermal
# slowdown or a lowered power limit typically costs a GPU a quarter to a half of its clock), and the power limit a
# planted power cap sets, of the board's.
THROTTLED_CLOCK = 0.7
CAPPED_LIMIT = 0.6
THROTTLE_QUIRKS = {
    "throttle_thermal": "thermal_slowdown_pct",
    "throttle_power": "power_capped_pct",
    "throttle_hw": "hw_slowdown_pct",
}


@dataclass(frozen=True, slots=True)
class Latest:
    """A node's last sample: when (its clock), each GPU's state and what the agent was given."""

    time: float
    gpus: tuple[GpuState, ...]
    samples: tuple[Sample, ...]


def activity(util: float, g: GpuState) -> tuple[float, float, float]:
    """SM, tensor-pipe and DRAM activity (%) of a GPU at ``util`` %: what GPM reports on Hopper and DCGM's
    profiling fields on any data-centre GPU. SM activity at 0.92 of utilisation is an estimate: NVML counts the
    GPU busy while any kernel runs, however few of its SMs that kernel occupies."""
    return min(100.0, util * 0.92), util * g.tensor_share, min(100.0, util * g.dram_share)


class SimulatedNode:
    """Collector for one virtual node. ``clock`` returns the simulation's wall time in seconds."""

    name = "simulated"

    def __init__(
        self,
        node: str,
        profile: NodeProfile,
        workloads: list[WorkloadSpec],
        clock: Callable[[], float],
        seed: int = 0,
        gpu_only: bool = False,
        quirks: frozenset[str] = frozenset(),
        schema: int = 2,
        background: realistic.Background | None = None,
    ) -> None:
        """``quirks``: ``md_raid`` (checkpoint volume on md RAID 0), ``roce_frontend`` (the front-end NICs are
        ConnectX ports with an RDMA device), ``host_network`` (workloads run in the host's network namespace, as
        Slurm jobs and host-network pods do: the agent reads their sockets but has no counters of their own, the
        node's being every workload's). ``schema`` 1 behaves like an agent from before schema 2: no process
        facts, RAID members unmarked, an RDMA-capable front-end port taken for the fabric. ``thin_host``: 8 CPUs
        per GPU, no NVMe, data over NFS (collectors/sim/profiles.py). ``background``: what the
        node itself sends and writes whatever its GPUs do (scrapes, log shipping, kubelet); none by default.
        ``throttle_thermal``, ``throttle_power``, ``throttle_hw``: every GPU is held below its clocks while it
        works, by heat, by a power limit lowered to ``CAPPED_LIMIT`` of the board's, or by the hardware slowdown
        signal (a power brake), and its work takes that much longer (``THROTTLED_CLOCK``)."""
        used = [g for w in workloads for g in w.gpus]
        if len(used) != len(set(used)) or any(g >= profile.gpus for g in used):
            raise ValueError(f"{node}: workloads overlap or exceed the node's {profile.gpus} GPUs")
        self.node = node
        self.profile = profile
        self.specs = list(workloads)
        self.gpu_only = gpu_only  # beside the real NIC and disk collectors of the machine it runs on
        self._clock = clock
        self.rng = random.Random(f"{seed}:{node}")
        self._start = clock()
        self._last = self._start
        self._counters: dict[tuple[str, str], float] = {}
        self._episode_until: dict[str, float] = {}  # per workload: end of a stall or burst
        self._backlog: dict[str, float] = {}  # per request queue: seconds of work waiting
        self.quirks = quirks
        self.schema = schema
        self._gpm = any(k in profile.gpu_model for k in ("H100", "H200", "B200"))  # GPM needs Hopper or newer
        self._netns: dict[str, tuple[float, float, float]] = {}  # per workload: tx bytes, rx bytes, seconds
        # Per workload since the start, as its network namespace's interface counts (cAdvisor reads those); the
        # window's figures above are taken away at each window, these never are.
        self.netns_bytes: dict[str, tuple[float, float]] = {}
        # per workload: bytes its processes read from and wrote for storage, since the start (what cAdvisor exports)
        self.io_bytes: dict[str, tuple[float, float]] = {}
        self._io: dict[str, tuple[float, float, float]] = {}  # per workload since the last window: read, written, s
        self.latest: Latest | None = None  # the last sample, for readers beside the agent (collectors/sim/exporter.py)
        self.background = background
        # Its own generator, so that adding a node's background leaves its workloads' draws as they were.
        self._background_rng = random.Random(f"{seed}:{node}:background")

    def release(self, workload: str) -> WorkloadSpec | None:
        """Stop running ``workload`` here (a scheduler moved it away); its spec, or None if it was not here."""
        spec = next((w for w in self.specs if w.id == workload), None)
        if spec is not None:
            self.specs.remove(spec)
        return spec

    def free_gpus(self) -> list[int]:
        held = {g for w in self.specs for g in w.gpus}
        return [g for g in range(self.profile.gpus) if g not in held]

    def admit(self, spec: WorkloadSpec) -> None:
        """Start running ``spec`` on its GPUs, which must be free."""
        if not set(spec.gpus) <= set(self.free_gpus()):
            raise ValueError(f"{self.node}: GPUs {spec.gpus} are not free")
        self.specs.append(spec)

    @property
    def started(self) -> float:
        """When the simulation began, on its clock: the time its daily cycles count from."""
        return self._start

    # ------------------------------------------------------------------ the collector interface

    def inventory(self) -> Inventory:
        p = self.profile
        gpus = [
            GpuInfo(
                index=i,
                uuid=f"GPU-sim-{self.node}-{i}",
                model=p.gpu_model,
                memory_mib=p.memory_mib,
                nvlink_links=p.nvlink_links,
                pcie_gen=p.pcie_gen,
                pcie_width=16,
                power_limit_w=p.power_limit_w,
            )
            for i in range(p.gpus)
        ]
        nics = []
        for n in p.nics:
            front = n.kind is NicKind.ETHERNET
            kind = NicKind.ROCE if front and "roce_frontend" in self.quirks else n.kind
            # An agent before schema 2 took every RDMA-capable port for the fabric; the current one knows the port
            # carrying the default route is the front end.
            fabric = kind in (NicKind.INFINIBAND, NicKind.ROCE) and (self.schema < 2 or not front)
            nics.append(
                NicInfo(
                    name=n.name,
                    kind=kind,
                    role=NicRole.EAST_WEST if fabric else NicRole.NORTH_SOUTH,
                    speed_mbps=n.speed_mbps,
                )
            )
        if self.gpu_only:
            return Inventory(gpus=gpus, driver_version="sim", cuda_version="sim")
        size = 7_680 * 10**9
        disks = [DiskInfo(name=self._disk, size_bytes=size)]
        if "md_raid" in self.quirks:
            member = "md127" if self.schema >= 2 else None
            disks = [
                DiskInfo(name="nvme0n1", size_bytes=size, member_of=member),
                DiskInfo(name="nvme1n1", size_bytes=size, member_of=member),
                DiskInfo(name="md127", size_bytes=2 * size),
            ]
        host = thin_host(p) if "thin_host" in self.quirks else HOSTS.get(p.key)
        return Inventory(gpus=gpus, nics=nics, disks=disks, driver_version="sim", cuda_version="sim", host=host)

    @property
    def _disk(self) -> str:
        """The node's one disk: a SATA boot drive on a thin node, which has no NVMe."""
        return "sda" if "thin_host" in self.quirks else "nvme0n1"

    def workloads(self) -> list[WorkloadRef]:
        refs = []
        for w in self.specs:
            ref = WorkloadRef(
                id=w.id,
                kind=WorkloadKind.KUBERNETES_POD,
                name=w.name,
                gpus=list(w.gpus),
                hint=w.hint,
                owner=simulated_namespace(w.name),
            )
            if self.schema >= 2:
                ref = ref.model_copy(update=self._facts(w))
            refs.append(ref)
        return refs

    def _facts(self, w: WorkloadSpec) -> dict[str, object]:
        """What a schema-2 agent reads of the workload's processes over the window since the last call."""
        tx, rx, seconds = self._netns.pop(w.id, (0.0, 0.0, 0.0))
        facts: dict[str, object] = {"program": w.program}
        if seconds > 0 and "host_network" not in self.quirks:
            facts.update(net_tx_bps=round(tx / seconds, 1), net_rx_bps=round(rx / seconds, 1))
        read, written, seconds = self._io.pop(w.id, (0.0, 0.0, 0.0))
        if seconds > 0:  # /proc/<pid>/io counts a process's own storage traffic in any network namespace
            facts.update(disk_read_bps=round(read / seconds, 1), disk_write_bps=round(written / seconds, 1))
        if w.listen_ports:
            follows = w.pattern is Pattern.LLM_SERVING or w.request_gpu_s > 0  # clients come and go with the day
            load = self.diurnal(w, self._last - self._start) if follows else 1.0
            peers = max(1, round(w.peers * load))
            facts.update(
                listen_ports=list(w.listen_ports),
                inbound_peers=peers,
                inbound_connections=peers * (4 if w.peers > 2 else 1),
            )
        else:  # as the agent reports a process that listens on nothing (collectors/workload_facts.py)
            facts.update(listen_ports=[], inbound_peers=0, inbound_connections=0)
        return facts

    def close(self) -> None:
        return None

    def sample(self) -> list[Sample]:
        now = self._clock()
        dt = max(now - self._last, 0.0)
        self._last = now
        t = now - self._start
        p = self.profile
        gpus = [GpuState() for _ in range(p.gpus)]
        fabric_bps = north_bps = north_rx_bps = read_bps = write_bps = 0.0
        for w in self.specs:
            f, n, nrx, r, wr = self._drive(w, t, gpus)
            fabric_bps += f
            north_bps += n
            north_rx_bps += nrx
            read_bps += r
            write_bps += wr
            tx, rx, seconds = self._netns.get(w.id, (0.0, 0.0, 0.0))
            self._netns[w.id] = (tx + n * dt, rx + nrx * dt, seconds + dt)
            tx, rx = self.netns_bytes.get(w.id, (0.0, 0.0))
            self.netns_bytes[w.id] = (tx + n * dt, rx + nrx * dt)
            read, written = self.io_bytes.get(w.id, (0.0, 0.0))
            self.io_bytes[w.id] = (read + r * dt, written + wr * dt)
            read, written, seconds = self._io.get(w.id, (0.0, 0.0, 0.0))
            self._io[w.id] = (read + r * dt, written + wr * dt, seconds + dt)
        realistic.contended(self, self.specs, gpus, t)
        if self.background is not None:  # the node's own: not in any workload's network namespace
            tx, rx, read, write = self.background.traffic(self._background_rng, t)
            north_bps += tx
            north_rx_bps += rx
            read_bps += read
            write_bps += write

        out: list[Sample] = []
        throttle = next((field for quirk, field in THROTTLE_QUIRKS.items() if quirk in self.quirks), None)
        limit_w = p.power_limit_w * CAPPED_LIMIT if "throttle_power" in self.quirks else math.inf
        for i, g in enumerate(gpus):
            util = min(max(g.util, 0.0), 100.0)
            held = throttle is not None and util > 1
            if held:  # the same work at a slower clock keeps kernels running longer
                util = min(util / THROTTLED_CLOCK, 100.0)
            clock = p.max_sm_clock_mhz * (0.95 * (THROTTLED_CLOCK if held else 1.0) if util > 1 else 0.1)
            gauges = {
                "util": round(util, 1),
                "mem_util": round(util * 0.6, 1),
                "mem_used_mib": round(g.mem_mib, 0),
                "power_w": round(
                    min(p.idle_power_w + (p.power_limit_w - p.idle_power_w) * util / 100 * g.intensity, limit_w), 1
                ),
                "temp_c": round(32 + util * 0.4 + self.rng.gauss(0, 0.5), 1),
                "sm_clock_mhz": round(clock, 0),
            }
            latest: dict[str, float] = {}
            if throttle is not None:
                gauges[throttle] = 100.0 if held else 0.0
                latest["power_limit_w"] = min(limit_w, p.power_limit_w)
            counters = {
                "pcie_tx_bps": self._advance(("gpu", f"{i}.pcie_tx"), g.pcie_bps, dt),
                "pcie_rx_bps": self._advance(("gpu", f"{i}.pcie_rx"), g.pcie_bps, dt),
            }
            if p.nvlink_links:
                counters["nvlink_tx_bps"] = self._advance(("gpu", f"{i}.nvl_tx"), g.nvlink_bps, dt)
                counters["nvlink_rx_bps"] = self._advance(("gpu", f"{i}.nvl_rx"), g.nvlink_bps, dt)
            if self._gpm:
                sm, tensor, dram = activity(util, g)
                gauges.update(sm_active=round(sm, 1), tensor_active=round(tensor, 1), dram_active=round(dram, 1))
            out.append(Sample(Entity.GPU, str(i), gauges=gauges, counters=counters, latest=latest))
        if self.gpu_only:
            self.latest = Latest(now, tuple(gpus), tuple(out))
            return out

        fabric = [n for n in p.nics if n.kind in (NicKind.INFINIBAND, NicKind.ROCE)]
        front = [n for n in p.nics if n.kind not in (NicKind.INFINIBAND, NicKind.ROCE)]
        for group, total_tx, total_rx in (
            (fabric, fabric_bps, fabric_bps),
            (front, north_bps, north_rx_bps),
        ):
            for nic in group:
                tx = total_tx / len(group) * self.jitter(0.05)
                rx = total_rx / len(group) * self.jitter(0.05)
                out.append(
                    Sample(
                        Entity.NIC,
                        nic.name,
                        counters={
                            "rx_bps": self._advance(("nic", f"{nic.name}.rx"), rx, dt),
                            "tx_bps": self._advance(("nic", f"{nic.name}.tx"), tx, dt),
                            "errors": 0,
                            "drops": 0,
                        },
                    )
                )
        # A RAID 0 over two NVMe drives: each member carries half and md127 counts the same bytes again.
        disks = (
            [("nvme0n1", 0.5), ("nvme1n1", 0.5), ("md127", 1.0)] if "md_raid" in self.quirks else [(self._disk, 1.0)]
        )
        for disk, part in disks:
            out.append(
                Sample(
                    Entity.DISK,
                    disk,
                    counters={
                        "read_bps": self._advance(("disk", f"{disk}.rb"), read_bps * part, dt),
                        "write_bps": self._advance(("disk", f"{disk}.wb"), write_bps * part, dt),
                        "read_iops": self._advance(("disk", f"{disk}.ro"), read_bps * part / 131_072, dt),
                        "write_iops": self._advance(("disk", f"{disk}.wo"), write_bps * part / 131_072, dt),
                    },
                )
            )
        busy = sum(g.util for g in gpus) / max(len(gpus), 1)
        out.append(
            Sample(
                Entity.HOST,
                "host",
                gauges={
                    "cpu_util": round(
                        realistic.host_cpu(self.specs, 5 + busy * 0.3 + self.rng.gauss(0, 1) ** 2, self.rng), 1
                    ),
                    "mem_used_pct": 35.0,
                },
            )
        )
        self.latest = Latest(now, tuple(gpus), tuple(out))
        return out

    # ------------------------------------------------------------------ the patterns

    def jitter(self, sigma: float) -> float:
        return max(0.0, 1.0 + self.rng.gauss(0, sigma))

    def _advance(self, key: tuple[str, str], rate: float, dt: float) -> int:
        total = self._counters.get(key, 0.0) + max(rate, 0.0) * dt
        self._counters[key] = total
        return int(total)

    def _drive(self, w: WorkloadSpec, t: float, gpus: list[GpuState]) -> realistic.Traffic:
        """Set GPU state for ``w`` at simulation second ``t``; return (fabric, north tx, north rx, read, write)
        bytes/s."""
        if w.pattern is Pattern.INFERENCE and (loading := realistic.loading_weights(self, w, t, gpus)) is not None:
            return loading
        if w.pattern is Pattern.INFERENCE and w.request_gpu_s > 0:
            return realistic.compute_service(self, w, t, gpus)
        if w.pattern in _REALISTIC:
            fabric, tx, rx, read, write = _REALISTIC[w.pattern](self, w, t, gpus)
            if w.save_to_network:  # checkpoints to NFS / object storage leave by the front end
                return fabric, tx + write, rx, read, 0.0
            return fabric, tx, rx, read, write
        for g in w.gpus:
            gpus[g].intensity = w.power_intensity
            gpus[g].tensor_share, gpus[g].dram_share = w.tensor_share, w.dram_share
        if w.pattern in (Pattern.TRAINING, Pattern.FINE_TUNING):
            fabric, north, read, write = self._training(w, t, gpus)
            # input read at the mount's limit is flat second to second (realistic.storage_bound_read)
            intake = (
                realistic.storage_bound_read(self, w) if w.storage_read_bps > 0 else w.input_bps * self.jitter(0.15)
            )
            rx = 0.05 * north + intake
            if w.save_to_network:
                return fabric, north + write, rx, read, 0.0
            return fabric, north, rx, read, write
        if w.pattern is Pattern.BATCH_INFERENCE:
            fabric, north, read, write = self._inference(w, t, gpus)
            # Offline scoring reads its input (disk, or NFS / object storage on the front end) and writes results;
            # it answers no clients.
            load = sum(gpus[g].util for g in w.gpus) / max(len(w.gpus), 1) / 100
            return fabric, 0.02 * north, w.input_bps * load * self.jitter(0.15), read, write
        if w.pattern is Pattern.INFERENCE:
            fabric, north, read, write = self._inference(w, t, gpus)
            return fabric, north * w.client_scale, north * w.client_scale * 0.05, read, write
        if w.pattern is Pattern.INTERACTIVE:
            fabric, north, read, write = self._interactive(w, t, gpus)
            return fabric, north, north * 0.05, read, write
        for g in w.gpus:  # idle: memory held, nothing running
            gpus[g].util = 0.0
            gpus[g].mem_mib = w.mem_fraction * self.profile.memory_mib
        return 0.0, 0.0, 0.0, 0.0, 0.0

    def episode(
        self, w: WorkloadSpec, t: float, rate: float, seconds: tuple[float, float], key: str | None = None
    ) -> bool:
        """True while a random episode (a stall, a burst) of ``w`` lasts; episodes start at ``rate`` per second.
        ``key`` keeps episodes apart within a workload (one per GPU of independent replicas)."""
        key = key or w.id
        until = self._episode_until.get(key, -1.0)
        if t >= until and self.rng.random() < rate:
            until = self._episode_until[key] = t + self.rng.uniform(*seconds)
        return t < until

    def queue(self, key: str, arrived: float) -> float:
        """Add ``arrived`` seconds of work to queue ``key`` and serve one second of it: the share of this second
        spent working (0-1). Work left over waits for the next second, as requests do behind a busy worker."""
        waiting = self._backlog.get(key, 0.0) + arrived
        served = min(1.0, waiting)
        self._backlog[key] = waiting - served
        return served

    def _training(self, w: WorkloadSpec, t: float, gpus: list[GpuState]) -> tuple[float, float, float, float]:
        """GPUs in lockstep at the job's level; gradient all-reduce over NVLink (or PCIe) and, for multi-node
        jobs, the fabric; checkpoint write bursts every ``checkpoint_period_s``; data-loader stalls."""
        p, rng = self.profile, self.rng
        stalled = self.episode(w, t, w.stall_rate, w.stall_seconds)
        saving = realistic.synchronous_save(w, t)
        common = realistic.starved(w, w.level * 100) + rng.gauss(0, w.noise)
        mem = w.mem_fraction * p.memory_mib
        exchange = realistic.exchanging(w, t)
        for g in w.gpus:
            util = 3.0 if stalled else common + rng.gauss(0, w.noise * 0.6)
            if saving is not None:  # the loop waits for the write: no kernel runs
                util = rng.uniform(0, 2)
            gpus[g].util = util
            gpus[g].mem_mib = mem * (1 + rng.gauss(0, 0.002))
            sync = util / 100 if len(w.gpus) > 1 and exchange else 0.0
            if p.nvlink_links:
                gpus[g].nvlink_bps = p.nvlink_gbps * GB * 0.35 * sync * self.jitter(0.1)
                gpus[g].pcie_bps = 2 * GB * util / 100
            else:
                gpus[g].pcie_bps = (12 * GB * sync + 2 * GB * util / 100) * self.jitter(0.1)
        fabric = 25 * GB * len(w.gpus) / 8 * self.jitter(0.1) if w.multi_node and not stalled else 0.0
        if saving is not None:
            write = saving * self.jitter(0.05)
        elif w.sync_save:
            write = 0.0
        else:  # asynchronous: written while the GPUs compute
            write = 3 * GB * self.jitter(0.1) if (t % w.checkpoint_period_s) < w.checkpoint_seconds else 0.0
        read = 0.0 if stalled else 0.2 * GB
        return fabric, 0.02 * GB * len(w.gpus) / 8, read, write

    def diurnal(self, w: WorkloadSpec, t: float) -> float:
        """Load factor of online inference at second ``t``: between DIURNAL_FLOOR and 1 over a period."""
        wave = 0.5 + 0.5 * math.sin(2 * math.pi * t / w.diurnal_period_s + w.diurnal_phase)
        return DIURNAL_FLOOR + (1 - DIURNAL_FLOOR) * wave

    def _inference(self, w: WorkloadSpec, t: float, gpus: list[GpuState]) -> tuple[float, float, float, float]:
        """Online: bursty load on a daily cycle, north-south traffic and KV cache following it, a model-load read
        burst at start. Batch: steady high load, no gradient traffic, no checkpoints."""
        p, rng = self.profile, self.rng
        online = w.pattern is Pattern.INFERENCE
        if online:
            load = min(1.0, w.level * self.diurnal(w, t) * math.exp(rng.gauss(0, w.burst_sigma)) / w.speed)
        else:
            load = min(1.0, max(0.0, w.level + rng.gauss(0, w.noise / 100 * 2)))
        mem = w.mem_fraction * p.memory_mib
        for g in w.gpus:
            if online:
                gpu_load = min(1.0, load * self.jitter(0.15))
            else:  # replicas share nothing: each GPU's load wanders on its own around the job's level
                gpu_load = min(1.0, max(0.0, w.level + rng.gauss(0, w.noise / 100 * 2)))
            gpus[g].util = gpu_load * 100
            gpus[g].mem_mib = mem + (0.15 * p.memory_mib * load if online else 0.0)  # KV cache follows load
            gpus[g].pcie_bps = 0.5 * GB * gpu_load
        north = 1.5 * GB * load * len(w.gpus)
        read = 0.3 * GB * load  # batch: reads its input
        if online:
            read = 3 * GB if t < 20 else 0.0  # weights loaded from local NVMe at start
        return 0.0, north, read, 0.0

    def _interactive(self, w: WorkloadSpec, t: float, gpus: list[GpuState]) -> tuple[float, float, float, float]:
        """A notebook: idle most of the time, a cell run now and then."""
        rng = self.rng
        burst = self.episode(w, t, w.cell_rate, (5.0, 30.0))
        for g in w.gpus:
            gpus[g].util = rng.uniform(50, 95) if burst else rng.choice((0.0, 0.0, 1.0))
            gpus[g].mem_mib = w.mem_fraction * self.profile.memory_mib
        return 0.0, 0.01 * GB if burst else 0.0, 0.0, 0.0


_REALISTIC = {
    Pattern.LLM_SERVING: realistic.llm_serving,
    Pattern.LOADER_BOUND_TRAINING: realistic.loader_bound_training,
    Pattern.LORA_FINE_TUNING: realistic.lora_fine_tuning,
    Pattern.EMBEDDING_BATCH: realistic.embedding_batch,
    Pattern.OFFLINE_LLM_BATCH: realistic.offline_llm_batch,
}


# Simulated pods live in a namespace per team, chosen from the workload's name as a platform team would
# name things, so that per-owner views and reports have several owners to show.
_TEAMS = (
    ("research", ("pretrain", "finetune", "train", "ddp", "lora", "rl")),
    ("serving", ("serving", "chat", "-api", "rerank", "embed")),
    ("data-science", ("notebook", "alloc", "jupyter", "explore")),
    ("batch", ("batch", "offline", "eval", "score")),
)


def simulated_namespace(name: str) -> str:
    """The Kubernetes namespace a simulated workload runs in."""
    for team, words in _TEAMS:
        if any(w in name for w in words):
            return f"team-{team}"
    return "team-platform"
