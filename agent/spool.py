"""Where windows wait for the broker: oldest first, bounded, acknowledged before they are let go.

Two implementations of one small interface: :class:`MemoryQueue` for simulated fleets and for an agent whose
spool directory cannot be used, and :class:`DiskSpool` for real agents, which writes each window to its own file
(write, fsync, rename) so that windows survive a ``kill -9`` or a reboot and are replayed in order, with their
original timestamps, once the broker is back. Both are bounded in windows and in bytes; at either cap the oldest
windows are dropped and counted.

A full or failing disk never stops sampling: a write that fails (``ENOSPC``, ``EIO``, ...) is counted by reason,
logged once per episode, and answered by dropping the oldest window to make room; when even that does not help
the new window is dropped (counted). Writes succeed again by themselves once space is freed.

A window the broker acknowledged is kept a while longer among the sent ones (bounded): the broker acknowledges
what it took, not what reached the optimizer, and drops messages for a subscriber whose queue is full. When the
optimizer finds a gap in a node's sequence numbers it asks for those windows (``resend``), and they go back into
the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import re
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

SUFFIX = ".window"
WRITE_ATTEMPTS = 3  # each failed attempt drops the oldest window to make room
RESEND_MAX = 10_000  # windows put back into the queue per request
MEMORY_MAX_BYTES = 256 << 20  # the memory queue's bound by default: the disk spool's default (spool_max_mb)
_IDENTITY = re.compile(rb'"session":(\d+),"seq":(\d+)')
Key = tuple[int, int]  # (session, seq)
Ranges = Iterable[tuple[int, int, int]]  # (session, first seq, last seq)


def window_key(payload: bytes) -> Key | None:
    """(session, seq) of an encoded window; None when it holds none."""
    m = _IDENTITY.search(payload, 0, 512)  # encode() writes them first, after the node and site
    if m is not None:
        return int(m.group(1)), int(m.group(2))
    try:
        raw = json.loads(payload)
        return int(raw["session"]), int(raw["seq"])
    except (ValueError, KeyError, TypeError, RecursionError):
        return None


def _wanted(ranges: Ranges) -> list[Key]:
    out: list[Key] = []
    for session, first, last in ranges:
        out.extend((session, seq) for seq in range(first, min(last, first + RESEND_MAX) + 1))
        if len(out) >= RESEND_MAX:
            break
    return out[:RESEND_MAX]


class ShortWrite(OSError):
    """``write`` made no progress: the file system took nothing more (full, or a quota reached)."""


def _reason(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, "EOTHER") if not isinstance(exc, ShortWrite) else "short_write"


def _out_of_space(exc: OSError) -> bool:
    return isinstance(exc, ShortWrite) or exc.errno in (errno.ENOSPC, errno.EDQUOT)


def write_all(fd: int, payload: bytes) -> None:
    """Write every byte of ``payload``: ``os.write`` may take only part of it (a nearly full disk, a signal)."""
    view = memoryview(payload)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise ShortWrite(errno.ENOSPC, "write took no bytes")
        view = view[written:]


class WindowQueue(Protocol):
    dropped: int
    write_errors: dict[str, int]
    empty: asyncio.Event

    def __len__(self) -> int: ...

    def put(self, payload: bytes) -> None:
        """Queue an encoded window; drop the oldest when full."""
        ...

    def peek(self) -> tuple[int, bytes] | None:
        """(token, payload) of the oldest window, or None."""
        ...

    def pop(self, token: int) -> None:
        """Let the window go once the broker acknowledged it (no-op if it was dropped meanwhile); it is kept among
        the sent windows, in case the optimizer asks for it again."""
        ...

    def resend(self, ranges: Ranges) -> int:
        """Queue again the sent windows in the (session, first seq, last seq) ``ranges`` that are still kept;
        how many."""
        ...

    async def wait(self) -> None:
        """Return once a window is queued."""
        ...


class _Signals:
    def __init__(self) -> None:
        self.dropped = 0
        self.write_errors: dict[str, int] = {}  # by errno name: windows the disk refused
        self._ready = asyncio.Event()
        self.empty = asyncio.Event()
        self.empty.set()

    def _update(self, size: int) -> None:
        if size:
            self._ready.set()
            self.empty.clear()
        else:
            self._ready.clear()
            self.empty.set()

    def _note_drop(self, what: str) -> None:
        self.dropped += 1
        if self.dropped == 1 or self.dropped % 100 == 0:
            log.warning("%s full: dropped the oldest window (%d dropped so far)", what, self.dropped)

    async def wait(self) -> None:
        await self._ready.wait()


class MemoryQueue(_Signals):
    """Bounded in-memory queue: at most ``capacity`` windows and ``max_bytes`` bytes, the sent windows kept for a
    resend counted in the bytes; they give way before a queued window is dropped."""

    def __init__(self, capacity: int, keep_sent: int = 0, max_bytes: int = MEMORY_MAX_BYTES) -> None:
        super().__init__()
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._items: deque[tuple[int, bytes]] = deque()
        self._bytes = 0  # queued
        self._next = 0
        self._sent: dict[Key, bytes] = {}  # in the order sent: dicts keep insertion order
        self._sent_bytes = 0
        self._keep = keep_sent

    def __len__(self) -> int:
        return len(self._items)

    @property
    def held_bytes(self) -> int:
        """Bytes held, queued and sent alike."""
        return self._bytes + self._sent_bytes

    def put(self, payload: bytes) -> None:
        self._items.append((self._next, payload))
        self._next += 1
        self._bytes += len(payload)
        self._trim_sent()
        while len(self._items) > self.capacity or (self._bytes > self.max_bytes and len(self._items) > 1):
            _, dropped = self._items.popleft()
            self._bytes -= len(dropped)
            self._note_drop("window queue")
        self._update(len(self._items))

    def peek(self) -> tuple[int, bytes] | None:
        return self._items[0] if self._items else None

    def pop(self, token: int) -> None:
        if self._items and self._items[0][0] == token:
            _, payload = self._items.popleft()
            self._bytes -= len(payload)
            key = window_key(payload)
            if key is not None and self._keep:
                self._sent_bytes += len(payload) - len(self._sent.pop(key, b""))
                self._sent[key] = payload
                self._trim_sent()
        self._update(len(self._items))

    def _trim_sent(self) -> None:
        while self._sent and (len(self._sent) > self._keep or self._bytes + self._sent_bytes > self.max_bytes):
            self._sent_bytes -= len(self._sent.pop(next(iter(self._sent))))  # the oldest sent goes first

    def resend(self, ranges: Ranges) -> int:
        count = 0
        for key in _wanted(ranges):
            payload = self._sent.pop(key, None)
            if payload is not None:
                self._sent_bytes -= len(payload)
                self.put(payload)
                count += 1
        return count


class DiskSpool(_Signals):
    """One file per window in ``directory``, named by a sequence number that orders them across restarts."""

    def __init__(self, directory: Path, max_windows: int, max_bytes: int, keep_sent_bytes: int = 0) -> None:
        super().__init__()
        self.directory = directory
        self.max_windows = max_windows
        self.max_bytes = max_bytes
        directory.mkdir(parents=True, exist_ok=True)
        # windows the broker acknowledged, named by (session, seq), oldest first
        self.sent_directory = directory.parent / "sent"
        self._keep_bytes = keep_sent_bytes
        self._sent: dict[Key, int] = {}
        self._sent_bytes = 0
        if keep_sent_bytes:
            self._load_sent()
        for stale in directory.glob("*.tmp"):
            stale.unlink(missing_ok=True)  # a write interrupted by a crash: the window was never complete
        self._files: deque[tuple[int, int]] = deque()  # (number, size)
        for path in sorted(directory.glob(f"*{SUFFIX}")):
            try:
                self._files.append((int(path.stem), path.stat().st_size))
            except (ValueError, OSError):
                log.warning("ignoring unexpected file %s in the spool", path)
        self._bytes = sum(size for _, size in self._files)
        self._next = self._files[-1][0] + 1 if self._files else 0
        self._head: tuple[int, bytes] | None = None
        self._failures = 0  # failed writes since the last one that succeeded
        if self._files:
            log.info("spool holds %d window(s) from before; replaying them first", len(self._files))
        self._update(len(self._files))

    def __len__(self) -> int:
        return len(self._files)

    def _path(self, number: int) -> Path:
        return self.directory / f"{number:016d}{SUFFIX}"

    def put(self, payload: bytes) -> None:
        for attempt in range(WRITE_ATTEMPTS):
            try:
                number = self._write(payload)
            except OSError as exc:
                self._note_write_error(exc)
                if not self._files or attempt + 1 == WRITE_ATTEMPTS or not _out_of_space(exc):
                    break
                self._remove_oldest()  # make room for the newest window: the oldest matters least
                self.dropped += 1
                continue
            if self._failures and attempt == 0:  # not merely room made by dropping: the disk takes windows again
                log.warning("spool writable again after %d failed write(s)", self._failures)
                self._failures = 0
            self._files.append((number, len(payload)))
            self._bytes += len(payload)
            while len(self._files) > self.max_windows or (self._bytes > self.max_bytes and len(self._files) > 1):
                self._remove_oldest()
                self._note_drop("spool")
            self._update(len(self._files))
            return
        self.dropped += 1  # the new window itself: the disk took nothing
        self._update(len(self._files))

    def _write(self, payload: bytes) -> int:
        """Write ``payload`` as the next numbered window (write, fsync, rename); its number, or OSError."""
        number = self._next
        self._next += 1
        path = self._path(number)
        tmp = path.with_suffix(".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                write_all(fd, payload)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)  # only a complete, synced window ever carries the spool's suffix
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)  # frees what a partial write took
            raise
        with contextlib.suppress(OSError):  # the window is complete; a failed directory sync only risks a reboot
            self._fsync_dir()
        return number

    def _note_write_error(self, exc: OSError) -> None:
        reason = _reason(exc)
        self.write_errors[reason] = self.write_errors.get(reason, 0) + 1
        if not self._failures:
            log.error(
                "cannot write to the spool in %s (%s); dropping the oldest windows until writes succeed again",
                self.directory,
                exc.strerror or exc,
            )
        self._failures += 1

    def _fsync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _remove_oldest(self) -> None:
        number, size = self._files.popleft()
        self._bytes -= size
        try:
            self._path(number).unlink(missing_ok=True)
        except OSError as exc:  # left behind, it is replayed after a restart: a duplicate the optimizer rejects
            log.warning("cannot remove spooled window %d: %s", number, exc.strerror or exc)
        if self._head is not None and self._head[0] == number:
            self._head = None

    def peek(self) -> tuple[int, bytes] | None:
        while self._files:
            number = self._files[0][0]
            if self._head is not None and self._head[0] == number:
                return self._head
            try:
                self._head = (number, self._path(number).read_bytes())
                return self._head
            except OSError as exc:
                log.warning("spooled window %d unreadable (%s); dropping it", number, exc)
                self._remove_oldest()
                self.dropped += 1
        self._update(0)
        return None

    def pop(self, token: int) -> None:
        if self._files and self._files[0][0] == token:
            if self._keep_bytes and self._head is not None and self._head[0] == token:
                self._keep(token, self._head[1])
            self._remove_oldest()
        self._head = None
        self._update(len(self._files))

    def _sent_path(self, key: Key) -> Path:
        return self.sent_directory / f"{key[0]:020d}-{key[1]:020d}{SUFFIX}"

    def _load_sent(self) -> None:
        try:
            self.sent_directory.mkdir(exist_ok=True)
            paths = sorted(self.sent_directory.glob(f"*{SUFFIX}"))
        except OSError as exc:
            log.warning("cannot keep sent windows in %s: %s", self.sent_directory, exc.strerror or exc)
            self._keep_bytes = 0
            return
        for path in paths:
            session, _, seq = path.stem.partition("-")
            try:
                size = path.stat().st_size
                key = (int(session), int(seq))
            except (ValueError, OSError):
                continue
            self._sent[key] = size
            self._sent_bytes += size
        self._trim_sent()

    def _keep(self, number: int, payload: bytes) -> None:
        """Move an acknowledged window among the sent ones (a rename: no copy, no fsync)."""
        key = window_key(payload)
        if key is None:
            return
        try:
            os.replace(self._path(number), self._sent_path(key))
        except OSError as exc:
            log.debug("sent window %d not kept: %s", number, exc)
            return
        self._sent_bytes += len(payload) - self._sent.pop(key, 0)
        self._sent[key] = len(payload)
        self._trim_sent()

    def _trim_sent(self) -> None:
        while self._sent and (self._sent_bytes > self._keep_bytes or len(self._sent) > self.max_windows):
            oldest = next(iter(self._sent))  # the longest sent: what the optimizer is least likely to ask for
            self._sent_bytes -= self._sent.pop(oldest)
            with contextlib.suppress(OSError):
                self._sent_path(oldest).unlink(missing_ok=True)

    def resend(self, ranges: Ranges) -> int:
        count = 0
        for key in _wanted(ranges):
            if key not in self._sent:
                continue
            path = self._sent_path(key)
            try:
                payload = path.read_bytes()
            except OSError:
                payload = b""
            self._sent_bytes -= self._sent.pop(key)
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
            if payload:
                self.put(payload)
                count += 1
        return count
