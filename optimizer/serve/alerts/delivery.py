"""Posting to one webhook: the receiver's rate limit, retries with exponential backoff on 5xx, 429 (honouring
Retry-After) and network errors, a bounded number of attempts, and counted failures. The URL is a secret:
it never reaches a log line, not even inside an exception's text."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from datetime import UTC
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

import aiohttp

from optimizer.serve.alerts.settings import AlertSettings, ReceiverSettings

log = logging.getLogger(__name__)


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


def redact(text: str, url: str) -> str:
    """``text`` with the URL, its path and its host replaced (aiohttp puts them in exception messages)."""
    parts = urlsplit(url)
    for secret in sorted({url, url.rstrip("/"), parts.path, parts.query, parts.netloc, parts.hostname or ""}, key=len):
        if len(secret) > 1:
            text = text.replace(secret, "<webhook>")
    return text


class Webhook:
    """One receiver's delivery channel. ``post`` returns True once the platform accepted the message."""

    def __init__(self, receiver: ReceiverSettings, settings: AlertSettings, rng: random.Random | None = None) -> None:
        self.receiver = receiver
        self.settings = settings
        self.sent = 0
        self.retries = 0
        self.failed: Counter[str] = Counter()
        self._interval = 1.0 / receiver.rate
        self._next_slot = 0.0
        self._lock = asyncio.Lock()
        self._rng = rng or random.Random()
        self._session: aiohttp.ClientSession | None = None

    @property
    def name(self) -> str:
        return self.receiver.name

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _slot(self) -> None:
        """Wait for this receiver's next free slot under its rate limit."""
        now = time.monotonic()
        wait = self._next_slot - now
        self._next_slot = max(now, self._next_slot) + self._interval
        if wait > 0:
            await asyncio.sleep(wait)

    def _backoff(self, attempt: int) -> float:
        ceiling = min(self.settings.retry_max, self.settings.retry_initial * 2**attempt)
        return self._rng.uniform(ceiling / 2, ceiling)

    async def post(self, body: bytes) -> bool:
        async with self._lock:  # one message at a time per receiver, in order
            try:
                url = self.receiver.url().get_secret_value()
            except ValueError as exc:
                self.failed["no_url"] += 1
                log.error("alert to %s not sent: %s", self.name, exc)
                return False
            if self._session is None:
                self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.settings.timeout))
            return await self._attempts(self._session, url, body)

    async def _attempts(self, session: aiohttp.ClientSession, url: str, body: bytes) -> bool:
        attempts = self.settings.max_attempts
        for attempt in range(attempts):
            await self._slot()
            header: str | None = None
            try:
                async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
                    await resp.read()
                    status = resp.status
                    header = resp.headers.get("Retry-After")
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                what = redact(f"{type(exc).__name__}: {exc}", url)
                reason = "network"
            else:
                if 200 <= status < 300:
                    self.sent += 1
                    return True
                what = f"HTTP {status}"
                if status == 429:
                    reason = "rate_limited"
                elif status >= 500:
                    reason = "server_error"
                else:
                    self.failed["rejected"] += 1
                    log.error("alert to %s rejected with HTTP %d; not retrying", self.name, status)
                    return False
            if attempt + 1 == attempts:
                self.failed[reason] += 1
                log.error("alert to %s failed after %d attempts (last: %s)", self.name, attempts, what)
                return False
            hinted = retry_after(header) if reason == "rate_limited" else None
            delay = min(self.settings.retry_max, hinted if hinted is not None else self._backoff(attempt))
            self.retries += 1
            log.warning("alert to %s: %s; retrying in %.1f s", self.name, what, delay)
            # a 429's Retry-After is a floor: the rate-limit slot must not let the next try in earlier
            self._next_slot = max(self._next_slot, time.monotonic() + delay)
            await asyncio.sleep(delay)
        return False  # pragma: no cover - the loop always returns
