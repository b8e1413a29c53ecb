"""The simulator as dcgm-exporter (with kube-state-metrics, cAdvisor and node_exporter beside it): the text it
serves, read by a strict parser and scraped by a real Prometheus; its history, backfilled by promtool into a real
Prometheus and imported into a real VictoriaMetrics."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import VictoriaMetrics, _wait_listening, free_port
from test_prometheus_import import _read_windows, _wait_searchable

from agent.simulate import ManualClock
from collectors.base import Entity
from collectors.sim.backfill import labels_path, write_history
from collectors.sim.exporter import (
    ExporterOptions,
    GpuView,
    Holder,
    NodeView,
    exporter_pod,
    node_view,
    render,
)
from collectors.sim.node import SimulatedNode
from collectors.sim.scenarios import ScenarioNode, build_scenario, simulated_node
from collectors.sim.scrape import ExporterServer
from collectors.sim.spec import Pattern
from optimizer.commands.cli import main as cli_main
from optimizer.commands.offline import load_labels
from optimizer.ingest.promsource import ReadSettings

# A strict reading of the text exposition format 0.0.4: HELP and TYPE once per family, before its samples, every
# sample's name in the family just declared, label names and quoted values, a number, an optional timestamp.
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_SAMPLE = re.compile(rf"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{{((?:{_LABEL})(?:,{_LABEL})*)?\}})? (\S+)(?: (-?\d+))?$")
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Series = list[tuple[str, dict[str, str], float]]


def parse(text: str) -> Series:
    """(name, labels, value) of every sample; AssertionError on anything the format does not allow."""
    assert text.endswith("\n")
    out: Series = []
    declared: set[str] = set()
    family = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            family = line.split(" ")[2]
            assert family not in declared, f"family {family} declared twice"
            declared.add(family)
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name == family and kind in ("gauge", "counter"), line
            continue
        m = _SAMPLE.match(line)
        assert m is not None, f"not a sample line: {line!r}"
        assert m.group(1) == family, f"{m.group(1)} outside its family ({family})"
        labels = dict(_PAIR.findall(m.group(2) or ""))
        assert len(labels) == len(_PAIR.findall(m.group(2) or "")), f"a label repeated: {line}"
        out.append((m.group(1), labels, float(m.group(3))))
    return out


def fleet(nodes: int = 6, seed: int = 3) -> tuple[list[ScenarioNode], list[SimulatedNode], ManualClock]:
    clock = ManualClock()
    scenario = build_scenario("realistic", nodes, seed)
    sims = [simulated_node(n, clock, seed) for n in scenario]
    for _ in range(3):
        clock.now += 1
        for s in sims:
            s.sample()
    return scenario, sims, clock


def of(series: Series, name: str) -> Series:
    return [s for s in series if s[0] == name]


# ----------------------------------------------------------------------------------------- the text


def test_series_carry_the_node_samples_and_their_pods() -> None:
    """Each NVIDIA GPU is written with the value its agent was given and with its pod; a free GPU with no pod
    labels; AMD and Intel nodes not at all (deliberate bugs: utilisation read from the memory-copy figure, one pod's
    labels put on every GPU of a node, each pod requesting one GPU whatever it holds)."""
    scenario, sims, _ = fleet()
    series = parse(render([node_view(s) for s in sims], ExporterOptions()))
    util = of(series, "DCGM_FI_DEV_GPU_UTIL")
    nvidia = [s for s in sims if s.profile.gpu_model.startswith("NVIDIA")]
    assert len(util) == sum(s.profile.gpus for s in nvidia) and nvidia
    assert {labels["Hostname"] for _, labels, _ in util} == {s.node for s in nvidia}
    for sim in nvidia:
        assert sim.latest is not None
        samples = {s.key: s for s in sim.latest.samples if s.entity is Entity.GPU}
        held = {g: w for w in sim.specs for g in w.gpus}
        for _, labels, value in util:
            if labels["Hostname"] != sim.node:
                continue
            gpu = int(labels["gpu"])
            assert value == round(samples[str(gpu)].gauges["util"])
            assert labels["UUID"] == f"GPU-sim-{sim.node}-{gpu}" and labels["device"] == f"nvidia{gpu}"
            assert labels["modelName"] == sim.profile.gpu_model
            if gpu in held:
                w = held[gpu]
                assert labels["pod_uid"] == w.id.removeprefix("k8s/") and labels["container"] == w.name
                assert labels["pod"].startswith(w.name) and labels["namespace"].startswith("team-")
            else:
                assert not {"pod", "namespace", "container", "pod_uid"} & set(labels)
    assert any("pod" not in labels for _, labels, _ in util), "a fleet with spare nodes has free GPUs"
    # The framebuffer adds up to the card's memory, as DCGM's FB_TOTAL does.
    total: dict[tuple[str, str], float] = {}
    for name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED"):
        for _, labels, value in of(series, name):
            key = (labels["Hostname"], labels["gpu"])
            total[key] = total.get(key, 0) + value
    memory = {s.node: s.profile.memory_mib for s in nvidia}
    assert all(v == memory[host] for (host, _), v in total.items())
    # Every pod on a GPU is in kube-state-metrics on its node, with its GPUs requested.
    pods = {(labels["namespace"], labels["pod"]) for _, labels, _ in util if "pod" in labels}
    info = {(lab["namespace"], lab["pod"]): lab["node"] for _, lab, _ in of(series, "kube_pod_info")}
    assert pods <= set(info)
    by_node = {w.id.removeprefix("k8s/"): n.name for n in scenario for w in n.workloads}
    for _, labels, _ in of(series, "kube_pod_info"):
        assert labels["node"] == by_node[labels["uid"]]
    requests = {lab["uid"]: v for _, lab, v in of(series, "kube_pod_container_resource_requests")}
    assert requests == {w.id.removeprefix("k8s/"): len(w.gpus) for n in scenario for w in n.workloads}


def test_field_sets_and_profiling_ratios() -> None:
    """basic has no DCGM_FI_PROF_* field, default has default-counters.csv's, all adds SM, NVLink (on NVLink
    GPUs only) and the power limit; ratios are 0-1 and follow the GPM fields the agent reads on Hopper
    (deliberate bugs: profiling fields left in basic, ratios written as percentages, NVLink on PCIe cards)."""
    _, sims, _ = fleet()
    views = [node_view(s) for s in sims]
    names = {o: {n for n, _, _ in parse(render(views, ExporterOptions(fields=o)))} for o in ("basic", "default", "all")}
    assert not any(n.startswith("DCGM_FI_PROF_") for n in names["basic"])
    assert {
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
    } <= names["default"]
    assert not {"DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_DEV_POWER_MGMT_LIMIT"} & set(
        names["default"]
    )
    everything = parse(render(views, ExporterOptions(fields="all")))
    nvlink_hosts = {s.node for s in sims if s.profile.nvlink_links}
    assert {lab["Hostname"] for _, lab, _ in of(everything, "DCGM_FI_PROF_NVLINK_TX_BYTES")} == nvlink_hosts & {
        s.node for s in sims if s.profile.gpu_model.startswith("NVIDIA")
    }
    for name in ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE"):
        assert all(0 <= v <= 1 for _, _, v in of(everything, name))
    hopper = next(s for s in sims if "H100" in s.profile.gpu_model or "H200" in s.profile.gpu_model)
    assert hopper.latest is not None
    gauges = {s.key: s.gauges for s in hopper.latest.samples if s.entity is Entity.GPU}
    for _, labels, value in of(everything, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"):
        if labels["Hostname"] == hopper.node:
            assert value == pytest.approx(gauges[labels["gpu"]]["tensor_active"] / 100, abs=0.0006)


def _gpu(index: int, holders: tuple[Holder, ...], mig: tuple[str, int] | None = None) -> GpuView:
    return GpuView(
        index=index, uuid=f"GPU-{index}", pci_bus_id="00000000:18:00.0", model="NVIDIA A100-SXM4-80GB", util=87.4,
        mem_copy_util=50, fb_used_mib=1000, fb_total_mib=81920, power_w=300.25, power_limit_w=400, sm_clock_mhz=1410,
        temp_c=60, gr_engine_active=0.874, sm_active=0.8, tensor_active=0.5, dram_active=0.3, pcie_tx_bps=1e9,
        pcie_rx_bps=1e9, nvlink_tx_bps=None, nvlink_rx_bps=None, holders=holders, mig=mig,
    )  # fmt: skip


def test_shared_gpus_jobs_mig_and_the_exact_line() -> None:
    """A time-sliced GPU is written once per pod, a Slurm job's GPU carries hpc_job, a MIG instance carries its
    profile and no GPU_UTIL, and the label order is dcgm-exporter's (deliberate bugs: one series for a shared
    GPU, GPU_UTIL written for a MIG instance, attributes in another order)."""
    a = Holder("k8s/u-a", "team-x", "chat-1", "chat", "u-a")
    b = Holder("k8s/u-b", "team-y", "chat-2", "chat", "u-b")
    job = Holder("slurm/4242", hpc_job="4242")
    view = NodeView(
        "a100-001",
        True,
        (_gpu(0, (a, b)), _gpu(1, (job,)), _gpu(2, (), mig=("1g.10gb", 3))),
        (),
        (),
    )
    text = render([view], ExporterOptions())
    assert (
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0",pci_bus_id="00000000:18:00.0",device="nvidia0",'
        'modelName="NVIDIA A100-SXM4-80GB",Hostname="a100-001",DCGM_FI_DRIVER_VERSION="550.54.15",'
        'container="chat",namespace="team-x",pod="chat-1",pod_uid="u-a"} 87\n'
    ) in text
    assert 'DCGM_FI_DEV_POWER_USAGE{gpu="0"' in text and "} 300.250000\n" in text  # Go's %f of a DCGM double
    util = of(parse(text), "DCGM_FI_DEV_GPU_UTIL")
    assert [(lab["gpu"], lab.get("pod"), lab.get("hpc_job")) for _, lab, _ in util] == [
        ("0", "chat-1", None),
        ("0", "chat-2", None),
        ("1", None, "4242"),
    ]
    gr = of(parse(text), "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
    mig = [lab for _, lab, _ in gr if lab["gpu"] == "2"]
    assert mig == [{**mig[0], "GPU_I_PROFILE": "1g.10gb", "GPU_I_ID": "3"}] and "pod" not in mig[0]
    # Outside Kubernetes the pods' labels go, the job's stays.
    bare = of(parse(render([view], ExporterOptions(kubernetes=False))), "DCGM_FI_DEV_GPU_UTIL")
    assert [(lab["gpu"], lab.get("hpc_job")) for _, lab, _ in bare] == [("0", None), ("1", "4242")]


def test_hostname_label_spellings() -> None:
    """Hostname by default, hostname when asked, and the exporter pod's name with the node in kubernetes_node
    (deliberate bug: the node's name left in Hostname in pod mode)."""
    view = NodeView("l4-007", True, (_gpu(0, ()),), (), ())
    (_, lower, _), *_ = of(parse(render([view], ExporterOptions(hostname_label="hostname"))), "DCGM_FI_DEV_GPU_UTIL")
    assert lower["hostname"] == "l4-007" and "Hostname" not in lower
    (_, pod, _), *_ = of(parse(render([view], ExporterOptions(hostname_from="pod"))), "DCGM_FI_DEV_GPU_UTIL")
    assert pod["Hostname"] == exporter_pod("l4-007") != "l4-007"
    assert pod["Hostname"].startswith("dcgm-exporter-") and pod["kubernetes_node"] == "l4-007"


def test_owners_and_network_counters() -> None:
    """Serving pods come from a ReplicaSet owned by a Deployment, notebooks from a StatefulSet, the rest from Jobs
    or bare; cAdvisor's counters are the pod's own traffic and grow, and host-network pods have none; its storage
    counters are the pod's own reads and writes, host network or not, on an md RAID node counted on the array and
    again half on each member, as the kernel's cgroup counts them; node_exporter counts each NIC (deliberate bugs:
    transmit and receive swapped, host-network pods given the node's counters, reads and writes swapped, the
    members given the array's bytes)."""
    scenario, sims, clock = fleet(nodes=10, seed=5)
    first = parse(render([node_view(s) for s in sims], ExporterOptions()))
    clock.now += 5
    for s in sims:
        s.sample()
    second = parse(render([node_view(s) for s in sims], ExporterOptions()))
    owners = {lab["uid"]: lab["owner_kind"] for _, lab, _ in of(first, "kube_pod_owner")}
    patterns = {w.id.removeprefix("k8s/"): w.pattern.value for n in scenario for w in n.workloads}
    for uid, kind in owners.items():
        expected = {"inference": "ReplicaSet", "llm_serving": "ReplicaSet", "interactive": "StatefulSet"}
        assert kind == expected.get(patterns[uid], "<none>" if patterns[uid] == "idle" else "Job")
    replicasets = {lab["replicaset"] for _, lab, _ in of(first, "kube_replicaset_owner")}
    assert replicasets == {
        lab["owner_name"] for _, lab, _ in of(first, "kube_pod_owner") if lab["owner_kind"] == "ReplicaSet"
    }
    host_network = {n.name for n in scenario if "host_network" in n.quirks}
    info = {lab["pod"]: lab for _, lab, _ in of(first, "kube_pod_info")}
    rx = {lab["pod"]: v for _, lab, v in of(second, "container_network_receive_bytes_total")}
    tx = {lab["pod"]: v for _, lab, v in of(second, "container_network_transmit_bytes_total")}
    assert set(rx) == {p for p, lab in info.items() if lab["node"] not in host_network}
    by_pod = {lab["pod"]: lab["uid"] for lab in info.values()}
    sim_of = {w.id.removeprefix("k8s/"): s for s in sims for w in s.specs}
    for pod, received in rx.items():
        sent, got = sim_of[by_pod[pod]].netns_bytes["k8s/" + by_pod[pod]]
        assert (received, tx[pod]) == (int(got), int(sent))
    reads = {(lab["pod"], lab["device"]): v for _, lab, v in of(second, "container_fs_reads_bytes_total")}
    writes = {(lab["pod"], lab["device"]): v for _, lab, v in of(second, "container_fs_writes_bytes_total")}
    assert {pod for pod, _ in writes} == set(info)
    raid = {n.name for n in scenario if "md_raid" in n.quirks}
    assert raid - host_network and raid & host_network  # both kinds of node are in this fleet
    for (pod, device), written in writes.items():
        read_total, written_total = sim_of[by_pod[pod]].io_bytes["k8s/" + by_pod[pod]]
        if info[pod]["node"] in raid:
            part = {"/dev/md127": 1.0, "/dev/nvme0n1": 0.5, "/dev/nvme1n1": 0.5}[device]
        else:
            part = {"/dev/nvme0n1": 1.0}[device]
        assert (reads[(pod, device)], written) == (int(read_total * part), int(written_total * part))
    assert sum(writes.values()) > 0 and sum(reads.values()) != sum(writes.values())
    before = {lab["device"] + lab["instance"]: v for _, lab, v in of(first, "node_network_transmit_bytes_total")}
    after = {lab["device"] + lab["instance"]: v for _, lab, v in of(second, "node_network_transmit_bytes_total")}
    assert before.keys() == after.keys() and all(after[k] >= before[k] for k in before)
    # The front end carries every node's own traffic (log shipping, scrapes), so it always moves.
    assert all(after[k] > before[k] for k in before if k.startswith("eth"))


# ----------------------------------------------------------------------------------------- real servers


def _binary(name: str) -> str:
    found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if found is None:
        pytest.fail(f"{name} is not installed: `make deps-test` installs it (apt-get install prometheus)")
    return found


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        body: bytes = r.read()
        return body


def _query(base: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    params = {"query": expr} | ({} if at is None else {"time": f"{at:.3f}"})
    reply = json.loads(_get(f"{base}/api/v1/query?{urllib.parse.urlencode(params)}"))
    assert reply["status"] == "success", reply
    result: list[dict[str, Any]] = reply["data"]["result"]
    return result


@pytest.fixture
def simulate(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``fleetfit simulate --dcgm-exporter 0`` without a broker: the base URL it prints and its seed's fleet."""
    err = tmp_path / "simulate.err"
    process = subprocess.Popen(
        [sys.executable, "-m", "optimizer.commands.cli", "simulate", "--nodes", "3", "--scenario", "realistic",
         "--seed", "4", "--dcgm-exporter", "0", "--duration", "60"],
        stderr=err.open("w"), stdout=subprocess.DEVNULL, cwd=Path(__file__).parent.parent,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    url = None
    while url is None and time.monotonic() < deadline and process.poll() is None:
        m = re.search(r"dcgm-exporter: (http://127\.0\.0\.1:\d+)/metrics", err.read_text())
        url = m.group(1) if m else None
        time.sleep(0.1)
    assert url is not None, err.read_text()
    yield url, err.read_text()
    process.terminate()
    process.wait(timeout=20)


def test_prometheus_scrapes_the_simulator_and_reads_its_backfilled_history(
    simulate: tuple[str, str], tmp_path: Path
) -> None:
    """A real Prometheus scrapes ``fleetfit simulate --dcgm-exporter`` (no broker) per node and reads back a day's
    history that promtool made into blocks (deliberate bugs: a node's endpoint serving the whole fleet, the
    history without # EOF, its timestamps in milliseconds)."""
    base, _ = simulate
    scenario = build_scenario("realistic", 3, 4)
    nvidia = [n for n in scenario if not n.profile.startswith(("mi300x", "gaudi"))]
    one = parse(_get(f"{base}/nodes/{nvidia[0].name}/metrics").decode())
    assert {lab["Hostname"] for _, lab, _ in of(one, "DCGM_FI_DEV_GPU_UTIL")} == {nvidia[0].name}

    history = tmp_path / "history.om"
    end = float(int(time.time() // 60 * 60) - 3 * 3600)  # hours before the live scrapes
    # Two processes, a node each: a family's lines come from both, each series from one.
    stats = write_history(scenario[:2], history, end=end, span=3600, step=60, options=ExporterOptions(), jobs=2)
    assert history.read_text().endswith("\n# EOF\n") and stats.steps == 60
    data = tmp_path / "data"
    subprocess.run(
        [_binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(history), str(data)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    config = tmp_path / "prometheus.yml"
    target = base.removeprefix("http://")
    config.write_text(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n"
        + "".join(
            f"  - job_name: {n.name}\n    honor_labels: true\n    metrics_path: /nodes/{n.name}/metrics\n"
            f"    static_configs: [{{targets: ['{target}']}}]\n"
            for n in scenario
        )
    )
    port = free_port()
    log = tmp_path / "prometheus.log"
    process = subprocess.Popen(
        [_binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={data}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100y", "--log.level=error"],
        stdout=log.open("ab"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        _wait_listening("127.0.0.1", port, process, log)
        prom = f"http://127.0.0.1:{port}"
        expected_gpus = sum(8 for _ in nvidia)
        deadline = time.monotonic() + 20
        live: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            try:
                live = _query(prom, "DCGM_FI_DEV_GPU_UTIL")
            except OSError:
                live = []
            if len(live) >= expected_gpus:
                break
            time.sleep(0.3)
        hosts = {r["metric"]["Hostname"] for r in live}
        assert hosts == {n.name for n in nvidia}, live
        # Each GPU seen once per pod holding it, the pods those of the seed's fleet.
        uids = {r["metric"].get("pod_uid") for r in live} - {None}
        assert uids == {w.id.removeprefix("k8s/") for n in nvidia for w in n.workloads}
        # The backfilled hour: the value written at a sample's timestamp comes back at that time.
        line = next(li for li in history.read_text().splitlines() if li.startswith("DCGM_FI_DEV_POWER_USAGE{"))
        selector, value, stamp = line.rsplit(" ", 2)
        back = _query(prom, selector, at=float(stamp))
        assert [float(r["value"][1]) for r in back] == [float(value)]
        hour = _query(prom, f"count_over_time({selector}[1h])", at=end)
        assert [r["value"][1] for r in hour] == ["60"]
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_victoriametrics_imports_the_history(victoria: VictoriaMetrics, tmp_path: Path) -> None:
    """The victoriametrics form goes into a real VictoriaMetrics through /api/v1/import/prometheus and a series
    comes back with its millisecond timestamps and values; read back by the Prometheus source, an LLM server's
    access log (0.05 MB/s, collectors/sim/workloads.py) on an md RAID node is its windows' disk writes, counted on
    the array and not again on its members (deliberate bugs: timestamps written in seconds, the cAdvisor series
    without the pod's namespace, the reader summing every device: 0.1 MB/s)."""
    history = tmp_path / "history.prom"
    end = float(int(time.time() // 60 * 60) - 3600)
    node = build_scenario("realistic", 1, 2)[0]
    write_history([node], history, end=end, span=600, step=60, options=ExporterOptions(), fmt="victoriametrics")
    urllib.request.urlopen(
        urllib.request.Request(f"{victoria.url}/api/v1/import/prometheus", data=history.read_bytes()), timeout=30
    ).read()
    written = [li for li in history.read_text().splitlines() if li.startswith('DCGM_FI_DEV_GPU_UTIL{gpu="0",')]
    assert len(written) == 10
    rows = victoria.export('DCGM_FI_DEV_GPU_UTIL{gpu="0"}')
    assert len(rows) == len({li.rsplit(" ", 2)[0] for li in written})
    metric: dict[str, str] = rows[0]["metric"]  # type: ignore[assignment]
    mine = [li for li in written if f'pod_uid="{metric["pod_uid"]}"' in li]
    assert rows[0]["timestamps"] == [int(li.rsplit(" ", 1)[1]) for li in mine]
    assert rows[0]["values"] == [float(li.rsplit(" ", 2)[1]) for li in mine]

    raid = next(
        n
        for n in build_scenario("realistic", 10, 5)
        if "md_raid" in n.quirks and [w.pattern for w in n.workloads] == [Pattern.LLM_SERVING]
    )
    end = float(int(time.time() // 300 * 300) - 3 * 3600)  # apart from the hour above
    write_history([raid], history, end=end, span=1200, step=60, options=ExporterOptions(), fmt="victoriametrics")
    urllib.request.urlopen(
        urllib.request.Request(f"{victoria.url}/api/v1/import/prometheus", data=history.read_bytes()), timeout=30
    ).read()
    _wait_searchable(victoria.url, 2)  # this node's series beside the first's
    refs = _read_windows(victoria.url, (end - 1200, end), ReadSettings(step=60.0, window=300.0))
    (windows,) = refs.values()
    assert len(windows) == 4
    for r in windows:
        assert (r["disk_write_bps"], r["disk_read_bps"]) == (pytest.approx(50e3, rel=0.02), 0)


def test_history_command_writes_the_ground_truth(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``fleetfit simulate --dcgm-history`` without a broker writes the file and labels ``fleetfit classify`` reads,
    named as a reader names the workloads; with nothing to do it says so (deliberate bug: labels keyed by the pod's
    name instead of k8s/<pod_uid>)."""
    out = tmp_path / "h.om"
    rc = cli_main(["simulate", "--nodes", "2", "--scenario", "realistic", "--seed", "9", "--dcgm-history", str(out),
                   "--history", "600", "--step", "60", "--dcgm-history-jobs", "2"])  # fmt: skip
    assert rc == 0
    labels = load_labels(labels_path(out))
    scenario = build_scenario("realistic", 2, 9)
    nvidia = [n for n in scenario if not n.profile.startswith(("mi300x", "gaudi"))]
    assert set(labels) == {w.id for n in nvidia for w in n.workloads}
    uids = set(re.findall(r'pod_uid="([^"]+)"', out.read_text()))
    assert {f"k8s/{u}" for u in uids} == set(labels)
    assert "dcgm-history:" in capsys.readouterr().err
    assert cli_main(["simulate", "--nodes", "2"]) == 2
    assert "--dcgm-exporter" in capsys.readouterr().err


async def test_bad_requests_are_refused_and_counted() -> None:
    """Requests that are not a scrape get 400/404/405, a log line and a count by reason; the next scrape still
    works (deliberate bug: an unknown node answered with the whole fleet)."""
    _, sims, _ = fleet(nodes=2)
    server = ExporterServer(sims, ExporterOptions())
    await server.start()
    try:

        async def ask(raw: bytes) -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(raw)
            await writer.drain()
            data = await reader.read()
            writer.close()
            return data

        assert (await ask(b"GARBAGE\r\n\r\n")).startswith(b"HTTP/1.1 400")
        assert (await ask(b"GET /nodes/nope/metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404")
        assert (await ask(b"POST /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 405")
        assert (await ask(b"GET /other HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404")
        counts = (await ask(b"GET /-/metrics HTTP/1.1\r\n\r\n")).decode()
        for reason in ("bad_request", "unknown_node", "method", "not_found"):
            assert f'fleetfit_sim_exporter_requests_rejected_total{{reason="{reason}"}} 1' in counts
        body = (await ask(b"GET /metrics HTTP/1.1\r\n\r\n")).split(b"\r\n\r\n", 1)[1].decode()
        assert of(parse(body), "DCGM_FI_DEV_GPU_UTIL")
    finally:
        await server.stop()


def test_history_refuses_a_step_longer_than_the_span(tmp_path: Path) -> None:
    """A span shorter than one step is refused in one line, not written as an empty file (deliberate bug: the
    check removed, leaving a file with no samples)."""
    node = replace(build_scenario("realistic", 1, 1)[0])
    with pytest.raises(ValueError, match="at least one step"):
        write_history([node], tmp_path / "x.om", end=1e9, span=30, step=60, options=ExporterOptions())
    assert not (tmp_path / "x.om").exists()
