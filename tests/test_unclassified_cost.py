"""What unclassified workloads hold: no move is recommended for a workload whose class is unknown, so the console's
overview and `fleetfit report` put a price on them."""

from __future__ import annotations

from pathlib import Path

import aiohttp
from conftest import free_port, simulated_fleet

from agent.config import MqttSettings
from agent.protocol import Plan, SolverReport, WorkloadClass, WorkloadView
from optimizer.decide.catalog import load_catalog
from optimizer.serve.config import ApiSettings, OptimizerConfig
from optimizer.serve.lifecycle import DB_NAME
from optimizer.serve.report import Ledger, run_report
from optimizer.serve.service import Optimizer
from optimizer.serve.web.app import WebServer
from optimizer.serve.web.views import Trend, overview

H100 = "H100 80GB SXM"  # the catalog's price: $2.50 a GPU-hour


def _plan() -> Plan:
    views = [
        WorkloadView(
            id="k8s/a", name="a", workload_class=WorkloadClass.UNKNOWN, confidence=0.0, nodes=["h100-001"],
            hardware=H100, gpus=4, mean_util=30.0,
        ),
        WorkloadView(
            id="k8s/b", name="b", workload_class=WorkloadClass.TRAINING, confidence=0.9, nodes=["h100-002"],
            hardware=H100, gpus=8, mean_util=90.0,
        ),
    ]  # fmt: skip
    solver = SolverReport(status="OPTIMAL", objective=0.0, best_bound=0.0, gap=0.0, solve_seconds=0.0)
    return Plan(site="s1", generated_at=0.0, solver=solver, workloads=views)


def test_report_prices_the_gpu_hours_of_unclassified_workloads(tmp_path: Path) -> None:
    """One hour charged (the first plan charges one solve interval, here 3600 s): the unknown workload's 4 H100s
    are 4 GPU-h and 4 × $2.50 = $10.00, the training's 8 are not counted there. Deliberate bug caught: the
    unknown figure summed over every class ($30.00), or never kept (no line)."""
    ledger = Ledger(tmp_path / DB_NAME)
    ledger.account(_plan(), {"k8s/a": "team-x", "k8s/b": "team-x"}, load_catalog(), 3600, now=7200.0)
    ledger.close()
    text = run_report(tmp_path, 0.0, "owner", "table")
    assert "unclassified: 4.0 GPU-h held by workloads with no class, US$ 10.00" in text, text
    assert '"unknown_held_usd": 10.0' in run_report(tmp_path, 0.0, "owner", "json")


def test_the_overview_prices_what_unclassified_workloads_hold() -> None:
    """The overview's class rows carry US$ per hour held: 4 H100s of an unknown workload hold 4 × $2.50 = $10/hour
    (what the console's "no class" line shows). Deliberate bug caught: the price taken from the wrong class."""
    fleet, _ = simulated_fleet("demo", 8, windows=3, seed=1)
    view = overview(fleet, [_plan()], load_catalog(), Trend())
    rows = {c.name: c for c in view.classes}
    assert rows["unknown"].gpus == 4 and rows["unknown"].held_usd == 10.0
    assert rows["training"].held_usd == 20.0


async def test_the_console_overview_says_what_unclassified_workloads_hold() -> None:
    """The overview page's line on workloads with no class: 1 workload on 4 GPUs, $10.00/hour (4 H100s at $2.50).
    Deliberate bug caught: the line left out, or priced from every class ($30.00)."""
    optimizer = Optimizer(OptimizerConfig(mqtt=MqttSettings(port=free_port())), load_catalog())
    optimizer.fleet, _ = simulated_fleet("demo", 8, windows=3, seed=1)
    optimizer.plans["s1"] = _plan()
    server = WebServer(optimizer, ApiSettings(port=0, token="t" * 32))
    await server.start()
    try:
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{server.port}/") as r:
            page = await r.text()
    finally:
        await server.stop()
    line = page.split('id="unclassified">')[1].split("</p>")[0]
    assert line.startswith("1 workload(s) on 4 GPU(s) have no class, holding $10.00/hour"), line
