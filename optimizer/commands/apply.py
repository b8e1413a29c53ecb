"""``fleetfit apply [ID...] [--execute]``: acknowledged actions carried out through each site's scheduler.

A dry run (the default) prints what each backend would run; ``--execute`` runs it, keeps each scheduler's answer
in the state file (optimizer/serve/executions.py), writes an audit entry and posts the results to the chat
receivers. Nothing here raises on a scheduler's refusal: a failed action is reported and counted in the exit
status (1), and the others go on (docs/apply.md)."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from optimizer.commands import cliargs

if TYPE_CHECKING:
    from optimizer.act.backend import Options, Proposal, Result
    from optimizer.serve.config import OptimizerConfig
    from optimizer.serve.lifecycle import Lifecycle, Tracked

log = logging.getLogger("fleetfit")


def add_parser(sub: argparse._SubParsersAction[cliargs.Parser]) -> None:
    p = sub.add_parser(
        "apply",
        help="carry acknowledged actions out through Slurm or Kubernetes (dry run unless --execute)",
        description="Carry out acknowledged actions through each site's scheduler ([sites.NAME] scheduler in the "
        "optimizer's config). Without --execute, prints what would run and changes nothing (docs/apply.md).",
    )
    p.add_argument("ids", nargs="*", metavar="ID", help="the actions to carry out (default: every acknowledged one)")
    p.add_argument("--execute", action="store_true", help="run the commands (default: print them)")
    p.add_argument("--requeue", action="store_true", help="a running Slurm job may be requeued onto its target")
    p.add_argument("--cancel", action="store_true", help="an idle Slurm allocation may be cancelled")
    p.add_argument("--site", help="only this site's actions")
    p.add_argument("--config", type=Path, help="the optimizer's config (TOML)")
    p.add_argument("--state-dir", type=Path, help="the optimizer's state directory (default: the config's)")
    p.add_argument("--no-post", action="store_true", help="do not post the results to the chat receivers")
    p.set_defaults(func=run)


@dataclass(frozen=True, slots=True)
class Done:
    tracked: Tracked
    result: Result


def _propose(config: OptimizerConfig, t: Tracked, owner: str | None, options: Options) -> Proposal | str:
    """What carrying ``t`` out would do, or why its site cannot."""
    from optimizer.act.backend import Proposal
    from optimizer.act.registry import backend

    site = config.sites.get(t.site)
    if site is None or site.scheduler is None:
        return f'site {t.site} names no scheduler ([sites.{t.site}] scheduler = "slurm" or "kubernetes")'
    try:
        return backend(site.scheduler, site.slurm, site.kubernetes).propose(t.recommendation, owner, options)
    except Exception as exc:  # a kubeconfig that does not load, a client library missing: this action only
        log.info("apply %s: %s", t.recommendation.id, exc, exc_info=log.isEnabledFor(logging.DEBUG))
        return Proposal(t.recommendation.id, site.scheduler, runnable=False, note=f"{type(exc).__name__}: {exc}")


def _chosen(lifecycle: Lifecycle, args: argparse.Namespace) -> tuple[list[Tracked], list[str]]:
    """The acknowledged actions to carry out, and a line for each ID given that cannot be."""
    from optimizer.serve.lifecycle import RecState

    acknowledged = lifecycle.list(args.site, [RecState.ACKNOWLEDGED])
    if not args.ids:
        return acknowledged, []
    by_id = {t.recommendation.id: t for t in acknowledged}
    chosen, refused = [], []
    for rec_id in dict.fromkeys(args.ids):
        if rec_id in by_id:
            chosen.append(by_id[rec_id])
            continue
        found = lifecycle.get(rec_id)
        if found is None:
            refused.append(f"{rec_id}: no such recommendation")
        elif found.state == RecState.ACKNOWLEDGED:
            refused.append(f"{rec_id}: of site {found.site}, not {args.site}")
        else:
            ack = f"fleetfit recommendations ack {rec_id}"
            refused.append(f"{rec_id}: {found.state}, not acknowledged (acknowledge it first: {ack})")
    return chosen, refused


def run(args: argparse.Namespace) -> int:
    import sqlite3

    from agent.config import ConfigError, load_config
    from optimizer.act.backend import Options, Status, carry_out
    from optimizer.plan.render import action_text, printable
    from optimizer.serve import audit
    from optimizer.serve.config import OptimizerConfig
    from optimizer.serve.executions import Execution
    from optimizer.serve.lifecycle import DB_NAME, Lifecycle, RecState

    try:
        config = load_config(OptimizerConfig, args.config)
    except ConfigError as exc:
        return cliargs.fail(str(exc))
    state_dir = args.state_dir or config.optimizer.state_dir
    if not (state_dir / DB_NAME).exists():
        return cliargs.fail(f"no recommendations yet: {state_dir / DB_NAME} does not exist (is the optimizer running?)")
    try:
        who = getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (a bare container)
        who = f"uid {os.getuid()}"
    options = Options(requeue=args.requeue, cancel=args.cancel)
    done: list[Done] = []
    unkept = ""  # why a result carried out could not be kept in the state file
    lifecycle: Lifecycle | None = None
    try:
        lifecycle = Lifecycle.in_state_dir(state_dir)
        chosen, refused = _chosen(lifecycle, args)
        for line in refused:
            print(f"fleetfit: {printable(line)}", file=sys.stderr)
        earlier = lifecycle.executions_of(t.recommendation.id for t in chosen)
        owners = lifecycle.kept_owners(t.recommendation.id for t in chosen)
        if args.execute:
            audit.use(audit.AuditLog(state_dir / DB_NAME))
        if not chosen and args.site and args.site not in config.sites and not lifecycle.list(args.site, RecState):
            # a site neither configured nor ever planned: a typo, not a site with nothing to do
            known = sorted({*config.sites, *(t.site for t in lifecycle.list(None, RecState))})
            return cliargs.fail(f"no site {printable(args.site)} (known: {', '.join(known) or 'none'})", cliargs.USAGE)
        if not chosen:
            print("no acknowledged actions" + (f" in site {args.site}" if args.site else ""))
        for t in chosen:
            rec = t.recommendation
            print(printable(f"{rec.id} [{t.site}] {action_text(rec)}"))
            before = earlier.get(rec.id)
            if before is not None and before.status == Status.APPLIED and not args.ids:
                print(f"  already carried out by {before.backend}; waiting for the workload on its target")
                continue
            proposal = _propose(config, t, owners.get(rec.id, (None, None))[1], options)
            if isinstance(proposal, str):
                print(printable(f"  {proposal}"))
                continue
            for line in proposal.describe().splitlines():  # each line made printable: names come from outside
                print(printable(f"  {line}"))
            if not args.execute:
                continue
            result = carry_out(proposal)
            first = result.answer
            print(printable(f"  {result.status.value}: {first}"))
            done.append(Done(t, result))
            try:
                lifecycle.add_execution(
                    Execution(
                        rec.id, t.site, time.time(), result.backend, result.status, result.commands, result.output, who
                    )
                )
            except sqlite3.Error as exc:
                # the scheduler has answered but the file takes no record (a full disk, a locked file): the answer is
                # printed above and posted; nothing more is run, since the next apply reads these records to leave
                # carried-out actions alone (a running job requeued twice restarts twice)
                unkept = f"{state_dir / DB_NAME}: {exc}: this result is not kept there; no further action is run"
                print(f"fleetfit: {printable(unkept)}", file=sys.stderr)
            audit.record(
                "apply", who, f"local:{who}", rec.id, result.status.value, f"{result.backend}: {first}"[:500],
                workload=rec.workload,
            )  # fmt: skip
            if unkept:
                break
    except sqlite3.Error as exc:
        return cliargs.fail(f"{state_dir / DB_NAME}: {exc}")
    finally:
        if lifecycle is not None:
            lifecycle.close()
        if args.execute:
            current = audit.current()
            audit.use(None)
            if current is not None:
                current.close()
    if done and not args.no_post:
        _post(config, done)
    failed = sum(1 for d in done if d.result.status == Status.FAILED)
    if not args.execute and chosen:
        print("dry run: nothing was changed (--execute runs the commands above)")
    return cliargs.DATA if failed or refused or unkept else 0


def post_items(done: list[Done]) -> dict[str, list[tuple[Done, str]]]:
    """Per site, each result in chat's words: the backend and its command, or what failed."""
    from optimizer.act.backend import Status

    out: dict[str, list[tuple[Done, str]]] = {}
    for d in done:
        if d.result.status == Status.NOTIFIED:
            continue  # nothing changed: the owner has the commands, the chat nothing new
        if d.result.status == Status.APPLIED:
            detail = f"{d.result.backend}: {'; '.join(d.result.commands)}"
        else:
            detail = f"{d.result.backend}: {d.result.answer}"
        out.setdefault(d.tracked.site, []).append((d, detail))
    return out


