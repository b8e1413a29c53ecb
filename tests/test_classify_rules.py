"""Each classification rule on both sides of its threshold, with features built by hand.

A row gives a base workload, one field set to a value just past the rule's threshold and to one just short of it,
and the class that evidence must favour (or disfavour). The values come from the assumptions written beside each
rule in optimizer/decide/classify.py, not from running the classifier: moving a threshold past either value, or switching
the rule off, turns its row red.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agent.protocol import WorkloadClass
from optimizer.decide.classify import classify, weigh
from optimizer.decide.features import Placement, WorkloadFeatures

TR, INF, BAT, NB = (
    WorkloadClass.TRAINING,
    WorkloadClass.INFERENCE,
    WorkloadClass.BATCH_INFERENCE,
    WorkloadClass.INTERACTIVE,
)
IDLE, UNKNOWN = WorkloadClass.IDLE, WorkloadClass.UNKNOWN


def features(gpus: int = 1, nodes: int = 1, **fields: Any) -> WorkloadFeatures:
    """A workload none of whose rules is near a threshold: 40 % busy, variation between steady and bursty,
    memory neither flat nor following load, no traffic, no facts (schema 1), a generic process name."""
    placements = [
        Placement(f"n{i}", "NVIDIA H100 80GB HBM3", 81_559, tuple(range(gpus)), float(gpus)) for i in range(nodes)
    ]
    base = WorkloadFeatures(
        id="k8s/w",
        name="w",
        hint="python3",
        placements=placements,
        windows=12,
        mean_util=40.0,
        p95_util=60.0,
        busy_cv=0.12,
        busy_level=40.0,
        busy_seconds=100,
        zero_seconds=0.0,
        mem_fraction=0.5,
        mem_stability=0.02,
        node_front_bps=1e6,
    )
    return replace(base, **fields)


# (rule, base fields, field, value past the threshold, value short of it, class, +1: gains / -1: loses)
Row = tuple[str, dict[str, Any], str, object, object, WorkloadClass, int]
ROWS: list[Row] = [
    # level
    ("busy >= 70 % (single GPU)", {}, "mean_util", 71.0, 69.0, TR, +1),
    ("steady middle level: variation", {"mean_util": 60.0}, "busy_cv", 0.09, 0.11, TR, +1),
    ("steady middle level: idle seconds", {"mean_util": 60.0, "busy_cv": 0.05}, "zero_seconds", 0.09, 0.11, TR, +1),
    ("steady middle level: from 50 %", {"busy_cv": 0.05}, "mean_util", 51.0, 49.0, TR, +1),
    ("load varying with requests: variation", {}, "busy_cv", 0.16, 0.14, INF, +1),
    ("load varying with requests: idle seconds", {"busy_cv": 0.2}, "zero_seconds", 0.39, 0.41, INF, +1),
    ("a low level leans to serving: below 50 %", {}, "mean_util", 49.0, 51.0, INF, +1),
    ("notebook bursts: idle seconds", {"mean_util": 20.0}, "zero_seconds", 0.41, 0.39, NB, +1),
    ("notebook bursts: burst level", {"mean_util": 20.0, "zero_seconds": 0.5}, "busy_level", 31.0, 29.0, NB, +1),
    ("notebook bursts: burst seconds", {"mean_util": 20.0, "zero_seconds": 0.5}, "busy_seconds", 5, 4, NB, +1),
    ("a step period", {}, "period_s", 8, None, TR, +1),
    # power and GPM
    ("tensor pipes >= 40 %", {"dram_share": 0.3}, "tensor_share", 0.41, 0.39, TR, +1),
    # DRAM's share of DRAM and tensor activity, on shape.py's anchors (0.35 -> 0, 0.80 -> 1), at DECODE_SHARE 0.55:
    # 0.5975; with DRAM at 55 % that is tensor pipes up to 37.05 %
    ("memory-bound: DRAM's share of the two >= 0.5975", {"dram_share": 0.55}, "tensor_share", 0.36, 0.38, TR, -1),
    # decode with a partly filled batch (tensor pipes <= PARTIAL_BATCH_TENSOR, 32 %) leans to serving; full, not
    ("decode, batch partly filled: tensor pipes <= 32 %", {"dram_share": 0.7}, "tensor_share", 0.31, 0.33, INF, +1),
    ("memory-bound: DRAM >= 55 %", {"tensor_share": 0.2}, "dram_share", 0.56, 0.54, INF, +1),
    ("compute-bound power >= 0.78", {}, "intensity", 0.79, 0.77, TR, +1),
    ("memory-bound power <= 0.68", {}, "intensity", 0.67, 0.69, INF, +1),
    # GPM's decode reading with the power sensor agreeing (<= 0.68) weighs more against training, once
    ("decode measured twice: power <= 0.68", {"tensor_share": 0.2, "dram_share": 0.7}, "intensity", 0.68, 0.69, TR, -1),
    # listening ports and clients (schema 2)
    ("a server: >= 3 clients", {"listen_ports": (8000,), "inbound_connections": 6}, "inbound_peers", 3, 2, INF, +1),
    ("one client connected", {"listen_ports": (8000,), "inbound_peers": 1}, "inbound_connections", 1, 0, INF, +1),
    # gradient exchange and lockstep
    ("gradient exchange: NVLink/PCIe >= 20 GB/s", {"gpus": 2}, "gpu_link_bps", 21e9, 19e9, TR, +1),
    ("gradient exchange: fabric >= 1 GB/s", {"gpus": 2}, "east_west_bps", 1.1e9, 0.9e9, TR, +1),
    ("busy GPUs without exchange: < 2 GB/s", {"gpus": 2, "mean_util": 75.0}, "gpu_link_bps", 1.9e9, 2.1e9, BAT, +1),
    ("busy GPUs without exchange: from 70 %", {"gpus": 2}, "mean_util", 71.0, 69.0, TR, -1),
    (
        "busy GPUs without exchange: fabric < 100 MB/s",
        {"gpus": 2, "mean_util": 75.0},
        "east_west_bps",
        0.09e9,
        0.11e9,
        BAT,
        +1,
    ),
    ("GPUs in lockstep: correlation >= 0.7", {"gpus": 2, "mean_util": 60.0}, "lockstep", 0.71, 0.69, TR, +1),
    ("independent replicas: correlation <= 0.3", {"gpus": 2, "mean_util": 60.0}, "lockstep", 0.29, 0.31, BAT, +1),
    ("independent replicas: only when busy", {"gpus": 2, "lockstep": 0.2}, "mean_util", 51.0, 49.0, BAT, +1),
    # without per-second lockstep (it needs load that moves): exchange, and GPUs at the same level
    (
        "GPUs together by their exchange: >= 0.5 GB/s",
        {"gpus": 2, "mean_util": 60.0},
        "gpu_link_bps",
        0.6e9,
        0.4e9,
        TR,
        +1,
    ),
    (
        "GPUs together by their exchange: spread < 15 %",
        {"gpus": 2, "gpu_link_bps": 1e9},
        "gpu_spread",
        0.14,
        0.16,
        TR,
        +1,
    ),
    ("GPUs together by their exchange: load moving", {"gpus": 2, "gpu_link_bps": 1e9}, "busy_cv", 0.06, 0.04, TR, +1),
    (
        "GPUs together by their exchange: or idle seconds",
        {"gpus": 2, "gpu_link_bps": 1e9, "busy_cv": 0.02},
        "zero_seconds",
        0.11,
        0.09,
        TR,
        +1,
    ),
    # front-end traffic and disks
    ("input read steadily: front end", {"own_network": True}, "ingress_bps", 10.5e6, 9.5e6, BAT, +1),
    ("input read steadily: disks", {"node_share": 0.9}, "disk_read_bps", 10.5e6, 9.5e6, BAT, +1),
    ("disks are its own on a node it mostly uses", {"disk_read_bps": 20e6}, "node_share", 0.76, 0.74, BAT, +1),
    (
        "input read steadily: more in than out",
        {"own_network": True, "ingress_bps": 20e6},
        "egress_bps",
        19e6,
        21e6,
        BAT,
        +1,
    ),
    (
        "input read steadily: any amount out with nobody connected",
        {"own_network": True, "ingress_bps": 20e6, "egress_bps": 30e6},
        "inbound_connections",
        0,
        None,
        BAT,
        +1,
    ),
    ("responses: >= 50 MB/s out", {"own_network": True, "mean_util": 20.0}, "egress_bps", 51e6, 49e6, INF, +1),
    ("client-sized traffic: 20 KB/s out", {"own_network": True}, "egress_bps", 21e3, 19e3, INF, +1),
    (
        "client-sized traffic: from 30 % busy",
        {"own_network": True, "egress_bps": 50e3},
        "mean_util",
        31.0,
        29.0,
        INF,
        +1,
    ),
    (
        "client-sized traffic: only beside a measured baseline",
        {"egress_bps": 50e3, "front_baseline_bps": 60e3},
        "baseline_from",
        "node",
        "site",
        INF,
        +1,
    ),
    ("busy without front-end traffic", {"mean_util": 55.0}, "node_front_bps", 4.9e3, 5.1e3, BAT, +1),
    ("busy without front-end traffic: from 50 %", {"node_front_bps": 1e3}, "mean_util", 51.0, 49.0, BAT, +1),
    (
        "busy without front-end traffic: under 1 MB/s read",
        {"mean_util": 55.0, "node_front_bps": 1e3},
        "disk_read_bps",
        0.9e6,
        1.1e6,
        BAT,
        +1,
    ),
    (
        "results uploaded with no client connected",
        {"mean_util": 55.0, "own_network": True, "inbound_connections": 0},
        "egress_bps",
        1.1e6,
        0.9e6,
        BAT,
        +1,
    ),
    # writes and memory
    ("a checkpoint burst", {}, "write_bursts", 1, 0, TR, +1),
    ("several checkpoint bursts", {"checkpoint_windows": 0.2}, "write_bursts", 2, 1, TR, +1),
    ("bursts in at most half the windows", {"write_bursts": 3}, "checkpoint_windows", 0.5, 0.6, TR, +1),
    (
        "bursts in most windows count until 6 windows",
        {"write_bursts": 3, "checkpoint_windows": 0.8},
        "windows",
        5,
        6,
        TR,
        +1,
    ),
    ("its share of bursts beside other steady jobs", {}, "shared_bursts", 1.0, 0.9, TR, +1),
    ("results written steadily", {"node_share": 1.0}, "write_bps", 2.1e6, 1.9e6, BAT, +1),
    ("results written steadily: on its own node", {"write_bps": 5e6}, "node_share", 0.76, 0.74, BAT, +1),
    ("results written steadily: from 30 % busy", {"write_bps": 5e6}, "mean_util", 31.0, 29.0, BAT, +1),
    (
        "results written steadily: its processes' own writes on a shared node",
        {"write_bps": 5e6, "node_share": 0.4},
        "own_writes",
        True,
        False,
        BAT,
        +1,
    ),
    ("flat KV-cache pool: >= 85 % of memory", {"mem_stability": 0.005}, "mem_fraction", 0.86, 0.84, INF, +1),
    ("flat KV-cache pool: flat", {"mem_fraction": 0.9}, "mem_stability", 0.009, 0.011, INF, +1),
    ("memory following load", {}, "mem_stability", 0.031, 0.029, INF, +1),
    ("memory following load: below 60 % busy", {"mem_stability": 0.05}, "mean_util", 59.0, 61.0, INF, +1),
    ("a daily cycle", {}, "diurnal_ratio", 4.1, 3.9, INF, +1),
    ("a daily cycle: below 60 % busy", {"diurnal_ratio": 8.0}, "mean_util", 59.0, 61.0, INF, +1),
    ("Slurm interactive step", {}, "sched_step", "interactive", None, NB, +1),
    ("Slurm batch step", {}, "sched_step", "batch", None, NB, -1),
]


@pytest.mark.parametrize(("rule", "base", "field", "past", "short", "cls", "sign"), ROWS, ids=[r[0] for r in ROWS])
def test_each_rule_turns_at_its_threshold(
    rule: str, base: dict[str, Any], field: str, past: object, short: object, cls: WorkloadClass, sign: int
) -> None:
    fields = dict(base)
    gpus = fields.pop("gpus", 1)
    fired = weigh(features(gpus, **(fields | {field: past})))
    held = weigh(features(gpus, **(fields | {field: short})))
    assert sign * (fired[cls] - held[cls]) > 0, (rule, fired, held)


def test_a_server_busy_half_the_time_with_no_connection_is_not_one() -> None:
    """No connection costs a busy workload more than a quiet one: requests in flight hold connections."""

    def penalty(util: float) -> float:
        schema2 = weigh(features(mean_util=util, inbound_connections=0, inbound_peers=0))
        schema1 = weigh(features(mean_util=util))
        return schema2[INF] - schema1[INF]

    assert penalty(51.0) < penalty(49.0) < 0


NAMES = [
    ("program", "torchrun", TR),
    ("program", "train_lora.py", TR),
    ("program", "vllm.entrypoints.openai.api_server", INF),
    ("program", "tritonserver", INF),
    ("program", "ipykernel_launcher", NB),
    ("program", "embed_corpus.py", BAT),
    ("hint", "VLLM::EngineCor", INF),
    ("hint", "deepspeed", TR),
]


@pytest.mark.parametrize(("where", "name", "cls"), NAMES)
def test_a_name_is_a_hint_for_its_class(where: str, name: str, cls: WorkloadClass) -> None:
    named = weigh(features(**{where: name}))
    generic = weigh(features())
    assert named[cls] > generic[cls]
    assert weigh(features(**{where: "python3"})) == generic  # an interpreter's name says nothing


def test_a_command_line_weighs_more_than_a_cut_process_name() -> None:
    assert weigh(features(program="vllm"))[INF] > weigh(features(hint="vllm"))[INF] > weigh(features())[INF]


# ---------------------------------------------------------------------------------------------- near idle


def near_idle(**fields: Any) -> WorkloadFeatures:
    """40 % of an 80 GB card held, GPUs at zero: what an abandoned allocation looks like."""
    values: dict[str, Any] = {
        "mean_util": 0.0,
        "p95_util": 0.0,
        "zero_seconds": 1.0,
        "busy_cv": 0.0,
        "busy_level": 0.0,
        "busy_seconds": 0,
        "mem_fraction": 0.5,
        "mem_stability": 0.0,
        "node_front_bps": 0.0,
    }
    return features(**(values | fields))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"mean_util": 1.9, "p95_util": 5.0, "zero_seconds": 0.9}, IDLE),
        ({"mean_util": 2.1, "p95_util": 5.0, "zero_seconds": 0.9}, None),
        ({"mean_util": 1.0, "p95_util": 9.9, "zero_seconds": 0.9}, IDLE),
        ({"mean_util": 1.0, "p95_util": 10.1, "zero_seconds": 0.9}, None),
    ],
)
def test_idle_below_2_percent_mean_and_10_percent_p95(fields: dict[str, Any], expected: WorkloadClass | None) -> None:
    result = classify(near_idle(**fields))
    if expected is IDLE:
        assert result.workload_class is IDLE and result.confidence >= 0.9
    else:
        assert result.workload_class is not IDLE


def test_background_traffic_does_not_make_an_idle_allocation_a_service() -> None:
    """The node sends 1 MB/s of its own; where it could not be measured, that traffic is nobody's evidence."""
    unknown_baseline = near_idle(egress_bps=1e6, ingress_bps=0.1e6)
    assert classify(unknown_baseline).workload_class is IDLE
    # its GPUs did nothing: whatever traffic is left over served nobody
    measured = near_idle(egress_bps=300e3, front_baseline_bps=60e3, baseline_from="node")
    assert classify(measured).workload_class is IDLE
    own = near_idle(egress_bps=300e3, own_network=True)  # a sidecar's scrapes in its own namespace
    assert classify(own).workload_class is IDLE


