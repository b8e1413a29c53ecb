"""Workload classification: evidence from how real systems behave, weighed openly, with an honest "unknown".

Each signal adds log-odds (in nats) for or against the classes it bears on; the weights come from how the
systems work, written beside each rule, not from fitting to a simulator. A class's confidence is its share of
the evidence (a softmax over the classes), reduced while little data has been seen. When the two best classes
are close, the answer is ``unknown`` with both sides in the evidence: a planner never acts on a coin toss.

What the rules assume about real systems:

* NVML's utilisation is the share of time any kernel ran. A continuous-batching LLM server (vLLM, SGLang, TGI,
  TensorRT-LLM) reads 85-99 % whenever a request is in flight, so a high level says nothing about training.
* Dense training (and embedding or scoring batches) runs tensor-core matmuls and draws close to the power limit
  when busy; decode is memory-bound and draws far less at the same utilisation. GPM (Hopper and newer) shows the
  same split directly: tensor-pipe activity against DRAM bandwidth.
* A training step repeats with a fixed period (compute, all-reduce, wait for the next batch), so per-second load
  has an autocorrelation peak at the step; serving follows arrivals and notebooks run cells at random.
* Training saves checkpoints at a cadence; even an adapter save (50-200 MB) stands out from a node's usual
  writes. Serving writes logs.
* A server listens on a port and holds connections from clients; a training job's only listeners are its
  rendezvous ports (excluded by the agent) and a notebook's is one browser.
* Training and batch jobs read input steadily (NFS or object storage on the front end, or local disks); an LLM
  server's text traffic is a few MB/s.
* A node sends traffic of its own whatever its GPUs do (scrapes, log shipping, kubelet: 0.3-1 MB/s); features take
  it off (optimizer/decide/features.py), and traffic counts as a workload's only where it is the workload's own
  (its pod's network namespace) or what is left once the node's own is known.
* A request in flight holds its connection open (a pending response, streamed tokens), so a server busy half the
  time or more always has clients connected; a workload busy with no inbound connection is working through input.
* Requests to a model run kernels: an allocation whose GPUs did nothing at all served nobody, whatever its node
  sent meanwhile.
* Batch inference exchanges nothing between its GPUs: independent replicas, each dipping on its own when its next
  input is late, where data-parallel training's ranks wait for each other every step. It writes its results as it
  goes (steadily), where training writes in checkpoint bursts.
* An online service works when its requests come: whatever the model (an LLM decoding, a diffusion pipeline
  drawing an image at the power limit, Whisper transcribing a chunk, an encoder embedding text), a worker runs
  while a request is in flight and idles until the next, and requests from many clients arrive at random, so
  its runs of work start often and after idle gaps as irregular as the arrivals. A notebook's cells come minutes
  apart; a training step repeats. Power and tensor activity say what shape the work is (compute- or
  memory-bound), not whether it is served: they weigh little between serving and training.
* Process names are hints: ``comm`` is cut at 15 characters and is ``python3`` for most Python programs; the
  command line's program (schema 2) is better, but an engine such as vLLM also runs offline batches.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from agent.protocol import WorkloadClass
from optimizer.decide.features import WorkloadFeatures
from optimizer.decide.shape import gpm_memory_share, shape_reading

MIN_WINDOWS = 3
FULL_CONFIDENCE_WINDOWS = 6
UNSURE_MARGIN = 0.7  # nats between the two best classes below which the answer is "unknown"
UNSEEN_CONFIDENCE = 0.55  # at most, for a class nothing only it does was seen in: under the planner's 0.6
# Work that starts this often a minute (distinct seconds at which one of its GPUs goes from idle to busy), after
# idle gaps this irregular (their coefficient of variation), is requests arriving: a person running notebook
# cells starts one every minute or few (the simulator's cells: 0.2-0.6 a minute), and a step loop's gaps repeat
# (coefficient near 0), where gaps between independent arrivals are exponential (coefficient 1), or as irregular
# as whole idle seconds let them be (_arrival_gap_cv); half of that is the bar.
REQUEST_STARTS_PER_MIN = 1.5
REQUEST_GAP_CV = 0.5  # of the variation random arrivals give
# A notebook cell that uses the GPU (a forward pass over a batch, a few training steps) keeps its kernels running for
# seconds to minutes at a level a model's matmuls reach (an estimate; 5 s is the shortest such run counted); an
# abandoned allocation reads 0 % every second. Work this long at this level between idle minutes is someone at a
# kernel, not an allocation to reclaim.
CELL_SECONDS = 5
CELL_LEVEL = 30.0
PARTIAL_BATCH_LEVEL = 95.0  # % busy, below which a memory-bound engine's batch is not full
# GPM's tensor-pipe share of busy time up to which decode runs a partly filled batch: one sequence reads every weight
# for a row of multiply-adds, and each sequence batched with it reuses the same read, so tensor activity grows with
# the batch while DRAM stays the bound (an estimate from the roofline, the bar this rule held before it read the
# share). Partly filled is serving's lean (its batch follows the requests in flight); full, serving at peak and
# offline generation alike.
PARTIAL_BATCH_TENSOR = 0.32
DECODE_SHARE = 0.55  # memory-bound share of GPU time (optimizer/decide/shape.py) from which the work is decode
COMPUTE_SHARE = 0.35  # and up to which it is dense compute (an image, speech or encoder model), for the headline
# Without utilisation (an A100 or A30 in MIG mode: NVML has none per instance, and GPM, which would sample each,
# came with Hopper) a class rests on memory held, processes and traffic. It is shown, never acted on (under the
# planner's 0.6): the planner cannot project onto other hardware a load nobody measured.
UTIL_UNAVAILABLE_CONFIDENCE = 0.5
# Load read only while its GPUs were held below their clocks (heat, a lowered power limit, the power brake) is more
# than the work needs on a GPU running at its clocks: the class may stand, a move sized on that load may not.
THROTTLED_LOAD_CONFIDENCE = 0.55

TR, INF, BAT, NB = (
    WorkloadClass.TRAINING,
    WorkloadClass.INFERENCE,
    WorkloadClass.BATCH_INFERENCE,
    WorkloadClass.INTERACTIVE,
)
CLASSES = (TR, INF, BAT, NB)

# Names as the kernel (``comm``, 15 characters, process titles such as ``VLLM::EngineCore``) or the command line
# shows them. Matched as tokens anywhere in the lowered name.
SERVING_NAMES = (
    "vllm",
    "sglang",
    "text-generation",
    "tgi",
    "tritonserver",
    "trtllm-serve",
    "lmdeploy",
    "ollama",
    "llama-server",
    "torchserve",
    "serve",
    "uvicorn",
    "gunicorn",
    "api_server",
)
TRAINING_NAMES = (
    "torchrun",
    "deepspeed",
    "accelerate",
    "megatron",
    "pretrain",
    "train",
    "finetune",
    "fine_tune",
    "lora",
    "llamafactory",
    "axolotl",
    "horovodrun",
    "nemo",
)
NOTEBOOK_NAMES = ("ipykernel", "jupyter", "ipython", "colab")
BATCH_NAMES = ("batch", "score", "embed", "generate", "offline", "predict", "infer")
GENERIC_NAMES = frozenset({"python", "python3", "pt_main_thread", "bash", "sh"})


@dataclass(frozen=True, slots=True)
class Classification:
    workload_class: WorkloadClass
    confidence: float
    evidence: tuple[str, ...]


def _gbps(value: float) -> str:
    if value >= 1e8:
        return f"{value / 1e9:.1f} GB/s"
    return f"{value / 1e6:.0f} MB/s" if value >= 1e6 else f"{value / 1e3:.0f} KB/s"


def _matches(name: str | None, tokens: tuple[str, ...]) -> bool:
    if not name:
        return False
    lowered = name.lower()
    return any(re.search(rf"(^|[^a-z]){re.escape(t)}", lowered) for t in tokens)


@dataclass(slots=True)
class _Ledger:
    scores: dict[WorkloadClass, float]
    reasons: dict[WorkloadClass, list[tuple[float, str]]]

    def add(self, reason: str, **weights: float) -> None:
        """``weights`` by class initial (T training, I inference, B batch, N notebook), in nats."""
        for key, weight in weights.items():
            c = {"T": TR, "I": INF, "B": BAT, "N": NB}[key]
            self.scores[c] += weight
            if weight > 0:
                self.reasons[c].append((weight, reason))


def _names(f: WorkloadFeatures, led: _Ledger) -> None:
    """The program (schema 2) or the process name: moderate evidence, never decisive alone."""
    name = f.program or f.hint
    what = f"program {f.program}" if f.program else f"process {f.hint}"
    if not name or name.lower() in GENERIC_NAMES:
        return
    strong = 1.0 if f.program else 0.7  # comm is cut and often generic; the command line is not
    if _matches(name, NOTEBOOK_NAMES):
        led.add(f"{what} (a notebook kernel)", N=2.0 * strong, T=-0.5)
    elif _matches(name, TRAINING_NAMES):
        led.add(f"{what} (a training launcher or script)", T=1.8 * strong, I=-0.5)
    elif _matches(name, SERVING_NAMES):
        # Engines also run offline batches (vLLM's LLM class), so batch keeps some of the weight.
        led.add(f"{what} (a serving engine)", I=1.6 * strong, B=0.6 * strong, T=-0.8)
    elif _matches(name, BATCH_NAMES):
        led.add(f"{what} (a batch script)", B=1.2 * strong)


def _server(f: WorkloadFeatures, led: _Ledger) -> None:
    """Listening ports and their clients (schema 2)."""
    if f.inbound_connections is None:
        return
    ports = ", ".join(f":{p}" for p in f.listen_ports[:3])
    peers, connections = f.inbound_peers or 0, f.inbound_connections
    if f.listen_ports and peers >= 3:
        led.add(f"listening on {ports} with {connections} connections from {peers} clients", I=2.5, B=-1.0, T=-1.5)
    elif f.listen_ports and connections >= 1:
        led.add(f"listening on {ports} with {connections} connection(s) from {peers} client(s)", I=0.8, N=0.8)
    elif f.mean_util >= 50:
        # Busy half the time or more, a server has requests in flight at nearly every moment, each holding a
        # connection, whenever the agent reads the table. This says what the work is not, not which of training or
        # batch it is.
        led.add(f"{f.mean_util:.0f} % busy with no client connected to it (no requests in flight)", I=-2.0)
    else:
        led.add("no client connections to any port", I=-1.0)


def _level(f: WorkloadFeatures, led: _Ledger) -> None:
    """Utilisation level and second-to-second shape."""
    util = f"GPUs {f.mean_util:.0f} % busy on average (p95 {f.p95_util:.0f} %)"
    steady = f.busy_cv < 0.1
    if f.mean_util >= 70:
        # Uninformative among the three: training, batch jobs and a continuous-batching server at load all keep
        # kernels running nearly every second.
        shape = f", steady while busy (variation {f.busy_cv:.0%})" if steady else ""
        led.add(f"{util}{shape}", T=0.5, B=0.5, I=0.5)
    elif 50 <= f.mean_util < 70 and steady and f.zero_seconds < 0.1:
        # Serving below saturation follows its arrivals; a steady middle level is a job held back at a fixed rate.
        led.add(f"{util}, steady while busy (variation {f.busy_cv:.0%})", T=0.4, B=0.4, I=-0.3)
    elif f.mean_util < 70 and f.busy_cv >= 0.15 and f.period_s is None and f.zero_seconds < 0.4:
        led.add(f"{util}, load varying with requests (variation {f.busy_cv:.0%})", I=1.5, T=-0.5, B=-0.5)
    elif f.mean_util < 50:
        led.add(util, I=0.3)
    if f.zero_seconds >= 0.4 and _cell_run(f) and f.period_s is None:
        line = f"idle {f.zero_seconds:.0%} of seconds, bursts at {f.busy_level:.0f} % in between"
        led.add(line, N=2.0, I=0.3, B=-1.0)
    if _requests(f):
        line = (
            f"work starts {f.starts_per_min:.1f} times a minute after irregular idle gaps (variation {f.gap_cv:.0%}),"
            f" runs of {f.run_s:.0f} s, no step period: load that follows requests"
        )
        led.add(line, I=2.0, N=-1.5, T=-0.5, B=-0.5)
    if f.period_s is not None:
        led.add(
            f"load repeats every {f.period_s} s (autocorrelation {f.period_strength:.2f}): a training step",
            T=2.2,
            I=-1.0,
            N=-1.5,
            B=-0.5,
        )


def _power(f: WorkloadFeatures, led: _Ledger) -> None:
    """How hard the busy GPUs work: power per unit of utilisation, and GPM's tensor against DRAM activity."""
    if f.tensor_share is not None and f.dram_share is not None:
        if f.tensor_share >= 0.4:
            # Embedding and scoring batches are dense too; offline LLM generation, like serving, is not.
            # Image, speech, embedding and vision services run dense kernels too: only LLM decode is not.
            led.add(f"tensor pipes {f.tensor_share:.0%} of busy time (dense matmuls)", T=1.0, B=0.5, I=-0.3)
        elif f.dram_share >= 0.55 and gpm_memory_share(f.tensor_share, f.dram_share) >= DECODE_SHARE:
            # Read as a share, as shape.py reads it: a full decode batch keeps the tensor pipes busier than a single
            # stream (more sequences per weight read) while DRAM stays the bound.
            line = f"memory-bound: DRAM {f.dram_share:.0%}, tensor pipes {f.tensor_share:.0%} of busy time (decode)"
            if f.tensor_share > PARTIAL_BATCH_TENSOR:
                # Its batch full: an engine serving at peak and one generating offline (vLLM's server and its LLM
                # class run the same engine) read alike; clients, traffic and load that follows requests tell them.
                led.add(f"{line}, its batch full", I=0.7, B=0.7, T=-1.0)
            elif f.intensity is not None and f.intensity <= 0.68:
                # The power sensor agrees with the profiling counters: one fact, measured twice, surer but not
                # twice the evidence. (Dense compute is not weighed up so: training, batch and services share it.)
                line += f", power {f.intensity:.0%} of what its utilisation allows"
                led.add(line, I=1.5, B=0.4, T=-1.5)
            else:
                led.add(line, I=1.0, B=0.4, T=-1.0)
    shape = shape_reading(f)
    if shape is not None and shape[0] >= DECODE_SHARE and f.mean_util >= 70 and f.busy_level < PARTIAL_BATCH_LEVEL:
        # A continuous-batching engine reads 86 % with one request in flight and ~98 % with its batch full (the
        # simulator's model of vLLM and SGLang, an estimate); an offline batch keeps its batch full while prompts
        # remain.
        line = (
            f"memory-bound ({shape[1]}) at {f.busy_level:.0f} % while busy: a decode batch partly filled, following"
            " the requests in flight"
        )
        led.add(line, I=1.0, B=-0.5)
    if f.intensity is None or (f.tensor_share is not None and f.dram_share is not None):
        # GPM (or DCGM's profiling fields) measured the shape above; power measures the same thing less directly,
        # and counting both would weigh one fact twice
        return
    if f.intensity >= 0.78:
        line = f"draws {f.intensity:.0%} of the power its utilisation allows (compute-bound)"
        led.add(line, T=1.0, B=0.5, I=-0.3)
    elif f.intensity <= 0.68:
        led.add(f"draws only {f.intensity:.0%} of the power its utilisation allows (memory-bound)", I=1.0, T=-1.2)


