"""A telemetry window as the optimizer reads it: ``agent.protocol.Telemetry`` decoded by msgspec.

``Telemetry`` (pydantic) is the protocol: the agent writes it, its JSON schema documents it, and it decides what
is accepted. The optimizer reads thousands of windows a second, and pydantic-core takes 1.3-1.4x ``json.loads``
of a window's bytes to validate it; msgspec validates the same bounds into slotted structs in ~0.5x
(``bench/ingest.py --validation-only --windows 60 --nodes 40 --rounds 3``: 63-67 us against 25-31 us a window).
So every window is first read here, and only what this reader cannot vouch for goes to the protocol's own
``decode``:

* a payload that is not plain ASCII without a backslash (``clean_bytes``): an escape may hide a control
  character, which the lenient decode leaves out field by field rather than refusing the window;
* a payload msgspec refuses, or one that fails the protocol's checks across values (``values_agree``,
  ``gpus_listed_agree``, the same functions its validators call).

``decode`` then accepts (possibly leaving fields out) or refuses with its reason and words, and what it
accepts is read again into a ``Window``. So the structs only ever carry windows ``Telemetry`` accepts, with the
same values: ``tests/test_window_reader.py`` holds the two readers to the same answer on valid, boundary and
hostile windows, and the structs' JSON schema to the models' (every field, type, bound, length and pattern).

A stats array is a plain 4-tuple here, ``(mean, p95, max, std)``: readers index it (``MEAN``, ``P95``...).
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter
from typing import Annotated, Final, Literal

import msgspec
from msgspec import Meta, Struct

from agent.protocol import (
    FLOAT32_MAX,
    HOST_PERCENT_FIELDS,
    MAX_CONNECTIONS,
    MAX_COUNTER,
    MAX_GPU_INDEX,
    MAX_PAYLOAD_BYTES,
    MAX_POWER_LIMIT_W,
    MAX_SAMPLES,
    PERCENT_FIELDS,
    DroppedField,
    ProtocolError,
    Telemetry,
    TopicKind,
    WorkloadKind,
    clean_bytes,
    decode,
    encode,
    gpus_listed_agree,
    values_agree,
)

MEAN, P95, MAX, STD = 0, 1, 2, 3  # positions in a stats array

# The protocol's constrained types (agent/protocol.py), as msgspec constraints. JSON numbers only: msgspec
# refuses a string for a number, a bool for either, a float for an int, and NaN and Infinity, which are not JSON.
_Measured = Annotated[float, Meta(ge=0, le=FLOAT32_MAX)]
_Percent = Annotated[float, Meta(ge=0, le=100)]
_Spread = Annotated[float, Meta(ge=0)]
_Count = Annotated[int, Meta(ge=0, le=MAX_COUNTER)]
_GpuIndex = Annotated[int, Meta(ge=0, le=MAX_GPU_INDEX)]
_Connections = Annotated[int, Meta(ge=0, le=MAX_CONNECTIONS)]
_Quantity = Annotated[float, Meta(ge=0)]
Stats = tuple[_Measured, _Measured, _Measured, _Spread]
Percentages = tuple[_Percent, _Percent, _Percent, _Spread]
_Ident = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
_OwnerName = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]+$")]
_Name = Annotated[str, Meta(min_length=1, max_length=64)]
_Text32 = Annotated[str, Meta(max_length=32)]
_Text64 = Annotated[str, Meta(max_length=64)]
_Text200 = Annotated[str, Meta(max_length=200)]
_Text300 = Annotated[str, Meta(max_length=300)]


# Every struct is slotted, immutable, refuses unknown fields like the models (extra="forbid"), and is not
# tracked by the cyclic garbage collector: a window holds no cycles, and thousands a second would only make
# collections run more often.


class WindowGpu(Struct, forbid_unknown_fields=True, frozen=True, gc=False):
    index: _GpuIndex
    util: Percentages | None = None
    mem_util: Percentages | None = None
    mem_used_mib: Stats | None = None
    power_w: Stats | None = None
    temp_c: Stats | None = None
    sm_clock_mhz: Stats | None = None
    pcie_tx_bps: Stats | None = None
    pcie_rx_bps: Stats | None = None
    nvlink_tx_bps: Stats | None = None
    nvlink_rx_bps: Stats | None = None
    c2c_tx_bps: Stats | None = None
    c2c_rx_bps: Stats | None = None
    sm_active: Percentages | None = None
    tensor_active: Percentages | None = None
    dram_active: Percentages | None = None
    sm_occupancy: Percentages | None = None
    util_series: Annotated[list[_Percent], Meta(max_length=3600)] = []
    workload: _Text200 | None = None
    xid_events: _Count = 0
    last_xid: _Count | None = None
    ecc_uncorrected: _Count | None = None
    remapped_rows: _Count | None = None
    power_limit_w: Annotated[float, Meta(ge=0, le=MAX_POWER_LIMIT_W)] | None = None
    power_capped_pct: Percentages | None = None
    thermal_slowdown_pct: Percentages | None = None
    hw_slowdown_pct: Percentages | None = None
    power_violation_pct: Stats | None = None
    thermal_violation_pct: Stats | None = None
    row_remap_pending: Annotated[int, Meta(ge=0, le=1)] | None = None
    row_remap_failure: Annotated[int, Meta(ge=0, le=1)] | None = None
    util_unavailable: Annotated[int, Meta(ge=0, le=1)] | None = None
    lost: bool = False


class WindowNic(Struct, forbid_unknown_fields=True, frozen=True, gc=False):
    name: _Name
    rx_bps: Stats | None = None
    tx_bps: Stats | None = None
    errors: _Count = 0
    drops: _Count = 0


class WindowDisk(Struct, forbid_unknown_fields=True, frozen=True, gc=False):
    name: _Name
    read_bps: Stats | None = None
    write_bps: Stats | None = None
    read_iops: Stats | None = None
    write_iops: Stats | None = None


class WindowHost(Struct, forbid_unknown_fields=True, frozen=True, gc=False):
    cpu_util: Percentages | None = None
    mem_used_pct: Percentages | None = None


class WindowMount(Struct, forbid_unknown_fields=True, frozen=True, gc=False):
    path: Annotated[str, Meta(min_length=1, max_length=255)]
    used_pct: _Percent
    free_bytes: _Count


class WindowWorkload(Struct, forbid_unknown_fields=True, frozen=True, gc=False):
    id: Annotated[str, Meta(min_length=1, max_length=200)]
    kind: WorkloadKind
    name: _Text200
    gpus: Annotated[list[_GpuIndex], Meta(max_length=64)]
    hint: _Text64 | None = None
    program: _Text64 | None = None
    listen_ports: Annotated[list[Annotated[int, Meta(ge=1, le=65535)]], Meta(max_length=16)] = []
    inbound_connections: _Connections | None = None
    inbound_peers: _Connections | None = None
    net_rx_bps: _Quantity | None = None
    net_tx_bps: _Quantity | None = None
    disk_read_bps: _Measured | None = None
    disk_write_bps: _Measured | None = None
    sched_step: _Text32 | None = None
    owner: _OwnerName | None = None
    owner_user: _OwnerName | None = None
    owner_claimed: bool | None = None
    gpu_mem_mib: Annotated[list[Annotated[float, Meta(ge=0, le=2**24)] | None], Meta(max_length=64)] | None = None


class Window(Struct, forbid_unknown_fields=True, frozen=True, gc=False, rename={"schema_": "schema"}):
    """One window of a node's telemetry (``Telemetry``'s fields, in its order)."""

    node: _Ident
    site: _Ident
    session: _Count
    seq: _Count
    start: float
    end: float
    samples: Annotated[int, Meta(ge=0, le=MAX_SAMPLES)]
    schema_: Literal[1, 2] = 2
    gpus: Annotated[list[WindowGpu], Meta(max_length=64)] = []
    gpu_unavailable: _Text300 | None = None
    nics: Annotated[list[WindowNic], Meta(max_length=64)] = []
    disks: Annotated[list[WindowDisk], Meta(max_length=64)] = []
    host: WindowHost = WindowHost()
    mounts: Annotated[list[WindowMount], Meta(max_length=32)] = []
    workloads: Annotated[list[WindowWorkload], Meta(max_length=64)] = []


_DECODER: Final = msgspec.json.Decoder(Window)
# What the checks across values read of every GPU and of the host, by C calls
_percentages, _host_percentages = attrgetter(*PERCENT_FIELDS), attrgetter(*HOST_PERCENT_FIELDS)
_index, _series = attrgetter("index"), attrgetter("util_series")


def _plausible(w: Window) -> bool:
    """The protocol's checks across values (``values_agree``, ``gpus_listed_agree``: what ``Telemetry`` and
    ``WorkloadRef`` check in their model validators); a window that fails one goes to ``decode``, which words the
    refusal."""
    gpus = w.gpus
    percentages = list(filter(None, chain(chain.from_iterable(map(_percentages, gpus)), _host_percentages(w.host))))
    longest = max(map(len, map(_series, gpus)), default=0)
    if not values_agree(w.start, w.end, w.samples, len(gpus), set(map(_index, gpus)), longest, percentages):
        return False
    return all(gpus_listed_agree(r.gpus, r.gpu_mem_mib) for r in w.workloads)


def read_window(payload: bytes | bytearray, dropped: list[DroppedField] | None = None) -> Window:
    """``payload`` as a Window when ``Telemetry`` accepts it; ProtocolError with ``decode``'s reason otherwise.

    With ``dropped`` (a list), bad text fields are left out rather than the window refused, as ``decode`` does,
    and each is appended as (field, reason)."""
    if len(payload) <= MAX_PAYLOAD_BYTES and clean_bytes(payload):
        try:
            window = _DECODER.decode(payload)
        except msgspec.MsgspecError:
            pass
        else:
            if _plausible(window):
                return window
    accepted = decode(TopicKind.TELEMETRY, payload, dropped)
    if not isinstance(accepted, Telemetry):  # decode gives the model of the kind it is asked for
        raise ProtocolError("schema", "not a telemetry window")
    return as_window(accepted)


def as_window(window: Telemetry) -> Window:
    """A window the protocol accepted, as a Window (offline recordings, and windows ``decode`` mended)."""
    try:
        return _DECODER.decode(encode(window))
    except msgspec.MsgspecError as exc:  # the two readers disagree: tests/test_window_reader.py says they must not
        raise ProtocolError("schema", f"accepted by the protocol, refused by the window reader: {exc}") from None