@pytest.mark.parametrize(
    ("fields", "answering"),
    [
        ({"egress_bps": 21e3}, True),
        ({"egress_bps": 19e3}, False),
        ({"egress_bps": 50e3, "zero_seconds": 0.994}, True),
        ({"egress_bps": 50e3, "zero_seconds": 0.996}, False),
        ({"egress_bps": 50e3, "own_network": False, "front_baseline_bps": 60e3, "node_share": 1.0}, True),
        ({"egress_bps": 50e3, "own_network": False, "front_baseline_bps": 60e3, "node_share": 0.7}, False),
        ({"egress_bps": 50e3, "own_network": False}, False),
    ],
)
def test_a_quiet_service_answers_with_its_own_traffic_while_its_gpus_work(
    fields: dict[str, Any], answering: bool
) -> None:
    f = near_idle(**({"mean_util": 0.5, "p95_util": 3.0, "zero_seconds": 0.9, "own_network": True} | fields))
    assert (classify(f).workload_class is not IDLE) is answering, classify(f)


def test_two_connected_clients_make_a_quiet_service_one_a_notebook_browser() -> None:
    service = classify(near_idle(listen_ports=(8000,), inbound_connections=4, inbound_peers=2))
    assert service.workload_class is INF
    browser = classify(near_idle(listen_ports=(8888,), inbound_connections=3, inbound_peers=1))
    assert browser.workload_class is NB and browser.confidence < 0.6  # attended, but not to be acted on
    assert classify(near_idle(listen_ports=(8888,), inbound_connections=0, inbound_peers=0)).workload_class is IDLE


