"""Command-line values checked where they are parsed, and secrets read from the environment or files.

Every bad value ends the command with one line that names its option, never a traceback. The exit status says
whose mistake it was, as argparse and grep do: 2 (``USAGE``) for the command line itself (an unknown option, a
value out of range, an argument missing), 1 (``DATA``) for what the command read (a file's contents or a file
that is not there, a config, the optimizer's state, a server that refused).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from agent.config import MqttSettings

WEBHOOK_KINDS = ("slack", "mattermost", "teams", "generic")
WEBHOOK_ENV = "FLEETFIT_ALERT_WEBHOOK"
BROKER_PASSWORD_ENV = "FLEETFIT_BROKER_PASSWORD"
_HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,62})?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62})?)*\.?")


DATA = 1
USAGE = 2


class DataError(ValueError):
    """A value the command read (a file, the environment) was refused: exit status ``DATA``, not ``USAGE``."""


# pydantic's phrasing, as the product says it (the location before it already names the key)
_PHRASES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^Value error, "), ""),
    (re.compile(r"^Assertion failed, "), ""),
    (re.compile(r"^Field required$"), "missing"),
    (re.compile(r"^Extra inputs are not permitted$"), "not a known key"),
    (re.compile(r"^Input should be a valid integer.*$"), "expected a whole number"),
    (re.compile(r"^Input should be a finite number$"), "expected a finite number"),
    (re.compile(r"^Input should be a valid number.*$"), "expected a number"),
    (re.compile(r"^Input should be a valid string$"), "expected text"),
    (re.compile(r"^Input should be a valid boolean.*$"), "expected true or false"),
    (re.compile(r"^Input should be a valid (list|array)$"), "expected a list"),
    (re.compile(r"^Input should be a valid dictionary.*$"), "expected a table (an object)"),
    (re.compile(r"^Input should be greater than or equal to "), "must be at least "),
    (re.compile(r"^Input should be greater than "), "must be above "),
    (re.compile(r"^Input should be less than or equal to "), "must be at most "),
    (re.compile(r"^Input should be less than "), "must be below "),
    (re.compile(r"^Input should be (a valid )?"), "expected "),
    (re.compile(r"^String should have at most "), "at most "),
    (re.compile(r"^String should have at least "), "at least "),
    (re.compile(r"^List should have at most "), "at most "),
    (re.compile(r"^Invalid JSON$"), "not valid JSON"),
]
_ERRNO = re.compile(r"\[Errno \d+\] ([^:\]]+)(: '[^']*')?")


def in_words(message: str) -> str:
    """An error line in the product's words: no pydantic phrasing ("Value error, ", "Input should be …"), no
    ``[Errno 2]`` (the path it repeats is already named before it)."""
    parts = _ERRNO.sub(lambda m: m.group(1), message).split(": ")
    for i, part in enumerate(parts):
        for pattern, words in _PHRASES:
            if pattern.search(part):
                parts[i] = pattern.sub(words, part, count=1)
                break
    return ": ".join(parts)


def fail(message: str, code: int = DATA) -> int:
    """One line on stderr, in the product's words, and the exit status: ``DATA`` (1) for what the command read,
    ``USAGE`` (2) for the command line itself."""
    print(f"fleetfit: {in_words(message)}", file=sys.stderr)
    return code


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: ``fleetfit demo: argument --duration: …``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def number(
    kind: Callable[[str], float], *, above: float | None = None, at_least: float | None = None
) -> Callable[[str], float]:
    """An argparse ``type`` for a finite number above (or at least) a bound."""
    what = "an integer" if kind is int else "a number"

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if above is not None and value <= above:
            raise argparse.ArgumentTypeError(f"must be above {above:g}, got {text}")
        if at_least is not None and value < at_least:
            raise argparse.ArgumentTypeError(f"must be at least {at_least:g}, got {text}")
        return value

    return parse


def port(text: str) -> int:
    """A TCP port, or 0 for a free one."""
    value = int(number(int, at_least=0)(text))
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is at most 65535, got {text}")
    return value


def http_url(text: str) -> str:
    """An http(s) URL with a host: nothing else (file:, ftp:) is fetched."""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r}: expected http://HOST[:PORT] or https://HOST[:PORT]")
    return text


def positive_float(text: str) -> float:
    return number(float, above=0)(text)


def non_negative_float(text: str) -> float:
    return number(float, at_least=0)(text)


def positive_int(text: str) -> int:
    return int(number(int, at_least=1)(text))


def non_negative_int(text: str) -> int:
    return int(number(int, at_least=0)(text))


_IDENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # agent.protocol.Ident: a site's or a node's name


def ident(text: str) -> str:
    """A site's name, as the protocol accepts it (it is a topic level)."""
    if not _IDENT.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r}: letters, digits, '.', '_' and '-', starting with a letter or digit, at most 128"
        )
    return text


