"""Plans for people (an aligned text table) and for programs (the protocol's JSON); safe cells for CSV.

It is also the one place an action is put into words. The command line, the console, chat messages, the generic
webhook, CSV and the API all name an action's kind, describe it, order it, number it and total a list of them
through the functions here, so a capacity team reads the same plan wherever it looks."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from agent.protocol import Finding, Plan, Purchase, Recommendation
from optimizer.decide.nodefit import FINDING_KINDS

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


# GPUs paid for while they wait on the rest of their node (optimizer/decide/nodefit.py): fixed there, not by a move
REST_OF_NODE = frozenset(FINDING_KINDS)


def _as_is(text: str) -> str:
    return text


class FindingWords(NamedTuple):
    """A finding's parts in words, unescaped, so a page can escape each and mark up the fix."""

    kind: str  # "input starved training"
    cost: str  # "$1,234.50/hour"
    detail: str
    fix: str  # what to change on the node; "" where a move is the fix


def finding_words(f: Finding) -> FindingWords:
    """The words every reader (plan text, chat, console) gives a finding's kind, cost, detail and fix."""
    return FindingWords(f.kind.value.replace("_", " "), f"${f.wasted_usd_per_hour:,.2f}/hour", f.detail, f.fix or "")


def finding_text(f: Finding, name: Callable[[str], str] = _as_is, esc: Callable[[str], str] = _as_is) -> str:
    """A finding in words, as the plan's text and chat say it: what agents named (the workload, its nodes) set
    apart by ``name``, the rest escaped by ``esc``."""
    words = finding_words(f)
    nodes = ",".join(name(n) for n in f.nodes)
    fix = f"; fix: {esc(words.fix)}" if words.fix else ""
    return (
        f"{name(f.workload_name)} on {nodes} [{esc(f.hardware)}]: {words.kind}, {words.cost} ({esc(words.detail)}){fix}"
    )


def waiting_on_node(findings: Iterable[Finding], top: int) -> list[Finding]:
    """The ``top`` costliest findings of GPUs waiting on the rest of their node."""
    rest = [f for f in findings if f.kind in REST_OF_NODE]
    return sorted(rest, key=lambda f: (-f.wasted_usd_per_hour, f.workload))[:top]


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


# ------------------------------------------------------------------------------------- actions in words

# Every kind of action a plan holds, in the order totals list them, and the word each is called by everywhere.
KINDS = {"move": "move", "reclaim": "reclaim", "right_size": "right-size", "consolidate": "consolidate"}
ARROW = "→"


def kind_of(r: Recommendation) -> str:
    """The action's kind as the protocol spells it (a schema-1 action without one is a move)."""
    return r.kind or "move"


def kind_word(kind: str | None) -> str:
    """A kind (``right_size``) as people read it (``right-size``)."""
    return KINDS.get(kind or "move", (kind or "move").replace("_", "-"))


def _count(gpus: float, share: float | None) -> str:
    if share is not None:
        return f"{gpus:g} × {share:.2g} of" if gpus != 1 else f"{share:.2g} of one"
    return f"{gpus:g} ×"


def change(r: Recommendation) -> str:
    """What the action changes, where: ``8 → 4 × L40S 48GB on l40s-004``."""
    kind = kind_of(r)
    if kind == "reclaim":
        return f"release {_count(r.gpus, r.gpu_share)} {r.from_hardware} on {r.from_node}"
    if kind == "right_size":
        kept = r.gpus if r.gpus_after is None else r.gpus_after
        return f"{r.gpus} {ARROW} {_count(kept, r.gpu_share)} {r.from_hardware} on {r.from_node}"
    before = f"{_count(r.gpus, r.gpu_share if kind != 'consolidate' else None)} {r.from_hardware} on {r.from_node}"
    if kind == "consolidate":
        target = f"{r.gpu_share or 1:.2g} of a GPU shared with other services, {r.to_hardware} on {r.to_node}"
    else:
        held = r.gpus if r.gpus_after is None else r.gpus_after
        target = f"{_count(held, r.gpu_share)} {r.to_hardware} on {r.to_node}"
    via = f" via {r.via_node} (wave {r.via_wave})" if r.via_node else ""
    return f"{before} {ARROW} {target}{via}"


def action_text(r: Recommendation) -> str:
    """The action in one line: ``right-size tts-api: 8 → 4 × L40S 48GB on l40s-004``."""
    return f"{kind_word(r.kind)} {r.workload_name or r.workload}: {change(r)}"


def order_key(r: Recommendation) -> tuple[int, float, str]:
    """The order to carry actions out in: wave by wave, the biggest saving first within a wave."""
    return (r.wave or 0, -r.monthly_savings_usd, r.id)


