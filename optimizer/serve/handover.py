"""A site's alert and lifecycle state, handed from one optimizer to the next through the broker.

The owner of a site publishes, retained on ``{prefix}/{site}/handover``, what it posted about the site's moves to
each chat receiver, people's decisions on them (acknowledged, dismissed, reopened: when, and on which optimizer)
and how long each proposed move has been settling. Every optimizer that follows the site keeps the latest record it
accepted; when it plans the site (a takeover, or its owner coming back), it takes the record in before it folds the
plan into its lifecycle and alert log, so a move already posted is not posted again and a decision holds. Where
both sides know a move, the later decision and the later post win, entry by entry.

Records are hostile input: the broker's ACL lets only optimizer accounts write the topic, and a record is also
refused (counted by reason) when it is malformed, too large, names another site than its topic, comes from an
optimizer whose presence does not claim the site, or is dated in the future.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable

from agent.protocol import (
    MAX_HANDOVER_ENTRIES,
    HandedPost,
    HandedSettling,
    HandedState,
    Handover,
    Plan,
    ProtocolError,
    Recommendation,
    handover_site,
    move_fingerprint,
    parse_handover,
)
from optimizer.serve.alerts.journal import Sent
from optimizer.serve.lifecycle import RecState
from optimizer.serve.ownership import Ownership

log = logging.getLogger(__name__)

# How far ahead of this optimizer's clock a record may be dated. Optimizers keep time by NTP (milliseconds apart);
# a record from further ahead would win every later comparison, so the bound is also how long a forged one could.
MAX_SKEW = 300.0
LOGGED_PER_REASON = 20

Decision = tuple[str, RecState, float, str]  # id, state, when, on which optimizer
Post = tuple[str, str, Sent]  # receiver, id, when


class Handovers:
    """The records this optimizer accepted from the broker (the latest per site), and what it last published."""

    def __init__(self, prefix: str, ownership: Ownership, clock: Callable[[], float] = time.time) -> None:
        self.prefix = prefix
        self.ownership = ownership
        self.clock = clock
        # site -> writer -> the latest record accepted: every optimizer that planned the site leaves its own, and a
        # record of one never hides another's (the retained topic holds the last writer's only)
        self.held: dict[str, dict[str, Handover]] = {}
        self.accepted = 0
        self.rejected: Counter[str] = Counter()
        self.adopted: Counter[str] = Counter()  # entries that changed state here, by kind: decision, post, settling
        self.mismatched = 0  # posts of moves this optimizer plans under the same id but names otherwise
        self.published = 0
        self._content: dict[str, str] = {}  # site -> the record last published, without its date

    def observe(self, topic: str, payload: bytes | bytearray) -> None:
        """Take one record in (a bad one is counted and logged, and changes nothing)."""
        try:
            site = handover_site(self.prefix, topic)
            if site is not None and not payload:  # cleared by an operator: the site starts afresh
                self.held.pop(site, None)
                return
            record = parse_handover(self.prefix, topic, payload)
            self._trust(record)
        except ProtocolError as exc:
            self.rejected[exc.reason] += 1
            n = self.rejected[exc.reason]
            if n <= LOGGED_PER_REASON or n % 1000 == 0:
                log.warning("rejected handover record on %r: %s (%d so far)", topic[:200], exc, n)
            return
        held = self.held.setdefault(record.site, {})
        known = held.get(record.optimizer)
        if known is not None and record.written_at < known.written_at:
            return  # an older record arriving late: the one held says more
        held[record.optimizer] = record
        self.accepted += 1

    def _trust(self, record: Handover) -> None:
        """Refuse a record no optimizer of the site could have written, or one dated ahead of this clock."""
        site, writer = record.site, record.optimizer
        if writer == self.ownership.name:
            claims = site in self.ownership.subscribed_sites  # a record of this optimizer's previous process
        else:
            # Only the account of that name may write its presence (the ACL): a presence that lists the site, online
            # or not, vouches for the writer.
            presence = self.ownership.presences.get(writer)
            claims = presence is not None and (site in presence.sites or site in presence.standby)
        if not claims:
            raise ProtocolError("not_site_optimizer", f"{writer!r} is no optimizer of site {site!r}")
        ahead = record.written_at - self.clock()
        if ahead > MAX_SKEW:
            raise ProtocolError("future", f"written {ahead:.0f} s ahead of this optimizer's clock")

    # ------------------------------------------------------------------ taking a record in

    def decisions(self, site: str) -> list[Decision]:
        """People's decisions on ``site``'s moves that the held record carries."""
        return [
            (s.id, RecState(s.state), s.changed, s.by or record.optimizer)
            for record in self._records(site)
            for s in record.states
        ]

    def posts(self, plan: Plan) -> list[Post]:
        """What the held record says was posted about the moves ``plan`` proposes, where the record names each
        move as this plan does (a post of a move not proposed now is offered again with a plan that proposes it)."""
        said = {r.id: move_fingerprint(r) for r in plan.recommendations}
        out: list[Post] = []
        for p in (p for record in self._records(plan.site) for p in record.posted):
            if p.id not in said:
                continue
            if p.fingerprint != said[p.id]:
                self.mismatched += 1
                continue
            out.append((p.receiver, p.id, Sent(p.first_sent, p.last_sent, p.resolved_sent)))
        return out

    def settling(self, plan: Plan) -> dict[str, tuple[float, float, int]]:
        """How long the held record saw each move ``plan`` proposes proposed."""
        proposed = {r.id for r in plan.recommendations}
        out: dict[str, tuple[float, float, int]] = {}
        for s in (s for record in self._records(plan.site) for s in record.settling):
            if s.id in proposed and (s.id not in out or s.last_plan > out[s.id][1]):
                out[s.id] = (s.first_proposed, s.last_plan, s.plans)
        return out

    def _records(self, site: str) -> list[Handover]:
        """The records held for ``site``, oldest first (the journal and lifecycle let the later entry win)."""
        return sorted(self.held.get(site, {}).values(), key=lambda r: r.written_at)

    # ------------------------------------------------------------------ publishing this optimizer's record

    def build(
        self,
        site: str,
        decisions: Iterable[tuple[str, RecState, float, str | None]],
        posts: Iterable[Post],
        bodies: dict[str, Recommendation],
        settling: dict[str, tuple[float, float, int]],
    ) -> Handover | None:
        """This optimizer's record of ``site``, or None when it says nothing new since the last one published.
        A post of a move whose planned form is no longer known is left out (nothing to name it by)."""
        now = self.clock()
        name = self.ownership.name
        states = [HandedState(id=i, state=s.value, changed=min(at, now), by=by or name) for i, s, at, by in decisions]
        posted = [
            HandedPost(
                id=i,
                receiver=receiver,
                fingerprint=move_fingerprint(bodies[i]),
                first_sent=min(sent.first_sent, now),
                last_sent=min(sent.last_sent, now),
                resolved_sent=None if sent.resolved_sent is None else min(sent.resolved_sent, now),
            )
            for receiver, i, sent in posts
            if i in bodies
        ]
        settled = [
            HandedSettling(id=i, first_proposed=min(first, now), last_plan=min(last, now), plans=plans)
            for i, (first, last, plans) in settling.items()
        ]
        record = Handover(
            site=site,
            optimizer=name,
            written_at=now,
            states=states[:MAX_HANDOVER_ENTRIES],
            posted=posted[:MAX_HANDOVER_ENTRIES],
            settling=settled[:MAX_HANDOVER_ENTRIES],
        )
        content = record.model_dump_json(exclude={"written_at"})
        if self._content.get(site) == content:
            return None
        return record

    def sent(self, record: Handover) -> None:
        """``record`` is on the broker: the next one is published only when it says something new."""
        self._content[record.site] = record.model_dump_json(exclude={"written_at"})
        self.published += 1
