"""The overview's unclassified paragraph names the unclassified workloads an agent upgrade would decide: those on
nodes whose agent sends no process facts (birth schema 1), which lack the clients and program that decide most."""

from __future__ import annotations

import json

import aiohttp
from conftest import free_port, simulated_fleet

from agent.config import MqttSettings
from agent.protocol import Plan, SolverReport, WorkloadClass, WorkloadView
from optimizer.decide.catalog import load_catalog
from optimizer.ingest.dcgm import SOURCE as PROMETHEUS
from optimizer.ingest.fleet import Fleet
from optimizer.serve.config import ApiSettings, OptimizerConfig
from optimizer.serve.service import Optimizer
from optimizer.serve.web.app import WebServer

# the catalog's prices per GPU-hour (optimizer/decide/data/catalog.toml, estimates)
H100 = "H100 80GB SXM"  # $2.50
L40S = "L40S 48GB"  # $0.85
A100 = "A100 80GB SXM"  # $1.50
L4 = "L4 24GB"  # $0.35
HOSTILE = "<script>alert(1)</script>"


def _view(
    name: str, nodes: list[str], hardware: str, gpus: int, cls: WorkloadClass = WorkloadClass.UNKNOWN
) -> WorkloadView:
    return WorkloadView(
        id=f"k8s/{name}", name=name, workload_class=cls, confidence=0.0, nodes=nodes, hardware=hardware, gpus=gpus,
        mean_util=50.0,
    )  # fmt: skip


def _plan(views: list[WorkloadView]) -> Plan:
    solver = SolverReport(status="OPTIMAL", objective=0.0, best_bound=0.0, gap=0.0, solve_seconds=0.0)
    return Plan(site="s1", generated_at=0.0, solver=solver, workloads=views)


def _fleet(schema_1: set[str], prometheus: frozenset[str] = frozenset()) -> Fleet:
    """The demo's 8 nodes in site s1, those named in ``schema_1`` born of an agent that predates process facts,
    those in ``prometheus`` read from dcgm-exporter's series."""
    fleet, _ = simulated_fleet("demo", 8, windows=1, seed=1)
    for (_, node), record in fleet.nodes.items():
        assert record.birth is not None
        update: dict[str, object] = {"schema_": 1} if node in schema_1 | prometheus else {}
        if node in prometheus:
            update["agent_version"] = PROMETHEUS
        record.birth = record.birth.model_copy(update=update)
    return fleet


async def _pages(fleet: Fleet, plan: Plan) -> tuple[str, list[dict[str, object]]]:
    """The overview page and /api/v1/nodes, served by a real optimizer's web server."""
    optimizer = Optimizer(OptimizerConfig(mqtt=MqttSettings(port=free_port())), load_catalog())
    optimizer.fleet = fleet
    optimizer.plans["s1"] = plan
    server = WebServer(optimizer, ApiSettings(port=0, token="t" * 32))
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{server.port}/") as r:
                page = await r.text()
            async with http.get(f"http://127.0.0.1:{server.port}/api/v1/nodes") as r:
                nodes = json.loads(await r.text())
    finally:
        await server.stop()
    return page, nodes


def _paragraph(page: str) -> str:
    return page.split('id="unclassified">')[1].split("</p>", maxsplit=1)[0]


