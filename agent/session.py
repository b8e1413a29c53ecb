"""Session numbers: a new, larger one on every agent start, so the optimizer can tell a restart from a replay.

The optimizer accepts each (session, window sequence) once and ignores births of older sessions, so a session
number must never repeat or go backwards, even when the state directory is restored from a backup or wiped.
It is therefore the larger of the persisted counter plus one and the wall clock in whole seconds: the clock
carries it past every number an earlier start used, the counter keeps it increasing across starts within
one second (or after the clock was set back).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)


def next_session(state_dir: Path, wall: Callable[[], float] = time.time) -> int:
    """The next session number, persisted in ``state_dir``; the clock alone if that is unwritable."""
    path = state_dir / "session"
    floor = int(wall())
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        try:
            current = int(path.read_text().strip() or 0)
        except FileNotFoundError:
            current = 0
        session = max(current + 1, floor)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{session}\n")
        os.replace(tmp, path)
        return session
    except (OSError, ValueError) as exc:
        log.warning("cannot keep the session counter in %s (%s); using %d", state_dir, exc, floor)
        return floor
