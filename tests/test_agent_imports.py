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
