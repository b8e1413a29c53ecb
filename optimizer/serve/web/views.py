"""What the console shows, computed from the optimizer's state: the fleet by hardware and class, the day's
trend from the history digests, the actions recommendations stand for and what would unblock a move."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from agent.protocol import NodeStatus, Plan, WorkloadClass, WorkloadView
from optimizer.decide.catalog import Catalog, GpuType
from optimizer.decide.snapshot import hardware_of
from optimizer.ingest.dcgm import SOURCE as PROMETHEUS
from optimizer.ingest.fleet import Fleet
from optimizer.ingest.history import DIGEST_SECONDS, DIGESTS_KEPT
from optimizer.serve.report import nodes_online


@dataclass(slots=True)
class HardwareRow:
    name: str
    nodes: int = 0
    gpus: int = 0
    in_use: int = 0
    price: float = 0.0
    offline: int = 0  # of ``nodes``


@dataclass(slots=True)
class ClassRow:
    name: str
    workloads: int = 0
    gpus: int = 0
    util_weighted: float = 0.0  # Σ mean utilisation × GPUs
    held_usd: float = 0.0  # per hour, at the catalog's price of its hardware

    @property
    def mean_util(self) -> float:
        return self.util_weighted / self.gpus if self.gpus else 0.0


@dataclass(slots=True)
class OldAgents:
    """Unclassified workloads whose nodes' agents send no process facts (birth schema 1): upgrading the agent there
    reads their clients and program, the facts that most often decide them."""

    workloads: int = 0
    gpus: int = 0
    held_usd: float = 0.0  # per hour, at the catalog's price of its hardware
    nodes: list[tuple[str, str]] = field(default_factory=list)  # (site, node), most unclassified GPUs first


@dataclass(slots=True)
class Overview:
    nodes: int = 0
    offline: int = 0  # nodes gone offline (their last will, or a clean stop): what they held is not wasted now
    from_prometheus: int = 0  # nodes read from dcgm-exporter's series in Prometheus, not from an agent
    gpus: int = 0
    workloads: int = 0
    hardware: list[HardwareRow] = field(default_factory=list)
    classes: list[ClassRow] = field(default_factory=list)
    waste_by_kind: dict[str, float] = field(default_factory=dict)
    trend: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # class -> [(time, mean util)]
    hardware_sites: dict[str, set[str]] = field(default_factory=dict)  # hardware name -> sites with a node of it
    online: dict[tuple[str, str], bool] = field(default_factory=dict)  # (site, node) -> online
    old_agents: OldAgents = field(default_factory=OldAgents)


def on_line(site: str, nodes: list[str], online: dict[tuple[str, str], bool]) -> bool:
    """Whether any of a workload's or finding's ``nodes`` is online (unknown nodes count as online)."""
    return not nodes or any(online.get((site, n), True) for n in nodes)


def overview(fleet: Fleet, plans: list[Plan], catalog: Catalog, trend: Trend) -> Overview:
    out = Overview()
    by_hw: dict[str, HardwareRow] = {}
    models: dict[str, GpuType | None] = {}
    agent_schema: dict[tuple[str, str], int] = {}  # (site, node) -> its agent's schema; Prometheus nodes left out
    for record in list(fleet.nodes.values()):
        birth = record.birth
        if birth is not None and birth.agent_version != PROMETHEUS:
            agent_schema[(record.site, record.node)] = birth.schema_
        physical = [g for g in birth.gpus if g.parent is None] if birth else []
        if not physical:
            continue
        model = physical[0].model
        if model not in models:  # a fleet has a handful of models and thousands of nodes
            models[model] = hardware_of(catalog, model)
        gpu = models[model]
        name = gpu.name if gpu else model
        row = by_hw.setdefault(name, HardwareRow(name, price=gpu.price_per_gpu_hour if gpu else 0.0))
        row.nodes += 1
        row.gpus += len(physical)
        out.nodes += 1
        out.from_prometheus += birth is not None and birth.agent_version == PROMETHEUS
        out.gpus += len(physical)
        out.hardware_sites.setdefault(name, set()).add(record.site)
        if record.status is not NodeStatus.ONLINE:
            row.offline += 1
            out.offline += 1
    out.online = nodes_online(fleet)
    by_cls: dict[str, ClassRow] = {}
    views: dict[str, WorkloadView] = {}
    old = out.old_agents
    old_gpus: dict[tuple[str, str], float] = defaultdict(float)  # (site, node) -> unclassified GPUs there
    for plan in plans:
        for w in plan.workloads:
            views[w.id] = w
            row_c = by_cls.setdefault(w.workload_class.value, ClassRow(w.workload_class.value))
            row_c.workloads += 1
            row_c.gpus += w.gpus
            row_c.util_weighted += w.mean_util * w.gpus
            price = by_hw[w.hardware].price if w.hardware in by_hw else 0.0
            if w.hardware in by_hw:
                by_hw[w.hardware].in_use += w.gpus
                row_c.held_usd += w.gpus * price
            if w.workload_class is WorkloadClass.UNKNOWN:
                schemas = {n: agent_schema.get((plan.site, n)) for n in w.nodes}
                # the classifier takes a workload's process facts from any of its nodes: one schema-2 agent among
                # them already sends them, so upgrading the others would not decide it
                if 1 in schemas.values() and 2 not in schemas.values():
                    old.workloads += 1
                    old.gpus += w.gpus
                    old.held_usd += w.gpus * price
                    for n, schema in schemas.items():
                        if schema == 1:
                            old_gpus[(plan.site, n)] += w.gpus / len(w.nodes)
        for f in plan.findings:
            if on_line(plan.site, f.nodes, out.online):  # an offline node wastes nothing now
                out.waste_by_kind[f.kind.value] = out.waste_by_kind.get(f.kind.value, 0.0) + f.wasted_usd_per_hour
    out.workloads = len(views)
    old.nodes = sorted(old_gpus, key=lambda key: (-old_gpus[key], key))
    out.hardware = sorted(by_hw.values(), key=lambda r: (-r.gpus, r.name))
    out.classes = sorted(by_cls.values(), key=lambda r: (-r.gpus, r.name))
    out.trend = trend.update(fleet, views)
    return out


class Trend:
    """GPU-weighted mean utilisation per class per 10-minute digest over the last day, kept up to date.

    A day of digests of 5,000 workloads is 720,000 items, most of a second to walk; each update adds only
    the digests closed since the previous one (a digest counts under the class its workload had then)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str, str], float] = {}  # (site, node, workload) -> latest digest counted
        self._totals: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
        self._weights: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))

    def update(self, fleet: Fleet, views: dict[str, WorkloadView]) -> dict[str, list[tuple[float, float]]]:
        seen: dict[tuple[str, str, str], float] = {}
        newest = 0.0
        for record in list(fleet.nodes.values()):
            for workload, digests in list(record.history.digests.items()):
                view = views.get(workload)
                if view is None or not digests:
                    continue
                key = (record.site, record.node, workload)
                counted = self._seen.get(key, float("-inf"))
                last = digests[-1].end
                seen[key] = last
                newest = max(newest, last)
                if last <= counted:
                    continue
                kept = list(digests)
                per_node = view.gpus / max(len(view.nodes), 1)
                total, weight = self._totals[view.workload_class.value], self._weights[view.workload_class.value]
                for d in reversed(kept):
                    if d.end <= counted:
                        break
                    bucket = d.end // DIGEST_SECONDS
                    total[bucket] += d.mean_util * per_node
                    weight[bucket] += per_node
        self._seen = seen  # workloads gone drop out
        oldest = newest // DIGEST_SECONDS - DIGESTS_KEPT
        out = {}
        for cls, totals in sorted(self._totals.items()):
            weights = self._weights[cls]
            for bucket in [b for b in totals if b < oldest]:
                del totals[bucket], weights[bucket]
            points = sorted((b * DIGEST_SECONDS, t / weights[b]) for b, t in totals.items() if weights[b])
            if points:
                out[cls] = points
        return out


