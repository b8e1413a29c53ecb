"""`fleetfit apply` through a real Slurm (Debian's slurmctld, slurmd and munge, 22.05): two one-node partitions,
h100 and l40s, each node with eight GPUs as GRES without device nodes, all started as root on free ports."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from apply_recs import slurm_move
from conftest import free_port

from agent.protocol import Plan, Recommendation, SolverReport
from optimizer.act.backend import Options, Status, carry_out
from optimizer.act.settings import SlurmSettings
from optimizer.act.slurm import Slurm, from_format
from optimizer.commands.cli import main
from optimizer.ingest.dcgm import SLURM_JOBS, Tally, workload_of
from optimizer.serve.audit import AuditLog
from optimizer.serve.lifecycle import DB_NAME, Lifecycle, RecState
from optimizer.serve.promfeed import slurm_jobs

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "scancel")
SBIN = ("/usr/sbin", "/usr/bin")


def _which(program: str) -> str | None:
    return shutil.which(program) or next((f"{d}/{program}" for d in SBIN if Path(d, program).exists()), None)


@dataclass
class Cluster:
    conf: Path
    env: dict[str, str]

    def run(self, *argv: str) -> str:
        done = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=20, check=False)
        assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
        return done.stdout.strip()

    def submit(self, *options: str) -> str:
        return self.run(
            "sbatch", "--parsable", "-J", "fleetfit-test", "-o", "/dev/null", *options, "--wrap", "sleep 60"
        )

    def job(self, job_id: str) -> tuple[str, str, str]:
        """(state, partition, nodes) as squeue says."""
        state, partition, nodes = [*self.run("squeue", "-h", "-j", job_id, "-o", "%T|%P|%N").split("|"), "", ""][:3]
        return state, partition, nodes

    def wait(self, job_id: str, state: str, timeout: float = 10.0) -> tuple[str, str, str]:
        deadline = time.monotonic() + timeout
        while (seen := self.job(job_id))[0] != state and time.monotonic() < deadline:
            time.sleep(0.2)
        return seen


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    missing = [p for p in PROGRAMS if _which(p) is None]
    if missing:
        pytest.skip(f"Slurm is not installed (no {', '.join(missing)}): apt-get install slurmctld slurmd munge")
    if os.geteuid() != 0:
        pytest.skip("slurmd runs jobs as their users and needs root")
    root = tmp_path_factory.mktemp("slurm")
    munge = root / "munge"
    munge.mkdir(mode=0o700)
    key = munge / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    socket = munge / "munge.socket"
    # Slurm 22.05 drops a GPU GRES without a File= from what slurmd reports, and the controller then marks the
    # node invalid ("gres/gpu count reported lower than configured"): each GPU is an empty file here.
    gpus = root / "gpus"
    gpus.mkdir()
    for n in range(8):
        (gpus / f"h100-{n}").touch()
        (gpus / f"l40s-{n}").touch()
    ctld, d1, d2 = free_port(), free_port(), free_port()
    conf = root / "slurm.conf"
    conf.write_text(
        f"""ClusterName=fleetfit
