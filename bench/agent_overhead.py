"""Agent overhead next to Prometheus node_exporter, measured side by side in the same run.

Runs ``fleetfit agent --simulate h100x8`` (publishing to a local Mosquitto) and Debian's
``prometheus-node-exporter`` with only its netdev and diskstats collectors, scraped once a second, for the same
steady-state interval; repeats for several rounds and prints the medians of CPU milliseconds per 1 Hz cycle and
resident memory, and the agent/node_exporter ratio.

The agent reads workload facts (collectors/workload_facts.py) in its own cycle: the bench starts ``--workloads``
real local server processes (8 by default, one per GPU) and gives them to the agent with ``--simulate-pids``, so
its simulated GPUs are run by them. Each listens on a TCP port and holds two inbound connections; half of them
run in a network namespace of their own (``unshare --net``, as a pod's), the other half in the host's (the fd
scan path). The agent attributes them and reads their facts through its real path (collectors/pids.py,
collectors/workload_facts.py) once per window; the round fails unless its last window carries every workload's
program and listening port, and the traffic rates of those in their own namespace.

One part of that path runs only once per 10 minutes (``SOCKET_INTERVAL_S``): each namespace's TCP table and
each host-namespace process's file descriptors are read again. The agent does its first such read during the
warm-up, so the bench measures it on the same processes (``WorkloadFacts.enrich``, reading afresh against
reading from cache) and adds it to the agent's CPU per cycle amortised over that interval.

    .venv/bin/python bench/agent_overhead.py [--duration 60] [--rounds 3] [--warmup 15] [--workloads 8]

``--workloads 0`` measures the agent without workload facts. Needs mosquitto and prometheus-node-exporter
(apt-get install mosquitto prometheus-node-exporter); namespaces need ``unshare`` and the right to use it
(root), else every workload runs in the host's namespace and the bench says so.
"""

from __future__ import annotations

import argparse
import json
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

# A model server's stand-in: listens on a port below the ephemeral range, holds two inbound connections from
# itself, and sits idle. In a namespace of its own it first brings loopback up (a new namespace's is down).
SERVER = """\
import random, signal, socket, sys
port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
for candidate in [port] if port else random.sample(range(20000, 29000), 200):
    try:
        server.bind(("127.0.0.1", candidate))
        break
    except OSError:
        continue
server.listen()
port = server.getsockname()[1]
clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
accepted = [server.accept()[0] for _ in clients]
print(port, flush=True)
signal.pause()
"""
PROGRAM = "model_server.py"


def wait_port(port: int, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def own_namespace_works() -> bool:
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if unshare is None or ip is None:
        return False
    probe = subprocess.run([unshare, "--net", ip, "link", "set", "lo", "up"], check=False, capture_output=True)
    return probe.returncode == 0


def start_workloads(workdir: Path, count: int, namespaces: bool) -> list[tuple[subprocess.Popen[bytes], bool]]:
    """``count`` servers, each its own process group (one workload each); every other one in a network namespace
    of its own when ``namespaces``. (process, in its own namespace) each, once listening."""
    script = workdir / PROGRAM
    script.write_text(SERVER)
    started = []
    for i in range(count):
        own = namespaces and i % 2 == 1
        if own:  # exec keeps the pid: the agent is given the server's own
            command = [
                "unshare",
                "--net",
                "sh",
                "-c",
                f'ip link set lo up && exec "$0" "{script}" 8000',
                sys.executable,
            ]
        else:
            command = [sys.executable, str(script)]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, start_new_session=True)
        started.append((proc, own))
    for proc, _ in started:
        assert proc.stdout is not None
        if not proc.stdout.readline().strip():
            raise RuntimeError(f"workload server {proc.pid} did not start")
    return started


def refresh_cost(pids: list[int], calls: int = 20) -> float:
    """CPU ms per window that reads every namespace's TCP table and every host-namespace process's descriptors
    afresh, above one that takes them from cache: what the agent does once per ``SOCKET_INTERVAL_S``."""
    refs = [WorkloadRef(id=f"w{i}", kind=WorkloadKind.PROCESS_GROUP, name=f"w{i}", gpus=[i]) for i in range(len(pids))]
    by_id = {ref.id: [pid] for ref, pid in zip(refs, pids, strict=True)}
    cached, fresh = WorkloadFacts(), WorkloadFacts(socket_interval=0.0)
    cached.enrich(refs, by_id)
    start = time.process_time()
    for _ in range(calls * 10):
        cached.enrich(refs, by_id)
    per_window = (time.process_time() - start) / (calls * 10)
    start = time.process_time()
    for _ in range(calls):
        fresh.enrich(refs, by_id)
    return max(0.0, (time.process_time() - start) / calls - per_window) * 1000


def last_window(state: Path) -> dict[str, object]:
    sent = sorted((state / "sent").glob("*.window"))
    if not sent:
        raise RuntimeError("the agent published no window")
    window: dict[str, object] = json.loads(sent[-1].read_bytes())
    return window