def test_an_idle_notebook_kernel_is_interactive_at_low_confidence() -> None:
    result = classify(near_idle(program="ipykernel_launcher"))
    assert result.workload_class is NB and result.confidence < 0.6


# ---------------------------------------------------------------------------------------------- decisions


def test_three_windows_are_needed() -> None:
    busy_training = {"gpus": 8, "mean_util": 92.0, "gpu_link_bps": 60e9, "write_bursts": 1}
    assert classify(features(**(busy_training | {"windows": 2}))).workload_class is UNKNOWN
    assert classify(features(**(busy_training | {"windows": 3}))).workload_class is TR


def test_confidence_grows_with_windows_up_to_six() -> None:
    busy_training = {"gpus": 8, "mean_util": 92.0, "gpu_link_bps": 60e9, "write_bursts": 2, "period_s": 6}
    confidences = [classify(features(**(busy_training | {"windows": w}))).confidence for w in (3, 5, 6, 12)]
    assert confidences[0] < confidences[1] < confidences[2] == confidences[3]


def test_a_serving_engine_name_alone_is_not_acted_on() -> None:
    """Busy, flat, memory-bound and named like vLLM: offline generation looks the same; with no client seen,
    the lean towards serving stays under the planner's confidence."""
    flat = {"mean_util": 97.0, "p95_util": 99.0, "busy_cv": 0.02, "mem_fraction": 0.9, "mem_stability": 0.0}
    engine = classify(features(gpus=8, hint="VLLM::EngineCor", gpu_link_bps=6e9, lockstep=0.99, **flat))
    assert engine.workload_class in (INF, UNKNOWN) and engine.confidence < 0.6
    serving = features(gpus=8, hint="VLLM::EngineCor", gpu_link_bps=6e9, lockstep=0.99, **flat)
    served = classify(replace(serving, listen_ports=(8000,), inbound_connections=40, inbound_peers=12))
    assert served.workload_class is INF and served.confidence >= 0.6
    offline = classify(replace(serving, program="vllm", inbound_connections=0, inbound_peers=0))
    assert offline.workload_class is not INF  # vllm run-batch: busy with nobody connected


