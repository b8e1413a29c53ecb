"""Small /proc and /sys files read whole, as cheaply as Python can: ``os.open`` and ``os.read``.

A buffered file object (``open``, ``Path.read_text``) costs more than the read itself on these paths: an agent
that reads a few files per process per window spent more time building file objects than in the kernel.
"""

from __future__ import annotations

import os

_CHUNK = 65_536


def _read_fd(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, _CHUNK):  # procfs may hand a file over in several reads
        chunks.append(chunk)
    return b"".join(chunks)


def read_bytes(path: str) -> bytes | None:
    """The whole file at ``path``; None when it cannot be opened or read (a process gone, no permission)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _read_fd(fd)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_with_inode(path: str) -> tuple[int, bytes] | None:
    """The inode and whole contents of the file at ``path``, from one open; None as for ``read_bytes``. A cgroup
    removed and made again under the same path (a systemd unit restarted) has files with other inodes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.fstat(fd).st_ino, _read_fd(fd)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_text(path: str) -> str | None:
    """``read_bytes`` decoded as UTF-8, undecodable bytes replaced (a process names itself with any bytes)."""
    data = read_bytes(path)
    return None if data is None else data.decode(errors="replace")
