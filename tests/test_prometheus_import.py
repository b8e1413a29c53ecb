"""`fleetfit import prometheus` against real servers holding dcgm-exporter, kube-state-metrics and cAdvisor series
(tests/dcgm_fleet.py): VictoriaMetrics through its import API, Prometheus backfilled with promtool."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from conftest import VictoriaMetrics
from dcgm_fleet import CHAT, NOTEBOOK, TRAIN, TRUTH, exposition
from promserver import import_into_victoria, prometheus

from optimizer.commands.cli import main
from optimizer.ingest.fleet import Fleet
from optimizer.ingest.promapi import Endpoint, PromClient
from optimizer.ingest.promsource import PrometheusSource, ReadSettings

HOURS = 2
WINDOW = 300


@pytest.fixture(scope="module")
def span() -> tuple[float, float]:
    end = (time.time() // WINDOW) * WINDOW - WINDOW
    return end - HOURS * 3600, end


def _importer(capsys: pytest.CaptureFixture[str], url: str, end: float, *extra: str) -> tuple[int, dict, str]:
    code = main(["import", "prometheus", url, "--since", f"{HOURS}h", "--until", str(end), *extra])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 and out.startswith("{") else {}), err


def _wait_searchable(url: str, nodes: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{url}/api/v1/label/Hostname/values", timeout=5) as r:
            if len(json.loads(r.read())["data"]) >= nodes:
                return
        time.sleep(0.3)
    raise AssertionError("imported series never became searchable")


def _by_id(snapshot: dict) -> dict[str, dict]:
    return {w["id"]: w for w in snapshot["workloads"]}


@pytest.fixture
def victoria_fleet(victoria: VictoriaMetrics, span: tuple[float, float]) -> VictoriaMetrics:
    import_into_victoria(victoria.url, exposition(*span))
    _wait_searchable(victoria.url, 3)
    return victoria


def test_a_fleet_read_from_victoriametrics_is_right(
    victoria_fleet: VictoriaMetrics, span: tuple[float, float], capsys: pytest.CaptureFixture[str]
) -> None:
    """Nodes, GPU counts, owners and classes as the fleet holds them."""
    code, snap, err = _importer(capsys, victoria_fleet.url, span[1], "--owner-label", "team")
    assert code == 0, err
    assert {(n["name"], n["hardware"], n["gpus"]) for n in snap["nodes"]} == {
        ("h100-001", "NVIDIA H100 80GB HBM3", 8),
        ("l40s-001", "NVIDIA L40S", 8),
        ("l40s-002", "NVIDIA L40S", 8),
    }
    workloads = _by_id(snap)
    assert {wid: workloads[wid]["class"] for wid in TRUTH} == TRUTH
    # GPUs each holds; the controller a capacity team moves (the Deployment past its ReplicaSet)
    chat, train, notebook = (workloads["k8s/" + p.uid] for p in (CHAT, TRAIN, NOTEBOOK))
    assert (chat["name"], chat["gpus"], chat["nodes"]) == ("chat-api", 4, ["h100-001"])
    assert (train["name"], train["gpus"]) == ("llama-pretrain", 4)
    assert (notebook["name"], notebook["gpus"]) == ("jupyter-alice", 2)
    assert workloads["slurm/4242"]["gpus"] == 4
    # the team label, read from kube_pod_labels
    assert (chat["owner"], train["owner"], notebook["owner"]) == ("serving", "research", "data-science")
    # one GPU shared by two pods: dcgm-exporter writes it once per pod; each holds half, neither the whole GPU
    shared = [w for w in snap["workloads"] if w["name"].startswith("tts-")]
    assert sorted(w["gpu_share"] for w in shared) == [0.5, 0.5]
    # profiling fields read: the shape measured
    assert chat["shape"] == pytest.approx(1.0, abs=0.2) and train["shape"] == pytest.approx(0.0, abs=0.2)
    assert "no DCGM_FI_PROF" not in err and "no cAdvisor" not in err


def _read_windows(
    url: str, span: tuple[float, float], settings: ReadSettings | None = None
) -> dict[str, list[dict[str, object]]]:
    """Each workload's references in the windows a read of ``span`` sends the fleet, in window order; every
    message the fleet accepts."""
    fleet = Fleet("prometheus", horizon_windows=100)
    refs: dict[str, list[dict[str, object]]] = {}

    def ingest(topic: str, payload: bytes) -> bool:
        assert fleet.ingest(topic, payload) is not None, fleet.rejected
        if topic.endswith("/telemetry"):
            for ref in json.loads(payload)["workloads"]:
                refs.setdefault(ref["id"], []).append(ref)
        return True

    async def read() -> None:
        async with PromClient(Endpoint(url)) as client:
            await PrometheusSource(client, fleet, settings or ReadSettings(), ingest=ingest).read(*span)

    asyncio.run(read())
    return refs


def test_a_pods_own_storage_traffic_reaches_its_windows(
    victoria_fleet: VictoriaMetrics, span: tuple[float, float]
) -> None:
    """cAdvisor's storage counters (tests/dcgm_fleet.py DISK) become each pod's disk_read_bps / disk_write_bps in
    every window: the trainer's summed over its containers and drives (0.8 + 0.4 + 0.3 MB/s written), its 6 MB/s
    read from an md RAID counted there and not again on its members, all steady across its container's restart; the chat server's 0.2 MB/s counted once although its pod's cgroup
    holds it again; nothing, not 0, for the notebook, whose pod has network series but no storage ones.
    Deliberate bugs: the pod's cgroup summed with its containers (chat 0.4 MB/s); counters summed before the rate
    (the restart reads the loader's whole history as one interval's writes: 5.2 MB/s in that window); deriv() in
    place of rate() (the fall at the restart pulls that window to 1.35 MB/s); every device summed (12 MB/s read);
    an absent series read as 0."""
    refs = _read_windows(victoria_fleet.url, span)
    chat, train, notebook = (refs["k8s/" + p.uid] for p in (CHAT, TRAIN, NOTEBOOK))
    assert len(train) == len(chat) == HOURS * 3600 // WINDOW  # a window's figure in each, the restart's included
    for r in train:
        assert r["disk_write_bps"] == pytest.approx(1.5e6, rel=0.02)
        assert r["disk_read_bps"] == pytest.approx(6e6, rel=0.02)
    for r in chat:
        assert (r["disk_write_bps"], r["disk_read_bps"]) == (pytest.approx(2e5, rel=0.02), 0)
        assert r["net_tx_bps"] == pytest.approx(3e6, rel=0.02)  # its network, read beside it as before
    assert notebook and all("net_tx_bps" in r for r in notebook)
    assert not any("disk_write_bps" in r or "disk_read_bps" in r for r in notebook)


def test_the_owner_is_the_namespace_without_an_owner_label(
    victoria_fleet: VictoriaMetrics, span: tuple[float, float], capsys: pytest.CaptureFixture[str]
) -> None:
    code, snap, err = _importer(capsys, victoria_fleet.url, span[1])
    assert code == 0, err
    assert _by_id(snap)["k8s/" + CHAT.uid]["owner"] == "team-serving"


def test_without_profiling_fields_it_classifies_from_what_is_there_and_says_so(
    victoria: VictoriaMetrics, span: tuple[float, float], capsys: pytest.CaptureFixture[str]
) -> None:
    """dcgm-exporter with profiling unavailable (consumer cards, a profiler holding the counters): no DCGM_FI_PROF_*.
    The same fleet with them, told apart by a cluster label (read with --selector): without them the classes hold,
    the evidence says what is missing, and no workload is surer than with them. Neither has cAdvisor's storage
    series, and the summary says so (deliberate bug: the line keyed on the network series)."""

    def tagged(cluster: str, profiling: bool) -> Iterator[str]:
        for line in exposition(*span):
            if line.startswith("DCGM_") and (profiling or not line.startswith("DCGM_FI_PROF_")):
                yield line.replace("{", f'{{cluster="{cluster}",', 1)
            elif not line.startswith(("DCGM_", "container_fs_")) and cluster == "full":
                yield line  # kube-state-metrics and cAdvisor's network, once

    import_into_victoria(victoria.url, [*tagged("full", True), *tagged("basic", False)])
    _wait_searchable(victoria.url, 3)
    code, full, _ = _importer(capsys, victoria.url, span[1], "--selector", 'cluster="full"')
    assert code == 0
    code, snap, err = _importer(capsys, victoria.url, span[1], "--selector", 'cluster="basic"')
    assert code == 0, err
    assert "no DCGM_FI_PROF_* series (profiling off)" in err
    assert "no cAdvisor storage series (container_fs_*_bytes_total) for GPU pods" in err
    assert "no cAdvisor network series" not in err
    workloads, with_them = _by_id(snap), _by_id(full)
    assert workloads["slurm/4242"]["class"] in ("batch_inference", "unknown")
    assert workloads["k8s/" + NOTEBOOK.uid]["class"] == "idle"
    assert workloads["k8s/" + CHAT.uid]["class"] == "inference"
    assert all(w["confidence"] <= with_them[wid]["confidence"] for wid, w in workloads.items())
    assert all(any("no DCGM profiling fields" in line for line in w["evidence"]) for w in workloads.values())
    assert not any(any("no DCGM profiling fields" in line for line in w["evidence"]) for w in with_them.values())


def test_a_day_in_a_backfilled_prometheus_plans_moves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A day of history scraped every 5 minutes, through Prometheus itself (promtool backfill), with a sample limit so
    small that every query is refused as too large until the reader splits it: the same classes come out, and a day
    of an idle notebook's allocation is enough for the plan to release it."""
    end = (time.time() // WINDOW) * WINDOW - WINDOW
    server = prometheus(tmp_path / "prom", exposition(end - 25 * 3600, end, step=300), max_samples=30_000)
    try:
        code = main(["import", "prometheus", server.url, "--since", "25h", "--until", str(end), "--window", "30m"])
        out, err = capsys.readouterr()
    finally:
        server.stop()
    assert code == 0, err
    assert "split as too large" in err
    snap = json.loads(out)
    assert {wid: _by_id(snap)[wid]["class"] for wid in TRUTH} == TRUTH
    path = tmp_path / "fleet.json"
    path.write_text(out)
    assert main(["plan", str(path), "--format", "json", "--time-limit", "5"]) == 0
    plan = json.loads(capsys.readouterr().out)
    reclaims = {r["workload"] for r in plan["recommendations"] if r.get("kind") == "reclaim"}
    assert reclaims == {"k8s/" + NOTEBOOK.uid}


def test_node_label_names_nodes_where_hostname_is_the_exporter_pod(
    victoria: VictoriaMetrics, span: tuple[float, float], capsys: pytest.CaptureFixture[str]
) -> None:
    """On Kubernetes dcgm-exporter's Hostname is its DaemonSet pod; the scrape copies the node name elsewhere."""
    lines = (
        line.replace('Hostname="', 'Hostname="dcgm-exporter-x7k2q",kubernetes_node="', 1)
        for line in exposition(span[1] - 1800, span[1])
    )
    import_into_victoria(victoria.url, lines)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        code, snap, err = _importer(capsys, victoria.url, span[1], "--node-label", "kubernetes_node", "--since", "30m")
        if code == 0 and len(snap["nodes"]) == 3:
            break
        time.sleep(0.5)
    assert sorted(n["name"] for n in snap["nodes"]) == ["h100-001", "l40s-001", "l40s-002"], err


class _Refusing(BaseHTTPRequestHandler):
    status = 401
    body = b'{"status":"error","errorType":"unauthorized","error":"bad token"}'

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def refusing() -> Iterator[HTTPServer]:
    server = HTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def test_failures_are_one_line_each(refusing: HTTPServer, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    assert main(["import", "prometheus", f"http://127.0.0.1:{port}", "--since", "1h"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fleetfit: cannot reach http://127.0.0.1:{port}") and "\n" not in err

    url = f"http://127.0.0.1:{refusing.server_address[1]}"
    assert main(["import", "prometheus", url, "--since", "1h"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"fleetfit: {url} refused the credentials (HTTP 401): bad token"

    _Refusing.status, _Refusing.body = 503, b"overloaded"
    try:
        assert main(["import", "prometheus", url, "--since", "1h"]) == 1
        assert capsys.readouterr().err.strip() == f"fleetfit: {url} answered HTTP 503: overloaded"
    finally:
        _Refusing.status, _Refusing.body = 401, b'{"status":"error","errorType":"unauthorized","error":"bad token"}'

    missing = tmp_path / "no-such-token"
    assert main(["import", "prometheus", url, "--since", "1h", "--bearer-token-file", str(missing)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fleetfit: cannot read the bearer token file {missing}") and "\n" not in err


def test_a_server_without_dcgm_series_says_what_is_missing(
    victoria: VictoriaMetrics, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["import", "prometheus", victoria.url, "--since", "1h"]) == 1
    err = capsys.readouterr().err
    assert "no dcgm-exporter series (DCGM_FI_DEV_FB_USED) with a Hostname or hostname label" in err
