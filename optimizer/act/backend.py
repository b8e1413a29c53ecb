"""The one interface every scheduler backend has: propose what carrying an action out would run, then run it.

A proposal is what a dry run prints and what ``--execute`` runs, step by step, so what a person reviewed is what
happens. A step is a command line (Slurm) or an API call (Kubernetes); the first that fails stops the rest, and
the result keeps every step's output."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from agent.protocol import Recommendation
from optimizer.act.runner import Ran, run


class Status(StrEnum):
    APPLIED = "applied"  # the scheduler accepted every step
    FAILED = "failed"  # a step failed (non-zero exit, timeout, missing program, refused by the server)
    NOTIFIED = "notified"  # nothing was changed: the commands are for the workload's owner (no opt-in, or manual)


@dataclass(frozen=True, slots=True)
class Step:
    """One thing to run: ``text`` is how a person reads it; ``argv`` a command, or ``call`` an API request."""

    text: str
    argv: tuple[str, ...] = ()
    call: Callable[[], Ran] | None = None
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 30.0

    def __call__(self) -> Ran:
        if self.call is not None:
            return self.call()
        return run(self.argv, self.timeout, self.env)


@dataclass(frozen=True, slots=True)
class Proposal:
    """What carrying out one action would do. ``steps`` run only when ``runnable``; otherwise ``note`` says why
    (no opt-in, nothing this backend can change) and the steps are printed for the workload's owner."""

    rec_id: str
    backend: str
    steps: tuple[Step, ...] = ()
    runnable: bool = True
    note: str = ""
    manifest: str = ""  # a document for ``kubectl apply -f``, when the backend writes one
    # run once the first step has succeeded, whatever the others do: undoing a hold the first step put on, so a
    # failed change never leaves a job held
    always: tuple[Step, ...] = ()

    @property
    def commands(self) -> list[str]:
        return [s.text for s in (*self.steps, *self.always)]

    def describe(self) -> str:
        """The proposal as ``fleetfit apply`` prints it and the console shows it."""
        lines = [f"{'runs' if self.runnable else 'for its owner (not run)'}: {self.backend}"]
        if self.note:
            lines.append(f"  note: {self.note}")
        lines += [f"  $ {c}" for c in self.commands]
        if self.manifest:
            lines.append("  manifest (kubectl apply -f):")
            lines += [f"    {line}" for line in self.manifest.splitlines()]
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Result:
    rec_id: str
    backend: str
    status: Status
    commands: tuple[str, ...]
    output: str

    @property
    def answer(self) -> str:
        """The scheduler's words in one line (``answer_of``)."""
        return answer_of(self.output)


def answer_of(output: str) -> str:
    """The scheduler's words in one line, from a run's ``output``: for a failure, the last line the failing step
    printed (steps that undo it run after and print below it); else the last line of all."""
    lines = [line for line in output.splitlines() if line.strip()]
    for n, line in enumerate(lines):
        if line.startswith("failed (") and n > 0:
            return line if lines[n - 1].startswith("$ ") else lines[n - 1]
    return lines[-1] if lines else ""


@dataclass(frozen=True, slots=True)
class Options:
    """Opt-ins given on the command line, on top of the site's own settings."""

    requeue: bool = False  # a running Slurm job may be requeued
    cancel: bool = False  # an idle allocation may be cancelled


class Backend(Protocol):
    name: str

    def propose(self, rec: Recommendation, owner: str | None, options: Options) -> Proposal:
        """What carrying ``rec`` out would do (``owner``: its namespace or account, when known). Reads the
        scheduler where it must (a job's state) and never changes anything."""
        ...


def carry_out(proposal: Proposal) -> Result:
    """Run a proposal's steps in order, stopping at the first that fails; a proposal that is not runnable is only
    reported (``notified``)."""
    if not proposal.runnable:
        said = proposal.note or "not run"
        return Result(proposal.rec_id, proposal.backend, Status.NOTIFIED, tuple(proposal.commands), said)
    outputs: list[str] = []
    failed = False
    for n, step in enumerate(proposal.steps):
        failed = not _ran(step, outputs)
        if failed:
            if n > 0:
                for undo in proposal.always:
                    _ran(undo, outputs)
            break
    else:
        for undo in proposal.always:
            failed = not _ran(undo, outputs) or failed
    status = Status.FAILED if failed else Status.APPLIED
    return Result(proposal.rec_id, proposal.backend, status, tuple(proposal.commands), "\n".join(outputs))


def _ran(step: Step, outputs: list[str]) -> bool:
    """Run ``step``, add what it said to ``outputs``; whether it succeeded."""
    ran = step()
    outputs.append(f"$ {step.text}\n{ran.output}".rstrip())
    if not ran.ok:
        outputs.append(f"failed ({'no exit status' if ran.code is None else f'exit status {ran.code}'})")
    return ran.ok
