"""Several optimizers on one broker, each planning its own sites, and a standby taking a stopped one's over."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import aiohttp
import aiomqtt
import pytest
from conftest import EXAMPLES, FLEETFIT, MosquittoServer, Shipped, recent, shipped_broker, wait_until
from test_alerts import receiver, settings
from webhook_server import webhook_server

from agent.config import MqttSettings
from agent.metrics import render
from agent.mqtt import make_client
from agent.protocol import (
    HandedPost,
    HandedState,
    Handover,
    NodeStatus,
    Presence,
    TopicKind,
    encode,
    handover_topic,
    move_fingerprint,
    node_topic,
    presence_topic,
)
from agent.simulate import offline_windows
from collectors.sim.scenarios import build_scenario
from optimizer.decide.catalog import load_catalog
from optimizer.serve.alerts.alerter import Alerter
from optimizer.serve.config import ApiSettings, OptimizerConfig, OptimizerSettings
from optimizer.serve.lifecycle import Lifecycle, RecState
from optimizer.serve.selfmetrics import optimizer_metrics
from optimizer.serve.service import Optimizer
from optimizer.serve.web.app import WebServer

SITES = ("s1", "s2", "s3", "s4")
NODES = 8  # the demo scenario's first eight nodes: a site whose plan holds moves (tests/test_alerts.py)
WINDOWS = 8


async def publish_sites(mqtt: MqttSettings, prefix: str, sites: tuple[str, ...]) -> None:
    """Each site's nodes: a retained birth and WINDOWS recent windows, at QoS 1."""
    async with make_client(mqtt, f"nodes-{prefix[-10:]}") as client:
        for site in sites:
            for node in build_scenario("demo", NODES):
                birth, windows = offline_windows(node, WINDOWS, site=site)
                topic = node_topic(prefix, site, node.name, TopicKind.BIRTH)
                await client.publish(topic, encode(birth), qos=1, retain=True)
                for w in recent(windows):
                    await client.publish(node_topic(prefix, site, node.name, TopicKind.TELEMETRY), encode(w), qos=1)


def scoped(
    mqtt: MqttSettings, name: str, sites: list[str], standby: list[str], state: Path, alerter: Alerter | None = None
) -> Optimizer:
    state.mkdir(parents=True, exist_ok=True)
    config = OptimizerConfig(
        mqtt=mqtt,
        optimizer=OptimizerSettings(
            client_id=name, sites=sites, standby_sites=standby, state_dir=state, solve_interval=86_400
        ),
    )
    return Optimizer(config, load_catalog(), lifecycle=Lifecycle.in_state_dir(state), alerter=alerter)


