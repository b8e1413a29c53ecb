"""One command run with a deadline, its output kept: what every scheduler command goes through."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MAX_OUTPUT = 4000  # characters of a command's output kept with its result (the state file holds every one)


@dataclass(frozen=True, slots=True)
class Ran:
    """What one command did: its exit status (None: it never ran or was stopped at its deadline) and output."""

    argv: tuple[str, ...]
    code: int | None
    output: str

    @property
    def ok(self) -> bool:
        return self.code == 0

    @property
    def line(self) -> str:
        return shlex.join(self.argv)


def _kept(text: str, limit: int | None = MAX_OUTPUT) -> str:
    text = text.strip()
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def run(
    argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None, limit: int | None = MAX_OUTPUT
) -> Ran:
    """Run ``argv`` (no shell) for at most ``timeout`` seconds, keeping ``limit`` characters of its output (None:
    all of it, for output that is read rather than recorded). A missing program, a deadline passed or a non-zero
    exit is a result, never an exception: the caller records it as failed with what it said."""
    # The optimizer's own settings stay with it: FLEETFIT_* overrides carry its secrets (the MQTT password, chat
    # webhooks, tokens), which no scheduler command needs.
    own = {k: v for k, v in os.environ.items() if not k.startswith("FLEETFIT_")}
    full_env = {**own, "LC_ALL": "C", **(env or {})}
    try:
        done = subprocess.run(
            list(argv), capture_output=True, timeout=timeout, check=False, env=full_env, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError:
        return Ran(tuple(argv), None, f"{argv[0]}: not installed (not found)")
    except subprocess.TimeoutExpired as exc:
        said = (exc.stdout or b"") + (exc.stderr or b"")
        text = said.decode(errors="replace") if isinstance(said, bytes) else str(said)
        return Ran(tuple(argv), None, _kept(f"stopped after {timeout:g} s without an answer. {text}"))
    except OSError as exc:
        return Ran(tuple(argv), None, f"{argv[0]}: {exc.strerror or exc}")
    output = (done.stdout + done.stderr).decode(errors="replace")
    return Ran(tuple(argv), done.returncode, _kept(output, limit))