# ------------------------------------------------------------------------------- archetypes from real systems

FLAT_BUSY = {"mean_util": 95.0, "p95_util": 98.0, "busy_cv": 0.03, "busy_level": 95.0, "mem_stability": 0.001}
ARCHETYPES = [
    (
        "data-parallel training: all-reduce over NVLink, checkpoints, lockstep",
        {"gpus": 8, **FLAT_BUSY, "gpu_link_bps": 90e9, "write_bursts": 2, "checkpoint_windows": 0.1, "intensity": 0.9},
        TR,
    ),
    (
        "batch encoding on 4 GPUs: replicas apart, reads input, writes vectors, nobody connected",
        {
            "gpus": 4,
            **FLAT_BUSY,
            "lockstep": 0.05,
            "intensity": 0.88,
            "ingress_bps": 12e6,
            "own_network": True,
            "write_bps": 8e6,
            "inbound_connections": 0,
            "inbound_peers": 0,
        },
        BAT,
    ),
    (
        "batch encoding on one GPU: results written steadily, no saves, nobody connected",
        {**FLAT_BUSY, "intensity": 0.9, "write_bps": 6e6, "inbound_connections": 0, "inbound_peers": 0},
        BAT,
    ),
    (
        "a continuous-batching server: clients, memory-bound, flat KV cache",
        {
            "gpus": 2,
            **FLAT_BUSY,
            "mem_fraction": 0.9,
            "intensity": 0.55,
            "lockstep": 0.95,
            "gpu_link_bps": 4e9,
            "listen_ports": (8000,),
            "inbound_connections": 60,
            "inbound_peers": 15,
            "own_network": True,
            "egress_bps": 300e3,
        },
        INF,
    ),
    (
        "a notebook: idle most seconds, bursts between",
        {
            "mean_util": 12.0,
            "p95_util": 85.0,
            "zero_seconds": 0.8,
            "busy_level": 70.0,
            "busy_seconds": 120,
            "busy_cv": 0.2,
        },
        NB,
    ),
]


