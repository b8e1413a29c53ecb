"""The ``fleetfit`` command."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from agent.protocol import Plan
from optimizer.commands import apply, cliargs, importer, token

if TYPE_CHECKING:
    from agent.service import Agent
    from collectors.sim.exporter import ExporterOptions
    from collectors.sim.scenarios import ScenarioNode
    from optimizer.serve.alerts.settings import AlertSettings, ReceiverSettings
    from optimizer.serve.config import OptimizerConfig

log = logging.getLogger("fleetfit")

# Modules a GPU node's (agent-only) install leaves out, and the extra that brings each.
EXTRAS = {
    "ortools": "optimizer",
    "aiohttp": "optimizer",
    "influxdb_client": "optimizer",
    "numpy": "optimizer",
    "amqtt": "demo",
}
# The commands that run on the optimizer's side, and the extra each needs; `agent` and `simulate` need none.
COMMAND_EXTRAS = {
    "optimizer": "optimizer",
    "demo": "demo",
    "plan": "optimizer",
    "classify": "optimizer",
    "recommendations": "optimizer",
    "report": "optimizer",
    "catalog": "optimizer",
    "alerts": "optimizer",
    "import": "optimizer",
    "token": "optimizer",
    "apply": "optimizer",
}
OWN_PACKAGES = ("agent", "collectors", "optimizer")


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("amqtt", "transitions"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


def _usage(message: str) -> int:
    return cliargs.fail(message, cliargs.USAGE)


# ------------------------------------------------------------------------------------------ agent


def _cmd_agent(args: argparse.Namespace) -> int:
    from agent.config import AgentConfig, ConfigError, load_config
    from agent.notify import Notifier
    from agent.service import Agent, serve
    from agent.session import next_session
    from agent.sources import node_collectors
    from agent.spool import MemoryQueue

    try:
        config = load_config(AgentConfig, args.config)
    except ConfigError as exc:
        return cliargs.fail(str(exc))
    try:
        collectors = node_collectors(config.agent, args.simulate, args.simulate_pids)
    except ValueError as exc:  # --simulate's spec
        return _usage(str(exc))
    if args.once:
        # a session per run (the clock's seconds), so that windows from several runs appended to one file are
        # not duplicates of each other when `classify` reads them back
        agent = Agent(config, collectors, session=int(time.time()), queue=MemoryQueue(1))
        window = asyncio.run(_one_window(agent, args.window, args.jsonl))
        print(window)
        return 0
    agent = Agent(config, collectors, session=next_session(config.agent.state_dir), notifier=Notifier())
    asyncio.run(serve(agent))
    return agent.exit_code


async def _one_window(agent: Agent, seconds: float, jsonl: bool = False) -> str:
    from agent.protocol import encode

    interval = agent.settings.sample_interval
    ticks = max(2, round(seconds / interval) + 1)  # rates need two readings
    for i in range(ticks):
        agent.tick()
        if i + 1 < ticks:
            await asyncio.sleep(interval)
    window = agent.close_window()
    for c in agent.collectors:
        c.close()
    if window is None:
        raise RuntimeError("no sample was taken")
    if jsonl:  # one line, as `fleetfit classify` reads recordings back
        return encode(window).decode()
    return json.dumps(json.loads(encode(window)), indent=2)


# -------------------------------------------------------------------------------------- optimizer


def _plan_printer(fmt: str) -> Callable[[Plan], None]:
    from optimizer.plan.render import render_table

    last: dict[str, object] = {}

    def show(plan: Plan) -> None:
        signature = (
            tuple((w.id, w.workload_class) for w in plan.workloads),
            tuple((r.id, r.to_node) for r in plan.recommendations),
        )
        if last.get(plan.site) == signature:
            return
        last[plan.site] = signature
        if fmt == "table":
            print(render_table(plan), end="\n\n", flush=True)

    return show


def _cmd_optimizer(args: argparse.Namespace) -> int:
    import sqlite3

    from agent.config import ConfigError, load_config
    from agent.notify import Notifier
    from optimizer.decide.catalog import CatalogError, load_catalog
    from optimizer.decide.inventory import InventoryError
    from optimizer.serve import audit
    from optimizer.serve.alerts.alerter import Alerter
    from optimizer.serve.audit import AuditLog
    from optimizer.serve.config import OptimizerConfig
    from optimizer.serve.lifecycle import Lifecycle
    from optimizer.serve.service import Optimizer, ingest_limits, serve

    try:
        config = load_config(OptimizerConfig, args.config)
        catalog = load_catalog(config.optimizer.catalog)
        # what refuses a config (prices, site inventories) before anything is written: a refused config leaves no
        # state directory for `recommendations` and `report` to read in place of the right one
        ingest_limits(config, catalog.with_prices(config.prices))
        lifecycle = Lifecycle.in_state_dir(config.optimizer.state_dir, repair=True)
        # decisions made through the API, and actions taken on them, are audited beside the states
        audit.use(AuditLog(lifecycle.path, config.api.audit_retention_days, config.api.audit_max_entries))
        # the alert log lives beside the states, wherever they had to go
        alerter = Alerter.in_state_dir(config.alerts, lifecycle.path.parent) if config.alerts.receivers else None
        optimizer = Optimizer(config, catalog, on_plan=_plan_printer("table"), lifecycle=lifecycle, alerter=alerter)
        if config.api.listen:
            from optimizer.serve.web.app import WebServer

            optimizer.attach(WebServer(optimizer, config.api))
    except (ConfigError, CatalogError, InventoryError) as exc:
        return cliargs.fail(str(exc))
    except UnicodeDecodeError:
        return cliargs.fail(f"catalog {config.optimizer.catalog}: not a text file (a catalog is TOML)")
    except (OSError, sqlite3.Error) as exc:
        return cliargs.fail(f"state directory {config.optimizer.state_dir}: {exc}")
    try:
        asyncio.run(serve(optimizer, Notifier()))
    except asyncio.CancelledError:  # a second SIGINT/SIGTERM
        return cliargs.fail("optimizer interrupted before a clean shutdown")
    if optimizer.failed is not None:
        return cliargs.fail(f"optimizer stopped: {optimizer.failed}")
    return 0


def _me() -> str:
    """How to run this ``fleetfit`` again from the same directory: its name when the shell finds this one by it."""
    import shutil

    found = shutil.which("fleetfit")
    given = sys.argv[0] if sys.argv and sys.argv[0].endswith("fleetfit") else ""
    if not given or (found and Path(found).resolve() == Path(given).resolve()):
        return "fleetfit"
    return given


def _cmd_demo(args: argparse.Namespace) -> int:
    import shlex

    from optimizer.commands.demo import DemoOptions, run_demo
    from optimizer.commands.demostate import DemoState, DemoStateError, default_dir
    from optimizer.plan.render import render_json, render_table

    if args.nodes < 8:
        return _usage("--nodes: the demo fleet needs at least 8 nodes")
    try:
        webhooks = cliargs.webhooks(args.alert_webhook, args.alert_webhook_file, os.environ)
    except ValueError as exc:
        return cliargs.fail(str(exc), cliargs.DATA if isinstance(exc, cliargs.DataError) else cliargs.USAGE)
    options = DemoOptions(
        nodes=args.nodes,
        duration=args.duration,
        seed=args.seed,
        time_scale=args.time_scale,
        webhooks=tuple(webhooks),
        console=not args.no_console,
        console_port=args.port,
        keep_serving=args.keep_serving,
        state_dir=args.state_dir,
    )
    printer = _plan_printer(args.format)
    # on stdout with the table; with --format json stdout carries only the plan
    out = sys.stderr if args.format == "json" else sys.stdout
    where: list[DemoState] = []

    def show_state() -> None:
        state = where[0]
        if state.kept:
            kept = "kept after the run, until the next demo"
        else:
            kept = f"removed when the run ends: another demo holds {default_dir()}"
        print(f"state: {state.path} ({kept}); from another terminal:", file=out)
        for command in ("recommendations", "report"):
            print(f"  {_me()} {command} --state-dir {shlex.quote(str(state.path))}", file=out)
        out.flush()

    def state_ready(state: DemoState) -> None:
        where.append(state)
        if not options.console:  # else after the console's address, which comes first
            show_state()

    def console_ready(url: str, token: str) -> None:
        print(f"console: {url}  (token for its buttons: {token})", file=out, flush=True)
        show_state()

    def show_final(plan: Plan) -> None:
        if args.format == "json":
            print(render_json(plan), flush=True)
        else:
            print("final plan:")
            print(render_table(plan), flush=True)

    final_shown: list[Plan] = []

    def final_ready(plan: Plan) -> None:  # with --keep-serving: shown now, while the console stays up
        final_shown.append(plan)
        show_final(plan)

    try:
        plan = asyncio.run(
            run_demo(options, on_plan=printer, on_console=console_ready, on_state=state_ready, on_final=final_ready)
        )
    except asyncio.CancelledError:  # a second SIGINT/SIGTERM
        return cliargs.fail("demo interrupted")
    except DemoStateError as exc:
        return cliargs.fail(str(exc))
    if plan is None:
        return cliargs.fail("no plan was produced: no telemetry reached the optimizer")
    if not final_shown:
        show_final(plan)
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from optimizer.decide.catalog import CatalogError, load_catalog
    from optimizer.decide.snapshot import Snapshot, unknown_hardware
    from optimizer.plan.recommend import PlanSettings, plan_snapshot
    from optimizer.plan.render import render_json, render_table

    try:
        snapshot = Snapshot.model_validate_json(args.fleet.read_bytes())
        catalog = load_catalog(args.catalog)
    except OSError as exc:
        return cliargs.fail(f"{args.fleet}: {exc.strerror}")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        return cliargs.fail(f"{args.fleet}: {where}: {first['msg']}")
    except CatalogError as exc:
        return cliargs.fail(str(exc))
    except UnicodeDecodeError:
        return cliargs.fail(f"catalog {args.catalog}: not a text file (a catalog is TOML)")
    unknown = unknown_hardware(catalog, snapshot)
    if unknown:
        i, name = unknown[0]
        return cliargs.fail(
            f"{args.fleet}: nodes.{i}.hardware: unknown hardware {name!r} (not a catalog key or GPU name)"
        )
    over = snapshot.overcommitted()
    if over:
        return cliargs.fail(f"{args.fleet}: more GPUs in use than installed on {', '.join(over)}")
    settings = PlanSettings(time_limit=args.time_limit, max_moves=args.max_moves, buy=not args.no_buy)
    if args.add or args.buy:
        from optimizer.commands.buy import BuyError, plan_and_buy

        try:
            print(plan_and_buy(snapshot, catalog, settings, args.add, args.buy, args.format))
        except BuyError as exc:  # --add's value
            return _usage(str(exc))
        return 0
    plan = plan_snapshot(snapshot, catalog, settings)
    print(render_json(plan) if args.format == "json" else render_table(plan))
    return 0


def _cmd_catalog(args: argparse.Namespace) -> int:
    import sqlite3

    from agent.config import ConfigError, load_config
    from optimizer.commands.catalog_view import Taught, from_state, render_catalog_json, render_catalog_table
    from optimizer.decide.catalog import CatalogError, load_catalog
    from optimizer.serve.config import OptimizerConfig
    from optimizer.serve.lifecycle import DB_NAME

    try:
        catalog = load_catalog(args.catalog)
        state_dir = args.state_dir or load_config(OptimizerConfig, args.config).optimizer.state_dir
    except (CatalogError, ConfigError) as exc:
        return cliargs.fail(str(exc))
    except UnicodeDecodeError:
        return cliargs.fail(f"catalog {args.catalog}: not a text file (a catalog is TOML)")
    taught = Taught()
    if (state_dir / DB_NAME).exists():
        try:
            taught = from_state(catalog, state_dir / DB_NAME)
        except sqlite3.Error as exc:
            return cliargs.fail(f"{state_dir / DB_NAME}: {exc}")
    print(render_catalog_json(catalog, taught) if args.format == "json" else render_catalog_table(catalog, taught))
    if taught.skipped:
        print(taught.skipped_line(state_dir / DB_NAME), file=sys.stderr)
    return 0


def _cmd_recommendations(args: argparse.Namespace) -> int:
    import csv
    import getpass
    import sqlite3

    from agent.config import ConfigError, load_config
    from optimizer.plan.render import action_fields, csv_cell, numbered, render_listing
    from optimizer.serve import audit
    from optimizer.serve.audit import AuditLog
    from optimizer.serve.config import OptimizerConfig
    from optimizer.serve.lifecycle import DB_NAME, OPEN, Lifecycle, LifecycleError, RecState

    given: list[Path] = args.state_dir or []
    try:
        # several optimizers, each planning its own sites: read each one's state directory
        state_dirs = given[1:] and given
        if not state_dirs:
            args.state_dir = given[0] if given else None
            state_dirs = [_state_dir(args, load_config(OptimizerConfig, args.config).optimizer.state_dir)]
    except ConfigError as exc:
        return cliargs.fail(str(exc))
    for state_dir in state_dirs:
        if not (state_dir / DB_NAME).exists():
            return cliargs.fail(
                f"no recommendations yet: {state_dir / DB_NAME} does not exist (is the optimizer running?)"
            )
    for state_dir in state_dirs:
        _say_state_dir(state_dir)
    rows = []
    for n, state_dir in enumerate(state_dirs):
        try:
            lifecycle = Lifecycle.in_state_dir(state_dir)
            if args.action:
                if not args.id:
                    return _usage(f"recommendations {args.action}: which recommendation? give its id")
                target = {"ack": RecState.ACKNOWLEDGED, "dismiss": RecState.DISMISSED, "reopen": RecState.NEW}
                try:  # whoever may write the state file decides from the shell
                    who = f"local:{getpass.getuser()}"
                except (KeyError, OSError):  # no name for this uid (a container)
                    who = f"local:uid {os.getuid()}"
                trail = AuditLog(lifecycle.path)
                try:
                    tracked = lifecycle.set_state(args.id, target[args.action])
                except LifecycleError as exc:
                    if "no recommendation" in str(exc) and n + 1 < len(state_dirs):
                        continue  # another optimizer's, perhaps
                    audit.record(args.action, who, "local", args.id, audit.REFUSED, str(exc), into=trail)
                    raise
                audit.record(args.action, who, "local", args.id, audit.OK, tracked.state.value, into=trail)
                print(f"{tracked.recommendation.id} {tracked.state}")
                return 0
            rows += lifecycle.list(args.site, list(RecState) if args.all else OPEN)
        except LifecycleError as exc:
            return cliargs.fail(str(exc))
        except sqlite3.Error as exc:
            return cliargs.fail(f"{state_dir / DB_NAME}: {exc}")
    open_numbers = {
        site: numbered(t.recommendation for t in rows if t.site == site and t.state in OPEN)
        for site in {t.site for t in rows}
    }
    if args.format == "json":
        out = [
            {
                **t.recommendation.model_dump(mode="json"),
                **action_fields(t.recommendation, open_numbers[t.site]),
                "site": t.site,
                "state": t.state.value,
                "first_seen": t.first_seen,
                "last_seen": t.last_seen,
            }
            for t in rows
        ]
        print(json.dumps(out, indent=2))
    elif args.format == "csv":
        columns = ["id", "state", "site", "number", "wave", "waits", "kind", "action", "workload", "class"]
        columns += ["from_node", "from_hardware", "to_node", "to_hardware", "gpus", "gpus_after"]
        columns += ["monthly_savings_usd", "risk", "reason"]
        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        for t in rows:
            r = t.recommendation
            fields = action_fields(r, open_numbers[t.site])
            row: list[object] = [
                r.id,
                t.state.value,
                t.site,
                fields["number"],
                r.wave,
                fields["waits"],
                fields["kind"],
                fields["action"],
                r.workload_name,
                r.workload_class.value,
                r.from_node,
                r.from_hardware,
                r.to_node,
                r.to_hardware,
                r.gpus,
                r.gpus_after,
                r.monthly_savings_usd,
                r.risk,
                r.reason,
            ]
            writer.writerow([csv_cell(v) for v in row])
    elif not rows:
        print("no recommendations" + ("" if args.all else " open (see --all)"))
    else:
        print(render_listing([(t.site, t.state.value, t.recommendation) for t in rows]))
    return 0


def _say_state_dir(state_dir: Path) -> None:
    """One line on stderr naming the state directory a read command reads (stdout stays the data); where it holds
    no state, the refusal names it instead."""
    from optimizer.serve.lifecycle import DB_NAME

    if (state_dir / DB_NAME).exists():
        print(f"fleetfit: reading the optimizer's state in {state_dir}", file=sys.stderr)


def _state_dir(args: argparse.Namespace, configured: Path) -> Path:
    """The state directory to read: ``--state-dir``, else the config's. Given neither, where the optimizer's default
    holds no state but a demo's directory does, the demo's, with a line on stderr that says so."""
    from optimizer.commands.demostate import demo_running, last_demo_dir
    from optimizer.serve.lifecycle import DB_NAME

    if args.state_dir is not None:
        return Path(args.state_dir)
    if args.config is not None or (configured / DB_NAME).exists():
        return configured
    demo = last_demo_dir()
    if demo is None:
        return configured
    which = "the running demo's" if demo_running(demo) else "the last demo's"
    print(f"fleetfit: no optimizer state in {configured}: reading {which}, in {demo}", file=sys.stderr)
    return demo


def _cmd_report(args: argparse.Namespace) -> int:
    import sqlite3

    from agent.config import ConfigError, load_config
    from optimizer.serve.config import OptimizerConfig
    from optimizer.serve.report import parse_since, run_report

    try:
        since = parse_since(args.since)
    except ValueError as exc:
        return _usage(str(exc))
    try:
        config = load_config(OptimizerConfig, args.config) if args.config or args.post or not args.state_dir else None
        state_dir = _state_dir(args, config.optimizer.state_dir if config else Path("."))
        _say_state_dir(state_dir)
        if args.post:
            return _post_report(state_dir, since, args.by, args.post, config)
        print(run_report(state_dir, since, args.by, args.format, wide=args.wide))
    except (ValueError, ConfigError, FileNotFoundError) as exc:
        return cliargs.fail(str(exc))
    except sqlite3.Error as exc:
        return cliargs.fail(f"{state_dir}: {exc}")
    return 0


def _post_report(state_dir: Path, since: float, by: str, name: str, config: OptimizerConfig | None) -> int:
    """Post the report to one configured alert receiver (a weekly digest, from a timer)."""
    from optimizer.serve.lifecycle import DB_NAME
    from optimizer.serve.report import Ledger
    from optimizer.serve.report_chat import render

    receivers = {r.name: r for r in config.alerts.receivers} if config else {}
    if name not in receivers:
        known = ", ".join(sorted(receivers)) or "none configured (give --config)"
        return _usage(f"report --post: no receiver {name!r} (receivers: {known})")
    receiver = receivers[name]
    url = receiver.url().get_secret_value()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return cliargs.fail(f"report --post: receiver {receiver.name}'s URL is not an http(s) URL with a host")
    if not (state_dir / DB_NAME).exists():
        raise FileNotFoundError(f"no showback yet: {state_dir / DB_NAME} does not exist (is the optimizer running?)")
    ledger = Ledger(state_dir / DB_NAME)
    try:
        rows = ledger.report(since, by)  # type: ignore[arg-type]
    finally:
        ledger.close()
    body = render(receiver.kind, rows, by, since, receiver.byte_limit)  # type: ignore[arg-type]
    assert config is not None

    if not _post_once(receiver, config.alerts, body):
        return cliargs.fail(f"report --post: {receiver.name} did not accept the report (see the log above)")
    print(f"posted the showback of {len(rows)} {by}(s) to {receiver.name} ({len(body)} bytes)")
    return 0


def _post_once(receiver: ReceiverSettings, settings: AlertSettings, body: bytes) -> bool:
    """Post ``body`` to ``receiver`` once, with the hooks' own retries and limits; whether it was accepted."""
    from optimizer.serve.alerts.delivery import Webhook

    async def send() -> bool:
        webhook = Webhook(receiver, settings)
        try:
            return await webhook.post(body)
        finally:
            await webhook.close()

    return asyncio.run(send())


