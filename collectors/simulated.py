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
from enum import StrEnum

from agent.protocol import DiskInfo, GpuInfo, NicInfo, NicKind, NicRole, WorkloadKind, WorkloadRef
from collectors.base import Entity, Inventory, Sample
from collectors.profiles import NodeProfile

GB = 1e9
DAY_S = 86_400.0
DIURNAL_FLOOR = 0.1  # trough / peak of online inference over a day: about 10x


class Pattern(StrEnum):
    """Ground-truth workload patterns; the values match the optimizer's class names where one exists."""

    TRAINING = "training"
    FINE_TUNING = "fine_tuning"
    INFERENCE = "inference"
    BATCH_INFERENCE = "batch_inference"
    INTERACTIVE = "interactive"
    IDLE = "idle"


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A simulated workload. ``level`` is the pattern's utilisation level as a fraction (the peak mean for
    online inference); ``mem_fraction`` the share of each GPU's memory it holds."""

    id: str
    name: str
    pattern: Pattern
    gpus: tuple[int, ...]
    hint: str
    level: float
    mem_fraction: float
    multi_node: bool = False
    checkpoint_period_s: float = 600.0
    checkpoint_seconds: float = 30.0
    stall_rate: float = 0.002  # per second: chance a data-loader stall starts (training)
    stall_seconds: tuple[float, float] = (5.0, 20.0)
    diurnal_phase: float = 0.0
    diurnal_period_s: float = DAY_S
    burst_sigma: float = 0.3  # second-to-second load variation of online inference (log-normal sigma)
    noise: float = 1.5  # utilisation noise, percentage points


