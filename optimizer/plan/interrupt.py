"""Cutting a plan short from another thread.

Plans are solved in a worker thread, and a CP-SAT solve runs to its time limit unless told to stop; a process
that is shutting down would otherwise wait up to that limit for a plan nobody will read (``asyncio.run`` joins
its worker threads). ``SolveStop.stop()`` ends the solve running now (CP-SAT's ``stop_search``) and leaves any
later solve of the same plan no time, so the plan returns at once with what it has.
"""

from __future__ import annotations

import threading

from ortools.sat.python import cp_model, cp_model_helper

NO_TIME_S = 0.001  # CP-SAT's time limit for a solve that starts after the stop


class SolveStop:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stopped = False
        self._running: set[cp_model.CpSolver] = set()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            for solver in self._running:
                solver.stop_search()

    def solve(self, solver: cp_model.CpSolver, model: cp_model.CpModel) -> cp_model_helper.CpSolverStatus:
        """``solver.solve(model)``, which ``stop()`` ends early."""
        with self._lock:
            if self._stopped:
                solver.parameters.max_time_in_seconds = NO_TIME_S
            self._running.add(solver)
        try:
            return solver.solve(model)
        finally:
            with self._lock:
                self._running.discard(solver)