def _traffic(f: WorkloadFeatures, led: _Ledger) -> None:
    """Gradient synchronisation, input streams and client traffic."""
    together = f.lockstep is not None and f.lockstep >= 0.7
    if f.gpu_link_bps >= 20e9 or f.east_west_bps >= 1e9:
        line = f"{_gbps(f.gpu_link_bps)} per GPU over NVLink/PCIe and {_gbps(f.east_west_bps)} on the fabric"
        led.add(f"{line}: gradient synchronisation", T=2.0, I=-0.3, B=-1.0)
    elif (
        f.gpus > 1
        and f.mean_util >= 70
        and f.gpu_link_bps < 2e9
        and f.east_west_bps < 1e8
        and not together
        and not _replicas(f)
    ):
        # GPUs whose load moves as one are in collectives however few bytes those carry (tensor-parallel decode at
        # a small batch exchanges ~1 GB/s per GPU), so few bytes say nothing against them.
        # Data-parallel training all-reduces its gradients every step: tens of GB/s at this level of work. GPUs
        # moving apart (_together) say the same of the same GPUs better: counted once.
        led.add(
            f"all {f.gpus} GPUs busy without gradient exchange ({_gbps(f.gpu_link_bps)} per GPU)", B=1.0, I=0.3, T=-1.0
        )
    _together(f, led)
    if f.multi_node:
        led.add(f"one job across {len(f.placements)} nodes", T=1.5)
    # Disks are the node's, and so are its NICs outside a pod's own network namespace: shared among workloads by
    # how traffic follows each one's load, which cannot tell workloads apart whose load is flat alike. Where others
    # do a good part of the node's GPU work, those figures are the node's, not evidence about this workload.
    alone = f.node_share >= 0.75
    network = f.own_network or alone
    ingress, egress = (f.ingress_bps, f.egress_bps) if network else (0.0, 0.0)
    # Small flows count only once the node's own is measured (its quiet windows), not estimated from other nodes.
    small = f.own_network or (alone and f.baseline_from == "node")
    # Responses go back over connections clients opened; with schema 2 and none, what leaves is uploads.
    clients = bool(f.listen_ports and (f.inbound_peers or 0) >= 3)
    could_serve = f.inbound_connections is None or clients
    # With clients connected to it, what arrives on the front end is their requests (text to embed, images to read,
    # audio to transcribe: an embedding or Triton server takes in more than it sends back), not input it fetches.
    intake = (0.0 if clients else ingress) + (f.disk_read_bps if alone else 0.0)
    if intake >= 10e6 and (intake >= egress or not could_serve):
        led.add(f"reads its input steadily ({_gbps(intake)} per GPU)", T=0.8, B=1.0, I=-0.8)
    elif egress >= 50e6 and could_serve:
        led.add(f"north-south traffic {_gbps(egress)} per GPU out (responses)", I=1.0, B=-0.3)
    elif egress >= 20e3 and f.mean_util >= 30 and could_serve and small:
        # Streamed tokens are small (tens of bytes each) but a busy server always has some on the wire.
        led.add(f"client-sized traffic on the front end ({_gbps(egress)} per GPU out)", I=0.8)
    elif f.mean_util >= 50 and alone and f.node_front_bps < 5e3 and intake < 1e6:
        # Busy with nothing coming in or going out: a job working through what it already holds.
        beyond = " beyond the node's own" if f.front_baseline_bps else ""
        led.add(f"busy with no front-end traffic{beyond} (no clients)", B=0.5, T=0.3, I=-0.7)
    if egress >= 1e6 and not could_serve and intake < 10e6:
        led.add(f"sends {_gbps(egress)} per GPU out with no client connected: results uploaded", B=0.6, I=-0.3)


