"""The README's install block, run as written in a scratch root: every credential the units load is made by the
block, every secret the configs name is loaded by their unit, the units' documentation is where they say, and
the broker, the optimizer and an agent started from what the block installed, with the credentials systemd would
hand them, talk to each other. Only systemctl, apt-get and the package install are stood in for (they would
change this machine, or take minutes)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import FLEETFIT, MosquittoServer, free_port

ROOT = Path(__file__).resolve().parent.parent
STUB = '#!/bin/sh\necho "$(basename "$0") $*" >> "{log}"\n'
# `python3 -m venv DIR`: a directory with a pip that only says what it was asked to install
VENV_STUB = '#!/bin/sh\n[ "$1 $2" = "-m venv" ] || exec /usr/bin/python3 "$@"\nmkdir -p "$3/bin"\nprintf \'%s\\n\' \'#!/bin/sh\' \'echo "pip $*" >> "{log}"\' > "$3/bin/pip"\nchmod +x "$3/bin/pip"\n'


def install_block() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Installing\n") :]
    return section[section.index("```sh\n") + 6 : section.index("\n```\n")]


def _credentials(unit: str, root: Path) -> dict[str, Path]:
    """LoadCredential=NAME:PATH lines of a unit, the paths inside ``root``."""
    return {
        m.group(1): root / m.group(2).lstrip("/") for m in re.finditer(r"^LoadCredential=([^:\s]+):(\S+)$", unit, re.M)
    }


def _credentials_dir(credentials: dict[str, Path], into: Path) -> Path:
    """$CREDENTIALS_DIRECTORY as systemd fills it from LoadCredential=."""
    into.mkdir(mode=0o700)
    for name, source in credentials.items():
        shutil.copyfile(source, into / name)
    return into


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(the scratch root, the checkout the block ran in, this host's short name) after running the block."""
    tmp = tmp_path_factory.mktemp("install")
    root, checkout, stubs = tmp / "root", tmp / "checkout", tmp / "stubs"
    for d in (root / "etc" / "mosquitto" / "conf.d", root / "etc" / "systemd" / "system", stubs):
        d.mkdir(parents=True)
    shutil.copytree(ROOT / "systemd", checkout / "systemd")
    shutil.copytree(ROOT / "docs", checkout / "docs", ignore=shutil.ignore_patterns("*.png", "examples"))
    shutil.copy(ROOT / "README.md", checkout)
    log = tmp / "commands.log"
    for name in ("systemctl", "apt-get"):
        (stubs / name).write_text(STUB.format(log=log))
    (stubs / "python3").write_text(VENV_STUB.format(log=log))
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    host = socket.gethostname().split(".")[0]
    block = install_block()
    settings = block.splitlines()[0]
    assert settings.startswith("BROKER=") and "NODES=" in settings
    block = block.replace(settings, f'BROKER=localhost SITE=lab NODES="gpu-001 {host}"', 1)
    for path in ("/etc/", "/opt/fleetfit"):
        block = block.replace(f" {path}", f" {root}{path}")
    if os.geteuid() != 0:  # files for the broker's own user: only root may give them away
        block = block.replace("-o mosquitto ", "")
    env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}")
    done = subprocess.run(
        ["sh", "-eu", "-c", block], cwd=checkout, capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = log.read_text()
    assert "pip install .[optimizer]" in said and "pip install ." in said  # both sides' installs
    assert "systemctl enable --now fleetfit-optimizer" in said and "systemctl enable --now fleetfit-agent" in said
    return root, checkout, host


def test_the_block_makes_every_credential_and_document_the_units_need(installed: tuple[Path, Path, str]) -> None:
    root, _, _ = installed
    for unit_name, config_name in (
        ("fleetfit-agent.service", "agent.toml"),
        ("fleetfit-optimizer.service", "optimizer.toml"),
    ):
        unit = (root / "etc" / "systemd" / "system" / unit_name).read_text()
        credentials = _credentials(unit, root)
        missing = [str(p) for p in credentials.values() if not p.is_file() or not p.read_text().strip()]
        assert not missing, f"{unit_name} loads credentials the block did not make: {missing}"
        # each secret the config names by a relative path is a credential its unit loads
        config = tomllib.loads((root / "etc" / "fleetfit" / config_name).read_text())
        named = {
            str(v)
            for section in config.values()
            if isinstance(section, dict)
            for k, v in section.items()
            if k.endswith("_file") and not str(v).startswith("/")
        }
        assert named <= set(credentials), (
            f"{config_name} names {named - set(credentials)}, which {unit_name} does not load"
        )
        for doc in re.findall(r"^Documentation=file://(\S+)$", unit, re.M):
            assert (root / doc.lstrip("/")).is_file(), f"{unit_name}: Documentation= {doc} is not installed"
    assert oct((root / "etc" / "fleetfit" / "credentials").stat().st_mode & 0o777) == "0o700"


def _get(url: str, token: str | None = None, method: str = "GET") -> tuple[int, str]:
    request = urllib.request.Request(url, method=method, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.slow
def test_what_the_block_installed_runs_an_optimizer_and_an_agent(
    installed: tuple[Path, Path, str], tmp_path: Path
) -> None:
    root, _, host = installed
    # the broker from its installed configuration (on a free port; as root, with files for root)
    port, api = free_port(), free_port()
    conf = (root / "etc" / "mosquitto" / "conf.d" / "fleetfit.conf").read_text()
    conf = conf.replace("/etc/mosquitto/fleetfit", str(root / "etc" / "mosquitto" / "fleetfit"))
    conf = conf.replace("/var/lib/mosquitto/", f"{tmp_path}/").replace("listener 8883", f"listener {port} 127.0.0.1")
    (tmp_path / "mosquitto.conf").write_text(conf + "user root\nlog_type error\n")
    broker = MosquittoServer("127.0.0.1", port, tmp_path / "mosquitto.conf", tmp_path / "mosquitto.log")
    broker.start()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        units = root / "etc" / "systemd" / "system"
        common = {"PATH": os.environ["PATH"], "FLEETFIT_MQTT_PORT": str(port)}
        optimizer_env = common | {
            "CREDENTIALS_DIRECTORY": str(
                _credentials_dir(
                    _credentials((units / "fleetfit-optimizer.service").read_text(), root), tmp_path / "oc"
                )
            ),
            "FLEETFIT_OPTIMIZER_STATE_DIR": str(tmp_path / "optimizer"),  # StateDirectory= would make it
            "FLEETFIT_OPTIMIZER_SOLVE_INTERVAL": "2",
            "FLEETFIT_API_PORT": str(api),
        }
        agent_env = common | {
            "CREDENTIALS_DIRECTORY": str(
                _credentials_dir(_credentials((units / "fleetfit-agent.service").read_text(), root), tmp_path / "ac")
            ),
            "FLEETFIT_AGENT_STATE_DIR": str(tmp_path / "agent"),
            "FLEETFIT_AGENT_PUBLISH_INTERVAL": "1",
        }
        config = root / "etc" / "fleetfit"
        logs = [(tmp_path / f"{n}.log").open("wb") for n in ("optimizer", "agent")]
        processes.append(
            subprocess.Popen(
                [FLEETFIT, "optimizer", "--config", str(config / "optimizer.toml")],
                env=optimizer_env,
                stdout=logs[0],
                stderr=subprocess.STDOUT,
            )
        )
        processes.append(
            subprocess.Popen(
                [FLEETFIT, "agent", "--config", str(config / "agent.toml"), "--simulate", "h100x8"],
                env=agent_env,
                stdout=logs[1],
                stderr=subprocess.STDOUT,
            )
        )
        deadline, nodes = time.monotonic() + 60, []
        while time.monotonic() < deadline:
            assert all(p.poll() is None for p in processes), (tmp_path / "optimizer.log").read_text()[-2000:] + (
                tmp_path / "agent.log"
            ).read_text()[-2000:]
            try:
                nodes = json.loads(_get(f"http://127.0.0.1:{api}/api/v1/nodes")[1])
            except (urllib.error.URLError, ConnectionError, json.JSONDecodeError):
                nodes = []
            if any(n["node"] == host and n["windows_held"] for n in nodes):
                break
            time.sleep(0.5)
        # the agent logged in as its node, over TLS with its minted password, into its site; the optimizer took it in
        assert [(n["site"], n["node"]) for n in nodes if n["windows_held"]] == [("lab", host)], nodes
        assert _get(f"http://127.0.0.1:{api}/healthz")[0] == 200
        # the API token the block made is the optimizer's: a decision on an unknown action is "not found", not 401
        token = (root / "etc" / "fleetfit" / "credentials" / "api-token").read_text().strip()
        assert _get(f"http://127.0.0.1:{api}/api/v1/recommendations/none/ack", token, "POST")[0] == 404
        assert _get(f"http://127.0.0.1:{api}/api/v1/recommendations/none/ack", "wrong", "POST")[0] == 401
    finally:
        for p in processes:
            p.terminate()
        for p in processes:
            p.wait(timeout=30)
        broker.stop()
