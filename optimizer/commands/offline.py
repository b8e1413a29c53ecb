"""Offline classification of recorded telemetry (``fleetfit classify FILE.jsonl``), and how to score it.

A recording is JSON lines. The simulator's ``--record`` writes ``{"birth": {...}, "labels": {...}}`` once per
node and ``{"window": {...}, "labels": {...}}`` per window; windows saved from a real fleet may be bare
telemetry or birth payloads, one per line. Labels (workload id → pattern) are optional; with them the report
scores itself.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from pydantic import ValidationError

from agent.protocol import (
    Birth,
    GpuInfo,
    Telemetry,
    TopicKind,
    WorkloadClass,
    encode,
    node_topic,
)
from optimizer.decide.classify import Classification, classify
from optimizer.decide.features import WorkloadFeatures, workload_features
from optimizer.ingest.fleet import Fleet

PREFIX = "offline"

# Ground-truth patterns as the classifier's classes: fine-tuning is training.
PATTERN_CLASS = {
    "training": WorkloadClass.TRAINING,
    "fine_tuning": WorkloadClass.TRAINING,
    "inference": WorkloadClass.INFERENCE,
    "batch_inference": WorkloadClass.BATCH_INFERENCE,
    "interactive": WorkloadClass.INTERACTIVE,
    "idle": WorkloadClass.IDLE,
    "llm_serving": WorkloadClass.INFERENCE,
    "loader_bound_training": WorkloadClass.TRAINING,
    "lora_fine_tuning": WorkloadClass.TRAINING,
    "embedding_batch": WorkloadClass.BATCH_INFERENCE,
    "offline_llm_batch": WorkloadClass.BATCH_INFERENCE,
}


class RecordingError(ValueError):
    pass


def label_class(label: object) -> WorkloadClass | None:
    """A label as a class: a class name (``inference``) or a simulator pattern (``llm_serving``)."""
    if not isinstance(label, str):
        return None
    key = label.strip().lower()
    if key in PATTERN_CLASS:
        return PATTERN_CLASS[key]
    try:
        return WorkloadClass(key)
    except ValueError:
        return None


def parse_labels(labels: dict[object, object], where: str) -> dict[str, WorkloadClass]:
    """Workload id → class; unknown labels refused, all of them named in one line."""
    out: dict[str, WorkloadClass] = {}
    unknown = set()
    for wid, label in labels.items():
        cls = label_class(label)
        if cls is None:
            unknown.add(repr(label))
        else:
            out[str(wid)] = cls
    if unknown:
        known = ", ".join([*(c.value for c in WorkloadClass), *sorted(set(PATTERN_CLASS) - set(WorkloadClass))])
        raise RecordingError(f"{where}: unknown label(s) {', '.join(sorted(unknown))}; known: {known}")
    return out


def load_labels(path: Path) -> dict[str, WorkloadClass]:
    """Labels from a JSON object (id → label) or a CSV with a header naming ``workload`` and ``label``/``class``
    columns (or two columns without a header)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RecordingError(f"{path}: not a text file") from None
    if text.lstrip().startswith("{"):
        return parse_labels(_json_object(text, str(path)), str(path))
    rows = [r for r in csv.reader(text.splitlines()) if r and any(c.strip() for c in r)]
    if rows and {c.strip().lower() for c in rows[0]} & {"workload", "id", "label", "class"}:
        header = [c.strip().lower() for c in rows[0]]
        wid = next((header.index(k) for k in ("workload", "id") if k in header), 0)
        lab = next((header.index(k) for k in ("label", "class") if k in header), 1)
        rows = rows[1:]
    else:
        wid, lab = 0, 1
    bad = [i for i, r in enumerate(rows, 1) if len(r) <= max(wid, lab)]
    if bad:
        raise RecordingError(f"{path}: row(s) {', '.join(map(str, bad[:5]))} lack a workload id and a label")
    return parse_labels({r[wid].strip(): r[lab].strip() for r in rows}, str(path))


@dataclass(slots=True)
class Recording:
    fleet: Fleet
    labels: dict[str, WorkloadClass] = field(default_factory=dict)
    lines: int = 0
    rejected: int = 0
    windows: int = 0  # telemetry windows taken in
    no_gpu: str | None = None  # why a window's agent saw no GPU (gpu_unavailable), the last one said

    def nothing_found(self, path: Path) -> str:
        """Why no workload came out of the recording at ``path``, in one line."""
        read = f"{path}: {self.lines} line(s) read ({self.rejected} rejected)"
        if not self.windows:
            return (
                f"{read}, none a telemetry window: expected windows as JSON lines, as `fleetfit simulate --record` "
                "and `fleetfit agent --once --jsonl` write them"
            )
        why = f"its agent saw no GPU ({self.no_gpu})" if self.no_gpu else "nothing ran on its GPUs"
        return (
            f"{read}: {self.windows} window(s), none attributing a GPU to a workload: {why}. Record where "
            "workloads run, or try `fleetfit agent --once --jsonl --simulate h100x8` (simulated GPUs)"
        )


