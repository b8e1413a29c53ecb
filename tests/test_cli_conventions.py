"""The command line's everyday conventions, run in-process: global options anywhere on the line, errors in the
product's words with an exit status that says whose mistake it was, a report that fits a terminal, what `plan
--add` added, a solver line that does not contradict itself, and an acknowledgement that can be taken back."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from agent.protocol import Plan, Recommendation, SolverReport, WorkloadClass
from optimizer.commands import cli
from optimizer.plan.render import render_table as render_plan
from optimizer.serve.lifecycle import Lifecycle, RecState
from optimizer.serve.report import Showback, render_csv, render_table

EXAMPLE_FLEET = Path(__file__).resolve().parent.parent / "docs" / "examples" / "fleet.json"


def test_global_options_work_before_and_after_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    """Deliberate bugs caught: --log-level known to the top parser only (`plan X --log-level debug` refused), or
    a command's own default overwriting the level given before the command."""
    parser = cli.build_parser()
    assert parser.parse_args(["plan", "x.json", "--log-level", "debug"]).log_level == "debug"
    assert parser.parse_args(["--log-level", "warning", "plan", "x.json"]).log_level == "warning"
    assert parser.parse_args(["plan", "x.json"]).log_level == "info"
    assert parser.parse_args(["import", "prometheus", "http://h", "--log-level", "error"]).log_level == "error"
    assert parser.parse_args(["alerts", "test", "--receiver", "r", "--log-level", "error"]).log_level == "error"
    with pytest.raises(SystemExit) as done:
        cli.main(["report", "--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("fleetfit ")


def _snapshot(tmp_path: Path, change: dict[str, object]) -> Path:
    fleet = json.loads(EXAMPLE_FLEET.read_text())
    node = fleet["nodes"][0] | change.get("node", {})
    fleet["nodes"][0] = node
    if "workload_nodes" in change:
        fleet["workloads"][0]["nodes"] = change["workload_nodes"]
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(fleet))
    return path


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"node": {"gpus": "eight"}}, "nodes.0.gpus: expected a whole number"),
        ({"node": {"gpus": 0}}, "nodes.0.gpus: must be at least 1"),
        ({"workload_nodes": ["nowhere"]}, "runs on unknown node nowhere"),
    ],
    ids=["not-a-number", "out-of-range", "cross-check"],
)
def test_a_bad_snapshot_is_refused_in_the_products_words_with_status_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, object], said: str
) -> None:
    """Deliberate bug caught: pydantic's message passed through ("Input should be greater than or equal to 1",
    "Value error, workload …"), or a bad file exiting 2 like a bad option."""
    path = _snapshot(tmp_path, change)
    assert cli.main(["plan", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"fleetfit: {path}: ") and said in err
    assert "Value error" not in err and "Input should" not in err


def test_usage_errors_exit_2_and_a_missing_file_1_without_errno(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Deliberate bugs caught: `[Errno 2] No such file or directory: '…'` in the line, a bad --add value
    (the command line) exiting 1, or a missing catalog (what it read) exiting 2."""
    assert cli.main(["plan", str(EXAMPLE_FLEET), "--catalog", str(tmp_path / "none.toml")]) == 1
    err = capsys.readouterr().err
    assert "[Errno" not in err and "No such file or directory" in err and err.count("\n") == 1
    assert cli.main(["plan", str(EXAMPLE_FLEET), "--add", "l40s x8"]) == 2
    assert "--add 'l40s x8': expected TYPE xGPUS = NODES" in capsys.readouterr().err
    assert cli.main(["report", "--since", "yesterday", "--state-dir", str(tmp_path)]) == 2


def _rows() -> list[Showback]:
    kinds = ["serving_on_training_hardware", "training_without_nvlink", "idle_allocation", "oversized_gpu_memory"]
    return [
        Showback(
            key=f"team-{n}",
            gpus={"training": 1200.0 * n, "inference": 900.5, "batch_inference": 33.0, "interactive": 12.0},
            held_usd=123_456.78 * n,
            wasted_usd={k: 1_000.0 * (i + 1) * n for i, k in enumerate(kinds)},
            open_savings_usd_month=45_678.0,
            workloads=40 * n,
        )
        for n in (1, 2, 3)
    ]


def test_report_table_fits_120_columns_with_short_headers_and_wide_shows_all() -> None:
    """Every class and four finding kinds with money in them: the default table stays within 120 columns, its
    headers are words ("TRAIN GPU-h", "IDLE $"), not enum names, and it says what it left out; --wide has every
    column. Deliberate bugs caught: one column per enum member, headed by its name (~260 columns), or --wide
    cutting columns too."""
    table = render_table(_rows(), "owner").splitlines()
    assert max(len(line) for line in table) <= 120
    head = table[0]
    assert head.startswith("OWNER") and "TRAIN GPU-h" in head and "SAVINGS $/MONTH" in head
    assert "_" not in head and "INFERENCE" not in head.replace("INFER GPU-h", "")
    assert table[-1].startswith("(left out to fit 120 columns: ") and "--wide" in table[-1]
    wide = render_table(_rows(), "owner", wide=True).splitlines()
    for header in ("IDLE $", "NO-NVLINK $", "SERVE-ON-TRAIN $", "OVERSIZED $", "BATCH GPU-h", "UNKNOWN GPU-h"):
        assert header in wide[0]
    assert len(wide) == 4 and max(len(line) for line in wide) > 120
    # nothing in a column: left out, even where it would fit
    small = render_table([Showback("solo", {"training": 2.0}, 10.0, {"idle_allocation": 0.0})], "site")
    assert small.splitlines()[0].split() == ["SITE", "WORKLOADS", "TRAIN", "GPU-h", "HELD", "$", "WASTED", "$",
                                             "SAVINGS", "$/MONTH"]  # fmt: skip
    # CSV keeps the protocol's names and every column
    columns = next(csv.reader(io.StringIO(render_csv(_rows(), "owner"))))
    assert columns[:3] == ["owner", "workloads", "gpu_hours_training"] and "wasted_usd_idle_allocation" in columns


def test_plan_add_names_the_nodes_it_added(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Deliberate bug caught: the added nodes never named, so a reader cannot tell new-l40s-001 from a real node
    (the table) or must guess which nodes were added (JSON)."""
    base = ["plan", str(EXAMPLE_FLEET), "--add", "l40s x8 = 2", "--no-buy", "--time-limit", "2"]
    assert cli.main(base) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == "added for this plan: 2 node(s) of 8 × L40S 48GB (new-l40s-001, new-l40s-002)"
    assert cli.main([*base, "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [n["name"] for n in out["added_nodes"]] == ["new-l40s-001", "new-l40s-002"]
    assert Plan.model_validate(out["plan"]).site == "eu-1"  # the plan beside them is still a protocol plan


def _plan(status: str, objective: float, bound: float) -> Plan:
    gap = abs(objective - bound) / objective
    solver = SolverReport(status=status, objective=objective, best_bound=bound, gap=gap, solve_seconds=1.5)
    return Plan(site="lab", generated_at=1.7e9, solver=solver)


def test_the_solver_line_never_calls_an_optimal_plan_a_gap() -> None:
    """OPTIMAL is proven: its cost sits above CP-SAT's bound only by the credit for keeping the last plan's actions
    (optimizer/plan/model.py adds it back). Deliberate bug caught: "OPTIMAL, …, gap 2.25 %"."""
    line = next(x for x in render_plan(_plan("OPTIMAL", 10_000.0, 9_775.0)).splitlines() if x.startswith("solver"))
    assert "gap" not in line and "%" not in line and "proven the cheapest" in line
    assert "cost $10,000 (a month's running cost plus the moves' one-off costs)" in line
    assert "$9,775, takes off a $225 credit for keeping the last plan's open actions" in line
    stopped = render_plan(_plan("FEASIBLE", 10_000.0, 9_775.0))
    assert "at most 2.25% above the least any placement could cost ($9,775" in stopped


def _recommendation() -> Recommendation:
    return Recommendation(
        id="rec-0001", workload="k8s/w1", workload_name="w1", workload_class=WorkloadClass.INFERENCE,
        confidence=0.9, gpus=1, from_node="h100-1", from_hardware="H100", to_node="l40s-1", to_hardware="L40S",
        monthly_savings_usd=1_000.0, reason="inference on training hardware", performance_impact="none",
        risk="low", evidence=[],
    )  # fmt: skip


def test_an_acknowledgement_made_by_mistake_is_reopened(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`recommendations reopen ID` takes an acknowledged action back to new, recorded as a decision. Deliberate
    bug caught: the lifecycle letting only a dismissed action be reopened ("is acknowledged; it cannot become
    new"), so the only undo was to dismiss it, which blocks every action that waits for it."""
    solver = SolverReport(status="OPTIMAL", objective=0, best_bound=0, gap=0, solve_seconds=0.1)
    life = Lifecycle.in_state_dir(tmp_path)
    life.record(Plan(site="lab", generated_at=1.7e9, solver=solver, recommendations=[_recommendation()]), {})
    base = ["recommendations", "--state-dir", str(tmp_path)]
    assert cli.main([*base, "ack", "rec-0001"]) == 0
    assert cli.main([*base, "reopen", "rec-0001"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "rec-0001 new"
    tracked = life.get("rec-0001")
    assert tracked is not None and tracked.state is RecState.NEW
    assert [(rec_id, state) for rec_id, state, _, _ in life.decisions("lab", 10)] == [("rec-0001", RecState.NEW)]
    life.close()


def test_a_plans_text_shows_no_terminal_escape_or_forged_line_from_a_name() -> None:
    """A snapshot or agent names a workload with a terminal escape (set the window title, clear the screen) and a
    line break followed by a forged action: `fleetfit plan` prints neither, in the findings or the actions (each
    control character shown as U+FFFD). Deliberate bug: render_table joining its lines unfiltered, as it did."""
    from agent.protocol import Finding, FindingKind

    evil = "w1\x1b]0;pwned\x07\x1b[2J\n    9. move everything to /dev/null"
    solver = SolverReport(status="OPTIMAL", objective=0, best_bound=0, gap=0, solve_seconds=0.1)
    finding = Finding(
        workload="k8s/w1", workload_name=evil, kind=FindingKind.SERVING_ON_TRAINING_HARDWARE, hardware="H100",
        nodes=["h100-1"], wasted_usd_per_hour=10.0, confidence=0.9, detail="inference at 24 %",
    )  # fmt: skip
    rec = _recommendation().model_copy(update={"workload_name": evil})
    plan = Plan(site="eu-1", generated_at=0.0, solver=solver, recommendations=[rec], findings=[finding])
    text = render_plan(plan)
    assert not any(c in text for c in "\x1b\x07")
    assert not any(line.lstrip().startswith("9. move everything") for line in text.splitlines())
    assert text.count("w1\N{REPLACEMENT CHARACTER}]0;pwned") == 2  # the finding and the action, each on its line