def _together(f: WorkloadFeatures, led: _Ledger) -> None:
    """Whether its GPUs' load rises and falls together: collectives (the all-reduce of data-parallel training, of
    tensor-parallel activations) make every rank wait for the slowest, so their load moves as one; replicas that
    exchange nothing dip on their own."""
    if f.lockstep is not None and f.mean_util >= 50:
        if f.lockstep >= 0.7:
            line = f"its {f.gpus} GPUs' load rises and falls together (correlation {f.lockstep:.2f})"
            # Data-parallel training and tensor-parallel serving alike.
            led.add(f"{line}: ranks waiting for each other in collectives", T=0.6, I=0.5, B=-0.3)
        elif _replicas(f):
            line = f"each of its {f.gpus} GPUs' load moves on its own (correlation {f.lockstep:.2f})"
            led.add(f"{line}: independent replicas, no collectives", B=1.2, I=0.2, T=-1.5)
        return
    if f.gpus > 1 and f.gpu_link_bps >= 0.5e9 and f.gpu_spread < 0.15 and (f.busy_cv >= 0.05 or f.zero_seconds >= 0.1):
        # Only telling where the load moves: at a steady 90 % every workload's GPUs look alike.
        line = f"all {f.gpus} GPUs move in lockstep exchanging {_gbps(f.gpu_link_bps)} per GPU"
        led.add(f"{line} (all-reduce of gradients or of tensor-parallel activations)", T=0.6, I=0.4, B=-0.6)


