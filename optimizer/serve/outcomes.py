"""What happened after a move: the load observed on the new hardware against the load the plan projected, and
the correction factors learned from it.

When the lifecycle sees an action applied, it records the action's projection here (``begin``). Every planning
round then looks at the workload on its new hardware (``observe``): its 10-minute digests since the move, or its
windows before the first digest closes, for up to a day. Each period is compared with the load the workload had
a day earlier at the same time of day, where the old node still holds that digest, so a daily cycle is not taken
for a wrong projection; otherwise with the projection itself. A projection off by more than ``MISS`` is a
finding.

Learning (``learning``): for demand-bound work (online inference), the observed load gives the speed the target
really has against the old hardware: ``speed as planned x projected load / observed load``. Its ratio to the
catalog's own speed is one sample of a correction factor for (site, shape, from, to). The load is what the target
node says, so a node that under-reports would teach the planner that its hardware is fast; the rule is built so
that no single node can (docs/decisions.md, "Learned corrections"):

- corrections are kept per site: a site's nodes teach only the plans of that site;
- a correction needs ``MIN_MOVES`` moves reported by ``MIN_NODES`` distinct target nodes or more;
- each node's moves are reduced to their median, and the nodes' medians to a cautious median (of an even count,
  the middle value nearer the catalog, or the catalog itself where the two middle values disagree on the
  direction), so that one node, however many moves it reports, cannot carry the factor past what the other nodes
  say;
- the result is shrunk toward the catalog by the evidence's length: samples are weighted by the hours they cover
  (a day counts fully) and the catalog counts as ``PRIOR`` days;
- a move whose sample lies more than ``OUTLIER`` (in log space) from its group's median is an outlier: a finding,
  for a person to look at the node.

Each sample and factor is bounded to [1/4, 4]. Throughput-bound jobs (training, batch) keep their GPUs as busy on
any hardware: their utilisation says nothing of speed, and they teach nothing here.

Rows of the outcomes table are read as hostile input (a version rollback leaves rows this version cannot read): a
row that does not parse is skipped, counted by reason (``skipped``) and logged, and the rest are used.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pydantic import ValidationError

from agent.protocol import Finding, FindingKind, Recommendation, WorkloadClass
from optimizer.decide.catalog import Catalog, Correction
from optimizer.decide.costs import THROUGHPUT_BOUND
from optimizer.decide.performance import ShapeBucket, bucket
from optimizer.decide.snapshot import hardware_of
from optimizer.ingest.digest import THROTTLED_PCT, WindowDigest, slowed
from optimizer.ingest.fleet import Fleet, NodeRecord
from optimizer.ingest.history import DIGEST_SECONDS

MISS = 0.25  # observed mean load off the projection by more than this share is a finding
OBSERVE_HOURS = 24.0  # how long after the move its load is followed
MIN_JUDGE_HOURS = 0.5  # observation needed before a projection is judged
MIN_LOAD = 2.0  # % utilisation below which a ratio of loads is noise
PRIOR = 1.0  # the catalog's own figure counts as this many days of observed moves
BOUND = 4.0  # a sample or a factor stays within [1/BOUND, BOUND]
DAY_S = 86_400.0
# Two nodes: the fewest where one node's reports are checked against another's. Three moves: one odd workload (a
# service whose load changed as it moved) is then never half of the evidence. Both are judgement, not measurement.
MIN_MOVES = 3
MIN_NODES = 2
# A sample this far from its group's median (a factor of 1.5 either way, in log space) is raised as an outlier:
# twice the projection's own MISS, so that what a projection_missed finding already says is not said again for
# every honest move of a correction still being learned. A judgement.
OUTLIER = math.log(1.5)

log = logging.getLogger(__name__)

# Unreadable outcome rows, by reason (bad_json, schema, bad_type), each row counted once in this process
# (``fleetfit_outcome_rows_skipped_total``).
skipped: Counter[str] = Counter()
_skipped_ids: set[str] = set()
MAX_SKIPPED_IDS = 100_000  # rows remembered as counted; past this a row may be counted again (bounded memory)

SCHEMA = """
CREATE TABLE IF NOT EXISTS outcomes (
    id TEXT PRIMARY KEY,
    site TEXT NOT NULL,
    workload TEXT NOT NULL,
    applied_at REAL NOT NULL,
    body TEXT NOT NULL,
    hours REAL NOT NULL DEFAULT 0,
    observed_mean REAL,
    observed_p95 REAL,
    projected_mean REAL,
    projected_p95 REAL,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS outcomes_site ON outcomes (site);
-- the node that reported each observation (a table of its own: older state files gain it without a migration)
CREATE TABLE IF NOT EXISTS outcome_nodes (
    id TEXT PRIMARY KEY,
    node TEXT NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class Observation:
    """The load seen on the new hardware, and the projection over the same periods (per GPU, 0-100 %)."""

    hours: float
    mean_util: float
    p95_util: float
    projected_mean: float
    projected_p95: float
    node: str = ""  # the node that reported it ("": not recorded, read as the move's target node)

    @property
    def off_by(self) -> float:
        """Observed mean load against projected, as a signed share (+1.0: twice the projection)."""
        return self.mean_util / max(self.projected_mean, 1e-9) - 1


@dataclass(frozen=True, slots=True)
class Outcome:
    recommendation: Recommendation
    site: str
    applied_at: float
    observation: Observation | None
    workload: str = ""  # the id it runs under now: a rescheduled pod is a new pod (its successor), else its own

    @property
    def observed_id(self) -> str:
        return self.workload or self.recommendation.workload

    @property
    def reporter(self) -> str:
        """The node whose windows the observation rests on."""
        seen = self.observation
        return seen.node if seen is not None and seen.node else self.recommendation.to_node

    @property
    def missed(self) -> bool:
        o = self.observation
        return (
            o is not None
            and o.hours >= MIN_JUDGE_HOURS
            and max(o.mean_util, o.projected_mean) >= MIN_LOAD
            and abs(o.off_by) > MISS
        )

    def describe(self) -> str:
        """What was seen after the move, in words ("" before anything was)."""
        o = self.observation
        if o is None:
            return "not yet seen on its new hardware"
        verdict = f"; {abs(o.off_by):.0%} {'above' if o.off_by > 0 else 'below'} the projection" if self.missed else ""
        return (
            f"{o.mean_util:.0f} % (p95 {o.p95_util:.0f} %) over {o.hours:.1f} h, against "
            f"{o.projected_mean:.0f} % (p95 {o.projected_p95:.0f} %) projected{verdict}"
        )

    def as_json(self) -> dict[str, object]:
        p = self.recommendation.projection
        o = self.observation
        return {
            "applied_at": self.applied_at,
            "projected_mean_util": p.mean_util if p else None,
            "projected_p95_util": p.p95_util if p else None,
            "observed_hours": round(o.hours, 2) if o else 0.0,
            "observed_mean_util": round(o.mean_util, 1) if o else None,
            "observed_p95_util": round(o.p95_util, 1) if o else None,
            "off_by": round(o.off_by, 3) if o else None,
            "missed": self.missed,
        }


def begin(db: sqlite3.Connection, site: str, rec: Recommendation, now: float, workload: str | None = None) -> None:
    """Start following an applied action that carries a projection (inside the lifecycle's transaction);
    ``workload``: the id it runs under now, where that is a successor's."""
    if rec.projection is None or rec.kind == "reclaim":
        return
    db.execute(
        "INSERT OR REPLACE INTO outcomes (id, site, workload, applied_at, body, updated) VALUES (?, ?, ?, ?, ?, ?)",
        (rec.id, site, workload or rec.workload, now, rec.model_dump_json(), now),
    )


class Unreadable(ValueError):
    """An outcome row this version cannot read; ``reason`` labels the count."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def _number(value: object, column: str) -> float:
    # SQLite keeps whatever was written: text or a blob in a REAL column comes back as such
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise Unreadable("bad_type", f"{column} is {type(value).__name__} {str(value)[:40]!r}, not a number")
    return float(value)


def _text(value: object, column: str) -> str:
    if not isinstance(value, str):
        raise Unreadable("bad_type", f"{column} is {type(value).__name__}, not text")
    return value


def _outcome(row: tuple[object, ...]) -> Outcome:
    """One row as an outcome; Unreadable when any column is not what this version writes."""
    _, row_site, workload, applied, body, hours, mean, p95, pmean, pp95, node = row
    try:
        parsed = json.loads(_text(body, "body"))
    except (ValueError, RecursionError) as exc:
        raise Unreadable("bad_json", f"body: {str(exc)[:120]}") from None
    try:
        rec = Recommendation.model_validate(parsed)
    except ValidationError as exc:
        raise Unreadable("schema", f"body: {exc.error_count()} field(s) not as this version reads them") from None
    figures = (mean, p95, pmean, pp95)
    seen = None
    if any(x is not None for x in figures):
        names = ("observed_mean", "observed_p95", "projected_mean", "projected_p95")
        m, p, pm, pp = (_number(x, n) for x, n in zip(figures, names, strict=True))
        seen = Observation(_number(hours, "hours"), m, p, pm, pp, _text(node, "node") if node is not None else "")
    return Outcome(rec, _text(row_site, "site"), _number(applied, "applied_at"), seen, _text(workload, "workload"))


def following(
    db: sqlite3.Connection, site: str | None = None, now: float | None = None, tally: Counter[str] | None = None
) -> list[Outcome]:
    """Outcomes (of ``site``, or all), those still followed first if ``now`` is given: applied in the last day.
    A row that cannot be read is skipped: counted in ``tally`` (every one of this read) where given, for the caller
    to report; else counted in ``skipped`` (once per row in this process) and logged."""
    query = "SELECT o.id, o.site, o.workload, o.applied_at, o.body, o.hours, o.observed_mean, o.observed_p95, "
    query += "o.projected_mean, o.projected_p95, n.node "
    query += "FROM outcomes o LEFT JOIN outcome_nodes n ON n.id = o.id"
    clauses: list[str] = []
    args: list[object] = []
    if site is not None:
        clauses.append("o.site = ?")
        args.append(site)
    if now is not None:
        clauses.append("o.applied_at >= ?")
        args.append(now - OBSERVE_HOURS * 3600 - DIGEST_SECONDS)
    if clauses:
        query += " WHERE " + " AND ".join(clauses)
    out = []
    new: Counter[str] = Counter()
    first = ""
    for row in db.execute(query, args):
        try:
            out.append(_outcome(row))
        except Unreadable as exc:
            if tally is not None:
                tally[exc.reason] += 1
                continue
            row_id = str(row[0])[:200]
            if row_id in _skipped_ids:
                continue
            if len(_skipped_ids) < MAX_SKIPPED_IDS:
                _skipped_ids.add(row_id)
            new[exc.reason] += 1
            first = first or f"{row_id!r}: {exc}"
    if new:
        skipped.update(new)
        log.warning(
            "outcomes: %d unreadable row(s) skipped (%s), first %s; planning goes on without them",
            new.total(),
            ", ".join(f"{reason}: {n}" for reason, n in sorted(new.items())),
            first,
        )
    return out


def of_ids(db: sqlite3.Connection, ids: list[str]) -> dict[str, Outcome]:
    wanted = set(ids)
    return {o.recommendation.id: o for o in following(db) if o.recommendation.id in wanted}


def save(db: sqlite3.Connection, outcomes: list[Outcome], now: float) -> None:
    """Keep what the latest observations saw (the fleet's history does not survive a restart)."""
    with db:
        for o in outcomes:
            seen = o.observation
            if seen is None:
                continue
            changed = db.execute(
                "UPDATE outcomes SET hours = ?, observed_mean = ?, observed_p95 = ?, projected_mean = ?, "
                "projected_p95 = ?, updated = ? WHERE id = ? AND hours <= ?",
                (
                    seen.hours,
                    seen.mean_util,
                    seen.p95_util,
                    seen.projected_mean,
                    seen.projected_p95,
                    now,
                    o.recommendation.id,
                    seen.hours,
                ),
            ).rowcount
            if changed and seen.node:
                db.execute(
                    "INSERT OR REPLACE INTO outcome_nodes (id, node) VALUES (?, ?)", (o.recommendation.id, seen.node)
                )


# ------------------------------------------------------------------------------------------ observing


@dataclass(frozen=True, slots=True)
class _Period:
    end: float
    hours: float
    mean: float
    p95: float


def _on_hardware(fleet: Fleet, site: str, hardware: str, catalog: Catalog) -> list[NodeRecord]:
    out = []
    for (rec_site, _), record in sorted(fleet.nodes.items()):
        if rec_site != site or record.birth is None:
            continue
        physical = [g for g in record.birth.gpus if g.parent is None] or record.birth.gpus
        if not physical:
            continue
        hw = hardware_of(catalog, physical[0].model.split(" MIG ", 1)[0], physical[0].pci_device_id)
        if hw is not None and hw.name == hardware:
            out.append(record)
    return out


def _held(window: WindowDigest, gpus: Iterable[int], parents: Mapping[int, int], tdp_w: float | None) -> bool:
    """Whether any of ``gpus`` (a MIG instance by its GPU's clocks) was held below its datasheet for THROTTLED_PCT
    of the window or more, by the one throttle rule: a power cap counts under a lowered limit only (``slowed``)."""
    wanted = {parents.get(g, g) for g in gpus}
    return any(slowed(t, tdp_w).held_pct >= THROTTLED_PCT for t in window.throttles if t.gpu in wanted)


def _periods(
    record: NodeRecord, workload: str, since: float, until: float, tdp_w: float | None = None
) -> list[_Period]:
    """The workload's load on one node after ``since``: closed digests, else the windows so far. Time its GPUs
    were held below their datasheet (heat, a lowered power limit: ``slowed``; ``tdp_w`` is the board's) is left
    out: load seen there says what the throttle allowed, not how fast the hardware is, and would teach a correction
    against the hardware. A power cap at the board's own limit is how the catalog's speeds were measured: kept."""
    birth = record.birth
    parents = {g.index: g.parent for g in birth.gpus if g.parent is not None} if birth is not None else {}
    held = [
        (w.start, w.end)
        for w in record.windows
        if w.throttles and any(_held(w, r.gpus, parents, tdp_w) for r in w.workloads if r.id == workload)
    ]
    digests = [
        d
        for d in record.history.of(workload)
        if since + DIGEST_SECONDS <= d.end <= until
        and not any(start < d.end and end > d.end - DIGEST_SECONDS for start, end in held)
    ]
    if digests:
        return [_Period(d.end, DIGEST_SECONDS / 3600, d.mean_util, d.peak_p95) for d in digests]
    out = []
    for w in record.windows:
        if w.start < since or w.end > until:
            continue
        ref = next((r for r in w.workloads if r.id == workload), None)
        if ref is None or _held(w, ref.gpus, parents, tdp_w):
            continue
        rows = w.gpu_rows
        starts = rows.starts(set(ref.gpus))  # where its GPUs' rows start: index, util mean, util p95, ...
        if starts:
            mean = sum(rows[at + 1] for at in starts) / len(starts)
            out.append(_Period(w.end, (w.end - w.start) / 3600, mean, max(rows[at + 2] for at in starts)))
    return out


def _day_before(fleet: Fleet, site: str, rec: Recommendation, at: float) -> tuple[float, float] | None:
    """(mean, p95) of the workload on its old node a day before ``at``, within one digest period."""
    record = fleet.record(site, rec.from_node)
    if record is None:
        return None
    near = [d for d in record.history.of(rec.workload) if abs(d.end - (at - DAY_S)) <= DIGEST_SECONDS / 2]
    return (near[0].mean_util, near[0].peak_p95) if near else None


def observe(fleet: Fleet, catalog: Catalog, outcome: Outcome, now: float) -> Outcome:
    """The outcome with what the fleet shows of the workload on its new hardware since it was applied."""
    rec, p = outcome.recommendation, outcome.recommendation.projection
    if p is None:
        return outcome
    until = min(now, outcome.applied_at + OBSERVE_HOURS * 3600 + DIGEST_SECONDS)
    by_node: dict[str, list[_Period]] = {}
    target = hardware_of(catalog, rec.to_hardware)
    tdp = target.datasheet.tdp_w if target is not None else None
    for record in _on_hardware(fleet, outcome.site, rec.to_hardware, catalog):
        found = _periods(record, outcome.observed_id, outcome.applied_at, until, tdp)
        if found:
            by_node[record.node] = found
    if not by_node:
        return outcome
    # One node's word: the planned target's where it reports the workload, else the node reporting it longest. A
    # second node naming the same workload (it cannot run on both) adds no evidence, and could only bend it.
    reporter = (
        rec.to_node if rec.to_node in by_node else max(by_node, key=lambda n: (sum(x.hours for x in by_node[n]), n))
    )
    periods = by_node[reporter]
    # the load the plan expected per GPU there, for each period: its load a day earlier where that is known
    factor = p.mean_util / p.before_mean_util if p.before_mean_util > 0 else 0.0
    p95_factor = p.p95_util / p.before_p95_util if p.before_p95_util > 0 else 0.0
    expected = []
    for period in periods:
        earlier = _day_before(fleet, outcome.site, rec, period.end)
        if earlier is not None and factor > 0:
            expected.append((earlier[0] * factor, earlier[1] * p95_factor))
        else:
            expected.append((p.mean_util, p.p95_util))
    hours = sum(x.hours for x in periods)
    seen = Observation(
        hours=round(hours, 3),
        mean_util=statistics.fmean(x.mean for x in periods),
        p95_util=max(x.p95 for x in periods),
        projected_mean=statistics.fmean(e for e, _ in expected),
        projected_p95=max(e for _, e in expected),
        node=reporter,
    )
    if outcome.observation is not None and outcome.observation.hours > seen.hours:
        return outcome  # what was seen before a restart covered more
    return Outcome(rec, outcome.site, outcome.applied_at, seen, outcome.workload)


# ------------------------------------------------------------------------------------------ learning


Key = tuple[str, ShapeBucket, str, str]  # site, shape, from key, to key


def _sample(catalog: Catalog, o: Outcome) -> tuple[Key, float, float] | None:
    """((site, shape, from, to), log factor, weight) of one observed move, None when it teaches nothing."""
    rec, p, seen = o.recommendation, o.recommendation.projection, o.observation
    if p is None or seen is None or p.shape is None or rec.workload_class in THROUGHPUT_BOUND:
        return None
    if rec.workload_class is not WorkloadClass.INFERENCE or seen.hours < MIN_JUDGE_HOURS:
        return None
    if seen.mean_util < MIN_LOAD or seen.projected_mean < MIN_LOAD:
        return None
    here, there = hardware_of(catalog, rec.from_hardware), hardware_of(catalog, rec.to_hardware)
    if here is None or there is None or here.key == there.key:
        return None
    observed_speed = p.speed * seen.projected_mean / seen.mean_util
    sample = min(BOUND, max(1 / BOUND, observed_speed / p.catalog_speed))
    key = (o.site, bucket(p.shape), here.key, there.key)
    return key, math.log(sample), min(1.0, seen.hours / OBSERVE_HOURS)


def cautious_median(values: list[float]) -> float:
    """The median of log factors; of an even count, the middle value nearer 0 (the catalog), or 0 itself where the
    two middle values lie on either side of it. Whatever one value of the list is, the result lies between 0 and
    the others' range: one liar can weaken a correction the others agree on, never strengthen or reverse it."""
    ordered = sorted(values)
    n = len(ordered)
    if n % 2:
        return ordered[n // 2]
    low, high = ordered[n // 2 - 1], ordered[n // 2]
    if low <= 0 <= high:
        return 0.0
    return low if abs(low) < abs(high) else high


@dataclass(frozen=True, slots=True)
class Learning:
    """What a set of observed moves teaches: each site's corrections, and the moves whose samples stand out."""

    sites: Mapping[str, tuple[Correction, ...]] = field(default_factory=dict)
    nodes: Mapping[Key, int] = field(default_factory=dict)  # distinct target nodes behind each correction
    outliers: Mapping[str, str] = field(default_factory=dict)  # recommendation id -> why it stands out

    def of_site(self, site: str) -> tuple[Correction, ...]:
        return self.sites.get(site, ())

    def nodes_of(self, site: str, c: Correction) -> int:
        return self.nodes.get((site, c.shape, c.from_key, c.to_key), 0)


def learning(catalog: Catalog, outcomes: list[Outcome]) -> Learning:
    """Correction factors per (site, shape, from, to) where several nodes' moves agree, shrunk toward the catalog;
    and the moves that lie far from their group's median."""
    groups: dict[Key, list[tuple[Outcome, float, float]]] = defaultdict(list)
    for o in outcomes:
        sample = _sample(catalog, o)
        if sample is not None:
            key, value, weight = sample
            groups[key].append((o, value, weight))
    out: dict[str, list[Correction]] = defaultdict(list)
    nodes: dict[Key, int] = {}
    outliers: dict[str, str] = {}
    for key, samples in sorted(groups.items()):
        site, shape, src, dst = key
        per_node: dict[str, list[float]] = defaultdict(list)
        for o, value, _ in samples:
            per_node[o.reporter].append(value)
        if len(samples) < MIN_MOVES or len(per_node) < MIN_NODES:
            continue  # one node's word, or too few moves: the catalog stands
        centre = cautious_median([statistics.median(v) for v in per_node.values()])
        for o, value, _ in samples:
            if abs(value - centre) > OUTLIER:
                outliers[o.recommendation.id] = (
                    f"node {o.reporter}'s load says {dst} runs {math.exp(value):.2f}x the catalog's speed against "
                    f"{src}, where the median of site {site}'s moves to {len(per_node)} nodes says "
                    f"{math.exp(centre):.2f}x"
                )
        weight = sum(w for _, _, w in samples)
        factor = math.exp(centre * weight / (weight + PRIOR))
        factor = min(BOUND, max(1 / BOUND, factor))
        nodes[key] = len(per_node)
        out[site].append(
            Correction(
                shape=shape,
                from_key=src,
                to_key=dst,
                factor=round(factor, 4),
                moves=len(samples),
                hours=round(weight * OBSERVE_HOURS, 1),
            )
        )
    return Learning({site: tuple(c) for site, c in out.items()}, nodes, outliers)


def learn(catalog: Catalog, outcomes: list[Outcome]) -> tuple[Correction, ...]:
    """The correction factors one site's observed moves teach (``learning``; give it one site's outcomes: the
    factors carry no site)."""
    return tuple(c for corrections in learning(catalog, outcomes).sites.values() for c in corrections)


def missed(outcomes: list[Outcome], outliers: Mapping[str, str] | None = None) -> list[Finding]:
    """A finding for each applied move whose observed load is off its projection by more than ``MISS``, or whose
    sample stands out from the others of its site (``outliers``: recommendation id -> why)."""
    out = []
    outliers = outliers or {}
    for o in outcomes:
        odd = outliers.get(o.recommendation.id)
        if not (o.missed or odd) or o.observation is None:
            continue
        rec, seen = o.recommendation, o.observation
        more = "more" if seen.off_by > 0 else "less"
        also = f"; an outlier: {odd}" if odd else ""
        out.append(
            Finding(
                workload=o.observed_id,
                workload_name=rec.workload_name,
                kind=FindingKind.PROJECTION_MISSED,
                hardware=rec.to_hardware,
                nodes=[o.reporter],
                wasted_usd_per_hour=0.0,
                confidence=1.0,
                detail=(
                    f"moved to {rec.to_hardware} expecting {seen.projected_mean:.0f} % "
                    f"(p95 {seen.projected_p95:.0f} %); "
                    f"observed {seen.mean_util:.0f} % (p95 {seen.p95_util:.0f} %) over {seen.hours:.1f} h, "
                    f"{abs(seen.off_by):.0%} {more} load than projected{also}"
                ),
            )
        )
    return out
