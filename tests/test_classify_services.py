"""Online services that do not look like LLM chat: compute-bound APIs (image generation, speech, embeddings,
vision), small LLMs as one replica per PCIe card, FP8 tensor-parallel serving at moderate load; and what an
"unknown" says would decide it.

Rows follow tests/test_classify_rules.py: one field just past a new rule's threshold and just short of it, the
class the evidence must favour. Expected values come from the assumptions beside each rule in
optimizer/decide/classify.py.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from conftest import simulated_fleet

from agent.protocol import WorkloadClass
from collectors.sim.spec import Pattern
from optimizer.decide.classify import classify, weigh
from optimizer.decide.features import Placement, WorkloadFeatures, work_runs, workload_features

TR, INF, BAT, NB, UNKNOWN = (
    WorkloadClass.TRAINING,
    WorkloadClass.INFERENCE,
    WorkloadClass.BATCH_INFERENCE,
    WorkloadClass.INTERACTIVE,
    WorkloadClass.UNKNOWN,
)


def features(gpus: int = 1, **fields: Any) -> WorkloadFeatures:
    """A schema-1 workload with a generic name, 40 % busy, no rule near a threshold."""
    base = WorkloadFeatures(
        id="k8s/w",
        name="w",
        hint="python3",
        placements=[Placement("n0", "NVIDIA L40S", 46_068, tuple(range(gpus)), float(gpus))],
        windows=12,
        mean_util=40.0,
        p95_util=60.0,
        busy_cv=0.12,
        busy_level=40.0,
        busy_seconds=100,
        mem_fraction=0.3,
        node_front_bps=1e6,
    )
    return replace(base, **fields)


REQUESTS: dict[str, Any] = {"starts_per_min": 4.0, "gap_cv": 0.9, "run_s": 5.0}
GAPS_2S: dict[str, Any] = {"zero_seconds": 0.2, "run_s": 8.0}
DECODE: dict[str, Any] = {"mean_util": 90.0, "busy_level": 90.0, "intensity": 0.6}
Row = tuple[str, dict[str, Any], str, object, object, WorkloadClass]
ROWS: list[Row] = [
    # requests: starts at >= 1.5 a minute after idle gaps varying >= 50 %, no step period
    ("requests: work starts >= 1.5 a minute", REQUESTS, "starts_per_min", 1.6, 1.4, INF),
    ("requests: idle gaps vary >= 50 %", REQUESTS, "gap_cv", 0.51, 0.49, INF),
    # read once a second: idle 20 % of seconds in runs of 8 s is gaps of 2 s on average, whose variation under random
    # arrivals is sqrt(1 - 1/2) = 0.707; half of it is 0.354
    ("requests: gaps vary >= half of random arrivals at 1 Hz", REQUESTS | GAPS_2S, "gap_cv", 0.36, 0.34, INF),
    # a decode batch partly filled: memory-bound (share >= 0.55: power <= 0.7075) and below 95 % while busy
    ("partial decode batch: below 95 % busy", DECODE, "busy_level", 94.0, 96.0, INF),
    ("partial decode batch: memory-bound share >= 0.55", DECODE, "intensity", 0.70, 0.715, INF),
    ("partial decode batch: from 70 % busy", DECODE | {"busy_level": 80.0}, "mean_util", 70.0, 69.0, INF),
    # GPM's decode reading with the power sensor agreeing (<= 0.68) weighs 1.5 instead of 1.0, once
    ("decode measured twice: power <= 0.68", {"tensor_share": 0.2, "dram_share": 0.7}, "intensity", 0.68, 0.69, INF),
]


@pytest.mark.parametrize(("rule", "base", "field", "past", "short", "cls"), ROWS, ids=[r[0] for r in ROWS])
def test_each_new_rule_turns_at_its_threshold(
    rule: str, base: dict[str, Any], field: str, past: object, short: object, cls: WorkloadClass
) -> None:
    """Catches REQUEST_STARTS_PER_MIN moved to 1.7 or 1.3, REQUEST_GAP_CV to 0.52 or 0.48, the gaps' bar read as
    if gaps were not whole seconds (0.5 for 2 s gaps), PARTIAL_BATCH_LEVEL moved to 93 or 97, DECODE_SHARE to 0.5
    or 0.6, the 70 % floor moved, or power's agreement with GPM ignored."""
    fired = weigh(features(**(base | {field: past})))
    held = weigh(features(**(base | {field: short})))
    others = [c for c in (TR, INF, BAT, NB) if c is not cls]
    assert fired[cls] - max(fired[c] for c in others) > held[cls] - max(held[c] for c in others), (fired, held)


