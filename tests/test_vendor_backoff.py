"""A device that stays broken against amdsmi's and HLML's re-initialisation, over ten simulated minutes of
1 Hz samples, with stand-ins that stay broken the way real devices do (a device amdsmi lists but cannot read, a
Gaudi that no longer answers any reading, a Gaudi whose handle cannot be had)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fake_amdsmi import FakeAmdGpu, make_fake_amdsmi
from fake_hlml import FakeGaudi, make_fake_hlml

from collectors.amd import open_amd_collector
from collectors.attribution import Attributor
from collectors.base import Sample
from collectors.gaudi import open_gaudi_collector

TEN_MINUTES = 600


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _run(sample: Callable[[], list[Sample]], clock: Clock, seconds: int) -> None:
    for _ in range(seconds):
        clock.now += 1.0
        sample()


# Re-initialisations at 30, 60, 120, 240 and 480 s (each wait twice the last, from 30 s), after the first: 6 in
# ten minutes. At a fixed 30 s it would be 1 + 20 = 21.
EXPECTED_INITS = 6


def test_a_broken_amd_gpu_does_not_reinitialise_amdsmi_every_30_s(tmp_path: Path) -> None:
    """Deliberate bug it catches: amdsmi shut down and initialised again at every 30 s check while the device stays
    unreadable (the backoff gate in AmdGpuCollector._rescan removed): 21 initialisations in ten minutes."""
    clock = Clock()
    gpus = [FakeAmdGpu(), FakeAmdGpu(unsupported={"asic"})]  # listed, never readable
    smi = make_fake_amdsmi(gpus)
    collector = open_amd_collector(smi, Attributor(tmp_path), clock=clock)
    assert collector is not None
    _run(collector.sample, clock, TEN_MINUTES)
    assert smi.inits == EXPECTED_INITS  # type: ignore[attr-defined]
    assert [f.index for f in collector.inventory().gpu_failures] == [1]  # still reported, still tried
    gpus[1].unsupported = set()
    _run(collector.sample, clock, 30)  # read again on its own handle at the next check, with no re-initialisation
    assert len(collector.inventory().gpus) == 2 and smi.inits == EXPECTED_INITS  # type: ignore[attr-defined]


def test_a_gaudi_that_stopped_answering_does_not_reinitialise_hlml_every_30_s(tmp_path: Path) -> None:
    """Deliberate bug it catches: the backoff gate in GaudiCollector._rescan removed (21 initialisations)."""
    clock = Clock()
    silent = FakeGaudi(minor=1, unsupported={"util", "memory", "power", "temp"})
    hlml = make_fake_hlml([FakeGaudi(minor=0), silent])
    collector = open_gaudi_collector(hlml, Attributor(tmp_path), clock=clock)
    assert collector is not None
    _run(collector.sample, clock, TEN_MINUTES)
    assert hlml.inits == EXPECTED_INITS  # type: ignore[attr-defined]
    silent.unsupported = set()
    _run(collector.sample, clock, 1)
    assert [s.gauges.get("util") for s in collector.sample()] == [93, 93]


def test_a_gaudi_that_cannot_be_opened_is_retried_alone_and_hlml_backs_off(tmp_path: Path) -> None:
    """Deliberate bug it catches: the device retried only through a whole re-initialisation, so once the backoff
    has grown it waits up to ten minutes after it could be opened again."""
    clock = Clock()
    broken = FakeGaudi(minor=1, handle_error=15)  # AIP_IS_LOST
    hlml = make_fake_hlml([FakeGaudi(minor=0), broken])
    collector = open_gaudi_collector(hlml, Attributor(tmp_path), clock=clock)
    assert collector is not None
    _run(collector.sample, clock, TEN_MINUTES)
    assert hlml.inits == EXPECTED_INITS  # type: ignore[attr-defined]
    broken.handle_error = None
    _run(collector.sample, clock, 30)
    assert [s.key for s in collector.sample()] == ["0", "1"] and hlml.inits == EXPECTED_INITS  # type: ignore[attr-defined]