def _guess_birth(window: Telemetry) -> Birth:
    """An inventory for windows recorded without their node's birth. It lists the GPUs only: NICs it does not
    know get their role from their names when the window is digested (optimizer/ingest/digest.py)."""
    gpus = [GpuInfo(index=g.index, uuid=f"GPU-{g.index}", model="unknown", memory_mib=0) for g in window.gpus]
    return Birth(
        node=window.node, site=window.site, session=window.session, agent_version="unknown", hostname=window.node,
        timestamp=window.start, gpus=gpus,
    )  # fmt: skip


def _json_object(text: str, where: str) -> dict[object, object]:
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise RecordingError(f"{where}: not JSON ({exc})") from None
    except RecursionError:
        raise RecordingError(f"{where}: JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise RecordingError(f"{where}: not a JSON object")
    return obj


def _objects(lines: Iterable[str]) -> Iterator[tuple[int, dict[str, object]]]:
    for number, line in enumerate(lines, 1):
        if line.strip():
            yield number, cast("dict[str, object]", _json_object(line, f"line {number}"))  # JSON keys are strings


def load(lines: Iterable[str], horizon: int = 100_000) -> Recording:
    """Feed a recording through the same validation and state the optimizer uses live."""
    rec = Recording(Fleet(PREFIX, horizon_windows=horizon))
    for number, obj in _objects(lines):
        rec.lines += 1
        labels = obj.get("labels")
        if isinstance(labels, dict):
            rec.labels.update(parse_labels(labels, f"line {number}"))
        payload = obj.get("birth") or obj.get("window") or obj
        if not isinstance(payload, dict):
            raise RecordingError(f"line {number}: no birth or window")
        try:
            if "seq" in payload:
                window = Telemetry.model_validate(payload)
                if window.node and rec.fleet.record(window.site, window.node) is None:
                    _ingest(rec, _guess_birth(window))
                if _ingest(rec, window):
                    rec.windows += 1
                    rec.no_gpu = window.gpu_unavailable or rec.no_gpu
            elif "agent_version" in payload:
                _ingest(rec, Birth.model_validate(payload))
            elif payload is not obj:
                rec.rejected += 1
        except ValidationError:
            rec.rejected += 1
    return rec


def _ingest(rec: Recording, message: Birth | Telemetry) -> bool:
    kind = TopicKind.BIRTH if isinstance(message, Birth) else TopicKind.TELEMETRY
    if rec.fleet.ingest(node_topic(PREFIX, message.site, message.node, kind), encode(message)) is None:
        rec.rejected += 1
        return False
    return True


def load_file(path: Path, horizon: int = 100_000) -> Recording:
    with path.open(encoding="utf-8") as fh:
        return load(fh, horizon)


@dataclass(frozen=True, slots=True)
class Scored:
    features: WorkloadFeatures
    result: Classification
    truth: WorkloadClass | None


def classify_all(rec: Recording) -> list[Scored]:
    out = []
    for site in rec.fleet.sites():
        for f in workload_features(rec.fleet, site):
            out.append(Scored(f, classify(f), rec.labels.get(f.id)))
    return out


@dataclass(frozen=True, slots=True)
class Score:
    classes: list[WorkloadClass]
    confusion: dict[tuple[WorkloadClass, WorkloadClass], int]  # (truth, predicted) → count
    macro_f1: float
    accuracy: float
    support: int


def score(pairs: Iterable[tuple[WorkloadClass, WorkloadClass]]) -> Score:
    """Confusion matrix and macro-F1 over the classes present in the truth."""
    confusion: Counter[tuple[WorkloadClass, WorkloadClass]] = Counter(pairs)
    truth_classes = sorted({t for t, _ in confusion}, key=list(WorkloadClass).index)
    shown = sorted({c for pair in confusion for c in pair}, key=list(WorkloadClass).index)
    f1s = []
    for c in truth_classes:
        tp = confusion[(c, c)]
        fp = sum(n for (t, p), n in confusion.items() if p == c and t != c)
        fn = sum(n for (t, p), n in confusion.items() if t == c and p != c)
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    total = sum(confusion.values())
    correct = sum(n for (t, p), n in confusion.items() if t == p)
    return Score(
        classes=shown,
        confusion=dict(confusion),
        macro_f1=sum(f1s) / len(f1s) if f1s else 0.0,
        accuracy=correct / total if total else 0.0,
        support=total,
    )


def render_score(s: Score) -> str:
    width = max(len(c.value) for c in s.classes) + 2
    column = width  # every class name fits whole in its column header
    lines = ["confusion matrix (rows: truth, columns: predicted)"]
    lines.append(" " * width + "".join(c.value.rjust(column) for c in s.classes))
    for t in s.classes:
        if not any(tt == t for tt, _ in s.confusion):
            continue
        lines.append(t.value.ljust(width) + "".join(str(s.confusion.get((t, p), 0)).rjust(column) for p in s.classes))
    lines.append(f"macro-F1 {s.macro_f1:.3f}, accuracy {s.accuracy:.3f} over {s.support} workload(s)")
    return "\n".join(lines)