@dataclass(slots=True)
class _GpuState:
    util: float = 0.0
    mem_mib: float = 0.0
    nvlink_bps: float = 0.0
    pcie_bps: float = 0.0


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
    ) -> None:
        used = [g for w in workloads for g in w.gpus]
        if len(used) != len(set(used)) or any(g >= profile.gpus for g in used):
            raise ValueError(f"{node}: workloads overlap or exceed the node's {profile.gpus} GPUs")
        self.node = node
        self.profile = profile
        self.specs = list(workloads)
        self.gpu_only = gpu_only  # beside the real NIC and disk collectors of the machine it runs on
        self._clock = clock
        self._rng = random.Random(f"{seed}:{node}")
        self._start = clock()
        self._last = self._start
        self._counters: dict[tuple[str, str], float] = {}
        self._episode_until: dict[str, float] = {}  # per workload: end of a stall or burst

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
        nics = [
            NicInfo(
                name=n.name,
                kind=n.kind,
                role=NicRole.EAST_WEST if n.kind in (NicKind.INFINIBAND, NicKind.ROCE) else NicRole.NORTH_SOUTH,
                speed_mbps=n.speed_mbps,
            )
            for n in p.nics
        ]
        if self.gpu_only:
            return Inventory(gpus=gpus, driver_version="sim", cuda_version="sim")
        return Inventory(
            gpus=gpus,
            nics=nics,
            disks=[DiskInfo(name="nvme0n1", size_bytes=7_680 * 10**9)],
            driver_version="sim",
            cuda_version="sim",
        )

    def workloads(self) -> list[WorkloadRef]:
        return [
            WorkloadRef(
                id=w.id,
                kind=WorkloadKind.KUBERNETES_POD,
                name=w.name,
                gpus=list(w.gpus),
                hint=w.hint,
                owner=simulated_namespace(w.name),
            )
            for w in self.specs
        ]

    def close(self) -> None:
        return None

    def sample(self) -> list[Sample]:
        now = self._clock()
        dt = max(now - self._last, 0.0)
        self._last = now
        t = now - self._start
        p = self.profile
        gpus = [_GpuState() for _ in range(p.gpus)]
        fabric_bps = north_bps = read_bps = write_bps = 0.0
        for w in self.specs:
            f, n, r, wr = self._drive(w, t, gpus)
            fabric_bps += f
            north_bps += n
            read_bps += r
            write_bps += wr

        out: list[Sample] = []
        for i, g in enumerate(gpus):
            util = min(max(g.util, 0.0), 100.0)
            gauges = {
                "util": round(util, 1),
                "mem_util": round(util * 0.6, 1),
                "mem_used_mib": round(g.mem_mib, 0),
                "power_w": round(p.idle_power_w + (p.power_limit_w - p.idle_power_w) * util / 100 * 0.95, 1),
                "temp_c": round(32 + util * 0.4 + self._rng.gauss(0, 0.5), 1),
                "sm_clock_mhz": round(p.max_sm_clock_mhz * (0.95 if util > 1 else 0.1), 0),
            }
            counters = {
                "pcie_tx_bps": self._advance(("gpu", f"{i}.pcie_tx"), g.pcie_bps, dt),
                "pcie_rx_bps": self._advance(("gpu", f"{i}.pcie_rx"), g.pcie_bps, dt),
            }
            if p.nvlink_links:
                counters["nvlink_tx_bps"] = self._advance(("gpu", f"{i}.nvl_tx"), g.nvlink_bps, dt)
                counters["nvlink_rx_bps"] = self._advance(("gpu", f"{i}.nvl_rx"), g.nvlink_bps, dt)
            out.append(Sample(Entity.GPU, str(i), gauges=gauges, counters=counters))
        if self.gpu_only:
            return out

        fabric = [n for n in p.nics if n.kind in (NicKind.INFINIBAND, NicKind.ROCE)]
        front = [n for n in p.nics if n.kind not in (NicKind.INFINIBAND, NicKind.ROCE)]
        for group, total_tx, total_rx in (
            (fabric, fabric_bps, fabric_bps),
            (front, north_bps, north_bps * 0.05),
        ):
            for nic in group:
                tx = total_tx / len(group) * self._jitter(0.05)
                rx = total_rx / len(group) * self._jitter(0.05)
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
        out.append(
            Sample(
                Entity.DISK,
                "nvme0n1",
                counters={
                    "read_bps": self._advance(("disk", "rb"), read_bps, dt),
                    "write_bps": self._advance(("disk", "wb"), write_bps, dt),
                    "read_iops": self._advance(("disk", "ro"), read_bps / 131_072, dt),
                    "write_iops": self._advance(("disk", "wo"), write_bps / 131_072, dt),
                },
            )
        )
        busy = sum(g.util for g in gpus) / max(len(gpus), 1)
        out.append(
            Sample(
                Entity.HOST,
                "host",
                gauges={
                    "cpu_util": round(5 + busy * 0.3 + self._rng.gauss(0, 1) ** 2, 1),
                    "mem_used_pct": 35.0,
                },
            )
        )
        return out

    # ------------------------------------------------------------------ the patterns

    def _jitter(self, sigma: float) -> float:
        return max(0.0, 1.0 + self._rng.gauss(0, sigma))

    def _advance(self, key: tuple[str, str], rate: float, dt: float) -> int:
        total = self._counters.get(key, 0.0) + max(rate, 0.0) * dt
        self._counters[key] = total
        return int(total)

    def _drive(self, w: WorkloadSpec, t: float, gpus: list[_GpuState]) -> tuple[float, float, float, float]:
        """Set GPU state for ``w`` at simulation second ``t``; return (fabric, north, read, write) bytes/s."""
        if w.pattern in (Pattern.TRAINING, Pattern.FINE_TUNING):
            return self._training(w, t, gpus)
        if w.pattern in (Pattern.INFERENCE, Pattern.BATCH_INFERENCE):
            return self._inference(w, t, gpus)
        if w.pattern is Pattern.INTERACTIVE:
            return self._interactive(w, t, gpus)
        for g in w.gpus:  # idle: memory held, nothing running
            gpus[g].util = 0.0
            gpus[g].mem_mib = w.mem_fraction * self.profile.memory_mib
        return 0.0, 0.0, 0.0, 0.0

    def _episode(self, w: WorkloadSpec, t: float, rate: float, seconds: tuple[float, float]) -> bool:
        """True while a random episode (a stall, a burst) of ``w`` lasts; episodes start at ``rate`` per second."""
        until = self._episode_until.get(w.id, -1.0)
        if t >= until and self._rng.random() < rate:
            until = self._episode_until[w.id] = t + self._rng.uniform(*seconds)
        return t < until

    def _training(self, w: WorkloadSpec, t: float, gpus: list[_GpuState]) -> tuple[float, float, float, float]:
        """GPUs in lockstep at the job's level; gradient all-reduce over NVLink (or PCIe) and, for multi-node
        jobs, the fabric; checkpoint write bursts every ``checkpoint_period_s``; data-loader stalls."""
        p, rng = self.profile, self._rng
        stalled = self._episode(w, t, w.stall_rate, w.stall_seconds)
        common = w.level * 100 + rng.gauss(0, w.noise)
        mem = w.mem_fraction * p.memory_mib
        for g in w.gpus:
            util = 3.0 if stalled else common + rng.gauss(0, w.noise * 0.6)
            gpus[g].util = util
            gpus[g].mem_mib = mem * (1 + rng.gauss(0, 0.002))
            sync = util / 100 if len(w.gpus) > 1 else 0.0
            if p.nvlink_links:
                gpus[g].nvlink_bps = p.nvlink_gbps * GB * 0.35 * sync * self._jitter(0.1)
                gpus[g].pcie_bps = 2 * GB * util / 100
            else:
                gpus[g].pcie_bps = (12 * GB * sync + 2 * GB * util / 100) * self._jitter(0.1)
        fabric = 25 * GB * len(w.gpus) / 8 * self._jitter(0.1) if w.multi_node and not stalled else 0.0
        write = 3 * GB * self._jitter(0.1) if (t % w.checkpoint_period_s) < w.checkpoint_seconds else 0.0
        read = 0.0 if stalled else 0.2 * GB
        return fabric, 0.02 * GB * len(w.gpus) / 8, read, write

    def diurnal(self, w: WorkloadSpec, t: float) -> float:
        """Load factor of online inference at second ``t``: between DIURNAL_FLOOR and 1 over a period."""
        wave = 0.5 + 0.5 * math.sin(2 * math.pi * t / w.diurnal_period_s + w.diurnal_phase)
        return DIURNAL_FLOOR + (1 - DIURNAL_FLOOR) * wave

    def _inference(self, w: WorkloadSpec, t: float, gpus: list[_GpuState]) -> tuple[float, float, float, float]:
        """Online: bursty load on a daily cycle, north-south traffic and KV cache following it, a model-load read
        burst at start. Batch: steady high load, no gradient traffic, no checkpoints."""
        p, rng = self.profile, self._rng
        online = w.pattern is Pattern.INFERENCE
        if online:
            load = min(1.0, w.level * self.diurnal(w, t) * math.exp(rng.gauss(0, w.burst_sigma)))
        else:
            load = min(1.0, max(0.0, w.level + rng.gauss(0, w.noise / 100 * 2)))
        mem = w.mem_fraction * p.memory_mib
        for g in w.gpus:
            gpu_load = min(1.0, load * self._jitter(0.15)) if online else load
            gpus[g].util = gpu_load * 100
            gpus[g].mem_mib = mem + (0.15 * p.memory_mib * load if online else 0.0)  # KV cache follows load
            gpus[g].pcie_bps = 0.5 * GB * gpu_load
        north = 1.5 * GB * load * len(w.gpus)
        read = 0.3 * GB * load  # batch: reads its input
        if online:
            read = 3 * GB if t < 20 else 0.0  # weights loaded from local NVMe at start
        return 0.0, north, read, 0.0

    def _interactive(self, w: WorkloadSpec, t: float, gpus: list[_GpuState]) -> tuple[float, float, float, float]:
        """A notebook: idle most of the time, a cell run now and then."""
        rng = self._rng
        burst = self._episode(w, t, 0.03, (5.0, 30.0))
        for g in w.gpus:
            gpus[g].util = rng.uniform(50, 95) if burst else rng.choice((0.0, 0.0, 1.0))
            gpus[g].mem_mib = w.mem_fraction * self.profile.memory_mib
        return 0.0, 0.01 * GB if burst else 0.0, 0.0, 0.0


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
