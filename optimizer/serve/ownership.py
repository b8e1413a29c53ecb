"""Which optimizer plans which site, when several share one broker.

Each optimizer announces, retained on its own presence topic, the sites it plans first (``sites``) and those it
stands by for (``standby``); its last will marks it offline when its connection dies. Every optimizer reads every
presence and computes the owner of a site with the same rule, so that all of them agree without talking to each
other: among the optimizers online, the first that lists the site in ``sites``, else the first that lists it in
``standby``; "first" by name. An optimizer that lists sites plans only while it is connected and has seen its own
presence come back from the broker (so it has read the others' retained presences before it decides anything).

An optimizer that lists no sites (the default, one optimizer for the whole fleet) announces nothing and plans every
site it sees that no optimizer online claims.

A presence is a claim, and the broker's ACL vouches only for its name (each account writes its own presence topic),
not for the sites it lists: an account minted for one site could claim every other, and the optimizers planning
those would yield them to an optimizer that cannot read their nodes, so nobody would plan them. Where ``peers``
lists the other optimizers with the sites each account may serve (as ``mint`` granted them), a presence counts only
for those; a claim beyond them is dropped before the presence is kept, counted (``refused``, by reason) and logged.
The handover records an optimizer accepts are vouched for by the same kept presences.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping

from agent.protocol import NodeStatus, Presence, ProtocolError, parse_presence

log = logging.getLogger(__name__)

PRIMARY, STANDBY = 0, 1  # an optimizer's rank for a site; lowest wins
LOGGED_PER_REASON = 20


class Ownership:
    """This optimizer's view of every optimizer's presence, and the sites it owns by it."""

    def __init__(
        self,
        prefix: str,
        name: str,
        sites: Iterable[str] = (),
        standby: Iterable[str] = (),
        peers: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        self.prefix = prefix
        self.name = name
        self.sites = tuple(dict.fromkeys(sites))
        self.standby = tuple(s for s in dict.fromkeys(standby) if s not in self.sites)
        # other optimizer -> the sites its account may serve; None: every claim believed (one operator, no peers)
        self.peers = {n: frozenset(s) for n, s in peers.items()} if peers else None
        self.presences: dict[str, Presence] = {}  # as kept: claims beyond ``peers`` dropped
        self.rejected: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()  # claimed sites not counted, by reason: unknown_optimizer, not_peer_site
        self._refused_logged: dict[str, frozenset[str]] = {}  # optimizer -> the sites last logged as refused
        self.seen_self = False  # our own online presence came back since we last connected
        self._owned: frozenset[str] = frozenset()

    @property
    def scoped(self) -> bool:
        """Whether this optimizer plans named sites only (and then only while it holds them)."""
        return bool(self.sites or self.standby)

    @property
    def subscribed_sites(self) -> tuple[str, ...]:
        """Sites whose nodes this optimizer follows: its own and those it stands by for (kept warm, so that a
        takeover plans from an hour of history rather than from nothing). Empty: every site."""
        return (*self.sites, *self.standby)

    def presence(self, status: NodeStatus, started: float) -> Presence:
        return Presence(optimizer=self.name, status=status, started=started, sites=self.sites, standby=self.standby)

    def connected(self) -> None:
        """A new broker session: decide nothing until our presence has come back through it."""
        self.seen_self = False

    def disconnected(self) -> None:
        self.seen_self = False

    def observe(self, topic: str, payload: bytes | bytearray) -> None:
        """Take one presence message in (a bad one is counted and logged, and changes nothing)."""
        try:
            if not payload:  # a retained presence cleared by an operator: that optimizer is gone
                name = topic.rsplit("/", 1)[-1]
                self.presences.pop(name, None)
                return
            presence = parse_presence(self.prefix, topic, payload)
        except ProtocolError as exc:
            self.rejected[exc.reason] += 1
            n = self.rejected[exc.reason]
            if n <= LOGGED_PER_REASON or n % 1000 == 0:
                log.warning("rejected optimizer presence on %r: %s (%d so far)", topic[:200], exc, n)
            return
        known = self.presences.get(presence.optimizer)
        if known is not None and presence.started < known.started:
            return  # a late message of a process that has since been restarted
        self.presences[presence.optimizer] = self._checked(presence)
        if presence.optimizer == self.name and presence.status is NodeStatus.ONLINE:
            self.seen_self = True

    def _checked(self, presence: Presence) -> Presence:
        """``presence`` with the sites its optimizer may not serve (by ``peers``) left out, each counted."""
        name = presence.optimizer
        if self.peers is None or name == self.name:  # our own account: our own config says what it serves
            return presence
        allowed = self.peers.get(name)
        reason = "unknown_optimizer" if allowed is None else "not_peer_site"
        allowed = allowed or frozenset()
        refused = frozenset(s for s in (*presence.sites, *presence.standby) if s not in allowed)
        if refused:
            self.refused[reason] += len(refused)
            if self._refused_logged.get(name) != refused:  # once per change, not per retained copy
                self._refused_logged[name] = refused
                shown = ", ".join(sorted(refused)[:20]) + (" ..." if len(refused) > 20 else "")
                why = "it is not in [optimizer] peers" if reason == "unknown_optimizer" else "peers lists others for it"
                log.warning("optimizer %s claims site(s) %s; the claim is not honoured (%s)", name, shown, why)
            presence = presence.model_copy(
                update={
                    "sites": [s for s in presence.sites if s in allowed],
                    "standby": [s for s in presence.standby if s in allowed],
                }
            )
        else:
            self._refused_logged.pop(name, None)
        return presence

    def owner(self, site: str) -> str | None:
        """The optimizer that plans ``site`` by the presences seen, or None when no optimizer online claims it."""
        best: tuple[int, str] | None = None
        for p in self.presences.values():
            if p.status is not NodeStatus.ONLINE:
                continue
            if site in p.sites:
                rank = PRIMARY
            elif site in p.standby:
                rank = STANDBY
            else:
                continue
            if best is None or (rank, p.optimizer) < best:
                best = (rank, p.optimizer)
        return best[1] if best is not None else None

    def owns(self, site: str) -> bool:
        """Whether this optimizer plans ``site`` now."""
        if not self.scoped:
            return self.owner(site) is None
        if site not in self.sites and site not in self.standby:
            return False
        return self.seen_self and self.owner(site) == self.name

    def owned(self, sites: Iterable[str]) -> list[str]:
        """Of ``sites``, those this optimizer plans now; a change is logged."""
        now = frozenset(s for s in sites if self.owns(s))
        if self.scoped:
            now |= frozenset(s for s in self.sites if self.owns(s))
        for site in sorted(now - self._owned):
            if site in self.standby:
                log.warning("site %s: taking it over (no optimizer online lists it first)", site)
            else:
                log.info("site %s: planning it", site)
        for site in sorted(self._owned - now):
            log.warning("site %s: no longer planning it (now %s)", site, self.owner(site) or "no optimizer online")
        self._owned = now
        return sorted(now)

    @property
    def planning(self) -> list[str]:
        """The sites this optimizer planned in its last round."""
        return sorted(self._owned)

    def view(self) -> dict[str, object]:
        """What /healthz and the console say about site ownership."""
        return {
            "optimizer": self.name,
            "sites": list(self.sites) or ["*"],
            "standby_sites": list(self.standby),
            "owned_sites": self.planning,
            "optimizers_online": sorted(n for n, p in self.presences.items() if p.status is NodeStatus.ONLINE),
        }
