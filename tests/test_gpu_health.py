"""What a fleet needs to know of a GPU's health and limits, read as real drivers report them: the power limit in
force window by window (NVIDIA, AMD, Gaudi), and the power fraction the optimizer works out from it."""

from __future__ import annotations

import time
from pathlib import Path

import pynvml
from fake_amdsmi import FakeAmdGpu, make_fake_amdsmi
from fake_hlml import FakeGaudi, make_fake_hlml
from fake_nvml import FakeGpu, make_fake_nvml

from agent.protocol import Birth, GpuInfo, GpuWindow, Stats, Telemetry
from agent.window import WindowBuilder
from collectors.amd import open_amd_collector
from collectors.attribution import Attributor
from collectors.base import Sample
from collectors.gaudi import open_gaudi_collector
from collectors.gpu import POWER_LIMIT_S, NvmlGpuCollector, open_gpu_collector
from optimizer.ingest.digest import digest
from optimizer.ingest.window import as_window


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Sampled:
    def sample(self) -> list[Sample]: ...


def _window(
    collector: _Sampled, clock: Clock, seconds: int = 3, builder: WindowBuilder | None = None
) -> list[GpuWindow]:
    """One window of ``seconds`` one-second samples, as the agent builds it (``builder``: the agent's, kept from
    window to window, so counts run on from the last one)."""
    builder = builder or WindowBuilder("n1", "s1", 1)
    start = clock.now
    for _ in range(seconds):
        builder.add(collector.sample(), clock.now)
        clock.now += 1
    return builder.close(0, start, clock.now, []).gpus


def _nvml(gpus: list[FakeGpu], root: Path, clock: Clock) -> NvmlGpuCollector:
    collector = open_gpu_collector(make_fake_nvml(gpus), Attributor(root, node="n1"), clock)
    assert isinstance(collector, NvmlGpuCollector)
    return collector


# ---------------------------------------------------------------- power limit


def test_the_nvidia_window_carries_the_enforced_limit_as_it_changes(tmp_path: Path) -> None:
    """Deliberate bugs caught: reading the management limit (700 W) rather than the enforced one, which the BMC
    holds at 400 W; and reading it at birth only, so the operator's later 500 W never reaches a window."""
    gpu = FakeGpu(power_limit_mw=700_000, external_cap_mw=400_000)
    clock = Clock()
    collector = _nvml([gpu], tmp_path, clock)
    assert collector.inventory().gpus[0].power_limit_w == 400
    assert _window(collector, clock)[0].power_limit_w == 400
    gpu.external_cap_mw, gpu.power_limit_mw = None, 500_000  # the BMC lets go; an operator sets 500 W
    clock.now += POWER_LIMIT_S
    assert _window(collector, clock)[0].power_limit_w == 500


def test_a_driver_without_the_enforced_limit_gives_the_management_limit(tmp_path: Path) -> None:
    gpu = FakeGpu(power_limit_mw=600_000, unsupported={"enforced_limit"})
    clock = Clock()
    assert _window(_nvml([gpu], tmp_path, clock), clock)[0].power_limit_w == 600


def test_the_amd_window_carries_the_power_cap_in_force(tmp_path: Path) -> None:
    """Deliberate bug caught: AMD's power cap never read (no limit in the birth or the window, so no power
    fraction for any AMD GPU); amdsmi gives it in µW, so a unit slip reads 500,000,000 W or 0.0005 W."""
    gpu = FakeAmdGpu(power_cap_w=500)
    clock = Clock()
    collector = open_amd_collector(make_fake_amdsmi([gpu]), Attributor(tmp_path), clock)
    assert collector is not None
    assert collector.inventory().gpus[0].power_limit_w == 500
    assert _window(collector, clock)[0].power_limit_w == 500
    gpu.power_cap_w = 450
    clock.now += POWER_LIMIT_S
    assert _window(collector, clock)[0].power_limit_w == 450


def test_the_gaudi_window_carries_the_current_limit_not_the_default(tmp_path: Path) -> None:
    """Deliberate bug caught: reading HLML's default limit (600 W) where the device runs at 450 W; a binding
    without the current-limit call leaves the window without one rather than claiming the default."""
    clock = Clock()
    collector = open_gaudi_collector(make_fake_hlml([FakeGaudi(limit_mw=450_000)]), Attributor(tmp_path), clock)
    assert collector is not None
    assert collector.inventory().gpus[0].power_limit_w == 450
    assert _window(collector, clock)[0].power_limit_w == 450
    old = open_gaudi_collector(make_fake_hlml([FakeGaudi()], current_limit=False), Attributor(tmp_path), clock)
    assert old is not None
    assert old.inventory().gpus[0].power_limit_w == 600  # the birth says the default, as before
    assert _window(old, clock)[0].power_limit_w is None


