"""Collector calls off the event loop: each collector that may block runs on a thread of its own, with a deadline.

NVML, amdsmi and HLML are C libraries that can block for seconds in a driver call (a GPU falling off the bus, a
driver being reloaded), and a hung NFS mount blocks a ``statvfs``. On the event loop such a call would stop
everything else the agent does: the MQTT keepalive, the metrics endpoint, signal handling. dcgm-exporter keeps
sampling apart from serving for the same reason. A thread stuck in a C call cannot be cancelled, so a collector
whose call has not returned is never given a second one: its samples are skipped (and counted) until it returns,
and the agent's watchdog stops when it stays stuck (agent/service.py).

The threads are daemon threads: a call that never returns must not keep the process from exiting when systemd
stops or restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
M_ARENA_MAX = -8  # mallopt(3)


@functools.cache  # once per process
def _one_malloc_arena() -> None:
    """glibc gives each thread that allocates its own malloc arena, a few hundred KiB resident apiece: the agent's
    few worker threads, each busy for milliseconds a second, share the main one instead (its budget is 40 MiB)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the interpreter runs on; absent on musl and macOS
    except (OSError, AttributeError):
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    mallopt(M_ARENA_MAX, 1)


class WorkerBusy(Exception):
    """The collector's previous call has not returned; no second call is started beside it."""

    def __init__(self, since: float) -> None:
        super().__init__(f"its previous call has not returned for {time.monotonic() - since:.1f} s")
        self.since = since


class Worker:
    """One daemon thread that runs one collector's calls, one at a time."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.AbstractEventLoop, asyncio.Future[Any]]] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        # monotonic seconds when the running call started; None when idle. Written by both threads, read by the loop.
        self.busy_since: float | None = None

    def stuck_for(self, now: float) -> float:
        """Seconds the running call has taken so far (0 when idle)."""
        since = self.busy_since
        return 0.0 if since is None else max(0.0, now - since)

    def submit(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Start ``fn()`` on this worker's thread; its result (or exception) comes in the returned future. Raises
        WorkerBusy if the previous call is still running. A future nobody awaits any more is passed to
        :func:`abandon`."""
        since = self.busy_since
        if since is not None:
            raise WorkerBusy(since)
        if self._thread is None:
            _one_malloc_arena()
            self._thread = threading.Thread(target=self._run, name=f"collector-{self.name}", daemon=True)
            self._thread.start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self.busy_since = time.monotonic()
        self._jobs.put((fn, loop, future))
        return future

    async def call(self, fn: Callable[[], T], deadline: float) -> T:
        """``fn()`` on this worker's thread; TimeoutError after ``deadline`` seconds (the call goes on, and this
        worker refuses others until it returns), WorkerBusy if the previous call is still running."""
        future = self.submit(fn)
        try:
            # shield: a deadline or a cancellation leaves the call running; its result is dropped when it comes.
            # asyncio.timeout, not wait_for, which can swallow a cancellation on 3.11.
            async with asyncio.timeout(deadline):
                return await asyncio.shield(future)
        except BaseException:
            abandon(future)
            raise

    def _run(self) -> None:
        while True:
            fn, loop, future = self._jobs.get()
            try:
                result, error = fn(), None
            except BaseException as exc:  # handed to the loop, which decides; the thread lives on
                result, error = None, exc
            self.busy_since = None
            with contextlib.suppress(RuntimeError):  # the loop closed while the call ran (the agent is exiting)
                loop.call_soon_threadsafe(_settle, future, result, error)


def abandon(future: asyncio.Future[Any]) -> None:
    """Nobody reads this call's outcome now: dropped when it comes, without "exception never retrieved" at exit."""
    future.add_done_callback(_drop)


def _drop(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
