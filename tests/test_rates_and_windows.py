"""Rates from counters (wrap, reset) and window statistics."""

from __future__ import annotations

import pytest

from agent.protocol import WorkloadKind, WorkloadRef
from agent.rates import WRAP_32, RateTracker
from agent.window import WindowBuilder
from collectors.base import Entity, Sample


def test_rate_is_increase_over_elapsed_time() -> None:
    r = RateTracker()
    assert r.update("k", 1000, 10.0) is None
    assert r.update("k", 3000, 12.0) == (2000.0, 2.0)


def test_32_bit_wrap_is_added_back() -> None:
    r = RateTracker()
    r.update("k", WRAP_32 - 100, 0.0)
    assert r.update("k", 400, 1.0) == (500.0, 1.0)
    assert r.resets == 0


def test_reset_yields_no_rate_and_is_counted() -> None:
    r = RateTracker()
    r.update("k", 10 * WRAP_32, 0.0)
    assert r.update("k", 5, 1.0) is None
    assert r.resets == 1
    assert r.update("k", 105, 2.0) == (100.0, 1.0)


def test_window_summarises_gauges_and_counter_rates() -> None:
    b = WindowBuilder("n1", "s1", session=4)
    for t in range(11):
        b.add(
            [
                Sample(Entity.GPU, "0", gauges={"util": 10.0 * (t % 2)}, counters={"pcie_tx_bps": 1000 * t}),
                Sample(Entity.NIC, "eth0", counters={"rx_bps": 50 * t, "tx_bps": 0, "errors": 2 * t, "drops": 0}),
                Sample(Entity.DISK, "nvme0n1", counters={"write_bps": 0 if t < 10 else 9000}),
                Sample(Entity.HOST, "host", gauges={"cpu_util": 50.0}),
            ],
            float(t),
        )
    ref = WorkloadRef(id="w1", kind=WorkloadKind.PROCESS_GROUP, name="w1", gpus=[0])
    w = b.close(seq=7, start=0.0, end=10.0, workloads=[ref])
    assert (w.node, w.site, w.session, w.seq, w.samples) == ("n1", "s1", 4, 7, 11)
    gpu = w.gpus[0]
    assert gpu.util is not None and gpu.util.mean == pytest.approx(10 * 5 / 11, rel=1e-3)
    assert gpu.util.max == 10.0
    assert gpu.pcie_tx_bps is not None and gpu.pcie_tx_bps.mean == 1000.0
    assert gpu.util_series[:3] == [0.0, 10.0, 0.0]
    assert gpu.workload == "w1"
    nic = w.nics[0]
    assert nic.rx_bps is not None and nic.rx_bps.mean == 50.0
    assert nic.errors == 20  # a count over the window, not a rate
    disk = w.disks[0]
    assert disk.write_bps is not None and disk.write_bps.max == 9000.0 and disk.write_bps.mean == 900.0
    assert w.host.cpu_util is not None and w.host.cpu_util.mean == 50.0
    # The next window starts empty but keeps counter history: its first second already has a rate.
    b.add([Sample(Entity.GPU, "0", counters={"pcie_tx_bps": 13000})], 11.0)
    nxt = b.close(seq=8, start=10.0, end=11.0, workloads=[])
    assert nxt.gpus[0].pcie_tx_bps is not None and nxt.gpus[0].pcie_tx_bps.mean == 3000.0


def test_a_gauge_past_its_bounds_is_dropped_not_the_window() -> None:
    b = WindowBuilder("n1", "s1", session=4)
    b.add([Sample(Entity.GPU, "0", gauges={"util": 40.0, "power_w": 300.0})], 0.0)
    # older amdsmi's 65535 for "not available", a negative power reading, an infinite host figure
    b.add([Sample(Entity.GPU, "0", gauges={"util": 65535.0, "power_w": -1.0}), _host(float("inf"))], 1.0)
    b.add([_host(101.0)], 2.0)
    gpu = b.close(seq=1, start=0.0, end=3.0, workloads=[]).gpus[0]
    assert gpu.util is not None and gpu.util.max == 40.0 and gpu.util_series == [40.0]
    assert gpu.power_w is not None and gpu.power_w.max == 300.0


def test_a_window_that_cannot_be_built_costs_that_window_only() -> None:
    b = WindowBuilder("n1", "s1", session=4)
    b.add([Sample(Entity.GPU, "0", gauges={"util": 50.0})], 0.0)
    with pytest.raises(ValueError, match="end precedes its start"):
        b.close(seq=1, start=5.0, end=1.0, workloads=[])  # end before start: no window
    b.add([Sample(Entity.GPU, "0", gauges={"util": 60.0})], 1.0)
    w = b.close(seq=2, start=1.0, end=2.0, workloads=[])
    assert w.samples == 1 and w.gpus[0].util_series == [60.0]


def _host(cpu: float) -> Sample:
    return Sample(Entity.HOST, "host", gauges={"cpu_util": cpu})
