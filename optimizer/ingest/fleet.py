"""The optimizer's view of the fleet, fed one MQTT message at a time.

Every message is validated; a bad one is rejected with a reason label and counted, and never disturbs what
the good ones built. Per node the optimizer keeps its inventory (from the retained birth), its online state
and a bounded history of telemetry windows.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import attrgetter

import msgspec

from agent.protocol import (
    CONTROL,
    MAX_RESEND_RANGES,
    Birth,
    DroppedField,
    NodeStatus,
    ProtocolError,
    State,
    Topic,
    TopicKind,
    WorkloadKind,
    clean_bytes,
    decode,
    parse_topic,
)
from optimizer.ingest.digest import KnownRefs, WindowDigest, birth_devices, digest
from optimizer.ingest.history import History
from optimizer.ingest.window import Window, WindowWorkload, read_window

log = logging.getLogger(__name__)

SESSIONS_TRACKED = 8  # sessions per node whose sequence numbers are remembered
# Rejections logged one by one per node and reason (per reason for messages that name no node); after that every
# 1000th. Per node, so that one node's flood never spends the budget that would have told of another's refusals.
LOGGED_PER_NODE = 5
LOGGED_PER_REASON = 20
MISSING_TRACKED = 20_000  # windows per node awaited from a gap in its sequence numbers
# A window is charged at least this many seconds of its node's budget: the shortest window an agent closes
# (agent.publish_interval).
MIN_WINDOW_SECONDS = 1.0
# A topic level the optimizer publishes under: a node of that name could forge a site's retained plan.
RESERVED_NODE_NAMES = frozenset({"recommendations"})
# Kinds of workload that can span nodes; any other (a pod, a unit, a container, a process group) lives on one.
MULTI_NODE_KINDS = frozenset({WorkloadKind.SLURM_JOB})
# A single-node workload changes node (a StatefulSet pod rescheduled) once its old node has not reported it
# for this long; until then another node reporting its id is a conflict.
TAKEOVER_SECONDS = 120.0
TOPICS_CACHED = 100_000  # parsed topics remembered (three per node)
# Refusals that read nothing (a bucket already empty): they are not charged again, so that the bucket refills.
UNREAD = frozenset({"rate_limited"})


_index_of = attrgetter("index")


@dataclass(frozen=True, slots=True)
class IngestLimits:
    """What the live optimizer holds each node to. The defaults (all off) suit offline replays of recordings,
    whose timestamps are old and whose windows arrive as fast as a file reads."""

    clock_skew: float | None = None  # seconds a timestamp may lie ahead of now (and a window behind it)
    # Windows are limited by the time they cover, never by when they arrive: a node may deliver
    # ``replay_seconds`` of window time at once (its spool replayed, or the backlog the broker kept while the
    # optimizer was away), then ``time_rate`` seconds of windows a second. An honest node covers no more time
    # than passes, however late its windows arrive.
    time_rate: float | None = None
    replay_seconds: float = 86_400.0
    # Messages read and refused (duplicates, malformed, over the time budget): past ``refusal_burst`` of them at
    # once (``refusal_rate`` a second sustained), the node's further messages are refused unread, so that a flood
    # costs little to refuse. Honest nodes are rarely refused anything.
    refusal_rate: float | None = None
    refusal_burst: float = 360.0
    # Births and states, refused unread past ``control_burst`` at once: an agent sends one of each per connection.
    control_rate: float | None = None
    control_burst: float = 30.0
    workloads_per_node: int | None = None  # distinct workloads a node may report within the horizon
    inventory: Callable[[Birth], str | None] | None = None  # says why a birth's hardware is implausible
    # A site's inventory of record (a CMDB): the birth to plan from, and why it differs from what the node claims
    site_inventory: Callable[[str, Birth], tuple[Birth, str | None]] | None = None


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
    known_workloads: KnownRefs = field(default_factory=dict)
    received: int = 0  # windows accepted
    workload_seen: dict[str, int] = field(default_factory=dict)  # workload id -> ``received`` when last reported
    # per recent session: windows a gap in its sequence numbers says never arrived -> when the gap was noticed
    missing: dict[int, dict[int, float]] = field(default_factory=dict)
    refilled: int = 0  # awaited windows that arrived after all
    lost: int = 0  # awaited windows given up on

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
        self.dropped_fields: Counter[tuple[str, str]] = Counter()  # (field, reason): text left out of windows
        self.inventory_flags: dict[tuple[str, str], str] = {}  # (site, node) -> how its birth differs from record
        self._buckets: dict[tuple[str, str, str], _Bucket] = {}  # (site, node, what is limited)
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

    def ingest(self, topic: str, payload: bytes | bytearray) -> Birth | State | Window | None:
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
            n = self.rejected[exc.reason]
            logged = LOGGED_PER_REASON
            if where is not None and where.node is not None:
                key = (where.site, where.node, exc.reason)
                self.node_rejections[key] += 1
                n, logged = self.node_rejections[key], LOGGED_PER_NODE
                if exc.reason not in UNREAD and self.limits.refusal_rate is not None:
                    self._charge((where.site, where.node, "refused"), self.limits.refusal_rate, 1.0)
            if n <= logged or n % 1000 == 0:  # a flood of bad messages must not flood the log
                log.warning("rejected message on %r: %s (%d %s so far)", topic[:200], exc, n, exc.reason)
            return None

    def record(self, site: str, node: str) -> NodeRecord | None:
        return self.nodes.get((site, node))

    def _apply(self, where: Topic, payload: bytes | bytearray) -> Birth | State | Window | None:
        if where.node is None:
            raise ProtocolError("bad_topic", "not a node topic")
        if where.node in RESERVED_NODE_NAMES:
            raise ProtocolError("reserved_name", f"{where.node!r} is a name the optimizer publishes under")
        if not payload and where.kind in (TopicKind.STATE, TopicKind.BIRTH):
            self.ignored["cleared_retained"] += 1  # someone cleared a retained message: nothing to apply
            return None
        limits = self.limits
        # before decoding, so that a flood costs little
        if limits.refusal_rate is not None:
            bucket = self._take((where.site, where.node, "refused"), limits.refusal_rate, limits.refusal_burst)
            if bucket.tokens < 1.0:
                raise ProtocolError(
                    "rate_limited",
                    f"more than {limits.refusal_burst:g} of its messages refused at once ({limits.refusal_rate:g} a "
                    "second): refused unread",
                )
        if where.kind is not TopicKind.TELEMETRY and limits.control_rate is not None:
            self._admit((where.site, where.node, "control"), limits.control_rate, limits.control_burst, where.kind)
        dropped: list[DroppedField] = []
        message: Birth | State | Window
        if where.kind is TopicKind.TELEMETRY:
            message = read_window(payload, dropped)
        else:
            decoded = decode(where.kind, payload)
            if not isinstance(decoded, Birth | State):
                raise ProtocolError("bad_topic", "not a node message")
            message = decoded
        if message.node != where.node:
            raise ProtocolError("node_mismatch", f"payload says node {message.node!r}, topic says {where.node!r}")
        if isinstance(message, Birth | Window) and message.site != where.site:
            raise ProtocolError("site_mismatch", f"payload says site {message.site!r}, topic says {where.site!r}")
        if not isinstance(message, Window) and not clean_bytes(payload):
            _no_control_characters(message)  # JSON itself refuses raw control bytes; escapes and UTF-8 need a look
        self._check_time(message)
        record = self._record(where.site, where.node)
        if isinstance(message, Birth):
            if message.session < record.session:
                raise ProtocolError("stale_session", f"birth of session {message.session} < {record.session}")
            why = limits.inventory(message) if limits.inventory is not None else None
            if why is not None:
                raise ProtocolError("implausible_inventory", why)
            if limits.site_inventory is not None:
                message = self._reconcile(record, message, limits.site_inventory)
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
            if dropped:
                self._note_dropped(record, dropped)
        self.accepted[where.kind.value] += 1
        return message

    def _reconcile(
        self, record: NodeRecord, birth: Birth, check: Callable[[str, Birth], tuple[Birth, str | None]]
    ) -> Birth:
        """The birth to plan from by the site's inventory of record; a difference is flagged and logged once."""
        planned, why = check(record.site, birth)
        key = (record.site, record.node)
        if why is None:
            self.inventory_flags.pop(key, None)
        elif self.inventory_flags.get(key) != why:
            self.inventory_flags[key] = why
            log.warning("%s/%s: birth differs from the site inventory: %s", record.site, record.node, why)
        return planned

    def _note_dropped(self, record: NodeRecord, dropped: list[DroppedField]) -> None:
        """Count the text fields left out of an accepted window (per field and reason, and per node)."""
        key = (record.site, record.node, "field_dropped")
        for name, reason in dropped:
            self.dropped_fields[(name, reason)] += 1
            self.node_rejections[key] += 1
        n = self.node_rejections[key]
        if n <= LOGGED_PER_NODE or n % 1000 == 0:
            fields = ", ".join(sorted({f"{name} ({reason})" for name, reason in dropped}))
            log.warning("%s/%s: left out of a window: %s (%d so far)", record.site, record.node, fields, n)

    def _telemetry(self, record: NodeRecord, window: Window) -> None:
        """Accept each (session, seq) once, in any order. Windows of an earlier session are still accepted after a
        restart: an agent replays what it spooled during an outage once it reconnects, after its new birth. A
        window that fills a gap in the sequence numbers (it was lost on the way and sent again) is accepted."""
        session, seq = window.session, window.seq
        seen = record.last_seq
        last = seen.get(session)
        awaited = record.missing.get(session)
        if last is None and len(seen) >= SESSIONS_TRACKED and session < min(seen):
            raise ProtocolError("stale_session", f"window of session {session}, long superseded")
        refill = last is not None and seq <= last
        if refill and (awaited is None or seq not in awaited):
            raise ProtocolError("duplicate", f"window {session}/{seq} already seen (last {last})")
        if record.birth is not None:
            devices = birth_devices(record.birth)
            if not devices.issuperset(map(_index_of, window.gpus)) or any(
                not devices.issuperset(r.gpus) for r in window.workloads
            ):
                self._sequence(record, session, seq, last)  # sent again it would be refused again: not awaited
                raise ProtocolError("gpu_index", f"a GPU index not among the {len(devices)} device(s) of the birth")
        if self.limits.time_rate is not None:
            # refused here, the window is still awaited: asked for again, it arrives once the budget has refilled
            cost = max(window.end - window.start, MIN_WINDOW_SECONDS)
            key = (record.site, record.node, "window_time")
            self._admit(key, self.limits.time_rate, self.limits.replay_seconds, "window time", cost)
        self._sequence(record, session, seq, last)
        refs = self._admit_workloads(record, window)
        record.session = max(record.session, window.session)
        if refs is not window.workloads:
            window = msgspec.structs.replace(window, workloads=refs)
        kept = digest(
            window, record.birth, record.known_workloads, record.windows[-1].workloads if record.windows else ()
        )
        record.windows.append(kept)
        record.history.add(kept)
        record.received += 1
        for ref in refs:
            record.workload_seen[ref.id] = record.received
        if record.received % self.horizon == 0:
            self._evict(record)

    def _sequence(self, record: NodeRecord, session: int, seq: int, last: int | None) -> None:
        """Note window ``seq`` of ``session`` as received: a gap before it is awaited, an awaited one arrived."""
        seen = record.last_seq
        if last is not None and seq <= last:
            awaited = record.missing.get(session)
            if awaited is not None and awaited.pop(seq, None) is not None:
                record.refilled += 1
            return
        if last is not None and seq > last + 1:
            self._await(record, session, last + 1, seq)
        seen[session] = seq
        while len(seen) > SESSIONS_TRACKED:
            oldest = min(seen)
            del seen[oldest]
            record.lost += len(record.missing.pop(oldest, {}))

    def _await(self, record: NodeRecord, session: int, first: int, end: int) -> None:
        """Note windows ``first`` to ``end - 1`` of ``session`` as missing (a gap in the sequence numbers)."""
        awaited = record.missing.setdefault(session, {})
        now = self.clock()
        room = MISSING_TRACKED - sum(len(m) for m in record.missing.values())
        start = max(first, end - max(room, 0))
        record.lost += start - first  # more than is tracked: the oldest are given up at once
        for seq in range(start, end):
            awaited[seq] = now

    def awaited(self, delay: float, give_up: float) -> dict[tuple[str, str], list[tuple[int, int, int]]]:
        """Per node, the (session, first, last) ranges of windows missing for at least ``delay`` seconds (at most
        ``MAX_RESEND_RANGES``, oldest first); windows missing longer than ``give_up`` are given up and counted."""
        now = self.clock()
        out: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
        for key, record in list(self.nodes.items()):
            if not record.missing:
                continue
            ranges: list[tuple[int, int, int]] = []
            for session in sorted(record.missing):
                awaited = record.missing[session]
                for seq in [q for q, at in awaited.items() if now - at > give_up]:
                    del awaited[seq]
                    record.lost += 1
                if not awaited:
                    del record.missing[session]
                    continue
                for seq in sorted(q for q, at in awaited.items() if now - at >= delay):
                    if ranges and ranges[-1][0] == session and ranges[-1][2] == seq - 1:
                        ranges[-1] = (session, ranges[-1][1], seq)
                    elif len(ranges) < MAX_RESEND_RANGES:
                        ranges.append((session, seq, seq))
            if ranges:
                out[key] = ranges
        return out

    def _take(self, key: tuple[str, str, str], rate: float, burst: float) -> _Bucket:
        """The token bucket for ``key`` (full when new), refilled at ``rate`` a second up to ``burst``."""
        now = self.clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) > 8 * len(self.nodes) + 10_000:
                self._buckets.clear()  # topics that never became nodes must not grow the table forever
            bucket = self._buckets[key] = _Bucket(burst, now)
        bucket.tokens = min(burst, bucket.tokens + max(0.0, now - bucket.at) * rate)
        bucket.at = now
        return bucket

    def _admit(self, key: tuple[str, str, str], rate: float, burst: float, what: str, cost: float = 1.0) -> None:
        """Take ``cost`` from the node's bucket for ``what``, or refuse the message as ``rate_limited``."""
        bucket = self._take(key, rate, burst)
        if bucket.tokens < cost:
            if what == "window time":
                raise ProtocolError(
                    "time_budget",
                    f"windows cover more time than passes: {cost:g} s over the {bucket.tokens:.0f} s left of "
                    f"{burst:g} (optimizer.node_replay_seconds), refilled {rate:g} s a second",
                )
            raise ProtocolError("rate_limited", f"more than {burst:g} {what} messages at once ({rate:g} a second)")
        bucket.tokens -= cost

    def _charge(self, key: tuple[str, str, str], rate: float, cost: float) -> None:
        """Take ``cost`` from a bucket, down to nothing (a refusal is charged even when none is left)."""
        bucket = self._take(key, rate, self.limits.refusal_burst)
        bucket.tokens = max(0.0, bucket.tokens - cost)

    def _check_time(self, message: Birth | State | Window) -> None:
        skew = self.limits.clock_skew
        if skew is None:
            return
        now = self.clock()
        # A retained birth or state can be days old (the node has been up that long); windows cannot.
        if isinstance(message, Window):
            if message.end > now + skew or message.start < now - skew:
                raise ProtocolError("timestamp", f"window {message.start:.0f}-{message.end:.0f}, now {now:.0f}")
        elif message.timestamp > now + skew:
            raise ProtocolError("timestamp", f"timestamp {message.timestamp:.0f} ahead of now {now:.0f}")

    def _admit_workloads(self, record: NodeRecord, window: Window) -> list[WindowWorkload]:
        """The window's workload references this node may claim; the rest are dropped and counted.

        A single-node workload (a pod, a unit) belongs to the node that reported it first until that node goes
        quiet about it; a node reporting another's id would otherwise turn it into a multi-node workload.
        """
        now = self.clock()
        cap = self.limits.workloads_per_node
        seen, oldest = record.workload_seen, record.received - self.horizon
        known: set[str] | None = None  # the ids counted against the cap: needed only for an id not reported lately
        kept: list[WindowWorkload] = []
        dropped = False
        for ref in window.workloads:
            if cap is not None and seen.get(ref.id, oldest) <= oldest:
                if known is None:
                    known = {wid for wid, at in seen.items() if at > oldest}
                over = ref.id not in known and len(known) >= cap
            else:
                over = False
            if over:
                reason: str | None = "workload_cap"  # checked first: a dropped id must not claim ownership
            else:
                reason = self._claim(record, ref, now)
            if reason is None:
                if known is not None:
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

    def _claim(self, record: NodeRecord, ref: WindowWorkload, now: float) -> str | None:
        key = (record.site, ref.id)
        owner = self._owners.get(key)
        if owner is not None and owner.node == record.node:
            owner.kind, owner.seen = ref.kind, now  # its own workload, window after window: no new record
            return None
        if owner is None or now - owner.seen > TAKEOVER_SECONDS:
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
        record.known_workloads = {wid: e for wid, e in record.known_workloads.items() if wid in alive}


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


def _no_control_characters(message: Birth | State) -> None:
    for text in _strings(message):
        if CONTROL.search(text):
            raise ProtocolError("control_character", f"a name or id holds a control character: {text[:40]!r}")
