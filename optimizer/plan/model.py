"""The rebalancing model, solved with OR-Tools CP-SAT.

One boolean per (movable workload, node it may run on), its current node included. Constraints: each
workload runs on exactly one node; no node holds more GPUs than it has (workloads that stay put reserve
theirs); at most ``max_moves`` workloads move. Objective: monthly cost of the placement plus the one-off cost
of each move, in integer cents. The current placement is the solver's hint, so "change nothing" is always a
feasible starting point.

The same problem gives the same plan (docs/decisions.md, "Stable plans"): nodes and workloads are taken in name
order whatever order they came in, every tie is broken by name, and CP-SAT runs its deterministic search
(``interleave_search``) under a deterministic work limit, so where it stops depends on the problem, not on the
machine's speed or load. The wall-clock limit stays as a safety net; a solve it cuts short is not used (its
result would depend on the machine), and the starting placement, a function of the problem alone, is the plan.

An open action (``Problem.kept``: proposed by an earlier plan, not yet carried out, dismissed or withdrawn) is
kept unless something clearly better turns up: choosing its node again is worth its margin in the objective
(half of it for another node of the same hardware, the same action landing elsewhere), so another placement
wins only if it saves more than that, and among equal-cost alternatives the earlier choice stays. The margin is
a preference, never a constraint: a plan is never made infeasible by what an earlier one chose.

Nodes the site could buy (``Problem.offers``, chosen in optimizer/plan/purchases.py) join the same model as empty
candidates of one hardware type, identical, so solved as a pool (optimizer/plan/pools.py) whose member count is a
variable: ``bought`` nodes, 0 to the number offered, each costing its amortised monthly price. A workload has
one choice per type ("a new node of it"); what it holds there fits ``bought`` nodes (exactly for divisible
sizes, as for pools; first-fit decreasing then names the nodes), at most ``bought`` large workloads and as many
replicas of one service. A workload on a new node pays only what differs from holding those GPUs (a
throughput-bound job that finishes sooner on faster hardware): the node's whole price is counted once.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from ortools.sat.python import cp_model

from agent.protocol import SolverReport, WorkloadClass
from optimizer.decide.catalog import Catalog, GpuType
from optimizer.decide.costs import Demand, fit_problem, grown, monthly_cost, right_sized, shared, units
from optimizer.plan.bound import Bound, BoundOptions, per_type_bound
from optimizer.plan.pools import Pool, assign, build_pools
from optimizer.plan.problem import Host, Movable, NodeSlot, Offer, Problem
from optimizer.plan.room import Layout, make_room
from optimizer.plan.rounding import Candidate, fill, pack

log = logging.getLogger(__name__)

CENTS = 100
MAX_PACKING_ROUNDS = 3


@dataclass(slots=True)
class Solution:
    placement: dict[str, str]  # workload id → node
    report: SolverReport
    monthly_cost: dict[str, tuple[float, float]] = field(default_factory=dict)  # (now, planned)
    blocked: dict[str, str] = field(default_factory=dict)  # workload id → why no better home was allowed
    gpus: dict[str, int] = field(default_factory=dict)  # workload id → capacity units it holds in the plan
    bound: Bound | None = None  # no placement within the move budget saves more a month


@dataclass(slots=True)
class _Targets:
    """Per hardware type, the nodes worth offering as destinations, roomiest first."""

    by_hardware: dict[str, list[tuple[int, str]]]
    per_type: int
    largest: dict[str, int] = field(default_factory=dict)  # hardware → the most capacity units one node has

    @classmethod
    def of(cls, problem: Problem) -> _Targets:
        room = {n.name: n.gpus - problem.fixed_usage.get(n.name, 0) for n in problem.nodes}
        for w in problem.movable:
            room[w.node] = room.get(w.node, 0) - units(w.demand, problem.units)
        by_hardware: dict[str, list[tuple[int, str]]] = {}
        for n in problem.nodes:
            by_hardware.setdefault(n.hardware, []).append((room[n.name], n.name))
        for nodes in by_hardware.values():
            nodes.sort(key=lambda rn: (-rn[0], rn[1]))
        small = len(problem.movable) * len(problem.nodes) <= problem.full_model_limit
        largest: dict[str, int] = {}
        for n in problem.nodes:
            largest[n.hardware] = max(largest.get(n.hardware, 0), n.gpus)
        return cls(by_hardware, len(problem.nodes) if small else problem.candidates_per_type, largest)

    def nodes(self, hardware: str, gpus: int) -> list[str]:
        """Up to ``per_type`` nodes of ``hardware`` with room for ``gpus`` now, and the next fullest few: those
        may free up when their own workloads move away."""
        listed = self.by_hardware.get(hardware, [])
        if self.per_type >= len(listed):
            return [name for _, name in listed]
        # roomiest first, so those with room are the ones before ``cut``: found without scanning every node of
        # the type for each workload (a fleet-scale model asks once per workload and type)
        cut = bisect.bisect_right(listed, -gpus, key=lambda rn: -rn[0])
        roomy = [name for _, name in listed[: min(cut, self.per_type)]]
        return roomy + [name for _, name in listed[cut : cut + max(2, self.per_type // 4)]]


@dataclass(slots=True)
class _Options:
    """Where one workload may run and what it costs a month there."""

    now: float  # as it runs today
    nodes: dict[str, float]  # node (its own included) → monthly cost there
    types: dict[str, float]  # worthwhile other hardware → monthly cost there
    gpus: dict[str, int]  # hardware (its own included) → GPUs it holds there
    why_not: str | None  # why no better hardware qualified, if so


def sized(catalog: Catalog, problem: Problem, w: Movable, current: GpuType, target: GpuType) -> Demand | None:
    """What ``w`` needs on ``target``: fewer GPUs where its daily peak fits them, a share of one where the
    operator lets services share that hardware (None: as it is, or it does not fit)."""
    if not (problem.right_size and w.resizable):
        return None
    fewer = right_sized(catalog, w.demand, current, target)
    step = problem.sharing.get(target.key)
    if fewer is not None and step is not None and problem.units > 1:
        return shared(catalog, fewer, current, target, step) or fewer
    return fewer


def _candidates(
    catalog: Catalog,
    problem: Problem,
    targets: _Targets,
    w: Movable,
    slots: dict[str, NodeSlot],
    offered: dict[str, Offer] | None = None,
) -> _Options:
    here = slots[w.node]
    current = catalog.by_key(here.hardware)
    cost_now = monthly_cost(catalog, w.demand, current, current)
    at_home = sized(catalog, problem, w, current, current)
    home_cost = monthly_cost(catalog, at_home, current, current) if at_home is not None else cost_now
    if cost_now - home_cost < max(problem.min_monthly_savings, problem.min_savings_fraction * cost_now):
        at_home, home_cost = None, cost_now
    out = _Options(cost_now, {w.node: home_cost}, {}, {here.hardware: units(at_home or w.demand, problem.units)}, None)
    # The roomiest few nodes of its own hardware: a move there saves nothing by itself but can free its node
    # for one that does, so the one-off cost alone decides. Only on small fleets: these near-equal choices
    # multiply the symmetric solutions CP-SAT must wade through, and stall it at a few hundred nodes.
    if len(problem.movable) * len(problem.nodes) <= problem.room_model_limit:
        gpus_home = out.gpus[here.hardware]
        same = (
            n
            for n in targets.nodes(here.hardware, gpus_home)
            if n != w.node and slots[n].gpus >= gpus_home and w.may_run_on(slots[n].host)
        )
        for name in itertools.islice(same, problem.room_moves):
            out.nodes[name] = home_cost + w.host_cost(slots[name].host, home_cost)
    keys = list(targets.by_hardware)
    if offered:
        keys += [key for key in offered if key not in targets.by_hardware]
    for key in keys:
        if key == here.hardware:
            continue
        target = catalog.by_key(key)
        problem_text = fit_problem(catalog, w.demand, current, target)
        demand = sized(catalog, problem, w, current, target) or w.demand
        if problem_text is not None:
            # a service whose load or memory the same count of these GPUs cannot carry: the count it needs
            largest = targets.largest.get(key, 0)
            if offered and key in offered:
                largest = max(largest, offered[key].gpus)
            bigger = grown(catalog, w.demand, current, target, largest // problem.units)
            if bigger is not None:
                problem_text, demand = None, bigger
        cost = monthly_cost(catalog, demand, current, target)
        saving = cost_now - cost
        worth = saving >= problem.min_monthly_savings and saving >= problem.min_savings_fraction * cost_now
        worth = worth and cost < home_cost  # never a move that saves less than resizing in place
        if problem_text and worth:
            out.why_not = problem_text
        if problem_text is None and worth:
            out.types[key] = cost
            out.gpus[key] = size = units(demand, problem.units)
            for name in targets.nodes(key, size):
                if slots[name].gpus >= size and w.may_run_on(slots[name].host):
                    out.nodes[name] = cost + w.host_cost(slots[name].host, cost)
            offer = offered.get(key) if offered else None
            # a node bought is known by its GPUs alone: never offered to a workload that needs more of its host
            if offer is not None and offer.gpus >= size and w.id in offer.workloads and w.needs is None:
                # the node's price is counted once, when bought; what the workload holds there is part of it
                held = size / problem.units * target.price_per_gpu_hour * catalog.defaults.hours_per_month
                out.nodes[offer.key] = cost - held
    return out


def _greedy(
    problem: Problem, targets: _Targets, options: dict[str, _Options], hardware: dict[str, str]
) -> dict[str, str]:
    """The baseline and the solver's starting point: the open actions that still fit where they were sent
    (``problem.kept``), then biggest saving first, each to the cheapest node with room (room it leaves behind is
    reused). Ties go by name."""
    room = {name: free for nodes in targets.by_hardware.values() for free, name in nodes}
    placement = {w.id: w.node for w in problem.movable}
    already: dict[str, set[str]] = {}
    for w in problem.movable:
        if w.service:
            already.setdefault(w.service, set()).add(w.node)
    taken: set[tuple[str, str]] = set()  # (service, node) that received a replica
    moved = 0

    hosts = {n.name: n.host for n in problem.nodes}

    def allowed(w: Movable, name: str) -> bool:
        if not w.may_run_on(hosts[name]):
            return False
        return not (w.service and name not in already[w.service] and (w.service, name) in taken)

    def place(w: Movable, node: str, gpus: int) -> None:
        nonlocal moved
        room[node] -= gpus
        room[w.node] += units(w.demand, problem.units)
        placement[w.id] = node
        if w.service:
            taken.add((w.service, node))
        moved += 1

    for w in problem.movable:  # in id order
        kept = problem.kept.get(w.id)
        key = hardware.get(kept.node) if kept is not None and kept.node != w.node else None
        o = options[w.id]
        if kept is None or key is None or key not in o.types or moved >= problem.max_moves:
            continue
        if room.get(kept.node, 0) >= o.gpus[key] and allowed(w, kept.node):
            place(w, kept.node, o.gpus[key])

    def best_saving(w: Movable) -> float:
        o = options[w.id]
        return o.now - min(o.types.values(), default=o.now)

    for w in sorted(problem.movable, key=lambda w: (-best_saving(w), w.id)):
        o = options[w.id]
        if moved >= problem.max_moves or not o.types or placement[w.id] != w.node:
            continue
        for key, cost in sorted(o.types.items(), key=lambda kv: (kv[1], kv[0])):
            gpus = o.gpus[key]
            fits = (name for _, name in targets.by_hardware.get(key, ()) if room[name] >= gpus and allowed(w, name))
            node = _cheapest_host(w, cost, hosts, fits)
            if node is not None:
                place(w, node, gpus)
                break
    return placement


GREEDY_HOST_LOOKS = 64  # nodes with room a greedy choice looks through for one that costs nothing beside its GPUs


def _cheapest_host(w: Movable, cost: float, hosts: dict[str, Host], fits: Iterable[str]) -> str | None:
    """The first of ``fits`` (nodes with room, roomiest first) where ``w`` pays nothing beside its GPUs (no
    mixed-node penalty, no cold starts over the network), looking at ``GREEDY_HOST_LOOKS`` of them at most; else
    the first of them."""
    first = None
    for name in itertools.islice(fits, GREEDY_HOST_LOOKS):
        if w.host_cost(hosts[name], cost) == 0.0:
            return name
        first = first or name
    return first


def _spread_replicas(
    model: cp_model.CpModel,
    problem: Problem,
    choice: dict[tuple[str, str], cp_model.IntVar],
    pools: dict[str, Pool],
) -> None:
    """No node gets two replicas of one service that were not already sharing it (a pool: one per member)."""
    services: dict[str, list[Movable]] = {}
    for w in problem.movable:
        if w.service:
            services.setdefault(w.service, []).append(w)
    options: dict[str, list[tuple[str, cp_model.IntVar]]] = {}
    for (wid, node), var in choice.items():
        options.setdefault(wid, []).append((node, var))
    for replicas in services.values():
        if len(replicas) < 2:
            continue
        already = {w.node for w in replicas}
        by_node: dict[str, list[cp_model.IntVar]] = {}
        for w in replicas:
            for node, var in options.get(w.id, []):
                by_node.setdefault(node, []).append(var)
        for node, variables in by_node.items():
            limit = pools[node].size if node in pools else 1
            if len(variables) > limit and node not in already:
                model.add(sum(variables) <= limit)


def _offer(
    model: cp_model.CpModel,
    problem: Problem,
    offer: Offer,
    terms: list[tuple[int, cp_model.IntVar]],
    choice: dict[tuple[str, str], cp_model.IntVar],
    objective: list[cp_model.LinearExpr],
) -> cp_model.IntVar:
    """The offered nodes: how many are bought, what that costs, and what the workloads sent there need."""
    bought = model.new_int_var(0, len(offer.names), f"bought[{offer.hardware}]")
    # Room the plan frees on the site's own nodes is priced like a new node's; a dollar a node more makes the
    # model use that room first, and buy only what it lacks.
    objective.append((round(offer.monthly_cost * CENTS) + CENTS) * bought)
    if not terms:
        return bought
    sizes = sorted({g for g, _ in terms})
    for s in sizes:  # exact for divisible sizes, as for a pool (optimizer/plan/pools.py)
        if s > 1 and all(g % s == 0 for g in sizes if g >= s):
            model.add(sum(g * v for g, v in terms if g >= s) <= s * (offer.gpus // s) * bought)
    model.add(sum(g * v for g, v in terms) <= offer.gpus * bought)
    large = [v for g, v in terms if 2 * g > offer.gpus]
    if large:
        model.add(sum(large) <= bought)
    replicas: dict[str, list[cp_model.IntVar]] = {}
    for w in problem.movable:
        var = choice.get((w.id, offer.key))
        if w.service and var is not None:
            replicas.setdefault(w.service, []).append(var)
    for same in replicas.values():
        if len(same) > 1:
            model.add(sum(same) <= bought)  # one replica of a service a node
    return bought


def _pool_capacity(model: cp_model.CpModel, pool: Pool, terms: list[tuple[int, cp_model.IntVar]]) -> None:
    """What a pool of identical nodes can take (see optimizer/plan/pools.py)."""
    sizes = sorted({g for g, _ in terms})
    for s, capacity in pool.capacity_by_size(sizes).items():
        if all(g % s == 0 for g in sizes if g >= s) and s > 1:  # exact for divisible sizes
            model.add(sum(g * v for g, v in terms if g >= s) <= capacity)
    model.add(sum(g * v for g, v in terms) <= pool.size * pool.room)  # always valid (the size-1 case)
    large = [v for g, v in terms if 2 * g > pool.room]
    if large:
        model.add(sum(large) <= pool.size)  # one large workload per member


def _neighbours(problem: Problem, options: dict[str, _Options], slots: dict[str, NodeSlot]) -> Problem:
    """The problem with each node's host counting, beside the workloads that cannot move, the movable ones no other
    hardware is worth moving to: they stay (but for moves within their hardware), so a workload moved beside them
    pays the mixed-node penalty. ``slots`` and the options' node costs are updated to match. One that could leave
    is not counted: whether it does is what the plan decides."""
    held: dict[str, set[WorkloadClass]] = {}
    for w in problem.movable:
        if not options[w.id].types:
            held.setdefault(w.node, set()).add(w.demand.workload_class)
    changed = {}
    for n in problem.nodes:
        classes = held.get(n.name, set())
        training = n.host.training or WorkloadClass.TRAINING in classes
        serving = n.host.serving or WorkloadClass.INFERENCE in classes
        if (training, serving) != (n.host.training, n.host.serving):
            changed[n.name] = replace(n, host=replace(n.host, training=training, serving=serving))
    if not changed:
        return problem
    slots.update({name: slot for name, slot in changed.items() if name in slots})
    for w in problem.movable:
        o = options[w.id]
        for node in o.nodes:
            if node in changed and node != w.node:
                base = o.types.get(slots[node].hardware, o.nodes[w.node])
                o.nodes[node] = base + w.host_cost(slots[node].host, base)
    return replace(problem, nodes=[changed.get(n.name, n) for n in problem.nodes])


def _host_label(host: Host) -> str:
    """A short name for a node's host, told apart in pool keys."""
    cpus = "?" if host.cpu_cores_per_gpu is None else f"{host.cpu_cores_per_gpu:g}"
    nvme = {None: "?", True: "nvme", False: "no-nvme"}[host.local_nvme]
    tenants = ("+training" if host.training else "") + ("+serving" if host.serving else "")
    return f"{cpus}cpu/{nvme}{tenants}"


