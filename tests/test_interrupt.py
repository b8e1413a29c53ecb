"""A plan's solve can be cut short from another thread, so a shutting-down process never waits out the
solver's time limit."""

from __future__ import annotations

import random
import threading
import time

from ortools.sat.python import cp_model

from optimizer.plan.interrupt import SolveStop

LIMIT_S = 3.0


def _hard_model() -> cp_model.CpModel:
    """A multi-knapsack CP-SAT cannot prove optimal within a few seconds."""
    rng = random.Random(7)
    model = cp_model.CpModel()
    items = [(rng.randint(20, 120), rng.randint(20, 120)) for _ in range(400)]
    bins = 12
    x = {(i, b): model.new_bool_var(f"x{i}_{b}") for i in range(len(items)) for b in range(bins)}
    for i in range(len(items)):
        model.add_at_most_one(x[i, b] for b in range(bins))
    for b in range(bins):
        model.add(sum(items[i][0] * x[i, b] for i in range(len(items))) <= 1000 + 7 * b)
    model.maximize(sum(items[i][1] * x[i, b] for i in range(len(items)) for b in range(bins)))
    return model


def _solver() -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = LIMIT_S
    solver.parameters.num_workers = 2
    solver.parameters.catch_sigint_signal = False
    return solver


def test_a_stopped_solve_ends_at_once_and_a_later_one_gets_no_time() -> None:
    model = _hard_model()
    started = time.perf_counter()
    unstopped = _solver().solve(model)
    assert unstopped != cp_model.OPTIMAL and time.perf_counter() - started > LIMIT_S * 0.8  # it uses its limit

    stop = SolveStop()
    threading.Timer(0.3, stop.stop).start()
    started = time.perf_counter()
    stop.solve(_solver(), model)
    assert time.perf_counter() - started < LIMIT_S / 2
    started = time.perf_counter()
    stop.solve(_solver(), model)
    assert time.perf_counter() - started < 0.5 and stop.stopped
