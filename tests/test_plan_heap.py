"""After each site's plan the planning thread hands back to the system what the plan allocated and let go."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest
from conftest import simulated_fleet

from optimizer.decide.catalog import load_catalog
from optimizer.ingest.fleet import Fleet
from optimizer.serve import service
from optimizer.serve.config import OptimizerConfig
from optimizer.serve.service import Optimizer


async def test_the_heap_is_trimmed_in_the_planning_thread_after_each_sites_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fleet, _ = simulated_fleet("mixed", 6, windows=4, site="a")
    other, _ = simulated_fleet("mixed", 6, windows=4, site="b")
    fleet.nodes.update(other.nodes)
    opt = Optimizer(OptimizerConfig(), load_catalog())
    opt.fleet = fleet
    events: list[tuple[str, int]] = []
    planned = opt._planned

    def planning(fleet: Fleet, site: str, open_actions: Sequence[Any], done: list[Any]) -> Any:
        out = planned(fleet, site, open_actions, done)
        events.append(("planned", threading.get_ident()))
        return out

    def trim() -> bool:
        events.append(("trimmed", threading.get_ident()))
        return True

    monkeypatch.setattr(opt, "_planned", planning)
    monkeypatch.setattr(service, "trim", trim)
    plans = await opt.plan_once()
    assert sorted(p.site for p in plans) == ["a", "b"]
    assert [what for what, _ in events] == ["planned", "trimmed"] * 2
    assert events[0][1] == events[1][1] != threading.get_ident()  # the plan's own thread, not the event loop's
