"""What the optimizer keeps of a window: all its GPUs in one packed array, read back as they were taken in."""

from __future__ import annotations

import gc
import math
import os
import tracemalloc

import pytest

from agent.protocol import Birth, Telemetry
from agent.simulate import offline_windows
from collectors.sim.scenarios import build_scenario
from optimizer.ingest.digest import HEAD, GpuDigest, GpuRows, KnownRefs, WindowDigest, digest
from optimizer.ingest.window import as_window


@pytest.fixture(scope="module")
def node() -> tuple[Birth, Telemetry]:
    for spec in build_scenario("mixed", 6, seed=1):
        birth, windows = offline_windows(spec, 2, site="s", seed=1)
        if len(windows[-1].gpus) == 8 and all(g.util is not None for g in windows[-1].gpus):
            return birth, windows[-1]
    raise AssertionError("no node of 8 GPUs in the scenario")


def _retained_once(window: Telemetry, birth: Birth) -> tuple[int, int, WindowDigest]:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        kept = digest(as_window(window), birth, {})
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    # Only what the optimizer's own code allocated: in a long run another test's thread, or a cache another module
    # fills lazily, may allocate a block between the two snapshots.
    only_ours = [tracemalloc.Filter(True, f"*{os.sep}optimizer{os.sep}*")]
    diff = after.filter_traces(only_ours).compare_to(before.filter_traces(only_ours), "filename")
    return sum(d.count_diff for d in diff), sum(d.size_diff for d in diff), kept


def _retained(window: Telemetry, birth: Birth) -> tuple[int, int, WindowDigest]:
    """(blocks, bytes) allocated by ``digest`` that the digest holds on to: the least of three reads, so that a
    one-off allocation elsewhere in the process is not read as the digest's."""
    reads = [_retained_once(window, birth) for _ in range(3)]
    return min(reads, key=lambda r: (r[0], r[1]))


def test_a_windows_gpus_cost_no_allocation_of_their_own(node: tuple[Birth, Telemetry]) -> None:
    """A node keeps 60 windows of 8 GPUs: an object per GPU per window was half the steady state's bytes in
    headers and allocations (docs/operations.md, "Memory per node"). Eight GPUs take as many allocations as one,
    and what each adds is its figures: 4 bytes each, a row of ``HEAD`` + 1 + its seconds."""
    birth, window = node
    one = window.model_copy(update={"gpus": window.gpus[:1]})
    # what is worked out once per birth, and warmed caches
    digest(as_window(window), birth, {})
    digest(as_window(one), birth, {})
    blocks_one, bytes_one, _ = _retained(one, birth)
    blocks_all, bytes_all, kept = _retained(window, birth)
    # An object per GPU would add seven blocks; a block more or less is a dict or cache of the interpreter's
    # resizing between the reads, which a long run sees now and then.
    assert abs(blocks_all - blocks_one) <= 2
    assert kept.gpu_rows.gpu_count == 8
    row = 4 * (HEAD + 1 + len(window.gpus[0].util_series))
    # pymalloc rounds a block up to 16 bytes, and a buffer may move from pymalloc to the system allocator
    assert (bytes_all - bytes_one) / 7 <= row + 16


def test_gpus_read_back_as_taken_in(node: tuple[Birth, Telemetry]) -> None:
    birth, window = node
    kept = digest(as_window(window), birth)
    assert [g.index for g in kept.gpu_rows.views()] == [g.index for g in window.gpus]
    for g, sent in zip(kept.gpu_rows.views(), window.gpus, strict=True):
        assert sent.util is not None
        assert g.util_mean == pytest.approx(sent.util.mean, rel=1e-6)
        assert g.util_p95 == pytest.approx(sent.util.p95, rel=1e-6)
        assert list(g.series) == pytest.approx(sent.util_series, rel=1e-6)
        assert (g.mem_max_mib is None) == (sent.mem_used_mib is None)


def test_series_of_unequal_length_are_kept_whole() -> None:
    """A GPU that missed a sample has a shorter series than the others; padding never reads as seconds."""
    gpus = [
        GpuDigest.of(0, 50.0, 60.0, 5.0, [40.0, 50.0, 60.0], mem_max_mib=1000.0),
        GpuDigest.of(3, 10.0, 12.0, 1.0, [10.0]),
        GpuDigest.of(5, 0.0, 0.0, 0.0, []),
    ]
    rows = GpuRows.of(gpus)
    assert rows.gpu_count == 3
    assert rows.width == HEAD + 1 + 3
    assert list(rows.column(0)) == [0.0, 3.0, 5.0]
    back = rows.views()
    assert [g.tobytes() for g in back] == [g.tobytes() for g in gpus]  # the same figures, bit for bit
    assert [len(g.series) for g in back] == [3, 1, 0]
    assert back[1].mem_max_mib is None and math.isclose(back[0].mem_max_mib or 0.0, 1000.0)
    assert rows.starts({3, 5}) == [1 + rows.width, 1 + 2 * rows.width]
    empty = GpuRows.of([])
    assert empty.gpu_count == 0 and empty.views() == () and empty.starts({0}) == []


def test_a_gpu_that_missed_a_sample_keeps_its_shorter_series(node: tuple[Birth, Telemetry]) -> None:
    birth, window = node
    short = window.gpus[1].model_copy(update={"util_series": window.gpus[1].util_series[:-1]})
    empty = window.gpus[2].model_copy(update={"util_series": []})
    gpus = [window.gpus[0], short, empty, *window.gpus[3:]]
    kept = digest(as_window(window.model_copy(update={"gpus": gpus})), birth)
    assert [len(g.series) for g in kept.gpu_rows.views()] == [len(g.util_series) for g in gpus]
    assert kept.gpu_rows.width == HEAD + 1 + max(len(g.util_series) for g in gpus)
    for g, sent in zip(kept.gpu_rows.views(), gpus, strict=True):
        assert list(g.series) == pytest.approx(sent.util_series, rel=1e-6)


def _fresh_ids(window: Telemetry) -> Telemetry:
    """The window as decoded anew: its workload ids equal strings, but objects of their own."""
    refs = [r.model_copy(update={"id": "".join(list(r.id))}) for r in window.workloads]
    return window.model_copy(update={"workloads": refs})


def test_a_nodes_windows_share_its_workloads_and_their_ids(node: tuple[Birth, Telemetry]) -> None:
    """Window after window a node reports the same workloads: the digests hold one tuple of one set of references,
    and what changes per window (``Volatile``) names its workload by the interned reference's id."""
    birth, window = node
    known: KnownRefs = {}
    first = digest(as_window(_fresh_ids(window)), birth, known)
    again = digest(as_window(_fresh_ids(window)), birth, known, first.workloads)
    assert again.workloads is first.workloads
    assert again.volatile, "the scenario's workloads report their own traffic"
    ids = [r.id for r in first.workloads]
    assert all(any(v.workload is i for i in ids) for v in again.volatile)
    other = window.workloads[0].model_copy(update={"id": "k8s/someone-else"})
    changed = digest(as_window(window.model_copy(update={"workloads": [other]})), birth, known, first.workloads)
    assert [r.id for r in changed.workloads] == ["k8s/someone-else"]
    # a workload whose name changes every window is one reference, its latest: what a node keeps stays one an id
    ids = {r.id for r in window.workloads} | {"k8s/someone-else"}
    for i in range(50):
        renamed = window.workloads[0].model_copy(update={"name": f"renamed-{i}"})
        kept = digest(as_window(window.model_copy(update={"workloads": [renamed]})), birth, known)
        assert kept.workloads[0].name == f"renamed-{i}"
    assert set(known) == ids