def _pooled(problem: Problem) -> tuple[list[NodeSlot], dict[str, Pool], dict[str, Pool]]:
    """The nodes the model sees (pools in place of their members), pools by key, and each member's pool."""
    if not problem.pools:
        return problem.nodes, {}, {}
    hosting = {w.node for w in problem.movable}
    free = ((n.name, n.hardware, n.gpus - problem.fixed_usage.get(n.name, 0)) for n in problem.nodes)
    # members of a pool are alike beside their GPUs too: what a workload needs or pays there holds for each
    hosts = {n.name: n.host for n in problem.nodes}
    kinds = {name: _host_label(host) for name, host in hosts.items() if host != Host()}
    pools = build_pools(free, hosting, problem.pool_min_members, kinds)
    member_of = {m: p for p in pools for m in p.members}
    nodes = [n for n in problem.nodes if n.name not in member_of] + [
        NodeSlot(p.key, p.hardware, p.room, hosts[p.members[0]]) for p in pools
    ]
    return nodes, {p.key: p for p in pools}, member_of


def solve(catalog: Catalog, problem: Problem) -> Solution:
    """Find the cheapest placement reachable within the move budget."""
    started = time.perf_counter()
    # Name order, whatever order the caller listed them in: the model, and so CP-SAT's search, is the same.
    problem = replace(
        problem,
        nodes=sorted(problem.nodes, key=lambda n: n.name),
        movable=sorted(problem.movable, key=lambda w: w.id),
        offers=sorted(problem.offers, key=lambda o: o.hardware),
    )
    model = cp_model.CpModel()
    choice: dict[tuple[str, str], cp_model.IntVar] = {}
    moves = []
    objective = []
    blocked: dict[str, str] = {}
    model_nodes, pools, member_of = _pooled(problem)
    usage: dict[str, list[tuple[int, cp_model.IntVar]]] = {n.name: [] for n in model_nodes}
    targets = _Targets.of(replace(problem, nodes=model_nodes)) if pools else _Targets.of(problem)
    slots = {n.name: n for n in model_nodes}
    hardware = {n.name: n.hardware for n in problem.nodes}
    offered = {o.hardware: o for o in problem.offers}
    for offer in problem.offers:
        slots[offer.key] = NodeSlot(offer.key, offer.hardware, offer.gpus)
        usage[offer.key] = []
        pools[offer.key] = offer.pool
    options: dict[str, _Options] = {}
    for w in problem.movable:
        options[w.id] = o = _candidates(catalog, problem, targets, w, slots, offered)
        if len(o.nodes) == 1 and o.why_not:
            blocked[w.id] = o.why_not
    problem = _neighbours(problem, options, slots)
    bonus = _preferences(problem, options, slots, member_of, hardware)
    bound: Bound | None = None
    if problem.start is not None:
        hint = problem.start  # a plan solved already (without offers): its placement is feasible here too
    else:
        # The greedy pass (the open actions first) and the LP rounded onto nodes both see every concrete node;
        # the better of the two, the open actions' margins counted, is the hint (pooled) and always a choice.
        concrete = _Targets.of(problem) if pools else targets
        greedy = _filled(problem, options, _greedy(problem, concrete, options, hardware), slots)
        bound = per_type_bound(problem, [_as_bound_options(w, options[w.id], slots) for w in problem.movable])
        hint = greedy
        dense = _filled(problem, options, {w.id: w.node for w in problem.movable}, slots)
        if _placement_cost(problem, options, dense, slots, bonus=bonus, member_of=member_of) < _placement_cost(
            problem, options, hint, slots, bonus=bonus, member_of=member_of
        ):
            hint = dense
        if bound is not None:
            rounded = _filled(problem, options, _rounded(problem, options, bound, slots), slots)
            if _placement_cost(problem, options, rounded, slots, bonus=bonus, member_of=member_of) < _placement_cost(
                problem, options, hint, slots, bonus=bonus, member_of=member_of
            ):
                hint = rounded
    start = {wid: member_of[node].key if node in member_of else node for wid, node in hint.items()}
    for w in problem.movable:
        o = options[w.id]
        if start[w.id] not in o.nodes:  # a given start may hold a move to make room, on its own hardware
            key = slots[start[w.id]].hardware
            o.nodes[start[w.id]] = o.types[key] if key in o.types else o.nodes[w.node]
    bonus = _preferences(problem, options, slots, member_of, hardware)  # again: the start may have added nodes
    prefer = {wid: k.node for wid, k in problem.kept.items() if k.node in member_of}  # pool members
    if sum(len(o.nodes) for o in options.values()) > problem.exact_model_limit and bound is not None:
        saved = sum(o.now for o in options.values()) - _placement_cost(problem, options, hint, slots, one_off=False)
        if saved >= (1 - problem.bound_tolerance) * bound.savings:
            # Proven within the tolerance of the best possible: CP-SAT could add at most that much, and at
            # fleet scale it spends its whole time limit in presolve before it finds anything.
            kept = _from_start(problem, options, start, pools, blocked, slots, hint, bound, started, prefer)
            if kept is not None:
                return kept
        if sum(len(o.nodes) for o in options.values()) > problem.focus_model_limit:
            _focus(problem, options, bound, start, slots, bonus)
    size: dict[tuple[str, str], int] = {}  # (workload, node) → GPUs it holds there
    for w in problem.movable:
        o = options[w.id]
        row = []
        for node, cost in o.nodes.items():
            var = model.new_bool_var(f"x[{w.id}@{node}]")
            choice[w.id, node] = var
            row.append(var)
            size[w.id, node] = gpus = o.gpus[slots[node].hardware]
            usage[node].append((gpus, var))
            one_off = 0.0 if node == w.node else w.move_cost_usd
            objective.append((round((cost + one_off) * CENTS) - round(bonus.get((w.id, node), 0.0) * CENTS)) * var)
            model.add_hint(var, node == start[w.id])
            if node != w.node:
                moves.append(var)
        model.add_exactly_one(row)
    for n in model_nodes:
        terms = usage[n.name]
        if n.name in pools and terms:
            _pool_capacity(model, pools[n.name], terms)
        elif terms:
            model.add(sum(g * v for g, v in terms) <= max(n.gpus - problem.fixed_usage.get(n.name, 0), 0))
    for offer in problem.offers:
        _offer(model, problem, offer, usage[offer.key], choice, objective)
    if moves:
        model.add(sum(moves) <= problem.max_moves)
    _spread_replicas(model, problem, choice, pools)
    model.minimize(sum(objective))

    solver = cp_model.CpSolver()
    # the time limit covers the whole plan: building the model at fleet scale takes seconds of it
    budget = problem.time_limit_s * (1 - problem.post_solve_share)
    if len(choice) > problem.exact_model_limit:
        # Symmetry detection takes most of the time limit on these models (packing constraints of thousands of
        # nodes) before the search starts; the hint already gives a solution to improve.
        solver.parameters.symmetry_level = 0
    # Deterministic: the interleaved search runs its subsolvers in batches, synchronised between batches, so
    # the result does not depend on how fast each runs, and a deterministic work limit ends it at the same point
    # on every machine. One worker: with two, each batch waits for its slowest task, and the 253-node bench fleet
    # took 2.0 units of work (6-7 s) to its optimum instead of 0.45 (under 2 s).
    solver.parameters.interleave_search = True
    solver.parameters.num_workers = problem.workers
    solver.parameters.random_seed = 1
    # CP-SAT would otherwise install its own SIGINT handler and leave SIG_DFL behind, so a later Ctrl-C
    # kills the daemon instead of shutting it down.
    solver.parameters.catch_sigint_signal = False
    work = problem.work
    status, cut = _run(solver, model, problem, work, budget - (time.perf_counter() - started))
    home = {w.id: w.node for w in problem.movable}
    earlier: dict[str, str] | None = None  # the last round's placement, should a re-solve find none in time
    for _ in range(MAX_PACKING_ROUNDS):  # a pool's share that will not pack: forbid it there and solve again
        if cut or status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            break
        chosen = {w.id: next(n for n in options[w.id].nodes if solver.value(choice[w.id, n])) for w in problem.movable}
        misfits = _misfits(problem, chosen, pools, size, prefer)
        if not misfits:
            break
        earlier = chosen
        model.clear_hints()  # type: ignore[no-untyped-call]
        for (wid, node), var in choice.items():
            model.add_hint(var, node == (home[wid] if wid in misfits else chosen[wid]))
        for wid in misfits:
            model.add(choice[wid, chosen[wid]] == 0)
        work = max(work - solver.deterministic_time, problem.work / 10)
        status, cut = _run(solver, model, problem, work, budget - (time.perf_counter() - started))
    name = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE) and not cut and earlier is not None:
        # The re-solve found nothing within its work: the round before stands, its workloads that do not pack
        # staying home (both depend only on the input, as the work limit does).
        placement = _concrete(problem, earlier, pools, blocked, size, prefer)
        elapsed = time.perf_counter() - started
        cost = sum(options[w.id].nodes[earlier[w.id]] for w in problem.movable)
        report = SolverReport(status="FEASIBLE", objective=round(cost, 2), best_bound=0.0, gap=0.0,
                              solve_seconds=round(elapsed, 4))  # fmt: skip
        return _solution(problem, options, earlier, placement, size, report, blocked, bound)
    if status == cp_model.UNKNOWN or cut:
        # Out of time before CP-SAT had a solution (presolve alone can take that long at fleet scale), or cut
        # short by the wall clock (what it found by then depends on the machine's speed and load): the starting
        # placement is feasible, at least as good as the greedy and the same on every machine, so it is the plan.
        if cut:
            log.info(
                "the solve reached its wall-clock limit (%.1f s) after %.2f of its %.2f deterministic seconds of "
                "work; the starting placement is the plan (the machine is slower or busier than the work limit "
                "allows for: raise the plan's time_limit)",
                solver.wall_time,
                solver.deterministic_time,
                work,
            )
        kept = _from_start(problem, options, start, pools, blocked, slots, hint, bound, started, prefer)
        if kept is not None:
            return kept
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        # Infeasible only if the current placement itself overflows a node (stale telemetry): keep it.
        placement = {w.id: w.node for w in problem.movable}
        elapsed = time.perf_counter() - started
        report = SolverReport(status=name, objective=0.0, best_bound=0.0, gap=0.0, solve_seconds=elapsed)
        held = {w.id: units(w.demand, problem.units) for w in problem.movable}
        return Solution(placement, report, blocked=blocked, gpus=held)
    chosen = {w.id: next(n for n in options[w.id].nodes if solver.value(choice[w.id, n])) for w in problem.movable}
    placement = _concrete(problem, chosen, pools, blocked, size, prefer)
    elapsed = time.perf_counter() - started
    # the objective counts the open actions kept as worth their margin; the report gives the cost itself (the
    # solver's bound, on the objective, is a lower bound on it too)
    value = solver.objective_value / CENTS + sum(bonus.get((wid, node), 0.0) for wid, node in chosen.items())
    best = solver.best_objective_bound / CENTS
    report = SolverReport(
        status=name,
        objective=round(value, 2),
        best_bound=round(best, 2),
        gap=round(abs(value - best) / max(abs(value), 1e-9), 6) if value else 0.0,
        solve_seconds=round(elapsed, 4),
    )
    return _solution(problem, options, chosen, placement, size, report, blocked, bound)


