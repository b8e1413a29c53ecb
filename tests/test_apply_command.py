"""`fleetfit apply` on the command line: which actions it takes, what it refuses in one line, and what it records
(the Slurm backend's runs against a real Slurm are in tests/test_apply_slurm.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from apply_recs import k8s_move

from agent.protocol import Plan, Recommendation, SolverReport
from optimizer.act.runner import run
from optimizer.commands.cli import main
from optimizer.serve.lifecycle import Lifecycle, RecState


def rec(n: int, workload: str) -> Recommendation:
    return k8s_move(
        id=f"rec-{n}",
        workload=workload,
        workload_name="chat-7d9c5b6f4d-x2x4z" if workload.startswith("k8s/") else f"job {n}",
        monthly_savings_usd=1000.0 * n,
    )


def state(tmp_path: Path, site: str, recs: list[Recommendation], acknowledged: list[str]) -> Lifecycle:
    lifecycle = Lifecycle.in_state_dir(tmp_path)
    solver = SolverReport(status="OPTIMAL", objective=0, best_bound=0, gap=0, solve_seconds=0.1)
    lifecycle.record(Plan(site=site, generated_at=time.time(), solver=solver, recommendations=recs), {})
    for rec_id in acknowledged:
        lifecycle.set_state(rec_id, RecState.ACKNOWLEDGED)
    return lifecycle


KUBE = """[sites.eu-1]
scheduler = "kubernetes"
[sites.eu-1.kubernetes]
namespace = "ml"
products = {l40s = "NVIDIA-L40S"}  # by catalog key; the plan names it "L40S 48GB"
"""


def test_only_acknowledged_actions_are_taken(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A new action named on the command line is refused in one line and the exit status says so; the
    acknowledged one is proposed (deliberate bug caught: every open action taken, acknowledged or not)."""
    state(tmp_path, "eu-1", [rec(1, "k8s/a"), rec(2, "k8s/b")], ["rec-1"])
    config = tmp_path / "optimizer.toml"
    config.write_text(KUBE)
    code = main(["apply", "rec-1", "rec-2", "--config", str(config), "--state-dir", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 1
    assert "fleetfit: rec-2: new, not acknowledged (acknowledge it first: fleetfit recommendations ack rec-2)" in (
        captured.err
    )
    assert "rec-1 [eu-1]" in captured.out and "rec-2 [eu-1]" not in captured.out
    assert main(["apply", "--config", str(config), "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "rec-1 [eu-1]" in out and "rec-2" not in out


def test_kubernetes_dry_run_prints_patch_and_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without a kubeconfig the patch and the manifest are printed for the owner, and --execute records the action
    as notified, never applied; the site names its hardware by catalog key (deliberate bugs caught: a proposal with
    nothing to run recorded as applied; hardware looked up by the plan's name alone, which finds no product; the
    proposal made printable as one block, which turns its line breaks into U+FFFD)."""
    lifecycle = state(tmp_path, "eu-1", [rec(1, "k8s/a")], ["rec-1"])
    config = tmp_path / "optimizer.toml"
    config.write_text(KUBE)
    args = ["apply", "--config", str(config), "--state-dir", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "\n    $ kubectl -n ml patch deployments.apps chat --type=strategic -p " in out  # a line of its own
    assert '"nvidia.com/gpu.product": "NVIDIA-L40S"' in out
    assert main([*args, "--execute", "--no-post"]) == 0
    assert lifecycle.executions_of(["rec-1"])["rec-1"].status == "notified"


def test_a_site_without_a_scheduler_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An action of a site with no scheduler configured says which key to set and records nothing (deliberate bug
    caught: the site's settings looked up by the workload's name)."""
    lifecycle = state(tmp_path, "lab", [rec(1, "slurm/5")], ["rec-1"])
    config = tmp_path / "optimizer.toml"
    config.write_text(KUBE)
    assert main(["apply", "--execute", "--config", str(config), "--state-dir", str(tmp_path)]) == 0
    assert 'site lab names no scheduler ([sites.lab] scheduler = "slurm" or "kubernetes")' in capsys.readouterr().out
    assert lifecycle.executions_of(["rec-1"]) == {}


def test_backend_settings_must_match_the_scheduler(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Kubernetes settings under a Slurm site fail at start in one line naming the site (deliberate bug caught: the
    check dropped, which leaves the Kubernetes settings silently unused)."""
    state(tmp_path, "eu-1", [rec(1, "slurm/5")], ["rec-1"])
    config = tmp_path / "optimizer.toml"
    config.write_text(KUBE.replace('scheduler = "kubernetes"', 'scheduler = "slurm"'))
    assert main(["apply", "--config", str(config), "--state-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "sites.eu-1" in err and "[kubernetes] is set but scheduler is slurm" in err
    assert len(err.strip().splitlines()) == 1


def test_a_state_file_with_another_executions_table_is_set_aside(tmp_path: Path) -> None:
    """A state file whose executions table is not fleetfit's is moved aside by the daemon, as any foreign table,
    and the new one takes executions (deliberate bug caught: executions missing from the tables checked, which
    leaves every apply failing on the foreign table)."""
    import sqlite3

    from optimizer.serve.executions import Execution
    from optimizer.serve.lifecycle import DB_NAME

    db = sqlite3.connect(tmp_path / DB_NAME)
    db.execute("CREATE TABLE executions (id INTEGER PRIMARY KEY, job TEXT)")
    db.commit()
    db.close()
    lifecycle = Lifecycle.in_state_dir(tmp_path, repair=True)
    assert lifecycle.problem is not None and "executions lacks" in lifecycle.problem
    lifecycle.add_execution(Execution("rec-1", "eu-1", 1.0, "slurm", "applied", ("scancel 5",), "", "ops"))
    assert lifecycle.executions_of(["rec-1"])["rec-1"].commands == ("scancel 5",)


def test_a_result_the_state_file_cannot_keep_is_still_reported_and_nothing_more_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk when an execution is recorded: the scheduler's answer is still printed and posted, the exit
    status is 1, and the next acknowledged action is not run, since a later apply could not tell it was carried
    out (deliberate bug caught: the write's error ending the command before the answer is printed, which hides a
    change already made and leaves the results unposted)."""
    import sqlite3

    from apply_recs import slurm_move

    from optimizer.commands import apply

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ran = tmp_path / "ran"
    (bin_dir / "scancel").write_text(f'#!/bin/sh\necho "$@" >> {ran}\n')
    (bin_dir / "scancel").chmod(0o755)
    recs = [slurm_move(n, kind="reclaim", monthly_savings_usd=1000.0 * n) for n in (5, 6)]
    state(tmp_path, "hpc", recs, [r.id for r in recs])
    config = tmp_path / "optimizer.toml"
    config.write_text(
        f'[sites.hpc]\nscheduler = "slurm"\n[sites.hpc.slurm]\ncancel_idle = true\nbin_dir = "{bin_dir}"\n'
    )

    def full(self: Lifecycle, execution: object) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    posted: list[list[str]] = []
    monkeypatch.setattr(Lifecycle, "add_execution", full)
    monkeypatch.setattr(apply, "_post", lambda _, done: posted.append([d.result.rec_id for d in done]))
    code = main(["apply", "--execute", "--config", str(config), "--state-dir", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 1
    assert ran.read_text().split() == ["6"]  # the larger saving first; job 5 never cancelled
    assert "  applied: " in captured.out
    assert "database or disk is full: this result is not kept there; no further action is run" in captured.err
    assert posted == [["move-6"]]


def test_a_scheduler_command_gets_none_of_the_optimizers_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """FLEETFIT_* overrides hold the optimizer's secrets (docs/configuration.md); a scheduler command is run
    without them and with the rest of the environment (PATH, SLURM_CONF). Deliberate bug caught: the whole
    environment passed on."""
    monkeypatch.setenv("FLEETFIT_MQTT_PASSWORD", "s3cret")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    ran = run(["env"], timeout=10)
    assert ran.ok and "s3cret" not in ran.output and "FLEETFIT_" not in ran.output
    assert "SLURM_CONF=/etc/slurm/slurm.conf" in ran.output and "LC_ALL=C" in ran.output


def test_a_site_typed_wrong_is_a_usage_error_not_nothing_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A site neither configured nor ever planned is a typo: exit 2 naming the sites known; a known site with
    nothing acknowledged is still "nothing to do" (exit 0). Deliberate bug caught: every --site taken at its word,
    which said "no acknowledged actions in site eu1" and exited 0."""
    state(tmp_path, "eu-1", [rec(1, "k8s/a")], [])
    config = tmp_path / "optimizer.toml"
    config.write_text(KUBE)
    args = ["apply", "--config", str(config), "--state-dir", str(tmp_path), "--site"]
    assert main([*args, "eu1"]) == 2
    assert "fleetfit: no site eu1 (known: eu-1)" in capsys.readouterr().err
    assert main([*args, "eu-1"]) == 0
    assert "no acknowledged actions in site eu-1" in capsys.readouterr().out
