"""Shared fixtures: a real Mosquitto broker on a free port, and helpers to drive simulated nodes offline."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiomqtt
import pytest

from agent.config import MqttSettings
from agent.protocol import Telemetry, TopicKind, encode, node_topic
from agent.simulate import offline_windows, shift_to_now
from collectors.sim.scenarios import build_scenario
from collectors.sim.spec import Pattern
from optimizer.decide.snapshot import Snapshot
from optimizer.ingest.fleet import Fleet

FLEETFIT = str(Path(sys.executable).parent / "fleetfit")  # the console command, as users run it
FLEET_PREFIX = "fleetfit/v1"
EXAMPLES = Path(__file__).resolve().parent.parent / "systemd" / "mosquitto"  # the shipped broker setup


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--full-faults",
        action="store_true",
        help="run the fault-injection tests (-m fault) at full length: 120 s broker and 60 s store outages, "
        "10,000 fuzzed messages",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--full-faults"):
        os.environ["FLEETFIT_FULL_FAULTS"] = "1"
    # `fleetfit demo` keeps its state in $XDG_STATE_HOME/fleetfit/demo: the demos the tests run keep theirs apart
    # from the user's own, in a directory of this run's
    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="fleetfit-tests-state-")


def fault_size(short: int, full: int) -> int:
    """The short figure in the everyday suite, the full one under ``--full-faults``."""
    return full if os.environ.get("FLEETFIT_FULL_FAULTS") == "1" else short


def free_port() -> int:
    """A free port outside the kernel's ephemeral range.

    Servers here are stopped and restarted on the same port while clients keep retrying. A retrying client's
    source port comes from the ephemeral range, and TCP will even connect a socket to itself when source and
    destination coincide; either way the port is taken and the restart fails with "Address already in use".
    Ports below the range are never handed out as source ports."""
    low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    pool = range(10_000, low) if low > 11_000 else range(high + 1, 65_536)
    rng = random.Random()
    for _ in range(500):
        port = rng.choice(pool)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port outside the ephemeral range")


@dataclass
class MosquittoServer:
    host: str
    port: int
    config: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def settings(self, prefix: str, protocol: str = "5") -> MqttSettings:
        return MqttSettings(
            host=self.host,
            port=self.port,
            prefix=prefix,
            protocol=protocol,  # type: ignore[arg-type]
            reconnect_max_delay=1.0,
        )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def start(self) -> None:
        """(Re)start on the same port."""
        self.stop()
        self.process = _spawn(self.config, self.log)
        _wait_listening(self.host, self.port, self.process, self.log)


def _spawn(config: Path, log: Path) -> subprocess.Popen[bytes]:
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    return subprocess.Popen([binary, "-c", str(config)], stdout=log.open("ab"), stderr=subprocess.STDOUT)


def _wait_listening(host: str, port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mosquitto exited: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("mosquitto did not start listening")


def write_mosquitto_config(directory: Path, port: int, persistent: bool = False) -> Path:
    """An anonymous loopback broker; ``persistent`` keeps sessions and retained messages across its restarts."""
    config = directory / "mosquitto.conf"
    persistence = ["persistence true", f"persistence_location {directory}/"] if persistent else ["persistence false"]
    config.write_text(
        "\n".join(
            [
                f"listener {port} 127.0.0.1",
                "allow_anonymous true",
                *persistence,
                "user root",
                # The optimizer's subscription must not lose QoS 1 messages when it falls behind.
                "max_queued_messages 100000",
                "log_type error",
                "log_type warning",
            ]
        )
        + "\n"
    )
    return config


def private_broker(directory: Path, persistent: bool = False) -> MosquittoServer:
    """A broker of the test's own (not yet started), for tests that stop and restart it."""
    port = free_port()
    return MosquittoServer(
        "127.0.0.1", port, write_mosquitto_config(directory, port, persistent), directory / "mosquitto.log"
    )


async def start_agent(
    config: Path, stderr: int = asyncio.subprocess.DEVNULL, env: dict[str, str] | None = None
) -> asyncio.subprocess.Process:
    """``fleetfit agent --config CONFIG`` as its own process, as systemd would run it."""
    return await asyncio.create_subprocess_exec(FLEETFIT, "agent", "--config", str(config), stderr=stderr, env=env)


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MosquittoServer]:
    if not (shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists()):
        pytest.fail("mosquitto is not installed: `make test` installs it (apt-get install mosquitto)")
    directory = tmp_path_factory.mktemp("mosquitto")
    port = free_port()
    config = write_mosquitto_config(directory, port)
    log = directory / "mosquitto.log"
    server = MosquittoServer("127.0.0.1", port, config, log)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def prefix() -> str:
    """A topic prefix unique to the test, so tests sharing a broker never see each other's messages."""
    return f"fleetfit-test/{uuid.uuid4().hex[:10]}"