def _run(
    solver: cp_model.CpSolver, model: cp_model.CpModel, problem: Problem, work: float, seconds: float
) -> tuple[cp_model.CpSolverStatus, bool]:
    """Solve within ``work`` deterministic seconds, ``seconds`` of wall clock at most (one at least); returns the
    status and whether the wall clock, not the work limit or a proof, ended the search."""
    solver.parameters.max_deterministic_time = work
    solver.parameters.max_time_in_seconds = max(seconds, 1.0)
    status = problem.stop.solve(solver, model) if problem.stop else solver.solve(model)
    proven = status in (cp_model.OPTIMAL, cp_model.INFEASIBLE, cp_model.MODEL_INVALID)
    stopped = problem.stop is not None and problem.stop.stopped
    # The work limit is checked between batches of the interleaved search, so a search it ends has done at
    # least that work; one that stopped short of it, unproven, was stopped by the clock.
    return status, not proven and not stopped and solver.deterministic_time < work


def _preferences(
    problem: Problem,
    options: dict[str, _Options],
    slots: dict[str, NodeSlot],
    member_of: dict[str, Pool],
    hardware: dict[str, str],
) -> dict[tuple[str, str], float]:
    """What keeping each open action is worth (US$ a month) on the choices that keep it: its node (or the pool
    the node is in) its whole margin, another node of the same hardware (the same action, landing elsewhere)
    half. Its node is offered where it still qualifies; an action whose hardware no longer qualifies (the move no
    longer saves enough, or does not fit) is worth nothing and is withdrawn."""
    out: dict[tuple[str, str], float] = {}
    for w in problem.movable:
        k = problem.kept.get(w.id)
        if k is None:
            continue
        o = options[w.id]
        home = slots[w.node].hardware
        if k.node == w.node:  # resized in place: kept while resizing still qualifies
            if o.gpus[home] < units(w.demand, problem.units):
                out[w.id, w.node] = k.margin_usd
            continue
        key = hardware.get(k.node)
        target = member_of[k.node].key if k.node in member_of else k.node
        if key is None or target not in slots:
            continue
        if key == home:  # a move that makes room, where it is still offered
            if target in o.nodes:
                out[w.id, target] = k.margin_usd
            continue
        if key not in o.types:
            continue
        if slots[target].gpus >= o.gpus[key] and w.may_run_on(slots[target].host):
            o.nodes.setdefault(target, o.types[key] + w.host_cost(slots[target].host, o.types[key]))
            out[w.id, target] = k.margin_usd
        for node in o.nodes:
            if node != target and slots[node].hardware == key:
                out[w.id, node] = k.margin_usd / 2
    return out


