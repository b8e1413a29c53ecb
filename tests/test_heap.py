"""The memory start-up freed goes back to the system (glibc's malloc_trim), measured on this process."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from agent.heap import trim


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_heap_memory_is_returned_to_the_system() -> None:
    # 40 MiB of 2 KiB blocks: above Python's small-object allocator, below malloc's mmap threshold, so they come
    # from the C heap, which keeps what is freed (the last block, still held, pins the heap's top)
    blocks = [bytearray(2048) for _ in range(20_000)]
    pinned = bytearray(2048)
    del blocks
    held = _rss_kib()
    assert trim()
    assert held - _rss_kib() > 20 * 1024  # most of the 40 MiB went back
    assert len(pinned) == 2048
