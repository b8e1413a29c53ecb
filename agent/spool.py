"""Where windows wait for the broker: oldest first, bounded, acknowledged before they are let go.

Two implementations of one small interface: :class:`MemoryQueue` for simulated fleets, and :class:`DiskSpool`
for real agents, which writes each window to its own file (write, fsync, rename) so that windows survive a
``kill -9`` or a reboot and are replayed in order, with their original timestamps, once the broker is back.
At the cap the oldest windows are dropped and counted.

A full or failing disk never stops sampling: a write that fails (``ENOSPC``, ``EIO``, ...) is counted by reason,
logged once per episode, and answered by dropping the oldest window to make room; when even that does not help
the new window is dropped (counted). Writes succeed again by themselves once space is freed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
from collections import deque
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

SUFFIX = ".window"
WRITE_ATTEMPTS = 3  # each failed attempt drops the oldest window to make room


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
        """Let the window go once the broker acknowledged it (no-op if it was dropped meanwhile)."""
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
    """Bounded in-memory queue."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self._items: deque[tuple[int, bytes]] = deque()
        self._next = 0

    def __len__(self) -> int:
        return len(self._items)

    def put(self, payload: bytes) -> None:
        if len(self._items) >= self.capacity:
            self._items.popleft()
            self._note_drop("window queue")
        self._items.append((self._next, payload))
        self._next += 1
        self._update(len(self._items))

    def peek(self) -> tuple[int, bytes] | None:
        return self._items[0] if self._items else None

    def pop(self, token: int) -> None:
        if self._items and self._items[0][0] == token:
            self._items.popleft()
        self._update(len(self._items))


class DiskSpool(_Signals):
    """One file per window in ``directory``, named by a sequence number that orders them across restarts."""

    def __init__(self, directory: Path, max_windows: int, max_bytes: int) -> None:
        super().__init__()
        self.directory = directory
        self.max_windows = max_windows
        self.max_bytes = max_bytes
        directory.mkdir(parents=True, exist_ok=True)
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
            self._remove_oldest()
        self._head = None
        self._update(len(self._files))
