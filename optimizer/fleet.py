"""The optimizer's view of the fleet, fed one MQTT message at a time.

Every message is validated; a bad one is rejected with a reason label and counted, and never disturbs what
the good ones built. Per node the optimizer keeps its inventory (from the retained birth), its online state
and a bounded history of telemetry windows.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from dataclasses import dataclass, field

from agent.protocol import (
    Birth,
    NodeStatus,
    ProtocolError,
    State,
    Telemetry,
    TopicKind,
    WorkloadRef,
    decode,
    parse_topic,
)
from optimizer.digest import RefKey, WindowDigest, digest
from optimizer.history import History

log = logging.getLogger(__name__)

SESSIONS_TRACKED = 8  # sessions per node whose sequence numbers are remembered
LOGGED_PER_REASON = 20  # rejections logged one by one per reason; after that every 1000th


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

    def __post_init__(self) -> None:
        self.windows = deque(self.windows, maxlen=self.horizon)


class Fleet:
    """Validated state of every node seen under one MQTT prefix."""

    def __init__(self, prefix: str, horizon_windows: int = 60) -> None:
        self.prefix = prefix
        self.horizon = horizon_windows
        self.nodes: dict[tuple[str, str], NodeRecord] = {}
        self.accepted: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self.ignored: Counter[str] = Counter()  # well-formed but nothing to apply (a retained message cleared)

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
        try:
            return self._apply(topic, payload)
        except ProtocolError as exc:
            self.rejected[exc.reason] += 1
            n = self.rejected[exc.reason]
            if n <= LOGGED_PER_REASON or n % 1000 == 0:  # a flood of bad messages must not flood the log
                log.warning("rejected message on %r: %s (%d %s so far)", topic[:200], exc, n, exc.reason)
            return None

    def record(self, site: str, node: str) -> NodeRecord | None:
        return self.nodes.get((site, node))

    def _apply(self, topic: str, payload: bytes | bytearray) -> Birth | State | Telemetry | None:
        where = parse_topic(self.prefix, topic)
        if where.node is None:
            raise ProtocolError("bad_topic", "not a node topic")
        if not payload and where.kind in (TopicKind.STATE, TopicKind.BIRTH):
            self.ignored["cleared_retained"] += 1  # someone cleared a retained message: nothing to apply
            return None
        message = decode(where.kind, payload)
        if not isinstance(message, Birth | State | Telemetry):
            raise ProtocolError("bad_topic", "not a node message")
        if message.node != where.node:
            raise ProtocolError("node_mismatch", f"payload says node {message.node!r}, topic says {where.node!r}")
        if isinstance(message, Birth | Telemetry) and message.site != where.site:
            raise ProtocolError("site_mismatch", f"payload says site {message.site!r}, topic says {where.site!r}")
        record = self._record(where.site, where.node)
        if isinstance(message, Birth):
            if message.session < record.session:
                raise ProtocolError("stale_session", f"birth of session {message.session} < {record.session}")
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
        record.session = max(record.session, window.session)
        if len(record.known_workloads) > 1000:
            record.known_workloads.clear()  # workloads come and go; the interning table must not grow forever
        kept = digest(window, record.birth, record.known_workloads)
        record.windows.append(kept)
        record.history.add(kept)
