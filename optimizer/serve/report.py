"""Showback: GPU use and waste per owner (team), site or hardware.

Agents report each workload's owner (Kubernetes namespace, Slurm account, systemd unit). Every plan the
optimizer charges the time since the site's previous plan to a ledger kept beside the recommendations: GPU-hours
by class, US$ held (GPUs × the catalog's price per GPU-hour) and US$ wasted by finding kind. ``fleetfit report``
sums the ledger; the console's per-owner view shows the same figures as rates for the current plans.
"""

from __future__ import annotations

import calendar
import csv
import io
import json
import sqlite3
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from agent.protocol import Finding, NodeStatus, Plan, WorkloadClass, WorkloadRef, WorkloadView
from optimizer.decide.catalog import Catalog
from optimizer.decide.snapshot import hardware_of
from optimizer.ingest.fleet import Fleet

UNATTRIBUTED = "(unattributed)"
# An owner a workload named for itself and nothing confirmed: charged apart from the team's confirmed use.
CLAIMED = " (claimed)"
By = Literal["owner", "site", "hardware"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    hour REAL NOT NULL,
    site TEXT NOT NULL,
    owner TEXT NOT NULL,
    hardware TEXT NOT NULL,
    workload_class TEXT NOT NULL,
    waste_kind TEXT NOT NULL,
    gpu_hours REAL NOT NULL,
    held_usd REAL NOT NULL,
    wasted_usd REAL NOT NULL,
    PRIMARY KEY (hour, site, owner, hardware, workload_class, waste_kind)
);
-- the seconds each site's plans charged per hour: what part of a period the ledger covers
CREATE TABLE IF NOT EXISTS charged (
    hour REAL NOT NULL,
    site TEXT NOT NULL,
    seconds REAL NOT NULL,
    PRIMARY KEY (hour, site)
);
CREATE TABLE IF NOT EXISTS owners (
    workload TEXT PRIMARY KEY,
    site TEXT NOT NULL,
    owner TEXT NOT NULL,
    seen REAL NOT NULL,
    hardware TEXT NOT NULL DEFAULT ''
);
-- workload ids are a site's own: the same id in two sites is two workloads (``owners`` keyed them by id alone)
CREATE TABLE IF NOT EXISTS workload_owners (
    site TEXT NOT NULL,
    workload TEXT NOT NULL,
    owner TEXT NOT NULL,
    seen REAL NOT NULL,
    hardware TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (site, workload)
);
"""


def _owner(ref: WorkloadRef) -> str:
    if not ref.owner:
        return UNATTRIBUTED
    return ref.owner + CLAIMED if ref.owner_claimed else ref.owner


def owners_of(fleet: Fleet, site: str | None = None) -> dict[str, str]:
    """Each workload's owner in ``site`` as its node's latest window reports it (``UNATTRIBUTED`` when none; an
    owner only the workload itself claims is marked so). Workload ids are unique within a site only: across sites
    use :func:`site_owners`."""
    return {wid: owner for (_, wid), owner in site_owners(fleet, site).items()}


def site_owners(fleet: Fleet, site: str | None = None) -> dict[tuple[str, str], str]:
    """Each workload's owner by (site, workload id), in ``site`` or in every site."""
    out: dict[tuple[str, str], str] = {}
    for (rec_site, _), record in list(fleet.nodes.items()):
        if (site is None or rec_site == site) and record.windows:
            for ref in record.windows[-1].workloads:
                key = (rec_site, ref.id)
                if ref.owner or key not in out:
                    out[key] = _owner(ref)
    return out


def nodes_online(fleet: Fleet, site: str | None = None) -> dict[tuple[str, str], bool]:
    """Whether each node (by site and name) is online: born and not gone offline since (its last will, or a clean
    stop). A node that went offline holds nothing now: showback stops charging it and the console leaves its
    workloads out of what is wasted now."""
    return {
        key: record.status is NodeStatus.ONLINE
        for key, record in list(fleet.nodes.items())
        if site is None or key[0] == site
    }


