"""Agent overhead next to Prometheus node_exporter, measured side by side in the same run.

Runs ``fleetfit agent --simulate h100x8`` (publishing to a local Mosquitto) and Debian's
``prometheus-node-exporter`` with only its netdev and diskstats collectors, scraped once a second, for the same
steady-state interval; repeats for several rounds and prints the medians of CPU milliseconds per 1 Hz cycle and
resident memory, and the agent/node_exporter ratio.

    .venv/bin/python bench/agent_overhead.py [--duration 60] [--rounds 3] [--warmup 15]

Needs mosquitto and prometheus-node-exporter (apt-get install mosquitto prometheus-node-exporter).
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cpu_seconds, free_port, mosquitto_command, rss_mib

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agent.protocol import WorkloadKind, WorkloadRef
from collectors.workload_facts import SOCKET_INTERVAL_S, WorkloadFacts

WINDOW_S = 10.0  # the agent's default publish interval: facts are read once per window
FACTS_WORKLOADS = 8  # one workload per GPU of an 8-GPU node, the most an agent reads


def wait_port(port: int, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def facts_cost(pid: int, calls: int = 200) -> float:
    """CPU ms to read one workload's process facts (collectors/workload_facts.py), once per window in the agent.

    ``--simulate`` has no real processes, so the agent above reads none: the cost is measured here on a real
    server process in the host's network namespace (the broker, with the agent's connection), which takes the
    dearer path (its file descriptors are scanned for socket inodes)."""
    cached, fresh = WorkloadFacts(), WorkloadFacts(socket_interval=0.0)
    # the agent's per-window path: liveness of the workload's processes, their facts, the reference updated
    refs, pids = [WorkloadRef(id="bench", kind=WorkloadKind.PROCESS_GROUP, name="bench", gpus=[0])], {"bench": [pid]}
    start = time.process_time()
    for _ in range(calls):
        cached.enrich(refs, pids)
    per_window = (time.process_time() - start) * 1000 / calls
    start = time.process_time()
    for _ in range(calls // 10):
        fresh.enrich(refs, pids)
    table = (time.process_time() - start) * 1000 / (calls // 10) - per_window
    # A namespace's TCP table is read again once per socket interval, i.e. once in that many windows.
    return per_window + table * WINDOW_S / SOCKET_INTERVAL_S


def one_round(workdir: Path, duration: float, warmup: float) -> dict[str, float]:
    fleetfit = str(Path(sys.executable).parent / "fleetfit")
    mqtt_port, exporter_port = free_port(), free_port()
    agent_conf = workdir / "agent.toml"
    agent_conf.write_text(
        f'[agent]\nnode = "bench"\nstate_dir = "{workdir / "state"}"\n[mqtt]\nhost = "127.0.0.1"\nport = {mqtt_port}\n'
    )
    exporter = shutil.which("prometheus-node-exporter") or "/usr/bin/prometheus-node-exporter"
    procs = [subprocess.Popen(mosquitto_command(workdir, mqtt_port), stderr=subprocess.DEVNULL)]
    try:
        wait_port(mqtt_port)
        agent = subprocess.Popen(
            [fleetfit, "agent", "--config", str(agent_conf), "--simulate", "h100x8"], stderr=subprocess.DEVNULL
        )
        node_exporter = subprocess.Popen(
            [
                exporter,
                f"--web.listen-address=127.0.0.1:{exporter_port}",
                "--collector.disable-defaults",
                "--collector.netdev",
                "--collector.diskstats",
            ],
            stderr=subprocess.DEVNULL,
        )
        procs += [agent, node_exporter]
        wait_port(exporter_port)
        url = f"http://127.0.0.1:{exporter_port}/metrics"
        start = time.monotonic()
        marks: dict[str, tuple[float, float]] = {}
        scrapes = 0
        next_scrape = start
        while True:
            now = time.monotonic()
            if now - start >= warmup and not marks:
                marks = {"agent": (now, cpu_seconds(agent.pid)), "exporter": (now, cpu_seconds(node_exporter.pid))}
                scrapes = 0
            if now - start >= warmup + duration:
                break
            urllib.request.urlopen(url, timeout=5).read()
            scrapes += 1
            next_scrape += 1.0
            time.sleep(max(0.0, next_scrape - time.monotonic()))
        end = time.monotonic()
        agent_cycles = end - marks["agent"][0]  # the agent samples at 1 Hz
        facts_ms = facts_cost(procs[0].pid)
        return {
            "agent_ms": (cpu_seconds(agent.pid) - marks["agent"][1]) * 1000 / agent_cycles,
            "exporter_ms": (cpu_seconds(node_exporter.pid) - marks["exporter"][1]) * 1000 / max(scrapes, 1),
            "agent_rss": rss_mib(agent.pid),
            "exporter_rss": rss_mib(node_exporter.pid),
            "facts_ms": facts_ms,
        }
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=60.0, help="steady-state seconds per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds before measuring (past the first window)")
    args = parser.parse_args()
    rounds = []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="fleetfit-bench-") as tmp:
            r = one_round(Path(tmp), args.duration, args.warmup)
        rounds.append(r)
        print(
            f"round {i + 1}: agent {r['agent_ms']:.2f} ms/cycle {r['agent_rss']:.1f} MiB | "
            f"node_exporter {r['exporter_ms']:.2f} ms/scrape {r['exporter_rss']:.1f} MiB",
            flush=True,
        )
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print()
    print(f"{'':24}{'fleetfit agent':>16}{'node_exporter':>16}{'ratio':>8}")
    print(
        f"{'CPU ms per 1 Hz cycle':24}{med['agent_ms']:>16.2f}{med['exporter_ms']:>16.2f}"
        f"{med['agent_ms'] / med['exporter_ms']:>8.2f}"
    )
    print(
        f"{'RSS MiB':24}{med['agent_rss']:>16.1f}{med['exporter_rss']:>16.1f}"
        f"{med['agent_rss'] / med['exporter_rss']:>8.2f}"
    )
    per_cycle = med["facts_ms"] * FACTS_WORKLOADS / WINDOW_S
    with_facts = med["agent_ms"] + per_cycle
    ratio = with_facts / med["exporter_ms"]
    print(
        f"{'with workload facts':24}{with_facts:>16.2f}{med['exporter_ms']:>16.2f}{ratio:>8.2f}"
        f"   ({med['facts_ms']:.2f} ms per workload per window; {FACTS_WORKLOADS} workloads)"
    )
    print(f"(medians of {args.rounds} rounds of {args.duration:g} s; targets: CPU ratio <= 1.0, agent RSS <= 40 MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