def _replicas(f: WorkloadFeatures) -> bool:
    """Whether its GPUs' load moves apart while busy: replicas that exchange nothing."""
    return f.lockstep is not None and f.lockstep <= 0.3 and f.mean_util >= 50


def _cell_run(f: WorkloadFeatures) -> bool:
    """Whether a run of work as long and as high as a notebook cell's was seen."""
    return f.busy_seconds >= CELL_SECONDS and f.busy_level >= CELL_LEVEL


def _writes_and_memory(f: WorkloadFeatures, led: _Ledger) -> None:
    # Checkpoints are bursts: writes in most windows are something else, once there are enough windows to tell.
    if f.write_bursts >= 1 and (f.checkpoint_windows <= 0.5 or f.windows < FULL_CONFIDENCE_WINDOWS):
        weight = 2.2 if f.write_bursts >= 2 else 1.2
        led.add(f"checkpoint-like write bursts in {f.write_bursts} window(s)", T=weight, I=-0.5, B=-0.3)
    elif f.shared_bursts >= 1:
        # Someone computing as steadily as it saves like training does on its node; each such job is as likely.
        line = f"save bursts on its node shared with other steady jobs ({f.shared_bursts:.1f} its share)"
        led.add(line, T=0.8, B=-0.2)
    if f.write_bps >= 2e6 and f.mean_util >= 30 and (f.node_share >= 0.75 or f.own_writes):
        # Training writes logs and metrics (KB/s) between checkpoint bursts, a server its logs; MB/s in most windows
        # are results written as they are computed (embeddings are about as large as the text they encode). The
        # node's writes are its own where it does most of the node's work, or where its processes' own were read.
        led.add(f"writes {_gbps(f.write_bps)} per GPU steadily (results as they are computed)", B=1.0, T=-0.3, I=-0.5)
    if f.mem_fraction >= 0.85 and f.mem_stability < 0.01:
        # Engines preallocate it for offline batches (vLLM's LLM class) as for serving.
        led.add(f"flat {f.mem_fraction:.0%} of GPU memory (a preallocated KV-cache pool)", I=0.5, B=0.4)
    elif f.mem_stability >= 0.03 and f.mean_util < 60:
        led.add(f"GPU memory follows the load (variation {f.mem_stability:.0%})", I=0.5)
    if f.diurnal_ratio is not None and f.diurnal_ratio >= 4 and f.mean_util < 60:
        line = f"daily cycle: the busiest 10 minutes {f.diurnal_ratio:.0f}x the quietest over {f.history_hours:.0f} h"
        led.add(line, I=1.5)
    if f.sched_step == "interactive":
        led.add("Slurm interactive step", N=1.0)
    elif f.sched_step == "batch":
        led.add("Slurm batch step", T=0.3, B=0.3, N=-0.5)


