"""The optimizer's ``[sources.prometheus]``: agentless nodes read from a real VictoriaMetrics every interval, into
the same fleet, plans and API as agents' nodes; a node with an agent stays the agent's."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
from conftest import VictoriaMetrics, free_port
from dcgm_fleet import CHAT, NOTEBOOK, TRAIN, TRUTH, exposition
from promserver import import_into_victoria
from pydantic import ValidationError
from test_prometheus_import import WINDOW, _wait_searchable

from agent.config import MqttSettings
from agent.metrics import render
from agent.protocol import Birth, GpuInfo, NodeStatus, TopicKind, encode, node_topic
from optimizer.decide.catalog import load_catalog
from optimizer.ingest.promapi import PromClient
from optimizer.serve.config import ApiSettings, OptimizerConfig
from optimizer.serve.lifecycle import Lifecycle
from optimizer.serve.selfmetrics import optimizer_metrics
from optimizer.serve.service import Optimizer
from optimizer.serve.web.app import WebServer

SITE = "lab"


def _agent_birth(optimizer: Optimizer, node: str) -> None:
    gpus = [GpuInfo(index=i, uuid=f"GPU-a-{i}", model="NVIDIA H100 80GB HBM3", memory_mib=81559) for i in range(8)]
    birth = Birth(
        node=node, site=SITE, session=3, agent_version="0.1.0", hostname=node, timestamp=time.time(), gpus=gpus
    )
    assert optimizer.fleet.ingest(node_topic(optimizer.config.mqtt.prefix, SITE, node, TopicKind.BIRTH), encode(birth))


async def test_agentless_nodes_join_the_fleet_and_agent_nodes_stay_the_agents(
    victoria: VictoriaMetrics, tmp_path: Path
) -> None:
    end = (time.time() // WINDOW) * WINDOW - WINDOW
    import_into_victoria(victoria.url, exposition(end - 7200, end))
    _wait_searchable(victoria.url, 3)
    config = OptimizerConfig.model_validate(
        {
            "mqtt": MqttSettings(port=free_port()),
            "sources": {"prometheus": {"url": victoria.url, "site": SITE, "backfill": 7200, "owner_label": "team"}},
        }
    )
    optimizer = Optimizer(config, load_catalog(), lifecycle=Lifecycle.in_state_dir(tmp_path))
    feed = optimizer.feed
    assert feed is not None
    _agent_birth(optimizer, "h100-001")  # this node runs an agent: its own windows count, not Prometheus'
    async with PromClient(feed.endpoint) as client:
        windows = await feed.read_once(client)
        assert windows > 0
        assert await feed.read_once(client) == 0  # nothing completed since: nothing read twice
    assert optimizer.fleet.rejected.get("duplicate", 0) == 0
    # two hours read back on purpose are no ingest lag: /metrics' lag is how late agents' windows come
    assert optimizer.lag.quantiles() == {}

    (plan,) = await optimizer.plan_once()
    classes = {w.id: w.workload_class.value for w in plan.workloads}
    expected = {wid: c for wid, c in TRUTH.items() if wid not in ("k8s/" + CHAT.uid, "k8s/" + TRAIN.uid)}
    assert {wid: classes.get(wid) for wid in expected} == expected
    assert "k8s/" + CHAT.uid not in classes  # on the agent's node: read from the agent alone
    assert "k8s/" + NOTEBOOK.uid in {f.workload for f in plan.findings}  # an idle allocation, found

    server = WebServer(optimizer, ApiSettings(port=0))
    await server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/api/v1/nodes"
        async with aiohttp.ClientSession() as http:
            async with http.get(url) as r:
                nodes = {n["node"]: n for n in await r.json()}
            async with http.get(f"http://127.0.0.1:{server.port}/") as r:
                page = await r.text()
    finally:
        await server.stop()
    assert {name: n["source"] for name, n in nodes.items()} == {
        "h100-001": "agent",
        "l40s-001": "prometheus",
        "l40s-002": "prometheus",
    }
    assert nodes["l40s-002"]["status"] == "online"
    assert "3 (2 from Prometheus)" in page  # the console's overview says where its nodes come from

    # three intervals without a node's series: it is said offline, as an agent's last will would
    feed.clock = lambda: end + 5 * feed.settings.interval + feed.settle
    async with PromClient(feed.endpoint) as client:
        await feed.read_once(client)
    record = optimizer.fleet.record(SITE, "l40s-002")
    assert record is not None and record.status is NodeStatus.OFFLINE
    agent = optimizer.fleet.record(SITE, "h100-001")
    assert agent is not None and agent.status is NodeStatus.ONLINE


async def test_a_server_that_fails_costs_a_counted_read_not_the_optimizer(tmp_path: Path) -> None:
    port = free_port()
    config = OptimizerConfig.model_validate(
        {"mqtt": MqttSettings(port=free_port()), "sources": {"prometheus": {"url": f"http://127.0.0.1:{port}"}}}
    )
    optimizer = Optimizer(config, load_catalog())
    feed = optimizer.feed
    assert feed is not None
    task = asyncio.create_task(feed.run())
    try:
        deadline = time.monotonic() + 10
        while not feed.reads["failed"] and time.monotonic() < deadline:  # noqa: ASYNC110 (a counter, not an event)
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
    assert feed.reads["failed"] >= 1  # and the task went on: it was cancelled, not ended
    assert feed.last_error is not None and feed.last_error.startswith(f"cannot reach http://127.0.0.1:{port}")


def test_a_bad_source_section_is_refused_in_one_line() -> None:
    with pytest.raises(ValidationError, match="fewer than two points"):
        OptimizerConfig.model_validate(
            {"sources": {"prometheus": {"url": "http://x:9090", "interval": 60, "step": 45}}}
        )
    with pytest.raises(ValidationError, match="url"):
        OptimizerConfig.model_validate({"sources": {"prometheus": {"url": "ftp://x"}}})


async def test_a_slurm_site_whose_squeue_fails_is_counted_on_metrics(tmp_path: Path) -> None:
    """A Slurm site read from Prometheus whose squeue cannot run (none in its bin_dir): the job-name read returns
    nothing and /metrics counts it as failed. Deliberate bug: the reads counted but never exported (no such
    series, so a site whose job names silently vanished alerts nobody)."""
    config = OptimizerConfig.model_validate(
        {
            "mqtt": MqttSettings(port=free_port()),
            "sources": {"prometheus": {"url": "http://127.0.0.1:9", "site": SITE}},
            "sites": {SITE: {"scheduler": "slurm", "slurm": {"bin_dir": str(tmp_path)}}},
        }
    )
    optimizer = Optimizer(config, load_catalog())
    assert optimizer.feed is not None and optimizer.feed.jobs is not None

    def failed() -> int:
        text = render(optimizer_metrics(optimizer))
        line = 'fleetfit_prometheus_slurm_job_reads_total{result="failed"} '
        return int(float(next(x for x in text.splitlines() if x.startswith(line)).split()[-1]))

    before = failed()
    assert await optimizer.feed.jobs() == {}
    assert failed() == before + 1
