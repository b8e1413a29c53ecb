"""The example Mosquitto setup (systemd/mosquitto/) on a real broker: TLS with minted certificates, a
password per node, the ACL confining each node to its own topics, anonymous clients refused; and the
optimizer refusing a payload whose node differs from its topic."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiomqtt
import pytest
from conftest import MosquittoServer, free_port, recent

import agent.mqtt
from agent.config import MqttSettings
from agent.mqtt import Link, make_client, stop_tasks
from agent.protocol import Birth, Telemetry, TopicKind, encode, node_topic
from agent.simulate import offline_windows
from agent.spool import MemoryQueue
from collectors.sim.scenarios import build_scenario
from optimizer.decide.catalog import load_catalog
from optimizer.serve.config import OptimizerConfig, OptimizerSettings
from optimizer.serve.service import Optimizer

EXAMPLES = Path(__file__).resolve().parent.parent / "systemd" / "mosquitto"
PREFIX = "fleetfit/v1"


@dataclass
class SecureBroker:
    server: MosquittoServer
    credentials: Path

    def settings(self, user: str | None, tls: bool = True, password: str | None = None) -> MqttSettings:
        client = self.credentials / "clients" / (user or "none")
        return MqttSettings(
            host="127.0.0.1",
            port=self.server.port,
            tls=tls,
            ca_file=self.credentials / "ca.crt" if tls else None,
            username=user,
            password=password if password is not None else ((client / "mqtt-password").read_text() if user else None),
            reconnect_max_delay=1.0,
        )


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    directory = tmp_path_factory.mktemp("secure-broker")
    creds = directory / "creds"
    mint = str(EXAMPLES / "mint")
    for args in (
        ["ca"],
        ["broker", "127.0.0.1", "localhost"],
        ["node", "lab", "node-a"],
        ["node", "lab", "node-b"],
        ["optimizer"],
        ["reader"],
    ):
        subprocess.run([mint, args[0], str(creds), *args[1:]], check=True, capture_output=True, timeout=60)
    port = free_port()
    config = (EXAMPLES / "fleetfit.conf").read_text()
    config = config.replace("/etc/mosquitto/fleetfit", str(creds)).replace("/var/lib/mosquitto/", f"{directory}/")
    config = config.replace("listener 8883", f"listener {port} 127.0.0.1")
    path = directory / "mosquitto.conf"
    # the test runs as root with private files; the listeners it opens are logged at "information"
    path.write_text(config + "user root\nlog_type error\nlog_type information\n")
    server = MosquittoServer("127.0.0.1", port, path, directory / "mosquitto.log")
    server.start()
    yield SecureBroker(server, creds)
    server.stop()


def _node_messages(node: str) -> tuple[Birth, list[Telemetry]]:
    template = build_scenario("well-placed", 1, seed=3)[0]
    birth, windows = offline_windows(template, 3, site="lab", seed=3)
    return birth.model_copy(update={"node": node}), [w.model_copy(update={"node": node}) for w in recent(windows)]


async def _publish(settings: MqttSettings, client_id: str, messages: list[tuple[str, bytes]]) -> None:
    async with make_client(settings, client_id) as client:
        for topic, payload in messages:
            await client.publish(topic, payload, qos=1)


async def test_nodes_are_confined_to_their_own_topics(secure_broker: SecureBroker) -> None:
    config = OptimizerConfig(
        mqtt=secure_broker.settings("fleetfit-optimizer"),
        optimizer=OptimizerSettings(client_id="fleetfit-optimizer", solve_interval=3600),
    )
    optimizer = Optimizer(config, load_catalog())
    task = asyncio.create_task(optimizer.run())
    await asyncio.wait_for(optimizer.connected.wait(), 10)
    try:
        birth_a, windows_a = _node_messages("node-a")
        birth_b, windows_b = _node_messages("node-b")
        own = [(node_topic(PREFIX, "lab", "node-a", TopicKind.BIRTH), encode(birth_a))]
        own += [(node_topic(PREFIX, "lab", "node-a", TopicKind.TELEMETRY), encode(w)) for w in windows_a]
        # node-a's credentials, node-b's topics: the ACL drops these before any subscriber sees them
        forged = [(node_topic(PREFIX, "lab", "node-b", TopicKind.BIRTH), encode(birth_b))]
        forged += [(node_topic(PREFIX, "lab", "node-b", TopicKind.TELEMETRY), encode(w)) for w in windows_b]
        # node-a's own topic carrying a payload that claims to be node-b: the optimizer refuses it
        spoofed = [(node_topic(PREFIX, "lab", "node-a", TopicKind.TELEMETRY), encode(windows_b[0]))]
        await _publish(secure_broker.settings("node-a"), "node-a", forged + own + spoofed)
        for _ in range(100):
            if optimizer.fleet.accepted["telemetry"] >= 3 and optimizer.fleet.rejected["node_mismatch"] >= 1:
                break
            await asyncio.sleep(0.1)
        assert set(optimizer.fleet.nodes) == {("lab", "node-a")}
        assert optimizer.fleet.accepted["telemetry"] == 3 and optimizer.fleet.accepted["birth"] == 1
        assert optimizer.fleet.rejected == {"node_mismatch": 1}
    finally:
        optimizer.should_exit.set()
        await task


async def test_anonymous_wrong_password_and_plain_tcp_are_refused(
    secure_broker: SecureBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deliberate bug caught: a listener that takes anonymous clients, any password, or plain MQTT (each then
    gets its CONNACK at once, and the publish goes through)."""
    refused = [
        secure_broker.settings(None),  # anonymous over TLS
        secure_broker.settings("node-a", password="not-the-password"),
    ]
    for settings in refused:
        with pytest.raises(aiomqtt.MqttError):
            async with make_client(settings, "intruder") as client:
                await client.publish(f"{PREFIX}/lab/node-a/birth", b"{}", qos=1)
    # Plain MQTT to the TLS listener is never answered: the client gives up when its wait for CONNACK ends, 10 s
    # by default. A broker that took plain MQTT would answer in milliseconds, so 3 s tells the two apart.
    monkeypatch.setattr(agent.mqtt, "PUBLISH_TIMEOUT_S", 3.0)
    with pytest.raises(aiomqtt.MqttError):
        async with make_client(secure_broker.settings("node-a", tls=False), "intruder") as client:
            await client.publish(f"{PREFIX}/lab/node-a/birth", b"{}", qos=1)


