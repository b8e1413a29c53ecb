"""Builds the Grafana dashboards in this directory from the names the optimizer writes (optimizer/serve/series.py)
and the series it and dcgm-exporter export to Prometheus.

    .venv/bin/python dashboards/generate.py      # rewrites dashboards/*.json and dashboards/prometheus/*.json

Every Flux query is made by :func:`flux`, which refuses a measurement, field or tag the optimizer does not
write, and every PromQL query by :func:`promql`, which refuses a metric name neither the optimizer's ``/metrics``
nor dcgm-exporter exports, so a renamed series breaks this script (and its test) instead of a dashboard in
production. The PromQL boards read the optimizer's findings and dcgm-exporter's series from a Prometheus-compatible
datasource (Prometheus, VictoriaMetrics, Thanos, Mimir: dashboards/provisioning/datasource-prometheus.yaml).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from optimizer.ingest import dcgm
from optimizer.serve import findingmetrics, series
from optimizer.serve.series import Measurement

DATASOURCE = {"type": "influxdb", "uid": "fleetfit-influxdb"}
PROMETHEUS = {"type": "prometheus", "uid": "fleetfit-prometheus"}
# what the PromQL boards may name: the optimizer's findings (optimizer/serve/findingmetrics.py) and dcgm-exporter's
PROMETHEUS_NAMES = frozenset(findingmetrics.NAMES) | frozenset(dcgm.METRICS)
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


def promql(query: str) -> str:
    """A PromQL query, checked to name only series the optimizer or dcgm-exporter exports."""
    import re

    names = set(re.findall(r"\b((?:fleetfit|DCGM)_[A-Za-z0-9_]+)\b", query))
    unknown = names - PROMETHEUS_NAMES
    if unknown or not names:
        raise ValueError(f"{query}: {sorted(unknown) or 'no series'} not exported")
    return query


def prom_variable(name: str, metric: str, label: str) -> Json:
    query = f"label_values({promql(metric)}, {label})"
    return {"name": name, "label": name, "type": "query", "datasource": PROMETHEUS,
            "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"}, "definition": query,
            "refresh": 2, "includeAll": True, "multi": True, "allValue": ".*", "current": {}, "sort": 1}  # fmt: skip


class Board:
    def __init__(
        self, uid: str, title: str, description: str, variables: list[Json], source: Json = DATASOURCE
    ) -> None:
        self.uid, self.title, self.description, self.variables = uid, title, description, variables
        self.source = source
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
                "datasource": self.source,
                "gridPos": {"x": self._x, "y": self._y, "w": w, "h": h},
                "targets": [self._target(i, q) for i, q in enumerate(queries)],
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": options or {},
            }
        )
        self._x += w
        self._row_h = max(self._row_h, h)

    def _target(self, i: int, query: str) -> Json:
        ref = chr(ord("A") + i)
        if self.source is PROMETHEUS:
            return {"refId": ref, "datasource": self.source, "expr": query, "legendFormat": "__auto", "range": True}
        return {"refId": ref, "datasource": self.source, "query": query}

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


def findings() -> Board:
    """The optimizer's findings and dcgm-exporter's GPUs, from a Prometheus-compatible datasource."""
    site = 'site=~"$site"'
    b = Board("fleetfit-prometheus", "fleetfit · findings (Prometheus)", "What fleetfit found, as the optimizer's "
              "/metrics exports it, beside dcgm-exporter's GPU series.",
              [prom_variable("site", "fleetfit_workload_gpus", "site")], PROMETHEUS)  # fmt: skip
    q = promql
    b.panel("stat", "Wasted now ($/hour)", [q(f"sum(fleetfit_waste_usd_per_hour{{{site}}})")], "currencyUSD", 6, 4)
    b.panel("stat", "Open savings ($/month)", [q(f"sum(fleetfit_open_savings_usd_per_month{{{site}}})")],
            "currencyUSD", 6, 4)  # fmt: skip
    b.panel("stat", "Open recommendations", [q(f"sum(fleetfit_open_recommendations{{{site}}})")], "short", 6, 4)
    b.panel("stat", "GPUs held by unclassified workloads", [q(f'sum(fleetfit_workload_gpus{{{site}, class="unknown"}})'
            " or vector(0)")], "short", 6, 4)  # fmt: skip
    top = q(f"topk(10, sum by (owner) (fleetfit_waste_usd_per_hour{{{site}}}))")
    b.panel("bargauge", "Waste by owner ($/hour)", [top], "currencyUSD", 12, 8)
    b.panel("timeseries", "Waste by finding ($/hour)", [q(f"sum by (kind) (fleetfit_waste_usd_per_hour{{{site}}})")],
            "currencyUSD")  # fmt: skip
    b.panel("timeseries", "Open savings by owner ($/month)",
            [q(f"sum by (owner) (fleetfit_open_savings_usd_per_month{{{site}}})")], "currencyUSD")  # fmt: skip
    b.panel("table", "GPUs by class × hardware", [q(f"sum by (class, hardware) (fleetfit_workload_gpus{{{site}}})")],
            "short")  # fmt: skip
    b.panel("timeseries", "Nodes by source", [q(f"sum by (source) (fleetfit_nodes_by_source{{{site}}})")], "short")
    b.panel("timeseries", "GPU utilisation by model (dcgm-exporter)",
            [q("avg by (modelName) (DCGM_FI_DEV_GPU_UTIL)")], "percent")  # fmt: skip
    b.panel("timeseries", "GPU memory used by model (dcgm-exporter)", [q("sum by (modelName) (DCGM_FI_DEV_FB_USED)")],
            "mbytes")  # fmt: skip
    return b


BOARDS = {"fleet-overview": fleet_overview, "node": node_drilldown, "placement": placement,
          "recommendations": recommendations}  # fmt: skip
PROMETHEUS_BOARDS = {"findings": findings}


def render() -> dict[str, str]:
    return {f"{name}.json": json.dumps(build().json(), indent=2) + "\n" for name, build in BOARDS.items()}


def render_prometheus() -> dict[str, str]:
    """The PromQL boards, written to dashboards/prometheus/."""
    return {f"{name}.json": json.dumps(build().json(), indent=2) + "\n" for name, build in PROMETHEUS_BOARDS.items()}


def main(argv: list[str]) -> int:
    """Write every board; any argument (``--help`` included) prints the usage instead and writes nothing."""
    usage = "usage: dashboards/generate.py  (takes no arguments; rewrites dashboards/*.json)"
    if argv and argv[0] in ("-h", "--help"):
        print(f"{usage}\n\n{(__doc__ or '').strip()}")
        return 0
    if argv:
        print(f"{usage}\ngenerate.py: unknown argument {argv[0]!r}; nothing written", file=sys.stderr)
        return 2
    for filename, text in render().items():
        (HERE / filename).write_text(text)
        print(f"wrote dashboards/{filename}")
    (HERE / "prometheus").mkdir(exist_ok=True)
    for filename, text in render_prometheus().items():
        (HERE / "prometheus" / filename).write_text(text)
        print(f"wrote dashboards/prometheus/{filename}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