RULES: tuple[Callable[[WorkloadFeatures, _Ledger], None], ...] = (
    _names,
    _server,
    _level,
    _power,
    _traffic,
    _writes_and_memory,
)
# those that stand without utilisation
BLIND_RULES: tuple[Callable[[WorkloadFeatures, _Ledger], None], ...] = (_names, _server, _traffic, _writes_and_memory)


def classify(f: WorkloadFeatures) -> Classification:
    """Classify one workload from its features."""
    if f.windows < MIN_WINDOWS:
        return Classification(
            WorkloadClass.UNKNOWN, 0.0, (f"only {f.windows} window(s) observed; {MIN_WINDOWS} needed",)
        )
    sufficiency = 0.5 + 0.5 * min(1.0, f.windows / FULL_CONFIDENCE_WINDOWS)
    util = f"GPUs {f.mean_util:.0f} % busy on average (p95 {f.p95_util:.0f} %)"
    # Requests to a model run kernels: GPUs at work in a fifth of the seconds or more, however little, are called by
    # someone; an abandoned allocation reads 0 % second after second.
    # Busy earlier in the day (the 10-minute digests' peak): a service at its trough or work between runs, not an
    # allocation nobody uses; the planner reclaims only what stayed idle.
    busy_today = f.history_hours >= 1 and f.daily_peak_p95 >= 30
    blind = f.util_unavailable is not None  # 0 % here is not a measurement: never taken for idle
    # A cell run between idle minutes keeps the mean near 0 % too: a person at a kernel holding its memory.
    quiet = f.mean_util < 2 and f.p95_util < 10 and not _answering(f) and f.zero_seconds >= 0.8 and not _cell_run(f)
    if quiet and not busy_today and not blind:
        held = f"{f.mem_fraction:.0%} of GPU memory held" if f.mem_fraction > 0.01 else "no GPU memory in use"
        name = f.program or f.hint
        if _matches(name, NOTEBOOK_NAMES):
            # A kernel between cells looks idle until its next burst; it is reclaimed only if it stays so.
            line = f"a notebook kernel ({name}) that ran nothing in {f.windows} window(s)"
            return Classification(WorkloadClass.INTERACTIVE, round(0.5 * sufficiency, 2), (line, util, held))
        if f.listen_ports and (f.inbound_connections or 0) >= 1:
            # One client attached (a browser on a notebook's or a dev server's port): someone is at it, so it is
            # not reclaimed on a few idle minutes.
            port = f":{f.listen_ports[0]}"
            line = f"one client connected to {port} (a browser on a notebook or a development server), nothing run"
            return Classification(WorkloadClass.INTERACTIVE, round(0.5 * sufficiency, 2), (line, util, held))
        return Classification(WorkloadClass.IDLE, round(0.95 * sufficiency, 2), (util, held))

    led = _ledger(f)
    ranked = sorted(CLASSES, key=lambda c: (-led.scores[c], CLASSES.index(c)))
    best, second = ranked[0], ranked[1]
    total = sum(math.exp(led.scores[c]) for c in CLASSES)
    share = math.exp(led.scores[best]) / total
    if led.scores[best] - led.scores[second] < UNSURE_MARGIN or led.scores[best] < 1.0:
        sides = [f"{c.value}: {'; '.join(r for _, r in sorted(led.reasons[c], key=lambda wr: -wr[0])[:2]) or '—'}"
                 for c in (best, second)]  # fmt: skip
        caveats = (_blind(f),) if blind else ()
        return Classification(WorkloadClass.UNKNOWN, 0.0, ("signals disagree", *caveats, *sides, _deciders(f)))
    reasons = tuple(r for _, r in sorted(led.reasons[best], key=lambda wr: -wr[0]))
    confidence = round(share * sufficiency, 2)
    if not _defining(best, f):
        # Everything for it is also seen in other classes (a busy, flat GPU; a serving engine's name that offline
        # batches share): a lean, not an answer to act on.
        confidence = min(confidence, UNSEEN_CONFIDENCE)
        reasons = (*reasons, f"nothing seen that only {_ARTICLE[best]} does: held below acting confidence")
    if blind:
        confidence = min(confidence, UTIL_UNAVAILABLE_CONFIDENCE)
        reasons = (_blind(f), *reasons)
    elif f.throttled_load:
        confidence = min(confidence, THROTTLED_LOAD_CONFIDENCE)
        reasons = (*reasons, f"load read only while its GPUs were held below their clocks ({_held(f)}): more than "
                   "the work needs on a GPU at its clocks, held below acting confidence")  # fmt: skip
    elif f.throttled_left_out:
        reasons = (*reasons, f"{f.throttled_left_out} window(s) on GPUs held below their clocks ({_held(f)}) left "
                   "out of its load")  # fmt: skip
    return Classification(best, confidence, (_headline(best, f), *reasons))