def _cmd_alerts(args: argparse.Namespace) -> int:
    from agent.config import ConfigError, load_config
    from optimizer.serve.alerts.notice import sample_notice
    from optimizer.serve.alerts.payloads import render
    from optimizer.serve.config import OptimizerConfig

    try:
        settings = load_config(OptimizerConfig, args.config).alerts
    except ConfigError as exc:
        return cliargs.fail(str(exc))
    receivers = {r.name: r for r in settings.receivers}
    if args.receiver not in receivers:
        known = ", ".join(sorted(receivers)) or "none configured"
        return _usage(f"alerts test: no receiver {args.receiver!r} (receivers: {known})")
    receiver = receivers[args.receiver]
    try:
        url = receiver.url().get_secret_value()
    except (ValueError, OSError) as exc:
        return cliargs.fail(f"alerts test: {exc}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        # a malformed URL never becomes valid by retrying: say so now (the URL is a secret: not printed)
        return cliargs.fail(f"alerts test: receiver {receiver.name}'s URL is not an http(s) URL with a host")
    notice = sample_notice()
    notice.link = settings.link
    body = render(receiver.kind, notice, receiver.byte_limit)

    if not _post_once(receiver, settings, body):
        return cliargs.fail(f"alerts test: the sample message to {receiver.name} was not accepted (see the log above)")
    print(f"sent a sample {receiver.kind} message to {receiver.name} ({len(body)} bytes)")
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    from agent.clock import Clock
    from agent.simulate import SimulatedFleet, open_record
    from collectors.sim.exporter import ExporterOptions
    from collectors.sim.scenarios import build_scenario, simulated_node
    from collectors.sim.scrape import ExporterServer, drive

    if not (args.broker or args.dcgm_exporter is not None or args.dcgm_history):
        return _usage("simulate: give --broker URL, --dcgm-exporter PORT or --dcgm-history FILE (or several)")
    try:
        mqtt = None
        if args.broker:
            mqtt = cliargs.broker_settings(args.broker, args.mqtt_protocol, args.broker_password_file, os.environ)
        nodes = build_scenario(args.scenario, args.nodes, args.seed)
    except ValueError as exc:  # --broker, --scenario, --nodes; a password file that cannot be read is DATA
        return cliargs.fail(str(exc), cliargs.DATA if isinstance(exc, cliargs.DataError) else cliargs.USAGE)
    exporter = ExporterOptions(
        fields=args.dcgm_fields,
        hostname_label=args.dcgm_hostname_label,
        hostname_from=args.dcgm_hostname,
        kubernetes=not args.dcgm_no_kubernetes,
    )
    if len(nodes) > args.nodes:
        print(
            f"simulating {len(nodes)} nodes: the {args.nodes} asked for and {len(nodes) - args.nodes} spare node(s) "
            "with free GPUs for the planned moves to land on (docs/simulator.md)",
            file=sys.stderr,
        )
    if args.dcgm_history:
        rc = _dcgm_history(args, nodes, exporter)
        if rc or (mqtt is None and args.dcgm_exporter is None):
            return rc
    try:
        record = open_record(args.record)
    except OSError as exc:
        return cliargs.fail(f"--record {args.record}: {exc.strerror}")
    _raise_open_files_limit()

    async def main() -> SimulatedFleet | str | None:
        import signal

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        clock = Clock(args.time_scale)
        fleet = None
        if mqtt is not None:
            fleet = SimulatedFleet(
                nodes,
                mqtt,
                site=args.site,
                clock=clock,
                publish_interval=args.publish_interval,
                seed=args.seed,
                record=record,
            )
        # Without a broker the nodes run without agents, sampled once a simulated second for the exporter alone.
        sims = fleet.sims if fleet is not None else [simulated_node(n, clock.wall, args.seed) for n in nodes]
        server = None
        if args.dcgm_exporter is not None:
            server = ExporterServer(sims, exporter, port=args.dcgm_exporter)
            try:
                await server.start()
            except OSError as exc:
                return f"--dcgm-exporter {args.dcgm_exporter}: {exc.strerror}"
            print(f"dcgm-exporter: {server.url}", file=sys.stderr, flush=True)
        if args.duration:
            loop.call_later(args.duration, stop.set)
        scheduler = None
        if args.apply_acknowledged:
            from agent.scheduler import apply_acknowledged

            scheduler = asyncio.create_task(apply_acknowledged(sims, args.api, stop))
        try:
            await (fleet.run(stop) if fleet is not None else drive(sims, clock, stop))
            if scheduler is not None:
                await scheduler
        finally:
            if server is not None:
                await server.stop()
        return fleet

    try:
        fleet = asyncio.run(main())
    finally:
        if record is not None:
            record.close()
    if isinstance(fleet, str):
        return cliargs.fail(fleet)
    if fleet is None or mqtt is None:
        return 0
    errors = [a.link.last_error for a in fleet.agents if a.link.last_error]
    if errors and not any(a.link.connects for a in fleet.agents):
        unsent = sum(len(a.queue) for a in fleet.agents)
        return cliargs.fail(
            f"--broker: never reached the broker at {mqtt.host}:{mqtt.port} ({errors[-1]}); "
            f"{unsent} window(s) not published"
        )
    return 0


def _dcgm_history(args: argparse.Namespace, nodes: list[ScenarioNode], exporter: ExporterOptions) -> int:
    """Write ``--dcgm-history``: the fleet's last ``--history`` seconds as the exporters would have published them."""
    from collectors.sim.backfill import labels_path, write_history

    end = float(int(time.time() // args.step * args.step))  # whole steps: every node's samples share timestamps
    try:
        stats = write_history(
            nodes, args.dcgm_history, end=end, span=args.history, step=args.step, options=exporter,
            fmt=args.dcgm_history_format, seed=args.seed, jobs=args.dcgm_history_jobs or os.cpu_count() or 1,
        )  # fmt: skip
    except ValueError as exc:
        return _usage(f"--dcgm-history: {exc}")
    except OSError as exc:
        return cliargs.fail(f"--dcgm-history {args.dcgm_history}: {exc.strerror}")
    print(
        f"dcgm-history: {args.dcgm_history} ({args.dcgm_history_format}, {stats.lines:,} samples of {stats.steps} "
        f"steps, {stats.bytes / 2**20:,.1f} MiB in {stats.seconds:.1f} s); ground truth of {stats.workloads} "
        f"workload(s) in {labels_path(args.dcgm_history)}",
        file=sys.stderr,
    )
    return 0


def _raise_open_files_limit() -> None:
    """One MQTT connection per simulated node: lift the soft limit on open files to the hard one."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _cmd_classify(args: argparse.Namespace) -> int:
    from optimizer.commands.offline import RecordingError, classify_all, load_file, load_labels, render_score, score
    from optimizer.decide.classify import MIN_WINDOWS

    try:
        rec = load_file(args.file, horizon=args.horizon)
    except OSError as exc:
        return cliargs.fail(f"{args.file}: {exc.strerror}")
    except UnicodeDecodeError:
        return cliargs.fail(f"{args.file}: not a text file (a recording is JSON lines of telemetry windows)")
    except RecordingError as exc:
        return cliargs.fail(f"{args.file}: {exc}")
    if args.labels is not None:
        try:
            rec.labels.update(load_labels(args.labels))
        except OSError as exc:
            return cliargs.fail(f"{args.labels}: {exc.strerror or exc}")
        except RecordingError as exc:
            return cliargs.fail(str(exc))
    results = classify_all(rec)
    if not results:
        return cliargs.fail(rec.nothing_found(args.file))
    if args.format == "json":
        rows = [
            {
                "workload": r.features.id,
                "name": r.features.name,
                "nodes": r.features.nodes,
                "class": r.result.workload_class.value,
                "confidence": r.result.confidence,
                "evidence": list(r.result.evidence),
                "label": r.truth.value if r.truth else None,
            }
            for r in results
        ]
        print(json.dumps(rows, indent=2))
    else:
        print(f"{len(results)} workload(s) from {rec.lines} line(s), {rec.rejected} rejected")
        for r in sorted(results, key=lambda r: (r.features.nodes, r.features.name)):
            mark = "" if r.truth is None else ("  ok" if r.truth == r.result.workload_class else f"  WRONG: {r.truth}")
            print(
                f"{r.features.name[:28]:28} {','.join(r.features.nodes)[:20]:20} {r.result.workload_class.value:16}"
                f" {r.result.confidence:.2f}{mark}"
            )
            print(f"    {'; '.join(r.result.evidence[:3])}")
    short = sum(1 for r in results if r.features.windows < MIN_WINDOWS)
    if short:
        print(
            f"{short} workload(s) seen in fewer than {MIN_WINDOWS} windows cannot be classified: record more "
            f"(`fleetfit agent --once --jsonl` writes one window a run; append {MIN_WINDOWS} or more to one file)",
            file=sys.stderr,
        )
    labelled = [(r.truth, r.result.workload_class) for r in results if r.truth is not None]
    if labelled:
        print(render_score(score(labelled)), file=sys.stderr if args.format == "json" else sys.stdout)
    return 0


# ------------------------------------------------------------------------------------------ main

DEFAULT_STATE_DIR = "/var/lib/fleetfit-optimizer"  # OptimizerSettings.state_dir, which imports the optimizer's packages


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fleetfit")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _group_help(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """A command group given without its verb (`fleetfit alerts`): its help, on stderr, and status 2."""

    def show(args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return 2

    return show


def build_parser() -> argparse.ArgumentParser:
    from collectors.sim.names import SCENARIOS

    parser = cliargs.Parser(
        prog="fleetfit",
        description="Find AI workloads on the wrong GPU hardware, and say where they should go. `fleetfit demo` "
        "shows it on a simulated fleet; `fleetfit COMMAND --help` describes each command.",
    )
    _add_global_options(parser, default="info")
    sub = parser.add_subparsers(dest="command", required=True)
    scenarios = ", ".join(SCENARIOS)

    p = sub.add_parser(
        "agent",
        help="per-node telemetry daemon",
        description="Sample this node's GPUs, NICs, disks and host every second, attribute GPUs to workloads, and "
        "publish a window of telemetry every 10 s to the broker (spooled on disk while it is unreachable). Runs "
        "under systemd (systemd/fleetfit-agent.service); --once prints one window and exits.",
    )
    p.add_argument("--config", type=Path, help="the agent's TOML config (default: built-in settings)")
    p.add_argument("--once", action="store_true", help="print one window as JSON and exit")
    p.add_argument("--jsonl", action="store_true", help="with --once: one JSON line, as `classify` reads back")
    p.add_argument(
        "--window", type=cliargs.positive_float, default=2.0, help="seconds the --once window spans (default 2)"
    )
    p.add_argument(
        "--simulate",
        metavar="MODELxN[:PATTERN][:PARTITION]",
        help="simulated GPUs (h100x8; mi300x8:cpx: AMD GPUs in a compute partition mode) with real NICs/disks",
    )
    p.add_argument(
        "--simulate-pids",
        metavar="PID[,PID...]",
        type=cliargs.pid_list,
        default=[],
        help="with --simulate: local processes taken for those on the simulated GPUs (PID i on GPU i), attributed "
        "to workloads and described from /proc as on a real node",
    )
    p.set_defaults(func=_cmd_agent)

    p = sub.add_parser(
        "optimizer",
        help="central daemon: ingest, classify, plan, serve the console",
        description="Take every node's telemetry from the broker, classify each workload, plan each site's moves "
        "every solve interval, keep their states, post them to chat, and serve the console and the HTTP API "
        "(127.0.0.1:8470 by default). Runs under systemd (systemd/fleetfit-optimizer.service).",
    )
    p.add_argument("--config", type=Path, help="the optimizer's TOML config (default: built-in settings)")
    p.set_defaults(func=_cmd_optimizer)

    p = sub.add_parser(
        "demo",
        help="embedded broker + simulated fleet + optimizer, with the console on a local port",
        description="Run a simulated fleet with planted misplacements, an idle allocation and an oversized service, "
        "replay a day of its history, plan it, and serve the console on 127.0.0.1 (its URL is printed). "
        "Needs nothing installed.",
    )
    p.add_argument("--nodes", type=cliargs.positive_int, default=13, help="simulated nodes, at least 8 (default 13)")
    p.add_argument(
        "--duration",
        type=cliargs.positive_float,
        default=25.0,
        help="seconds of live telemetry, after each node's day of history is queued (default 25)",
    )
    p.add_argument("--format", choices=["table", "json"], default="table", help="how plans are printed (stdout)")
    p.add_argument("--seed", type=int, default=1, help="random seed of the simulated fleet (default 1)")
    p.add_argument(
        "--time-scale",
        type=cliargs.positive_float,
        default=10.0,
        help="simulated seconds per real second (default 10)",
    )
    p.add_argument("--port", type=cliargs.port, default=0, help="the console's port on 127.0.0.1 (default: a free one)")
    p.add_argument("--keep-serving", action="store_true", help="after the run, keep the console up until Ctrl-C")
    p.add_argument(
        "--state-dir",
        type=Path,
        help="keep the run's recommendation states and ledger here (default: $XDG_STATE_HOME/fleetfit/demo, "
        "~/.local/state/fleetfit/demo), for `fleetfit recommendations` and `fleetfit report`",
    )
    p.add_argument("--no-console", action="store_true", help="serve no console")
    p.add_argument(
        "--alert-webhook",
        action="append",
        default=[],
        type=cliargs.webhook,
        metavar="KIND=URL",
        help="also post the recommendations to this webhook (KIND: slack, mattermost, teams, generic); repeatable. "
        f"The URL is a secret that any user can read here: prefer ${cliargs.WEBHOOK_ENV} (KIND=URL, "
        "space-separated) or --alert-webhook-file",
    )
    p.add_argument(
        "--alert-webhook-file", type=Path, metavar="FILE", help="a file of KIND=URL lines (# starts a comment)"
    )
    p.set_defaults(func=_cmd_demo)

    importer.add_parser(sub)
    apply.add_parser(sub)
    token.add_parser(sub)

    p = sub.add_parser(
        "alerts",
        help="chat alert hooks",
        description="The optimizer's chat receivers ([[alerts.receivers]] in its config: Slack, Mattermost, Teams, "
        "a generic webhook).",
    )
    alerts = p.add_subparsers(dest="alerts_command", metavar="{test}")
    p.set_defaults(func=_group_help(p))
    t = alerts.add_parser(
        "test",
        help="send a sample message to one receiver",
        description="Send a made-up recommendation to one receiver of --config, to check its URL and its channel.",
    )
    t.add_argument("--receiver", required=True, help="the receiver's name in [[alerts.receivers]]")
    t.add_argument("--config", type=Path, help="the optimizer's config")
    t.set_defaults(func=_cmd_alerts)

    p = sub.add_parser(
        "recommendations",
        help="list recommendations; acknowledge, dismiss or reopen one",
        description="The optimizer's recommended actions per site, numbered in the order to carry them out (wave "
        "by wave; an action waits for those it names), with their state; or a person's decision on one. Reads "
        "the optimizer's state directory.",
    )
    p.add_argument("action", nargs="?", choices=["ack", "dismiss", "reopen"], help="a decision on recommendation ID")
    p.add_argument("id", nargs="?", help="the recommendation's id (the ID column of the list)")
    p.add_argument("--format", choices=["table", "json", "csv"], default="table", help="output format")
    p.add_argument("--all", action="store_true", help="include dismissed, applied and expired ones")
    p.add_argument("--site", help="only this site's recommendations")
    p.add_argument("--config", type=Path, help="the optimizer's config (for its state directory)")
    p.add_argument(
        "--state-dir",
        type=Path,
        action="append",
        help=f"the optimizer's state directory (default: --config's [optimizer] state_dir, else {DEFAULT_STATE_DIR}; "
        "given neither option, a demo's ($XDG_STATE_HOME/fleetfit/demo) when the optimizer's holds no state); "
        "repeat it to read several optimizers', each planning its own sites",
    )
    p.set_defaults(func=_cmd_recommendations)

    p = sub.add_parser(
        "report",
        help="showback: GPU-hours by class, $ held, $ wasted by finding kind and open savings per owner",
        description="Sum the optimizer's ledger: every plan charges the time since the previous one (the time the "
        "optimizer watched; replayed history is not charged) to each workload's owner, site or hardware.",
    )
    p.add_argument("--by", choices=["owner", "site", "hardware"], default="owner", help="group by (default owner)")
    p.add_argument(
        "--wide",
        action="store_true",
        help="the table with every column, empty ones included (by default it fits 120 columns)",
    )
    p.add_argument("--since", default="7d", help="7d, 24h, 90m, 2w or a date YYYY-MM-DD (UTC; default 7d)")
    p.add_argument("--format", choices=["table", "json", "csv"], default="table", help="output format")
    p.add_argument("--config", type=Path, help="the optimizer's config (for its state directory)")
    p.add_argument(
        "--state-dir",
        type=Path,
        help=f"the optimizer's state directory (default: --config's [optimizer] state_dir, else {DEFAULT_STATE_DIR}; "
        "given neither option, a demo's ($XDG_STATE_HOME/fleetfit/demo) when the optimizer's holds no state)",
    )
    p.add_argument(
        "--post",
        metavar="RECEIVER",
        help="post it to this alert receiver of --config instead of printing (a weekly digest, from a timer)",
    )
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser(
        "catalog",
        help="the hardware catalog: figures, throughput per workload shape, sources, learned corrections",
        description="Print every GPU model's datasheet figures, its throughput for compute-bound and memory-bound "
        "work against an H100 SXM, the source of each figure, and the correction factors learned from observed "
        "moves (from the optimizer's state directory). A catalog file with a figure or a source missing is refused.",
    )
    p.add_argument("--format", choices=["table", "json"], default="table", help="output format")
    p.add_argument("--catalog", type=Path, help="hardware catalog (default: the one shipped)")
    p.add_argument("--config", type=Path, help="the optimizer's config (for its state directory)")
    p.add_argument("--state-dir", type=Path, help="the optimizer's state directory (learned corrections)")
    p.set_defaults(func=_cmd_catalog)

    p = sub.add_parser(
        "classify",
        help="classify recorded telemetry; scores itself when labels are present",
        description="Classify the workloads in recorded telemetry windows (fleetfit simulate --record, or fleetfit "
        "agent --once --jsonl appended several times: a class needs at least three windows of a workload). With "
        "labels it prints a confusion matrix and macro-F1.",
    )
    p.add_argument(
        "file", type=Path, metavar="FILE.jsonl", help="windows as JSON lines (simulate --record, agent --once --jsonl)"
    )
    p.add_argument("--format", choices=["table", "json"], default="table", help="output format")
    p.add_argument("--horizon", type=cliargs.positive_int, default=100_000, help="latest windows per node to use")
    p.add_argument(
        "--labels",
        type=Path,
        metavar="FILE",
        help="workload id -> class (or simulator pattern) as JSON or CSV, to score the recording",
    )
    p.set_defaults(func=_cmd_classify)

    p = sub.add_parser(
        "plan",
        help="plan offline from a fleet snapshot (docs/snapshot.md)",
        description="Plan moves for a documented fleet snapshot, as the optimizer plans a live site: the actions in "
        "the order to carry them out, what each saves, blocked moves with why, what buying capacity returns, and "
        "how far the plan is from the best possible.",
    )
    p.add_argument("fleet", type=Path, metavar="FLEET.json", help="a fleet snapshot (docs/snapshot.md)")
    p.add_argument("--time-limit", type=cliargs.positive_float, default=10.0, help="solver seconds (default 10)")
    p.add_argument("--max-moves", type=cliargs.non_negative_int, default=20, help="most moves in the plan (default 20)")
    p.add_argument("--catalog", type=Path, help="hardware catalog (default: the one shipped)")
    p.add_argument("--format", choices=["table", "json"], default="table", help="output format")
    p.add_argument(
        "--add",
        action="append",
        default=[],
        metavar='"TYPE xGPUS = NODES"',
        help='plan as if these empty nodes were added, e.g. "l40s x8 = 4"; repeatable',
    )
    buying = p.add_mutually_exclusive_group()
    buying.add_argument(
        "--buy", action="store_true", help="what buying the capacity the plan lacks returns, with its own time limit"
    )
    buying.add_argument("--no-buy", action="store_true", help="leave the purchase section out (a faster plan)")
    p.set_defaults(func=_cmd_plan)

    p = sub.add_parser(
        "simulate",
        help="run simulated agents against a broker",
        description="Simulated nodes of known hardware running workloads of known patterns (docs/simulator.md), "
        "publishing over MQTT as real agents do; --record keeps every window with its ground truth.",
    )
    p.add_argument(
        "--broker",
        help=f"mqtt[s]://[user@]host[:port]; the password from ${cliargs.BROKER_PASSWORD_ENV} or "
        "--broker-password-file (a password in the URL is visible to every user); without it the nodes run for "
        "--dcgm-exporter alone",
    )
    p.add_argument("--broker-password-file", type=Path, metavar="FILE", help="file holding the broker password")
    p.add_argument("--mqtt-protocol", choices=["5", "3.1.1"], default="5", help="MQTT version (default 5)")
    p.add_argument(
        "--nodes",
        type=cliargs.positive_int,
        default=10,
        help="nodes to simulate; a few spare nodes with free GPUs are added (default 10)",
    )
    p.add_argument("--scenario", default="mixed", choices=SCENARIOS, metavar="NAME", help=f"one of: {scenarios}")
    p.add_argument("--seed", type=int, default=0, help="random seed: two seeds give two fleets (default 0)")
    p.add_argument("--site", default="sim", type=cliargs.ident, help="the site the nodes report under (default sim)")
    p.add_argument(
        "--time-scale", type=cliargs.positive_float, default=1.0, help="simulated seconds per real second (default 1)"
    )
    p.add_argument(
        "--publish-interval",
        type=cliargs.number(float, at_least=1.0),
        default=10.0,
        help="simulated seconds per window (default 10)",
    )
    p.add_argument(
        "--duration", type=cliargs.non_negative_float, default=0.0, help="seconds of real time; 0 runs until stopped"
    )
    p.add_argument(
        "--record", type=cliargs.output_file, help="append every window with its ground-truth labels as JSONL"
    )
    p.add_argument(
        "--apply-acknowledged",
        action="store_true",
        help="act as the fleet's scheduler: carry out the actions acknowledged in the optimizer (read from --api); "
        "moved workloads run at the simulated hardware's own speed",
    )
    p.add_argument(
        "--api",
        type=cliargs.http_url,
        default="http://127.0.0.1:8470",
        help="the optimizer's HTTP API, for --apply-acknowledged (default http://127.0.0.1:8470)",
    )
    _add_exporter_arguments(p)
    p.set_defaults(func=_cmd_simulate)
    _global_options_everywhere(parser)
    return parser


LOG_LEVELS = ["debug", "info", "warning", "error"]


def _add_global_options(p: argparse.ArgumentParser, default: str | None) -> None:
    """``--version`` and ``--log-level``. On a command (``default`` None) they leave the value the line gave
    before the command in place unless given again after it."""
    g = p if default is not None else p.add_argument_group("options of every command")
    own = p._option_string_actions
    if "--version" not in own:
        g.add_argument("--version", action="version", version=f"fleetfit {_version()}")
    if "--log-level" not in own:
        level = default if default is not None else argparse.SUPPRESS
        g.add_argument("--log-level", default=level, choices=LOG_LEVELS, help="log verbosity (stderr; default info)")


def _global_options_everywhere(parser: argparse.ArgumentParser) -> None:
    """Global options anywhere on the line (`fleetfit plan X --log-level debug`), on every command and every
    command's verb; a command with an option of the same name keeps its own."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
                _add_global_options(command, default=None)
                _global_options_everywhere(command)


def _add_exporter_arguments(p: argparse.ArgumentParser) -> None:
    """simulate's dcgm-exporter options (docs/simulator.md)."""
    from collectors.sim.names import FIELD_SETS, HISTORY_FORMATS

    g = p.add_argument_group("dcgm-exporter, kube-state-metrics, cAdvisor and node_exporter series")
    g.add_argument(
        "--dcgm-exporter", type=cliargs.port, metavar="PORT",
        help="serve every node's series on http://127.0.0.1:PORT/metrics and one node's on /nodes/NODE/metrics "
        "(0: a free port, printed)",
    )  # fmt: skip
    g.add_argument(
        "--dcgm-fields", choices=FIELD_SETS, default="default",
        help="basic: no profiling fields; default: default-counters.csv's; all: also SM, NVLink and power limit",
    )  # fmt: skip
    g.add_argument(
        "--dcgm-hostname-label", choices=("Hostname", "hostname"), default="Hostname",
        help="the host name label's spelling (dcgm-exporter after 4.8.2 writes hostname)",
    )  # fmt: skip
    g.add_argument(
        "--dcgm-hostname", choices=("node", "pod"), default="node",
        help="pod: the exporter pod's name, as on Kubernetes, and the node in kubernetes_node",
    )  # fmt: skip
    g.add_argument(
        "--dcgm-no-kubernetes", action="store_true",
        help="no pod labels on GPUs and no kube-state-metrics or cAdvisor series (bare metal)",
    )  # fmt: skip
    g.add_argument(
        "--dcgm-history", type=cliargs.output_file, metavar="FILE",
        help="write the fleet's past --history seconds, timestamped, and FILE.labels.json (the ground truth)",
    )  # fmt: skip
    g.add_argument(
        "--dcgm-history-format", choices=HISTORY_FORMATS, default="openmetrics",
        help="openmetrics (promtool tsdb create-blocks-from openmetrics) or victoriametrics (/api/v1/import/"
        "prometheus: text with millisecond timestamps)",
    )  # fmt: skip
    g.add_argument(
        "--dcgm-history-jobs", type=cliargs.positive_int, metavar="N",
        help="processes simulating the history, each a share of the nodes (default: one per CPU)",
    )  # fmt: skip
    g.add_argument(
        "--history", type=cliargs.positive_float, default=86_400.0, metavar="SECONDS",
        help="seconds of past for --dcgm-history (default 86400)",
    )  # fmt: skip
    g.add_argument(
        "--step", type=cliargs.number(float, at_least=1.0), default=60.0, metavar="SECONDS",
        help="seconds between --dcgm-history samples, one scrape interval (default 60)",
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 0
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        extra = COMMAND_EXTRAS.get(args.command) or EXTRAS.get(top)
        if not top or top in OWN_PACKAGES or extra is None:
            raise
        return cliargs.fail(
            f"`fleetfit {args.command}` needs the {extra}'s packages ({top} is not installed): "
            f"pip install 'fleetfit[{extra}]'"
        )
    except BrokenPipeError:  # the reader left (`fleetfit classify … | head -1`): nothing more to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's last flush does not fail again
        return 141  # as a shell reports a command killed by SIGPIPE
    return code


if __name__ == "__main__":
    sys.exit(main())
