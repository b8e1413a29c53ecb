"""Slurm: a job read with ``squeue --json`` (or ``squeue -o`` where the JSON plugin is absent), a pending job
moved with ``scontrol update``, a running one requeued only with opt-in, an idle allocation cancelled only with
opt-in.

Slurm 22.05 cannot retype a pending job's typed GRES request: after ``scontrol update JobId=N Gres=gpu:l40s:1``
the controller keeps the old type and finds the job never runnable ("node lacks GRES", reason BadConstraints);
an untyped request (``--gres=gpu:1``) moves with its partition alone. A job that asked for the source's GPU type
by name is therefore left to its owner, with the commands to resubmit it."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.protocol import Recommendation
from optimizer.act.backend import Options, Proposal, Step
from optimizer.act.runner import MAX_OUTPUT, run
from optimizer.act.settings import SlurmSettings, pick
from optimizer.plan.render import kind_of

NAME = "slurm"
_JOB = re.compile(r"^slurm/(\d+(?:_\d+)?)$")
# a GPU request as squeue reports it: "gres:gpu:h100:1", "gres/gpu:2", "gpu:1"
_GPU = re.compile(r"(?:gres[:/])?gpu(?::([A-Za-z0-9_.-]+))?:(\d+)")
_FIELDS = ("%i", "%j", "%a", "%u", "%T", "%P", "%N", "%b")


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """A job as the scheduler knows it: the identity and owner it gives a workload."""

    id: str
    name: str
    account: str
    user: str
    state: str
    partition: str
    nodes: str
    gres: str  # the GPU request per node as squeue prints it ("gres:gpu:h100:1")

    @property
    def gpu_type(self) -> str | None:
        m = _GPU.search(self.gres)
        return m.group(1) if m else None

    @property
    def gpus(self) -> int:
        m = _GPU.search(self.gres)
        return int(m.group(2)) if m else 0


def _text(value: object) -> str:
    if isinstance(value, list):  # 23.02 and later give states as a list
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):  # numbers as {"set": true, "number": N} in later versions
        return str(value.get("number", ""))
    return "" if value is None or value == "(null)" else str(value)


def from_json(payload: dict[str, Any]) -> list[SlurmJob]:
    """Jobs from ``squeue --json`` (data_parser of Slurm 22.05 and later)."""
    out = []
    for j in payload.get("jobs", []):
        gres = _text(j.get("tres_per_node")) or _text(j.get("gres_detail"))
        out.append(
            SlurmJob(
                id=_text(j.get("job_id")),
                name=_text(j.get("name")),
                account=_text(j.get("account")),
                user=_text(j.get("user_name")),
                state=_text(j.get("job_state")),
                partition=_text(j.get("partition")),
                nodes=_text(j.get("nodes")),
                gres=gres,
            )
        )
    return out


def from_format(text: str) -> list[SlurmJob]:
    """Jobs from ``squeue -h -o '%i|%j|%a|%u|%T|%P|%N|%b'`` (where squeue has no JSON plugin)."""
    out = []
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) != len(_FIELDS):
            continue
        cells = ["" if c in ("(null)", "N/A") else c.strip() for c in cells]
        out.append(SlurmJob(*cells))
    return out


class Slurm:
    """The Slurm backend of one site."""

    name = NAME

    def __init__(self, settings: SlurmSettings) -> None:
        self.settings = settings
        self.env = {"SLURM_CONF": str(settings.slurm_conf)} if settings.slurm_conf else {}

    def _bin(self, program: str) -> str:
        return str(Path(self.settings.bin_dir) / program) if self.settings.bin_dir else program

    def jobs(self, job_ids: list[str] | None = None, running: bool = False) -> tuple[list[SlurmJob], str]:
        """Jobs squeue lists (those of ``job_ids``, when given; the running ones only, with ``running``) and, when
        it could not answer, why."""
        wanted = ["-j", ",".join(job_ids)] if job_ids else []
        wanted += ["-t", "RUNNING"] if running else []
        ran = run([self._bin("squeue"), "--json", *wanted], self.settings.timeout, self.env, limit=None)
        found: list[SlurmJob] | None = None
        if ran.ok:
            with contextlib.suppress(ValueError, AttributeError, TypeError):  # not JSON: the plain format instead
                found = from_json(json.loads(ran.output))
        if found is None:
            argv = [self._bin("squeue"), "-h", *wanted, "-o", "|".join(_FIELDS)]
            plain = run(argv, self.settings.timeout, self.env, limit=None)
            if not plain.ok:
                return [], (plain.output or ran.output)[-MAX_OUTPUT:]
            found = from_format(plain.output)
        # squeue 22.05's JSON output lists every state whatever -t asks for
        return [j for j in found if not running or "RUNNING" in j.state.split(",")], ""

    def _step(self, *argv: str) -> Step:
        full = (self._bin(argv[0]), *argv[1:])
        return Step(shlex.join(full), full, env=self.env, timeout=self.settings.timeout)

    def propose(self, rec: Recommendation, owner: str | None, options: Options) -> Proposal:
        m = _JOB.match(rec.workload)
        if m is None:
            return Proposal(rec.id, NAME, runnable=False, note=f"{rec.workload} is not a Slurm job")
        job_id = m.group(1)
        kind = kind_of(rec)
        if kind == "reclaim":
            cancel = self.settings.cancel_idle or options.cancel
            note = "" if cancel else "cancelling is opt-in (cancel_idle = true or --cancel): tell its owner"
            return Proposal(rec.id, NAME, (self._step("scancel", job_id),), runnable=cancel, note=note)
        jobs, problem = self.jobs([job_id])
        job = next((j for j in jobs if j.id == job_id), None)
        if job is None:
            said = problem.strip().splitlines()[-1] if problem.strip() else "not in the queue"
            return Proposal(rec.id, NAME, runnable=False, note=f"job {job_id}: {said}")
        partition = pick(self.settings.partitions, rec.to_hardware)
        if partition is None:
            known = ", ".join(sorted(self.settings.partitions)) or "none"
            note = f"no partition for {rec.to_hardware} in [sites.*.slurm] partitions (known: {known})"
            return Proposal(rec.id, NAME, runnable=False, note=note)
        change = [f"Partition={partition}"]
        if feature := pick(self.settings.features, rec.to_hardware):
            change.append(f"Features={feature}")
        if kind != "move":
            gpus = rec.gpus_after if rec.gpus_after is not None else rec.gpus
            note = (
                f"a {kind.replace('_', '-')} changes the job's GPU request: its owner resubmits it "
                f"(-p {partition} --gres=gpu:{max(1, round(gpus))})"
            )
            return Proposal(rec.id, NAME, (self._step("scontrol", "update", f"JobId={job_id}", *change),), False, note)
        target_type = pick(self.settings.gres_types, rec.to_hardware)
        if job.gpu_type is not None and job.gpu_type != target_type:
            gres = f"gpu:{target_type}:{job.gpus}" if target_type else f"gpu:{job.gpus}"
            note = (
                f"job {job_id} asks for GPU type {job.gpu_type} by name, which Slurm cannot change on a queued "
                f"job: its owner ({job.user or '?'}, account {job.account or '?'}) resubmits it with "
                f"-p {partition} --gres={gres}"
            )
            return Proposal(rec.id, NAME, runnable=False, note=note)
        update = self._step("scontrol", "update", f"JobId={job_id}", *change)
        if job.state == "PENDING":
            return Proposal(rec.id, NAME, (update,))
        if job.state == "RUNNING":
            steps = (self._step("scontrol", "requeuehold", job_id), update)
            release = (self._step("scontrol", "release", job_id),)
            if self.settings.requeue_running or options.requeue:
                return Proposal(rec.id, NAME, steps, always=release)
            note = (
                f"job {job_id} is running: requeueing restarts it (requeue_running = true or --requeue); "
                f"for its owner ({job.user or '?'})"
            )
            return Proposal(rec.id, NAME, steps, runnable=False, note=note, always=release)
        return Proposal(rec.id, NAME, runnable=False, note=f"job {job_id} is {job.state}: nothing to move")
