"""What a real node's agent loads: nothing of the optimizer, the simulator or the optimizer's libraries.

Every module imported stays resident for the agent's life (its code alone is most of the Python heap), and the
agent's budget is 40 MiB of resident memory (docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys

# Modules a GPU node's agent has no use for; the simulator only with --simulate.
DENIED = (
    "optimizer",
    "collectors.sim",
    "psutil",
    "multiprocessing",
    "numpy",
    "ortools",
    "aiohttp",
    "influxdb_client",
    "amqtt",
)

AGENT = """
import json, sys
from agent.config import AgentConfig
from agent.notify import Notifier
from agent.service import Agent, serve
from agent.session import next_session
from agent.sources import node_collectors
from agent.spool import MemoryQueue
print(json.dumps(sorted(sys.modules)))
"""


def test_agent_loads_no_optimizer_or_simulator_module() -> None:
    """Red when agent/sources.py imports collectors.sim at module level again (1.5 MiB of the simulator's
    modules in every real node's agent), or when any agent module pulls in the optimizer."""
    out = subprocess.run([sys.executable, "-c", AGENT], capture_output=True, text=True, check=True, timeout=60)
    loaded = json.loads(out.stdout)
    denied = [m for m in loaded if any(m == d or m.startswith(d + ".") for d in DENIED)]
    assert denied == []
    assert "agent.service" in loaded and "collectors.host" in loaded  # the probe did load the agent


CLI = """
import json, sys
from optimizer.commands.cli import build_parser
build_parser().parse_args(["agent", "--once"])
print(json.dumps(sorted(sys.modules)))
"""
# The command line itself lives in optimizer.commands; what it must not pull in for `fleetfit agent`:
CLI_DENIED = (
    *tuple(d for d in DENIED if d not in ("optimizer", "collectors.sim")),
    "optimizer.decide",
    "optimizer.plan",
    "optimizer.serve",
)


def test_fleetfit_agent_parses_its_command_without_the_simulator() -> None:
    """Red when the parser imports collectors.sim.scenarios or .backfill again for the scenario and exporter names
    it offers (the whole simulator, ~2.5 MiB, resident in every real node's agent)."""
    out = subprocess.run([sys.executable, "-c", CLI], capture_output=True, text=True, check=True, timeout=60)
    loaded = json.loads(out.stdout)
    light = ("optimizer.serve", "optimizer.serve.tokens")  # the token command's roles: the standard library only
    denied = [m for m in loaded if m not in light and any(m == d or m.startswith(d + ".") for d in CLI_DENIED)]
    simulator = [m for m in loaded if m.startswith("collectors.sim.") and m != "collectors.sim.names"]
    assert denied == [] and simulator == []
