"""Planning keeps to its share of a core: a large site's rounds are spaced out, a small site's are not."""

from __future__ import annotations

import pytest

from optimizer.decide.catalog import load_catalog
from optimizer.serve.config import OptimizerConfig, OptimizerSettings
from optimizer.serve.service import Optimizer


def optimizer(interval: float, share: float) -> Optimizer:
    settings = OptimizerSettings(solve_interval=interval, plan_cpu_share=share)
    return Optimizer(OptimizerConfig(optimizer=settings), load_catalog())


@pytest.mark.parametrize(("cpu", "wall"), [(0.2, 0.3), (2.9, 3.0)])
def test_a_round_within_the_share_leaves_the_interval_alone(cpu: float, wall: float) -> None:
    opt = optimizer(60, 0.05)
    opt._pace(cpu, wall)  # 2.9 s of CPU every 63 s is 4.6 % of a core: within 5 %
    assert opt.plan_wait == 60


@pytest.mark.parametrize(("cpu", "wall", "share"), [(10.0, 12.0, 0.05), (30.0, 31.0, 0.1), (6.0, 40.0, 0.05)])
def test_a_costly_round_is_followed_by_rest_that_keeps_planning_at_its_share(
    cpu: float, wall: float, share: float
) -> None:
    opt = optimizer(60, share)
    opt._pace(cpu, wall)
    cycle = opt.plan_wait + wall  # from the start of this round to the start of the next
    assert opt.plan_wait > 60
    # exactly the share over the cycle: no more CPU than allowed, and no longer rest than it takes
    assert cpu / cycle == pytest.approx(share)


def test_rounds_return_to_the_interval_once_they_are_cheap_again() -> None:
    opt = optimizer(60, 0.05)
    opt._pace(20.0, 21.0)
    assert opt.plan_wait == pytest.approx(20.0 / 0.05 - 21.0)
    opt._pace(1.0, 1.5)
    assert opt.plan_wait == 60


def test_the_share_is_a_setting_with_bounds() -> None:
    with pytest.raises(ValueError, match="plan_cpu_share"):
        OptimizerSettings(plan_cpu_share=0)
    with pytest.raises(ValueError, match="plan_cpu_share"):
        OptimizerSettings(plan_cpu_share=1.5)


def test_stretching_is_told_when_it_starts_and_ends_not_every_round(caplog: pytest.LogCaptureFixture) -> None:
    opt = optimizer(60, 0.05)
    with caplog.at_level("INFO", logger="optimizer.serve.service"):
        opt._pace(3.1, 3.2)  # 3.1 / 0.05 - 3.2 = 58.8 s: within the interval, nothing to tell
        opt._pace(20.0, 21.0)
        opt._pace(21.0, 22.0)
        opt._pace(1.0, 1.5)
    told = [r.getMessage() for r in caplog.records]
    assert len(told) == 2
    assert "resting 379 s between rounds rather than solve_interval's 60 s" in told[0]
    assert "solve_interval's 60 s again" in told[1]
