"""Grouping and scheduling: each plan's moves become notices per receiver and site once they have settled
(proposed by ``settle_plans`` consecutive plans over ``settle_seconds`` at least: a move a plan soon withdraws is
never posted), gathered for ``group_wait``, posted once (the journal remembers), repeated after
``repeat_interval`` while nobody has acknowledged them, and followed by a resolved notice when a posted move is
applied or expires."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agent.protocol import Finding, Plan, Recommendation
from optimizer.plan.render import waiting_on_node
from optimizer.serve.alerts.delivery import Webhook
from optimizer.serve.alerts.journal import Journal, Sent, Settling, SettlingUnsaved
from optimizer.serve.alerts.notice import Item, Notice, Status
from optimizer.serve.alerts.payloads import render
from optimizer.serve.alerts.settings import AlertSettings, ReceiverSettings
from optimizer.serve.lifecycle import DB_NAME, RecState

log = logging.getLogger(__name__)
# GPUs waiting on their node said in a notice: the costliest few, so the moves keep the message (each line carries
# its evidence and fix, a few hundred characters)
WAITING_SHOWN = 5


@dataclass(slots=True)
class _Group:
    receiver: str
    site: str
    due: float  # monotonic
    generated_at: float
    items: dict[str, Item] = field(default_factory=dict)


class Alerter:
    def __init__(
        self,
        settings: AlertSettings,
        journal: Journal,
        webhooks: Iterable[Webhook] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.journal = journal
        self.webhooks = {w.name: w for w in (webhooks or (Webhook(r, settings) for r in settings.receivers))}
        self.clock = clock
        self.notices_sent = 0
        self.notices_failed = 0
        self.journal_error: str | None = None  # why the alert log was last not written
        # posts not yet in the alert log (its disk was full): written at the next chance, in order
        self._unjournaled: list[tuple[str, str, list[str], list[str], float]] = []
        self._pending: dict[tuple[str, str], _Group] = {}
        self._waiting: dict[str, list[Finding]] = {}  # per site, from its latest plan
        self._wake = asyncio.Event()
        self.on_post: Callable[[str], None] | None = None  # told the site of each post once it is in the alert log

    @classmethod
    def in_state_dir(cls, settings: AlertSettings, state_dir: Path) -> Alerter:
        return cls(settings, Journal(state_dir / DB_NAME))

    # ------------------------------------------------------------------ what to say

    def adopt(
        self, site: str, posts: list[tuple[str, str, Sent]], settling: dict[str, tuple[float, float, int]]
    ) -> tuple[int, int]:
        """Take in what another optimizer posted about ``site``'s moves and how long it saw them proposed (a
        handover), before the next plan of the site is observed. Returns the entries that changed here: posts,
        settling. A log that cannot be written (a full disk) adopts nothing: the moves may be posted again."""
        try:
            return self.journal.adopt_posts(site, posts), self.journal.adopt_settling(site, settling)
        except sqlite3.Error as exc:
            if self.journal_error is None:
                log.error("alert log not written (%s): site %s's handed-over posts may be posted again", exc, site)
            self.journal_error = f"cannot write the alert log: {exc}"
            return 0, 0

    def _wanted(self, receiver: ReceiverSettings, site: str, rec: Recommendation) -> bool:
        return (
            (not receiver.sites or site in receiver.sites)
            and (not receiver.classes or rec.workload_class in receiver.classes)
            and rec.monthly_savings_usd >= receiver.min_monthly_savings
            and self.settings.severity(rec.monthly_savings_usd).rank >= receiver.min_severity.rank
        )

    def observe(
        self,
        plan: Plan,
        states: dict[str, RecState],
        resolved: Iterable[tuple[Recommendation, RecState]] = (),
    ) -> None:
        """Fold a site's new plan in. ``states`` holds each proposed move's lifecycle state; ``resolved`` the
        moves this plan applied or expired."""
        self._journal()  # posts the alert log could not take before
        now = self.clock()
        self._waiting[plan.site] = waiting_on_node(plan.findings, WAITING_SHOWN)
        resolved = list(resolved)
        try:
            settling = self.journal.proposed(plan.site, [r.id for r in plan.recommendations], plan.generated_at, now)
        except SettlingUnsaved as unsaved:  # a full disk: this plan settles as read, and the next counts it again
            settling = unsaved.settling
            if self.journal_error is None:
                log.error("alert log not written (%s): moves settle from what it held", unsaved.__cause__)
            self.journal_error = f"cannot write the alert log: {unsaved.__cause__}"
        else:
            self._journal_written()
        for webhook in self.webhooks.values():
            receiver = webhook.receiver
            items: list[Item] = []
            for rec in plan.recommendations:
                if states.get(rec.id, RecState.NEW) != RecState.NEW or not self._wanted(receiver, plan.site, rec):
                    continue
                sent = self.journal.sent(receiver.name, rec.id)
                if sent is None or sent.resolved_sent is not None:
                    if not self._settled(settling[rec.id], now):
                        continue  # not yet: a later plan may still withdraw it
                    status = Status.NEW
                elif self.settings.repeat_interval and now - sent.last_sent >= self.settings.repeat_interval:
                    status = Status.REMINDER
                else:
                    continue
                items.append(Item(rec, status, self.settings.severity(rec.monthly_savings_usd)))
            for rec, state in resolved:
                sent = self.journal.sent(receiver.name, rec.id)
                if sent is None or sent.resolved_sent is not None or not self._wanted(receiver, plan.site, rec):
                    continue
                status = Status.APPLIED if state == RecState.APPLIED else Status.EXPIRED
                items.append(Item(rec, status, self.settings.severity(rec.monthly_savings_usd)))
            self._enqueue(receiver.name, plan, items)

    def _settled(self, settling: Settling, now: float) -> bool:
        return (
            settling.plans >= self.settings.settle_plans
            and now - settling.first_proposed >= self.settings.settle_seconds
        )

    def _enqueue(self, receiver: str, plan: Plan, items: list[Item]) -> None:
        key = (receiver, plan.site)
        group = self._pending.get(key)
        if group is not None:  # moves no longer proposed are not announced; resolved ones stay
            proposed = {r.id for r in plan.recommendations}
            group.items = {k: i for k, i in group.items.items() if i.status.resolved or k in proposed}
            group.generated_at = plan.generated_at
        if not items:
            if group is not None and not group.items:
                del self._pending[key]
            return
        if group is None:
            group = _Group(receiver, plan.site, time.monotonic() + self.settings.group_wait, plan.generated_at)
            self._pending[key] = group
        for item in items:
            group.items[item.id] = item
        self._wake.set()

    @property
    def pending(self) -> int:
        return sum(len(g.items) for g in self._pending.values())

    # ------------------------------------------------------------------ sending

    async def _send(self, group: _Group) -> bool:
        webhook = self.webhooks[group.receiver]
        notice = Notice(
            group.site,
            group.generated_at,
            list(group.items.values()),
            self.settings.link,
            self._waiting.get(group.site, []),
        )
        body = render(webhook.receiver.kind, notice, webhook.receiver.byte_limit)
        try:
            posted = await webhook.post(body)
        except asyncio.CancelledError:  # stopped mid-post: the moves are still unsent
            self._pending.setdefault((group.receiver, group.site), group)
            raise
        if not posted:
            self.notices_failed += 1
            return False  # not journaled: the next plan brings these moves up again
        now = self.clock()
        firing = [i.id for i in notice.items if not i.status.resolved]
        done = [i.id for i in notice.items if i.status.resolved]
        self._unjournaled.append((group.receiver, group.site, firing, done, now))
        self._journal()
        self.notices_sent += 1
        if self.on_post is not None:
            self.on_post(group.site)
        log.info("alert to %s: %s", group.receiver, notice.title())
        return True

    def _journal(self) -> None:
        """Write what was posted into the alert log. A full disk must not stop the alerts: what cannot be written
        is kept and written with the next post or plan (until then a restart may post it again)."""
        wrote = False
        while self._unjournaled:
            receiver, site, firing, done, at = self._unjournaled[0]
            try:
                if firing:
                    self.journal.mark_firing(receiver, site, firing, at)
                if done:
                    self.journal.mark_resolved(receiver, done, at)
            except sqlite3.Error as exc:
                if self.journal_error is None:
                    log.error("alert log not written (%s): a restart may post these moves again", exc)
                self.journal_error = f"cannot write the alert log: {exc}"
                del self._unjournaled[:-1000]  # bounded: the oldest posts are the least likely to come again
                return
            self._unjournaled.pop(0)
            wrote = True
        if wrote:
            self._journal_written()

    def _journal_written(self) -> None:
        if self.journal_error is not None and not self._unjournaled:
            log.warning("alert log written again")
            self.journal_error = None

    def _due(self, everything: bool = False) -> list[_Group]:
        now = time.monotonic()
        due = [g for g in self._pending.values() if everything or g.due <= now]
        for g in due:
            del self._pending[(g.receiver, g.site)]
        return due

    async def run(self) -> None:
        """Post groups as they fall due, until cancelled."""
        while True:
            self._wake.clear()
            due = self._due()
            if due:
                await asyncio.gather(*(self._send(g) for g in due))
                continue
            due_at = min((g.due for g in self._pending.values()), default=None)
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that arrives as the
            # event is set (a plan observed just before shutdown), and this loop would then never end
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(None if due_at is None else max(0.0, due_at - time.monotonic())):
                    await self._wake.wait()

    async def flush(self) -> None:
        """Post everything pending now (at shutdown, and at the end of the demo)."""
        due = self._due(everything=True)
        if due:
            await asyncio.gather(*(self._send(g) for g in due))

    async def close(self) -> None:
        for webhook in self.webhooks.values():
            await webhook.close()
        self.journal.close()
