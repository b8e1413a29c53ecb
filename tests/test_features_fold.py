"""A workload's windows folded as arrays give the features the window-by-window fold gives."""

from __future__ import annotations

import dataclasses
import math
import random
import tracemalloc
from array import array
from typing import Any

import pytest
from conftest import simulated_fleet

from optimizer.decide import features
from optimizer.decide.features import _Acc, _fold_run, _fold_window
from optimizer.ingest.digest import ROW_SERIES_AT, GpuDigest, GpuRows, WindowDigest
from optimizer.ingest.fleet import Fleet


def window(rng: random.Random, seq: int, gpus: list[int], seconds: int) -> WindowDigest:
    digests = []
    for index in gpus:
        level = rng.choice([0.0, 3.0, 30.0, 55.0, 97.0])
        series = [min(100.0, max(0.0, level + rng.uniform(-8, 8))) for _ in range(seconds)]
        mean = math.fsum(series) / len(series) if series else level
        digests.append(
            GpuDigest.of(
                index,
                mean,
                max(series, default=level),
                rng.uniform(0, 10),
                series,
                mem_max_mib=rng.choice([None, rng.uniform(1000, 80000)]),
                link_bps=rng.uniform(0, 1e9),
                power_frac=rng.choice([None, rng.uniform(0.1, 1.0)]),
                tensor_active=rng.choice([None, rng.uniform(0, 60)]),
                dram_active=rng.choice([None, rng.uniform(0, 60)]),
            )
        )
    return WindowDigest(seq, seq, seq * 10.0, seq * 10.0 + 10, GpuRows.of(digests), 0.0, 0.0, 0.0, ())


def close(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-9, abs=1e-9)
    if isinstance(a, list | tuple | array) and isinstance(b, list | tuple | array):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    ("gpus", "held"), [([0], {0}), ([0, 1, 2, 3], {1, 2}), ([0, 1], {0, 1}), ([4, 5, 6], {4, 5, 6})]
)
def test_windows_folded_together_match_one_by_one(seed: int, gpus: list[int], held: set[int]) -> None:
    rng = random.Random(seed)
    seconds = rng.choice([1, 2, 10])
    windows = [window(rng, seq, gpus, seconds) for seq in range(12)]
    rows = [(w, tuple(sorted(held)), rng.uniform(0, 1e6), rng.uniform(0, 1e6), rng.random() < 0.2) for w in windows]
    together, alone = _Acc(), _Acc()
    _fold_run(together, rows, held, "node-a")
    for w, _, east, north, ckpt in rows:
        _fold_window(alone, w, held, east, north, ckpt, "node-a")
    assert together.windows == alone.windows == len(windows)
    for name in (f.name for f in dataclasses.fields(_Acc)):
        assert close(getattr(together, name), getattr(alone, name)), name


def test_windows_whose_gpus_differ_are_folded_one_by_one() -> None:
    rng = random.Random(9)
    windows = [window(rng, seq, [0, 1] if seq % 3 else [0], 10) for seq in range(9)]  # GPU 1 lost now and then
    both: tuple[int, ...] = (0, 1)
    rows = [(w, both, 1.0, 2.0, False) for w in windows]
    together, alone = _Acc(), _Acc()
    _fold_run(together, rows, {0, 1}, "n")
    for w, _, east, north, ckpt in rows:
        _fold_window(alone, w, {0, 1}, east, north, ckpt, "n")
    assert close(dataclasses.asdict(together), dataclasses.asdict(alone))


@pytest.mark.parametrize("together", [True, False])
def test_figures_per_second_are_held_packed(together: bool) -> None:
    """Every workload's figures are held until the last node is folded: an hour of 8 GPUs at 1 Hz is 4,800 of a
    GPU's own seconds and 600 of the workload's load in each of four series. Packed (float32 for a GPU's own
    series, as the digest keeps them; float64 for what is worked out from them) that is ~40 KB; as lists of
    float objects (8 bytes of pointer and 24 of object each) ~330 KB."""
    rng = random.Random(3)
    gpus = list(range(8))
    rows = [(window(rng, seq, gpus, 10), tuple(gpus), 1.0, 2.0, False) for seq in range(60)]
    acc = _Acc()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        if together:
            _fold_run(acc, rows, set(gpus), "n")
        else:
            for w, _, east, north, ckpt in rows:
                _fold_window(acc, w, set(gpus), east, north, ckpt, "n")
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(acc.per_gpu) == 8
    assert sum(map(len, acc.per_gpu.values())) == 4800
    assert len(acc.load) == len(acc.spreads) == len(acc.centred) == 600
    # 4,800 float32 and 4 x 600 float64, with the per-window figures besides (a few dozen lists of 60 or 480)
    assert held < 100_000


def test_a_workloads_features_are_worked_out_once_its_last_node_is_folded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its figures are let go then, not held with every other workload's until the whole site is folded."""
    fleet, _ = simulated_fleet("mixed", 12, windows=6)
    events: list[tuple[str, str]] = []
    fold, finish = features._fold_windows, features._features

    def folding(acc: _Acc, rows: list[Any], node: str) -> None:
        events.append(("fold", node))
        fold(acc, rows, node)

    def finishing(fleet: Fleet, site: str, wid: str, acc: _Acc) -> features.WorkloadFeatures:
        done = finish(fleet, site, wid, acc)
        events.append(("features", max(done.nodes)))
        return done

    monkeypatch.setattr(features, "_fold_windows", folding)
    monkeypatch.setattr(features, "_features", finishing)
    out = features.workload_features(fleet, "s1")
    assert len(out) == sum(kind == "features" for kind, _ in events) > 10
    for at, (kind, last) in enumerate(events):
        if kind == "features":  # nothing of a node after its last has been folded yet; all of its own have
            assert all(node <= last for k, node in events[:at] if k == "fold")
            assert ("fold", last) in events[:at]


def test_a_longer_series_of_a_gpu_it_does_not_hold_reaches_none_of_its_figures() -> None:
    """A window's rows are as wide as its longest series: GPU 0 (another workload's) has a second more than the
    workload's own GPUs 1 and 2, whose rows are padded; the fold as arrays reads their seconds alone."""
    rng = random.Random(5)
    windows = []
    for seq in range(8):
        w = window(rng, seq, [1, 2], 10)
        longer = window(rng, seq, [0], 11)
        rows = GpuRows.of([*longer.gpu_rows.views(), *w.gpu_rows.views()])
        windows.append(dataclasses.replace(w, gpu_rows=rows))
    assert windows[0].gpu_rows.width == ROW_SERIES_AT + 11
    rows_of = [(w, (1, 2), 1.0, 2.0, False) for w in windows]
    together, alone = _Acc(), _Acc()
    _fold_run(together, rows_of, {1, 2}, "n")
    for w, _, east, north, ckpt in rows_of:
        _fold_window(alone, w, {1, 2}, east, north, ckpt, "n")
    assert together.seconds == alone.seconds == 8 * 2 * 10
    assert close(dataclasses.asdict(together), dataclasses.asdict(alone))
