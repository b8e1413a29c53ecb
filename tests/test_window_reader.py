"""The optimizer's window reader (msgspec) against the protocol's model (pydantic): the same windows accepted,
with the same values, and the same refused, for the same reason.

The reader vouches for a window only when its bytes are clean ASCII and msgspec and its cross-value checks accept
it; anything else goes to the protocol's ``decode``. So a wrong constraint in the reader shows as a window it
accepts and the model refuses (or reads differently). Every field of a real window is replaced, in turn, with
hostile values; Hypothesis then mutates several at once, and adds and deletes keys.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from agent import protocol
from agent.protocol import ProtocolError, Telemetry, TopicKind, decode, encode
from agent.simulate import offline_windows
from collectors.sim.scenarios import build_scenario
from optimizer.ingest import window as reader
from optimizer.ingest.window import read_window

Path = tuple[str | int, ...]

# Values at and just past every bound the protocol sets, and of every wrong JSON type.
HOSTILE: list[Any] = [
    None, True, False, 0, -0.0, -1, -1e-9, 0.5, 1, 63, 64, 99.99, 100, 100.0001, 65535, 65536, 2**24, 2**24 + 1,
    3.4028234663852886e38, 3.41e38, 1.7976931348623157e308, 2**32, 2**32 + 1, 2**53, 2**53 + 1, 2**64, 10**300,
    9.0e9, 9.0e9 + 1, "", "9",
    "a", "-a", "n,1 x", "x" * 33, "x" * 65, "x" * 129, "x" * 201, "x" * 301, "é" * 64, "é" * 65, "a\u202eb",
    "a\x1bb", [], [1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4, 5], [0, 0, 0, 0], [50, 60, 40, 1], [200, 1, 1, 1], {},
    {"x": 1}, "k8s_pod", "nope",
]  # fmt: skip


def _windows() -> list[Telemetry]:
    out = []
    for spec in build_scenario("mixed", 6, seed=4):
        _, windows = offline_windows(spec, 2, site="s")
        out += windows
    return out


WINDOWS = _windows()
RICH = max(WINDOWS, key=lambda w: len(encode(w)))  # the window with the most fields: GPUs, NICs, workloads


def _two_of_each(window: Telemetry) -> str:
    """``window`` cut to its first two GPUs and NICs, as JSON text, each workload keeping only the GPUs left. The
    sweep sets only the first two items of a list (``_paths``), so the rest were carried along unread: each
    window costs both readers in proportion to its size, and the cut keeps every field the sweep reaches."""
    raw = json.loads(encode(window))
    raw["gpus"], raw["nics"] = raw["gpus"][:2], raw["nics"][:2]
    kept = {g["index"] for g in raw["gpus"]}
    for workload in raw["workloads"]:
        keep = [i for i, gpu in enumerate(workload["gpus"]) if gpu in kept]
        for key in ("gpus", "gpu_mem_mib"):
            if workload.get(key) is not None:
                workload[key] = [workload[key][i] for i in keep]
    return json.dumps(raw, separators=(",", ":"))


SWEPT = _two_of_each(RICH)


def _paths(value: Any, at: Path = ()) -> Iterator[Path]:
    yield at
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*at, key))
    elif isinstance(value, list):
        for i, item in enumerate(value[:2]):  # the first two of a list: a GPU, a NIC, a series value
            yield from _paths(item, (*at, i))


def _set(raw: Any, path: Path, value: Any) -> None:
    for part in path[:-1]:
        raw = raw[part]
    raw[path[-1]] = value


def _verdict(read: Any, payload: bytes) -> tuple[str, Any, list[tuple[str, str]]]:
    """("accepted", the window's values, fields left out) or ("refused", the reason, [])."""
    dropped: list[tuple[str, str]] = []
    try:
        window = read(payload, dropped)
    except ProtocolError as exc:
        return "refused", exc.reason, []
    return "accepted", _values(window), dropped


def _protocol(payload: bytes, dropped: list[tuple[str, str]]) -> Telemetry:
    message = decode(TopicKind.TELEMETRY, payload, dropped)
    assert isinstance(message, Telemetry)
    return message


def _values(window: Any) -> Any:
    """A window's values as JSON would have them, types kept (an int stays apart from a float)."""
    if isinstance(window, BaseModel):
        return _typed(window.model_dump(mode="json", by_alias=True))
    return _typed(msgspec.to_builtins(window))


def _typed(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)


def _same(payload: bytes) -> None:
    assert _verdict(read_window, payload) == _verdict(_protocol, payload), payload[:300]


def test_real_windows_read_alike() -> None:
    assert WINDOWS and all(read_window(encode(w)) for w in WINDOWS)
    for w in WINDOWS:
        _same(encode(w))


def test_every_field_with_every_hostile_value_reads_alike() -> None:
    """~160 fields of a rich window (two GPUs, NICs and workload GPUs of it: all the sweep sets), each replaced
    with each of ~50 values: ~8,000 windows."""
    base = json.loads(SWEPT)
    paths = [p for p in _paths(base) if p]
    assert len(paths) > 150 and base["workloads"] and len(base["gpus"]) == 2 and len(base["nics"]) == 2
    assert base["disks"] and len(base["workloads"][0]["gpus"]) == 2
    assert _verdict(_protocol, SWEPT.encode())[0] == "accepted" and protocol.clean_bytes(SWEPT.encode())
    assert paths == [p for p in _paths(json.loads(encode(RICH))) if p], "the cut leaves out no field the sweep sets"
    fast = 0
    for path in paths:
        for value in HOSTILE:
            raw = json.loads(SWEPT)
            _set(raw, path, value)
            payload = json.dumps(raw, separators=(",", ":")).encode()
            _same(payload)
            fast += protocol.clean_bytes(payload)
    assert fast > len(paths) * len(HOSTILE) // 2, "most of the sweep goes through the reader's own path"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_windows_mutated_at_random_read_alike(data: st.DataObject) -> None:
    window = data.draw(st.sampled_from(WINDOWS))
    raw = json.loads(encode(window))
    paths = [p for p in _paths(raw) if p]
    for _ in range(data.draw(st.integers(1, 4))):
        path = data.draw(st.sampled_from(paths))
        how = data.draw(st.sampled_from(["value", "number", "delete", "unknown"]))
        try:
            if how == "value":
                # a copy: a list drawn twice would otherwise be one object, set inside itself, and HOSTILE changed
                _set(raw, path, copy.deepcopy(data.draw(st.sampled_from(HOSTILE))))
            elif how == "number":
                _set(raw, path, data.draw(st.floats(allow_nan=False, allow_infinity=False) | st.integers()))
            elif how == "delete":
                parent: Any = raw
                for part in path[:-1]:
                    parent = parent[part]
                del parent[path[-1]]
            else:
                _set(raw, (*path[:-1], "surplus"), 1)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation took this path away
    _same(json.dumps(raw, separators=(",", ":")).encode())


def test_checks_across_values_hold_and_read_alike() -> None:
    """What the protocol checks across values (``values_agree``, ``gpus_listed_agree``; both readers use them):
    each broken once and refused, each just kept and accepted, and the two readers alike on every case."""
    base = json.loads(encode(RICH))
    samples, gpus, listed = base["samples"], len(base["gpus"]), len(base["workloads"][0]["gpus"])
    longest = int((base["end"] - base["start"]) / protocol.MIN_SAMPLE_INTERVAL) + 2  # samples a window may hold
    cases: list[tuple[Path, Any, bool]] = [
        (("gpus", 0, "util_series"), [1.0] * samples, True),
        (("gpus", 0, "util_series"), [1.0] * (samples + 1), False),
        (("gpus", 1, "index"), base["gpus"][0]["index"], False),
        (("gpus", 0, "index"), 63, True),
        (("gpus", 0, "index"), 64, False),
        (("gpus", 0, "util"), [50.0, 50.0, 50.0, 0.0], True),
        (("gpus", 0, "util"), [50.1, 50.0, 50.0, 0.0], False),
        (("gpus", 0, "mem_util"), [40.0, 50.1, 50.0, 0.0], False),
        (("gpus", 0, "dram_active"), [40.0, 50.1, 50.0, 0.0], False),
        (("host", "mem_used_pct"), [40.0, 50.1, 50.0, 0.0], False),
        (("host", "cpu_util"), [50.1, 40.0, 50.0, 0.0], False),
        (("end",), base["start"], False),  # a window of no length holds at most 2 samples
        (("end",), base["start"] - 1, False),
        (("start",), 0, True),
        (("end",), protocol.LATEST_TIMESTAMP + 1, False),
        (("samples",), longest, True),
        (("samples",), longest + 1, False),
        (("workloads", 0, "gpus"), [0, 0], False),
        (("workloads", 0, "gpus"), [0, 64], False),
        (("workloads", 0, "gpus"), [-1], False),
        (("workloads", 0, "gpu_mem_mib"), [1.0] * listed, True),
        (("workloads", 0, "gpu_mem_mib"), [1.0] * (listed + 1), False),
        (("workloads", 0, "gpu_mem_mib"), [None] * listed, True),
        (("gpus",), base["gpus"] * (64 // gpus + 1), False),
    ]
    for path, value, kept in cases:
        raw = json.loads(encode(RICH))
        _set(raw, path, value)
        payload = json.dumps(raw, separators=(",", ":")).encode()
        assert protocol.clean_bytes(payload)
        assert _verdict(_protocol, payload)[0] == ("accepted" if kept else "refused"), (path, value)
        _same(payload)


def test_bytes_that_are_no_window_are_refused_alike() -> None:
    encoded = encode(RICH)
    for payload in [b"", b"null", b"[]", b"{}", b"{", encoded[:-1], encoded + b"x", b"\xef\xbb\xbf" + encoded,
                    encoded.replace(b'"schema":2', b'"schema":true'), encoded.replace(b'"schema":2', b'"schema":3'),
                    encoded.replace(b'"samples":', b'"samples":1,"samples":'), b" " + encoded + b" ",
                    encoded.replace(b'"node":"', b'"node":"\\u0000'), b"x" * (protocol.MAX_PAYLOAD_BYTES + 1),
                    encoded.replace(b'"util_series":[', b'"util_series":' + b"[" * 100_000, 1)]:  # fmt: skip
        _same(payload)
    # nested past the interpreter's recursion limit by 100 KB of brackets (under the 256 KiB a payload may hold):
    # refused as bad JSON like any other, not an error escaping the fleet's ingest
    assert _verdict(read_window, b'{"gpus":' + b"[" * 100_000) == ("refused", "bad_json", [])


# What a JSON schema says beside the constraints: names, prose, defaults (the models' and the reader's defaults
# are compared by the sweep, which deletes fields), and unknown fields refused (both do; the sweep adds some).
NOT_CONSTRAINTS = frozenset({"title", "description", "default", "additionalProperties", "$defs"})


def _constraints(node: Any, defs: dict[str, Any]) -> Any:
    """A JSON schema with its references resolved and only what constrains a value kept, in one order."""
    if isinstance(node, list):
        return [_constraints(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _constraints(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
    out = {}
    for key, value in node.items():
        if key in NOT_CONSTRAINTS or (key == "items" and value is False):  # msgspec closes a tuple's items
            continue
        if key == "type" and "enum" in node:  # pydantic names an enum's type, msgspec leaves it to the values
            continue
        if key in ("required", "enum"):
            if value:
                out[key] = sorted(value)
            continue
        out[key] = _constraints(value, defs)
    return out


def _with_duplicate(value: Any, key_path: Path, extra: Any, at: Path = ()) -> str:
    """``value`` as JSON with the key at ``key_path`` given twice: ``extra`` first, then its own value."""
    if isinstance(value, dict):
        items = []
        for key, item in value.items():
            if (*at, key) == key_path:
                items.append(f"{json.dumps(key)}:{json.dumps(extra)}")
            items.append(f"{json.dumps(key)}:{_with_duplicate(item, key_path, extra, (*at, key))}")
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_with_duplicate(item, key_path, extra, (*at, i)) for i, item in enumerate(value)) + "]"
    return json.dumps(value)


def test_a_key_given_twice_is_read_alike_the_last_one_kept() -> None:
    """Every key of a rich window given twice, a value no field takes (301 characters) first and the real one
    last: both readers keep the last, so the window reads as the real one. Deliberate bug caught: one reader
    keeping the first value of a key, or refusing a key given twice, while the other keeps the last (a node could
    show the optimizer's checks one value and its store another)."""
    base = json.loads(encode(RICH))
    paths = [p for p in _paths(base) if p and isinstance(p[-1], str)]
    assert len(paths) > 70
    real = ("accepted", _values(RICH), [])
    for path in paths:
        payload = _with_duplicate(base, path, "x" * 301).encode()
        assert protocol.clean_bytes(payload) and payload.count(f'"{path[-1]}":'.encode()) >= 2
        assert _verdict(read_window, payload) == real, path
        assert _verdict(_protocol, payload) == real, path


def test_the_reader_has_the_models_fields_and_bounds() -> None:
    """Every field of every section, its type (an integer apart from a number), whether it may be null or left
    out, and every bound, length and pattern: the reader's JSON schema against the protocol's, item by item. A
    bound the protocol tightens and the reader does not would let the reader accept what the protocol refuses."""
    model = Telemetry.model_json_schema(by_alias=True)
    struct = msgspec.json.schema(reader.Window)
    expected = _constraints(model, model.get("$defs", {}))
    assert _constraints(struct, struct.get("$defs", {})) == expected
    assert expected["properties"]["gpus"]["items"]["properties"]["util"]["anyOf"][0]["prefixItems"][0] == {
        "type": "number",
        "minimum": 0,
        "maximum": 100,
    }, "the comparison reaches the bounds of a stats array's figures"