def test_a_compute_bound_service_idle_between_requests_is_served_not_a_notebook() -> None:
    """An image API on a schema-1 agent with a neutral name: 40 % busy in runs of 5 s starting 4 times a minute at
    random, near the power limit. Before requests were read it was a notebook (idle 56 % of seconds, bursts) or
    training's power signature; catches the requests rule switched off or its notebook weight dropped."""
    f = features(zero_seconds=0.56, busy_level=45.0, busy_cv=0.4, intensity=0.88, **REQUESTS)
    result = classify(f)
    assert result.workload_class is INF, result
    assert any("load that follows requests" in e for e in result.evidence), result.evidence
    # the headline says what a planner projects with: compute-bound, and measured from power (0.88 -> share 0.06)
    assert result.evidence[0].startswith("online service:"), result.evidence
    assert "compute-bound (power: 88% of what its utilisation allows)" in result.evidence[0], result.evidence
    # the same bursts minutes apart are a person running cells
    cells = classify(replace(f, starts_per_min=0.4, run_s=17.0))
    assert cells.workload_class is NB, cells


def test_a_step_loop_idle_between_steps_is_not_taken_for_requests() -> None:
    """Loader-bound training whose step period went unseen: runs start 10 times a minute, but the gaps repeat
    (variation 5 %); and one whose period was seen, gaps irregular or not. Catches the gap-regularity check or the
    step-period check dropped from the requests rule."""
    f = features(zero_seconds=0.5, busy_level=90.0, starts_per_min=10.0, gap_cv=0.05, run_s=3.0)
    assert weigh(f)[INF] == weigh(replace(f, starts_per_min=None, gap_cv=None))[INF]
    stepped = features(period_s=8, **REQUESTS)
    assert weigh(stepped)[INF] == weigh(replace(stepped, starts_per_min=None, gap_cv=None))[INF]


def test_small_llm_replicas_and_fp8_tensor_parallel_serving_are_served() -> None:
    """An 8B model, one vLLM replica per L4 (no collectives: correlation 0.1), memory-bound at 92 % while busy;
    and a 70B FP8 model over 4 GPUs in lockstep exchanging 1.3 GB/s at a small batch. Both were unknown: the
    replicas taken for batch (a memory-bound engine below a full batch was not read), the tensor-parallel engine's
    small exchange taken for no exchange. Catches either fix reverted."""
    replicas = features(
        gpus=8, mean_util=92.0, busy_level=92.0, busy_cv=0.04, lockstep=0.1, intensity=0.45, mem_fraction=0.88
    )
    assert classify(replicas).workload_class is INF, classify(replicas)
    tp = features(
        gpus=4, mean_util=80.0, busy_level=90.0, busy_cv=0.02, lockstep=0.99, gpu_link_bps=1.3e9, intensity=0.6
    )
    assert classify(tp).workload_class is INF, classify(tp)
    # the busy-without-exchange rule (+1.0 for batch) stays silent where the GPUs move as one
    assert weigh(tp)[BAT] <= weigh(replace(tp, lockstep=None))[BAT] - 1.0


def test_busy_replicas_idle_a_second_at_a_time_follow_requests() -> None:
    """An 8B model as one engine per L4, 72 % busy: idle 19 % of seconds, a second or two at a time, work starting 43
    times a minute, gaps varying 45 % (random arrivals read once a second give 0.44 at a 1.24 s mean gap),
    replicas apart (correlation 0.02), memory-bound by power. Was unknown, batch 3.1 nats against serving 2.8: its
    gaps were held to 0.5 as if they were not whole seconds. Catches that bar restored."""
    f = features(
        gpus=8, mean_util=72.0, busy_level=72.0, p95_util=90.0, busy_cv=0.18, zero_seconds=0.19, starts_per_min=43.0,
        run_s=5.27, gap_cv=0.45, lockstep=0.02, intensity=0.5, mem_fraction=0.87,
    )  # fmt: skip
    result = classify(f)
    assert result.workload_class is INF, result
    assert any("load that follows requests" in e for e in result.evidence), result.evidence