SlurmctldHost=localhost
SlurmctldPort={ctld}
SlurmdPort={d1}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
GresTypes=gpu
MpiDefault=none
ReturnToService=2
SchedulerParameters=sched_interval=1
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
NodeName=h100-1 NodeHostname=localhost NodeAddr=127.0.0.1 Port={d1} CPUs=2 RealMemory=1000 Gres=gpu:h100:8
NodeName=l40s-1 NodeHostname=localhost NodeAddr=127.0.0.1 Port={d2} CPUs=2 RealMemory=1000 Gres=gpu:l40s:8
PartitionName=h100 Nodes=h100-1 Default=YES State=UP
PartitionName=l40s Nodes=l40s-1 State=UP
"""
    )
    (root / "gres.conf").write_text(
        f"NodeName=h100-1 Name=gpu Type=h100 File={gpus}/h100-[0-7]\n"
        f"NodeName=l40s-1 Name=gpu Type=l40s File={gpus}/l40s-[0-7]\n"
    )
    (root / "state").mkdir()
    env = {**os.environ, "SLURM_CONF": str(conf)}
    log = (root / "daemons.log").open("w")
    procs = [
        subprocess.Popen(
            [_which("munged") or "munged", "-F", "--force", f"--socket={socket}", f"--key-file={key}",
             f"--log-file={root}/munged.log", f"--pid-file={munge}/munged.pid", f"--seed-file={munge}/seed"],
            stdout=log, stderr=subprocess.STDOUT,
        ),
    ]  # fmt: skip
    deadline = time.monotonic() + 5
    while not socket.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    procs.append(
        subprocess.Popen([_which("slurmctld") or "", "-D", "-i", "-f", str(conf)], env=env, stdout=log, stderr=log)
    )
    for node in ("h100-1", "l40s-1"):
        argv = [_which("slurmd") or "", "-D", "-N", node, "-f", str(conf)]
        procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
    cluster = Cluster(conf, env)
    try:
        deadline = time.monotonic() + 15
        states: list[str] = []
        while time.monotonic() < deadline:
            argv = ["sinfo", "-h", "-N", "-o", "%N=%t"]
            states = subprocess.run(argv, capture_output=True, text=True, env=env, check=False).stdout.split()
            if sorted(states) == ["h100-1=idle", "l40s-1=idle"]:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"Slurm nodes not idle in 15 s ({states}): {(root / 'slurmctld.log').read_text()[-2000:]}")
        yield cluster
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()


def settings(cluster: Cluster, **kw: object) -> SlurmSettings:
    fields: dict[str, object] = {
        "partitions": {"H100 80GB": "h100", "L40S 48GB": "l40s"},
        "gres_types": {"H100 80GB": "h100", "L40S 48GB": "l40s"},
        "slurm_conf": cluster.conf,
        "timeout": 10.0,
        **kw,
    }
    return SlurmSettings.model_validate(fields)


def move(job_id: str, kind: str = "move") -> Recommendation:
    return slurm_move(job_id, kind=kind)


def test_jobs_read_with_identity_owner_and_gpus(slurm: Cluster) -> None:
    """squeue --json and squeue -o both give a job's id, name, user, partition and GPUs (deliberate bug caught:
    the GPU count read from the GRES type's place, which gives none)."""
    job = slurm.submit("--hold", "-p", "h100", "--gres=gpu:h100:2")
    try:
        backend = Slurm(settings(slurm))
        jobs, problem = backend.jobs([job])
        assert problem == ""
        (seen,) = jobs
        assert (seen.id, seen.name, seen.user, seen.partition, seen.state) == (
            job, "fleetfit-test", "root", "h100", "PENDING",
        )  # fmt: skip
        assert (seen.gpu_type, seen.gpus) == ("h100", 2)
        plain = from_format(slurm.run("squeue", "-h", "-j", job, "-o", "%i|%j|%a|%u|%T|%P|%N|%b"))
        assert [(j.id, j.partition, j.gpus, j.gpu_type) for j in plain] == [(job, "h100", 2, "h100")]
    finally:
        slurm.run("scancel", job)


def test_agentless_jobs_get_their_name_and_account_from_squeue(slurm: Cluster) -> None:
    """A GPU dcgm-exporter labels with a job id alone is held by a workload named and owned as Slurm says; a held
    job holds nothing and is not read (deliberate bug caught: the account left out, so showback charges the job to
    nobody)."""
    running = slurm.submit("-p", "h100", "--gres=gpu:1", "-A", "team-nlp", "-J", "train-llama")
    held = slurm.submit("--hold", "-p", "h100", "--gres=gpu:1")
    try:
        assert slurm.wait(running, "RUNNING")[0] == "RUNNING"
        jobs = asyncio.run(slurm_jobs(settings(slurm))())
        assert set(jobs) == {running}
        key = workload_of({"hpc_job": running, "gpu": "0"}, {(SLURM_JOBS, j): m for j, m in jobs.items()}, Tally())
        assert key is not None
        assert (key.id, key.name, key.owner) == (f"slurm/{running}", "train-llama", "team-nlp")
        bare = workload_of({"hpc_job": held, "gpu": "1"}, {}, Tally())
        assert bare is not None and (bare.name, bare.owner) == (f"job {held}", None)
    finally:
        slurm.run("scancel", running, held)