async def test_two_optimizers_plan_four_sites_once_each_and_a_standby_takes_over(
    mosquitto: MosquittoServer, prefix: str, tmp_path: Path
) -> None:
    mqtt = mosquitto.settings(prefix)
    tag = prefix[-6:]
    with webhook_server() as server:
        alerters = {
            who: Alerter.in_state_dir(settings(receiver(server, f"hook-{who}")), tmp_path / who) for who in "ab"
        }
        a = scoped(mqtt, f"opt-a-{tag}", ["s1", "s2"], ["s3", "s4"], tmp_path / "a", alerters["a"])
        b = scoped(mqtt, f"opt-b-{tag}", ["s3", "s4"], ["s1", "s2"], tmp_path / "b", alerters["b"])
        running = [a, b]
        tasks = {o.ownership.name: asyncio.create_task(o.run()) for o in running}
        try:
            await wait_until(lambda: a.ownership.seen_self and b.ownership.seen_self, 10, "both presences")
            await publish_sites(mqtt, prefix, SITES)
            expected = len(SITES) * NODES * WINDOWS  # each follows its standby sites too
            await wait_until(
                lambda: all(o.fleet.accepted["telemetry"] == expected for o in (a, b)), 20, "every window, twice"
            )
            await wait_until(lambda: len(a.ownership.presences) == len(b.ownership.presences) == 2, 5, "presences")
            for _ in range(2):  # the second round proposes the same moves: nothing is posted again
                planned = {o.ownership.name: sorted(p.site for p in await o.plan_once()) for o in (a, b)}
                for alerter in alerters.values():
                    await alerter.flush()
                assert planned == {a.ownership.name: ["s1", "s2"], b.ownership.name: ["s3", "s4"]}
            await asyncio.sleep(0.3)
            posted = [(d.path.split("/")[2], d.json()["site"]) for d in server.delivered]
            assert sorted(posted) == [("hook-a", "s1"), ("hook-a", "s2"), ("hook-b", "s3"), ("hook-b", "s4")]
            assert all(p.recommendations for p in [*a.plans.values(), *b.plans.values()])
            # one listing of both optimizers' recommendations
            listing = await asyncio.create_subprocess_exec(
                FLEETFIT, "recommendations", "--format", "json", "--state-dir", str(tmp_path / "a"),
                "--state-dir", str(tmp_path / "b"), stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, _ = await listing.communicate()
            assert sorted({r["site"] for r in json.loads(out)}) == list(SITES)

            # a stops (cleanly: it says so); b, standing by for its sites, plans all four
            a.should_exit.set()
            await tasks.pop(a.ownership.name)
            await wait_until(lambda: b.ownership.owner("s1") == b.ownership.name, 5, "b to take s1 and s2 over")
            assert sorted(p.site for p in await b.plan_once()) == list(SITES)
            assert b.ownership.view()["owned_sites"] == list(SITES)

            # a comes back: it plans its sites again and b lets them go
            again = scoped(mqtt, a.ownership.name, ["s1", "s2"], ["s3", "s4"], tmp_path / "a2")
            running.append(again)
            tasks[again.ownership.name] = asyncio.create_task(again.run())
            await wait_until(lambda: again.ownership.seen_self, 10, "a's new presence")
            await wait_until(lambda: b.ownership.owner("s1") == again.ownership.name, 5, "b to see a back")
            assert sorted(p.site for p in await b.plan_once()) == ["s3", "s4"]
            assert sorted(b.plans) == ["s3", "s4"]  # its console no longer shows the sites it let go
        finally:
            for o in running:
                o.should_exit.set()
            with contextlib.suppress(Exception):
                await asyncio.gather(*tasks.values())
            for alerter in alerters.values():
                await alerter.close()


def firing(server: object) -> list[list[str]]:
    """The workloads each delivered alert announced, in order."""
    return [sorted(m["workload_name"] for m in d.json()["firing"]) for d in server.delivered]  # type: ignore[attr-defined]


def state_of(optimizer: Optimizer, rec_id: str) -> RecState | None:
    assert optimizer.lifecycle is not None
    tracked = optimizer.lifecycle.get(rec_id)
    return tracked.state if tracked is not None else None


async def test_a_standby_takes_a_site_over_where_its_owner_stopped(
    mosquitto: MosquittoServer, prefix: str, tmp_path: Path
) -> None:
    """One chat channel, two optimizers: the owner of s1 posts its moves once they settle (two plans), having had
    one acknowledged through its API; the other is dismissed there just before the owner stops, and the standby plans
    the same moves. The channel hears of them once, and both decisions hold on the standby. A record forged by a
    client that is no optimizer of s1 is refused and counted. The owner comes back with an empty state directory: it
    posts nothing again, and a decision made on the standby holds."""
    mqtt = mosquitto.settings(prefix)
    tag = prefix[-6:]
    owner_name, standby_name = f"opt-a-{tag}", f"opt-b-{tag}"
    with webhook_server() as server:
        alert = settings(receiver(server, "chat"), settle_plans=2)  # one channel, named alike on both
        owner = scoped(mqtt, owner_name, ["s1"], [], tmp_path / "a", Alerter.in_state_dir(alert, tmp_path / "a"))
        standby = scoped(mqtt, standby_name, [], ["s1"], tmp_path / "b", Alerter.in_state_dir(alert, tmp_path / "b"))
        api = WebServer(owner, ApiSettings(port=0, token="t0ken"))  # type: ignore[arg-type]
        owner.attach(api)
        owner.handover_interval = 3600.0  # its record must follow each post, not a timer
        running = [owner, standby]
        tasks = {o.ownership.name: asyncio.create_task(o.run()) for o in running}
        try:
            await wait_until(lambda: owner.ownership.seen_self and standby.ownership.seen_self, 10, "presences")
            await wait_until(lambda: len(standby.ownership.presences) == 2, 5, "the owner's presence")
            await publish_sites(mqtt, prefix, ("s1",))
            await wait_until(
                lambda: all(o.fleet.accepted["telemetry"] == NODES * WINDOWS for o in running), 20, "s1's windows"
            )
            assert [p.site for p in await owner.plan_once()] == ["s1"]  # the first plan: nothing settled yet
            moves = {r.workload_name: r.id for r in owner.plans["s1"].recommendations}
            assert sorted(moves) == ["forgotten-notebook-alloc", "vision-finetune-ddp"]  # tests/test_api.py
            acked, posted = moves["vision-finetune-ddp"], moves["forgotten-notebook-alloc"]
            async with aiohttp.ClientSession() as http:
                url = f"http://127.0.0.1:{api.port}/api/v1/recommendations/{acked}/ack"
                async with http.post(url, headers={"Authorization": "Bearer t0ken"}) as r:
                    assert r.status == 200
            await owner.plan_once()  # settled: the move nobody acknowledged is posted
            assert owner.alerter is not None
            await owner.alerter.flush()
            assert firing(server) == [["forgotten-notebook-alloc"]]
            await wait_until(
                lambda: any(p.id == posted for r in standby.handovers.held.get("s1", {}).values() for p in r.posted),
                10,
                "the owner's record of its post",
            )

            # a client that is no optimizer of s1 forges a record: every move posted, none to post
            now = time.time()
            forged = Handover(
                site="s1",
                optimizer="n-rogue",
                written_at=now,
                posted=[
                    HandedPost(id=r.id, receiver="chat", fingerprint=move_fingerprint(r), first_sent=1.0, last_sent=1.0)
                    for r in owner.plans["s1"].recommendations
                ],
                states=[HandedState(id=acked, state="new", changed=now)],
            )
            async with make_client(mqtt, f"rogue-{tag}") as rogue:
                await rogue.publish(handover_topic(prefix, "s1"), encode(forged), qos=1)
            await wait_until(
                lambda: standby.handovers.rejected["not_site_optimizer"] == 1, 5, "the forged record refused"
            )
            metrics = render(optimizer_metrics(standby))
            assert 'fleetfit_handover_rejected_total{reason="not_site_optimizer"} 1' in metrics

            # a decision just before the owner stops (no plan, no post, no timer: its shutdown hands it over)
            async with aiohttp.ClientSession() as http:
                url = f"http://127.0.0.1:{api.port}/api/v1/recommendations/{posted}/dismiss"
                async with http.post(url, headers={"Authorization": "Bearer t0ken"}) as r:
                    assert r.status == 200
            owner.should_exit.set()
            await tasks.pop(owner_name)
            await wait_until(lambda: standby.ownership.owner("s1") == standby_name, 5, "the standby to take s1")
            for _ in range(2):
                assert [p.site for p in await standby.plan_once()] == ["s1"]
                assert standby.alerter is not None
                await standby.alerter.flush()
            assert {r.id for r in standby.plans["s1"].recommendations} == {acked, posted}
            await asyncio.sleep(0.3)
            assert firing(server) == [["forgotten-notebook-alloc"]]  # once in all
            assert (state_of(standby, acked), state_of(standby, posted)) == (RecState.ACKNOWLEDGED, RecState.DISMISSED)

            # reopened on the standby; the owner comes back with nothing of its own and plans s1 again
            assert standby.lifecycle is not None
            standby.lifecycle.set_state(posted, RecState.NEW)
            assert await standby.publish_handover() == 1
            back = scoped(mqtt, owner_name, ["s1"], [], tmp_path / "a2", Alerter.in_state_dir(alert, tmp_path / "a2"))
            running.append(back)
            tasks[owner_name] = asyncio.create_task(back.run())
            await wait_until(lambda: standby.ownership.owner("s1") == owner_name, 10, "the owner back")
            await publish_sites(mqtt, prefix, ("s1",))  # windows are not retained: the nodes' next ones
            await wait_until(lambda: back.fleet.accepted["telemetry"] == NODES * WINDOWS, 20, "s1's windows, again")
            for _ in range(2):
                assert [p.site for p in await back.plan_once()] == ["s1"]
                assert back.alerter is not None
                await back.alerter.flush()
            await asyncio.sleep(0.3)
            assert firing(server) == [["forgotten-notebook-alloc"]]
            assert (state_of(back, acked), state_of(back, posted)) == (RecState.ACKNOWLEDGED, RecState.NEW)
        finally:
            for o in running:
                o.should_exit.set()
            with contextlib.suppress(Exception):
                await asyncio.gather(*tasks.values())


def optimizer_toml(
    path: Path, port: int, prefix: str, name: str, sites: list[str], state: Path, extra: str = "", interval: int = 86400
) -> Path:
    path.write_text(
        f'[optimizer]\nclient_id = "{name}"\nsites = {sites!r}\nstate_dir = "{state}"\nsolve_interval = {interval}\n'
        f'[mqtt]\nhost = "127.0.0.1"\nport = {port}\nprefix = "{prefix}"\nkeepalive = 5\nsession_expiry = 60\n'
        f'[api]\nlisten = ""\n{extra}'
    )
    return path


@pytest.mark.slow
async def test_a_killed_optimizers_last_will_hands_its_site_to_the_standby(
    mosquitto: MosquittoServer, prefix: str, tmp_path: Path
) -> None:
    """The owner is killed outright (SIGKILL: no goodbye) after posting its moves; the broker publishes its last
    will and the standby takes the site over, from the record the owner left after its post: the chat channel hears
    of each move once."""
    tag = prefix[-6:]
    owner = f"opt-owner-{tag}"
    (tmp_path / "owner").mkdir()
    with webhook_server() as server:
        chat = receiver(server, "chat")  # the owner reads the same URL from the environment it inherits
        alerts = (
            "[alerts]\ngroup_wait = 0\nsettle_seconds = 0\nsettle_plans = 1\n"
            f'[[alerts.receivers]]\nname = "chat"\nkind = "generic"\nurl_env = "{chat.url_env}"\n'
        )
        config = optimizer_toml(
            tmp_path / "owner.toml", mosquitto.port, prefix, owner, ["s1"], tmp_path / "owner", alerts, interval=2
        )
        process = await asyncio.create_subprocess_exec(FLEETFIT, "optimizer", "--config", str(config))
        alerter = Alerter.in_state_dir(settings(chat), tmp_path / "standby")
        standby = scoped(mosquitto.settings(prefix), f"opt-standby-{tag}", [], ["s1"], tmp_path / "standby", alerter)
        task = asyncio.create_task(standby.run())
        try:
            await wait_until(lambda: standby.ownership.owner("s1") == owner, 30, "the owner's presence")
            await publish_sites(mosquitto.settings(prefix), prefix, ("s1",))
            await wait_until(lambda: standby.fleet.accepted["telemetry"] == NODES * WINDOWS, 20, "s1's windows")
            assert await standby.plan_once() == []  # s1 has its owner

            def handed() -> set[str]:
                return {p.id for r in standby.handovers.held.get("s1", {}).values() for p in r.posted}

            await wait_until(lambda: len(handed()) == 2, 30, "the owner's record of both moves posted")
            os.kill(process.pid, signal.SIGKILL)
            await process.wait()
            await wait_until(lambda: standby.ownership.owner("s1") == standby.ownership.name, 10, "the owner's will")
            assert [p.site for p in await standby.plan_once()] == ["s1"]
            await alerter.flush()
            assert {r.id for r in standby.plans["s1"].recommendations} == handed()
            await asyncio.sleep(0.3)
            announced = sorted(name for names in firing(server) for name in names)
            assert announced == ["forgotten-notebook-alloc", "vision-finetune-ddp"]  # each once, by the owner
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
            standby.should_exit.set()
            await task


async def test_an_optimizer_plans_nothing_before_its_presence_comes_back(
    mosquitto: MosquittoServer, prefix: str, tmp_path: Path
) -> None:
    """A scoped optimizer that cannot announce itself (not connected, or the broker refuses its presence) plans
    nothing: it cannot know that no one else plans its sites."""
    lonely = scoped(mosquitto.settings(prefix), f"opt-{prefix[-6:]}", ["s1"], [], tmp_path / "x")
    await publish_sites(mosquitto.settings(prefix), prefix, ("s1",))
    async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:  # the fleet as it would have read it
        await client.subscribe(f"{prefix}/s1/+/birth", qos=1)
        async with asyncio.timeout(5):
            async for m in client.messages:
                lonely._take(str(m.topic), m.payload if isinstance(m.payload, bytes) else b"")
                if len(lonely.fleet.nodes) == NODES:
                    break
    assert await lonely.plan_once() == []
    assert lonely.ownership.view()["owned_sites"] == []


@pytest.fixture
def scoped_accounts(tmp_path: Path) -> Shipped:
    """The shipped broker (not started) with nodes n1 in s1 and n3 in s3, and two site-scoped optimizers."""
    shipped = shipped_broker(tmp_path, {"s1": ["n1"], "s3": ["n3"]})
    mint = [str(EXAMPLES / "mint"), "optimizer", str(shipped.credentials)]
    subprocess.run([*mint, "fleetfit-optimizer-east", "s1", "s2"], check=True, capture_output=True, timeout=60)
    subprocess.run([*mint, "fleetfit-optimizer-west", "s3"], check=True, capture_output=True, timeout=60)
    return shipped


async def test_a_site_scoped_account_reads_and_plans_its_sites_only(scoped_accounts: Shipped, tmp_path: Path) -> None:
    """`mint optimizer DIR NAME SITE...` on the shipped broker: the account reads its sites' nodes, publishes their
    plans, handover records and its own presence, and nothing of another site or another optimizer's presence; a
    node may not write its site's handover record."""
    shipped = scoped_accounts
    shipped.server.start()
    prefix = "fleetfit/v1"
    east = shipped.settings("fleetfit-optimizer-east").model_copy(update={"prefix": prefix})
    try:
        async with (
            make_client(east, "fleetfit-optimizer-east") as spy,
            make_client(shipped.settings("fleetfit-reader"), "fleetfit-reader") as reader,
        ):
            await spy.subscribe(f"{prefix}/+/+/birth", qos=1)  # wider than its sites: the broker filters per topic
            await spy.subscribe(f"{prefix}/+/handover", qos=1)
            await reader.subscribe(f"{prefix}/+/recommendations", qos=1)
            await reader.subscribe(f"{prefix}/_optimizers/+", qos=1)  # not the reader's: delivers nothing
            for node, site in (("n1", "s1"), ("n3", "s3")):
                async with make_client(shipped.settings(node), node) as client:
                    birth, _ = offline_windows(build_scenario("demo", NODES)[0], 1, site=site)
                    birth = birth.model_copy(update={"node": node})
                    await client.publish(
                        node_topic(prefix, site, node, TopicKind.BIRTH), encode(birth), qos=1, retain=True
                    )
                    # a forged record: every move of its site already posted, so none would reach chat
                    await client.publish(f"{prefix}/{site}/handover", b'{"forged": true}', qos=1, retain=True)
            await spy.publish(f"{prefix}/s1/recommendations", b"{}", qos=1)
            await spy.publish(f"{prefix}/s3/recommendations", b"{}", qos=1)  # west's site
            await spy.publish(f"{prefix}/_optimizers/fleetfit-optimizer-west", b"{}", qos=1)  # a forged presence
            await spy.publish(f"{prefix}/s1/handover", b"east's", qos=1)
            await spy.publish(f"{prefix}/s3/handover", b"east's", qos=1)  # west's site
            got: list[tuple[str, bytes]] = []
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2):
                    async for m in spy.messages:
                        got.append((str(m.topic), m.payload if isinstance(m.payload, bytes) else b""))
            read: list[str] = []
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1):
                    async for m in reader.messages:
                        read.append(str(m.topic))
        assert [t for t, _ in sorted(got)] == [f"{prefix}/s1/handover", f"{prefix}/s1/n1/birth"]
        assert (f"{prefix}/s1/handover", b"east's") in got  # its own record, not n1's
        assert read == [f"{prefix}/s1/recommendations"]

        # the optimizer itself, as that account: its presence goes through and comes back
        optimizer = scoped(east, "fleetfit-optimizer-east", ["s1", "s2"], [], tmp_path / "east")
        task = asyncio.create_task(optimizer.run())
        try:
            await wait_until(lambda: optimizer.ownership.seen_self, 10, "its own presence")
            await wait_until(lambda: ("s1", "n1") in optimizer.fleet.nodes, 10, "n1's retained birth")
        finally:
            optimizer.should_exit.set()
            await task
    finally:
        shipped.server.stop()


