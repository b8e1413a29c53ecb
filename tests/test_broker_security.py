"""The example Mosquitto setup (systemd/mosquitto/) on a real broker: TLS with minted certificates, a
password per node, the ACL confining each node to its own topics, anonymous clients refused; and the
optimizer refusing a payload whose node differs from its topic."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiomqtt
import pytest
from conftest import MosquittoServer, free_port, recent

from agent.config import MqttSettings
from agent.mqtt import make_client
from agent.protocol import Birth, Telemetry, TopicKind, encode, node_topic
from agent.simulate import offline_windows
from collectors.scenarios import build_scenario
from optimizer.catalog import load_catalog
from optimizer.config import OptimizerConfig, OptimizerSettings
from optimizer.service import Optimizer

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
    for args in (["ca"], ["broker", "127.0.0.1", "localhost"], ["node", "lab", "node-a"], ["node", "lab", "node-b"]):
        subprocess.run([mint, args[0], str(creds), *args[1:]], check=True, capture_output=True, timeout=60)
    subprocess.run([mint, "optimizer", str(creds)], check=True, capture_output=True, timeout=60)
    port = free_port()
    config = (EXAMPLES / "fleetfit.conf").read_text()
    config = config.replace("/etc/mosquitto/fleetfit", str(creds)).replace("/var/lib/mosquitto/", f"{directory}/")
    config = config.replace("listener 8883", f"listener {port} 127.0.0.1")
    path = directory / "mosquitto.conf"
    path.write_text(config + "user root\nlog_type error\n")  # the test runs as root with private files
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


async def test_anonymous_wrong_password_and_plain_tcp_are_refused(secure_broker: SecureBroker) -> None:
    refused = [
        secure_broker.settings(None),  # anonymous over TLS
        secure_broker.settings("node-a", password="not-the-password"),
        secure_broker.settings("node-a", tls=False),  # plain MQTT to the TLS listener
    ]
    for settings in refused:
        with pytest.raises(aiomqtt.MqttError):
            async with make_client(settings, "intruder") as client:
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


async def test_nodes_read_nothing_not_even_plans(secure_broker: SecureBroker) -> None:
    # the optimizer publishes a plan and node-a its state; node-b, subscribed to everything, gets neither
    plan_topic = f"{PREFIX}/lab/recommendations"
    received: list[str] = []
    async with make_client(secure_broker.settings("node-b"), "node-b-reader") as snoop:
        await snoop.subscribe(f"{PREFIX}/#", qos=1)
        await _publish(secure_broker.settings("fleetfit-optimizer"), "opt-pub", [(plan_topic, b"{}")])
        await _publish(secure_broker.settings("node-a"), "node-a-pub", [(f"{PREFIX}/lab/node-a/state", b"{}")])

        async def collect() -> None:
            async for message in snoop.messages:
                received.append(str(message.topic))

        with pytest.raises(TimeoutError):
            await asyncio.wait_for(collect(), 1.5)
    assert received == []
