"""Classification of what production fleets run: continuous-batching LLM servers busy 85-99 %, loader-bound and
adapter training, notebooks; confident answers are right; wrong node signals are corrected; labels are checked."""

from __future__ import annotations

import json
import math
import random
import re
import subprocess
from pathlib import Path

import pytest
from conftest import FLEETFIT, simulated_fleet

from agent.protocol import Birth, DiskInfo, DiskWindow, NicInfo, NicKind, NicRole, Stats, Telemetry, encode
from agent.simulate import offline_windows
from collectors.sim.scenarios import build_scenario
from collectors.sim.spec import Pattern
from collectors.storage import StorageCollector
from optimizer.commands.offline import PATTERN_CLASS, RecordingError, load_labels
from optimizer.decide.classify import classify
from optimizer.decide.features import step_period, workload_features
from optimizer.ingest.digest import digest, roles
from optimizer.ingest.window import as_window


@pytest.mark.parametrize(("seed", "names"), [(11, True), (12, True), (13, False)])
def test_confident_answers_on_a_realistic_fleet_are_right(seed: int, names: bool) -> None:
    fleet, truth = simulated_fleet("realistic", 12, windows=36, seed=seed, names=names)
    confident = wrong = 0
    for f in workload_features(fleet, "s1"):
        result = classify(f)
        expected = PATTERN_CLASS[truth[f.id].value]
        if truth[f.id] is Pattern.INTERACTIVE and f.p95_util < 10:
            continue  # a notebook is judged from its first burst
        if result.confidence >= 0.6:
            confident += 1
            wrong += result.workload_class is not expected
        if truth[f.id] is Pattern.LLM_SERVING and f.mean_util >= 85:
            # The case the textbook rules got wrong: a busy, flat, steady server is serving, not training or batch.
            assert result.workload_class in (expected, result.workload_class.UNKNOWN), (f.name, result)
        if truth[f.id] in (Pattern.LOADER_BOUND_TRAINING, Pattern.LORA_FINE_TUNING):
            assert result.workload_class in (expected, result.workload_class.UNKNOWN), (f.name, result)
    assert confident >= 10 and wrong == 0, (confident, wrong)


def test_a_continuous_batching_server_says_why_in_words() -> None:
    fleet, truth = simulated_fleet("realistic", 12, windows=24, seed=4)
    features = workload_features(fleet, "s1")
    servers = [f for f in features if truth[f.id] is Pattern.LLM_SERVING and f.mean_util >= 80 and f.program]
    assert servers
    for f in servers:
        result = classify(f)
        assert result.workload_class is result.workload_class.INFERENCE, (f.name, result)
        text = " ".join(result.evidence)
        assert "listening on :" in text and "client" in text, text


def _window(node: str, disks: dict[str, float]) -> Telemetry:
    return Telemetry(
        node=node, site="s", session=1, seq=0, start=0.0, end=10.0, samples=10,
        disks=[DiskWindow(name=n, write_bps=Stats(v / 2, v, v, 0.0)) for n, v in disks.items()],
    )  # fmt: skip


def test_raid_members_are_not_counted_twice() -> None:
    writes = {"nvme0n1": 100e6, "nvme1n1": 100e6, "md127": 200e6}
    old = Birth(node="n", site="s", session=1, agent_version="0.1", hostname="n", timestamp=0.0)
    assert digest(as_window(_window("n", writes)), old).peak_write_bps == 200e6  # an old agent: the md device alone
    marked = old.model_copy(
        update={"disks": [DiskInfo(name="nvme0n1", member_of="md127"), DiskInfo(name="nvme1n1", member_of="md127")]}
    )
    assert digest(as_window(_window("n", writes | {"sda": 5e6})), marked).peak_write_bps == 205e6


