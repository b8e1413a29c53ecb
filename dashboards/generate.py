"""Builds the Grafana dashboards in this directory from the names the optimizer writes (optimizer/serve/series.py).

    .venv/bin/python dashboards/generate.py      # rewrites dashboards/*.json

Every Flux query is made by :func:`flux`, which refuses a measurement, field or tag the optimizer does not
write, so a renamed series breaks this script (and its test) instead of a dashboard in production.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from optimizer.serve import series
from optimizer.serve.series import Measurement

DATASOURCE = {"type": "influxdb", "uid": "fleetfit-influxdb"}
HERE = Path(__file__).resolve().parent
Json = dict[str, Any]


def flux(
    m: Measurement,
    fields: list[str],
    group: list[str] | None = None,
    filters: dict[str, str] | None = None,
    agg: str | None = "mean",
    tail: str = "",
) -> str:
    """A Flux query over ``m``'s ``fields``; ``filters`` maps tags to dashboard variables (regex match)."""
    bad = [f for f in fields if f not in m.fields] + [t for t in (group or []) + list(filters or {}) if t not in m.tags]
    if bad:
        raise ValueError(f"{m.name} has no {bad}")
    field_test = " or ".join(f'r._field == "{f}"' for f in fields)
    lines = [
        "from(bucket: v.defaultBucket)",
        "  |> range(start: v.timeRangeStart, stop: v.timeRangeStop)",
        f'  |> filter(fn: (r) => r._measurement == "{m.name}" and ({field_test}))',
    ]
    for tag, var in (filters or {}).items():
        lines.append(f"  |> filter(fn: (r) => r.{tag} =~ /^${{{var}:regex}}$/)")
    if group is not None:
        lines.append(f"  |> group(columns: {json.dumps([*group, '_field'])})")
    if agg:
        lines.append(f"  |> aggregateWindow(every: v.windowPeriod, fn: {agg}, createEmpty: false)")
    return "\n".join(lines) + tail


def tag_values(m: Measurement, tag: str) -> str:
    if tag not in m.tags:
        raise ValueError(f"{m.name} has no tag {tag}")
    return (
        f'import "influxdata/influxdb/schema"\n'
        f'schema.measurementTagValues(bucket: v.defaultBucket, measurement: "{m.name}", tag: "{tag}")'
    )


def variable(name: str, m: Measurement, tag: str, multi: bool = True) -> Json:
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": DATASOURCE,
        "query": tag_values(m, tag),
        "definition": tag_values(m, tag),
        "refresh": 2,
        "includeAll": multi,
        "multi": multi,
        "allValue": ".*",
        "current": {},
        "sort": 1,
    }


class Board:
    def __init__(self, uid: str, title: str, description: str, variables: list[Json]) -> None:
        self.uid, self.title, self.description, self.variables = uid, title, description, variables
        self.panels: list[Json] = []
        self._x = self._y = self._row_h = 0

    def panel(self, kind: str, title: str, queries: list[str], unit: str = "short", w: int = 12, h: int = 8,
              description: str = "", options: Json | None = None) -> None:  # fmt: skip
        if self._x + w > 24:
            self._x, self._y, self._row_h = 0, self._y + self._row_h, 0
        self.panels.append(
            {
                "id": len(self.panels) + 1,
                "type": kind,
                "title": title,
                "description": description,
                "datasource": DATASOURCE,
                "gridPos": {"x": self._x, "y": self._y, "w": w, "h": h},
                "targets": [
                    {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "query": q} for i, q in enumerate(queries)
                ],
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": options or {},
            }
        )
        self._x += w
        self._row_h = max(self._row_h, h)

    def json(self) -> Json:
        return {
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": ["fleetfit"],
            "editable": True,
            "schemaVersion": 39,
            "version": 1,
            "refresh": "1m",
            "time": {"from": "now-6h", "to": "now"},
            "timezone": "",
            "templating": {"list": self.variables},
            "annotations": {"list": []},
            "links": [{"type": "dashboards", "tags": ["fleetfit"], "asDropdown": True, "title": "fleetfit"}],
            "panels": self.panels,
        }


def fleet_overview() -> Board:
    g, w, p = series.GPU, series.WORKLOAD, series.PLAN
    site = {"site": "site"}
    b = Board("fleetfit-overview", "fleetfit · fleet overview", "Utilisation by GPU model and class, and the money "
              "misplaced workloads waste.", [variable("site", g, "site")])  # fmt: skip
    last = "\n  |> last()"
    b.panel(
        "stat", "Wasted now ($/hour)", [flux(p, ["wasted_usd_per_hour"], [], site, None, last)], "currencyUSD", 6, 4
    )
    b.panel("stat", "Recommended savings ($/month)", [flux(p, ["monthly_savings_usd"], [], site, None, last)],
            "currencyUSD", 6, 4)  # fmt: skip
    b.panel("stat", "Recommended moves", [flux(p, ["recommendations"], [], site, None, last)], "short", 6, 4)
    b.panel("stat", "Workloads classified", [flux(p, ["workloads"], [], site, None, last)], "short", 6, 4)
    b.panel("timeseries", "GPU utilisation by model", [flux(g, ["util"], ["model"], site)], "percent")
    b.panel("timeseries", "Mean GPU utilisation by workload class", [flux(w, ["mean_util"], ["class"], site)],
            "percent")  # fmt: skip
    b.panel("timeseries", "Wasted $/hour by site", [flux(p, ["wasted_usd_per_hour"], ["site"], site)], "currencyUSD")
    b.panel("timeseries", "GPU memory used by model", [flux(g, ["mem_used_mib"], ["model"], site, "sum")], "mbytes")
    return b


