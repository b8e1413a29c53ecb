"""What writing a telemetry window to the store costs: the optimizer's own line-protocol encoder against
influxdb-client's ``Point`` for the same points, measured in the same run.

    .venv/bin/python bench/store_lines.py [--windows 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from influxdb_client.client.write.point import Point
from influxdb_client.domain.write_precision import WritePrecision

from agent.protocol import Birth, Telemetry
from agent.simulate import offline_windows
from collectors.scenarios import build_scenario
from optimizer import store
from optimizer.series import Measurement
from optimizer.store import window_points


def library_point(m: Measurement, tags: Mapping[str, str | None], fields: Mapping[str, float | None], ts: float) -> Any:
    """The baseline: the same point built the library's way, which the store did before its own encoder."""
    p = Point(m.name).time(int(ts * 1e9), WritePrecision.NS)
    for k, v in tags.items():
        if v:
            p.tag(k, v)
    for k, fv in fields.items():
        if fv is not None:
            p.field(k, float(fv))
    return p


def timed(pairs: list[tuple[Birth, Telemetry]], encode: Callable[[Any], str]) -> float:
    started = time.perf_counter()
    for b, w in pairs:
        [encode(p) for p in window_points(b, w)]
    return (time.perf_counter() - started) / len(pairs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    pairs = []
    for node in build_scenario("mixed", 24, seed=3):
        birth, windows = offline_windows(node, max(2, args.windows // 24), site="bench", seed=3)
        pairs += [(birth, w) for w in windows]
    pairs = pairs[: args.windows]
    values = sum(line.values for b, w in pairs for line in window_points(b, w))
    ours, theirs = [], []
    for _ in range(args.rounds):
        ours.append(timed(pairs, lambda line: line.text))
        with mock.patch.object(store, "point", library_point):
            theirs.append(timed(pairs, lambda p: p.to_line_protocol()))
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"{len(pairs)} windows, {values / len(pairs):.0f} values each; medians of {args.rounds} rounds")
    print(f"fleetfit line encoder:      {a * 1e6:6.0f} µs per window")
    print(f"influxdb-client Points:     {b * 1e6:6.0f} µs per window")
    print(f"ratio {a / b:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