def test_an_old_agents_rdma_front_end_is_read_as_the_front_end() -> None:
    def birth(*nics: tuple[str, NicKind, NicRole]) -> Birth:
        return Birth(
            node="n", site="s", session=1, agent_version="0.1", hostname="n", timestamp=0.0,
            nics=[NicInfo(name=n, kind=k, role=r) for n, k, r in nics],
        )  # fmt: skip

    ew, ns = NicRole.EAST_WEST, NicRole.NORTH_SOUTH
    only_roce = birth(("eth0", NicKind.ROCE, ew), ("eth1", NicKind.ROCE, ew))
    assert roles(only_roce) == {"eth0": ns, "eth1": ns}
    with_ib = birth(("ib0", NicKind.INFINIBAND, ew), ("ens1", NicKind.ROCE, ew))
    assert roles(with_ib) == {"ib0": ew, "ens1": ns}
    fabric = birth(("roce0", NicKind.ROCE, ew), ("eth0", NicKind.ETHERNET, ns))
    assert roles(fabric) == {"roce0": ew, "eth0": ns}  # a node that names its front end is believed


def test_labels_files_accept_classes_and_patterns_and_refuse_unknown_ones(tmp_path: Path) -> None:
    csv_file = tmp_path / "labels.csv"
    csv_file.write_text("workload,label\nk8s/a,llm_serving\nk8s/b,training\nk8s/c, Batch_Inference \n")
    assert {k: v.value for k, v in load_labels(csv_file).items()} == {
        "k8s/a": "inference", "k8s/b": "training", "k8s/c": "batch_inference",
    }  # fmt: skip
    bad = tmp_path / "labels.json"
    bad.write_text(json.dumps({"k8s/a": "serving", "k8s/b": "trainig", "k8s/c": "idle"}))
    with pytest.raises(RecordingError, match=r"unknown label\(s\) 'serving', 'trainig'"):
        load_labels(bad)


def test_classify_scores_a_recording_with_a_labels_file_and_refuses_a_bad_one(tmp_path: Path) -> None:
    recording, labels = tmp_path / "fleet.jsonl", {}
    lines = []
    for node in build_scenario("demo", 8, seed=2):
        birth, windows = offline_windows(node, 6, site="s")
        labels.update({w.id: w.pattern.value for w in node.workloads})
        lines += [encode(birth).decode(), *(encode(w).decode() for w in windows)]
    recording.write_text("\n".join(lines) + "\n")
    good = tmp_path / "labels.json"
    good.write_text(json.dumps(labels))
    done = subprocess.run(
        [FLEETFIT, "classify", str(recording), "--labels", str(good)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    # every labelled workload is scored: the confusion matrix counts them all, whatever the classifier says
    printed = re.search(r"macro-F1 ([0-9.]+), accuracy ([0-9.]+) over (\d+) workload", done.stdout)
    assert printed is not None, done.stdout
    assert int(printed[3]) == len(labels)
    bad = tmp_path / "bad.csv"
    bad.write_text("k8s/x,gpu-hog\n")
    done = subprocess.run(
        [FLEETFIT, "classify", str(recording), "--labels", str(bad)], capture_output=True, text=True, check=False
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "unknown label(s) 'gpu-hog'" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_the_agent_marks_raid_members_from_sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for disk in ("nvme0n1", "nvme1n1", "md127", "sda"):
        (tmp_path / "block" / disk / "holders").mkdir(parents=True)
        (tmp_path / "block" / disk / "size").write_text("1000\n")
    for member in ("nvme0n1", "nvme1n1"):
        (tmp_path / "block" / member / "holders" / "md127").mkdir()
    storage = StorageCollector(sysfs_root=tmp_path)
    monkeypatch.setattr(storage, "_counters", lambda: dict.fromkeys(("nvme0n1", "nvme1n1", "md127", "sda")))
    members = {d.name: d.member_of for d in storage.inventory().disks}
    assert members == {"md127": None, "nvme0n1": "md127", "nvme1n1": "md127", "sda": None}


def test_a_step_period_is_found_only_where_load_repeats() -> None:
    rng = random.Random(5)
    square = [95.0 if (t % 6) < 3 else 2.0 for t in range(300)]
    assert step_period(square)[0] == 6
    alternating = [90.0 if t % 2 else 10.0 for t in range(300)]
    assert step_period(alternating)[0] is None  # at 1 Hz, every other second is aliasing, not a step
    arrivals = [min(100.0, 60 * math.exp(rng.gauss(0, 0.3))) for _ in range(300)]
    assert step_period(arrivals)[0] is None
    level, bursts = 0.0, []
    for _ in range(300):  # a notebook's cells: bursts that persist and fade
        level = 90.0 if rng.random() < 0.02 else level * 0.9
        bursts.append(level)
    assert step_period(bursts)[0] is None
