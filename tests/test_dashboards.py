"""The Grafana dashboards: generated from the names the optimizer writes, every Flux query naming a
measurement, field and tag that exists, and JSON in the shape Grafana's file provisioning loads."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from optimizer.serve import series

ROOT = Path(__file__).resolve().parent.parent / "dashboards"
PANEL_TYPES = {"stat", "timeseries", "table", "bargauge", "gauge", "text"}
MEASUREMENTS = {m.name: m for m in series.ALL}


def _boards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(ROOT.glob("*.json"))}


def test_committed_dashboards_are_what_the_generator_makes() -> None:
    spec = importlib.util.spec_from_file_location("generate", ROOT / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    made = module.render()
    assert set(made) == set(_boards()), "run dashboards/generate.py"
    for name, text in made.items():
        assert (ROOT / name).read_text() == text, f"{name} is stale: run dashboards/generate.py"


def _names_in(query: str) -> tuple[set[str], set[str], set[str]]:
    measurements = set(re.findall(r'_measurement == "([^"]+)"', query)) | set(
        re.findall(r'measurement: "([^"]+)"', query)
    )
    fields = set(re.findall(r'r\._field == "([^"]+)"', query))
    tags = set(re.findall(r"r\.([a-z_]+) =~", query)) | set(re.findall(r'\btag: "([^"]+)"', query))
    for columns in re.findall(r"group\(columns: (\[[^\]]*\])\)", query):
        tags |= {c for c in json.loads(columns) if not c.startswith("_")}
    return measurements, fields, tags


def test_every_query_names_series_the_optimizer_writes() -> None:
    queries = 0
    for name, board in _boards().items():
        texts = [t["query"] for p in board["panels"] for t in p["targets"]]
        texts += [v["query"] for v in board["templating"]["list"]]
        for query in texts:
            measurements, fields, tags = _names_in(query)
            assert len(measurements) == 1, f"{name}: {query}"
            m = MEASUREMENTS.get(measurements.pop())
            assert m is not None, f"{name}: unknown measurement in {query}"
            assert fields <= set(m.fields), f"{name}: {fields - set(m.fields)} not fields of {m.name}"
            assert tags <= set(m.tags), f"{name}: {tags - set(m.tags)} not tags of {m.name}"
            queries += 1
    assert queries >= 30


def test_dashboards_have_the_shape_grafana_loads() -> None:
    datasource = yaml.safe_load((ROOT / "provisioning" / "datasource.yaml").read_text())
    (ds,) = datasource["datasources"]
    assert datasource["apiVersion"] == 1 and ds["type"] == "influxdb" and ds["jsonData"]["version"] == "Flux"
    provider = yaml.safe_load((ROOT / "provisioning" / "dashboards.yaml").read_text())["providers"][0]
    assert provider["type"] == "file" and provider["options"]["path"]
    boards = _boards()
    assert {"fleet-overview.json", "node.json", "placement.json", "recommendations.json"} <= set(boards)
    assert len({b["uid"] for b in boards.values()}) == len(boards)
    for name, board in boards.items():
        assert isinstance(board["schemaVersion"], int) and board["title"] and len(board["uid"]) <= 40
        variables = {v["name"] for v in board["templating"]["list"]}
        assert all(v["datasource"]["uid"] == ds["uid"] for v in board["templating"]["list"])
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)) and board["panels"], name
        for p in board["panels"]:
            assert p["type"] in PANEL_TYPES and p["title"]
            g = p["gridPos"]
            assert all(isinstance(g[k], int) for k in "xywh") and g["x"] + g["w"] <= 24 and g["h"] > 0
            assert p["datasource"]["uid"] == ds["uid"] and p["targets"]
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs))
            for t in p["targets"]:
                used = set(re.findall(r"\$\{(\w+)(?::\w+)?\}", t["query"]))
                assert used <= variables, f"{name}/{p['title']}: undefined {used - variables}"
                assert "v.timeRangeStart" in t["query"]  # follows the dashboard's time picker


def test_generator_help_or_an_unknown_argument_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``generate.py --help`` prints its usage and leaves every board as it is; only a plain run writes. Deliberate
    bug it catches: arguments ignored, so ``--help`` rewrites the dashboards."""
    spec = importlib.util.spec_from_file_location("generate", ROOT / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.HERE = tmp_path  # where it writes
    assert module.main(["--help"]) == 0
    assert "usage: dashboards/generate.py" in capsys.readouterr().out
    assert module.main(["--dry-run"]) == 2
    assert "unknown argument '--dry-run'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    assert module.main([]) == 0
    assert {p.name for p in tmp_path.glob("*.json")} == set(_boards())
