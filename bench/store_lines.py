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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from influxdb_client.client.write.point import Point
from influxdb_client.domain.write_precision import WritePrecision

from agent.protocol import Birth, NicRole, Stats, Telemetry
from agent.simulate import offline_windows
from collectors.sim.scenarios import build_scenario
from optimizer.ingest.window import Window, as_window
from optimizer.serve import series
from optimizer.serve.series import Measurement
from optimizer.serve.store import window_points


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


def _mean(s: Stats | None) -> float | None:
    return s.mean if s is not None else None


def library_points(birth: Birth | None, w: Telemetry) -> list[Any]:
    """The same points the library's way: per-value dispatch, tags and fields sorted per point."""
    models = {g.index: g.model for g in birth.gpus} if birth else {}
    roles = {n.name: n.role for n in birth.nics} if birth else {}
    base = {"site": w.site, "node": w.node}
    out = []
    for g in w.gpus:
        fields: dict[str, float | None] = {
            f: _mean(getattr(g, f)) for f in series.GPU.fields if isinstance(getattr(g, f, None), Stats)
        }
        fields.update(
            util_p95=g.util.p95 if g.util else None, util_max=g.util.max if g.util else None, xid_events=g.xid_events
        )
        tags = {**base, "gpu": str(g.index), "model": models.get(g.index), "workload": g.workload}
        out.append(library_point(series.GPU, tags, fields, w.end))
    for n in w.nics:
        fields = {"rx_bps": _mean(n.rx_bps), "tx_bps": _mean(n.tx_bps), "errors": n.errors, "drops": n.drops}
        fields.update(rx_bps_max=n.rx_bps.max if n.rx_bps else None, tx_bps_max=n.tx_bps.max if n.tx_bps else None)
        tags = {**base, "nic": n.name, "role": roles.get(n.name, NicRole.OTHER).value}
        out.append(library_point(series.NIC, tags, fields, w.end))
    for d in w.disks:
        fields = {f: _mean(getattr(d, f)) for f in ("read_bps", "write_bps", "read_iops", "write_iops")}
        fields["write_bps_max"] = d.write_bps.max if d.write_bps else None
        out.append(library_point(series.DISK, {**base, "disk": d.name}, fields, w.end))
    host = {"cpu_util": _mean(w.host.cpu_util), "mem_used_pct": _mean(w.host.mem_used_pct)}
    out.append(library_point(series.HOST, base, host, w.end))
    return out


def timed(pairs: list[tuple[Birth, Telemetry, Window]], points: Callable[[Birth, Telemetry, Window], object]) -> float:
    started = time.perf_counter()
    for b, w, read in pairs:
        points(b, w, read)
    return (time.perf_counter() - started) / len(pairs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    pairs = []
    for node in build_scenario("mixed", 24, seed=3):
        birth, windows = offline_windows(node, max(2, args.windows // 24), site="bench", seed=3)
        # the store is handed windows as the optimizer reads them (optimizer/ingest/window.py)
        pairs += [(birth, w, as_window(w)) for w in windows]
    pairs = pairs[: args.windows]
    values = sum(line.values for b, _, read in pairs for line in window_points(b, read))
    ours, theirs = [], []
    for _ in range(args.rounds):
        ours.append(timed(pairs, lambda b, _, read: window_points(b, read)))
        theirs.append(timed(pairs, lambda b, w, _: [p.to_line_protocol() for p in library_points(b, w)]))
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"{len(pairs)} windows, {values / len(pairs):.0f} values each; medians of {args.rounds} rounds")
    print(f"fleetfit line encoder:      {a * 1e6:6.0f} µs per window")
    print(f"influxdb-client Points:     {b * 1e6:6.0f} µs per window")
    print(f"ratio {a / b:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
