"""Session numbers: one more on every agent start, so the optimizer can tell a restart from a replay."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)


def next_session(state_dir: Path) -> int:
    """Increment and persist the session counter in ``state_dir``; fall back to the clock if unwritable."""
    path = state_dir / "session"
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        try:
            current = int(path.read_text().strip() or 0)
        except FileNotFoundError:
            current = 0
        session = current + 1
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{session}\n")
        os.replace(tmp, path)
        return session
    except (OSError, ValueError) as exc:
        session = int(time.time())
        log.warning("cannot keep the session counter in %s (%s); using %d", state_dir, exc, session)
        return session
