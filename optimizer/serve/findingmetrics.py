"""What the plans found, as Prometheus series on the optimizer's ``/metrics``: what a team alerts on and graphs beside
the dcgm-exporter series it already has (dashboards/fleetfit-prometheus.json).

Labels are bounded: ``site`` (the sites planned), ``kind`` (finding kinds, action kinds, classes: fixed sets),
``hardware`` (the catalog's names), ``source`` (agent, prometheus), and ``owner`` (a namespace, team label or Slurm
account), the one label whose values come from outside: at most ``MAX_OWNERS`` a site, the owners with the most
waste, the rest summed as ``(other owners)``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from agent.metrics import Family
from agent.protocol import Plan
from optimizer.ingest.dcgm import SOURCE
from optimizer.ingest.fleet import Fleet
from optimizer.serve.report import UNATTRIBUTED, owners_of

MAX_OWNERS = 50
# Every series this module exports (dashboards/generate.py refuses a PromQL query naming any other).
NAMES = (
    "fleetfit_waste_usd_per_hour",
    "fleetfit_open_savings_usd_per_month",
    "fleetfit_open_recommendations",
    "fleetfit_workload_gpus",
    "fleetfit_nodes_by_source",
)
OTHER = "(other owners)"


def _bounded(values: dict[tuple[str, str, str], float], cap: int) -> dict[tuple[str, str, str], float]:
    """(owner, kind, hardware) -> value, with owners past the ``cap`` with the most summed as OTHER."""
    by_owner: dict[str, float] = defaultdict(float)
    for (owner, _, _), v in values.items():
        by_owner[owner] += v
    kept = set(sorted(by_owner, key=lambda o: (-by_owner[o], o))[:cap])
    out: dict[tuple[str, str, str], float] = defaultdict(float)
    for (owner, kind, hardware), v in values.items():
        out[(owner if owner in kept else OTHER, kind, hardware)] += v
    return out


def _gauge(name: str, help_text: str, rows: Iterable[tuple[dict[str, str], float]]) -> Family:
    return Family(name, "gauge", help_text, list(rows))


def finding_metrics(plans: dict[str, Plan], fleet: Fleet, cap: int = MAX_OWNERS) -> list[Family]:
    """Waste, open savings, recommendations, GPUs per class and nodes per source, from the current plans."""
    waste: list[tuple[dict[str, str], float]] = []
    savings: list[tuple[dict[str, str], float]] = []
    counts: list[tuple[dict[str, str], float]] = []
    gpus: list[tuple[dict[str, str], float]] = []
    for site, plan in sorted(plans.items()):
        owners = owners_of(fleet, site)
        wasted: dict[tuple[str, str, str], float] = defaultdict(float)
        for f in plan.findings:
            wasted[(owners.get(f.workload, UNATTRIBUTED), f.kind.value, f.hardware)] += f.wasted_usd_per_hour
        for (owner, kind, hardware), v in sorted(_bounded(wasted, cap).items()):
            waste.append(({"site": site, "owner": owner, "kind": kind, "hardware": hardware}, round(v, 4)))
        saved: dict[tuple[str, str, str], float] = defaultdict(float)
        per_kind: dict[str, int] = defaultdict(int)
        for r in plan.recommendations:
            kind = r.kind or "move"
            saved[(owners.get(r.workload, UNATTRIBUTED), kind, r.from_hardware)] += r.monthly_savings_usd
            per_kind[kind] += 1
        for (owner, kind, hardware), v in sorted(_bounded(saved, cap).items()):
            savings.append(({"site": site, "owner": owner, "kind": kind, "hardware": hardware}, round(v, 2)))
        counts.extend(({"site": site, "kind": kind}, float(n)) for kind, n in sorted(per_kind.items()))
        held: dict[tuple[str, str], float] = defaultdict(float)
        for w in plan.workloads:
            held[(w.workload_class.value, w.hardware)] += w.gpus
        gpus.extend(({"site": site, "class": c, "hardware": hw}, v) for (c, hw), v in sorted(held.items()))
    sources: dict[tuple[str, str], int] = defaultdict(int)
    for (site, _), record in list(fleet.nodes.items()):
        if record.birth is not None:
            sources[(site, "prometheus" if record.birth.agent_version == SOURCE else "agent")] += 1
    return [
        _gauge(
            "fleetfit_waste_usd_per_hour",
            "US$ an hour the last plan's findings waste, per owner, finding kind and hardware.",
            waste,
        ),
        _gauge(
            "fleetfit_open_savings_usd_per_month",
            "US$ a month the last plan's actions would save, per owner, action kind and current hardware.",
            savings,
        ),
        _gauge("fleetfit_open_recommendations", "Actions in the last plan, per action kind.", counts),
        _gauge(
            "fleetfit_workload_gpus",
            "GPUs held by the last plan's workloads, per class (unknown: unclassified) and hardware.",
            gpus,
        ),
        _gauge(
            "fleetfit_nodes_by_source",
            "Nodes with an inventory, per source: an agent, or dcgm-exporter's series read from Prometheus.",
            [({"site": s, "source": src}, float(n)) for (s, src), n in sorted(sources.items())],
        ),
    ]
