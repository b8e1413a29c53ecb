"""Owners from attribution to showback: what the agent reads cheaply on the node, the protocol's optional
fields, the simulator's namespaces, the ledger every plan charges, and `fleetfit report`."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import subprocess
from pathlib import Path

import pytest
from conftest import FLEET_PREFIX, FLEETFIT, free_port, simulated_fleet
from pydantic import ValidationError

from agent.config import MqttSettings
from agent.protocol import TopicKind, WorkloadKind, WorkloadRef, encode, node_topic
from agent.simulate import offline_windows
from collectors.attribution import Attributor, OwnerReader, SlurmJobs
from collectors.sim.scenarios import build_scenario
from optimizer.decide.catalog import load_catalog
from optimizer.ingest.fleet import Fleet
from optimizer.serve.config import OptimizerConfig, OptimizerSettings
from optimizer.serve.lifecycle import Lifecycle
from optimizer.serve.report import (
    CLAIMED,
    UNATTRIBUTED,
    Ledger,
    live_showback,
    nodes_online,
    owners_of,
    parse_since,
    site_owners,
)
from optimizer.serve.service import Optimizer

UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def _proc(root: Path, pid: int, cgroup: str, environ: bytes = b"", uid: int = 0) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cgroup").write_text(f"0::{cgroup}\n")
    (d / "comm").write_text("python3\n")
    (d / "environ").write_bytes(environ)
    (d / "status").write_text(f"Name:\tpython3\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")


def test_owner_reader_finds_namespace_account_user_and_unit(tmp_path: Path) -> None:
    proc, pods = tmp_path / "proc", tmp_path / "pods"
    (pods / f"ml-research_trainer-7c9f_{UID}").mkdir(parents=True)
    (pods / "kube-system_coredns-1_not-a-uid").mkdir()
    _proc(proc, 10, f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-abc.scope")
    _proc(
        proc,
        11,
        "/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0",
        b"HOME=/home/ada\0SLURM_JOB_ACCOUNT=physics\0SLURM_JOB_USER=ada\0PATH=/bin\0",
    )
    _proc(proc, 12, "/system.slice/vllm-chat.service")
    _proc(proc, 13, "/user.slice/user-1000.slice/session-3.scope")
    _proc(proc, 14, "/system.slice/slurmstepd.scope/job_4243/step_0", b"SLURM_JOB_ACCOUNT=evil\x1b[2J\0")
    attributor, owners = Attributor(proc, node="n1"), OwnerReader(proc, pods, slurm=SlurmJobs(scontrol=""))
    assert owners.of(10, attributor.owner(10)) == ("ml-research", None, None)
    # no scheduler to ask: the account is the job's own claim; the user is the process's uid, not SLURM_JOB_USER
    assert owners.of(11, attributor.owner(11)) == ("physics", "root", True)
    assert owners.of(12, attributor.owner(12)) == ("vllm-chat.service", None, None)
    assert owners.of(13, attributor.owner(13)) == (None, None, None)
    assert owners.of(14, attributor.owner(14)) == ("evil[2J", "root", True)  # control characters never leave
    # a pod whose log directory is gone, or a node without /var/log/pods: no namespace, no failure
    assert OwnerReader(proc, tmp_path / "absent").of(10, attributor.owner(10)) == (None, None, None)


def test_owner_fields_are_optional_and_printable() -> None:
    ref = WorkloadRef(id="slurm/1", kind=WorkloadKind.SLURM_JOB, name="job 1", gpus=[0], owner="physics")
    assert WorkloadRef.model_validate_json(ref.model_dump_json()).owner == "physics"
    # a schema-1 agent sends none
    old = WorkloadRef.model_validate({"id": "k8s/x", "kind": "k8s_pod", "name": "x", "gpus": [0]})
    assert old.owner is None and old.owner_user is None
    with pytest.raises(ValidationError):
        WorkloadRef(id="k8s/x", kind=WorkloadKind.KUBERNETES_POD, name="x", gpus=[0], owner="team\n@channel")


def test_simulated_workloads_carry_their_team() -> None:
    fleet, _ = simulated_fleet("demo", 8, windows=2)
    owners = owners_of(fleet)
    assert len(owners) == 7 and UNATTRIBUTED not in owners.values()
    names = {ref.id: ref.name for r in fleet.nodes.values() for ref in r.windows[-1].workloads}
    by_name = {names[w]: o for w, o in owners.items()}
    assert by_name["llm-pretrain"] == "team-research" and by_name["chat-serving"] == "team-serving"
    assert by_name["forgotten-notebook-alloc"] == "team-data-science"


def test_an_owner_that_changes_is_charged_as_the_latest_window_says() -> None:
    """A workload's owner can change while it runs (a namespace label set, a Slurm account resolved by the
    scheduler rather than claimed): showback follows the node's latest window, not the first one it saw."""
    node = build_scenario("demo", 8, 1)[0]
    birth, windows = offline_windows(node, 3, site="s1")
    fleet = Fleet(FLEET_PREFIX)
    assert fleet.ingest(node_topic(FLEET_PREFIX, "s1", node.name, TopicKind.BIRTH), encode(birth))
    first = windows[0].workloads[0]
    changes = [{"owner": None}, {"owner": "team-a", "owner_claimed": True}, {"owner": "team-a", "owner_claimed": False}]
    seen = []
    for w, change in zip(windows, changes, strict=True):
        refs = [first.model_copy(update=change), *w.workloads[1:]]
        sent = w.model_copy(update={"workloads": refs})
        assert fleet.ingest(node_topic(FLEET_PREFIX, "s1", node.name, TopicKind.TELEMETRY), encode(sent))
        seen.append(owners_of(fleet)[first.id])
    assert seen == [UNATTRIBUTED, "team-a" + CLAIMED, "team-a"]


