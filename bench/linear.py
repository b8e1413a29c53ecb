"""Work that must grow linearly with the fleet, timed at two sizes in the same run: a linear step takes about
4x as long at 4x the size, a quadratic one 16x. Exits non-zero past 10x (allocation-heavy steps run a little
above 4x: the collector scans more objects in a bigger heap).

* ``with_additions``: naming the nodes of ``--add "l40s x8 = N"`` (twice), N = 2,500 and 10,000;
* ``Snapshot`` validation: each workload's nodes looked up in one set, 5,000 and 20,000 nodes.

With ``--demo``, also the wall time of ``fleetfit demo --duration 8 --format json`` (a day of history, 8 s
live, the plan), which has no baseline to compare with: it is printed, not judged.

    .venv/bin/python bench/linear.py [--demo]
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from optimizer.commands.buy import parse_addition, with_additions
from optimizer.decide.catalog import load_catalog
from optimizer.decide.snapshot import Snapshot

FLEETFIT = str(Path(sys.executable).parent / "fleetfit")
BASE = {
    "site": "eu-1",
    "nodes": [{"name": "h100-01", "hardware": "h100", "gpus": 8}],
    "workloads": [{"id": "p", "class": "training", "nodes": ["h100-01"], "gpus": 8}],
}


def _seconds(step: Callable[[], object], repeats: int = 5) -> float:
    """The fastest of ``repeats`` runs on the process's CPU clock: the least disturbed by other load."""
    times = []
    for _ in range(repeats):
        gc.collect()
        started = time.process_time()
        step()
        times.append(time.process_time() - started)
    return min(times)


def additions(n: int) -> Callable[[], object]:
    catalog = load_catalog()
    addition = parse_addition(f"l40s x8 = {n}", catalog)
    snapshot = Snapshot.model_validate(BASE)
    return lambda: with_additions(snapshot, [addition, addition])


def snapshot(n: int) -> Callable[[], object]:
    nodes = [{"name": f"n{i}", "hardware": "l4", "gpus": 8} for i in range(n)]
    workloads = [{"id": f"w{i}", "class": "inference", "nodes": [f"n{i}"], "gpus": 8} for i in range(0, n, 2)]
    raw = {"site": "s", "nodes": nodes, "workloads": workloads}
    return lambda: Snapshot.model_validate(raw)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo", action="store_true", help="also time `fleetfit demo --duration 8`")
    args = parser.parse_args()
    worst = 0.0
    for name, make, small in (("with_additions", additions, 2_500), ("Snapshot validation", snapshot, 5_000)):
        a, b = _seconds(make(small)), _seconds(make(4 * small))
        worst = max(worst, b / a)
        print(f"{name}: {a:.3f} s at {small:,}, {b:.3f} s at {4 * small:,}: {b / a:.1f}x (linear ~4x, quadratic ~16x)")
    if args.demo:
        started = time.monotonic()
        subprocess.run([FLEETFIT, "demo", "--duration", "8", "--format", "json"], capture_output=True, check=True)
        print(f"fleetfit demo --duration 8: {time.monotonic() - started:.0f} s wall")
    return 0 if worst <= 10 else 1


if __name__ == "__main__":
    sys.exit(main())
