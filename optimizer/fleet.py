"""The optimizer's view of the fleet, fed one MQTT message at a time.

Every message is validated; a bad one is rejected with a reason label and counted, and never disturbs what
the good ones built. Per node the optimizer keeps its inventory (from the retained birth), its online state
and a bounded history of telemetry windows.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import attrgetter

from agent.protocol import (
    Birth,
    NodeStatus,
    ProtocolError,
    State,
    Telemetry,
    Topic,
    TopicKind,
    WorkloadKind,
    WorkloadRef,
    decode,
    parse_topic,
)
from optimizer.digest import RefKey, WindowDigest, birth_devices, digest
from optimizer.history import History

log = logging.getLogger(__name__)

SESSIONS_TRACKED = 8  # sessions per node whose sequence numbers are remembered
LOGGED_PER_REASON = 20  # rejections logged one by one per reason; after that every 1000th
# A topic level the optimizer publishes under: a node of that name could forge a site's retained plan.
RESERVED_NODE_NAMES = frozenset({"recommendations"})
# Kinds of workload that can span nodes; any other (a pod, a unit, a container, a process group) lives on one.
MULTI_NODE_KINDS = frozenset({WorkloadKind.SLURM_JOB})
# A single-node workload changes node (a StatefulSet pod rescheduled) once its old node has not reported it
# for this long; until then another node reporting its id is a conflict.
TAKEOVER_SECONDS = 120.0
TOPICS_CACHED = 100_000  # parsed topics remembered (three per node)
# Control characters (C0, DEL, C1), zero-width and bidirectional overrides: names end up in terminals, chat
# messages and spreadsheets, where these hide or rewrite text.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


_index_of = attrgetter("index")


@dataclass(frozen=True, slots=True)
class IngestLimits:
    """What the live optimizer holds each node to. The defaults (all off) suit offline replays of recordings,
    whose timestamps are old and whose windows arrive as fast as a file reads."""

    clock_skew: float | None = None  # seconds a timestamp may lie ahead of now (and a window behind it)
    window_rate: float | None = None  # windows a second a node may send, sustained
    window_burst: float = 360.0  # windows a node may send at once (an agent replaying its spool)
    workloads_per_node: int | None = None  # distinct workloads a node may report within the horizon
    inventory: Callable[[Birth], str | None] | None = None  # says why a birth's hardware is implausible


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


@dataclass(slots=True)
class _Owner:
    node: str
    kind: WorkloadKind
    seen: float  # ingest time of the last window that reported the workload


@dataclass(slots=True)
class NodeRecord:
    site: str
    node: str
    horizon: int
    birth: Birth | None = None
    status: NodeStatus = NodeStatus.OFFLINE
    session: int = -1
    last_seq: dict[int, int] = field(default_factory=dict)  # per recent session: the last window seen
    windows: deque[WindowDigest] = field(default_factory=deque)
    history: History = field(default_factory=History)
    known_workloads: dict[RefKey, WorkloadRef] = field(default_factory=dict)
    received: int = 0  # windows accepted
    workload_seen: dict[str, int] = field(default_factory=dict)  # workload id -> ``received`` when last reported

    def __post_init__(self) -> None:
        self.windows = deque(self.windows, maxlen=self.horizon)


class Fleet:
    """Validated state of every node seen under one MQTT prefix."""

    def __init__(
        self,
        prefix: str,
        horizon_windows: int = 60,
        limits: IngestLimits | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.prefix = prefix
        self.horizon = horizon_windows
        self.limits = limits or IngestLimits()
        self.clock = clock
        self.nodes: dict[tuple[str, str], NodeRecord] = {}
        self.accepted: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self.ignored: Counter[str] = Counter()  # well-formed but nothing to apply (a retained message cleared)
        # per (site, node, reason): rejected messages, and workload references dropped from accepted windows
        self.node_rejections: Counter[tuple[str, str, str]] = Counter()
        self.dropped_refs: Counter[str] = Counter()  # workload references dropped, by reason
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self._owners: dict[tuple[str, str], _Owner] = {}  # (site, workload id) -> the node it runs on
        self._owners_pruned = 0.0
        self._topics: dict[str, Topic] = {}

    def _record(self, site: str, node: str) -> NodeRecord:
        key = (site, node)
        if key not in self.nodes:
            self.nodes[key] = NodeRecord(site, node, self.horizon)
        return self.nodes[key]

    def snapshot(self) -> Fleet:
        """A copy that planning can read in another thread while ingest goes on (windows are immutable)."""
        copy = Fleet(self.prefix, self.horizon)
        for key, r in list(self.nodes.items()):
            copy.nodes[key] = NodeRecord(
                r.site,
                r.node,
                r.horizon,
                r.birth,
                r.status,
                r.session,
                dict(r.last_seq),
                deque(r.windows),
                r.history.copy(),
            )
        return copy

    def sites(self) -> list[str]:
        return sorted({site for site, _ in self.nodes})

    def ingest(self, topic: str, payload: bytes | bytearray) -> Birth | State | Telemetry | None:
        """Apply one message; return it once accepted, or None (the reason counted) when it is rejected."""
        where: Topic | None = None
        try:
            where = self._topics.get(topic)
            if where is None:
                where = parse_topic(self.prefix, topic)
                if len(self._topics) >= TOPICS_CACHED:
                    self._topics.clear()
                self._topics[topic] = where  # a node sends on the same three topics all its life
            return self._apply(where, payload)
        except ProtocolError as exc:
            self.rejected[exc.reason] += 1
            if where is not None and where.node is not None:
                self.node_rejections[(where.site, where.node, exc.reason)] += 1
            n = self.rejected[exc.reason]
            if n <= LOGGED_PER_REASON or n % 1000 == 0:  # a flood of bad messages must not flood the log
                log.warning("rejected message on %r: %s (%d %s so far)", topic[:200], exc, n, exc.reason)
            return None

    def record(self, site: str, node: str) -> NodeRecord | None:
        return self.nodes.get((site, node))

    def _apply(self, where: Topic, payload: bytes | bytearray) -> Birth | State | Telemetry | None:
        if where.node is None:
            raise ProtocolError("bad_topic", "not a node topic")
        if where.node in RESERVED_NODE_NAMES:
            raise ProtocolError("reserved_name", f"{where.node!r} is a name the optimizer publishes under")
        if not payload and where.kind in (TopicKind.STATE, TopicKind.BIRTH):
            self.ignored["cleared_retained"] += 1  # someone cleared a retained message: nothing to apply
            return None
        if where.kind is TopicKind.TELEMETRY and self.limits.window_rate is not None:
            self._admit((where.site, where.node), self.limits.window_rate)  # before decoding: a flood costs little
        message = decode(where.kind, payload)
        if not isinstance(message, Birth | State | Telemetry):
            raise ProtocolError("bad_topic", "not a node message")
        if message.node != where.node:
            raise ProtocolError("node_mismatch", f"payload says node {message.node!r}, topic says {where.node!r}")
        if isinstance(message, Birth | Telemetry) and message.site != where.site:
            raise ProtocolError("site_mismatch", f"payload says site {message.site!r}, topic says {where.site!r}")
        if not (payload.isascii() and b"\\u" not in payload and b"\x7f" not in payload):
            _no_control_characters(message)  # JSON itself refuses raw control bytes; escapes and UTF-8 need a look
        self._check_time(message)
        record = self._record(where.site, where.node)
        if isinstance(message, Birth):
            if message.session < record.session:
                raise ProtocolError("stale_session", f"birth of session {message.session} < {record.session}")
            why = self.limits.inventory(message) if self.limits.inventory is not None else None
            if why is not None:
                raise ProtocolError("implausible_inventory", why)
            record.session = message.session
            record.birth = message
            record.status = NodeStatus.ONLINE
        elif isinstance(message, State):
            if message.session < record.session:
                raise ProtocolError("stale_session", f"state of session {message.session} < {record.session}")
            record.session = message.session
            record.status = message.status
        else:
            self._telemetry(record, message)
        self.accepted[where.kind.value] += 1
        return message

    def _telemetry(self, record: NodeRecord, window: Telemetry) -> None:
        """Accept each (session, seq) once. Windows of an earlier session are still accepted after a restart:
        an agent replays what it spooled during an outage once it reconnects, after its new birth."""
        seen = record.last_seq
        last = seen.get(window.session)
        if last is None and len(seen) >= SESSIONS_TRACKED and window.session < min(seen):
            raise ProtocolError("stale_session", f"window of session {window.session}, long superseded")
        if last is not None and window.seq <= last:
            raise ProtocolError("duplicate", f"window {window.session}/{window.seq} already seen (last {last})")
        seen[window.session] = window.seq
        while len(seen) > SESSIONS_TRACKED:
            del seen[min(seen)]
        if record.birth is not None:
            devices = birth_devices(record.birth)
            if not devices.issuperset(map(_index_of, window.gpus)) or any(
                not devices.issuperset(r.gpus) for r in window.workloads
            ):
                raise ProtocolError("gpu_index", f"a GPU index not among the {len(devices)} device(s) of the birth")
        refs = self._admit_workloads(record, window)
        record.session = max(record.session, window.session)
        if refs is not window.workloads:
            window = window.model_copy(update={"workloads": refs})
        kept = digest(window, record.birth, record.known_workloads)
        record.windows.append(kept)
        record.history.add(kept)
        record.received += 1
        for ref in refs:
            record.workload_seen[ref.id] = record.received
        if record.received % self.horizon == 0:
            self._evict(record)

    def _admit(self, key: tuple[str, str], rate: float) -> None:
        """A token bucket per node: ``window_burst`` at once, ``rate`` a second sustained."""
        now = self.clock()
        burst = self.limits.window_burst
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) > 4 * len(self.nodes) + 10_000:
                self._buckets.clear()  # topics that never became nodes must not grow the table forever
            bucket = self._buckets[key] = _Bucket(burst, now)
        bucket.tokens = min(burst, bucket.tokens + max(0.0, now - bucket.at) * rate)
        bucket.at = now
        if bucket.tokens < 1.0:
            raise ProtocolError(
                "rate_limited",
                f"more than {rate:g} windows a second (burst {burst:g}); optimizer.node_window_rate must stay above "
                "the agents' publish_rate",
            )
        bucket.tokens -= 1.0

    def _check_time(self, message: Birth | State | Telemetry) -> None:
        skew = self.limits.clock_skew
        if skew is None:
            return
        now = self.clock()
        # A retained birth or state can be days old (the node has been up that long); windows cannot.
        if isinstance(message, Telemetry):
            if message.end > now + skew or message.start < now - skew:
                raise ProtocolError("timestamp", f"window {message.start:.0f}-{message.end:.0f}, now {now:.0f}")
        elif message.timestamp > now + skew:
            raise ProtocolError("timestamp", f"timestamp {message.timestamp:.0f} ahead of now {now:.0f}")

    def _admit_workloads(self, record: NodeRecord, window: Telemetry) -> list[WorkloadRef]:
        """The window's workload references this node may claim; the rest are dropped and counted.

        A single-node workload (a pod, a unit) belongs to the node that reported it first until that node goes
        quiet about it; a node reporting another's id would otherwise turn it into a multi-node workload.
        """
        now = self.clock()
        cap = self.limits.workloads_per_node
        alive = [wid for wid, at in record.workload_seen.items() if at > record.received - self.horizon]
        known = set(alive)
        kept: list[WorkloadRef] = []
        dropped = False
        for ref in window.workloads:
            if cap is not None and ref.id not in known and len(known) >= cap:
                reason: str | None = "workload_cap"  # checked first: a dropped id must not claim ownership
            else:
                reason = self._claim(record, ref, now)
            if reason is None:
                known.add(ref.id)
                kept.append(ref)
                continue
            dropped = True
            self.dropped_refs[reason] += 1
            self.node_rejections[(record.site, record.node, reason)] += 1
            n = self.dropped_refs[reason]
            if n <= LOGGED_PER_REASON or n % 1000 == 0:
                log.warning("%s/%s: dropped workload %r: %s (%d so far)", record.site, record.node, ref.id, reason, n)
        if now - self._owners_pruned > TAKEOVER_SECONDS:
            self._owners_pruned = now
            self._owners = {k: o for k, o in self._owners.items() if now - o.seen <= TAKEOVER_SECONDS}
        return kept if dropped else window.workloads

    def _claim(self, record: NodeRecord, ref: WorkloadRef, now: float) -> str | None:
        key = (record.site, ref.id)
        owner = self._owners.get(key)
        if owner is None or owner.node == record.node or now - owner.seen > TAKEOVER_SECONDS:
            self._owners[key] = _Owner(record.node, ref.kind, now)
            return None
        if ref.kind == owner.kind and ref.kind in MULTI_NODE_KINDS:
            return None
        return "workload_conflict"

    def _evict(self, record: NodeRecord) -> None:
        """Forget workloads the node has not reported within the horizon: their history, interned references
        and the ids counted against its cap."""
        alive = {wid for wid, at in record.workload_seen.items() if at > record.received - self.horizon}
        record.workload_seen = {wid: at for wid, at in record.workload_seen.items() if wid in alive}
        record.history.retain(alive)
        record.known_workloads = {k: r for k, r in record.known_workloads.items() if k[0] in alive}


def _strings(value: object) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list | tuple):
        if value and isinstance(value[0], int | float):
            return  # a stats array or a per-second series: numbers all through (the model checked them)
        for item in value:
            if isinstance(item, str | list | tuple) or hasattr(item, "__pydantic_fields__"):
                yield from _strings(item)
    elif hasattr(value, "__pydantic_fields__"):
        for item in value.__dict__.values():
            yield from _strings(item)


def _no_control_characters(message: Birth | State | Telemetry) -> None:
    for text in _strings(message):
        if _CONTROL.search(text):
            raise ProtocolError("control_character", f"a name or id holds a control character: {text[:40]!r}")