def _from_start(
    problem: Problem,
    options: dict[str, _Options],
    start: dict[str, str],
    pools: dict[str, Pool],
    blocked: dict[str, str],
    slots: dict[str, NodeSlot],
    hint: dict[str, str],
    bound: Bound | None,
    started: float,
    prefer: dict[str, str],
) -> Solution | None:
    """The starting placement as the plan (None if a pool's share of it does not pack, and ``hint`` does not
    name nodes that exist: a given start may name pools)."""
    chosen = {w.id: start[w.id] for w in problem.movable}
    size = {(w.id, chosen[w.id]): options[w.id].gpus[slots[chosen[w.id]].hardware] for w in problem.movable}
    if _misfits(problem, chosen, pools, size, prefer):
        # first-fit decreasing need not repack what the start packed node by node: its own nodes stand
        concrete = {n.name: n.hardware for n in problem.nodes}
        if not all(node in concrete for node in hint.values()):
            return None
        chosen = {w.id: hint[w.id] for w in problem.movable}
        slots = {**slots, **{n.name: n for n in problem.nodes}}
        size = {(w.id, chosen[w.id]): options[w.id].gpus[concrete[chosen[w.id]]] for w in problem.movable}
        for w in problem.movable:
            o = options[w.id]
            if chosen[w.id] != w.node:  # a move to make room stays on its own hardware, at its cost there
                o.nodes.setdefault(chosen[w.id], o.types.get(concrete[chosen[w.id]], o.nodes[w.node]))
        pools = {}
    report = SolverReport(
        status="HEURISTIC",
        objective=round(_placement_cost(problem, options, hint, slots), 2),
        best_bound=0.0,
        gap=0.0,
        solve_seconds=round(time.perf_counter() - started, 4),
    )
    size.update({(w.id, w.node): options[w.id].gpus[slots[w.node].hardware] for w in problem.movable})
    placement = _concrete(problem, chosen, pools, blocked, size, prefer)
    return _solution(problem, options, chosen, placement, size, report, blocked, bound)