def test_pending_job_moves_and_runs_on_the_target_partition(slurm: Cluster) -> None:
    """A held job's move updates its partition; released, it runs on the L40S node (deliberate bug caught: the
    partition of the source hardware named in the update, which leaves the job on h100)."""
    job = slurm.submit("--hold", "-p", "h100", "--gres=gpu:1")
    try:
        proposal = Slurm(settings(slurm)).propose(move(job), None, Options())
        assert proposal.runnable
        assert proposal.commands == [f"scontrol update JobId={job} Partition=l40s"]
        result = carry_out(proposal)
        assert result.status == Status.APPLIED, result.output
        slurm.run("scontrol", "release", job)
        assert slurm.wait(job, "RUNNING") == ("RUNNING", "l40s", "l40s-1")
    finally:
        slurm.run("scancel", job)


def test_running_job_is_moved_only_with_requeue(slurm: Cluster) -> None:
    """Without opt-in a running job's move is printed for its owner and the job runs on; with --requeue it is
    requeued into the target partition (deliberate bug caught: the opt-in check dropped, which requeues it)."""
    job = slurm.submit("-p", "h100", "--gres=gpu:1")
    try:
        assert slurm.wait(job, "RUNNING")[:2] == ("RUNNING", "h100")
        backend = Slurm(settings(slurm))
        proposal = backend.propose(move(job), None, Options())
        assert not proposal.runnable
        assert "requeue" in proposal.note
        assert proposal.commands[0] == f"scontrol requeuehold {job}"
        result = carry_out(proposal)
        assert result.status == Status.NOTIFIED
        assert slurm.job(job)[:2] == ("RUNNING", "h100")

        result = carry_out(backend.propose(move(job), None, Options(requeue=True)))
        assert result.status == Status.APPLIED, result.output
        # a requeued job is COMPLETING while its step ends, then waits out Slurm's begin time
        assert slurm.wait(job, "PENDING")[:2] == ("PENDING", "l40s")
    finally:
        slurm.run("scancel", job)


def test_a_failed_requeue_leaves_the_job_released(slurm: Cluster) -> None:
    """A requeue whose partition change Slurm refuses is recorded failed with Slurm's words, and the job is
    released again, not left held (deliberate bug caught: the release skipped after a failed update, which leaves
    the job held until someone notices)."""
    job = slurm.submit("-p", "h100", "--gres=gpu:1")
    try:
        assert slurm.wait(job, "RUNNING")[:2] == ("RUNNING", "h100")
        broken = settings(slurm, partitions={"L40S 48GB": "no-such-partition"})
        result = carry_out(Slurm(broken).propose(move(job), None, Options(requeue=True)))
        assert result.status == Status.FAILED
        assert "Invalid partition name specified" in result.answer
        assert f"$ scontrol release {job}" in result.output
        reason = slurm.run("squeue", "-h", "-j", job, "-o", "%r")
        assert "Held" not in reason
    finally:
        slurm.run("scancel", job)


def test_typed_gres_request_is_left_to_its_owner(slurm: Cluster) -> None:
    """A job that asked for H100s by GRES type is not retyped (Slurm 22.05 would then never run it); its owner
    is told how to resubmit (deliberate bug caught: the type check dropped, which updates the job into a state it
    never leaves)."""
    job = slurm.submit("--hold", "-p", "h100", "--gres=gpu:h100:1")
    try:
        proposal = Slurm(settings(slurm)).propose(move(job), None, Options())
        assert not proposal.runnable
        assert "--gres=gpu:l40s:1" in proposal.note
        assert carry_out(proposal).status == Status.NOTIFIED
        assert slurm.job(job)[1] == "h100"
    finally:
        slurm.run("scancel", job)