def _blind(f: WorkloadFeatures) -> str:
    return (
        f"utilisation unavailable ({f.util_unavailable}): classified from memory held, processes and traffic, "
        "held below acting confidence"
    )


def _held(f: WorkloadFeatures) -> str:
    """What held its GPUs down, the most telling first, as shares of its GPU time."""
    parts = [
        (f.throttle_thermal, "heat"),
        (f.throttle_power, "a lowered power limit"),
        (f.throttle_hw, "the hardware slowdown signal"),
    ]
    return ", ".join(f"{what} {share:.0%}" for share, what in sorted(parts, reverse=True) if share > 0)


def weigh(f: WorkloadFeatures) -> dict[WorkloadClass, float]:
    """The evidence for each class in nats, as ``classify`` weighs a workload that is not idle."""
    return dict(_ledger(f).scores)


def _ledger(f: WorkloadFeatures) -> _Ledger:
    led = _Ledger({c: 0.0 for c in CLASSES}, {c: [] for c in CLASSES})
    if f.util_unavailable is not None:
        # Rules that read utilisation or its shape would read an unmeasured 0 %.
        for rule in BLIND_RULES:
            rule(f, led)
        return led
    if f.mean_util < 2 and f.p95_util < 10:
        util = f"GPUs {f.mean_util:.0f} % busy on average (p95 {f.p95_util:.0f} %)"
        if _answering(f):
            # Near-idle GPUs that still answer clients: a service at its quietest hour, not an allocation to reclaim.
            led.add(f"{util}, yet answering clients: a service at its quietest", I=1.5)
        elif f.zero_seconds < 0.8:
            led.add(f"{util}, at work in {1 - f.zero_seconds:.0%} of seconds: requests trickling in", I=0.8)
        if f.daily_peak_p95 >= 30 and f.history_hours >= 1:
            led.add(f"{util} now, {f.daily_peak_p95:.0f} % at its busiest within the day: quiet, not abandoned", I=1.0)
    for rule in RULES:
        rule(f, led)
    return led