def node_drilldown() -> Board:
    g, n, d, h = series.GPU, series.NIC, series.DISK, series.HOST
    sel = {"site": "site", "node": "node"}
    b = Board("fleetfit-node", "fleetfit · node", "One node's GPUs, NICs and disks.",
              [variable("site", g, "site"), variable("node", g, "node")])  # fmt: skip
    b.panel("timeseries", "GPU utilisation", [flux(g, ["util"], ["node", "gpu"], sel)], "percent")
    b.panel("timeseries", "GPU memory used", [flux(g, ["mem_used_mib"], ["node", "gpu"], sel)], "mbytes")
    b.panel("timeseries", "SM / tensor / DRAM activity", [flux(g, ["sm_active", "tensor_active", "dram_active"],
            ["node", "gpu"], sel)], "percentunit")  # fmt: skip
    b.panel("timeseries", "GPU power", [flux(g, ["power_w"], ["node", "gpu"], sel)], "watt")
    b.panel("timeseries", "NVLink", [flux(g, ["nvlink_tx_bps", "nvlink_rx_bps"], ["node", "gpu"], sel)], "Bps")
    b.panel("timeseries", "PCIe", [flux(g, ["pcie_tx_bps", "pcie_rx_bps"], ["node", "gpu"], sel)], "Bps")
    b.panel("timeseries", "NIC traffic by role", [flux(n, ["rx_bps", "tx_bps"], ["node", "nic", "role"], sel)], "Bps")
    b.panel("timeseries", "NIC errors and drops", [flux(n, ["errors", "drops"], ["node", "nic"], sel, "sum")])
    b.panel("timeseries", "Disk throughput", [flux(d, ["read_bps", "write_bps"], ["node", "disk"], sel)], "Bps")
    b.panel("timeseries", "Disk write peaks (checkpoints)", [flux(d, ["write_bps_max"], ["node", "disk"], sel, "max")],
            "Bps")  # fmt: skip
    b.panel("timeseries", "Host CPU and memory", [flux(h, ["cpu_util", "mem_used_pct"], ["node"], sel)], "percent")
    b.panel("timeseries", "XID errors", [flux(g, ["xid_events"], ["node", "gpu"], sel, "sum")])
    return b


def placement() -> Board:
    w, f = series.WORKLOAD, series.FINDING
    site = {"site": "site"}
    b = Board("fleetfit-placement", "fleetfit · workload placement", "Which class runs on which hardware, and the "
              "misplaced workloads.", [variable("site", w, "site")])  # fmt: skip
    matrix = '\n  |> last()\n  |> group(columns: ["class", "hardware"])\n  |> sum()\n  |> group()'
    b.panel("table", "GPUs by class × hardware", [flux(w, ["gpus"], None, site, None, "\n  |> group(columns: "
            "[\"workload\"])" + matrix)], "short", 12, 10)  # fmt: skip
    misplaced = '\n  |> last()\n  |> group()\n  |> sort(columns: ["_value"], desc: true)'
    b.panel("table", "Misplaced workloads ($ wasted per hour)", [flux(f, ["wasted_usd_per_hour"], None, site, None,
            misplaced)], "currencyUSD", 12, 10)  # fmt: skip
    b.panel("timeseries", "Waste by finding", [flux(f, ["wasted_usd_per_hour"], ["kind"], site, "sum")], "currencyUSD")
    b.panel("timeseries", "Classification confidence by class", [flux(w, ["confidence"], ["class"], site)],
            "percentunit")  # fmt: skip
    return b


def recommendations() -> Board:
    r, p = series.RECOMMENDATION, series.PLAN
    site = {"site": "site"}
    b = Board("fleetfit-recommendations", "fleetfit · recommendations", "The latest plan's moves and the solver.",
              [variable("site", p, "site")])  # fmt: skip
    moves = '\n  |> last()\n  |> group()\n  |> sort(columns: ["_value"], desc: true)'
    b.panel("table", "Recommended moves ($/month)", [flux(r, ["monthly_savings_usd"], None, site, None, moves)],
            "currencyUSD", 24, 10)  # fmt: skip
    b.panel("timeseries", "Savings recommended", [flux(p, ["monthly_savings_usd"], ["site"], site)], "currencyUSD")
    b.panel("timeseries", "Moves per plan", [flux(p, ["recommendations"], ["site"], site)])
    b.panel("timeseries", "Solve time", [flux(p, ["solve_seconds"], ["site"], site, "max")], "s")
    b.panel("timeseries", "Optimality gap", [flux(p, ["gap"], ["site"], site, "max")], "percentunit")
    return b


BOARDS = {"fleet-overview": fleet_overview, "node": node_drilldown, "placement": placement,
          "recommendations": recommendations}  # fmt: skip


def render() -> dict[str, str]:
    return {f"{name}.json": json.dumps(build().json(), indent=2) + "\n" for name, build in BOARDS.items()}


if __name__ == "__main__":
    for filename, text in render().items():
        (HERE / filename).write_text(text)
        print(f"wrote dashboards/{filename}")