def _wire(presence: Presence) -> bytes:
    return presence.model_dump_json(by_alias=True).encode()


async def test_a_presence_claiming_sites_beyond_its_peers_entry_does_not_take_them(
    mosquitto: MosquittoServer, prefix: str, tmp_path: Path
) -> None:
    """The fleet's optimizer lists one scoped peer, east, for s1. East's retained presence claims s1 and s2 (its
    account may write its own presence, whatever it says), and an optimizer it does not list claims s2: it yields
    s1 to east and still plans s2, and counts both refused claims. Deliberate bug: presences kept as they claim
    (``peers`` ignored): s2 is yielded to an optimizer that cannot read its nodes, and nobody plans it."""
    mqtt = mosquitto.settings(prefix)
    tag = prefix[-6:]
    east, rogue = f"opt-east-{tag}", f"opt-rogue-{tag}"
    settings = OptimizerSettings(client_id=f"opt-fleet-{tag}", peers={east: ["s1"]}, solve_interval=86_400)
    fleet = Optimizer(OptimizerConfig(mqtt=mqtt, optimizer=settings), load_catalog())
    async with make_client(mqtt, f"claims-{tag}") as client:
        for name, sites in ((east, ["s1", "s2"]), (rogue, ["s2"])):
            claim = Presence(optimizer=name, status=NodeStatus.ONLINE, started=time.time(), sites=sites)
            await client.publish(presence_topic(prefix, name), _wire(claim), qos=1, retain=True)
    task = asyncio.create_task(fleet.run())
    try:
        await wait_until(lambda: fleet.connected.is_set() and len(fleet.ownership.presences) == 2, 10, "presences")
        await publish_sites(mqtt, prefix, ("s1", "s2"))
        expected = 2 * NODES * WINDOWS
        await wait_until(lambda: fleet.fleet.accepted["telemetry"] == expected, 20, "every window")
        assert [p.site for p in await fleet.plan_once()] == ["s2"]
        assert fleet.ownership.owner("s1") == east and fleet.ownership.owner("s2") is None
        assert fleet.ownership.refused == {"not_peer_site": 1, "unknown_optimizer": 1}
        text = render(optimizer_metrics(fleet))
        assert 'fleetfit_presence_claims_refused_total{reason="not_peer_site"} 1' in text
    finally:
        fleet.should_exit.set()
        await task