def numbered(recs: Iterable[Recommendation]) -> dict[str, int]:
    """Each action's number (1, 2, …) in the order to carry them out, by id."""
    return {r.id: i for i, r in enumerate(sorted(recs, key=order_key), 1)}


WAITS_FOR = "waits for"  # the one name for what an action must wait for, in every listing (the JSON field: after)


def waits(r: Recommendation, number: Mapping[str, int]) -> str:
    """What the action waits for: ``waits for #1, #2`` (an action not listed is named by its id), the dismissed
    actions it cannot go ahead without (``waits for dismissed #4``), and ``together with #3`` for a swap; "" when
    it waits for nothing."""

    def refs(ids: list[str]) -> str:
        return ", ".join(f"#{number[i]}" if i in number else i for i in ids)

    waited = [refs(r.after)] if r.after else []
    if r.blocked_by:
        waited.append(f"dismissed {refs(r.blocked_by)}")
    parts = [f"{WAITS_FOR} {', '.join(waited)}"] if waited else []
    if r.swap:
        parts.append(f"together with {refs(r.swap)}")
    return "; ".join(parts)


def waits_cell(r: Recommendation, number: Mapping[str, int]) -> str:
    """:func:`waits` under a column headed "waits for": ``#1, #2``."""
    return waits(r, number).removeprefix(f"{WAITS_FOR} ")


def savings_by_kind(recs: Iterable[Recommendation]) -> dict[str, float]:
    """US$ a month per kind of action, kinds in ``KINDS`` order."""
    sums: dict[str, float] = {}
    for r in recs:
        sums[kind_of(r)] = sums.get(kind_of(r), 0.0) + r.monthly_savings_usd
    return {k: sums[k] for k in sorted(sums, key=lambda k: (list(KINDS).index(k) if k in KINDS else len(KINDS), k))}


def total_text(recs: Iterable[Recommendation], money: Callable[[float], str] = lambda v: f"${v:,.0f}") -> str:
    """The one total of a list of actions, broken down by kind where kinds differ:
    ``$18,673/month (move $11,811, reclaim $4,380, right-size $2,482)``."""
    by_kind = savings_by_kind(recs)
    text = f"{money(sum(by_kind.values()))}/month"
    if len(by_kind) > 1:
        text += " (" + ", ".join(f"{kind_word(k)} {money(v)}" for k, v in by_kind.items()) + ")"
    return text


def waves_of(recs: Iterable[Recommendation]) -> int:
    return max((r.wave or 1 for r in recs), default=0)


def action_fields(r: Recommendation, number: Mapping[str, int]) -> dict[str, object]:
    """What JSON listings (the API, ``fleetfit recommendations --format json``) add to an action: its kind
    (``move`` for a schema-1 action), its number in the order to carry them out, and the action in words."""
    return {"kind": kind_of(r), "number": number.get(r.id), "action": action_text(r), "waits": waits(r, number)}


LISTING_HEADERS = ["#", "WAVE", "WAITS FOR", "ID", "STATE", "SAVING/MONTH", "RISK", "ACTION"]


def render_listing(rows: list[tuple[str, str, Recommendation]]) -> str:
    """``fleetfit recommendations``: (site, state, action) rows per site in the order to carry them out, each site
    headed by its total. Open actions are numbered as the plan numbers them; closed ones (``--all``) are not."""
    out: list[str] = []
    for site in sorted({site for site, _, _ in rows}):
        mine = [(state, r) for s, state, r in rows if s == site]
        open_recs = [r for state, r in mine if state in ("new", "acknowledged")]
        number = numbered(open_recs)
        mine.sort(key=lambda x: (number.get(x[1].id, len(number) + 1), order_key(x[1])))
        if out:
            out.append("")
        out.append(
            f"site {site}: {len(open_recs)} open action(s) in {waves_of(open_recs)} wave(s), saving "
            f"{total_text(open_recs)}"
            + (f"; {len(mine) - len(open_recs)} closed" if len(mine) > len(open_recs) else "")
        )
        cells = [
            [
                str(number[r.id]) if r.id in number else "–",
                str(r.wave or 1) if r.id in number else "–",
                waits_cell(r, number) if r.id in number else "",
                r.id,
                state,
                f"${r.monthly_savings_usd:,.0f}",
                r.risk,
                action_text(r),
            ]
            for state, r in mine
        ]
        out += _table(LISTING_HEADERS, cells)
    return "\n".join(printable(line) for line in out)


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
        lines.append(
            f"findings (misplacements and GPUs waiting on the rest of their node), wasting ${waste:,.2f}/hour:"
        )
        for f in plan.findings:
            lines.append(f"  {finding_text(f)}")
    if plan.recommendations:
        lines.append("")
        lines.append(
            f"recommended actions, saving {total_text(plan.recommendations)}, in {waves_of(plan.recommendations)} "
            "wave(s) (a wave's actions run in parallel):"
        )
        lines += _actions(plan.recommendations)
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
        lines += render_purchases(plan.purchases).split("\n")
    s = plan.solver
    lines.append(solver_text(plan))
    if s.savings_usd is not None and s.bound_savings_usd is not None:
        lines.append(bound_text(plan))
    # names come from agents and snapshots: a terminal escape or a newline in one must not reach the terminal
    return "\n".join(printable(line) for line in lines)