def test_fleetfit_apply_dry_run_then_execute(
    slurm: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fleetfit apply` prints the command and changes nothing; with --execute it moves the job, keeps the
    scheduler's answer in the state file and writes an audit entry (deliberate bug caught: a dry run that
    executes)."""
    job = slurm.submit("--hold", "-p", "h100", "--gres=gpu:1")
    try:
        rec = move(job)
        lifecycle = Lifecycle.in_state_dir(tmp_path)
        solver = SolverReport(status="OPTIMAL", objective=0, best_bound=0, gap=0, solve_seconds=0.1)
        lifecycle.record(Plan(site="eu-1", generated_at=time.time(), solver=solver, recommendations=[rec]), {})
        lifecycle.set_state(rec.id, RecState.ACKNOWLEDGED)
        config = tmp_path / "optimizer.toml"
        config.write_text(
            f'[sites.eu-1]\nscheduler = "slurm"\n[sites.eu-1.slurm]\nslurm_conf = "{slurm.conf}"\n'
            'partitions = {"L40S 48GB" = "l40s", "H100 80GB" = "h100"}\n'
        )
        args = ["apply", "--config", str(config), "--state-dir", str(tmp_path)]
        assert main(args) == 0
        out = capsys.readouterr().out
        assert f"$ scontrol update JobId={job} Partition=l40s" in out
        assert "dry run: nothing was changed" in out
        assert slurm.job(job)[1] == "h100"
        assert lifecycle.executions_of([rec.id]) == {}

        assert main([*args, "--execute", "--no-post"]) == 0
        assert slurm.job(job)[1] == "l40s"
        done = lifecycle.executions_of([rec.id])[rec.id]
        assert (done.status, done.backend, done.commands) == ("applied", "slurm", (
            f"scontrol update JobId={job} Partition=l40s",
        ))  # fmt: skip
        entries = AuditLog(tmp_path / DB_NAME).query(workload=rec.workload)
        assert [(e.action, e.target, e.result) for e in entries] == [("apply", rec.id, "applied")]
        assert lifecycle.get(rec.id).state == RecState.ACKNOWLEDGED  # type: ignore[union-attr]
    finally:
        slurm.run("scancel", job)


def test_command_failures_are_recorded_not_raised(tmp_path: Path) -> None:
    """A missing program and one that outlives its timeout come back as failed with what happened (deliberate
    bug caught: the timeout not passed to the command, which then hangs the apply)."""
    missing = SlurmSettings(bin_dir=tmp_path / "nowhere", cancel_idle=True)
    result = carry_out(Slurm(missing).propose(move("7", kind="reclaim"), None, Options()))
    assert result.status == Status.FAILED
    assert "not installed" in result.output
    slow = tmp_path / "bin"
    slow.mkdir()
    (slow / "scancel").write_text("#!/bin/sh\nsleep 30\n")
    (slow / "scancel").chmod(0o755)
    started = time.monotonic()
    result = carry_out(Slurm(SlurmSettings(bin_dir=slow, cancel_idle=True, timeout=0.5)).propose(
        move("7", kind="reclaim"), None, Options()
    ))  # fmt: skip
    assert time.monotonic() - started < 10
    assert result.status == Status.FAILED
    assert "stopped after 0.5 s" in result.output
    quiet = carry_out(Slurm(SlurmSettings(bin_dir=slow)).propose(move("7", kind="reclaim"), None, Options()))
    assert quiet.status == Status.NOTIFIED
    assert json.dumps(quiet.commands) == json.dumps([f"{slow}/scancel 7"])