@pytest.mark.parametrize(("what", "fields", "cls"), ARCHETYPES, ids=[a[0] for a in ARCHETYPES])
def test_archetypes_of_real_workloads_without_names(what: str, fields: dict[str, Any], cls: WorkloadClass) -> None:
    values = dict(fields)
    gpus = values.pop("gpus", 1)
    result = classify(features(gpus, **values))
    assert result.workload_class is cls and result.confidence >= 0.6, (what, result)


def test_one_job_across_nodes_is_training_evidence() -> None:
    assert weigh(features(gpus=8, nodes=2))[TR] > weigh(features(gpus=8))[TR]


def test_close_evidence_is_unknown_and_clear_evidence_is_not() -> None:
    """Dense, busy, reading its input and nothing else: training and batch scoring both do that. One checkpoint
    burst settles it."""
    dense = {**FLAT_BUSY, "intensity": 0.9, "own_network": True, "ingress_bps": 30e6}
    assert classify(features(**dense)).workload_class is UNKNOWN
    assert classify(features(**dense, write_bursts=1, checkpoint_windows=0.1)).workload_class is TR


@pytest.mark.parametrize(("zero_seconds", "idle"), [(0.81, True), (0.79, False)])
def test_gpus_at_work_a_fifth_of_the_seconds_are_not_idle(zero_seconds: float, idle: bool) -> None:
    """A trickle of requests runs kernels now and then; an abandoned allocation reads 0 % every second."""
    f = near_idle(mean_util=1.0, p95_util=4.0, zero_seconds=zero_seconds, busy_seconds=3)
    assert (classify(f).workload_class is IDLE) is idle, classify(f)