def online_share(site: str, w: WorkloadView, online: Mapping[tuple[str, str], bool] | None) -> float:
    """The share of ``w``'s nodes that are online (1 when nothing is known of them: an offline replay)."""
    if online is None or not w.nodes:
        return 1.0
    return sum(1 for n in w.nodes if online.get((site, n), True)) / len(w.nodes)


@dataclass(slots=True)
class Showback:
    """One owner's (or site's, or hardware's) share. Amounts are totals in a report and per hour in the
    console; open savings are always per month."""

    key: str
    gpus: dict[str, float] = field(default_factory=dict)  # by workload class: GPUs held, or GPU-hours
    held_usd: float = 0.0
    wasted_usd: dict[str, float] = field(default_factory=dict)  # by finding kind
    open_savings_usd_month: float = 0.0
    workloads: int = 0
    offline: int = 0  # of ``workloads`` (the console's): on nodes all offline, holding and wasting nothing now
    # of ``held_usd``: held by workloads with no class, for which no move can be recommended until one is known
    unknown_usd: float = 0.0

    @property
    def wasted_total(self) -> float:
        return sum(self.wasted_usd.values())

    def as_json(self) -> dict[str, object]:
        return {
            "key": self.key,
            "workloads": self.workloads,
            "gpus_by_class": {k: round(v, 3) for k, v in sorted(self.gpus.items())},
            "held_usd": round(self.held_usd, 2),
            "unknown_held_usd": round(self.unknown_usd, 2),
            "wasted_usd_by_kind": {k: round(v, 2) for k, v in sorted(self.wasted_usd.items())},
            "wasted_usd": round(self.wasted_total, 2),
            "open_savings_usd_month": round(self.open_savings_usd_month, 2),
        }


def _prices(catalog: Catalog) -> Callable[[str], float]:
    """Price per GPU-hour by hardware name, looked up once per name (a fleet has a handful of models)."""
    known: dict[str, float] = {}

    def price(hardware: str) -> float:
        if hardware not in known:
            gpu = hardware_of(catalog, hardware)
            known[hardware] = gpu.price_per_gpu_hour if gpu is not None else 0.0
        return known[hardware]

    return price


def _key(by: By, site: str, owner: str, hardware: str) -> str:
    return {"owner": owner, "site": site, "hardware": hardware}[by]


def live_showback(
    plans: Iterable[Plan],
    owners: Mapping[tuple[str, str], str],
    catalog: Catalog,
    open_ids: set[str],
    by: By = "owner",
    online: Mapping[tuple[str, str], bool] | None = None,
) -> list[Showback]:
    """The current plans per owner (``owners`` by (site, workload id), as :func:`site_owners` gives them): GPUs
    held by class, US$ held and wasted per hour, open savings per month (of the recommendations in
    ``open_ids``). Most money held first. A workload whose nodes are all offline (``online``, as
    :func:`nodes_online` gives it) holds and wastes nothing now: it is counted in ``offline``, and its moves still
    in the open savings."""
    rows: dict[str, Showback] = {}
    price = _prices(catalog)
    for plan in plans:
        where: dict[str, Showback] = {}  # workloads holding GPUs now
        saving: dict[str, Showback] = {}  # workloads offline, whose moves still stand
        for w in plan.workloads:
            share = online_share(plan.site, w, online)
            key = _key(by, plan.site, owners.get((plan.site, w.id), UNATTRIBUTED), w.hardware)
            row = rows.setdefault(key, Showback(key))
            row.workloads += 1
            if share == 0:
                row.offline += 1
                saving[w.id] = row
                continue
            row.gpus[w.workload_class.value] = row.gpus.get(w.workload_class.value, 0.0) + w.gpus * share
            row.held_usd += w.gpus * share * price(w.hardware)
            if w.workload_class is WorkloadClass.UNKNOWN:
                row.unknown_usd += w.gpus * share * price(w.hardware)
            where[w.id] = row
        for f in plan.findings:
            if f.wasted_usd_per_hour > 0 and (hit := where.get(f.workload)) is not None:
                hit.wasted_usd[f.kind.value] = hit.wasted_usd.get(f.kind.value, 0.0) + f.wasted_usd_per_hour
        for r in plan.recommendations:
            if r.id in open_ids and (hit := where.get(r.workload) or saving.get(r.workload)) is not None:
                hit.open_savings_usd_month += r.monthly_savings_usd
    return sorted(rows.values(), key=lambda s: (-s.held_usd, s.key))