def test_a_claim_beyond_its_peers_entry_neither_outranks_a_scoped_owner_nor_vouches_for_a_handover() -> None:
    """A scoped optimizer, b, plans s2; a (first by name) claims s2 too, where b's peers list a for s1 only: b
    keeps s2, and a handover record a writes for s2 is refused. Deliberate bug: ``peers`` ignored (a would own s2
    by name, and its record would be taken in)."""
    from agent.protocol import parse_presence
    from optimizer.serve.handover import Handovers
    from optimizer.serve.ownership import Ownership

    b = Ownership("p", "opt-b", ["s2"], [], peers={"opt-a": ["s1"]})
    claim = Presence(optimizer="opt-a", status=NodeStatus.ONLINE, started=1.0, sites=["s1", "s2"])
    b.observe(presence_topic("p", "opt-a"), _wire(claim))
    mine = Presence(optimizer="opt-b", status=NodeStatus.ONLINE, started=1.0, sites=["s2"])
    b.observe(presence_topic("p", "opt-b"), _wire(mine))
    assert parse_presence("p", presence_topic("p", "opt-a"), _wire(claim)).sites == ["s1", "s2"]
    assert b.owner("s1") == "opt-a" and b.owner("s2") == "opt-b" and b.owns("s2")
    handovers = Handovers("p", b)
    record = Handover(site="s2", optimizer="opt-a", written_at=time.time())
    handovers.observe(handover_topic("p", "s2"), encode(record))
    assert handovers.rejected == {"not_site_optimizer": 1} and not handovers.held