def _post(config: OptimizerConfig, done: list[Done]) -> None:
    """Post the results to each receiver that follows the site; a receiver that does not answer is logged."""
    from optimizer.act.backend import Status as Ran
    from optimizer.serve.alerts.delivery import Webhook
    from optimizer.serve.alerts.notice import Item, Notice, Status
    from optimizer.serve.alerts.payloads import render

    async def send() -> None:
        for site, items in post_items(done).items():
            notice = Notice(site=site, generated_at=time.time(), link=config.alerts.link)
            for d, detail in items:
                status = Status.CARRIED_OUT if d.result.status == Ran.APPLIED else Status.FAILED
                severity = config.alerts.severity(d.tracked.recommendation.monthly_savings_usd)
                notice.items.append(Item(d.tracked.recommendation, status, severity, detail))
            for receiver in config.alerts.receivers:
                if receiver.sites and site not in receiver.sites:
                    continue
                webhook = Webhook(receiver, config.alerts)
                try:
                    if not await webhook.post(render(receiver.kind, notice, receiver.byte_limit)):
                        log.warning("apply: %s did not accept the results for site %s", receiver.name, site)
                except (OSError, ValueError) as exc:  # its URL unset or unreadable: the others still get theirs
                    log.warning("apply: the results were not posted to %s: %s", receiver.name, exc)
                finally:
                    await webhook.close()

    asyncio.run(send())