def test_a_full_decode_batch_is_an_llm_engine_not_training_and_clients_tell_which() -> None:
    """A saturated engine with its batch full: GPM reads DRAM 75 %, tensor pipes 35 % (more sequences per weight
    read than one stream: past the 32 % of a partly filled batch, yet DRAM's share of the two is 0.68,
    memory-bound), 98 % busy on 8 GPUs. On a schema-1 agent it is unknown between serving and offline generation,
    never training, and says what would decide it; with process facts, no client connected makes it batch and many
    clients serving. Catches the decode rule read from tensor pipes alone again (training stays in the running:
    unknown with no clients), or a full batch weighed for serving over batch (the schema-1 engine taken for a
    server)."""
    f = features(
        gpus=8, mean_util=98.0, p95_util=100.0, busy_level=98.0, busy_cv=0.01, tensor_share=0.35, dram_share=0.75,
        intensity=0.7, mem_fraction=0.9, mem_stability=0.0, gpu_link_bps=13e9,
    )  # fmt: skip
    schema1 = classify(f)
    assert schema1.workload_class is UNKNOWN, schema1
    assert "training" not in " ".join(schema1.evidence[1:3]), schema1.evidence
    assert schema1.evidence[-1].startswith("would decide it:") and "clients" in schema1.evidence[-1], schema1.evidence
    offline = classify(replace(f, inbound_connections=0, inbound_peers=0))
    assert offline.workload_class is BAT, offline
    served = classify(replace(f, listen_ports=(8000,), inbound_connections=24, inbound_peers=12))
    assert served.workload_class is INF, served


def test_an_unknown_names_what_would_decide_it() -> None:
    """A saturated memory-bound engine on a schema-1 agent: serving and offline generation look alike for a
    quarter of an hour. Unknown, saying which missing signals would decide it; catches the deciders line lost."""
    f = features(gpus=8, mean_util=98.0, busy_level=98.0, busy_cv=0.01, intensity=0.7, mem_fraction=0.9)
    result = classify(f)
    assert result.workload_class is UNKNOWN, result
    decide = result.evidence[-1]
    assert decide.startswith("would decide it:") and "clients" in decide and "command line" in decide, decide


def test_work_runs_tell_random_arrivals_from_a_step_loop() -> None:
    """Gaps of a step loop repeat (variation 0); gaps between arrivals vary; one start on two GPUs at the same
    second counts once. Expected figures worked out by hand from the series."""
    step = [95.0 if t % 6 < 3 else 0.0 for t in range(120)]  # 3 s runs every 6 s: 20 starts, the first at 0 uncounted
    assert work_runs([step]) == (19 / 120 * 60, 3.0, 0.0)
    gaps = [2, 9, 4, 20, 1, 7, 3]
    series: list[float] = []
    for g in gaps:
        series += [0.0] * g + [90.0] * 2
    series += [0.0] * (60 - len(series) % 60)
    runs = work_runs([series, series])
    assert runs is not None
    starts, run_s, gap_cv = runs
    assert starts == 7 / len(series) * 60 and run_s == 2.0
    assert gap_cv is not None and gap_cv > 0.5  # 9, 4, 20, 1, 7, 3 between runs


def test_compute_bound_services_through_the_pipeline_are_not_notebooks() -> None:
    """Simulated image, speech, embedding and vision APIs and LLM replicas, neutral names, through agent windows
    and ingest: none is taken for a notebook or training with confidence 0.5 or more, and most are served.
    Catches the requests rule or the lockstep check reverted (image and speech APIs read as notebooks)."""
    fleet, truth = simulated_fleet("services", 6, windows=36, seed=5, names=False)
    online = [f for f in workload_features(fleet, "s1") if truth[f.id] in (Pattern.INFERENCE, Pattern.LLM_SERVING)]
    assert len(online) >= 6
    results = [classify(f) for f in online]
    for f, r in zip(online, results, strict=True):
        assert not (r.workload_class in (NB, TR) and r.confidence >= 0.5), (f.name, r)
    assert sum(r.workload_class is INF for r in results) >= 0.8 * len(results), [
        (f.name, r.workload_class.value) for f, r in zip(online, results, strict=True)
    ]


@pytest.mark.parametrize(("peers", "cls"), [(3, INF), (2, BAT)])
def test_an_embedding_server_on_per_gpu_workers_takes_requests_not_input(peers: int, cls: WorkloadClass) -> None:
    """Text-embeddings-inference or Triton on one worker per GPU: each GPU's load moves on its own, dense kernels at
    the power limit, and more bytes in (the texts) than out (the vectors), over connections from its clients. With
    three clients or more connected, those bytes are requests and it is served; with two (a Ray worker and its
    head) it is not served. Red when intake counts requests from connected clients as input read (the server is
    taken for batch at 0.61)."""
    f = features(
        4,
        mean_util=63.0,
        p95_util=70.0,
        busy_level=63.0,
        busy_cv=0.07,
        busy_seconds=900,
        lockstep=-0.02,
        intensity=0.99,
        own_network=True,
        ingress_bps=14.6e6,
        egress_bps=116e3,
        listen_ports=(8001,),
        inbound_connections=12,
        inbound_peers=peers,
    )
    result = classify(f)
    assert result.workload_class is cls, result
