"""A workload's shape, from what its agent measured: the share of its GPU time bound by memory bandwidth (LLM
decode) rather than tensor compute (optimizer/decide/performance.py says what the planner does with it).

The evidence, best first (each an estimate of how the hardware behaves, stated beside its anchors):

* GPM (Hopper and newer, read by the agent) or DCGM's profiling fields (any data-centre GPU, read from
  dcgm-exporter through Prometheus: ``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`` and ``DCGM_FI_PROF_DRAM_ACTIVE``, the same
  counters): DRAM-bandwidth activity against tensor-pipe activity. A GEMM-bound workload (vision,
  encoders, dense training) keeps the tensor pipes busy most of its busy time and streams DRAM at a third or so
  of peak; LLM decode reads every weight and the KV cache per token, so DRAM runs near peak while the tensor
  pipes idle between reads. DRAM's share of the two, ``dram / (dram + tensor)``, reads about 0.35 for the
  first and 0.8 for the second (DCGM's ``PROF_DRAM_ACTIVE`` and ``PROF_PIPE_TENSOR_ACTIVE`` as NVIDIA's
  profiling guides show them for such kernels); between the two anchors the shape is interpolated.
* Power per unit of utilisation (any GPU): dense matmuls draw close to the power limit when busy (0.9 of the
  range between idle and the limit, per unit of utilisation); memory-bound decode keeps kernels running at far
  lower power (0.55). Read only from busy windows, where the idle share of power matters least.
* The serving engine: an LLM server (vLLM, SGLang, TGI, TensorRT-LLM, LMDeploy, llama.cpp, Ollama) spends most
  of its GPU time decoding, which is memory-bound.

Without any of them the shape is unknown, and the planner assumes the end less favourable to a move.
"""

from __future__ import annotations

import re

from optimizer.decide.features import WorkloadFeatures

GPM_COMPUTE, GPM_MEMORY = 0.35, 0.80  # DRAM's share of DRAM + tensor activity at the two ends
POWER_COMPUTE, POWER_MEMORY = 0.90, 0.55  # power intensity at the two ends
LLM_ENGINES = ("vllm", "sglang", "text-generation", "tgi", "trtllm", "lmdeploy", "llama-server", "ollama")


def _ramp(value: float, at_zero: float, at_one: float) -> float:
    return min(1.0, max(0.0, (value - at_zero) / (at_one - at_zero)))


def gpm_memory_share(tensor: float, dram: float) -> float:
    """The memory-bound share of busy time (0-1) from tensor-pipe and DRAM activity, GPM's or DCGM's."""
    return _ramp(dram / (dram + tensor), GPM_COMPUTE, GPM_MEMORY) if tensor + dram > 0 else 0.0


def _llm_engine(name: str | None) -> bool:
    if not name:
        return False
    lowered = name.lower()
    return any(re.search(rf"(^|[^a-z]){re.escape(e)}", lowered) for e in LLM_ENGINES)


def shape_reading(f: WorkloadFeatures) -> tuple[float, str] | None:
    """The memory-bound share of the workload's GPU time as measured (0-1), with what it was read from; None
    where neither profiling counters nor power were read in windows with work."""
    tensor, dram = f.shape_tensor, f.shape_dram
    if tensor is not None and dram is not None and tensor + dram > 0:
        # Series a scrape apart come from Prometheus, whose profiling figures are dcgm-exporter's DCGM_FI_PROF_*;
        # an agent's per-second windows carry GPM's.
        source = "GPM" if f.per_second else "DCGM profiling"
        what = f"{source}: DRAM {dram:.0%}, tensor pipes {tensor:.0%} of busy time"
        return gpm_memory_share(tensor, dram), what
    if f.intensity is not None:
        what = f"power: {f.intensity:.0%} of what its utilisation allows"
        return _ramp(f.intensity, POWER_COMPUTE, POWER_MEMORY), what
    return None


def measured_shape(f: WorkloadFeatures) -> float | None:
    """The memory-bound share of the workload's GPU time, 0-1 in steps of 0.05; None when nothing tells."""
    reading = shape_reading(f)
    if reading is not None:
        share = reading[0]
    elif _llm_engine(f.program) or _llm_engine(f.hint):
        share = 1.0
    else:
        return None
    return round(share * 20) / 20  # a measured shape is not finer than this; stable across plans
