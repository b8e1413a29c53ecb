"""Simulated GPUs run by real local processes: attributed and described through /proc, as on a node with GPUs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.protocol import Telemetry, TopicKind, decode
from agent.sources import simulated_gpus
from collectors.attribution import Attributor
from collectors.sim.processes import ProcessBackedGpus
from collectors.workload_facts import WithFacts, WorkloadFacts

FLEETFIT = shutil.which("fleetfit") or str(Path(sys.executable).parent / "fleetfit")

# Listens on a port below the ephemeral range with one client of its own connected, then waits.
SERVER = """\
import random, socket, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
for port in random.sample(range(20000, 29000), 200):
    try:
        server.bind(("127.0.0.1", port))
        break
    except OSError:
        continue
server.listen()
client = socket.create_connection(("127.0.0.1", port))
accepted = server.accept()[0]
print(port, flush=True)
sys.stdin.read()
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """(pid, port) of a real server process, in a process group of its own."""
    script = tmp_path / "tiny_server.py"
    script.write_text(SERVER)
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
    )
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    yield proc.pid, port
    proc.kill()
    proc.wait(timeout=10)


def test_each_process_is_attributed_to_its_gpu_and_described(server: tuple[int, int]) -> None:
    pid, port = server
    attributor = Attributor(node="n1")
    gone = 2**22 + 1  # above any pid_max: never a live process
    collector = WithFacts(
        ProcessBackedGpus(simulated_gpus("h100x2", "n1"), [pid, os.getpid(), gone], attributor),
        attributor,
        WorkloadFacts(),  # TCP tables read when asked, not on a thread: the first window has them
    )
    refs = {r.id: r for r in collector.workloads()}
    assert set(refs) == {f"pgid/n1/{pid}", f"pgid/n1/{os.getpgid(0)}"}  # the third pid is dropped
    served = refs[f"pgid/n1/{pid}"]
    assert served.gpus == [0]  # PID i on GPU i modulo the GPU count: the gone one would have been on GPU 0 too
    assert (served.program, served.listen_ports, served.inbound_connections) == ("tiny_server.py", [port], 1)
    assert refs[f"pgid/n1/{os.getpgid(0)}"].gpus == [1]
    assert len(collector.sample()) == 2  # the GPUs' telemetry is the simulated node's
    collector.close()


def test_the_agent_takes_simulated_gpus_processes_from_the_command_line(server: tuple[int, int]) -> None:
    pid, _ = server
    done = subprocess.run(
        [FLEETFIT, "agent", "--once", "--window", "1", "--simulate", "l4x2", "--simulate-pids", f"{pid},{pid}"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    window = decode(TopicKind.TELEMETRY, done.stdout)
    assert isinstance(window, Telemetry)
    assert [(w.id, w.gpus, w.program) for w in window.workloads] == [
        (f"pgid/{window.node}/{pid}", [0, 1], "tiny_server.py")
    ]
    assert [g.workload for g in window.gpus] == [f"pgid/{window.node}/{pid}"] * 2
    for args, why in (
        (["--simulate-pids", str(pid)], b"only with --simulate"),
        (["--simulate", "l4x2", "--simulate-pids", "0"], b"at least 1"),
        (["--simulate", "l4x2", "--simulate-pids", "12,x"], b"process ids separated by commas"),
    ):
        bad = subprocess.run([FLEETFIT, "agent", "--once", *args], capture_output=True, timeout=60, check=False)
        assert bad.returncode == 2 and why in bad.stderr and b"Traceback" not in bad.stderr