def test_the_power_fraction_is_of_the_limit_the_window_ran_under() -> None:
    """Deliberate bug caught: dividing by the birth's limit: 300 W of a 700 W birth limit is 0.43, but the GPU ran
    capped at 400 W, where 300 W is 0.75 of what it could draw."""
    birth = Birth(
        node="n1", site="s1", session=1, agent_version="t", hostname="n1", timestamp=time.time(),
        gpus=[GpuInfo(index=0, uuid="GPU-0", model="NVIDIA H100 80GB HBM3", memory_mib=81_559, power_limit_w=700.0)],
    )  # fmt: skip

    def window(limit: float | None) -> Telemetry:
        gpu = GpuWindow(index=0, util=Stats.of([50.0]), power_w=Stats.of([300.0]), power_limit_w=limit)
        return Telemetry(node="n1", site="s1", session=1, seq=1, start=0.0, end=1.0, samples=1, gpus=[gpu])

    (capped,) = digest(as_window(window(400.0)), birth).gpu_rows.views()
    (uncapped,) = digest(as_window(window(None)), birth).gpu_rows.views()
    assert capped.power_frac is not None and abs(capped.power_frac - 0.75) < 1e-6
    assert uncapped.power_frac is not None and abs(uncapped.power_frac - 300 / 700) < 1e-6


# ---------------------------------------------------------------- XID events


def test_a_lost_gpu_does_not_hide_the_other_gpus_xids(tmp_path: Path) -> None:
    """Deliberate bug caught: the drain stopping at the first error that is not a timeout. A lost GPU makes every
    wait on the set fail, so GPU 0's XID 79 would never be counted while GPU 1 stays lost; and the set made again
    without GPU 1 must take it back when it answers, or its XID 31 would go unseen."""
    healthy, lost = FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b")
    nvml = make_fake_nvml([healthy, lost])
    clock = Clock()
    collector = open_gpu_collector(nvml, Attributor(tmp_path, node="n1"), clock)
    lost.lost = True
    builder = WindowBuilder("n1", "s1", 1)
    _window(collector, clock, 1, builder)
    nvml.xid_queue.append((healthy, 79))  # type: ignore[attr-defined]
    gpus = {g.index: g for g in _window(collector, clock, 2, builder)}
    assert (gpus[0].xid_events, gpus[0].last_xid) == (1, 79)
    assert gpus[1].lost and set(nvml.wait_timeouts) == {0}  # type: ignore[attr-defined]  # a poll, never a block
    lost.lost = False  # back on the bus: its XIDs are counted again
    _window(collector, clock, 1, builder)
    nvml.xid_queue.append((lost, 31))  # type: ignore[attr-defined]
    gpus = {g.index: g for g in _window(collector, clock, 1, builder)}
    assert (gpus[1].xid_events, gpus[1].last_xid) == (1, 31)


def test_one_failed_wait_does_not_leave_the_xids_behind_it_for_later(tmp_path: Path) -> None:
    """Deliberate bug caught: returning at an interrupted wait (UNKNOWN): XID 48 would come a window late."""
    gpu = FakeGpu()
    nvml = make_fake_nvml([gpu])
    clock = Clock()
    collector = open_gpu_collector(nvml, Attributor(tmp_path, node="n1"), clock)
    builder = WindowBuilder("n1", "s1", 1)
    _window(collector, clock, 1, builder)
    nvml.event_faults.append(pynvml.NVML_ERROR_UNKNOWN)  # type: ignore[attr-defined]
    nvml.xid_queue.append((gpu, 48))  # type: ignore[attr-defined]
    (window,) = _window(collector, clock, 1, builder)
    assert (window.xid_events, window.last_xid) == (1, 48)


# ---------------------------------------------------------------- throttling and row remapping