def _solution(
    problem: Problem,
    options: dict[str, _Options],
    chosen: dict[str, str],
    placement: dict[str, str],
    size: dict[tuple[str, str], int],
    report: SolverReport,
    blocked: dict[str, str],
    bound: Bound | None,
) -> Solution:
    monthly: dict[str, tuple[float, float]] = {}
    held: dict[str, int] = {}
    for w in problem.movable:
        o = options[w.id]
        node = chosen[w.id] if placement[w.id] != w.node else w.node
        monthly[w.id] = (o.now, o.nodes[node])
        held[w.id] = size[w.id, node]
    return Solution(placement, report, monthly, blocked, held, bound)


def _as_bound_options(w: Movable, o: _Options, slots: dict[str, NodeSlot]) -> BoundOptions:
    home = slots[w.node].hardware
    by_type = {key: (cost, o.gpus[key]) for key, cost in o.types.items()}
    by_type[home] = (o.nodes[w.node], o.gpus[home])
    return BoundOptions(id=w.id, home=home, now=o.now, by_type=by_type)


def _barred(problem: Problem) -> dict[str, frozenset[str]]:
    """For each workload with needs, the nodes that do not meet them (one set shared by workloads alike)."""
    sets: dict[object, frozenset[str]] = {}
    out: dict[str, frozenset[str]] = {}
    for w in problem.movable:
        if w.needs is None:
            continue
        if w.needs not in sets:
            sets[w.needs] = frozenset(n.name for n in problem.nodes if not w.may_run_on(n.host))
        out[w.id] = sets[w.needs]
    return out


