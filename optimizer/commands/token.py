"""``fleetfit token``: API tokens per person or service, kept as hashes in the optimizer's tokens file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agent.config import credential_path, parse_toml
from optimizer.commands import cliargs
from optimizer.serve.tokens import Role, TokenFileError, add, parse, read_private


def add_parser(sub: argparse._SubParsersAction[cliargs.Parser]) -> None:
    """``fleetfit token add`` and ``fleetfit token list``."""
    p = sub.add_parser(
        "token",
        help="API tokens per person or service, each with a role (viewer, approver, admin)",
        description="Manage the optimizer's tokens file ([api] tokens_file; docs/operations.md, Access and audit). "
        "The file keeps only hashes; the running optimizer rereads it when it changes.",
    )
    kinds = p.add_subparsers(dest="token_command", metavar="{add,list}", required=True)
    for name, helptext in (
        ("add", "make a fresh token, print it once and append its hash to the tokens file"),
        ("list", "the names and roles in the tokens file, and any line it rejects"),
    ):
        q = kinds.add_parser(name, help=helptext, description=helptext[0].upper() + helptext[1:] + ".")
        if name == "add":
            q.add_argument(
                "name", help="whose token: a person (alice) or a service (grafana), as the audit log names it"
            )
            q.add_argument(
                "--role",
                choices=[r.value for r in Role],
                required=True,
                help="viewer: reads; approver: and acknowledges, dismisses, applies; admin: and everything else",
            )
        q.add_argument("--file", type=Path, help="the tokens file (default: --config's [api] tokens_file)")
        q.add_argument("--config", type=Path, help="the optimizer's config, for its [api] tokens_file")
        q.set_defaults(func=run)


def _tokens_file(args: argparse.Namespace) -> Path:
    """The file --file names, else the config's ``[api] tokens_file`` (read as TOML only: the file need not exist
    yet, which the full config check would refuse)."""
    if args.file is not None:
        return Path(args.file)
    if args.config is None:
        raise cliargs.DataError("which tokens file? give --file or --config")
    try:
        raw = parse_toml(Path(args.config).read_text())
    except OSError as exc:
        raise cliargs.DataError(f"cannot read {args.config}: {exc.strerror or exc}") from None
    except ValueError as exc:  # tomllib.TOMLDecodeError, TooDeep
        raise cliargs.DataError(f"{args.config}: {exc}") from None
    api = raw.get("api")
    value = api.get("tokens_file") if isinstance(api, dict) else None
    if not isinstance(value, str) or not value:
        raise cliargs.DataError(f"{args.config} sets no [api] tokens_file")
    return credential_path(Path(value))


def run(args: argparse.Namespace) -> int:
    try:
        path = _tokens_file(args)
    except cliargs.DataError as exc:
        return cliargs.fail(str(exc))
    if args.token_command == "list":
        try:
            holders, rejected = parse(read_private(path))
        except TokenFileError as exc:
            return cliargs.fail(str(exc))
        for holder, _ in holders:
            print(f"{holder.name}\t{holder.role.value}")
        for number, reason, why in rejected:
            print(f"fleetfit: {path}, line {number} rejected ({reason}): {why}", file=sys.stderr)
        return 0
    try:
        token = add(path, args.name, Role(args.role))
    except ValueError as exc:  # the name; TokenFileError (a ValueError) is the file's
        return cliargs.fail(str(exc), cliargs.DATA if isinstance(exc, TokenFileError) else cliargs.USAGE)
    except OSError as exc:
        return cliargs.fail(f"cannot write {path}: {exc.strerror or exc}")
    print(token)
    print(
        f"fleetfit: a token for {args.name} ({args.role}) is added to {path}; it is shown only now "
        "(the file keeps its hash); the running optimizer takes it at its next request",
        file=sys.stderr,
    )
    return 0