_ARTICLE = {TR: "a training job", INF: "a service", BAT: "a batch job", NB: "a notebook"}


def _defining(c: WorkloadClass, f: WorkloadFeatures) -> bool:
    """Whether anything was seen that (nearly) only class ``c`` does: for training, gradient exchange, saves, a step
    period, several nodes; for serving, clients (connected, or their traffic where it is the workload's own), a
    daily cycle, load following arrivals; for batch, results written or uploaded with no client connected, or busy
    with none connected (GPUs exchanging nothing, whether their load moves apart or their links carry no bytes, are
    not batch's alone: a service's per-GPU workers do the same); for notebooks, bursts between idle minutes. A program
    on the command line (schema 2) counts; a process name does not (comm is generic or cut, and engines run
    offline batches under the same name), except a notebook kernel's, which nothing else is called."""
    program = f.program if f.program and f.program.lower() not in GENERIC_NAMES else None
    alone = f.node_share >= 0.75
    if c is TR:
        return (
            f.gpu_link_bps >= 20e9
            or f.east_west_bps >= 1e9
            or f.write_bursts >= 1
            or f.period_s is not None
            or f.multi_node
            or _matches(program, TRAINING_NAMES)
        )
    if c is INF:
        own_traffic = f.own_network or (alone and f.baseline_from == "node")
        return (
            bool(f.listen_ports and (f.inbound_peers or 0) >= 2)
            or (own_traffic and f.egress_bps >= 20e3)
            or (f.diurnal_ratio is not None and f.diurnal_ratio >= 4)
            or (f.mean_util < 70 and f.busy_cv >= 0.15 and f.period_s is None)
            or _requests(f)
            or _matches(program, SERVING_NAMES)
        )
    if c is BAT:
        no_clients = f.inbound_connections == 0 and f.mean_util >= 50
        return ((alone or f.own_writes) and f.write_bps >= 2e6) or no_clients or _matches(program, BATCH_NAMES)
    return (f.zero_seconds >= 0.4 and f.busy_seconds >= CELL_SECONDS) or _matches(f.program or f.hint, NOTEBOOK_NAMES)


