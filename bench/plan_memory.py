"""The optimizer's memory per node: at rest with the whole horizon held, and at its peak while it plans.

A fleet's windows are simulated ahead (bench/replay.py: the ``mixed`` scenario, the simulator and the agent's own
window code, cached for the next run), ``--distinct`` per node, cycled with fresh sequence numbers and times to
``--windows`` a node, as ``bench/e2e.py --replay`` sends them. A fresh interpreter, the optimizer's own
(``Optimizer`` with its ingest limits, the garbage collector tuned as the daemon tunes it), reads them from a pipe
and takes them in with ``Fleet.ingest``, as it would off the broker; then it runs one round of plans as the
service's planning task does (``plan_once``: the fleet copied, features, classification and the solve in a
worker thread). No broker, store or state directory: the memory of those is not what is measured.

Resident memory (``VmRSS``) is read before any node (idle), after every window is in (steady), at its peak
during the round (sampled every 20 ms by a side thread, and the kernel's high-water mark ``VmHWM``, reset just
before the round) and after it; each as KiB a node above idle. Also the round's CPU: the planning thread's
(``plan_cpu_seconds``, what pacing counts) and the whole process's (with the solver's threads).

    .venv/bin/python bench/plan_memory.py [--nodes 2000] [--windows 60] [--distinct 6] [--plan-out FILE]

``--plan-out`` writes the round's recommendations and workloads (ids, classes, moves; no times) as JSON, to
compare a plan before and after a change on the same inputs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PREFIX = "fleetfit/v1"
SITE = "memory"
WINDOW_S = 10.0
_HEAD = struct.Struct(">HI")  # a record on the pipe: topic length, payload length


def _status(field: str) -> int:
    """A ``/proc/self/status`` figure, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    """VmHWM from here on: the round's own peak."""
    Path("/proc/self/clear_refs").write_text("5")


def _write(path: Path, plans: list[dict[str, object]]) -> None:
    path.write_text(json.dumps(plans, indent=1))


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Sampler:
    """The highest VmRSS seen every ``every`` seconds, from a thread of its own."""

    def __init__(self, every: float = 0.02) -> None:
        self.peak = 0
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self.peak = max(self.peak, _status("VmRSS"))
            if self._stop.wait(self._every):
                return