async def durable_subscriber(port: int, topic_filter: str, received: list[bytes]) -> None:
    """Collect payloads through a persistent session that reconnects by itself, so the broker queues for it
    while it is away. Run it as a task and cancel it when done."""
    while True:
        try:
            async with aiomqtt.Client(
                "127.0.0.1",
                port,
                identifier=f"durable-{topic_filter}",
                clean_session=False,
                protocol=aiomqtt.ProtocolVersion.V311,
            ) as client:
                await client.subscribe(topic_filter, qos=1)
                async for m in client.messages:
                    received.append(bytes(m.payload))  # type: ignore[arg-type]
        except aiomqtt.MqttError:
            await asyncio.sleep(0.2)


async def wait_until(predicate: Callable[[], bool], limit: float, what: str) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``limit`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


@dataclass
class VictoriaMetrics:
    """A real VictoriaMetrics (Debian's victoria-metrics), the InfluxDB v2 write API's stand-in in tests."""

    port: int
    data: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
        self.process = subprocess.Popen(
            [binary, f"-httpListenAddr=127.0.0.1:{self.port}", f"-storageDataPath={self.data}",
             "-search.latencyOffset=0s", "-retentionPeriod=100y", "-loggerLevel=ERROR"],
            stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        _wait_listening("127.0.0.1", self.port, self.process, self.log)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)

    def export(self, match: str, settle: float = 15.0) -> list[dict[str, object]]:
        """Every series matching ``match`` with its values. Freshly written samples take a moment to become
        searchable, so read until two reads a second apart agree (at most ``settle`` seconds)."""
        import json
        import urllib.parse
        import urllib.request

        body = urllib.parse.urlencode({"match[]": match}).encode()

        def read() -> list[dict[str, object]]:
            urllib.request.urlopen(f"{self.url}/internal/force_flush", timeout=10).read()
            with urllib.request.urlopen(f"{self.url}/api/v1/export", data=body, timeout=30) as response:
                rows = [json.loads(line) for line in response.read().splitlines() if line.strip()]
            return sorted(rows, key=lambda r: json.dumps(r["metric"], sort_keys=True))

        previous = read()
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline:
            time.sleep(1.0)
            current = read()
            if current == previous and current:
                return current
            previous = current
        return previous


@pytest.fixture
def victoria(tmp_path: Path) -> Iterator[VictoriaMetrics]:
    if not (shutil.which("victoria-metrics") or Path("/usr/bin/victoria-metrics").exists()):
        pytest.fail("victoria-metrics is not installed: `make test` installs it (apt-get install victoria-metrics)")
    server = VictoriaMetrics(free_port(), tmp_path / "vm-data", tmp_path / "vm.log")
    server.start()
    yield server
    server.stop()


def write_agent_config(directory: Path, port: int, prefix: str, node: str, interval: float = 1.0) -> Path:
    """An agent configuration for ``node`` on the local broker, its state (session, spool) under ``directory``."""
    path = directory / "agent.toml"
    path.write_text(
        f'[agent]\nnode = "{node}"\nsite = "lab"\npublish_interval = {interval}\nstate_dir = "{directory / "state"}"\n'
        f'[mqtt]\nhost = "127.0.0.1"\nport = {port}\nprefix = "{prefix}"\nkeepalive = 5\nreconnect_max_delay = 1.0\n'
    )
    return path


def simulated_fleet(
    scenario: str, nodes: int, windows: int = 18, seed: int = 1, site: str = "s1", names: bool = True
) -> tuple[Fleet, dict[str, Pattern]]:
    """A fleet state fed with ``windows`` simulated windows of every node (no broker), and the ground truth.
    ``names`` false: every process is ``python3`` with no program, so only behaviour tells workloads apart."""
    fleet = Fleet(FLEET_PREFIX, horizon_windows=60)
    truth = {}
    for node in build_scenario(scenario, nodes, seed, names=names):
        birth, telemetry = offline_windows(node, windows, site=site, seed=seed)
        assert fleet.ingest(node_topic(FLEET_PREFIX, site, node.name, TopicKind.BIRTH), encode(birth))
        for w in telemetry:
            assert fleet.ingest(node_topic(FLEET_PREFIX, site, node.name, TopicKind.TELEMETRY), encode(w))
        truth.update({w.id: w.pattern for w in node.workloads})
    return fleet, truth


def recent(windows: list[Telemetry]) -> list[Telemetry]:
    """``windows`` moved in time to end now (see agent.simulate.shift_to_now)."""
    return shift_to_now(windows)


def three_actions(site: str) -> Snapshot:
    """A site whose plan is three actions of three kinds, their savings of different widths (catalog prices a
    GPU-hour: H100 $2.50, L40S $0.85, L4 $0.35, A100 $1.50; 730 hours a month):

    * image-gen, image generation (compute-bound) on 8 H100 at 20 % (p95 34 %), moves to the empty L40S node: an
      L40S does 0.38 of an H100's compute-bound work, so 20 / 0.38 = 53 % (p95 89 %) there, and 8 × (2.50 -
      0.85) × 730 = $9,636 a month. Its 40,000 MiB per GPU keep it off 4 H100s (80,000 > 90 % of 80 GiB).
    * vision-finetune-ddp, 4-GPU training on L4 (no NVLink), moves to the empty H100 node: an H100 does 1 / 0.11
      of an L4's compute-bound work, and 1 / 0.6 more off PCIe: 4 × 0.35 × 730 - 4 × 2.50 × 730 × 0.11 × 0.6 =
      1,022 - 481.80 = $540.20 a month.
    * forgotten-notebook-alloc, 4 A100 idle all day, is released: 4 × 1.50 × 730 = $4,380 a month."""
    return Snapshot.model_validate(
        {
            "site": site,
            "nodes": [
                {"name": "h100-001", "hardware": "h100", "gpus": 8},
                {"name": "h100-002", "hardware": "h100", "gpus": 8},
                {"name": "l40s-001", "hardware": "l40s", "gpus": 8},
                {"name": "l4-001", "hardware": "l4", "gpus": 8},
                {"name": "a100-001", "hardware": "a100", "gpus": 8},
            ],
            "workloads": [
                {"id": "k8s/image-gen", "name": "image-gen", "class": "inference", "nodes": ["h100-001"],
                 "gpus": 8, "mem_mib_per_gpu": 40_000, "mean_util": 20, "p95_util": 34, "shape": "compute"},
                {"id": "slurm/4711", "name": "vision-finetune-ddp", "class": "training", "nodes": ["l4-001"],
                 "gpus": 4, "mem_mib_per_gpu": 20_000, "mean_util": 90, "p95_util": 93, "shape": "compute"},
                {"id": "slurm/4712", "name": "forgotten-notebook-alloc", "class": "idle", "nodes": ["a100-001"],
                 "gpus": 4, "mem_mib_per_gpu": 24_000, "mean_util": 0, "p95_util": 0},
            ],
        }
    )  # fmt: skip


# ------------------------------------------------------------------------------------ the shipped broker


def shipped_config(creds: Path, directory: Path, port: int, overrides: dict[str, str] | None = None) -> Path:
    """``systemd/mosquitto/fleetfit.conf`` as shipped, with the test's paths and port (and ``overrides``, each
    replacing a setting's value)."""
    config = (EXAMPLES / "fleetfit.conf").read_text()
    config = config.replace("/etc/mosquitto/fleetfit", str(creds)).replace("/var/lib/mosquitto/", f"{directory}/")
    config = config.replace("listener 8883", f"listener {port} 127.0.0.1")
    lines = config.splitlines()
    for key, value in (overrides or {}).items():
        lines = [f"{key} {value}" if line.split(" ", 1)[0] == key else line for line in lines]
    path = directory / "mosquitto.conf"
    # the tests run as root with private files
    path.write_text("\n".join(lines) + "\nuser root\nlog_type error\nlog_type warning\n")
    return path


@dataclass
class Shipped:
    """A Mosquitto with the shipped configuration, ACL and ``mint`` credentials (not started by this class)."""

    server: MosquittoServer
    credentials: Path
    directory: Path

    def settings(self, user: str, port: int | None = None) -> MqttSettings:
        return MqttSettings(
            host="127.0.0.1",
            port=port or self.server.port,
            tls=True,
            ca_file=self.credentials / "ca.crt",
            username=user,
            password=(self.credentials / "clients" / user / "mqtt-password").read_text(),
            reconnect_max_delay=1.0,
        )

    def broker(self, directory: Path, **overrides: str) -> MosquittoServer:
        """Another Mosquitto (not started) with the shipped configuration and credentials; ``overrides`` replace
        a setting's value (e.g. a smaller queue, so that a flood fills it in a second)."""
        directory.mkdir(parents=True, exist_ok=True)
        port = free_port()
        config = shipped_config(self.credentials, directory, port, overrides)
        return MosquittoServer("127.0.0.1", port, config, directory / "mosquitto.log")


def shipped_broker(directory: Path, nodes: dict[str, list[str]], optimizers: tuple[str, ...] = ()) -> Shipped:
    """Credentials minted by ``systemd/mosquitto/mint`` (a CA, the broker, the optimizer, a reader, more optimizer
    accounts, and ``nodes`` by site) and a broker configured as shipped, in ``directory``."""
    creds = directory / "creds"
    mint = str(EXAMPLES / "mint")

    def run(*args: str) -> None:
        subprocess.run([mint, args[0], str(creds), *args[1:]], check=True, capture_output=True, timeout=60)

    run("ca")
    run("broker", "127.0.0.1")
    run("optimizer")
    for name in optimizers:
        run("optimizer", name)
    run("reader")
    for site, names in nodes.items():
        for name in names:
            run("node", site, name)
    port = free_port()
    server = MosquittoServer("127.0.0.1", port, shipped_config(creds, directory, port), directory / "mosquitto.log")
    return Shipped(server, creds, directory)
