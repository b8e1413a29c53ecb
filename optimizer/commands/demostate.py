"""Where ``fleetfit demo`` keeps its state, so that ``fleetfit recommendations`` and ``fleetfit report`` can read
it from another terminal while the demo runs, and after it.

The demo keeps its recommendation states, ledger and snapshots in one directory of the user's
(``$XDG_STATE_HOME/fleetfit/demo``, by default ``~/.local/state/fleetfit/demo``), holds a lock on it while it
runs, and clears the previous run's files when it starts: the state is that of the last run, kept until the next
one. A second demo running at the same time, or a home it cannot write, gets a temporary directory of its own,
removed when it ends (and says so)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LOCK_NAME = "demo.lock"
# What a run leaves in its state directory: the state database (with SQLite's write-ahead files) and snapshots.
_RUN_FILES = ("fleetfit.db", "fleetfit.db-wal", "fleetfit.db-shm", "snapshot-*.json")


def default_dir(environ: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    """The demo's own state directory: ``$XDG_STATE_HOME/fleetfit/demo`` (``~/.local/state/fleetfit/demo``)."""
    base = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "fleetfit" / "demo"


class DemoStateError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class DemoState:
    path: Path
    kept: bool  # False: a temporary directory, removed when the demo ends


def _lock(path: Path) -> int | None:
    """An exclusive lock on ``path``'s lock file, or None when another demo holds it."""
    fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _clear(path: Path) -> None:
    """Remove the previous run's files (and only those: the directory may be one the user chose)."""
    for pattern in _RUN_FILES:
        for old in path.glob(pattern):
            old.unlink(missing_ok=True)


@contextlib.contextmanager
def demo_state(chosen: Path | None = None) -> Iterator[DemoState]:
    """The directory this run keeps its state in, locked for the run. ``chosen`` (``--state-dir``) must be free;
    the default directory falls back to a temporary one when another demo holds it or it cannot be written."""
    where = chosen or default_dir()
    fd: int | None = None
    try:
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = _lock(where)
    except OSError as exc:
        if chosen is not None:
            raise DemoStateError(f"--state-dir {chosen}: {exc.strerror or exc}") from None
    if fd is None and chosen is not None:
        raise DemoStateError(f"--state-dir {chosen}: another demo is using it")
    if fd is None:
        temporary = Path(tempfile.mkdtemp(prefix="fleetfit-demo-"))
        try:
            yield DemoState(temporary, kept=False)
        finally:
            shutil.rmtree(temporary, ignore_errors=True)
        return
    try:
        _clear(where)
        yield DemoState(where, kept=True)
    finally:
        os.close(fd)  # releases the lock; the state stays for `fleetfit report` and the next run clears it


def last_demo_dir(environ: dict[str, str] | os._Environ[str] = os.environ) -> Path | None:
    """The default demo directory when it holds a demo's state (of a demo running or finished), else None."""
    path = default_dir(environ)
    return path if (path / "fleetfit.db").exists() else None


def demo_running(path: Path) -> bool:
    """Whether a demo holds ``path`` now."""
    try:
        fd = os.open(path / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
