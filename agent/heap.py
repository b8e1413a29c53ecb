"""Hands back to the system the memory the agent's start-up, or an optimizer's round of plans, used and freed.

Start-up (imports, the first windows' models and schemas, the first read of the TCP tables) leaves freed memory
in the C allocator's heap, which glibc keeps for later use rather than returning it: half a MiB or more of the
agent's resident memory, against a budget of 40 MiB. ``malloc_trim`` returns it, once the agent has settled;
trimming every window would only make the next one fault the same pages in again. The optimizer trims after each
round of plans, which frees hundreds of MiB at a time and then rests for a minute or more."""

from __future__ import annotations

import ctypes


def trim() -> bool:
    """Return the C heap's free memory to the system (glibc's ``malloc_trim``); False where the C library has
    no such call (musl, macOS)."""
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim  # the C library the interpreter runs on, whatever its file
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    malloc_trim(0)
    return True
