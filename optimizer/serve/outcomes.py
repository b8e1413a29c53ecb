"""What happened after a move: the load observed on the new hardware against the load the plan projected, and
the correction factors learned from it.

When the lifecycle sees an action applied, it records the action's projection here (``begin``). Every planning
round then looks at the workload on its new hardware (``observe``): its 10-minute digests since the move, or its
windows before the first digest closes, for up to a day. Each period is compared with the load the workload had
a day earlier at the same time of day, where the old node still holds that digest, so a daily cycle is not taken
for a wrong projection; otherwise with the projection itself. A projection off by more than ``MISS`` is a
finding.

Learning (``learn``): for demand-bound work (online inference), the observed load gives the speed the target
really has against the old hardware: ``speed as planned x projected load / observed load``. Its ratio to the
catalog's own speed is one sample of a correction factor for (shape, from, to). Samples are weighted by the
hours they cover (a day counts fully) and averaged in log space with the catalog itself counted as ``PRIOR``
days of evidence, so one short observation moves the factor little and several days of consistent moves move it
most of the way; each sample and the factor are bounded to [1/4, 4]. Throughput-bound jobs (training, batch)
keep their GPUs as busy on any hardware: their utilisation says nothing of speed, and they teach nothing here.
"""

from __future__ import annotations

import json
import math
import sqlite3
import statistics
from collections import defaultdict
from dataclasses import dataclass

from agent.protocol import Finding, FindingKind, Recommendation, WorkloadClass
from optimizer.decide.catalog import Catalog, Correction
from optimizer.decide.costs import THROUGHPUT_BOUND
from optimizer.decide.performance import bucket
from optimizer.decide.snapshot import hardware_of
from optimizer.ingest.fleet import Fleet, NodeRecord
from optimizer.ingest.history import DIGEST_SECONDS

MISS = 0.25  # observed mean load off the projection by more than this share is a finding
OBSERVE_HOURS = 24.0  # how long after the move its load is followed
MIN_JUDGE_HOURS = 0.5  # observation needed before a projection is judged
MIN_LOAD = 2.0  # % utilisation below which a ratio of loads is noise
PRIOR = 1.0  # the catalog's own figure counts as this many days of observed moves
BOUND = 4.0  # a sample or a factor stays within [1/BOUND, BOUND]
DAY_S = 86_400.0

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
"""


@dataclass(frozen=True, slots=True)
class Observation:
    """The load seen on the new hardware, and the projection over the same periods (per GPU, 0-100 %)."""

    hours: float
    mean_util: float
    p95_util: float
    projected_mean: float
    projected_p95: float

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


def following(db: sqlite3.Connection, site: str | None = None, now: float | None = None) -> list[Outcome]:
    """Outcomes (of ``site``, or all), those still followed first if ``now`` is given: applied in the last day."""
    query = "SELECT id, site, workload, applied_at, body, hours, observed_mean, observed_p95, projected_mean, "
    query += "projected_p95 "
    query += "FROM outcomes"
    clauses: list[str] = []
    args: list[object] = []
    if site is not None:
        clauses.append("site = ?")
        args.append(site)
    if now is not None:
        clauses.append("applied_at >= ?")
        args.append(now - OBSERVE_HOURS * 3600 - DIGEST_SECONDS)
    if clauses:
        query += " WHERE " + " AND ".join(clauses)
    out = []
    for _, row_site, workload, applied, body, hours, mean, p95, pmean, pp95 in db.execute(query, args):
        seen = Observation(hours, mean, p95, pmean, pp95) if mean is not None else None
        out.append(Outcome(Recommendation.model_validate(json.loads(body)), row_site, applied, seen, workload))
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
            db.execute(
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


def _periods(record: NodeRecord, workload: str, since: float, until: float) -> list[_Period]:
    """The workload's load on one node after ``since``: closed digests, else the windows so far."""
    digests = [d for d in record.history.of(workload) if since + DIGEST_SECONDS <= d.end <= until]
    if digests:
        return [_Period(d.end, DIGEST_SECONDS / 3600, d.mean_util, d.peak_p95) for d in digests]
    out = []
    for w in record.windows:
        if w.start < since or w.end > until:
            continue
        ref = next((r for r in w.workloads if r.id == workload), None)
        if ref is None:
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
    periods: list[_Period] = []
    for record in _on_hardware(fleet, outcome.site, rec.to_hardware, catalog):
        periods += _periods(record, outcome.observed_id, outcome.applied_at, until)
    if not periods:
        return outcome
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
    )
    if outcome.observation is not None and outcome.observation.hours > seen.hours:
        return outcome  # what was seen before a restart covered more
    return Outcome(rec, outcome.site, outcome.applied_at, seen, outcome.workload)


# ------------------------------------------------------------------------------------------ learning


def _sample(catalog: Catalog, o: Outcome) -> tuple[tuple[str, str, str], float, float] | None:
    """((shape, from, to), log factor, weight) of one observed move, None when it teaches nothing."""
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
    return (bucket(p.shape), here.key, there.key), math.log(sample), min(1.0, seen.hours / OBSERVE_HOURS)


def learn(catalog: Catalog, outcomes: list[Outcome]) -> tuple[Correction, ...]:
    """Correction factors per (shape, from, to) from every observed move, shrunk toward the catalog."""
    logs: dict[tuple[str, str, str], list[tuple[float, float]]] = defaultdict(list)
    for o in outcomes:
        sample = _sample(catalog, o)
        if sample is not None:
            key, value, weight = sample
            logs[key].append((value, weight))
    out = []
    for (shape, src, dst), samples in sorted(logs.items()):
        weight = sum(w for _, w in samples)
        factor = math.exp(sum(v * w for v, w in samples) / (weight + PRIOR))
        factor = min(BOUND, max(1 / BOUND, factor))
        hours = sum(w for _, w in samples) * OBSERVE_HOURS
        out.append(
            Correction(
                shape=shape,
                from_key=src,
                to_key=dst,
                factor=round(factor, 4),
                moves=len(samples),
                hours=round(hours, 1),
            )
        )
    return tuple(out)


def missed(outcomes: list[Outcome]) -> list[Finding]:
    """A finding for each applied move whose observed load is off its projection by more than ``MISS``."""
    out = []
    for o in outcomes:
        if not o.missed or o.observation is None:
            continue
        rec, seen = o.recommendation, o.observation
        more = "more" if seen.off_by > 0 else "less"
        out.append(
            Finding(
                workload=o.observed_id,
                workload_name=rec.workload_name,
                kind=FindingKind.PROJECTION_MISSED,
                hardware=rec.to_hardware,
                nodes=[rec.to_node],
                wasted_usd_per_hour=0.0,
                confidence=1.0,
                detail=(
                    f"moved to {rec.to_hardware} expecting {seen.projected_mean:.0f} % "
                    f"(p95 {seen.projected_p95:.0f} %); "
                    f"observed {seen.mean_util:.0f} % (p95 {seen.p95_util:.0f} %) over {seen.hours:.1f} h, "
                    f"{abs(seen.off_by):.0%} {more} load than projected"
                ),
            )
        )
    return out
