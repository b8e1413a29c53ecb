"""A GPU node installs only the agent's dependencies: the agent runs without the optimizer's and the demo's, and
the commands that need them say which extra to install."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# kubernetes: `fleetfit apply` imports it only to reach an API server (its own extra, `kubernetes`)
OPTIMIZER_ONLY = ("ortools", "aiohttp", "amqtt", "influxdb_client", "numpy", "msgspec", "kubernetes")
# The module each distribution installs, where the two names differ.
MODULE_OF = {"influxdb-client": "influxdb_client", "nvidia-ml-py": "pynvml", "paho-mqtt": "paho"}

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
from optimizer.commands.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _without_extras(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS, *args], capture_output=True, text=True, timeout=60, check=False
    )


def _requirement_names(requirements: list[str]) -> set[str]:
    return {r.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip().replace("-", "_") for r in requirements}


def _modules(requirements: list[str]) -> set[str]:
    names = {r.split(">")[0].split("<")[0].split("=")[0].split("[")[0].split(";")[0].strip() for r in requirements}
    return {MODULE_OF.get(n, n.replace("-", "_")) for n in names}


def _third_party_imports(package: str) -> set[str]:
    """The top-level modules ``package`` imports that are neither the standard library's nor this project's."""
    import ast

    found = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"agent", "collectors", "optimizer"}


def test_every_module_the_optimizer_imports_is_installed_by_its_extras_and_blocked_here() -> None:
    """A module the optimizer imports that no extra names would crash an install that lacks it by chance; one
    this file does not block would let the commands below pass where an agent-only install crashes."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = _modules(project["dependencies"])
    optional = project["optional-dependencies"]
    extras = _modules(optional["optimizer"] + optional["demo"] + optional["kubernetes"])
    needed = _third_party_imports("optimizer") - base - {"pydantic_core"}  # pydantic_core comes with pydantic
    assert needed <= extras, f"imported by optimizer/ but in no extra: {needed - extras}"
    assert needed <= set(OPTIMIZER_ONLY), f"not blocked by this test: {needed - set(OPTIMIZER_ONLY)}"
    assert _third_party_imports("agent") | _third_party_imports("collectors") <= base | {"pydantic_core", "paho"}


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


OPTIMIZER_SIDE = {
    "optimizer": [],
    "plan": [str(ROOT / "docs" / "examples" / "chain.json")],
    "classify": [str(ROOT / "README.md")],
    "recommendations": ["--state-dir", str(ROOT)],
    "report": ["--state-dir", str(ROOT)],
    "catalog": [],
    "alerts": ["test", "--receiver", "ops"],
    "import": ["prometheus", "http://127.0.0.1:1", "--since", "1h"],
    "apply": ["--state-dir", str(ROOT)],
}


def test_every_optimizer_command_without_its_extra_says_in_one_line_what_to_install() -> None:
    from optimizer.commands.cli import build_parser

    commands = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    # a new command is listed here; `token` needs no extra (it hashes and appends to a file)
    assert commands - {"agent", "simulate", "demo", "token"} == set(OPTIMIZER_SIDE)
    for command, args in OPTIMIZER_SIDE.items():
        done = _without_extras(command, *args)
        assert done.returncode == 1 and "Traceback" not in done.stderr, (command, done.stderr[-500:])
        assert done.stderr.count("\n") == 1, (command, done.stderr)
        assert done.stderr.endswith("pip install 'fleetfit[optimizer]'\n"), (command, done.stderr)
    demo = _without_extras("demo", "--duration", "1")
    assert demo.returncode == 1 and demo.stderr.endswith("pip install 'fleetfit[demo]'\n")


@pytest.mark.slow
def test_installing_the_package_prints_no_warning(tmp_path: Path) -> None:
    """`make demo` installs the package (editable, --quiet) before anything else: the build says nothing (no
    deprecated license table, no package missing from the list, no editable-install caveat), and a wheel holds
    the console's files and the catalog. Lines pip prints about its own configuration on this machine (a
    find-links location that does not exist) are not the build's."""
    tree = tmp_path / "src"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True, timeout=120)
    pip = [str(tmp_path / "venv" / "bin" / "python"), "-m", "pip"]
    # as the Makefile does: a current pip shows what the build backend warns about, an old one hides it
    subprocess.run([*pip, "install", "--quiet", "--upgrade", "pip"], capture_output=True, check=True, timeout=300)
    for command in (
        ["install", "--quiet", "--no-deps", "-e", str(tree)],
        ["wheel", "--quiet", "--no-deps", "-w", str(tmp_path / "dist"), str(tree)],
    ):
        done = subprocess.run([*pip, *command], capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        said = [line for line in (done.stdout + done.stderr).splitlines() if not line.startswith("WARNING: Location")]
        assert not [line for line in said if "warning" in line.lower()], "\n".join(said[:40])
    (wheel,) = (tmp_path / "dist").glob("fleetfit-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    assert {
        "optimizer/serve/web/static/console.css",
        "optimizer/serve/web/static/console.js",
        "optimizer/decide/data/catalog.toml",
    } <= names
