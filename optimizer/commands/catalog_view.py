"""``fleetfit catalog``: every GPU model's figures, its throughput per workload shape and where each figure comes
from, with the correction factors each site's observed moves have taught."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from optimizer.decide.catalog import Catalog, Figure, GpuType
from optimizer.plan.render import printable
from optimizer.serve import outcomes
from optimizer.serve.outcomes import Learning


@dataclass(frozen=True, slots=True)
class Taught:
    """What a state file's observed moves teach, and its outcome rows that could not be read."""

    learning: Learning = field(default_factory=Learning)
    skipped: Counter[str] = field(default_factory=Counter)  # by reason

    def skipped_line(self, path: Path) -> str:
        """One line saying how many outcome rows were skipped ("" when none were)."""
        if not self.skipped:
            return ""
        reasons = ", ".join(f"{reason}: {n}" for reason, n in sorted(self.skipped.items()))
        return f"{path}: {self.skipped.total()} outcome row(s) unreadable by this version, skipped ({reasons})"


def from_state(catalog: Catalog, db_path: Path) -> Taught:
    """The corrections the state file's applied moves teach, per site; sqlite3.Error when it is no database."""
    db = sqlite3.connect(db_path, timeout=10)
    try:
        db.executescript(outcomes.SCHEMA)  # a state file of an older version lacks the newer tables
        tally: Counter[str] = Counter()
        done = outcomes.following(db, tally=tally)
    finally:
        db.close()
    return Taught(outcomes.learning(catalog, done), tally)


def _figure(f: Figure) -> str:
    return f"{f.value:.2f} {f.method}"


def _row(g: GpuType) -> list[str]:
    d = g.datasheet
    return [
        g.key,
        g.name,
        f"{d.memory_gib:g}",
        f"{d.bandwidth_tbps:g}",
        f"{d.bf16_tflops:g}",
        f"{d.fp8_tflops:g}" if d.fp8_tflops else "-",
        f"{d.interconnect_gbps:g}",
        f"{d.tdp_w:g}",
        f"{g.price_per_gpu_hour:.2f}",
        _figure(g.perf.compute),
        _figure(g.perf.memory),
    ]


HEADERS = ["KEY", "NAME", "GiB", "TB/s", "BF16", "FP8", "LINK GB/s", "TDP W", "$/GPU-h", "COMPUTE", "MEMORY"]


def render_catalog_table(catalog: Catalog, taught: Taught | None = None) -> str:
    """The figures as a table, then each model's sources, then what each site's observed moves taught."""
    rows = [_row(g) for g in catalog.gpu]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(HEADERS, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines += [
        "",
        "COMPUTE / MEMORY: throughput of one GPU against one H100 SXM for compute-bound work (vision, encoders,",
        "diffusion, dense training) and memory-bandwidth-bound work (LLM decode); mlperf: published MLPerf results,",
        "roofline: datasheet arithmetic, estimate: reasoned, not measured. BF16/FP8: dense tensor TFLOPS.",
        "",
        "sources:",
    ]
    for g in catalog.gpu:
        lines.append(f"  {g.key}:")
        lines.append(f"    datasheet: {printable(g.datasheet.source)}")
        for shape, f in (("compute", g.perf.compute), ("memory", g.perf.memory)):
            lines.append(f"    {shape} {f.value:.2f}{_range(f)}: {printable(f.source)}")
        lines.append(f"    price ${g.price_per_gpu_hour:.2f}/GPU-hour: {printable(g.price_source)}")
    scaling = catalog.defaults.pcie_training_scaling
    lines += ["", f"multi-GPU training over PCIe keeps {scaling.value:.0%} of its speed: {printable(scaling.source)}"]
    lines += ["", *_learned_lines(taught or Taught())]
    return "\n".join(lines)


def _range(f: Figure) -> str:
    return f" (published {f.range[0]:.2f}-{f.range[1]:.2f})" if f.range else ""


def _learned_lines(taught: Taught) -> list[str]:
    learned = {site: c for site, c in sorted(taught.learning.sites.items()) if c}
    if not learned:
        return [
            "learned from observed moves: nothing yet (a correction needs "
            f"{outcomes.MIN_MOVES} applied moves to {outcomes.MIN_NODES} target nodes or more in one site)"
        ]
    lines = [
        "learned from observed moves, per site (factors on the catalog's speed ratio, the median of the target",
        "nodes' own medians, shrunk toward 1 on thin evidence; each site's plans use its own):",
    ]
    for site, corrections in learned.items():
        lines.append(f"  site {printable(site)}:")
        for c in corrections:
            lines.append(
                f"    {c.shape:7} {c.from_key} -> {c.to_key}: x{c.factor:.2f} from {c.moves} move(s) to "
                f"{taught.learning.nodes_of(site, c)} node(s), {c.hours:.0f} h observed"
            )
    return lines


def render_catalog_json(catalog: Catalog, taught: Taught | None = None) -> str:
    taught = taught or Taught()
    learning = taught.learning
    body = {
        "defaults": catalog.defaults.model_dump(mode="json"),
        "gpu": [g.model_dump(mode="json") for g in catalog.gpu],
        "learned": {
            site: [{**c.model_dump(mode="json"), "nodes": learning.nodes_of(site, c)} for c in corrections]
            for site, corrections in sorted(learning.sites.items())
        },
        "outcome_rows_skipped": dict(sorted(taught.skipped.items())),
    }
    return json.dumps(body, indent=2)