def _rounded(
    problem: Problem, options: dict[str, _Options], bound: Bound, slots: dict[str, NodeSlot]
) -> dict[str, str]:
    """The LP's placement packed onto concrete nodes (optimizer/plan/rounding.py)."""
    room = {n.name: n.gpus - problem.fixed_usage.get(n.name, 0) for n in problem.nodes}
    for w in problem.movable:
        room[w.node] -= units(w.demand, problem.units)
    barred = _barred(problem)
    candidates = []
    for w in problem.movable:
        b = _as_bound_options(w, options[w.id], slots)
        fractions = bound.fractions.get(w.id, {})
        now = units(w.demand, problem.units)
        candidates.append(Candidate(w.id, w.node, b.home, now, w.service, b.by_type, fractions, barred.get(w.id)))
    hardware = {n.name: n.hardware for n in problem.nodes}
    placed = pack(candidates, room, hardware, problem.max_moves)
    # what the packing could not place, placed by moving small tenants aside (optimizer/plan/room.py)
    left = {n.name: n.gpus - problem.fixed_usage.get(n.name, 0) for n in problem.nodes}
    pending = []
    taken = set()
    for c in candidates:
        node, gpus = placed[c.id]
        left[node] -= gpus
        if node != c.node:
            if c.service:
                taken.add((c.service, node))
            continue
        target = max(c.fractions, key=lambda k: (c.fractions[k], k == c.home), default=c.home)
        if target != c.home and target in c.by_type:
            pending.append((c.by_type[c.home][0] - c.by_type[target][0], c, target))
    moves = sum(1 for c in candidates if placed[c.id][0] != c.node)
    move_cost = {w.id: w.move_cost_usd for w in problem.movable}
    layout = Layout({c.id: c for c in candidates}, placed, left, hardware, taken, move_cost)
    make_room(pending, layout, problem.max_moves - moves)
    return {wid: node for wid, (node, _) in layout.placed.items()}