def test_clock_events_violation_time_and_row_remaps_reach_the_window(tmp_path: Path) -> None:
    """Deliberate bugs caught: the reasons read only under their new name (a binding before 12.535 has only
    ...ThrottleReasons, so a power-capped GPU would read as unthrottled); violation time taken in the wrong unit
    (ns over 1e9 reads 0.5 for half of each second, not 50 %); a pending row remap not carried."""
    gpu = FakeGpu(clock_events=0x4 | 0x1, remap_pending=True)  # power cap, and idle (which costs nothing)
    clock = Clock()
    nvml = make_fake_nvml([gpu], clock_events_api="throttle")
    collector = open_gpu_collector(nvml, Attributor(tmp_path, node="n1"), clock)
    builder = WindowBuilder("n1", "s1", 1)
    start = clock.now
    for _ in range(4):
        builder.add(collector.sample(), clock.now)
        clock.now += 1
        gpu.violation_ns[0] = gpu.violation_ns.get(0, 0) + 500_000_000  # held by the power cap half of each second
    (window,) = builder.close(0, start, clock.now, []).gpus
    assert window.power_capped_pct is not None and window.power_capped_pct.mean == 100
    assert window.thermal_slowdown_pct is not None and window.thermal_slowdown_pct.mean == 0
    assert window.power_violation_pct is not None and window.power_violation_pct.mean == 50
    assert (window.row_remap_pending, window.row_remap_failure) == (1, 0)


def test_load_seen_on_a_throttled_gpu_teaches_no_correction() -> None:
    """Deliberate bug caught: periods on a GPU power-capped under a lowered limit kept among what a move is judged
    by: its load there says what the cap allowed, and would teach the planner that the hardware is slow."""
    from agent.protocol import TopicKind, encode, node_topic
    from agent.simulate import offline_windows, shift_to_now
    from collectors.sim.scenarios import build_scenario
    from optimizer.ingest.digest import THROTTLED_PCT, slowed
    from optimizer.ingest.fleet import Fleet
    from optimizer.serve.outcomes import _periods

    node = build_scenario("mixed", 4, seed=3)[0]
    birth, windows = offline_windows(node, 4, site="s")
    windows = shift_to_now(windows)
    ref = windows[0].workloads[0]
    capped = Stats.of([100.0, 100.0])
    held = windows[1].model_copy(
        update={"gpus": [g.model_copy(update={"power_capped_pct": capped, "power_limit_w": 240.0})
                         if g.index in ref.gpus else g for g in windows[1].gpus]}
    )  # fmt: skip
    windows[1] = held
    fleet = Fleet("p")
    fleet.ingest(node_topic("p", "s", node.name, TopicKind.BIRTH), encode(birth))
    for w in windows:
        fleet.ingest(node_topic("p", "s", node.name, TopicKind.TELEMETRY), encode(w))
    record = fleet.record("s", node.name)
    assert record is not None
    # 240 W is 60 % of the A100 SXM's 400 W TDP (the catalog's datasheet figure): a lowered limit
    held_down = [
        sorted(t.gpu for t in w.throttles if slowed(t, 400.0).held_pct >= THROTTLED_PCT) for w in record.windows
    ]
    assert held_down[1] == sorted(ref.gpus) and held_down[0] == []
    periods = _periods(record, ref.id, windows[0].start - 1, windows[-1].end + 1, 400.0)
    assert [p.end for p in periods] == [w.end for w in windows if w is not held]


# ---------------------------------------------------------------- utilisation NVML cannot give


def test_an_a100_in_mig_mode_says_it_has_no_utilisation_rather_than_reading_idle(tmp_path: Path) -> None:
    """Deliberate bug caught: an A100 in MIG mode (no GPM before Hopper) sent with its utilisation simply absent,
    which reads as a GPU nobody uses; the birth must say why and each window must mark it, for the GPU and each
    instance, while an H100 in MIG mode (GPM per instance) is not marked."""
    a100_slices = [
        FakeGpu(name="NVIDIA A100-SXM4-80GB MIG 3g.40gb", gpu_instance_id=1),
        FakeGpu(name="NVIDIA A100-SXM4-80GB MIG 3g.40gb", gpu_instance_id=2),
    ]
    a100 = FakeGpu(name="NVIDIA A100-SXM4-80GB", pci_device_id=0x20B210DE, mig=list(a100_slices))
    h100_slice = FakeGpu(name="NVIDIA H100 80GB HBM3 MIG 7g.80gb", gpu_instance_id=1, gpm={1: 40.0})
    h100 = FakeGpu(mig=[h100_slice], gpm={2: 20.0})
    clock = Clock()
    collector = _nvml([a100, h100], tmp_path, clock)
    birth = {g.index: g for g in collector.inventory().gpus}
    marked = {i for i, g in birth.items() if g.util_unavailable}
    assert {birth[i].model for i in marked} == {"NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB MIG 3g.40gb"}
    assert len(marked) == 3 and "MIG" in (birth[min(marked)].util_unavailable or "")
    gpus = {g.index: g for g in _window(collector, clock, 3)}
    assert {i for i, g in gpus.items() if g.util_unavailable == 1} == marked
    assert all(gpus[i].util is None for i in marked)
    assert all(g.util_unavailable is None for i, g in gpus.items() if i not in marked)