def _read(stream: IO[bytes], n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise EOFError("the stream of windows ended early")
    return data


async def measure(windows: int, plan_out: Path | None) -> dict[str, object]:
    """The measured process: an optimizer fed from stdin, then one round of plans."""
    from optimizer.decide.catalog import load_catalog
    from optimizer.serve.config import OptimizerConfig, OptimizerSettings
    from optimizer.serve.service import Optimizer, tune_gc

    config = OptimizerConfig(
        optimizer=OptimizerSettings(client_id="bench-plan-memory", solve_interval=3600, horizon_windows=windows)
    )
    opt = Optimizer(config, load_catalog())
    tune_gc()  # as `fleetfit optimizer` does at start
    idle = _status("VmRSS")
    stdin = sys.stdin.buffer
    (count,) = struct.unpack(">I", _read(stdin, 4))
    for _ in range(count):
        topic_len, payload_len = _HEAD.unpack(_read(stdin, _HEAD.size))
        opt.fleet.ingest(_read(stdin, topic_len).decode(), _read(stdin, payload_len))
    steady = _status("VmRSS")
    _reset_peak()
    cpu, wall = _cpu(), time.monotonic()
    with Sampler() as sampler:
        plans = await opt.plan_once()
    cpu, wall = _cpu() - cpu, time.monotonic() - wall
    after = _status("VmRSS")
    if plan_out is not None:
        _write(plan_out, [_content(json.loads(p.model_dump_json())) for p in plans])
    return {
        "nodes": len(opt.fleet.nodes),
        "accepted": opt.fleet.accepted["telemetry"],
        "rejected": dict(opt.fleet.rejected),
        "held": sorted(len(r.windows) for r in opt.fleet.nodes.values())[len(opt.fleet.nodes) // 2],
        "idle": idle,
        "steady": steady,
        "peak": max(sampler.peak, _status("VmHWM")),
        "sampled": sampler.peak,
        "after": after,
        "plan_cpu": opt.plan_cpu_seconds,
        "process_cpu": cpu,
        "wall": wall,
        "recommendations": sum(len(p.recommendations) for p in plans),
    }


def _content(plan: dict[str, object]) -> dict[str, object]:
    """A plan without what differs from one run to the next on the same inputs (times, timings)."""
    drop = {"created", "generated_at", "timing", "solve_seconds", "elapsed", "wall_seconds", "solver"}
    return {k: v for k, v in plan.items() if k not in drop}


def stream(nodes: list[tuple[str, bytes, list[bytes]]], windows: int, out: IO[bytes]) -> None:
    """Every node's birth, then its windows, ending now, spread over one window as agents start."""
    from agent.protocol import TopicKind, node_topic

    now = time.time()
    out.write(struct.pack(">I", len(nodes) * (windows + 1)))
    for i, (name, birth, templates) in enumerate(nodes):
        records = [(node_topic(PREFIX, SITE, name, TopicKind.BIRTH), birth)]
        topic = node_topic(PREFIX, SITE, name, TopicKind.TELEMETRY)
        for k in range(windows):
            end = now - WINDOW_S * (windows - 1 - k) - WINDOW_S * i / len(nodes)
            payload = (
                templates[k % len(templates)]
                .replace(b"987654321", str(k).encode())
                .replace(b"1111111111.125", repr(end - WINDOW_S).encode())
                .replace(b"1111111121.125", repr(end).encode())
            )
            records.append((topic, payload))
        for t, p in records:
            data = t.encode()
            out.write(_HEAD.pack(len(data), len(p)) + data + p)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--windows", type=int, default=60, help="windows a node holds (the horizon)")
    parser.add_argument("--distinct", type=int, default=6, help="windows simulated per node, cycled (as e2e)")
    parser.add_argument("--scenario", default="mixed")
    parser.add_argument("--plan-out", type=Path, help="write the plan's content here (JSON)")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the measured process
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(asyncio.run(measure(args.windows, args.plan_out))))
        return 0
    from replay import Replay

    began = time.monotonic()
    replay = Replay(args.scenario, args.nodes, SITE, per_node=args.distinct)
    print(f"{args.nodes} nodes' windows ready in {time.monotonic() - began:.0f} s", flush=True)
    command = [sys.executable, __file__, "--measure", "--windows", str(args.windows)]
    if args.plan_out is not None:
        command += ["--plan-out", str(args.plan_out.resolve())]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=os.environ)
    assert child.stdin is not None
    stream(replay.nodes, args.windows, child.stdin)
    child.stdin.close()
    del replay
    assert child.stdout is not None
    out = child.stdout.read()
    if child.wait():
        print(f"the measured process failed ({child.returncode})")
        return 1
    r = json.loads(out.decode().strip().splitlines()[-1])
    n = r["nodes"]

    def per_node(kib: int) -> str:
        return f"{kib / 1024:,.0f} MiB, {(kib - r['idle']) / n:,.0f} KiB a node above idle"

    print(f"{n} nodes, {r['accepted']:,} windows taken in ({r['held']} held a node), rejected: {r['rejected'] or 0}")
    print(f"idle (before any node): {r['idle'] / 1024:,.0f} MiB")
    print(f"steady (every window in): {per_node(r['steady'])}")
    sampled = f"sampled every 20 ms: {r['sampled'] / 1024:,.0f} MiB"
    print(f"peak during the round of plans: {per_node(r['peak'])} ({sampled})")
    print(f"after the round: {per_node(r['after'])}")
    print(f"peak against steady: {(r['peak'] - r['idle']) / max(r['steady'] - r['idle'], 1):.2f}x")
    print(
        f"the round: {r['plan_cpu']:.1f} s of the planning thread's CPU, {r['process_cpu']:.1f} s of the process's, "
        f"{r['wall']:.1f} s wall; {r['recommendations']} recommendation(s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