@pytest.mark.parametrize(
    ("history", "idle"),
    [
        ({"daily_peak_p95": 31.0, "history_hours": 20.0}, False),
        ({"daily_peak_p95": 29.0, "history_hours": 20.0}, True),
        ({"daily_peak_p95": 80.0, "history_hours": 0.9}, True),
    ],
)
def test_an_allocation_busy_earlier_in_the_day_is_quiet_not_idle(history: dict[str, float], idle: bool) -> None:
    """At its nightly trough a service may run nothing for a while; the day's digests remember its peak."""
    result = classify(near_idle(**history))
    assert (result.workload_class is IDLE) is idle, result
    if not idle:
        assert result.confidence < 0.6  # nothing to act on either way


@pytest.mark.parametrize(
    ("fields", "idle"),
    [
        ({"busy_seconds": 5, "busy_level": 68.0}, False),
        ({"busy_seconds": 4, "busy_level": 68.0}, True),
        ({"busy_seconds": 18, "busy_level": 31.0}, False),
        ({"busy_seconds": 18, "busy_level": 29.0}, True),
    ],
)
def test_a_cell_run_between_idle_minutes_is_a_notebook_not_an_idle_allocation(
    fields: dict[str, Any], idle: bool
) -> None:
    """A Jupyter kernel holds its memory for hours and runs a cell now and then (seconds at a model's level):
    its mean stays under 2 %, yet someone is at it. Red when the idle gate ignores the cell's run (the
    notebook is reclaimed as idle at 0.95), or when CELL_SECONDS (5 s) or CELL_LEVEL (30 %) moves past a row."""
    f = near_idle(mean_util=1.5, p95_util=1.0, zero_seconds=0.98, **fields)
    result = classify(f)
    if idle:
        assert result.workload_class is IDLE, result
    else:
        assert result.workload_class is NB, result