async def test_the_overview_counts_unclassified_workloads_an_agent_upgrade_would_decide() -> None:
    """h100-001 and l40s-001 run schema-1 agents; a100-001 is read from Prometheus (schema 1 on its birth, no agent
    to upgrade). Counted: a (4 H100 on h100-001) and c (8 L40S on l40s-001): 2 workloads, 12 GPUs, 4 × 2.50 + 8 ×
    0.85 = $16.80/hour, l40s-001 first (8 unclassified GPUs against 4). Not counted: b on schema-2 h100-002; d on
    the Prometheus node; e across schema-1 h100-003 and schema-2 h100-002 (the schema-2 agent already sends its
    process facts); f on h100-001 has a class. Deliberate bugs caught: the Prometheus node counted as an agent
    (3 workloads, a100-001 named), a multi-node workload counted when any node is schema 1 (3 workloads, h100-003
    named), every unknown workload counted, nodes ordered by name, the sentence left out, the schema left out of
    /api/v1/nodes."""
    fleet = _fleet({"h100-001", "l40s-001", "h100-003"}, prometheus=frozenset({"a100-001"}))
    plan = _plan(
        [
            _view("a", ["h100-001"], H100, 4),
            _view("b", ["h100-002"], H100, 2),
            _view("c", ["l40s-001"], L40S, 8),
            _view("d", ["a100-001"], A100, 4),
            _view("e", ["h100-003", "h100-002"], H100, 8),
            _view("f", ["h100-001"], H100, 4, WorkloadClass.TRAINING),
        ]
    )
    page, nodes = await _pages(fleet, plan)
    line = _paragraph(page)
    assert line.startswith("5 workload(s) on 26 GPU(s) have no class"), line
    assert (
        "2 of them (12 GPUs, $16.80/hour) run on nodes whose agent sends no process facts (schema 1): upgrading "
        "fleetfit-agent there reads their clients and program, which decide most of them. Nodes: l40s-001, "
        "h100-001." in line
    ), line
    for other in ("h100-002", "h100-003", "a100-001"):
        assert other not in line, line
    # the API says which agents those are: each node's schema beside its source
    by_name = {n["node"]: n for n in nodes}
    assert by_name["h100-001"]["schema"] == 1 and by_name["h100-002"]["schema"] == 2
    assert by_name["a100-001"]["source"] == "prometheus"


async def test_no_upgrade_sentence_when_every_unclassified_workload_has_process_facts() -> None:
    """Every unclassified workload runs on schema-2 agents (the schema-1 node l4-001 holds only a classified one):
    the paragraph keeps its count and says nothing of upgrades. Deliberate bug caught: any schema-1 node in the
    fleet, or classified workloads on one, triggering the sentence."""
    fleet = _fleet({"l4-001"})
    plan = _plan([_view("a", ["h100-001"], H100, 4), _view("g", ["l4-001"], L4, 2, WorkloadClass.INFERENCE)])
    page, _ = await _pages(fleet, plan)
    line = _paragraph(page)
    assert line.startswith("1 workload(s) on 4 GPU(s) have no class, holding $10.00/hour"), line
    assert "schema 1" not in line and "upgrading" not in line and 'id="old-agents"' not in page, line


async def test_node_names_an_agent_reports_are_escaped_and_at_most_five_are_listed() -> None:
    """Seven schema-1 nodes hold an unclassified workload each; the one named like a script holds the most GPUs
    so it comes first, the rest by name ("l4-001" sorts before "l40s-001"): it shows as text, and after five names
    "and 2 more". Deliberate bugs caught: the name
    written unescaped (a script in the page), every name listed."""
    fleet = _fleet({"h100-001", "h100-002", "h100-003", "l40s-001", "l40s-002", "l4-001", "l4-002"})
    record = fleet.nodes.pop(("s1", "a100-001"))
    assert record.birth is not None
    record.node = HOSTILE
    record.birth = record.birth.model_copy(update={"schema_": 1})
    fleet.nodes[("s1", HOSTILE)] = record
    names = ["h100-001", "h100-002", "h100-003", "l40s-001", "l40s-002", "l4-001"]
    plan = _plan([_view("x", [HOSTILE], A100, 8)] + [_view(n, [n], L4, 1) for n in names])
    page, _ = await _pages(fleet, plan)
    line = _paragraph(page)
    assert HOSTILE not in page
    assert "Nodes: &lt;script&gt;alert(1)&lt;/script&gt;, h100-001, h100-002, h100-003, l4-001 and 2 more." in line, (
        line
    )
