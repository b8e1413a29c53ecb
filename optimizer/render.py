"""Plans for people (an aligned text table) and for programs (the protocol's JSON); safe cells for CSV."""

from __future__ import annotations

import json
import re

from agent.protocol import Plan, Purchase, Recommendation

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


def render_table(plan: Plan, every_answer: bool = False) -> str:
    """The plan in words; with ``every_answer`` (``fleetfit plan --buy``) the purchase section is there even when
    it says nothing is worth buying or that there was no time to answer."""
    lines = [f"site {plan.site}: {len(plan.workloads)} workload(s), {len(plan.recommendations)} recommended action(s)"]
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
        waves = max((r.wave or 1 for r in plan.recommendations), default=1)
        lines.append(
            f"recommended actions, saving ${plan.monthly_savings_usd:,.0f}/month, in {waves} wave(s) "
            "(a wave's actions run in parallel):"
        )
        lines += _actions(plan)
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
    if plan.purchases or every_answer:
        lines.append("")
        lines.append(render_purchases(plan.purchases))
    s = plan.solver
    lines.append(
        f"solver: {s.status}, objective ${s.objective:,.0f}, bound ${s.best_bound:,.0f}, "
        f"gap {s.gap:.2%}, {s.solve_seconds:.2f} s"
    )
    if s.savings_usd is not None and s.bound_savings_usd is not None:
        share = s.savings_usd / s.bound_savings_usd if s.bound_savings_usd > 0 else 1.0
        lines.append(
            f"moves and resizing save ${s.savings_usd:,.0f}/month; no plan saves more than "
            f"${s.bound_savings_usd:,.0f}/month ({share:.1%} of that bound; {s.bound_method})"
        )
    return "\n".join(lines)


def render_purchases(purchases: list[Purchase] | None) -> str:
    """The plan's purchase section: the nodes worth buying, chosen together, best net saving first."""
    if purchases is None:
        return "what to buy: not answered; the plan's time limit ran out first"
    if not purchases:
        return "what to buy: nothing; no purchase pays for itself in what the blocked moves would save"
    lines = ["what to buy, for the moves blocked for want of capacity (chosen together, against this plan):"]
    for p in purchases:
        net = p.monthly_savings_usd - p.monthly_cost_usd
        payback = f"pays back in {p.payback_months:.1f} months" if p.payback_months is not None else "never pays back"
        lines.append(
            f"  {p.nodes} node(s) of {p.gpus_per_node} × {printable(p.hardware)}: unblock "
            f"${p.monthly_savings_usd:,.0f}/month, cost ${p.monthly_cost_usd:,.0f}/month amortised "
            f"(net ${net:,.0f}/month); {payback}; takes {len(p.workloads)} workload(s)"
        )
    return "\n".join(lines)


def _what(r: Recommendation) -> str:
    """One action in words: what changes where."""
    if r.kind == "reclaim":
        return f"release {r.gpus} × {r.from_hardware} on {r.from_node}"
    if r.kind == "right_size":
        return f"shrink to {r.gpus_after:g} of its {r.gpus} GPUs on {r.from_node} [{r.from_hardware}]"
    if r.kind == "consolidate":
        return (
            f"{r.from_node} [{r.from_hardware}] -> {r.gpu_share:.2g} of a shared GPU on {r.to_node} [{r.to_hardware}]"
        )
    via = f" via {r.via_node} (wave {r.via_wave})" if r.via_node else ""
    size = f" on {r.gpus_after:g} GPU(s)" if r.gpus_after is not None else ""
    return f"{r.from_node} [{r.from_hardware}] -> {r.to_node} [{r.to_hardware}]{size}{via}"


def projected_load(r: Recommendation) -> str:
    """The load an action expects per GPU on its target, as planned ("" when it projects none)."""
    p = r.projection
    if p is None:
        return ""
    shape = "shape unknown" if p.shape is None else f"memory-bound {p.shape:.0%}"
    return f"{p.mean_util:.0f} % (p95 {p.p95_util:.0f} %) at {p.speed:.2f}× the speed; {shape}"


def _held(r: Recommendation) -> str:
    return f"{r.gpu_share:.2g} of a GPU" if r.gpu_share is not None else f"{r.gpus} GPU"


def _actions(plan: Plan) -> list[str]:
    """The recommendations numbered in the order to carry them out, each with what it waits for."""
    number = {r.id: i for i, r in enumerate(plan.recommendations, 1)}
    lines: list[str] = []
    wave = None
    for r in plan.recommendations:
        if r.wave != wave and r.wave is not None:
            wave = r.wave
            lines.append(f"  wave {wave}:")
        lines.append(
            f"  {number[r.id]:>3}. {(r.kind or 'move').replace('_', '-')} {r.workload_name} "
            f"({r.workload_class.value}, {_held(r)}): {_what(r)}  ${r.monthly_savings_usd:,.0f}/month"
        )
        if r.after:
            lines.append(f"      after: {', '.join(f'#{number[a]}' for a in r.after if a in number)}")
        if r.swap:
            lines.append(f"      swap: together with {', '.join(f'#{number[a]}' for a in r.swap if a in number)}")
        if r.blocked_by:
            lines.append(f"      waits on dismissed: {', '.join(r.blocked_by)}")
        lines.append(f"      why: {r.reason}")
        lines.append(f"      impact: {r.performance_impact}; risk {r.risk}")
    return lines


def render_json(plan: Plan) -> str:
    return json.dumps(plan.model_dump(mode="json", by_alias=True), indent=2)