def test_busy_gpus_moving_apart_are_counted_once_for_batch() -> None:
    """Replicas whose load moves apart and busy GPUs exchanging nothing are one fact about the same GPUs: a few
    more bytes between them (2.1 GB/s, past the 2 GB/s of the bytes rule) must not change the evidence while the
    correlation already says replicas. Red when the bytes rule fires beside the replicas rule (1 nat more for
    batch)."""
    both = weigh(features(2, mean_util=75.0, lockstep=0.2))
    replicas_only = weigh(features(2, mean_util=75.0, lockstep=0.2, gpu_link_bps=2.1e9))
    assert both == pytest.approx(replicas_only)
    # where the correlation is unknown, the bytes still speak
    assert weigh(features(2, mean_util=75.0))[BAT] > weigh(features(2, mean_util=75.0, gpu_link_bps=2.1e9))[BAT]


@pytest.mark.parametrize(
    ("fields", "acted_on"),
    [
        ({"mean_util": 60.0, "lockstep": 0.2}, False),
        ({"mean_util": 60.0, "lockstep": 0.2, "inbound_connections": 0}, True),
        ({"mean_util": 75.0, "intensity": 0.9}, False),
        ({"mean_util": 75.0, "intensity": 0.9, "inbound_connections": 0}, True),
    ],
)
def test_replicas_alone_are_not_acted_on_as_batch(fields: dict[str, Any], acted_on: bool) -> None:
    """A service's per-GPU workers exchange nothing and move apart as batch replicas do, so replicas alone (read
    from their correlation, or from busy GPUs whose links carry no bytes) lean to batch without reaching acting
    confidence; nobody connected to a busy workload (schema 2) is what batch alone shows. Red when _defining(BAT)
    counts replicas again, by correlation (the first row reaches 0.69) or by bytes (the third, dense kernels at
    75 %, reaches 0.63)."""
    f = features(2, busy_cv=0.05, **fields)
    result = classify(f)
    assert result.workload_class is BAT, result
    assert (result.confidence >= 0.6) is acted_on, result
