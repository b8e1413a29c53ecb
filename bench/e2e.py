"""End to end at fleet size on one machine: Mosquitto + ``fleetfit simulate --nodes N`` + ``fleetfit optimizer``
+ VictoriaMetrics, for several minutes of real time.

Prints, from what each process reports and what /proc says about it: windows published by the simulator and
accepted by the optimizer, ingest lag (window end → optimizer, from its /metrics), points written to and read
back from VictoriaMetrics, solve time and recommendations per plan, CPU (share of one core) and peak RSS of
every process, and the headroom left on this machine.

The optimizer's lag is told from the simulator's: a bare subscriber in this process (one paho client on its
own thread, reading only each window's ``end``) sees how late windows reach the broker's subscribers at all;
what the optimizer adds is the difference. ``--simulators K`` splits the fleet over K simulator processes
(site ``e2e-1`` … ``e2e-K``, so that planning sees K sites of N/K nodes) for when one cannot keep up.
The optimizer's CPU includes its solver threads (``/proc/pid/stat``, threads that ended included).

``--replay`` publishes windows simulated before the clock starts (bench/replay.py: each node's first minute,
cycled with fresh sequence numbers and times) from one thread of this process, in place of live simulators: the
simulator needs ~4.5 ms of CPU per window, most of a core at 2,000 nodes, which a 2-core machine cannot spare
beside the optimizer. The optimizer's work per window is the same either way.

    .venv/bin/python bench/e2e.py [--nodes 2000] [--duration 300] [--solve-interval 60] [--simulators 1] [--replay]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import paho.mqtt.client as paho
from common import free_port, mosquitto_command, process_cpu_seconds, raise_open_files_limit, rss_mib
from paho.mqtt.enums import CallbackAPIVersion
from replay import Replay

FLEETFIT = str(Path(sys.executable).parent / "fleetfit")


def scrape(port: int) -> dict[str, float]:
    out: dict[str, float] = {}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return out
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def wait_http(url: str, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer")


def start_victoria_metrics(binary: str, work: Path, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [binary, f"-httpListenAddr=127.0.0.1:{port}", f"-storageDataPath={work / 'vm'}", "-loggerLevel=ERROR"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def vm_series_count(port: int, metric: str) -> int:
    query = urllib.parse.urlencode({"match[]": f'{{__name__=~"{metric}"}}'})
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/export?{query}", timeout=60) as r:
        return sum(len(json.loads(line)["values"]) for line in r.read().decode().splitlines() if line)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


class BareLag:
    """Window end -> arrival at a subscriber that does nothing else: the simulator's and broker's share of lag."""

    END = re.compile(rb'"end":([0-9.eE+-]+)')

    def __init__(self, port: int) -> None:
        self.samples: list[tuple[float, float]] = []  # (arrival, lag)
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id="bench-bare-lag")
        self.client.on_message = self._message
        self.client.on_connect = lambda c, *_: c.subscribe("fleetfit/v1/+/+/telemetry", qos=0)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def _message(self, client: paho.Client, userdata: object, message: paho.MQTTMessage) -> None:
        found = self.END.search(message.payload)
        if found:
            now = time.time()
            self.samples.append((now, now - float(found.group(1))))

    def stop(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()

    def quantiles(self, since: float) -> tuple[float, float]:
        lags = sorted(lag for at, lag in self.samples if at >= since)
        if not lags:
            return float("nan"), float("nan")
        return lags[len(lags) // 2], lags[max(0, -(-len(lags) * 95 // 100) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of real time (default 300)")
    parser.add_argument("--solve-interval", type=float, default=60.0)
    parser.add_argument("--scenario", default="mixed")
    parser.add_argument("--simulators", type=int, default=1, help="simulator processes sharing the fleet")
    parser.add_argument("--replay", action="store_true", help="publish windows simulated before the run")
    parser.add_argument("--profile", type=Path, help="run the optimizer under cProfile, its stats written here")
    args = parser.parse_args()
    replay = None
    if args.replay:
        prepared = time.monotonic()
        replay = Replay(args.scenario, args.nodes, "e2e")
        print(f"replay: {args.nodes} nodes' windows simulated in {time.monotonic() - prepared:.0f} s", flush=True)
    raise_open_files_limit()
    vm_binary = shutil.which("victoria-metrics")
    if vm_binary is None:
        sys.exit("victoria-metrics is not installed (apt-get install victoria-metrics)")
    with tempfile.TemporaryDirectory(prefix="fleetfit-e2e-") as tmp:
        work = Path(tmp)
        mqtt_port, vm_port, api_port = free_port(), free_port(), free_port()
        procs: dict[str, subprocess.Popen[bytes]] = {}
        procs["mosquitto"] = subprocess.Popen(
            mosquitto_command(work, mqtt_port, "max_queued_messages 200000", "max_connections -1")
        )
        procs["victoria-metrics"] = start_victoria_metrics(vm_binary, work, vm_port)
        wait_http(f"http://127.0.0.1:{vm_port}/health")
        config = work / "optimizer.toml"
        config.write_text(
            f'[optimizer]\nstate_dir = "{work / "state"}"\nsolve_interval = {args.solve_interval}\n'
            f"horizon_windows = 60\n"
            f'[mqtt]\nhost = "127.0.0.1"\nport = {mqtt_port}\nsession_expiry = 3600\n'
            f'[influxdb]\nurl = "http://127.0.0.1:{vm_port}"\n'
            f'[api]\nlisten = "127.0.0.1"\nport = {api_port}\n'
        )
        (work / "state").mkdir()
        profiled = [sys.executable, "-m", "cProfile", "-o", str(args.profile.resolve())] if args.profile else []
        procs["optimizer"] = subprocess.Popen(
            [*profiled, FLEETFIT, "--log-level", "warning", "optimizer", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=(work / "optimizer.log").open("wb"),
        )
        wait_http(f"http://127.0.0.1:{api_port}/healthz")
        rss_idle = rss_mib(procs["optimizer"].pid)  # connected and serving, no node seen yet
        bare = BareLag(mqtt_port)
        sites = [("e2e", args.nodes)] if args.simulators == 1 else [
            (f"e2e-{k + 1}", args.nodes // args.simulators + (k < args.nodes % args.simulators))
            for k in range(args.simulators)
        ]  # fmt: skip
        for i, (site, nodes) in enumerate(sites if replay is None else []):
            procs[f"simulator{i}"] = subprocess.Popen(
                [FLEETFIT, "--log-level", "warning", "simulate", "--broker", f"mqtt://127.0.0.1:{mqtt_port}",
                 "--nodes", str(nodes), "--scenario", args.scenario, "--site", site, "--time-scale", "1",
                 "--duration", str(args.duration), "--seed", str(i)],
                stdout=subprocess.DEVNULL,
                stderr=(work / f"simulate{i}.log").open("wb"),
            )  # fmt: skip
        if replay is not None:
            replay.start(mqtt_port, args.duration)
        started = time.monotonic()
        bench_cpu0 = time.process_time()
        simulators = [k for k in procs if k.startswith("simulator")]
        cpu0 = {k: process_cpu_seconds(p.pid) for k, p in procs.items()}
        peak = dict.fromkeys(procs, 0.0)
        last_cpu = dict(cpu0)
        lag_p50: list[float] = []
        lag_p95: list[float] = []
        solves: dict[float, tuple[float, float, float, float]] = {}
        while any(procs[k].poll() is None for k in simulators) or (replay is not None and replay.alive()):
            time.sleep(5)
            for k, p in procs.items():
                if p.poll() is None:
                    peak[k] = max(peak[k], rss_mib(p.pid))
                    last_cpu[k] = process_cpu_seconds(p.pid)
            m = scrape(api_port)
            if time.monotonic() - started > 60:  # past the first windows' start-up burst
                lag_p50.append(m.get('fleetfit_ingest_lag_seconds{quantile="0.5"}', float("nan")))
                lag_p95.append(m.get('fleetfit_ingest_lag_seconds{quantile="0.95"}', float("nan")))
            plans = m.get("fleetfit_plans_total", 0)
            if plans and plans not in solves:
                solves[plans] = (
                    m.get('fleetfit_solve_seconds{site="e2e"}', 0),
                    m.get('fleetfit_recommendations{site="e2e"}', 0),
                    m.get('fleetfit_solve_gap{site="e2e"}', 0),
                    m.get('fleetfit_solve_optimal{site="e2e"}', 0),
                )
        elapsed = time.monotonic() - started
        bench_cpu = time.process_time() - bench_cpu0
        cpu = {k: (process_cpu_seconds(p.pid) if p.poll() is None else last_cpu[k]) - cpu0[k] for k, p in procs.items()}
        bare.stop()
        bare_p50, bare_p95 = bare.quantiles(time.time() - elapsed + 60)
        time.sleep(15)  # the optimizer drains and the store flushes
        m = scrape(api_port)
        for k in ("optimizer", "victoria-metrics", "mosquitto"):
            procs[k].send_signal(signal.SIGTERM)
        for k in ("optimizer", "mosquitto"):
            procs[k].wait(timeout=60)
        if not m.get('fleetfit_messages_accepted_total{kind="telemetry"}'):
            for log in sorted(work.glob("*.log")):  # nothing arrived: say why before the logs go
                print(f"--- {log.name}:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:]))
        written = m.get("fleetfit_store_points_written_total", 0)
        values = m.get("fleetfit_store_values_written_total", 0)
        time.sleep(2)
        procs["victoria-metrics"].wait(timeout=30)
        # read back after a restart of the store, from disk
        vm = start_victoria_metrics(vm_binary, work, vm_port)
        try:
            wait_http(f"http://127.0.0.1:{vm_port}/health")
            urllib.request.urlopen(f"http://127.0.0.1:{vm_port}/internal/force_flush", timeout=30).close()
            read_back = vm_series_count(vm_port, "fleetfit_.*")
        finally:
            vm.terminate()
            vm.wait(timeout=30)

    windows = m.get('fleetfit_messages_accepted_total{kind="telemetry"}', 0)
    rejected = sum(v for k, v in m.items() if k.startswith("fleetfit_messages_rejected_total"))
    expected = args.nodes * int(args.duration // 10)
    print(f"fleet: {args.nodes} simulated nodes ({args.scenario}), {elapsed:.0f} s at time-scale 1, 10 s windows")
    print(f"windows: ~{expected} expected, {windows:.0f} accepted by the optimizer, {rejected:.0f} rejected")
    print(
        f"ingest lag (window end -> optimizer), median over the run of its p50 / p95: "
        f"{_median(lag_p50):.2f} s / {_median(lag_p95):.2f} s (worst p95 {max(lag_p95, default=float('nan')):.2f} s)"
    )
    print(
        f"  window end -> a bare subscriber (the simulator and broker), past the first minute: p50 {bare_p50:.2f} s / "
        f"p95 {bare_p95:.2f} s"
        + (
            f"; the optimizer's own: ~{_median(lag_p50) - bare_p50:.2f} s / ~{_median(lag_p95) - bare_p95:.2f} s"
            if bare_p95 <= 2.0
            else ": the simulator did not keep up, so the optimizer's lag above is mostly not its own"
        )
    )
    dropped = m.get("fleetfit_store_points_dropped_total", 0)
    print(f"store: {written:.0f} points ({values:.0f} field values) written, {read_back} values read back from "
          f"VictoriaMetrics after its restart, {dropped:.0f} points dropped")  # fmt: skip
    for plans, (solve, recs, gap, optimal) in sorted(solves.items()):
        status = "OPTIMAL" if optimal else "FEASIBLE"
        print(f"plan {plans:.0f}: {status}, solve {solve:.2f} s, gap {gap:.2%}, {recs:.0f} recommendations")
    total = 0.0
    if replay is not None:
        late = sorted(replay.late) or [0.0]
        behind = late[len(late) * 95 // 100]
        print(f"replay (this process, its lag probe included): CPU {bench_cpu / elapsed * 100:5.1f} % of one core; "
              f"{replay.published} windows published, p95 {behind:.2f} s behind schedule")  # fmt: skip
        total += bench_cpu / elapsed
    else:
        sim_cpu = sum(cpu[k] for k in simulators)
        sim_rss = sum(peak[k] for k in simulators)
        print(f"{'simulator' + (f' x{len(simulators)}' if len(simulators) > 1 else ''):17} CPU "
              f"{sim_cpu / elapsed * 100:5.1f} % of one core, peak RSS {sim_rss:6.0f} MiB")  # fmt: skip
        total += sim_cpu / elapsed
    for k in ("optimizer", "mosquitto", "victoria-metrics"):
        share = cpu[k] / elapsed
        total += share
        print(f"{k:17} CPU {share * 100:5.1f} % of one core, peak RSS {peak[k]:6.0f} MiB")
    cores = os.cpu_count() or 1
    load = cpu["optimizer"] / elapsed
    print(f"all together: {total * 100:.0f} % of one core, of {cores} cores")
    plan_cpu = m.get("fleetfit_plan_cpu_seconds_total", 0.0)
    plans_made, rest = m.get("fleetfit_plans_total", 0), m.get("fleetfit_plan_wait_seconds", float("nan"))
    print(f"planning: {plans_made:.0f} plan(s), {plan_cpu:.1f} s of CPU in all ({plan_cpu / elapsed * 100:.1f} % of "
          f"one core); rest before the next round {rest:.0f} s (solve_interval {args.solve_interval:g} s, longer "
          f"where planning would exceed optimizer.plan_cpu_share)")  # fmt: skip
    print(f"optimizer, whole load (ingest, store writes, planning with its solver threads): {load * 100:.1f} % of one "
          f"core: {args.nodes / max(load, 1e-9):,.0f} nodes per optimizer core at 10 s windows")  # fmt: skip
    print(f"optimizer memory: peak RSS {peak['optimizer']:.0f} MiB, {rss_idle:.0f} MiB before any node: "
          f"{(peak['optimizer'] - rss_idle) * 1024 / args.nodes:.0f} KiB per node above that "
          f"({peak['optimizer'] * 1024 / args.nodes:.0f} KiB per node in all), with {min(int(elapsed // 10), 60)} of "
          f"the 60 windows a node keeps (bench/ingest.py traces a node at the full horizon)")  # fmt: skip


if __name__ == "__main__":
    main()
