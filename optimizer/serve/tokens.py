"""API tokens per person or service, each with a role, from a file the optimizer rereads when it changes.

The file (``[api] tokens_file``) holds one token a line, as ``fleetfit token add`` writes it::

    # name      role      hash of the token
    alice       approver  sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824
    grafana     viewer    sha256:...

Only hashes are kept: the file shows who may do what, never a token anyone could use. A token is checked by
hashing it and comparing the hash with every line's in constant time (``hmac.compare_digest``, no early exit), so
the time an answer takes says nothing about how much of a token was right.

A line that is not of that form is rejected alone (logged and counted by reason), the rest stands. A file that
cannot be read, or that others than its owner and group may read, is refused: at start the optimizer does not
start; later the tokens read last stay in force and ``problem`` says why. The old shared token (``[api] token``)
is one more token, an admin named ``shared-token``, with a warning.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import stat
from collections import Counter
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

log = logging.getLogger(__name__)

SHARED_NAME = "shared-token"  # the holder the old shared token's decisions are recorded under
MAX_FILE_BYTES = 1 << 20  # about 10,000 lines: more people than one optimizer serves; a bigger file is refused
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$")
HASH = re.compile(r"^sha256:([0-9a-f]{64})$")
TOKEN_BYTES = 32  # 256 bits from secrets.token_urlsafe: no guessing, and no salt needed for a hash of it


class Role(StrEnum):
    VIEWER = "viewer"  # reads the console and the API
    APPROVER = "approver"  # and decides: acknowledge, dismiss, reopen, apply
    ADMIN = "admin"  # and everything else: reloading the tokens file


_RANK = {Role.VIEWER: 0, Role.APPROVER: 1, Role.ADMIN: 2}


def allows(role: Role, needed: Role) -> bool:
    """Whether ``role`` may do what needs ``needed`` (each role may do what the ones below it may)."""
    return _RANK[role] >= _RANK[needed]


@dataclass(frozen=True, slots=True)
class Holder:
    name: str
    role: Role


class TokenFileError(ValueError):
    """A tokens file that cannot be used at all (missing, unreadable, readable by others, too big)."""


def hash_token(token: str) -> str:
    """A token as the tokens file keeps it."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def line_for(name: str, role: Role, token: str) -> str:
    """The tokens file's line for ``token``; ValueError for a name the file would reject."""
    if not NAME.fullmatch(name):  # not match: its "$" lets a trailing line break split the line in two
        raise ValueError(f"a name is 1 to 64 letters, digits and . _ @ + - (starting with a letter or digit): {name!r}")
    return f"{name} {role.value} {hash_token(token)}\n"


def parse(text: str) -> tuple[list[tuple[Holder, bytes]], list[tuple[int, str, str]]]:
    """The holders of a tokens file with their tokens' hashes, and the lines rejected: (line number, reason,
    why). Reasons: ``fields``, ``name``, ``role``, ``hash``, ``duplicate_token``."""
    holders: list[tuple[Holder, bytes]] = []
    rejected: list[tuple[int, str, str]] = []
    seen: set[bytes] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != 3:
            rejected.append((number, "fields", f"{len(fields)} fields, not 3 (name role sha256:HEX)"))
            continue
        name, role, digest = fields
        if not NAME.fullmatch(name):
            rejected.append((number, "name", "a name is 1 to 64 letters, digits and . _ @ + -"))
            continue
        if role not in Role.__members__.values():
            rejected.append((number, "role", f"role {role[:20]!r} is not viewer, approver or admin"))
            continue
        found = HASH.match(digest)
        if found is None:
            # never echo the field: a token pasted here by mistake must not reach the log
            rejected.append((number, "hash", "the third field is not sha256: and 64 lower-case hex digits"))
            continue
        value = bytes.fromhex(found.group(1))
        if value in seen:
            rejected.append((number, "duplicate_token", "the same token is on an earlier line"))
            continue
        seen.add(value)
        holders.append((Holder(name, Role(role)), value))
    return holders, rejected


def _private(path: Path, mode: int) -> None:
    """TokenFileError when others than the file's owner and group may read or change it."""
    if mode & stat.S_IRWXO:
        raise TokenFileError(f"{path} is open to others (mode {stat.S_IMODE(mode):o}): chmod o= {path}")


