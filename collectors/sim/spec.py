"""What the simulated node and the workload models share: the workload's description, one GPU's
state and the node as the workload models see it."""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from collectors.sim.profiles import NodeProfile

DAY_S = 86_400.0


class Node(Protocol):
    """The simulated node as the workload models see it (collectors/sim/node.py)."""

    profile: NodeProfile
    rng: random.Random

    def jitter(self, sigma: float) -> float: ...

    def episode(
        self, w: WorkloadSpec, t: float, rate: float, seconds: tuple[float, float], key: str | None = None
    ) -> bool: ...

    def diurnal(self, w: WorkloadSpec, t: float) -> float: ...

    def queue(self, key: str, arrived: float) -> float: ...


class Pattern(StrEnum):
    """Ground-truth workload patterns; the values match the optimizer's class names where one exists."""

    TRAINING = "training"
    FINE_TUNING = "fine_tuning"
    INFERENCE = "inference"
    BATCH_INFERENCE = "batch_inference"
    INTERACTIVE = "interactive"
    IDLE = "idle"
    # Production behaviours (collectors/sim/workloads.py): what real serving engines and training jobs look like.
    LLM_SERVING = "llm_serving"  # continuous batching (vLLM, SGLang, TGI, TensorRT-LLM), tensor-parallel or not
    LOADER_BOUND_TRAINING = "loader_bound_training"  # training starved by its input pipeline
    LORA_FINE_TUNING = "lora_fine_tuning"  # adapter fine-tuning on one GPU, small saves
    EMBEDDING_BATCH = "embedding_batch"  # data-parallel batch encoding or scoring, one replica per GPU
    OFFLINE_LLM_BATCH = "offline_llm_batch"  # offline LLM generation (vLLM's LLM class, run-batch)


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
    cell_rate: float = 0.03  # notebook: per second, chance a cell run starts
    # How hard the work drives the GPU: share of (limit - idle) power drawn at 100 % utilisation. Dense matmuls
    # (training, embeddings) run near the limit; memory-bound decode keeps kernels running at far lower power.
    power_intensity: float = 0.95
    tensor_share: float = 0.6  # GPM tensor-pipe activity as a share of utilisation (Hopper and newer)
    dram_share: float = 0.4  # GPM DRAM bandwidth utilisation as a share of utilisation
    program: str | None = None  # what a schema-2 agent reads from the command line
    listen_ports: tuple[int, ...] = ()
    peers: int = 0  # distinct clients holding connections to a server at peak
    input_bps: float = 0.0  # per node: training / batch input read rate (NFS or object storage on the front end)
    save_bytes: float = 0.0  # per checkpoint; 0: the pattern's default
    save_to_network: bool = False  # checkpoints go to shared storage over the front end, not to local disks
    step_s: float = 4.0  # loader-bound training: one step's period
    duty: float = 0.4  # loader-bound training: share of a step the GPUs compute
    client_scale: float = 1.0  # online inference: client traffic relative to the textbook 1.5 GB/s per GPU at peak
    rps_peak: float = 20.0  # LLM serving: requests per second at the daily peak
    request_s: float = 8.0  # LLM serving: seconds a request stays in flight (prefill + decode)
    output_bps: float = 0.0  # batch encoding: results written per node at full load
    input_from_disk: bool = False  # batch: input staged on local disks rather than read over the front end
    tp: int = 1  # offline LLM generation: tensor-parallel degree of each replica
    chunk_s: float = 0.0  # offline LLM generation: seconds per chunk of prompts (0: one never-ending chunk)
    replicas: int = 1  # LLM serving: engines behind one load balancer, each on len(gpus) / replicas GPUs
    request_gpu_s: float = 0.0  # compute-bound online service: GPU seconds of dense work per request (0: not one)
    request_bytes: tuple[float, float] = (0.0, 0.0)  # compute-bound online service: bytes in and out per request
    speed: float = 1.0  # how fast its GPUs serve its load against those it was sized on (collectors/sim/speed.py)
    # The rest of the node (collectors/sim/workloads.py, "the rest of the node"); the defaults change nothing.
    input_wait: float = 0.0  # training: share of each step its GPUs wait for the next batch
    loader_cpu_bound: bool = False  # that wait is the data loader's workers holding every host CPU
    storage_read_bps: float = 0.0  # or storage's: its input read over NFS at the mount's limit, bytes/s (0: not)
    sync_save: bool = False  # training: checkpoints written with the GPUs waiting (torch.save, DCP without async_save)
    save_write_bps: float = 3e9  # the checkpoint volume's write bandwidth (a synchronous save's length)
    checkpoint_offset_s: float = 0.0  # seconds into each checkpoint period a synchronous save starts
    restart_s: float = 0.0  # online inference: a replica starts every restart_s seconds (0: none starts)
    restart_offset_s: float = 0.0  # seconds into each such period a replica starts
    weights_bytes: float = 0.0  # what a starting replica reads before it serves
    weights_read_bps: float = 2e9  # how fast it reads them
    weights_local: bool = False  # from a local NVMe cache (disk reads), not NFS or object storage (front end)
    exchange_every_s: float = 0.0  # training: one gradient exchange per optimizer step this long (0: every second)
    exchange_s: float = 0.0  # how long that exchange holds the PCIe links


@dataclass(slots=True)
class GpuState:
    util: float = 0.0
    mem_mib: float = 0.0
    nvlink_bps: float = 0.0
    pcie_bps: float = 0.0
    intensity: float = 0.95
    tensor_share: float = 0.6
    dram_share: float = 0.4
