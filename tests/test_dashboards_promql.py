"""The PromQL dashboards (dashboards/prometheus/): every panel's query run against a real VictoriaMetrics holding
what a simulated run of the optimizer exported on /metrics and what dcgm-exporter writes, and every one finds data;
and the boards in the shape Grafana provisions."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import re
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import VictoriaMetrics, simulated_fleet
from dcgm_fleet import exposition
from promserver import import_into_victoria

from agent.metrics import render
from optimizer.decide.catalog import load_catalog
from optimizer.serve.config import OptimizerConfig
from optimizer.serve.selfmetrics import optimizer_metrics
from optimizer.serve.service import Optimizer

ROOT = Path(__file__).resolve().parent.parent / "dashboards"


def _boards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted((ROOT / "prometheus").glob("*.json"))}


def test_committed_promql_boards_are_what_the_generator_makes() -> None:
    spec = importlib.util.spec_from_file_location("generate", ROOT / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    made = module.render_prometheus()
    assert set(made) == set(_boards()), "run dashboards/generate.py"
    for name, text in made.items():
        assert (ROOT / "prometheus" / name).read_text() == text, f"{name} is stale: run dashboards/generate.py"


def test_promql_boards_have_the_shape_grafana_loads() -> None:
    (ds,) = yaml.safe_load((ROOT / "provisioning" / "datasource-prometheus.yaml").read_text())["datasources"]
    assert ds["type"] == "prometheus"
    for name, board in _boards().items():
        variables = {v["name"] for v in board["templating"]["list"]}
        assert all(v["datasource"]["uid"] == ds["uid"] for v in board["templating"]["list"])
        for p in board["panels"]:
            g = p["gridPos"]
            assert g["x"] + g["w"] <= 24 and p["datasource"]["uid"] == ds["uid"], f"{name}/{p['title']}"
            for t in p["targets"]:
                used = set(re.findall(r"\$(\w+)", t["expr"]))
                assert used <= variables, f"{name}/{p['title']}: undefined {used - variables}"


def _metrics_lines(text: str, ms: int) -> list[str]:
    """The optimizer's /metrics exposition as samples stamped ``ms`` (VictoriaMetrics' import format)."""
    return [f"{line} {ms}" for line in text.splitlines() if line and not line.startswith("#")]


def _query(url: str, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    body = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": 60}).encode()
    with urllib.request.urlopen(f"{url}/api/v1/query_range", data=body, timeout=30) as r:
        answer = json.loads(r.read())
    assert answer["status"] == "success", answer
    return answer["data"]["result"]  # type: ignore[no-any-return]


async def test_every_promql_panel_finds_data_after_a_simulated_run(victoria: VictoriaMetrics) -> None:
    fleet, _ = simulated_fleet("demo", 13, windows=8)
    optimizer = Optimizer(OptimizerConfig(), load_catalog())
    optimizer.fleet = fleet
    await optimizer.plan_once()
    now = time.time()
    lines: list[str] = []
    for minutes in range(30, -1, -5):  # a half hour of scrapes of the same plan
        lines += _metrics_lines(render(optimizer_metrics(optimizer)), int((now - minutes * 60) * 1000))
    lines += list(exposition(now - 1800, now))
    import_into_victoria(victoria.url, lines)

    queries = [
        (name, p["title"], t["expr"]) for name, b in _boards().items() for p in b["panels"] for t in p["targets"]
    ]
    assert len(queries) >= 10
    deadline = time.monotonic() + 20
    empty = queries
    while empty and time.monotonic() < deadline:
        empty = []
        for name, title, expr in queries:
            series = _query(victoria.url, expr.replace("$site", ".*"), now - 3600, now)
            values = [float(v) for s in series for _, v in s["values"]]
            if not values or not all(math.isfinite(v) for v in values):
                empty.append((name, title, expr))
        if empty:
            await asyncio.sleep(0.5)  # freshly imported samples take a moment to be searchable
    assert not empty, f"panels without data: {empty}"
    waste = _query(victoria.url, "sum(fleetfit_waste_usd_per_hour)", now - 600, now)
    plan_waste = sum(f.wasted_usd_per_hour for p in optimizer.plans.values() for f in p.findings)
    assert float(waste[0]["values"][-1][1]) == pytest.approx(plan_waste, rel=1e-3)