COST_TERMS = "a month's running cost plus the moves' one-off costs"  # the model's objective (optimizer/plan/model.py)


def solver_text(plan: Plan) -> str:
    """The solver's line. CP-SAT minimises the placement's cost (a month's running cost plus the moves' one-off
    costs) less a credit for keeping the last plan's open actions (optimizer/plan/model.py); the report gives the
    cost without that credit, and the bound is on the credited figure. So an OPTIMAL plan's cost sits above the
    bound by the credit alone: that difference is no gap, and "OPTIMAL, gap 2.25 %" contradicts itself."""
    s = plan.solver
    head = f"solver: {s.status} in {s.solve_seconds:.2f} s"
    cost = f"${s.objective:,.0f} ({COST_TERMS})"
    if s.status == "OPTIMAL":
        text = f"{head}: proven the cheapest placement within the move limit; cost {cost}"
        credit = s.objective - s.best_bound
        if credit >= 0.5:  # whole dollars, as printed
            text += (
                f"; the solver's own figure, ${s.best_bound:,.0f}, takes off a ${credit:,.0f} credit for keeping "
                "the last plan's open actions"
            )
        return text
    if s.status == "FEASIBLE" and s.best_bound > 0:
        return (
            f"{head}: stopped before proving it the cheapest; cost {cost}, at most {s.gap:.2%} above the least any "
            f"placement could cost (${s.best_bound:,.0f}, the solver's bound when it stopped)"
        )
    if s.status == "FEASIBLE":
        return f"{head}: stopped before proving it the cheapest; cost {cost}"
    return f"{head}: no placement found; every workload stays where it is"


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


def projected_load(r: Recommendation) -> str:
    """The load an action expects per GPU on its target, as planned ("" when it projects none)."""
    p = r.projection
    if p is None:
        return ""
    shape = "shape unknown" if p.shape is None else f"memory-bound {p.shape:.0%}"
    return f"{p.mean_util:.0f} % (p95 {p.p95_util:.0f} %) at {p.speed:.2f}× the speed; {shape}"


def bound_text(plan: Plan) -> str:
    """How far the plan is from the best possible. The bound is on what the solver decides (moves, right-sizes,
    consolidations); releasing an idle allocation is decided before it, so the plan's total is that plus them."""
    s = plan.solver
    solved = s.savings_usd or 0.0
    bound = s.bound_savings_usd or 0.0
    share = solved / bound if bound > 0 else 1.0
    reclaims = sum(r.monthly_savings_usd for r in plan.recommendations if kind_of(r) == "reclaim")
    text = (
        f"bound: the solver's actions (moves and resizing) save ${solved:,.0f}/month, {share:.1%} of the most any "
        f"plan's could (${bound:,.0f}/month; {s.bound_method})"
    )
    if reclaims:
        text += f"; reclaims, decided before the solve, add ${reclaims:,.0f}"
    return text


def _actions(recs: list[Recommendation]) -> list[str]:
    """The actions numbered in the order to carry them out, wave by wave, each with what it waits for."""
    ordered = sorted(recs, key=order_key)
    number = numbered(ordered)
    lines: list[str] = []
    wave = None
    for r in ordered:
        if r.wave != wave and r.wave is not None:
            wave = r.wave
            lines.append(f"  wave {wave}:")
        lines.append(f"  {number[r.id]:>3}. {action_text(r)}  ${r.monthly_savings_usd:,.0f}/month")
        if waiting := waits(r, number):
            lines.append(f"      {waiting}")
        lines.append(f"      why: {r.reason}")
        lines.append(f"      impact: {r.performance_impact}; risk {r.risk}")
    return lines


def render_json(plan: Plan) -> str:
    return json.dumps(plan.model_dump(mode="json", by_alias=True), indent=2)