async def test_tls_refuses_a_broker_certificate_from_another_ca(secure_broker: SecureBroker, tmp_path: Path) -> None:
    minted = await asyncio.create_subprocess_exec(
        str(EXAMPLES / "mint"), "ca", str(tmp_path), stdout=subprocess.DEVNULL
    )
    assert await minted.wait() == 0
    settings = secure_broker.settings("node-a").model_copy(update={"ca_file": tmp_path / "ca.crt"})
    with pytest.raises(aiomqtt.MqttError):
        async with make_client(settings, "node-a"):
            pass


async def _collect(client: aiomqtt.Client, into: list[tuple[str, bytes]], want: int, limit: float) -> None:
    """Gather messages until ``want`` arrived or ``limit`` seconds passed."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(limit):
            async for message in client.messages:
                into.append((str(message.topic), bytes(message.payload)))  # type: ignore[arg-type]
                if len(into) >= want:
                    return


async def test_nodes_read_nothing_but_their_own_resend_requests(secure_broker: SecureBroker) -> None:
    """The optimizer publishes a plan and asks both nodes for windows; node-a publishes its state. A reader (the
    account dashboards use) receives the plan, and node-a its own request: both must arrive, so the silence of
    node-b, subscribed to everything, means the ACL refused it, not that nothing was sent."""
    plan_topic = f"{PREFIX}/lab/recommendations"
    request = b'{"schema":2,"node":"node-b","windows":[[1,0,3]]}'
    snooped: list[tuple[str, bytes]] = []
    plans: list[tuple[str, bytes]] = []
    mine: list[tuple[str, bytes]] = []
    async with (
        make_client(secure_broker.settings("node-b"), "node-b") as snoop,
        make_client(secure_broker.settings("fleetfit-reader"), "fleetfit-reader") as reader,
        make_client(secure_broker.settings("node-a"), "node-a") as node_a,
    ):
        await snoop.subscribe(f"{PREFIX}/#", qos=1)
        await snoop.subscribe(f"{PREFIX}/lab/node-a/resend", qos=1)
        await reader.subscribe(f"{PREFIX}/#", qos=1)
        await node_a.subscribe(f"{PREFIX}/lab/node-a/resend", qos=1)
        await _publish(
            secure_broker.settings("fleetfit-optimizer"),
            "fleetfit-optimizer",
            [(plan_topic, b"{}"), (f"{PREFIX}/lab/node-a/resend", request.replace(b"node-b", b"node-a"))],
        )
        await node_a.publish(f"{PREFIX}/lab/node-a/state", b"{}", qos=1)  # (a second node-a session would end it)
        await asyncio.gather(
            _collect(snoop, snooped, 1, 1.5), _collect(reader, plans, 1, 10), _collect(node_a, mine, 1, 10)
        )
    assert [t for t, _ in plans] == [plan_topic]  # what the ACL lets a reader see, and nothing else
    assert mine == [(f"{PREFIX}/lab/node-a/resend", request.replace(b"node-b", b"node-a"))]
    assert snooped == []


async def test_a_node_cannot_connect_as_the_optimizer_or_another_node(secure_broker: SecureBroker) -> None:
    """Client ids are bound to accounts (use_username_as_clientid): whatever id node-b asks for, the broker gives
    it its own, so the optimizer's and node-a's sessions stay up."""
    received: list[tuple[str, bytes]] = []
    async with (
        make_client(secure_broker.settings("fleetfit-optimizer"), "fleetfit-optimizer") as optimizer,
        make_client(secure_broker.settings("node-a"), "node-a") as node_a,
    ):
        await optimizer.subscribe(f"{PREFIX}/+/+/telemetry", qos=1)
        for stolen in ("fleetfit-optimizer", "node-a", "fleetfit-reader"):
            async with make_client(secure_broker.settings("node-b"), stolen):
                pass
        await node_a.publish(f"{PREFIX}/lab/node-a/telemetry", b"still here", qos=1)  # raises if it was cut
        await _collect(optimizer, received, 1, 10)
    assert received == [(f"{PREFIX}/lab/node-a/telemetry", b"still here")]


def test_the_shipped_configuration_opens_one_listener(secure_broker: SecureBroker) -> None:
    """A listener's setting (use_username_as_clientid) placed before the `listener` line would open a second,
    plain-text listener on 1883 and apply only there."""
    opened = re.findall(r"Opening ipv[46] listen socket on port (\d+)", secure_broker.server.log.read_text())
    assert opened and set(opened) == {str(secure_broker.server.port)}


async def _run_link(link: Link, until: Callable[[], bool], limit: float = 10) -> None:
    """Run ``link`` until ``until()`` holds (or ``limit`` seconds pass), then stop it."""
    task = asyncio.create_task(link.run())
    try:
        for _ in range(int(limit / 0.05)):
            if until():
                return
            await asyncio.sleep(0.05)
        raise TimeoutError(f"not reached within {limit} s")
    finally:
        await stop_tasks([task])


def _link(settings: MqttSettings, site: str, node: str = "node-a") -> Link:
    birth, windows = _node_messages(node)
    queue = MemoryQueue(10)
    queue.put(encode(windows[0].model_copy(update={"site": site})))
    return Link(settings, site, node, 1, lambda: birth.model_copy(update={"site": site}), queue, time.time)


async def test_a_publish_the_acl_refuses_keeps_the_window_and_says_why(
    secure_broker: SecureBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """node-a's credentials were minted for site lab; an agent configured for site elsewhere has every publish
    answered with PUBACK reason 135. The window stays spooled, the error names the topic and the likely fix, the
    refusal is counted, and it is tried again. Deliberate bug it catches: the PUBACK's reason code ignored (aiomqtt's
    own publish), which popped the window as published and logged nothing."""
    caplog.set_level(logging.INFO, "agent.mqtt")
    link = _link(secure_broker.settings("node-a"), "elsewhere")
    await _run_link(link, lambda: link.publishes_refused["not_authorized"] >= 2)
    assert len(link.queue) == 1 and link.published == 0
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors[0].startswith(
        f"the broker refused node node-a's publish to {PREFIX}/elsewhere/node-a/birth: not authorized — is [agent] "
        "site the site its credentials were minted for?; 1 window(s) kept in the spool, retrying in"
    )
    families = {f.name: f for f in link.refusal_metrics()}
    assert families["fleetfit_agent_publishes_refused_total"].samples[0][0] == {"reason": "not_authorized"}
    # the same agent with its own site: the window goes out (the refusal above was the site, nothing else)
    right = _link(secure_broker.settings("node-a"), "lab")
    await _run_link(right, lambda: right.published == 1)
    assert len(right.queue) == 0 and not right.publishes_refused


async def test_refused_credentials_and_certificates_are_errors_retried_with_backoff(
    secure_broker: SecureBroker, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """A wrong password (Mosquitto's CONNACK says "Not authorized") and a broker certificate from another CA are logged as
    errors with the reason, counted, and retried. Deliberate bug it catches: both logged at INFO as "broker
    unreachable" on every retry, forever."""
    caplog.set_level(logging.INFO, "agent.mqtt")
    wrong = _link(secure_broker.settings("node-a", password="not-the-password"), "lab")
    await _run_link(wrong, lambda: sum(wrong.connects_refused.values()) >= 2)
    # polled every 50 ms while the link retries with jittered backoff (which may draw 0 s): a third refusal may
    # come before the poll sees the second
    assert set(wrong.connects_refused) == {"not_authorized"} and wrong.connects_refused["not_authorized"] >= 2
    assert len(wrong.queue) == 1
    minted = await asyncio.create_subprocess_exec(
        str(EXAMPLES / "mint"), "ca", str(tmp_path), stdout=subprocess.DEVNULL
    )
    assert await minted.wait() == 0
    other_ca = secure_broker.settings("node-a").model_copy(update={"ca_file": tmp_path / "ca.crt"})
    untrusted = _link(other_ca, "lab")
    await _run_link(untrusted, lambda: sum(untrusted.connects_refused.values()) >= 1)
    assert list(untrusted.connects_refused) == ["tls_certificate"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "the broker refused node node-a's connection" in errors[0] and "password" in errors[0]
    assert "TLS: self-signed certificate in certificate chain" in errors[-1] and "ca_file" in errors[-1]
    assert not [r for r in caplog.records if r.levelno < logging.WARNING and "unreachable" in r.getMessage()]
