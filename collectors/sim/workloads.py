"""Production behaviours of serving engines and training jobs, for the simulator.

Each model states the assumption it rests on, from how the real systems work; none is fitted to the classifier.

* Continuous-batching LLM servers (vLLM, SGLang, TGI, TensorRT-LLM): the engine steps whenever any request is in
  flight, and NVML's utilisation counts the time any kernel runs, so the GPU reads 85–99 % while requests are in
  flight and ~0 only when none is. The KV cache is preallocated at start (vLLM's ``gpu_memory_utilization`` 0.9),
  so memory sits near 90 % and flat whatever the load. Decode is memory-bound: tensor pipes are lightly used and
  the board draws well under its limit. Text is small on the wire: a few KB per request. Tensor-parallel engines
  all-reduce activations every forward pass, so their GPUs move in lockstep and NVLink bytes follow the batch.
  Small models are served as data-parallel replicas instead (``replicas``: one engine per GPU behind a load
  balancer, as vLLM or SGLang run an 8B model on L4 or L40S cards without NVLink): each replica steps only while
  its own requests are in flight, so each GPU's load comes and goes on its own and nothing crosses PCIe between
  them. Quantised large models (FP8 weights on Hopper, tensor-parallel over 4 GPUs) halve the bytes read per token
  but still read every weight per step: decode stays memory-bound and the engine's behaviour is the same; at
  moderate load (a few requests in flight) the engine idles between them.
* Compute-bound online services (``request_gpu_s``): an image API (diffusers pipelines behind FastAPI, ComfyUI),
  speech recognition (Whisper behind Triton or a FastAPI worker), an embedding or reranking API
  (text-embeddings-inference), a vision model behind Triton. One worker per GPU takes requests from a queue
  (Triton's instance group, one uvicorn worker per device, ComfyUI's prompt queue): a request runs dense kernels
  (a UNet's or an encoder's matmuls) for its GPU time, near the power limit, and the GPU idles until the next
  one; requests that arrive meanwhile wait. An image takes seconds (SDXL at 1024x1024 and 30 steps: 3-5 s on an
  H100, twice that on an L40S, all estimates), a 30 s audio chunk about a second, an embedding batch tens of
  milliseconds, so at 1 Hz the first two read as runs of full seconds between idle ones and the last as a level
  that follows arrivals. Weights and the caching allocator's activations stay resident between requests (flat
  memory). What crosses the front end is the requests and responses: a prompt in and a PNG of 1-2 MB out, audio
  (0.2-1 MB compressed) in and text out, text in and vectors (a few KB as JSON) out.
* Training starved by its input pipeline: every rank waits for its batch, so all GPUs drop to ~0 together and
  compute together; a step repeats with a fixed period (seen at 1 Hz when the step is longer than ~2 s, flat at
  the duty cycle when shorter). Input streams in over the front-end NIC from NFS or object storage.
* Adapter (LoRA) fine-tuning: one GPU, no gradient all-reduce, saves of the adapter only (50–200 MB) at a fixed
  cadence, dense matmuls (near the power limit while busy).
* Batch encoding (sentence-transformers, Hugging Face pipelines, Ray Data ``map_batches`` with an encoder or a
  classifier): one independent replica per GPU, nothing exchanged between them, so each GPU's load dips on its
  own when its next batch is late; dense matmuls near the power limit; the caching allocator holds a fixed batch's
  activations, so memory is flat and no optimiser state ever appears; input read steadily (object storage or NFS
  on the front end, or a local copy), results written steadily (embeddings are about as large as the text they
  encode; scores are bytes), never in checkpoint bursts.
* Offline LLM generation (vLLM's ``LLM`` class or ``vllm run-batch``, SGLang's offline engine): the engine's batch
  stays full while prompts remain, so the GPUs read 92–99 % with a preallocated KV cache (flat memory near 90 %)
  and memory-bound decode; tensor-parallel replicas all-reduce activations as a server does, data-parallel
  replicas run apart. A script feeding prompts in chunks lets each batch drain at the chunk's end (the long
  generations finish last) before the next chunk starts. Prompts and generated text are KB each: little traffic,
  no listening port.
* A node's own traffic, whatever its GPUs do (``Background``): node_exporter, dcgm-exporter and kubelet's
  cAdvisor scraped every 15 or 30 s, a log shipper (fluent-bit, vector, promtail) sending the node's and its
  containers' logs, kubelet's status updates, lease renewals and watches against the API server, journald and
  container logs flushed to disk by the file system's 5 s commit. Together 0.3–1 MB/s out, a tenth of that in.

The rest of the node: GPUs that wait on the CPU, on storage or on a neighbour (optimizer/decide/nodefit.py finds
them; docs/nodefit.md).

* Input-starved training (``input_wait``): a PyTorch DataLoader with too few workers, or too few cores for them,
  decodes and augments (JPEG, audio, video) slower than the GPUs consume batches, so every step waits for its batch
  and NVML, which counts the time a kernel runs, reads the step's compute share: 20–60 %. Steps are sub-second, so
  the 1 Hz reading is level, not dipping. With ``loader_cpu_bound`` the workers keep every core busy whatever the
  GPUs do (host CPU 92–100 %); without it the wait is storage's (the existing loader-bound model). With
  ``storage_read_bps`` the loader reads its dataset over NFS at the mount's limit (~1-2 GB/s for one client over
  one TCP connection, an estimate): the read stream runs at that ceiling every second (1 % spread), whatever the
  GPUs do, and the host's CPUs stay at the GPUs' own level.
* Synchronous checkpointing (``sync_save``): ``torch.save`` or ``torch.distributed.checkpoint.save`` blocks the
  training loop until the model and optimiser state are written: ~16 bytes a parameter with Adam in mixed precision
  (fp16 weights and gradients, fp32 master weights, two fp32 moments), 1.1 TB for a 70B model across the job, each
  node its share, at the volume's write bandwidth; the GPUs idle for the whole write. With
  ``torch.distributed.checkpoint.async_save`` the state is copied to host memory in a second or two and written in
  the background while the GPUs compute (the default model: writes while busy).
* Cold starts (``restart_s``): an autoscaled service (KServe, Knative, a Deployment behind an HPA) starts replicas
  as load rises; a new replica reads its weights (140 GB for a 70B model in FP16) before its GPUs do any work,
  from NFS or object storage at ~1–5 GB/s (30–140 s), or from a local NVMe cache at several GB/s. Memory fills as
  the weights arrive; the GPUs idle until the engine serves.
* Training beside a latency-sensitive service on one node (``exchange_every_s``): a job that accumulates gradients
  exchanges them once per optimizer step, for seconds, over the PCIe switches and host bridge the service's GPUs
  also use (on cards without NVLink). While it does, the service's requests wait for their transfers: each takes
  longer (an estimate: half as long again) and how much longer varies second to second, so the service's per-second
  load is more variable in the windows its neighbour exchanges.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from collectors.sim.spec import GpuState, Node, Pattern, WorkloadSpec

GB = 1e9
MB = 1e6
Traffic = tuple[float, float, float, float, float]  # fabric, north tx, north rx, disk read, disk write (bytes/s)


def _poisson(node: Node, mean: float) -> int:
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


def _decode(
    node: Node,
    states: list[GpuState],
    busy: bool,
    level: float,
    fill: float,
    mem: float,
    parallel: bool,
    host_bps: float,
) -> None:
    """One continuous-batching engine decoding on ``states`` (a server, or an offline replica): memory-bound
    kernels whose power and tensor use grow with ``fill``, the share of its batch slots in use; a tensor-parallel
    engine all-reduces activations every layer, over NVLink where the node has it, else over PCIe (half counted
    on each GPU's link); ``host_bps`` of tokens and control to and from the host while busy."""
    for state in states:
        state.util = level + (node.rng.gauss(0, 0.5) if busy else 0.0)
        state.mem_mib = mem
        state.intensity = 0.35 + 0.35 * fill
        state.tensor_share = 0.15 + 0.2 * fill
        state.dram_share = 0.75
        all_reduce = (0.5 + 6 * fill) * GB * node.jitter(0.1) if (busy and parallel) else 0.0
        host = host_bps if busy else 0.0
        if node.profile.nvlink_links:
            state.nvlink_bps, state.pcie_bps = all_reduce, host
        else:
            state.nvlink_bps, state.pcie_bps = 0.0, all_reduce * 0.5 + host


def llm_serving(node: Node, w: WorkloadSpec, t: float, gpus: list[GpuState]) -> Traffic:
    """A continuous-batching server (or ``replicas`` of it behind a load balancer, each with its share of the
    requests): busy whenever a request is in flight, flat preallocated memory."""
    p, rng = node.profile, node.rng
    arrivals = w.rps_peak * node.diurnal(w, t)
    replicas = max(1, min(w.replicas, len(w.gpus)))
    width = len(w.gpus) // replicas
    mem = w.mem_fraction * p.memory_mib
    for r in range(replicas):
        # slower GPUs hold each request longer
        in_flight = _poisson(node, arrivals / replicas * w.request_s / w.speed)
        fill = min(1.0, in_flight / 64)  # share of the engine's batch slots in use
        busy = in_flight > 0
        level = 86 + 12 * (1 - math.exp(-in_flight / 6)) + rng.gauss(0, 1.0) if busy else rng.choice((0.0, 0.0, 1.0))
        group = [gpus[g] for g in w.gpus[r * width : (r + 1) * width]]
        _decode(node, group, busy, level, fill, mem, width > 1, 0.05 * GB)
    # Prompts in, streamed tokens out (server-sent events): tens of KB per request.
    return 0.0, arrivals * 40e3 * node.jitter(0.2), arrivals * 12e3 * node.jitter(0.2), 0.0, 0.05 * MB


def compute_service(node: Node, w: WorkloadSpec, t: float, gpus: list[GpuState]) -> Traffic:
    """One worker per GPU, each working through its share of the requests one at a time: dense kernels for
    ``request_gpu_s`` per request, idle between requests."""
    p, rng = node.profile, node.rng
    arrivals = w.rps_peak * node.diurnal(w, t) / len(w.gpus)  # the load balancer spreads requests evenly
    requests = 0
    for g in w.gpus:
        state = gpus[g]
        arrived = _poisson(node, arrivals)
        requests += arrived
        work = sum(w.request_gpu_s / w.speed * node.jitter(0.2) for _ in range(arrived))
        busy = node.queue(f"{w.id}:{g}", work)
        state.util = busy * (95 + rng.gauss(0, 1.5)) if busy > 0 else rng.choice((0.0, 0.0, 1.0))
        state.mem_mib = w.mem_fraction * p.memory_mib * (1 + rng.gauss(0, 0.0005))
        state.intensity = w.power_intensity
        state.tensor_share, state.dram_share = w.tensor_share, w.dram_share
        state.pcie_bps = (w.request_bytes[0] + w.request_bytes[1]) * arrived + 0.01 * GB * busy
        state.nvlink_bps = 0.0
    into, out = w.request_bytes
    # the front end carries the requests and their responses, and the worker's access log goes to disk
    return 0.0, out * requests + 2e3, into * requests + 2e3, 0.0, 0.02 * MB


def loader_bound_training(node: Node, w: WorkloadSpec, t: float, gpus: list[GpuState]) -> Traffic:
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


def lora_fine_tuning(node: Node, w: WorkloadSpec, t: float, gpus: list[GpuState]) -> Traffic:
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


def _writeback(t: float, rate: float) -> float:
    """Writes of ``rate`` bytes/s as the page cache flushes them: every 5 s (ext4's commit interval), five
    seconds' worth at once."""
    return 5 * rate if t % 5.0 < 1.0 else 0.0


def embedding_batch(node: Node, w: WorkloadSpec, t: float, gpus: list[GpuState]) -> Traffic:
    """Independent replicas, one per GPU, each dipping on its own when its next batch is late."""
    p, rng = node.profile, node.rng
    active = 0.0
    for g in w.gpus:
        state = gpus[g]
        late = node.episode(w, t, w.stall_rate, w.stall_seconds, key=f"{w.id}:{g}")
        util = rng.uniform(5, 45) if late else w.level * 100 + rng.gauss(0, w.noise)
        state.util = util
        active += max(0.0, min(util, 100.0)) / 100 / len(w.gpus)
        state.mem_mib = w.mem_fraction * p.memory_mib * (1 + rng.gauss(0, 0.0005))
        state.intensity = w.power_intensity
        state.tensor_share, state.dram_share = w.tensor_share, w.dram_share
        state.pcie_bps = 0.05 * GB * util / 100  # token ids or images in, vectors out: no peer traffic
        state.nvlink_bps = 0.0
    intake = w.input_bps * active * node.jitter(0.15)
    output = w.output_bps * active * node.jitter(0.15)
    rx, read = (0.0, intake) if w.input_from_disk else (intake, 0.0)
    if w.save_to_network:  # uploaded in parts of a few MB as they fill: steady at 1 Hz
        return 0.0, output + 0.05 * MB, rx + 0.01 * MB, read, 0.0
    return 0.0, 0.05 * MB, rx + 0.01 * MB, read, _writeback(t, output)


def offline_llm_batch(node: Node, w: WorkloadSpec, t: float, gpus: list[GpuState]) -> Traffic:
    """Tensor-parallel groups of ``w.tp`` GPUs, each a replica working through prompts chunk by chunk."""
    p, rng = node.profile, node.rng
    tp = max(1, min(w.tp, len(w.gpus)))
    chunk = w.chunk_s if w.chunk_s > 0 else math.inf  # 0: one queue of prompts, the batch always full
    mem = w.mem_fraction * p.memory_mib
    written = 0.0
    for r in range(len(w.gpus) // tp):
        group = w.gpus[r * tp : (r + 1) * tp]
        # Replicas start apart (their chunks were of different prompts) and drain at different moments.
        fill = 1.0
        if chunk < math.inf:
            phase = (t + chunk * (r * 0.37 + w.diurnal_phase / (2 * math.pi))) % chunk
            drain = min(25.0, 0.15 * chunk)
            if phase >= chunk - 2.0:  # results detokenised and written, the next chunk tokenised
                fill, written = 0.0, written + 2 * MB
            elif phase >= chunk - 2.0 - drain:
                fill = max(0.02, (chunk - 2.0 - phase) / drain) ** 2  # the long generations finish last
        busy = fill > 0
        level = 86 + 12 * (1 - math.exp(-fill * 64 / 6)) + rng.gauss(0, 1.0) if busy else rng.choice((0.0, 1.0))
        _decode(node, [gpus[g] for g in group], busy, level, fill, mem, tp > 1, 0.02 * GB)
    prompts = w.input_bps * node.jitter(0.3)  # a few KB per prompt, read as the engine takes them
    if w.save_to_network:
        return 0.0, written + 0.02 * MB, prompts, 0.0, 0.0
    return 0.0, 0.02 * MB, 0.01 * MB, prompts, written


@dataclass(frozen=True, slots=True)
class Background:
    """A node's own traffic (the module's last assumption); drawn per node by ``draw_background``."""

    logs_bps: float  # log shipping out
    scrape_bytes: float  # one round of metrics scrapes, gzip-compressed responses
    scrape_s: float
    scrape_offset: float
    control_bps: float  # kubelet and the API server, each way
    journal_bps: float  # logs written to local disk

    def traffic(self, rng: random.Random, t: float) -> tuple[float, float, float, float]:
        """(front-end tx, front-end rx, disk read, disk write) bytes/s at second ``t``."""
        scrape = (t + self.scrape_offset) % self.scrape_s < 1.0
        tx = self.logs_bps * max(0.0, rng.gauss(1, 0.3)) + self.control_bps * max(0.0, rng.gauss(1, 0.5))
        rx = self.control_bps * 1.5 * max(0.0, rng.gauss(1, 0.5)) + 0.02 * self.logs_bps  # watches, acks
        if scrape:
            tx, rx = tx + self.scrape_bytes, rx + 3e3
        return tx, rx, 5e3 * rng.random(), _writeback(t, self.journal_bps)


def draw_background(rng: random.Random) -> Background:
    """Per node: log volume depends on what runs and how verbose it is; exporters' payloads on the number of
    devices and containers."""
    return Background(
        logs_bps=rng.uniform(0.2e6, 0.85e6),
        scrape_bytes=rng.uniform(0.1e6, 0.6e6),
        scrape_s=rng.choice((15.0, 30.0)),
        scrape_offset=rng.uniform(0, 30),
        control_bps=rng.uniform(5e3, 25e3),
        journal_bps=rng.uniform(0.1e6, 1e6),
    )


# ----------------------------------------------------------------------------------------- the rest of the node

CPU_SATURATED = 92.0  # host CPU (%) while a data loader's workers hold every core: their queue never empties
CONTENDED_SLOWDOWN = 1.5  # an estimate: a request's GPU time while a neighbour's exchange holds the PCIe links
CONTENDED_SIGMA = 0.5  # an estimate: how that stretch varies second to second (log-normal sigma)


def starved(w: WorkloadSpec, level: float) -> float:
    """Utilisation (%) of training whose steps wait ``input_wait`` of their time for input."""
    return level * (1 - w.input_wait)


def storage_bound_read(node: Node, w: WorkloadSpec) -> float:
    """Bytes/s a loader bound by its storage reads: the mount's limit, flat (a bandwidth-bound stream never idles)."""
    return w.storage_read_bps * node.jitter(0.01)


def host_cpu(specs: list[WorkloadSpec], cpu: float, rng: random.Random) -> float:
    """The node's CPU (%): ``cpu`` as the GPUs' work leaves it, or saturated where a data loader is CPU-bound."""
    if any(w.loader_cpu_bound and w.input_wait > 0 for w in specs):
        return min(100.0, CPU_SATURATED + abs(rng.gauss(0, 3)))
    return cpu


def synchronous_save(w: WorkloadSpec, t: float) -> float | None:
    """Bytes/s written while a synchronous save of ``save_bytes`` holds the GPUs at second ``t``; None outside."""
    if not w.sync_save or w.save_bytes <= 0:
        return None
    length = w.save_bytes / w.save_write_bps
    return w.save_write_bps if (t - w.checkpoint_offset_s) % w.checkpoint_period_s < length else None


def exchanging(w: WorkloadSpec, t: float) -> bool:
    """Whether training that accumulates gradients is exchanging them at second ``t`` (always, without accumulation)."""
    if w.exchange_every_s <= 0:
        return True
    return t % w.exchange_every_s < w.exchange_s


def loading_weights(node: Node, w: WorkloadSpec, t: float, gpus: list[GpuState]) -> Traffic | None:
    """A starting replica reading its weights at second ``t``: GPUs idle, memory filling; None once it serves."""
    if w.restart_s <= 0 or w.weights_bytes <= 0:
        return None
    length = w.weights_bytes / w.weights_read_bps
    phase = (t - w.restart_offset_s) % w.restart_s
    if phase >= length:
        return None
    for g in w.gpus:
        state = gpus[g]
        state.util = 0.0
        state.mem_mib = w.mem_fraction * node.profile.memory_mib * phase / length
        state.pcie_bps = w.weights_read_bps / len(w.gpus)  # host to device as the shards arrive
        state.nvlink_bps = 0.0
    read = w.weights_read_bps * node.jitter(0.05)
    return (0.0, 0.02 * MB, 0.0, read, 0.0) if w.weights_local else (0.0, 0.02 * MB, read, 0.0, 0.0)


def contended(node: Node, specs: list[WorkloadSpec], gpus: list[GpuState], t: float) -> None:
    """Online services' GPUs while a training neighbour without NVLink exchanges gradients over the shared PCIe."""
    if node.profile.nvlink_links:
        return
    training = [w for w in specs if w.exchange_every_s > 0]
    if not training or not any(exchanging(w, t) for w in training):
        return
    for w in specs:
        if w.listen_ports or w.pattern is Pattern.INFERENCE:
            for g in w.gpus:
                stretch = CONTENDED_SLOWDOWN * math.exp(node.rng.gauss(0, CONTENDED_SIGMA))
                gpus[g].util = min(100.0, gpus[g].util * stretch)
