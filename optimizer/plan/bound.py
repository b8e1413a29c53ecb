"""An upper bound on the monthly savings of any plan, so a plan can say how close to the best it is.

CP-SAT's own bound at fleet scale is loose (it must close the node-by-node packing) and only covers the
candidate nodes the model was offered. This one relaxes the planner's whole problem instead: each workload is
spread fractionally over hardware types, and the GPUs of each type are pooled over all its nodes. The
linear programme that remains (GLOP solves it in well under a second at 8,000 workloads) keeps the move
budget, and, per type and workload size ``s``, that workloads of at least ``s`` GPUs fit only in whole
``s``-GPU blocks of each node's free room (exact for sizes that divide each other). Every placement the
planner may choose is feasible for it, so no plan saves more than its optimum.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ortools.linear_solver import pywraplp

if TYPE_CHECKING:
    from optimizer.plan.problem import Problem

METHOD = "LP relaxation, GPUs pooled per hardware type"


@dataclass(frozen=True, slots=True)
class BoundOptions:
    """What one workload may do: its hardware today, its monthly cost today, and per hardware type it may
    run on (its own included) the monthly cost and GPUs there."""

    id: str
    home: str
    now: float
    by_type: dict[str, tuple[float, int]]


@dataclass(frozen=True, slots=True)
class Bound:
    savings: float  # US$ a month; no plan within the move budget saves more
    seconds: float
    fractions: dict[str, dict[str, float]] = field(default_factory=dict)  # workload → hardware → LP share
    method: str = METHOD


def per_type_bound(problem: Problem, options: Iterable[BoundOptions]) -> Bound | None:
    """The LP bound for ``problem`` (None when the LP solver is unavailable or fails)."""
    started = time.perf_counter()
    solver = pywraplp.Solver.CreateSolver("GLOP")
    if solver is None:
        return None
    free: dict[str, list[int]] = {}  # hardware → free GPUs of each node once every movable workload left
    for n in problem.nodes:
        free.setdefault(n.hardware, []).append(max(n.gpus - problem.fixed_usage.get(n.name, 0), 0))
    terms: dict[str, list[tuple[int, pywraplp.Variable]]] = {}
    moves: list[pywraplp.Variable] = []
    objective = solver.Objective()
    total_now = 0.0
    rows: dict[str, list[tuple[str, pywraplp.Variable]]] = {}
    for o in options:
        total_now += o.now
        row = rows[o.id] = []
        for key, (cost, gpus) in o.by_type.items():
            if key not in free:
                continue
            var = solver.NumVar(0.0, 1.0, "")
            objective.SetCoefficient(var, cost)
            terms.setdefault(key, []).append((gpus, var))
            row.append((key, var))
            if key != o.home:
                moves.append(var)
        if not row:
            return None  # a workload on hardware the problem does not list: nothing sound to say
        one = solver.Constraint(1.0, 1.0)
        for _, var in row:
            one.SetCoefficient(var, 1.0)
    objective.SetMinimization()
    for key, placed in terms.items():
        sizes = sorted({g for g, _ in placed})
        for s in sorted({1, *sizes}):
            if s > 1 and any(g % s for g in sizes if g >= s):
                continue  # the block argument holds only for sizes that divide each other
            cap = solver.Constraint(0.0, float(sum(s * (f // s) for f in free[key])))
            for g, var in placed:
                if g >= s:
                    cap.SetCoefficient(var, float(g))
    if moves:
        budget = solver.Constraint(0.0, float(problem.max_moves))
        for var in moves:
            budget.SetCoefficient(var, 1.0)
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return None
    fractions = {wid: {key: var.solution_value() for key, var in row} for wid, row in rows.items()}
    return Bound(round(total_now - objective.Value(), 2), round(time.perf_counter() - started, 4), fractions)
