"""``fleetfit plan --add/--buy``: what-if additions to a snapshot, and the plan's purchase section in words.

``fleetfit plan FLEET.json --add "l40s x8 = 4"`` plans as if four 8-GPU L40S nodes had been added, and names them
(``new-l40s-001``…) above the table, or in ``added_nodes`` beside the plan in JSON.
``fleetfit plan FLEET.json --buy`` gives the plan's purchase question its own time limit and always prints the
answer, "nothing" included: which nodes to buy for the moves blocked for want of capacity, what they cost and
unlock a month, and their payback (optimizer/plan/purchases.py, where the rule is).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from optimizer.decide.catalog import Catalog, GpuType
from optimizer.decide.snapshot import Snapshot, SnapshotNode
from optimizer.plan.purchases import NEW_PREFIX
from optimizer.plan.recommend import PlanSettings, plan_snapshot
from optimizer.plan.render import render_table

MAX_ADDED = 10_000  # nodes, in one --add and in all of them: more is a typo, and a plan that takes minutes
_ADDITION = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*[x×]\s*(\d+)\s*=\s*(\d+)\s*$")


class BuyError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Addition:
    hardware: GpuType
    gpus: int  # per node
    nodes: int


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
    if not 1 <= gpus <= 64 or not 1 <= nodes <= MAX_ADDED:
        raise BuyError(f"--add {text!r}: 1-64 GPUs a node and 1-{MAX_ADDED} nodes")
    return Addition(hardware, gpus, nodes)


def with_additions(snapshot: Snapshot, additions: list[Addition]) -> Snapshot:
    """The snapshot with the added nodes, empty, named ``new-<type>-<n>``."""
    taken = {n.name for n in snapshot.nodes}
    nodes = list(snapshot.nodes)
    last: dict[str, int] = {}  # per type, the number last given: each search resumes there, not at 1
    for a in additions:
        for _ in range(a.nodes):
            i = last.get(a.hardware.key, 0) + 1
            while f"{NEW_PREFIX}{a.hardware.key}-{i:03d}" in taken:
                i += 1
            last[a.hardware.key] = i
            name = f"{NEW_PREFIX}{a.hardware.key}-{i:03d}"
            taken.add(name)
            nodes.append(SnapshotNode(name=name, hardware=a.hardware.key, gpus=a.gpus))
    return snapshot.model_copy(update={"nodes": nodes})


def plan_and_buy(
    snapshot: Snapshot, catalog: Catalog, settings: PlanSettings, additions: list[str], buy: bool, fmt: str
) -> str:
    """``fleetfit plan --add ... [--buy]``: the plan with the added nodes, and what to buy, as text or JSON."""
    parsed = [parse_addition(a, catalog) for a in additions]
    if sum(a.nodes for a in parsed) > MAX_ADDED:
        raise BuyError(f"--add: at most {MAX_ADDED} nodes in all")
    bigger = with_additions(snapshot, parsed)
    added = bigger.nodes[len(snapshot.nodes) :]
    if buy:
        settings = settings.model_copy(update={"buy": True, "buy_time_limit": settings.time_limit})
    plan = plan_snapshot(bigger, catalog, settings)
    if fmt == "json":
        body = plan.model_dump(mode="json", by_alias=True)
        out: dict[str, object] = {"plan": body}
        if added:  # beside the plan, which stays a protocol Plan
            out["added_nodes"] = [{"name": n.name, "hardware": n.hardware, "gpus": n.gpus} for n in added]
        if buy:  # --buy has always printed {"plan": ..., "purchases": [...]}; the plan carries the same list
            out["purchases"] = body["purchases"] or []
        return json.dumps(out if len(out) > 1 else body, indent=2)
    lines = [added_text(parsed, [n.name for n in added])] if added else []
    return "\n".join([*lines, render_table(plan, every_answer=buy)])


SHOWN = 6  # added nodes named one by one; more are shown as the first and the last


def added_text(additions: list[Addition], names: list[str]) -> str:
    """A line per ``--add``, ``added for this plan: 4 node(s) of 8 × L40S 48GB (new-l40s-001, …)``: the nodes
    it put in the snapshot, by the names the plan's actions use."""
    parts = []
    start = 0
    for a in additions:
        mine = names[start : start + a.nodes]
        start += a.nodes
        shown = ", ".join(mine) if len(mine) <= SHOWN else f"{mine[0]}, {mine[1]}, …, {mine[-1]}"
        parts.append(f"added for this plan: {a.nodes} node(s) of {a.gpus} × {a.hardware.name} ({shown})")
    return "\n".join(parts)
