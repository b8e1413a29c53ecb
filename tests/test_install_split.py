"""A GPU node installs only the agent's dependencies: the agent runs without the optimizer's and the demo's, and
the commands that need them say which extra to install."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPTIMIZER_ONLY = ("ortools", "aiohttp", "amqtt", "influxdb_client")

# Runs `fleetfit ARGS` as if the optimizer's and the demo's packages were not installed.
WITHOUT_EXTRAS = f"""
import sys
BLOCKED = {OPTIMIZER_ONLY!r}
class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, NotInstalled())
from optimizer.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _without_extras(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS, *args], capture_output=True, text=True, timeout=60, check=False
    )


def _requirement_names(requirements: list[str]) -> set[str]:
    return {r.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip().replace("-", "_") for r in requirements}


def test_the_default_install_is_the_agents() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    default = _requirement_names(project["dependencies"])
    assert not default & {"ortools", "aiohttp", "amqtt", "influxdb_client"}
    extras = project["optional-dependencies"]
    assert {"aiohttp", "ortools", "influxdb_client"} <= _requirement_names(extras["optimizer"])
    assert "amqtt" in _requirement_names(extras["demo"])


def test_the_agent_runs_without_the_optimizers_packages() -> None:
    done = _without_extras("agent", "--once", "--simulate", "h100x8", "--window", "1")
    assert done.returncode == 0, done.stderr
    assert '"gpus"' in done.stdout


def test_an_optimizer_command_without_its_extra_says_what_to_install() -> None:
    done = _without_extras("optimizer")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "pip install 'fleetfit[optimizer]'" in done.stderr
    demo = _without_extras("demo", "--duration", "1")
    assert demo.returncode == 2 and "pip install 'fleetfit[demo]'" in demo.stderr