async def _planned(state_dir: Path, rounds: int) -> Optimizer:
    fleet, _ = simulated_fleet("demo", 8, windows=8)
    config = OptimizerConfig(
        mqtt=MqttSettings(port=free_port()), optimizer=OptimizerSettings(state_dir=state_dir, solve_interval=60)
    )
    optimizer = Optimizer(config, load_catalog(), lifecycle=Lifecycle.in_state_dir(state_dir))
    optimizer.fleet = fleet
    for _ in range(rounds):
        await optimizer.plan_once()
    return optimizer


def _report(state_dir: Path, *args: str) -> str:
    result = subprocess.run(
        [FLEETFIT, "report", "--state-dir", str(state_dir), *args], capture_output=True, timeout=60, check=True
    )
    return result.stdout.decode()


def test_report_sums_gpu_hours_money_and_savings_per_owner(tmp_path: Path) -> None:
    optimizer = asyncio.run(_planned(tmp_path, rounds=2))
    plan = optimizer.plans["s1"]
    assert optimizer.tracker is not None  # its writes were awaited: they are committed
    rows = {r["key"]: r for r in json.loads(_report(tmp_path, "--format", "json", "--since", "1d"))["rows"]}
    assert {"team-research", "team-serving", "team-data-science"} <= set(rows)
    # two plans, each charged one 60 s solve interval (the second came at once, so it charged ~0 s)
    research = rows["team-research"]
    assert research["gpus_by_class"]["training"] == pytest.approx(12 * 60 / 3600, rel=0.05)
    idle = rows["team-data-science"]
    assert idle["wasted_usd_by_kind"]["idle_allocation"] == pytest.approx(6.0 * 60 / 3600, rel=0.05)
    assert idle["held_usd"] == pytest.approx(4 * 1.5 * 60 / 3600, rel=0.05)
    # open savings per owner are the open recommendations of its workloads
    assert sum(r["open_savings_usd_month"] for r in rows.values()) == pytest.approx(plan.monthly_savings_usd, abs=1)
    training = next(r for r in plan.recommendations if r.workload_name == "vision-finetune-ddp")
    assert rows["team-research"]["open_savings_usd_month"] == pytest.approx(training.monthly_savings_usd, abs=1)
    # chat-serving is the serving team's misplacement, but no card of the site carries its load: nothing open
    assert not [r for r in plan.recommendations if r.workload_name == "chat-serving"]
    assert rows["team-serving"]["open_savings_usd_month"] == 0

    lines = _report(tmp_path, "--by", "hardware").splitlines()
    assert lines[1].startswith("HARDWARE") and any(line.startswith("H100 80GB SXM") for line in lines)
    table = [line for line in lines[1:] if not line.startswith("(left out")]  # a note on what fitting cut
    assert len({len(line) for line in table}) == 1  # every row as wide as the header: columns line up
    csv_rows = list(csv.DictReader(io.StringIO(_report(tmp_path, "--by", "site", "--format", "csv"))))
    assert [r["site"] for r in csv_rows] == ["s1"] and float(csv_rows[0]["gpu_hours_training"]) > 0


