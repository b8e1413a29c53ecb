"""Production behaviours of serving engines and training jobs, for the simulator.

Each model states the assumption it rests on, from how the real systems work; none is fitted to the classifier.

* Continuous-batching LLM servers (vLLM, SGLang, TGI, TensorRT-LLM): the engine steps whenever any request is in
  flight, and NVML's utilisation counts the time any kernel runs, so the GPU reads 85–99 % while requests are in
  flight and ~0 only when none is. The KV cache is preallocated at start (vLLM's ``gpu_memory_utilization`` 0.9),
  so memory sits near 90 % and flat whatever the load. Decode is memory-bound: tensor pipes are lightly used and
  the board draws well under its limit. Text is small on the wire: a few KB per request. Tensor-parallel engines
  all-reduce activations every forward pass, so their GPUs move in lockstep and NVLink bytes follow the batch.
* Training starved by its input pipeline: every rank waits for its batch, so all GPUs drop to ~0 together and
  compute together; a step repeats with a fixed period (seen at 1 Hz when the step is longer than ~2 s, flat at
  the duty cycle when shorter). Input streams in over the front-end NIC from NFS or object storage.
* Adapter (LoRA) fine-tuning: one GPU, no gradient all-reduce, saves of the adapter only (50–200 MB) at a fixed
  cadence, dense matmuls (near the power limit while busy).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collectors.simulated import SimulatedNode, WorkloadSpec, _GpuState

GB = 1e9
MB = 1e6
Traffic = tuple[float, float, float, float, float]  # fabric, north tx, north rx, disk read, disk write (bytes/s)


def _poisson(node: SimulatedNode, mean: float) -> int:
    """A Poisson draw (normal approximation above 30)."""
    rng = node.rng
    if mean > 30:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def llm_serving(node: SimulatedNode, w: WorkloadSpec, t: float, gpus: list[_GpuState]) -> Traffic:
    """A continuous-batching server: busy whenever a request is in flight, flat preallocated memory."""
    p, rng = node.profile, node.rng
    arrivals = w.rps_peak * node.diurnal(w, t)
    in_flight = _poisson(node, arrivals * w.request_s / w.speed)  # slower GPUs hold each request longer
    fill = min(1.0, in_flight / 64)  # share of the engine's batch slots in use
    busy = in_flight > 0
    level = 86 + 12 * (1 - math.exp(-in_flight / 6)) + rng.gauss(0, 1.0) if busy else rng.choice((0.0, 0.0, 1.0))
    mem = w.mem_fraction * p.memory_mib
    tp = len(w.gpus) > 1
    for g in w.gpus:
        state = gpus[g]
        state.util = level + (rng.gauss(0, 0.5) if busy else 0.0)
        state.mem_mib = mem
        state.intensity = 0.35 + 0.35 * fill
        state.tensor_share = 0.15 + 0.2 * fill
        state.dram_share = 0.75
        all_reduce = (0.5 + 6 * fill) * GB * node.jitter(0.1) if (busy and tp) else 0.0
        if p.nvlink_links:
            state.nvlink_bps = all_reduce
            state.pcie_bps = 0.05 * GB if busy else 0.0
        else:
            state.pcie_bps = all_reduce * 0.5 + (0.05 * GB if busy else 0.0)
    # Prompts in, streamed tokens out (server-sent events): tens of KB per request.
    return 0.0, arrivals * 40e3 * node.jitter(0.2), arrivals * 12e3 * node.jitter(0.2), 0.0, 0.05 * MB


def loader_bound_training(node: SimulatedNode, w: WorkloadSpec, t: float, gpus: list[_GpuState]) -> Traffic:
    """Ranks compute for ``duty`` of each ``step_s`` and wait for input together the rest of it."""
    p, rng = node.profile, node.rng
    if w.step_s < 2.0:  # several steps per NVML sample: the reading averages to the duty cycle
        computing, level = True, w.duty * 96 + rng.gauss(0, w.noise)
    else:
        phase = (t % w.step_s) / w.step_s
        computing, level = phase < w.duty, 94 + rng.gauss(0, w.noise)
    mem = w.mem_fraction * p.memory_mib
    share = w.duty if w.step_s < 2.0 else (1.0 if computing else 0.0)
    for g in w.gpus:
        state = gpus[g]
        state.util = level + rng.gauss(0, 0.6) if computing else rng.uniform(0, 3)
        state.mem_mib = mem * (1 + rng.gauss(0, 0.001))
        state.intensity = w.power_intensity
        state.tensor_share, state.dram_share = w.tensor_share, w.dram_share
        sync = (1 + 3 * rng.random()) * GB * share if len(w.gpus) > 1 else 0.0  # all-reduce at 1-4 GB/s
        if p.nvlink_links:
            state.nvlink_bps, state.pcie_bps = sync, 0.3 * GB * share
        else:
            state.pcie_bps = sync + 0.3 * GB * share
    fabric = 2 * GB * share * len(w.gpus) / 8 * node.jitter(0.1) if w.multi_node else 0.0
    save = w.save_bytes or 20 * GB
    write = min(2 * GB, save) if (t % w.checkpoint_period_s) < max(1.0, save / (2 * GB)) else 0.0
    return fabric, 2 * MB, w.input_bps * node.jitter(0.15), 0.0, write


def lora_fine_tuning(node: SimulatedNode, w: WorkloadSpec, t: float, gpus: list[_GpuState]) -> Traffic:
    """One GPU, steady dense compute, an adapter saved every ``checkpoint_period_s``."""
    p, rng = node.profile, node.rng
    stalled = node.episode(w, t, w.stall_rate, w.stall_seconds)
    for g in w.gpus:
        state = gpus[g]
        state.util = rng.uniform(0, 4) if stalled else w.level * 100 + rng.gauss(0, w.noise)
        state.mem_mib = w.mem_fraction * p.memory_mib * (1 + rng.gauss(0, 0.001))
        state.intensity = w.power_intensity
        state.tensor_share, state.dram_share = w.tensor_share, w.dram_share
        state.pcie_bps = 0.2 * GB * (0 if stalled else w.level)
    save = w.save_bytes or 120 * MB
    write = save if (t % w.checkpoint_period_s) < 1.0 else 0.0
    return 0.0, 0.1 * MB, 0.5 * MB, 0.0, write