_UNBLOCK = (
    (re.compile(r"^pinned"), "remove it from [plan] pinned, or move it by hand"),
    (re.compile(r"multi-node"), "move it by hand, all of its nodes together"),
    (re.compile(r"class uncertain"), "more telemetry (a day shows its cycle), or lower [plan] min_confidence"),
    (re.compile(r"^no (.+) in site (.+)$"), r"add \1 capacity to site \2"),
    (re.compile(r"^no free (.+) capacity"), r"free or add \1 capacity (the moves above may free some)"),
    (re.compile(r"moves went to bigger savings"), "raise [plan] max_moves, or carry out the planned moves first"),
    (re.compile(r"no better fit"), "nothing cheaper fits its memory and load"),
    (re.compile(r"^load would reach"), "a faster GPU in the site, or its load spread over more GPUs"),
    (re.compile(r"^needs \d+ GiB"), "a GPU with more memory in the site"),
)


# a catalog name may end in one parenthesised part of its own ("MI300A 128GB (APU)")
_ELSEWHERE = re.compile(r"(?P<name>[^,;()]+?(?: \([^()]*\))?) \(not in this site\)")


def where_else(detail: str, site: str, hardware_sites: dict[str, set[str]]) -> str:
    """A finding's detail with "X (not in this site)" saying where X is: the sites that have it, or that no site of
    the fleet does (buying it is a purchase, not a move)."""

    def say(m: re.Match[str]) -> str:
        name = m.group("name")
        others = sorted(hardware_sites.get(name.strip(), set()) - {site})
        if others:
            return f"{name} (in site {', '.join(others[:3])}{', …' if len(others) > 3 else ''}, not this one)"
        return f"{name} (no site of this fleet has it: a purchase, not a move)"

    return _ELSEWHERE.sub(say, detail)


def hardware_sites(fleet: Fleet, catalog: Catalog) -> dict[str, set[str]]:
    """The sites that have a node of each hardware (by catalog name, or the model reported)."""
    out: dict[str, set[str]] = {}
    models: dict[str, GpuType | None] = {}
    for record in list(fleet.nodes.values()):
        physical = [g for g in record.birth.gpus if g.parent is None] if record.birth else []
        if physical:
            model = physical[0].model
            if model not in models:
                models[model] = hardware_of(catalog, model)
            gpu = models[model]
            out.setdefault(gpu.name if gpu else model, set()).add(record.site)
    return out


def unblock(reason: str) -> str:
    """What would let the planner move a blocked workload."""
    for pattern, advice in _UNBLOCK:
        if m := pattern.search(reason):
            return m.expand(advice)
    return "review by hand"