def test_report_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    for args, words, code in (
        (["--since", "yesterday"], b"--since 'yesterday'", 2),  # the command line: a usage error
        (["--state-dir", str(tmp_path / "none")], b"no showback yet", 1),  # what it read: a data error
    ):
        result = subprocess.run(
            [FLEETFIT, "report", "--state-dir", str(tmp_path / "none"), *args],
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == code and words in result.stderr and len(result.stderr.splitlines()) == 1


def test_ledger_does_not_charge_the_time_the_optimizer_was_down(tmp_path: Path) -> None:
    optimizer = asyncio.run(_planned(tmp_path / "state", rounds=1))
    plan = optimizer.plans["s1"]
    ledger = Ledger(tmp_path / "other.db")
    owners = owners_of(optimizer.fleet)
    assert ledger.account(plan, owners, optimizer.catalog, 60, now=1000.0) == 60
    assert ledger.account(plan, owners, optimizer.catalog, 60, now=1030.0) == 30
    assert ledger.account(plan, owners, optimizer.catalog, 60, now=90_000.0) == 180  # a day down: three intervals
    assert parse_since("2d", now=200_000.0) == 200_000.0 - 2 * 86400
    assert parse_since("1970-01-03") == 2 * 86400  # a date is midnight UTC


def test_report_posts_a_digest_to_each_kind_of_receiver(tmp_path: Path) -> None:
    from webhook_server import webhook_server

    optimizer = asyncio.run(_planned(tmp_path / "state", rounds=1))
    plan = optimizer.plans["s1"]
    # an owner name chosen to abuse chat markup: it must arrive inert
    evil = "<!channel> @here [click](http://evil.example) `x`"
    ledger = Ledger(tmp_path / "state" / "fleetfit.db")
    owners = dict.fromkeys(owners_of(optimizer.fleet), evil)
    ledger.account(plan, owners, optimizer.catalog, 3600)
    ledger.close()
    config = tmp_path / "optimizer.toml"
    kinds = ("slack", "mattermost", "teams", "generic")
    config.write_text(
        f'[optimizer]\nstate_dir = "{tmp_path / "state"}"\n'
        + "".join(
            f'[[alerts.receivers]]\nname = "{k}-chat"\nkind = "{k}"\nurl_env = "HOOK_{k.upper()}"\n' for k in kinds
        )
    )
    with webhook_server() as hooks:
        env = {"PATH": "/usr/bin:/bin"} | {f"HOOK_{k.upper()}": hooks.url(f"/{k}/s3cr3t") for k in kinds}
        for k in kinds:
            result = subprocess.run(
                [FLEETFIT, "report", "--config", str(config), "--since", "7d", "--post", f"{k}-chat"],
                capture_output=True,
                text=True,
                timeout=60,
                env=env,
                check=False,
            )
            assert result.returncode == 0, result.stderr
            assert f"to {k}-chat" in result.stdout and "s3cr3t" not in result.stdout + result.stderr
        bodies = {r.path.split("/")[1]: r.json() for r in hooks.wait_for(4)}
    slack = json.dumps(bodies["slack"])
    assert bodies["slack"]["blocks"][0]["type"] == "header" and "team-research" in slack
    assert "<!channel>" not in slack and "@here" not in slack and "[click](" not in slack
    mattermost = bodies["mattermost"]["text"]
    assert "@here" not in mattermost and "](http" not in mattermost and mattermost.count("```") == 2
    facts = bodies["teams"]["attachments"][0]["content"]["body"][2]["facts"]
    assert {f["title"] for f in facts} >= {"team-research", "team-serving"}
    assert all("[" not in f["title"] and "@" not in f["title"] for f in facts)
    generic = bodies["generic"]
    assert generic["kind"] == "fleetfit.showback" and evil in {r["key"] for r in generic["rows"]}  # data, as is


def test_report_post_refuses_an_unknown_receiver_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [FLEETFIT, "report", "--state-dir", str(tmp_path), "--post", "nobody"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2 and "no receiver 'nobody'" in result.stderr and result.stderr.count("\n") == 1


def test_digest_fits_each_platform_by_listing_fewer_owners() -> None:
    from optimizer.serve.report import Showback
    from optimizer.serve.report_chat import render

    rows = [
        Showback(f"team-{n:03d}-&-<x>", {"training": 100.0 * n}, 2.5 * n, {"idle_allocation": n}) for n in range(300)
    ]
    for kind in ("slack", "mattermost", "teams", "generic"):
        body = render(kind, rows, "owner", 0.0, 4000, now=86400.0)
        assert len(body) <= 4000, kind
        text = body.decode()
        assert "more" in text or '"omitted"' in text, kind
    slack = json.loads(render("slack", rows, "owner", 0.0, 40_000, now=86400.0))
    section = slack["blocks"][1]["text"]["text"]
    assert len(section) <= 3000 and "&amp;" not in section  # names are plain: nothing to escape, nothing cut


def test_offline_nodes_stop_accruing_showback(tmp_path: Path) -> None:
    """A node gone offline is charged nothing: with one node offline its workloads' GPU-hours stop, and once every
    agent has stopped neither GPU-hours, money nor covered time grow. Deliberate bug caught: the ledger charging
    every workload of the last plan, whatever its nodes' state (covered time kept growing with every agent down)."""
    optimizer = asyncio.run(_planned(tmp_path / "state", rounds=1))
    plan, catalog = optimizer.plans["s1"], optimizer.catalog
    ledger = Ledger(tmp_path / "other.db")
    owners = owners_of(optimizer.fleet)
    online = nodes_online(optimizer.fleet, "s1")
    assert online and all(online.values())
    assert ledger.account(plan, owners, catalog, 60, now=3600.0, online=online) == 60
    first = sum(r.held_usd for r in ledger.report(0.0))
    # one node offline: 60 s more of every workload but those on it alone
    node = next(w.nodes[0] for w in plan.workloads if len(w.nodes) == 1 and w.gpus > 0)
    kept = [w for w in plan.workloads if node not in w.nodes]
    price = {g.name: g.price_per_gpu_hour for g in catalog.gpu}
    expected = sum(w.gpus * price[w.hardware] for w in kept) * 60 / 3600
    assert len(kept) < len(plan.workloads)
    ledger.account(plan, owners, catalog, 60, now=3660.0, online={**online, ("s1", node): False})
    second = sum(r.held_usd for r in ledger.report(0.0))
    assert second - first == pytest.approx(expected, abs=0.01)
    # every agent stopped: nothing more, the covered time included
    gone = dict.fromkeys(online, False)
    assert ledger.account(plan, owners, catalog, 60, now=3720.0, online=gone) == 0
    assert ledger.account(plan, owners, catalog, 60, now=3780.0, online=gone) == 0
    assert sum(r.held_usd for r in ledger.report(0.0)) == pytest.approx(second, abs=1e-9)
    assert ledger.covered(0.0) == 120
    # the live view per owner holds nothing for an offline node's workloads either, and says they are offline
    rows = live_showback([plan], site_owners(optimizer.fleet), catalog, set(), "owner", online=gone)
    assert rows and all(r.workloads == r.offline > 0 and r.held_usd == 0 and not r.gpus for r in rows)


def test_a_report_since_minutes_counts_the_workloads_it_charges(tmp_path: Path) -> None:
    """`report --since 5m` sums the usage of the hour it falls in (the ledger is kept by the hour), and counts the
    workloads charged in that same hour. Deliberate bug caught: workloads counted since the exact minute (0 of them
    when the last plan came 10 minutes ago) beside the hour's GPU-hours."""
    optimizer = asyncio.run(_planned(tmp_path / "state", rounds=1))
    plan = optimizer.plans["s1"]
    ledger = Ledger(tmp_path / "other.db")
    owners = owners_of(optimizer.fleet)
    ledger.account(plan, owners, optimizer.catalog, 60, now=7200.0 + 1200)  # 02:20
    rows = {r.key: r for r in ledger.report(since=7200.0 + 1800)}  # asked at 02:35 for the last 5 minutes
    for owner in {owners.get(w.id, UNATTRIBUTED) for w in plan.workloads}:
        charged = [w for w in plan.workloads if owners.get(w.id, UNATTRIBUTED) == owner]
        assert rows[owner].workloads == len(charged) > 0
        assert sum(rows[owner].gpus.values()) == pytest.approx(sum(w.gpus for w in charged) / 60, rel=1e-6)