def _filled(
    problem: Problem, options: dict[str, _Options], placement: dict[str, str], slots: dict[str, NodeSlot]
) -> dict[str, str]:
    """``placement`` with the room it leaves on cheaper hardware filled (optimizer/plan/rounding.py, ``fill``)."""
    room = {n.name: n.gpus - problem.fixed_usage.get(n.name, 0) for n in problem.nodes}
    barred = _barred(problem)
    candidates = []
    for w in problem.movable:
        b = _as_bound_options(w, options[w.id], slots)
        held = units(w.demand, problem.units)
        candidates.append(Candidate(w.id, w.node, b.home, held, w.service, b.by_type, {}, barred.get(w.id)))
    hardware = {n.name: n.hardware for n in problem.nodes}
    move_cost = {w.id: w.move_cost_usd for w in problem.movable}
    return fill(candidates, placement, room, hardware, problem.max_moves, move_cost)


def _placement_cost(
    problem: Problem,
    options: dict[str, _Options],
    placement: dict[str, str],
    slots: dict[str, NodeSlot],
    one_off: bool = True,
    bonus: dict[tuple[str, str], float] | None = None,
    member_of: dict[str, Pool] | None = None,
) -> float:
    """The objective of a concrete placement: monthly cost plus (``one_off``) the one-off cost of its moves, less
    (``bonus``, by model node: ``member_of`` maps pooled nodes to their pool) what keeping open actions is worth."""
    hardware = {n.name: n.hardware for n in problem.nodes}
    hosts = {n.name: n.host for n in problem.nodes}
    total = 0.0
    for w in problem.movable:
        o, node = options[w.id], placement[w.id]
        if node == w.node:
            total += o.nodes[w.node]
        else:
            cost = o.types.get(hardware[node], o.nodes[w.node])
            total += cost + w.host_cost(hosts[node], cost) + (w.move_cost_usd if one_off else 0.0)
        if bonus:
            pool = member_of.get(node) if member_of else None
            total -= bonus.get((w.id, pool.key if pool is not None else node), 0.0)
    return total


