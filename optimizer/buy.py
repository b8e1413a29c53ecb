"""What to buy: the plan's blocked savings as a purchase question, and what-if additions to a snapshot.

``fleetfit plan FLEET.json --add "l40s x8 = 4"`` plans as if four 8-GPU L40S nodes had been added.
``fleetfit plan FLEET.json --buy`` prices, for each hardware type the plan found short ("no free L40S
capacity", "no H200 in site"), the nodes that would take the blocked workloads: it plans again with them added
(the same planner, the new nodes as empty candidates), keeps the smallest number that captures nine tenths of
what the full purchase would, and reports what it costs a month at the catalog's price and how many months of
the savings it unlocks pay for it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass

from agent.protocol import Plan
from optimizer.catalog import Catalog, GpuType
from optimizer.recommend import PlanSettings, plan_snapshot
from optimizer.render import render_table
from optimizer.snapshot import Snapshot, SnapshotNode

AMORTISATION_MONTHS = 36  # the catalog's prices amortise purchase over three years (optimizer/data/catalog.toml)
CAPTURE = 0.9  # the smallest purchase that captures this share of the full purchase's savings
NEW_PREFIX = "new-"
_ADDITION = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*[x×]\s*(\d+)\s*=\s*(\d+)\s*$")


class BuyError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Addition:
    hardware: GpuType
    gpus: int  # per node
    nodes: int


@dataclass(frozen=True, slots=True)
class Purchase:
    hardware: str
    gpus_per_node: int
    nodes: int
    monthly_cost_usd: float  # the new nodes at the catalog's amortised price
    monthly_savings_usd: float  # what the plan saves beyond the plan without them, before paying for them
    payback_months: float | None  # months of those savings that pay for the nodes; None: they never do


def parse_addition(text: str, catalog: Catalog) -> Addition:
    """``"l40s x8 = 4"``: four nodes of eight L40S each."""
    match = _ADDITION.match(text)
    if match is None:
        raise BuyError(f'--add {text!r}: expected TYPE xGPUS = NODES, e.g. "l40s x8 = 4"')
    key, gpus, nodes = match.group(1).lower(), int(match.group(2)), int(match.group(3))
    try:
        hardware = catalog.by_key(key)
    except KeyError:
        known = ", ".join(g.key for g in catalog.gpu)
        raise BuyError(f"--add {text!r}: no GPU {key!r} in the catalog ({known})") from None
    if not 1 <= gpus <= 64 or not 1 <= nodes <= 10_000:
        raise BuyError(f"--add {text!r}: 1-64 GPUs a node and 1-10000 nodes")
    return Addition(hardware, gpus, nodes)


def with_additions(snapshot: Snapshot, additions: list[Addition]) -> Snapshot:
    """The snapshot with the added nodes, empty, named ``new-<type>-<n>``."""
    taken = {n.name for n in snapshot.nodes}
    nodes = list(snapshot.nodes)
    for a in additions:
        for _ in range(a.nodes):
            i = 1
            while f"{NEW_PREFIX}{a.hardware.key}-{i:03d}" in taken:
                i += 1
            name = f"{NEW_PREFIX}{a.hardware.key}-{i:03d}"
            taken.add(name)
            nodes.append(SnapshotNode(name=name, hardware=a.hardware.key, gpus=a.gpus))
    return snapshot.model_copy(update={"nodes": nodes})


def _short(plan: Plan, catalog: Catalog) -> dict[str, float]:
    """Per hardware type the plan found short: the GPUs its blocked workloads hold now."""
    by_name = {g.name: g for g in catalog.gpu}
    gpus = {w.id: w.gpus for w in plan.workloads}
    short: dict[str, float] = {}
    for b in plan.blocked:
        found = re.match(r"^no (?:free )?(.+?) (?:capacity )?in site ", b.reason)
        if found and found.group(1) in by_name:
            key = by_name[found.group(1)].key
            short[key] = short.get(key, 0.0) + gpus.get(b.workload, 0)
    return short


def suggest(
    snapshot: Snapshot, catalog: Catalog, settings: PlanSettings, plan: Plan, gpus_per_node: int = 8
) -> list[Purchase]:
    """For each hardware type the plan found short, the smallest purchase that captures most of what buying
    enough for every blocked workload would save; best net saving first."""
    out = []
    for key, gpus in sorted(_short(plan, catalog).items()):
        hardware = catalog.by_key(key)
        gpu_month = hardware.price_per_gpu_hour * catalog.defaults.hours_per_month

        def gross(nodes: int, hardware: GpuType = hardware, gpu_month: float = gpu_month) -> float:
            """What the plan with ``nodes`` more saves a month before paying for them: its extra savings
            already pay for the new GPUs it uses at the catalog's price, so that is added back."""
            bigger = plan_snapshot(
                with_additions(snapshot, [Addition(hardware, gpus_per_node, nodes)]), catalog, settings
            )
            used = sum(
                r.gpus_after if r.gpus_after is not None else r.gpus
                for r in bigger.recommendations
                if r.kind == "move" and r.to_node.startswith(f"{NEW_PREFIX}{hardware.key}-")
            )
            return bigger.monthly_savings_usd - plan.monthly_savings_usd + used * gpu_month

        full = max(1, math.ceil(gpus / gpus_per_node))
        full_gain = gross(full)
        best_nodes, best_gain = full, full_gain
        nodes = full // 2
        while nodes >= 1:
            g = gross(nodes)
            if g < CAPTURE * full_gain:
                break
            best_nodes, best_gain = nodes, g
            nodes //= 2
        cost = best_nodes * gpus_per_node * gpu_month
        payback = cost * AMORTISATION_MONTHS / best_gain if best_gain > 0 else None
        out.append(Purchase(hardware.name, gpus_per_node, best_nodes, round(cost, 2), round(best_gain, 2), payback))
    return sorted(out, key=lambda p: -(p.monthly_savings_usd - p.monthly_cost_usd))


def render_purchases(purchases: list[Purchase]) -> str:
    if not purchases:
        return "what to buy: nothing; no move is blocked for want of capacity"
    lines = ["what to buy (each on its own, against this plan):"]
    for p in purchases:
        payback = f"pays back in {p.payback_months:.1f} months" if p.payback_months is not None else "never pays back"
        lines.append(
            f"  {p.nodes} node(s) of {p.gpus_per_node} × {p.hardware}: unblock ${p.monthly_savings_usd:,.0f}/month, "
            f"cost ${p.monthly_cost_usd:,.0f}/month amortised (net ${p.monthly_savings_usd - p.monthly_cost_usd:,.0f}"
            f"/month); {payback}"
        )
    return "\n".join(lines)


def plan_and_buy(
    snapshot: Snapshot, catalog: Catalog, settings: PlanSettings, additions: list[str], buy: bool, fmt: str
) -> str:
    """``fleetfit plan --add ... [--buy]``: the plan with the added nodes, and what to buy, as text or JSON."""
    bigger = with_additions(snapshot, [parse_addition(a, catalog) for a in additions])
    plan = plan_snapshot(bigger, catalog, settings)
    purchases = suggest(bigger, catalog, settings, plan) if buy else []
    if fmt == "json":
        body = {"plan": plan.model_dump(mode="json", by_alias=True), "purchases": [asdict(p) for p in purchases]}
        return json.dumps(body, indent=2) if buy else json.dumps(body["plan"], indent=2)
    text = render_table(plan)
    return f"{text}\n\n{render_purchases(purchases)}" if buy else text
