"""Planning's features over a fleet's windows, against json.loads of the same windows, in the same run.

Every plan folds every window each node holds into its workloads' features (optimizer/decide/features.py); at
2,000 nodes and the default horizon that is 120,000 windows a plan. This times ``workload_features`` over ``--nodes``
simulated nodes with ``--windows`` windows each (the ``mixed`` scenario), on the thread's CPU clock, beside
``json.loads`` of the same windows' bytes, and prints µs per window and the ratio: medians of ``--rounds``.

``--against FILE`` times another features module too (say the one before a change:
``git show REV:optimizer/decide/features.py > /tmp/features_before.py``), in alternation with this one, prints
the ratio of the two and checks that every feature of every workload agrees to 1e-9.

    .venv/bin/python bench/features.py [--nodes 100] [--windows 60] [--rounds 3] [--against FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.protocol import TopicKind, encode, node_topic
from agent.simulate import offline_windows, shift_to_now
from collectors.sim.scenarios import build_scenario
from optimizer.decide import features
from optimizer.ingest.fleet import Fleet

PREFIX = "fleetfit/v1"
SITE = "bench"


def timed(work: Callable[[], object]) -> tuple[float, object]:
    began = time.thread_time()
    out = work()
    return time.thread_time() - began, out


def agree(a: list[features.WorkloadFeatures], b: list[object]) -> int:
    """Features that differ by more than 1e-9 (relative) between two runs over the same fleet."""
    differ = int(len(a) != len(b))
    for x, y in zip(a, b, strict=False):
        dx, dy = dataclasses.asdict(x), dataclasses.asdict(y)  # type: ignore[call-overload]
        for key, u in dx.items():
            v = dy.get(key)
            if isinstance(u, float) and isinstance(v, float):
                differ += not (u == v or (math.isnan(u) and math.isnan(v)) or abs(u - v) <= 1e-9 * max(1, abs(u)))
            else:
                differ += u != v
    return differ


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--windows", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", type=Path, help="another features.py to time beside this one")
    args = parser.parse_args()
    fleet = Fleet(PREFIX, horizon_windows=args.windows)
    payloads = []
    for i, node in enumerate(build_scenario("mixed", args.nodes, seed=3)):
        birth, windows = offline_windows(node, args.windows, site=SITE, seed=i)
        fleet.ingest(node_topic(PREFIX, SITE, node.name, TopicKind.BIRTH), encode(birth))
        topic = node_topic(PREFIX, SITE, node.name, TopicKind.TELEMETRY)
        for w in shift_to_now(windows):
            payloads.append(encode(w))
            fleet.ingest(topic, payloads[-1])
    count = fleet.accepted["telemetry"]
    other = None
    if args.against is not None:
        spec = importlib.util.spec_from_file_location("features_against", args.against)
        assert spec is not None
        assert spec.loader is not None
        other = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = other  # its dataclasses look their module up by name
        spec.loader.exec_module(other)
    runs: dict[str, list[float]] = {"this": [], "json.loads": [], "against": []}
    for _ in range(max(args.rounds, 1)):
        spent, ours = timed(lambda: features.workload_features(fleet, SITE))
        runs["this"].append(spent)
        runs["json.loads"].append(timed(lambda: [len(json.loads(p)) for p in payloads])[0])  # each dropped at once
        if other is not None:
            spent, theirs = timed(lambda: other.workload_features(fleet, SITE))
            runs["against"].append(spent)
            assert isinstance(ours, list)
            assert isinstance(theirs, list)
            differ = agree(ours, theirs)
    us = {k: statistics.median(v) / count * 1e6 for k, v in runs.items() if v}
    print(f"{args.nodes} nodes x {args.windows} windows ({count} windows), medians of {max(args.rounds, 1)} rounds:")
    print(f"features: {us['this']:.0f} µs per window; json.loads of the same window {us['json.loads']:.0f} µs: "
          f"{us['this'] / us['json.loads']:.2f}x")  # fmt: skip
    if other is not None:
        print(f"{args.against}: {us['against']:.0f} µs per window: this one takes {us['this'] / us['against']:.2f}x "
              f"its time; features that differ by more than 1e-9: {differ}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
