"""Plans for people (an aligned text table) and for programs (the protocol's JSON); safe cells for CSV."""

from __future__ import annotations

import json
import re

from agent.protocol import Plan

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def printable(text: str) -> str:
    """``text`` with control characters (terminal escapes, NUL, newlines) shown as U+FFFD."""
    return _CONTROL.sub("\N{REPLACEMENT CHARACTER}", text)


def csv_cell(value: object) -> object:
    """A CSV cell no spreadsheet runs as a formula: text starting with ``= + - @`` or a tab or CR gets a leading
    ``'`` (OWASP's advice); control characters are replaced. Numbers stay numbers."""
    if not isinstance(value, str):
        return value
    if value.startswith(FORMULA_STARTS):
        value = "'" + value
    return printable(value)


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line.rstrip()]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return out


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def render_table(plan: Plan) -> str:
    lines = [f"site {plan.site}: {len(plan.workloads)} workload(s), {len(plan.recommendations)} recommended move(s)"]
    rows = [
        [
            _short(w.name, 28),
            w.workload_class.value,
            f"{w.confidence:.2f}",
            _short(",".join(w.nodes), 24),
            _short(w.hardware, 22),
            str(w.gpus),
            f"{w.mean_util:.0f}%",
        ]
        for w in sorted(plan.workloads, key=lambda v: (v.nodes, v.name))
    ]
    lines += _table(["WORKLOAD", "CLASS", "CONF", "NODES", "HARDWARE", "GPUS", "UTIL"], rows)
    if plan.findings:
        waste = sum(f.wasted_usd_per_hour for f in plan.findings)
        lines.append("")
        lines.append(f"misplacements, wasting ${waste:,.2f}/hour:")
        for f in plan.findings:
            lines.append(
                f"  {f.workload_name} on {','.join(f.nodes)} [{f.hardware}]: {f.kind.value.replace('_', ' ')}, "
                f"${f.wasted_usd_per_hour:,.2f}/hour ({f.detail})"
            )
    if plan.recommendations:
        lines.append("")
        lines.append(f"recommended moves, saving ${plan.monthly_savings_usd:,.0f}/month:")
        for r in plan.recommendations:
            lines.append(
                f"  {r.workload_name} ({r.workload_class.value}, {r.gpus} GPU): "
                f"{r.from_node} [{r.from_hardware}] -> {r.to_node} [{r.to_hardware}]  "
                f"${r.monthly_savings_usd:,.0f}/month"
            )
            lines.append(f"      why: {r.reason}")
            lines.append(f"      impact: {r.performance_impact}; risk {r.risk}")
    else:
        lines.append("")
        lines.append("no moves recommended")
    if plan.blocked:
        lines.append("")
        lines.append("not moved:")
        for b in plan.blocked:
            lines.append(
                f"  {b.workload_name} on {b.node} [{b.hardware}]: {b.reason} "
                f"(would save ${b.monthly_savings_usd:,.0f}/month)"
            )
    s = plan.solver
    lines.append(
        f"solver: {s.status}, objective ${s.objective:,.0f}, bound ${s.best_bound:,.0f}, "
        f"gap {s.gap:.2%}, {s.solve_seconds:.2f} s"
    )
    return "\n".join(lines)


def render_json(plan: Plan) -> str:
    return json.dumps(plan.model_dump(mode="json", by_alias=True), indent=2)
