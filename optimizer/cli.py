"""The ``fleetfit`` command."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from agent.protocol import Plan

if TYPE_CHECKING:
    from agent.config import MqttSettings
    from agent.service import Agent

log = logging.getLogger("fleetfit")


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("amqtt", "transitions"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


def _fail(message: str) -> int:
    print(f"fleetfit: {message}", file=sys.stderr)
    return 2


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
        return _fail(str(exc))
    try:
        collectors = node_collectors(config.agent, args.simulate)
    except ValueError as exc:
        return _fail(str(exc))
    if args.once:
        agent = Agent(config, collectors, session=0, queue=MemoryQueue(1))
        window = asyncio.run(_one_window(agent, args.window))
        print(window)
        return 0
    agent = Agent(config, collectors, session=next_session(config.agent.state_dir), notifier=Notifier())
    asyncio.run(serve(agent))
    return 0


async def _one_window(agent: Agent, seconds: float) -> str:
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
    return json.dumps(json.loads(encode(window)), indent=2)


# -------------------------------------------------------------------------------------- optimizer


def _plan_printer(fmt: str) -> Callable[[Plan], None]:
    from optimizer.render import render_table

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
    from optimizer.alerts.alerter import Alerter
    from optimizer.catalog import CatalogError, load_catalog
    from optimizer.config import OptimizerConfig
    from optimizer.lifecycle import Lifecycle
    from optimizer.service import Optimizer, serve

    try:
        config = load_config(OptimizerConfig, args.config)
        catalog = load_catalog(config.optimizer.catalog)
        lifecycle = Lifecycle.in_state_dir(config.optimizer.state_dir)
        alerter = Alerter.in_state_dir(config.alerts, config.optimizer.state_dir) if config.alerts.receivers else None
        optimizer = Optimizer(
            config, catalog, on_plan=_plan_printer("table"), lifecycle=lifecycle, api=config.api, alerter=alerter
        )
    except (ConfigError, CatalogError) as exc:
        return _fail(str(exc))
    except (OSError, sqlite3.Error) as exc:
        return _fail(f"state directory {config.optimizer.state_dir}: {exc}")
    asyncio.run(serve(optimizer))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from optimizer.demo import DemoOptions, run_demo
    from optimizer.render import render_json, render_table

    if args.nodes < 8:
        return _fail("--nodes: the demo fleet needs at least 8 nodes")
    webhooks = []
    for spec in args.alert_webhook:
        kind, sep, url = spec.partition("=")
        if (
            not sep
            or kind not in ("slack", "mattermost", "teams", "generic")
            or not url.startswith(("http://", "https://"))
        ):
            return _fail(f"--alert-webhook {kind}=…: use KIND=URL with KIND slack, mattermost, teams or generic")
        webhooks.append((kind, url))
    options = DemoOptions(
        nodes=args.nodes, duration=args.duration, seed=args.seed, time_scale=args.time_scale, webhooks=tuple(webhooks)
    )
    printer = _plan_printer(args.format)
    plan = asyncio.run(run_demo(options, on_plan=printer))
    if plan is None:
        return _fail("no plan was produced: no telemetry reached the optimizer")
    if args.format == "json":
        print(render_json(plan))
    else:
        print("final plan:")
        print(render_table(plan))
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from optimizer.catalog import CatalogError, load_catalog
    from optimizer.recommend import PlanSettings, plan_snapshot
    from optimizer.render import render_json, render_table
    from optimizer.snapshot import Snapshot

    try:
        snapshot = Snapshot.model_validate_json(args.fleet.read_bytes())
        catalog = load_catalog(args.catalog)
    except OSError as exc:
        return _fail(f"{args.fleet}: {exc.strerror}")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        return _fail(f"{args.fleet}: {where}: {first['msg']}")
    except CatalogError as exc:
        return _fail(str(exc))
    over = snapshot.overcommitted()
    if over:
        return _fail(f"{args.fleet}: more GPUs in use than installed on {', '.join(over)}")
    settings = PlanSettings(time_limit=args.time_limit, max_moves=args.max_moves)
    if args.add or args.buy:
        from optimizer.buy import plan_and_buy

        try:
            print(plan_and_buy(snapshot, catalog, settings, args.add, args.buy, args.format))
        except ValueError as exc:
            return _fail(str(exc))
        return 0
    plan = plan_snapshot(snapshot, catalog, settings)
    print(render_json(plan) if args.format == "json" else render_table(plan))
    return 0


def _cmd_recommendations(args: argparse.Namespace) -> int:
    import csv
    import sqlite3

    from agent.config import ConfigError, load_config
    from optimizer.config import OptimizerConfig
    from optimizer.lifecycle import DB_NAME, OPEN, Lifecycle, LifecycleError, RecState

    try:
        state_dir = args.state_dir or load_config(OptimizerConfig, args.config).optimizer.state_dir
    except ConfigError as exc:
        return _fail(str(exc))
    if not (state_dir / DB_NAME).exists():
        return _fail(f"no recommendations yet: {state_dir / DB_NAME} does not exist (is the optimizer running?)")
    try:
        lifecycle = Lifecycle.in_state_dir(state_dir)
        if args.action:
            if not args.id:
                return _fail(f"recommendations {args.action}: which recommendation? give its id")
            target = {"ack": RecState.ACKNOWLEDGED, "dismiss": RecState.DISMISSED, "reopen": RecState.NEW}
            tracked = lifecycle.set_state(args.id, target[args.action])
            print(f"{tracked.recommendation.id} {tracked.state}")
            return 0
        rows = lifecycle.list(args.site, list(RecState) if args.all else OPEN)
    except LifecycleError as exc:
        return _fail(str(exc))
    except sqlite3.Error as exc:
        return _fail(f"{state_dir / DB_NAME}: {exc}")
    if args.format == "json":
        out = [
            {
                **t.recommendation.model_dump(mode="json"),
                "site": t.site,
                "state": t.state.value,
                "first_seen": t.first_seen,
                "last_seen": t.last_seen,
            }
            for t in rows
        ]
        print(json.dumps(out, indent=2))
    elif args.format == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow(
            [
                "id",
                "state",
                "site",
                "workload",
                "class",
                "from_node",
                "from_hardware",
                "to_node",
                "to_hardware",
                "monthly_savings_usd",
                "risk",
                "reason",
            ]
        )
        for t in rows:
            r = t.recommendation
            writer.writerow(
                [
                    r.id,
                    t.state.value,
                    t.site,
                    r.workload_name,
                    r.workload_class.value,
                    r.from_node,
                    r.from_hardware,
                    r.to_node,
                    r.to_hardware,
                    r.monthly_savings_usd,
                    r.risk,
                    r.reason,
                ]
            )
    else:
        if not rows:
            print("no recommendations" + ("" if args.all else " open (see --all)"))
        for t in rows:
            r = t.recommendation
            print(
                f"{r.id}  {t.state.value:12} {r.workload_name[:28]:28} {r.from_node} -> {r.to_node} "
                f"[{r.to_hardware}]  ${r.monthly_savings_usd:,.0f}/month  risk {r.risk}"
            )
    return 0


def _cmd_alerts(args: argparse.Namespace) -> int:
    from agent.config import ConfigError, load_config
    from optimizer.alerts.delivery import Webhook
    from optimizer.alerts.notice import sample_notice
    from optimizer.alerts.payloads import render
    from optimizer.config import OptimizerConfig

    try:
        settings = load_config(OptimizerConfig, args.config).alerts
    except ConfigError as exc:
        return _fail(str(exc))
    receivers = {r.name: r for r in settings.receivers}
    if args.receiver not in receivers:
        known = ", ".join(sorted(receivers)) or "none configured"
        return _fail(f"alerts test: no receiver {args.receiver!r} (receivers: {known})")
    receiver = receivers[args.receiver]
    notice = sample_notice()
    notice.link = settings.link
    body = render(receiver.kind, notice, receiver.byte_limit)

    async def send() -> bool:
        webhook = Webhook(receiver, settings)
        try:
            return await webhook.post(body)
        finally:
            await webhook.close()

    if not asyncio.run(send()):
        return _fail(f"alerts test: the sample message to {receiver.name} was not accepted (see the log above)")
    print(f"sent a sample {receiver.kind} message to {receiver.name} ({len(body)} bytes)")
    return 0


def _broker_settings(url: str, protocol: str) -> MqttSettings:
    from agent.config import MqttSettings

    parts = urlsplit(url if "://" in url else f"mqtt://{url}")
    if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
        raise ValueError(f"--broker {url!r}: expected mqtt://host[:port] or mqtts://host[:port]")
    tls = parts.scheme == "mqtts"
    return MqttSettings(
        host=parts.hostname,
        port=parts.port or (8883 if tls else 1883),
        tls=tls,
        username=parts.username,
        password=parts.password,
        protocol=protocol,
    )


def _cmd_simulate(args: argparse.Namespace) -> int:
    from agent.clock import Clock
    from agent.simulate import SimulatedFleet, open_record
    from collectors.scenarios import build_scenario

    try:
        mqtt = _broker_settings(args.broker, args.mqtt_protocol)
        nodes = build_scenario(args.scenario, args.nodes, args.seed)
    except ValueError as exc:
        return _fail(str(exc))
    record = open_record(args.record)
    _raise_open_files_limit()

    async def main() -> None:
        import signal

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        fleet = SimulatedFleet(
            nodes,
            mqtt,
            site=args.site,
            clock=Clock(args.time_scale),
            publish_interval=args.publish_interval,
            seed=args.seed,
            record=record,
        )
        if args.duration:
            loop.call_later(args.duration, stop.set)
        await fleet.run(stop)

    try:
        asyncio.run(main())
    finally:
        if record is not None:
            record.close()
    return 0


def _raise_open_files_limit() -> None:
    """One MQTT connection per simulated node: lift the soft limit on open files to the hard one."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _cmd_classify(args: argparse.Namespace) -> int:
    from optimizer.offline import RecordingError, classify_all, load_file, render_score, score

    try:
        rec = load_file(args.file, horizon=args.horizon)
    except (OSError, RecordingError) as exc:
        return _fail(f"{args.file}: {exc}")
    results = classify_all(rec)
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
    labelled = [(r.truth, r.result.workload_class) for r in results if r.truth is not None]
    if labelled:
        print(render_score(score(labelled)), file=sys.stderr if args.format == "json" else sys.stdout)
    return 0