def _hour(t: float) -> float:
    return t - t % 3600


class Ledger:
    """The accumulated showback, in the optimizer's SQLite state file (beside the recommendations)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # opened where the daemon starts, written from its database thread (optimizer.serve.lifecycle.Offloaded)
        self._db = sqlite3.connect(path, timeout=10, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)
        if self._db.execute("SELECT 1 FROM owners LIMIT 1").fetchone() is not None:
            with self._db:  # owners kept by id alone before: each kept under the site it was last seen in
                self._db.execute(
                    "INSERT OR IGNORE INTO workload_owners (site, workload, owner, seen, hardware) "
                    "SELECT site, workload, owner, seen, hardware FROM owners"
                )
                self._db.execute("DELETE FROM owners")
        self._last: dict[str, float] = {}

    def close(self) -> None:
        self._db.close()

    def account(
        self,
        plan: Plan,
        owners: Mapping[str, str],
        catalog: Catalog,
        interval: float,
        now: float | None = None,
        online: Mapping[tuple[str, str], bool] | None = None,
    ) -> float:
        """Charge the time since this site's previous plan to each workload in ``plan``; return the seconds
        charged. ``interval`` is the solve interval: the first plan charges one, and a gap longer than three
        (the optimizer was down) charges three. ``online`` (:func:`nodes_online`) says which nodes are up: a
        workload is charged for its GPUs on online nodes only, and a site with no node online charges nothing,
        neither GPUs nor covered time (its plan is the last one its nodes allowed, not what runs)."""
        now = time.time() if now is None else now
        previous = self._last.get(plan.site)
        seconds = interval if previous is None else min(max(now - previous, 0.0), 3 * interval)
        self._last[plan.site] = now
        if online is not None and not any(up for (site, _), up in online.items() if site == plan.site):
            return 0.0
        hours = seconds / 3600
        waste: dict[str, Finding] = {}  # the costliest of each workload's findings (a projection missed costs 0)
        for f in sorted(plan.findings, key=lambda f: f.wasted_usd_per_hour):
            if f.wasted_usd_per_hour > 0:
                waste[f.workload] = f
        price = _prices(catalog)
        sums: dict[tuple[str, str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        charged = []
        for w in plan.workloads:
            share = online_share(plan.site, w, online)
            if share == 0:
                continue
            charged.append(w)
            finding = waste.get(w.id)
            key = (
                owners.get(w.id, UNATTRIBUTED),
                w.hardware,
                w.workload_class.value,
                finding.kind.value if finding else "",
            )
            acc = sums[key]
            acc[0] += w.gpus * share * hours
            acc[1] += w.gpus * share * price(w.hardware) * hours
            acc[2] += finding.wasted_usd_per_hour * share * hours if finding else 0.0
        with self._db:
            self._db.executemany(
                "INSERT INTO usage VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (hour, site, owner, hardware, workload_class, waste_kind) DO UPDATE SET "
                "gpu_hours = gpu_hours + excluded.gpu_hours, held_usd = held_usd + excluded.held_usd, "
                "wasted_usd = wasted_usd + excluded.wasted_usd",
                [(_hour(now), plan.site, *k, *v) for k, v in sums.items()],
            )
            self._db.execute(
                "INSERT INTO charged VALUES (?, ?, ?) ON CONFLICT (hour, site) DO UPDATE SET "
                "seconds = seconds + excluded.seconds",
                (_hour(now), plan.site, seconds),
            )
            self._db.executemany(
                "INSERT INTO workload_owners VALUES (?, ?, ?, ?, ?) ON CONFLICT (site, workload) DO UPDATE SET "
                "owner = excluded.owner, seen = excluded.seen, hardware = excluded.hardware",
                [(plan.site, w.id, owners.get(w.id, UNATTRIBUTED), now, w.hardware) for w in charged],
            )
        return seconds

    def report(self, since: float, by: By = "owner") -> list[Showback]:
        """Totals since ``since`` (whole hours: from the start of its hour), with each key's open savings and the
        workloads charged in those hours; most money held first."""
        since = _hour(since)  # the usage below is kept per hour: a workload counts where its GPU-hours do
        rows: dict[str, Showback] = {}
        query = (
            "SELECT site, owner, hardware, workload_class, waste_kind, gpu_hours, held_usd, wasted_usd "
            "FROM usage WHERE hour >= ?"
        )
        for site, owner, hardware, cls, kind, gpu_hours, held, wasted in self._db.execute(query, (since,)):
            key = _key(by, site, owner, hardware)
            row = rows.setdefault(key, Showback(key))
            row.gpus[cls] = row.gpus.get(cls, 0.0) + gpu_hours
            row.held_usd += held
            if cls == WorkloadClass.UNKNOWN.value:
                row.unknown_usd += held
            if kind:
                row.wasted_usd[kind] = row.wasted_usd.get(kind, 0.0) + wasted
        open_rows = (
            self._db.execute(
                "SELECT r.site, COALESCE(o.owner, ?), r.body FROM recommendations r "
                "LEFT JOIN workload_owners o ON o.site = r.site AND o.workload = r.workload "
                "WHERE r.state IN ('new', 'acknowledged')",
                (UNATTRIBUTED,),
            ).fetchall()
            if self._has_recommendations()
            else []
        )
        for site, owner, body in open_rows:
            rec = json.loads(body)
            key = _key(by, site, owner, str(rec.get("from_hardware", "")))
            row = rows.setdefault(key, Showback(key))
            row.open_savings_usd_month += float(rec.get("monthly_savings_usd", 0.0))
        workloads: dict[str, set[tuple[str, str]]] = defaultdict(set)
        for site, owner, workload, hardware in self._db.execute(
            "SELECT site, owner, workload, hardware FROM workload_owners WHERE seen >= ?", (since,)
        ):
            workloads[_key(by, site, owner, hardware)].add((site, workload))
        for key, ids in workloads.items():
            if key in rows:
                rows[key].workloads = len(ids)
        return sorted(rows.values(), key=lambda s: (-s.held_usd, s.key))

    def covered(self, since: float) -> float:
        """The seconds since ``since`` the ledger charged, for the site it covers longest: the time the optimizer
        watched and planned. Replayed history (an agent's spool after an outage, the demo's day) is not charged:
        it arrives after the time it covers, which the optimizer either watched already or was down for."""
        row = self._db.execute(
            "SELECT MAX(total) FROM (SELECT SUM(seconds) AS total FROM charged WHERE hour >= ? GROUP BY site)",
            (_hour(since),),
        ).fetchone()
        return float(row[0] or 0.0)

    def _has_recommendations(self) -> bool:
        found = self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'recommendations'")
        return found.fetchone() is not None


# ------------------------------------------------------------------------------------------- rendering

_CLASSES = ("training", "inference", "batch_inference", "interactive", "idle", "unknown")


# Short headers a person reads; CSV and JSON keep the protocol's names. "IDLE GPU-h" is time held by workloads
# classed idle, "IDLE $" the money wasted by idle allocations (finding kinds, docs/console.md).
CLASS_HEADERS = {
    "training": "TRAIN",
    "inference": "INFER",
    "batch_inference": "BATCH",
    "interactive": "INTERACTIVE",
    "idle": "IDLE",
    "unknown": "UNKNOWN",
}
KIND_HEADERS = {
    "serving_on_training_hardware": "SERVE-ON-TRAIN $",
    "training_without_nvlink": "NO-NVLINK $",
    "multi_node_training_without_rdma": "NO-RDMA $",
    "oversized_gpu_memory": "OVERSIZED $",
    "idle_allocation": "IDLE $",
    "uncatalogued_hardware": "UNCATALOGUED $",
    "projection_missed": "OFF-PROJECTION $",
    "input_starved_training": "STARVED $",
    "checkpoint_stall": "CKPT-STALL $",
    "slow_cold_start": "COLD-START $",
    "mixed_node": "MIXED-NODE $",
}
TABLE_WIDTH = 120  # columns of a terminal the table fits by default; --wide has no limit
KEY_WIDTH = 28  # an owner, site or hardware name longer than this is cut (with …) to fit


def _kind_header(kind: str) -> str:
    return KIND_HEADERS.get(kind, kind.upper().replace("_", "-")[:16] + " $")


def render_table(
    rows: list[Showback], by: By, unit: str = "GPU-h", wide: bool = False, width: int = TABLE_WIDTH
) -> str:
    """Aligned columns for people. By default the table fits ``width`` columns: columns with nothing in them are
    left out, then the waste by finding kind and the GPU-hours of the smallest classes until it fits (a line
    under it names them). ``wide`` shows every column. CSV and JSON keep every column either way."""
    kinds = (
        sorted({k for r in rows for k in r.wasted_usd})
        if not wide
        else sorted({*KIND_HEADERS, *(k for r in rows for k in r.wasted_usd)})
    )
    # (header, cells, (group, amount)): too wide, the waste kinds (group 0) go first, then the classes, least first
    optional: list[tuple[str, list[str], tuple[int, float]]] = []
    for c in _CLASSES:
        cells = [f"{r.gpus.get(c, 0.0):,.1f}" for r in rows]
        optional.append(
            (f"{CLASS_HEADERS.get(c, c.upper())} {unit}", cells, (1, sum(r.gpus.get(c, 0.0) for r in rows)))
        )
    for k in kinds:
        cells = [f"{r.wasted_usd.get(k, 0.0):,.2f}" for r in rows]
        optional.append((_kind_header(k), cells, (0, sum(r.wasted_usd.get(k, 0.0) for r in rows))))
    if not wide:  # a column whose every cell reads zero says nothing
        optional = [o for o in optional if any(c.strip("0.,") for c in o[1])]
    left_out: list[str] = []

    def build() -> list[str]:
        shown = {h for h, _, _ in optional} - set(left_out)
        keep = [o for o in optional if o[0] in shown]
        classes = [o for o in keep if o[2][0] == 1]
        wastes = [o for o in keep if o[2][0] == 0]
        headers = [by.upper(), "WORKLOADS", *(h for h, _, _ in classes), "HELD $", "WASTED $"]
        headers += [h for h, _, _ in wastes] + ["SAVINGS $/MONTH"]
        body = [
            [
                r.key if wide else (r.key if len(r.key) <= KEY_WIDTH else r.key[: KEY_WIDTH - 1] + "…"),
                str(r.workloads),
                *(cells[i] for _, cells, _ in classes),
                f"{r.held_usd:,.2f}",
                f"{r.wasted_total:,.2f}",
                *(cells[i] for _, cells, _ in wastes),
                f"{r.open_savings_usd_month:,.0f}",
            ]
            for i, r in enumerate(rows)
        ]
        widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(headers)]
        # the first column is text (left-aligned), the rest are amounts (right-aligned, so digits line up)
        return [
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))
            ).rstrip()
            for line in [headers, *body]
        ]

    lines = build()
    for header, _, _ in sorted(optional, key=lambda o: o[2]):
        if wide or max(len(line) for line in lines) <= width:
            break
        left_out.append(header)
        lines = build()
    if left_out:
        lines.append(f"(left out to fit {width} columns: {', '.join(left_out)}; --wide shows every column)")
    return "\n".join(lines)


def _cell(text: str) -> str:
    """A CSV cell a spreadsheet will not run: formulas are quoted as text."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def render_csv(rows: list[Showback], by: By) -> str:
    kinds = sorted({k for r in rows for k in r.wasted_usd})
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(
        [by, "workloads", *(f"gpu_hours_{c}" for c in _CLASSES), "held_usd", "wasted_usd"]
        + [f"wasted_usd_{k}" for k in kinds]
        + ["open_savings_usd_month"]
    )
    for r in rows:
        writer.writerow(
            [_cell(r.key), r.workloads, *(round(r.gpus.get(c, 0.0), 3) for c in _CLASSES)]
            + [round(r.held_usd, 2), round(r.wasted_total, 2)]
            + [round(r.wasted_usd.get(k, 0.0), 2) for k in kinds]
            + [round(r.open_savings_usd_month, 2)]
        )
    return out.getvalue()