def pid_list(text: str) -> list[int]:
    """Process ids separated by commas: ``4242,4243``."""
    try:
        pids = [int(word) for word in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected process ids separated by commas, got {text!r}") from None
    if any(pid < 1 for pid in pids):
        raise argparse.ArgumentTypeError(f"a process id is at least 1, got {text!r}")
    return pids


def output_file(text: str) -> Path:
    """A file to append to: its directory must exist and it must not be a directory itself."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file name in it")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"directory {path.parent} does not exist")
    return path


# ------------------------------------------------------------------------------------------ webhooks


def webhook(spec: str) -> tuple[str, str]:
    """``KIND=URL``; the error never repeats the URL, which is a credential."""
    kind, sep, url = spec.strip().partition("=")
    if not sep:
        raise argparse.ArgumentTypeError("expected KIND=URL, e.g. slack=https://hooks.slack.com/services/…")
    if kind not in WEBHOOK_KINDS:
        raise argparse.ArgumentTypeError(f"unknown KIND {kind!r} in KIND=URL: use {', '.join(WEBHOOK_KINDS)}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"the URL after {kind}= is not an http:// or https:// URL with a host")
    return kind, url


def webhooks(given: list[tuple[str, str]], file: Path | None, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """Webhooks from ``--alert-webhook`` (readable by every user in the process list, so warned about),
    ``--alert-webhook-file`` (one KIND=URL per line) and ``FLEETFIT_ALERT_WEBHOOK`` (KIND=URL, space-separated).
    DataError names the source of a bad entry."""
    if given:
        print(
            f"fleetfit: warning: --alert-webhook shows the webhook URL to every user of this machine (ps); "
            f"prefer {WEBHOOK_ENV} or --alert-webhook-file",
            file=sys.stderr,
        )
    out = list(given)
    sources: list[tuple[str, list[str]]] = []
    if file is not None:
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not a text file"
            raise DataError(f"--alert-webhook-file {file}: {reason}") from None
        lines = [line.strip() for line in text.splitlines()]
        sources.append((f"--alert-webhook-file {file}", [line for line in lines if line and not line.startswith("#")]))
    if environ.get(WEBHOOK_ENV, "").strip():
        sources.append((WEBHOOK_ENV, environ[WEBHOOK_ENV].split()))
    for where, specs in sources:
        for spec in specs:
            try:
                out.append(webhook(spec))
            except argparse.ArgumentTypeError as exc:
                raise DataError(f"{where}: {exc}") from None
    return out


# ------------------------------------------------------------------------------------------ broker


def broker_settings(
    url: str, protocol: str, password_file: Path | None = None, environ: Mapping[str, str] = os.environ
) -> MqttSettings:
    """``mqtt[s]://[user[:password]@]host[:port]``; the password may instead come from ``password_file`` or
    ``FLEETFIT_BROKER_PASSWORD``, which no other user can read. ValueError names ``--broker``."""
    from pydantic import SecretStr

    from agent.config import MqttSettings, read_secret

    shape = "expected mqtt://host[:port] or mqtts://host[:port]"
    if "://" not in url:
        if "/" in url:  # mqtt//host, a typo, is no host name
            raise ValueError(f"--broker {url!r}: {shape}")
        url = f"mqtt://{url}"
    parts = urlsplit(url)
    if parts.scheme not in ("mqtt", "mqtts"):
        raise ValueError(f"--broker: scheme {parts.scheme!r} unknown; {shape}")
    host = parts.hostname or ""
    if not (_HOSTNAME.fullmatch(host) or (host and ":" in host)) or parts.path not in ("", "/"):
        raise ValueError(f"--broker: {parts.netloc.rpartition('@')[2] or url!r} is not a host name; {shape}")
    if parts.query or parts.fragment:
        raise ValueError(f"--broker: {shape} (no path, query or fragment)")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"--broker: the port must be a number from 1 to 65535 ({shape})") from None
    if port == 0:
        raise ValueError("--broker: the port must be a number from 1 to 65535")
    tls = parts.scheme == "mqtts"
    password: SecretStr | None = SecretStr(unquote(parts.password)) if parts.password else None
    if password is not None:
        print(
            f"fleetfit: warning: the password in --broker is visible to every user of this machine (ps); "
            f"prefer {BROKER_PASSWORD_ENV} or --broker-password-file",
            file=sys.stderr,
        )
    elif password_file is not None:
        try:
            password = read_secret(password_file)
        except ValueError as exc:
            raise DataError(f"--broker-password-file: {exc}") from None
    elif environ.get(BROKER_PASSWORD_ENV):
        password = SecretStr(environ[BROKER_PASSWORD_ENV])
    return MqttSettings(
        host=host,
        port=port or (8883 if tls else 1883),
        tls=tls,
        username=unquote(parts.username) if parts.username else None,
        password=password,
        protocol=protocol,
    )