def _requests(f: WorkloadFeatures) -> bool:
    """Whether its runs of work start as requests arrive: often, after irregular gaps, with no step period."""
    return (
        f.starts_per_min is not None
        and f.gap_cv is not None
        and f.period_s is None
        and f.starts_per_min >= REQUEST_STARTS_PER_MIN
        and f.gap_cv > 0
        and f.gap_cv >= REQUEST_GAP_CV * _arrival_gap_cv(f)
    )


def _arrival_gap_cv(f: WorkloadFeatures) -> float:
    """The variation of idle gaps that requests arriving at random leave in load read once a second. A gap is a run
    of idle seconds, each followed by another with the chance q that no request arrived meanwhile, so gaps are
    geometric: variation sqrt(q), q = 1 - 1/(mean gap in seconds). A server busy most seconds idles a second at a
    time and its gaps vary little, however random its arrivals (gaps of 1.25 s: 0.45); long gaps tend to the
    exponential's 1. The mean gap is the idle seconds per run, runs and gaps alternating."""
    if f.run_s is None or not 0 < f.zero_seconds < 1:
        return 1.0
    gap = f.run_s * f.zero_seconds / (1 - f.zero_seconds)
    return math.sqrt(1 - 1 / gap) if gap > 1 else 0.0


def _answering(f: WorkloadFeatures) -> bool:
    """Whether a near-idle workload still serves clients: a service at its quietest hour, not an allocation to
    reclaim. A browser on a notebook's port is one client; a service has several connected (schema 2), or traffic
    of its own beyond the node's while its GPUs do some work: requests to a model run kernels, so traffic beside GPUs
    that did nothing at all is somebody else's (the node's scrapes and log shipping, which features could not take
    off where the node was never quiet)."""
    if f.listen_ports and (f.inbound_peers or 0) >= 2:
        return True
    own = f.own_network or (f.front_baseline_bps is not None and f.node_share >= 0.75)
    worked = f.zero_seconds < 0.995
    return own and worked and f.egress_bps >= 20e3


def _deciders(f: WorkloadFeatures) -> str:
    """What an undecided workload lacks that would decide it, most telling first."""
    missing = []
    if f.inbound_connections is None:
        missing.append("its clients (an agent with process facts, schema 2, reads its listening ports)")
    if not f.program and (not f.hint or f.hint.lower() in GENERIC_NAMES):
        missing.append("the program on its command line")
    if f.diurnal_ratio is None:
        missing.append(f"12 h of history for a daily cycle (has {f.history_hours:.0f} h)")
    if f.intensity is None and f.tensor_share is None:
        missing.append("power or profiling (DCGM, GPM) in a busy window")
    if f.starts_per_min is None and f.zero_seconds >= 0.05:
        missing.append("load each second (points a scrape apart hide when work starts)")
    return "would decide it: " + ("; ".join(missing) if missing else "more windows of the same signals")


def _headline(c: WorkloadClass, f: WorkloadFeatures) -> str:
    """What kind of workload this is, in a capacity planner's words, with its level and what it lacks."""
    level = f"{f.mean_util:.0f} % busy" if f.util_unavailable is None else "utilisation unavailable"
    if c is INF:
        shape = shape_reading(f)
        dense = shape is not None and shape[0] <= COMPUTE_SHARE
        kind = "continuous-batching server" if f.mean_util >= 70 and not dense else "online service"
        lacks = "" if f.period_s is not None else ", no step period"
        bound = ""
        if shape is not None and (dense or shape[0] >= DECODE_SHARE):
            # what the planner projects its load on other hardware with (optimizer/decide/performance.py)
            bound = f", {'compute' if dense else 'memory'}-bound ({shape[1]})"
        return f"{kind}: {level}, {f.mem_fraction:.0%} of GPU memory{lacks}{bound}"
    if c is TR:
        step = f", a step every {f.period_s} s" if f.period_s is not None else ""
        kind = "distributed training" if f.multi_node else f"training on {f.gpus} GPU(s)"
        return f"{kind}: {level}{step}"
    if c is BAT:
        return f"batch job: {level}, no clients, no gradient exchange"
    return f"notebook: idle {f.zero_seconds:.0%} of seconds, bursts at {f.busy_level:.0f} %"