def _focus(
    problem: Problem,
    options: dict[str, _Options],
    bound: Bound,
    start: dict[str, str],
    slots: dict[str, NodeSlot],
    bonus: dict[tuple[str, str], float],
) -> None:
    """At fleet scale, offer each workload only nodes of the hardware types the LP gives some of it, besides
    its own node, its starting one and those that keep its open action: the LP has already priced every type,
    and a model a fifth the size leaves CP-SAT time to improve on the start."""
    for w in problem.movable:
        o = options[w.id]
        keep = {key for key, share in bound.fractions.get(w.id, {}).items() if share > 1e-6}
        o.nodes = {
            node: cost
            for node, cost in o.nodes.items()
            if node in (w.node, start[w.id]) or slots[node].hardware in keep or (w.id, node) in bonus
        }


def _pool_shares(
    problem: Problem, chosen: dict[str, str], pools: dict[str, Pool], size: dict[tuple[str, str], int]
) -> dict[str, list[tuple[str, int, str | None]]]:
    """The workloads the plan sent to each pool, as ``(id, gpus, service)``."""
    shares: dict[str, list[tuple[str, int, str | None]]] = {}
    for w in problem.movable:
        if chosen[w.id] in pools:
            shares.setdefault(chosen[w.id], []).append((w.id, size[w.id, chosen[w.id]], w.service))
    return shares


def _misfits(
    problem: Problem,
    chosen: dict[str, str],
    pools: dict[str, Pool],
    size: dict[tuple[str, str], int],
    prefer: dict[str, str],
) -> set[str]:
    """Workloads the plan sent to a pool that first-fit decreasing cannot give a member."""
    shares = _pool_shares(problem, chosen, pools, size)
    return {wid for key, work in shares.items() for wid in assign(pools[key], work, prefer)[1]}


def _concrete(
    problem: Problem,
    chosen: dict[str, str],
    pools: dict[str, Pool],
    blocked: dict[str, str],
    size: dict[tuple[str, str], int],
    prefer: dict[str, str],
) -> dict[str, str]:
    """Each workload the plan sent to a pool gets a member (the one its open action named, where it fits); one
    that cannot be packed stays where it is."""
    placement = {wid: node for wid, node in chosen.items() if node not in pools}
    home = {w.id: w.node for w in problem.movable}
    for key, workloads in _pool_shares(problem, chosen, pools, size).items():
        placed, unplaced = assign(pools[key], workloads, prefer)
        placement.update(placed)
        for wid in unplaced:
            placement[wid] = home[wid]
            blocked[wid] = f"no single {pools[key].hardware} node left with room after packing"
    return placement