def render_json(rows: list[Showback], by: By, since: float, covered: float | None = None) -> str:
    body: dict[str, object] = {"by": by, "since": since}
    if covered is not None:
        body["covered_seconds"] = round(covered, 1)  # the time the optimizer watched, charged plan by plan
    body["rows"] = [r.as_json() for r in rows]
    return json.dumps(body, indent=2)


_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: float | None = None) -> float:
    """``7d``, ``24h``, ``90m``, ``2w`` ago, or a date ``YYYY-MM-DD`` (UTC); raise ValueError otherwise."""
    now = time.time() if now is None else now
    text = text.strip()
    if text[:-1].isdigit() and text[-1:] in _UNITS:
        return now - int(text[:-1]) * _UNITS[text[-1]]
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%d")))
    except ValueError:
        raise ValueError(f"--since {text!r}: use 7d, 24h, 90m, 2w or a date YYYY-MM-DD") from None


def run_report(state_dir: Path, since: float, by: By, fmt: str, wide: bool = False) -> str:
    """The report as text, from the optimizer's state directory; ``wide``: the table with every column."""
    from optimizer.serve.lifecycle import DB_NAME

    path = state_dir / DB_NAME
    if not path.exists():
        raise FileNotFoundError(f"no showback yet: {path} does not exist (is the optimizer running?)")
    ledger = Ledger(path)
    try:
        rows = ledger.report(since, by)
        covered = ledger.covered(since)
    finally:
        ledger.close()
    if fmt == "json":
        return render_json(rows, by, since, covered)
    if fmt == "csv":
        return render_csv(rows, by).rstrip("\n")
    start = time.strftime("%Y-%m-%d %H:%M", time.gmtime(_hour(since)))  # the ledger is kept by the hour
    if not rows:
        return f"nothing accounted since {start} UTC"
    head = (
        f"GPU use and waste per {by} since {start} UTC, over the {duration(covered)} the optimizer watched "
        "(time it was down and replayed history are not charged)"
    )
    return head + unclassified(rows, "GPU-h") + "\n" + render_table(rows, by, wide=wide)


def unclassified(rows: list[Showback], unit: str) -> str:
    """What unclassified workloads held, for the report's first line (empty where none did): their waste is
    invisible, since no move is recommended for a workload whose class is unknown."""
    gpus = sum(r.gpus.get(WorkloadClass.UNKNOWN.value, 0.0) for r in rows)
    if gpus <= 0:
        return ""
    usd = sum(r.unknown_usd for r in rows)
    return (
        f"; unclassified: {gpus:,.1f} {unit} held by workloads with no class, US$ {usd:,.2f}, for which no move is "
        "recommended until their class is known (each says what would decide it)"
    )


def duration(seconds: float) -> str:
    """``52 s``, ``14 min``, ``3.2 h``, ``6.9 days``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
