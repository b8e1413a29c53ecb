"""The names the simulator offers on the command line (scenarios, exporter field sets, history formats), in a
module of their own: the ``fleetfit`` parser lists them without importing the simulator, so that ``fleetfit agent``
on a real node loads none of it."""

from __future__ import annotations

from typing import Literal

SCENARIOS = ("demo", "mixed", "well-placed", "training-heavy", "inference-heavy", "hard", "realistic", "services")

FieldSet = Literal["basic", "default", "all"]
FIELD_SETS: tuple[FieldSet, ...] = ("basic", "default", "all")

HistoryFormat = Literal["openmetrics", "victoriametrics"]
HISTORY_FORMATS: tuple[HistoryFormat, ...] = ("openmetrics", "victoriametrics")