def read_private(path: Path) -> str:
    """The text of a tokens file that only its owner and group may read; TokenFileError otherwise."""
    try:
        with path.open("rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            _private(path, mode)
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise TokenFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise TokenFileError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise TokenFileError(f"{path} is not UTF-8 text") from None


class Tokens:
    """The tokens a server accepts: the tokens file's, reread whenever it changes, and the old shared token."""

    def __init__(self, path: Path | None, shared: str | None = None) -> None:
        self.path = path
        self._shared = hashlib.sha256(shared.encode()).digest() if shared else None
        self._holders: list[tuple[Holder, bytes]] = []
        self._signature: tuple[int, int, int, int] | None = None
        self.rejected: Counter[str] = Counter()  # lines rejected, by reason, counted at each read of the file
        self.reloads: Counter[str] = Counter()  # reads of the file: ok, failed
        self.problem: str | None = None  # why the file's current contents are not in force; None when they are
        if shared:
            log.warning(
                "API: the shared token ([api] token or token_file) is in use, as an admin named %r: every decision "
                "made with it is recorded under that one name; give each person a token of their own "
                "([api] tokens_file, fleetfit token add)",
                SHARED_NAME,
            )
        if path is not None:
            self._load(read_private(path), self._stat(path))  # at start a file that cannot be used is fatal

    @property
    def shared(self) -> bool:
        return self._shared is not None

    def roles(self) -> Counter[str]:
        """How many tokens are in force, by role."""
        out = Counter(h.role.value for h, _ in self._holders)
        if self._shared is not None:
            out[Role.ADMIN.value] += 1
        return out

    @staticmethod
    def _stat(path: Path) -> tuple[int, int, int, int] | None:
        try:
            st = path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def _load(self, text: str, signature: tuple[int, int, int, int] | None) -> None:
        holders, rejected = parse(text)
        for number, reason, why in rejected:
            self.rejected[reason] += 1
            log.warning("API tokens file %s, line %d rejected (%s): %s", self.path, number, reason, why)
        self._holders = holders
        self._signature = signature
        self.reloads["ok"] += 1
        if self.problem is not None:
            log.warning("API tokens file %s read again: %d tokens in force", self.path, len(holders))
        self.problem = None

    def refresh(self, force: bool = False) -> None:
        """Reread the tokens file when it changed (or ``force``); one that cannot be read keeps the tokens in force."""
        if self.path is None:
            return
        signature = self._stat(self.path)
        if not force and signature is not None and signature == self._signature:
            return
        try:
            self._load(read_private(self.path), signature)
        except TokenFileError as exc:
            self._signature = signature  # said once per change of the file, not at every request
            self.reloads["failed"] += 1
            if self.problem != str(exc):
                log.error(
                    "API tokens file not reread, the %d tokens read last stay in force: %s", len(self._holders), exc
                )
            self.problem = str(exc)

    def holder(self, token: str) -> Holder | None:
        """Whose ``token`` is, or None for a token not in force."""
        self.refresh()
        digest = hashlib.sha256(token.encode()).digest()
        found: Holder | None = None
        for holder, value in self._holders:  # every line compared, a match or not: the time says nothing
            if hmac.compare_digest(digest, value) and found is None:
                found = holder
        if self._shared is not None and hmac.compare_digest(digest, self._shared) and found is None:
            found = Holder(SHARED_NAME, Role.ADMIN)
        return found


def add(path: Path, name: str, role: Role) -> str:
    """A fresh token for ``name`` with ``role``, its hash appended to the tokens file at ``path`` (created private,
    with its directory's owner and group, when missing); the token itself, to be shown once."""
    token = new_token()
    line = line_for(name, role, token)
    existed = path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        if not existed and os.geteuid() == 0:
            # made by root in the service's own directory (its state directory, owned by its dynamic user):
            # the service must be able to read it
            where = path.parent.stat()
            os.fchown(fd, where.st_uid, where.st_gid)
        _private(path, os.fstat(fd).st_mode)
        if os.fstat(fd).st_size and not _ends_in_newline(path):
            line = "\n" + line
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return token


def _ends_in_newline(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"