def check_facts(window: dict[str, object], workloads: list[tuple[subprocess.Popen[bytes], bool]]) -> None:
    """The agent read what the bench set up: each workload's program and port, and its own namespace's rates."""
    refs = window.get("workloads")
    assert isinstance(refs, list)
    own = sum(1 for _, o in workloads if o)
    served = [r for r in refs if r.get("program") == PROGRAM and r.get("listen_ports") and r["inbound_connections"]]
    rated = [r for r in served if "net_rx_bps" in r]
    if len(served) != len(workloads) or len(rated) != own:
        raise RuntimeError(
            f"the agent's last window describes {len(served)} of {len(workloads)} workload servers "
            f"({len(rated)} of {own} with namespace traffic): {json.dumps(refs)[:2000]}"
        )


def one_round(workdir: Path, duration: float, warmup: float, workloads: int, namespaces: bool) -> dict[str, float]:
    fleetfit = str(Path(sys.executable).parent / "fleetfit")
    mqtt_port, exporter_port = free_port(), free_port()
    state = workdir / "state"
    agent_conf = workdir / "agent.toml"
    agent_conf.write_text(
        f'[agent]\nnode = "bench"\nstate_dir = "{state}"\n[mqtt]\nhost = "127.0.0.1"\nport = {mqtt_port}\n'
    )
    exporter = shutil.which("prometheus-node-exporter") or "/usr/bin/prometheus-node-exporter"
    procs = [subprocess.Popen(mosquitto_command(workdir, mqtt_port), stderr=subprocess.DEVNULL)]
    servers: list[tuple[subprocess.Popen[bytes], bool]] = []
    try:
        servers = start_workloads(workdir, workloads, namespaces)
        pids = [p.pid for p, _ in servers]
        wait_port(mqtt_port)
        command = [fleetfit, "agent", "--config", str(agent_conf), "--simulate", "h100x8"]
        if pids:
            command += ["--simulate-pids", ",".join(map(str, pids))]
        agent = subprocess.Popen(command, stderr=subprocess.DEVNULL)
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
        result = {
            "agent_ms": (cpu_seconds(agent.pid) - marks["agent"][1]) * 1000 / agent_cycles,
            "exporter_ms": (cpu_seconds(node_exporter.pid) - marks["exporter"][1]) * 1000 / max(scrapes, 1),
            "agent_rss": rss_mib(agent.pid),
            "exporter_rss": rss_mib(node_exporter.pid),
            "refresh_ms": refresh_cost(pids) if pids else 0.0,
        }
        if servers:
            check_facts(last_window(state), servers)
        return result
    finally:
        for p in reversed(procs):
            p.terminate()
        for p, _ in servers:
            p.kill()
        for p in procs + [p for p, _ in servers]:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=60.0, help="steady-state seconds per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds before measuring (past the first window)")
    parser.add_argument(
        "--workloads", type=int, default=8, help="workload server processes whose facts the agent reads (0: none)"
    )
    args = parser.parse_args()
    namespaces = args.workloads > 1 and own_namespace_works()
    if args.workloads > 1 and not namespaces:
        print("cannot make network namespaces here (unshare, root): every workload runs in the host's", flush=True)
    rounds = []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="fleetfit-bench-") as tmp:
            r = one_round(Path(tmp), args.duration, args.warmup, args.workloads, namespaces)
        rounds.append(r)
        print(
            f"round {i + 1}: agent {r['agent_ms']:.2f} ms/cycle {r['agent_rss']:.1f} MiB | "
            f"node_exporter {r['exporter_ms']:.2f} ms/scrape {r['exporter_rss']:.1f} MiB",
            flush=True,
        )
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    refresh = med["refresh_ms"] / SOCKET_INTERVAL_S  # one refresh per interval, 1 cycle a second
    agent_ms = med["agent_ms"] + refresh
    own = args.workloads // 2 if namespaces else 0
    facts = f"workload facts of {args.workloads} processes ({own} in namespaces of their own)" if args.workloads else ""
    print()
    print(f"{'':24}{'fleetfit agent':>16}{'node_exporter':>16}{'ratio':>8}")
    print(
        f"{'CPU ms per 1 Hz cycle':24}{agent_ms:>16.2f}{med['exporter_ms']:>16.2f}{agent_ms / med['exporter_ms']:>8.2f}"
    )
    print(
        f"{'RSS MiB':24}{med['agent_rss']:>16.1f}{med['exporter_rss']:>16.1f}"
        f"{med['agent_rss'] / med['exporter_rss']:>8.2f}"
    )
    print(f"(medians of {args.rounds} rounds of {args.duration:g} s; targets: CPU ratio <= 1.0, agent RSS <= 40 MiB)")
    if args.workloads:
        print(
            f"(agent with {facts}: {med['agent_ms']:.2f} ms per cycle measured, plus {refresh:.3f} ms for "
            f"re-reading TCP tables and descriptors, {med['refresh_ms']:.1f} ms every {SOCKET_INTERVAL_S:g} s)"
        )
    else:
        print("(agent without workload facts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
