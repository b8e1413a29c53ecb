"""What to buy: the purchase that returns the most of the savings a plan leaves blocked for want of capacity.

After the plan is solved, every workload it leaves short of the cheapest worthwhile hardware the site runs
counts towards that type's shortfall (a type the site does not run yet is a platform decision, not capacity:
``fleetfit plan --add`` prices one); the ``MAX_BUYERS`` with most to gain, and no more than the move budget
holds. Each short type is offered in the planner's own CP-SAT model as empty ``GPUS_PER_NODE``-GPU nodes: as
many as its shortfall fills and its workloads' savings could pay for, solved as one pool with a bought count
(optimizer/plan/model.py). The model, started from the plan and restricted to the workloads short of capacity (the
others hold what the plan gives them, and their moves come out of the budget), chooses their placement and the
purchase together, minimising monthly cost with each bought node at its amortised price (the catalog's
``price_per_gpu_hour``: purchase over ``AMORTISATION_MONTHS`` plus running costs) and a dollar more, so that
room the plan frees on the site's own nodes is used before anything is bought.

The rule: the net-optimal purchase. A node is bought only if what it unlocks exceeds what it costs, so a
purchase that never pays is never suggested, and each node bought pays for itself (docs/decisions.md: why not
the fewest nodes that keep nine tenths of its savings). For each
type bought: the nodes, their monthly cost, the savings they unlock (what the plan with them saves a month
beyond the plan without them, before paying for them: moves onto a bought node free the GPUs they leave, and
moves into the room that frees are shared among the types bought, in proportion), and the payback: monthly
cost × ``AMORTISATION_MONTHS`` ÷ monthly savings, the months of savings that pay for the nodes' whole
amortisation period (under 36 whenever the purchase pays).

The phase runs with the time the plan's solve leaves within its limit (``MIN_SECONDS`` at least, or the
question is left unanswered: ``None``); ``fleetfit plan --buy`` gives it a limit of its own.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from agent.protocol import Purchase
from optimizer.decide.catalog import Catalog, GpuType
from optimizer.decide.costs import fit_problem, monthly_cost, units
from optimizer.plan.model import Solution, sized, solve
from optimizer.plan.problem import Movable, Offer, Problem

AMORTISATION_MONTHS = 36  # the catalog's prices amortise purchase over three years (optimizer/decide/data/catalog.toml)
GPUS_PER_NODE = 8
NEW_PREFIX = "new-"
MIN_SECONDS = 0.5  # below this the purchase question is left unanswered rather than answered badly
MAX_BUYERS = 300  # workloads offered new nodes, most to gain first: the model stays small at fleet scale


@dataclass(slots=True)
class _Short:
    units: int = 0  # capacity units the workloads short of this type take there
    gross: float = 0.0  # what they would save a month there beyond the plan, the nodes' price not counted
    buyers: set[str] = field(default_factory=set)  # those workloads


def _wanted(
    catalog: Catalog, problem: Problem, w: Movable, current: GpuType, planned: float, present: list[str]
) -> tuple[GpuType, int, float] | None:
    """The cheapest of the site's hardware ``w`` is worth moving to beyond where the plan puts it, the units it
    takes there and its monthly cost there."""
    cost_now = monthly_cost(catalog, w.demand, current, current)
    worth = max(problem.min_monthly_savings, problem.min_savings_fraction * cost_now)
    best: tuple[GpuType, int, float] | None = None
    for key in present:
        target = catalog.by_key(key)
        if key == current.key or fit_problem(catalog, w.demand, current, target) is not None:
            continue
        demand = sized(catalog, problem, w, current, target) or w.demand
        cost = monthly_cost(catalog, demand, current, target)
        if cost_now - cost >= worth and planned - cost >= worth and (best is None or cost < best[2]):
            best = (target, units(demand, problem.units), cost)
    return best


def offers(
    catalog: Catalog, problem: Problem, solution: Solution, taken: set[str], gpus_per_node: int = GPUS_PER_NODE
) -> list[Offer]:
    """The nodes worth offering: per short type, as many as its shortfall fills and its savings could pay for."""
    hardware = {n.name: n.hardware for n in problem.nodes}
    present = sorted(set(hardware.values()))
    month = catalog.defaults.hours_per_month
    wants = []
    for w in problem.movable:
        current = catalog.by_key(hardware[w.node])
        planned = solution.monthly_cost.get(w.id, (0.0, monthly_cost(catalog, w.demand, current, current)))[1]
        found = _wanted(catalog, problem, w, current, planned, present)
        if found is None or found[1] > gpus_per_node * problem.units:
            continue
        target, size, cost = found
        gross = planned - (cost - size / problem.units * target.price_per_gpu_hour * month) - w.move_cost_usd
        if gross > 0:
            wants.append((gross, w.id, target.key, size))
    # no plan moves more than its budget: the workloads with most to gain are the ones a purchase could serve
    wants.sort(key=lambda x: (-x[0], x[1]))
    short: dict[str, _Short] = {}
    for gross, wid, key, size in wants[: min(problem.max_moves, MAX_BUYERS)]:
        s = short.setdefault(key, _Short())
        s.units += size
        s.gross += gross
        s.buyers.add(wid)
    out = []
    for key, s in sorted(short.items()):
        target = catalog.by_key(key)
        node_cost = gpus_per_node * target.price_per_gpu_hour * month
        count = min(math.ceil(s.units / (gpus_per_node * problem.units)), math.floor(s.gross / node_cost))
        if count < 1:
            continue
        names: list[str] = []
        i = 0
        while len(names) < count:
            i += 1
            name = f"{NEW_PREFIX}{key}-{i:03d}"
            if name not in taken:
                names.append(name)
        out.append(Offer(key, gpus_per_node * problem.units, node_cost, tuple(names), frozenset(s.buyers)))
    return out


def purchases(
    catalog: Catalog,
    problem: Problem,
    solution: Solution,
    seconds: float,
    gpus_per_node: int = GPUS_PER_NODE,
    work: float | None = None,
) -> list[Purchase] | None:
    """What to buy for the plan ``solution`` of ``problem``, solved within ``seconds`` (None: no time to) and
    ``work`` deterministic seconds of CP-SAT (default: the plan's own work limit), so the same plan gets the same
    answer whenever there is time for one."""
    started = time.perf_counter()
    if seconds < MIN_SECONDS:
        return None
    if sum(1 for w in problem.movable if solution.placement.get(w.id, w.node) != w.node) >= problem.max_moves:
        return []  # the plan's moves take the whole budget: no new node could be used
    taken = {n.name for n in problem.nodes}
    offered = offers(catalog, problem, solution, taken, gpus_per_node)
    if not offered:
        return []
    left = seconds - (time.perf_counter() - started)
    if left < MIN_SECONDS:
        return None
    buying = _buying(problem, solution, offered, left, problem.work if work is None else work)
    if buying.max_moves == 0:
        return []  # the plan's other moves take the whole budget
    bought = solve(catalog, buying)
    return _purchases(catalog, problem, solution, bought, offered, gpus_per_node)


def _buying(problem: Problem, solution: Solution, offered: list[Offer], seconds: float, work: float) -> Problem:
    """The plan's model with the offers, restricted to the workloads short of capacity: every other workload
    holds what the plan gives it (at best already, or with nothing to gain from a new node), which keeps the
    model a few hundred choices at fleet scale; the moves it makes come out of the budget."""
    buyers = frozenset().union(*(o.workloads for o in offered))
    fixed = dict(problem.fixed_usage)
    moved = 0
    for w in problem.movable:
        if w.id in buyers:
            continue
        node = solution.placement.get(w.id, w.node)
        fixed[node] = fixed.get(node, 0) + solution.gpus.get(w.id, units(w.demand, problem.units))
        moved += node != w.node
    return replace(
        problem,
        fixed_usage=fixed,
        movable=[w for w in problem.movable if w.id in buyers],
        max_moves=max(problem.max_moves - moved, 0),
        offers=offered,
        start={w.id: solution.placement.get(w.id, w.node) for w in problem.movable if w.id in buyers},
        time_limit_s=seconds,
        work_limit=work,
        post_solve_share=0.0,
        kept={},
    )


def _purchases(
    catalog: Catalog,
    problem: Problem,
    before: Solution,
    after: Solution,
    offered: list[Offer],
    gpus_per_node: int,
) -> list[Purchase]:
    type_of = {name: o for o in offered for name in o.names}
    nodes: dict[str, set[str]] = {}
    direct: dict[str, float] = {}
    workloads: dict[str, list[str]] = {}
    spill = 0.0  # what the plan with the new nodes gains on the nodes it already has
    for w in problem.movable:
        gain = before.monthly_cost.get(w.id, (0.0, 0.0))[1] - after.monthly_cost.get(w.id, (0.0, 0.0))[1]
        if w.id not in before.monthly_cost or w.id not in after.monthly_cost:
            continue
        node = after.placement.get(w.id, w.node)
        offer = type_of.get(node)
        if offer is None:
            spill += gain
            continue
        nodes.setdefault(offer.hardware, set()).add(node)
        direct[offer.hardware] = direct.get(offer.hardware, 0.0) + gain
        workloads.setdefault(offer.hardware, []).append(w.id)
    total = sum(direct.values())
    out = []
    for key, names in nodes.items():
        offer = next(o for o in offered if o.hardware == key)
        gross = direct[key] + (spill * direct[key] / total if total > 0 else 0.0)
        cost = len(names) * offer.monthly_cost
        if gross <= cost:
            continue  # the solver may stop at a purchase that does not pay; never suggest one
        out.append(
            Purchase(
                hardware=catalog.by_key(key).name,
                gpus_per_node=gpus_per_node,
                nodes=len(names),
                monthly_cost_usd=round(cost, 2),
                monthly_savings_usd=round(gross, 2),
                payback_months=round(cost * AMORTISATION_MONTHS / gross, 2),
                workloads=sorted(workloads[key]),
            )
        )
    return sorted(out, key=lambda p: -(p.monthly_savings_usd - p.monthly_cost_usd))