# ------------------------------------------------------------------------------------------ main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetfit", description="Find AI workloads on the wrong GPU hardware.")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("agent", help="per-node telemetry daemon")
    p.add_argument("--config", type=Path)
    p.add_argument("--once", action="store_true", help="print one window as JSON and exit")
    p.add_argument("--window", type=float, default=2.0, help="seconds the --once window spans (default 2)")
    p.add_argument("--simulate", metavar="MODELxN[:PATTERN]", help="simulated GPUs (e.g. h100x8) with real NICs/disks")
    p.set_defaults(func=_cmd_agent)

    p = sub.add_parser("optimizer", help="central daemon: ingest, classify, plan")
    p.add_argument("--config", type=Path)
    p.set_defaults(func=_cmd_optimizer)

    p = sub.add_parser("demo", help="embedded broker + simulated fleet + optimizer")
    p.add_argument("--nodes", type=int, default=10)
    p.add_argument("--duration", type=float, default=45.0, help="seconds of real time (default 45)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--time-scale", type=float, default=10.0, help="simulated seconds per real second")
    p.add_argument(
        "--alert-webhook",
        action="append",
        default=[],
        metavar="KIND=URL",
        help="also post the recommendations to this webhook (KIND: slack, mattermost, teams, generic); repeatable",
    )
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("alerts", help="chat alert hooks")
    alerts = p.add_subparsers(dest="alerts_command", required=True)
    t = alerts.add_parser("test", help="send a sample message to one receiver")
    t.add_argument("--receiver", required=True, help="the receiver's name in [[alerts.receivers]]")
    t.add_argument("--config", type=Path, help="the optimizer's config")
    t.set_defaults(func=_cmd_alerts)

    p = sub.add_parser("recommendations", help="list recommendations; acknowledge, dismiss or reopen one")
    p.add_argument("action", nargs="?", choices=["ack", "dismiss", "reopen"])
    p.add_argument("id", nargs="?")
    p.add_argument("--format", choices=["table", "json", "csv"], default="table")
    p.add_argument("--all", action="store_true", help="include dismissed, applied and expired ones")
    p.add_argument("--site")
    p.add_argument("--config", type=Path, help="the optimizer's config (for its state directory)")
    p.add_argument("--state-dir", type=Path, help="the optimizer's state directory")
    p.set_defaults(func=_cmd_recommendations)

    p = sub.add_parser("classify", help="classify recorded telemetry; scores itself when labels are present")
    p.add_argument("file", type=Path, metavar="FILE.jsonl")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--horizon", type=int, default=100_000, help="latest windows per node to use")
    p.set_defaults(func=_cmd_classify)

    p = sub.add_parser("plan", help="plan offline from a fleet snapshot (docs/snapshot.md)")
    p.add_argument("fleet", type=Path, metavar="FLEET.json")
    p.add_argument("--time-limit", type=float, default=10.0, help="solver seconds (default 10)")
    p.add_argument("--max-moves", type=int, default=20)
    p.add_argument("--catalog", type=Path, help="hardware catalog (default: the one shipped)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument(
        "--add",
        action="append",
        default=[],
        metavar='"TYPE xGPUS = NODES"',
        help='plan as if these empty nodes were added, e.g. "l40s x8 = 4"; repeatable',
    )
    p.add_argument("--buy", action="store_true", help="also say what buying capacity the plan lacks would return")
    p.set_defaults(func=_cmd_plan)

    p = sub.add_parser("simulate", help="run simulated agents against a broker")
    p.add_argument("--broker", required=True, help="mqtt://[user:pass@]host[:port]")
    p.add_argument("--mqtt-protocol", choices=["5", "3.1.1"], default="5")
    p.add_argument("--nodes", type=int, default=10)
    p.add_argument("--scenario", default="mixed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--site", default="sim")
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--publish-interval", type=float, default=10.0)
    p.add_argument("--duration", type=float, default=0.0, help="seconds of real time; 0 runs until stopped")
    p.add_argument("--record", type=Path, help="append every window with its ground-truth labels as JSONL")
    p.set_defaults(func=_cmd_simulate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
