"""A slow or hung GPU against the agent's event loop and its systemd watchdog, with NVML stand-ins whose calls
block the way the real binding's do (inside the C call, the GIL released)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from pathlib import Path

from conftest import free_port
from fake_nvml import FakeGpu, make_fake_nvml

from agent.config import AgentConfig, AgentSettings, MqttSettings
from agent.metrics import render
from agent.notify import Notifier
from agent.protocol import WorkloadRef
from agent.service import Agent
from agent.spool import MemoryQueue
from collectors.attribution import Attributor
from collectors.base import Entity, Inventory, Sample
from collectors.gpu import NvmlGpuCollector, open_gpu_collector


class Host:
    """A collector that answers at once, as the host's does; counts the rounds it was sampled in."""

    name = "host"
    blocking = True

    def __init__(self) -> None:
        self.rounds = 0

    def inventory(self) -> Inventory:
        return Inventory()

    def sample(self) -> list[Sample]:
        self.rounds += 1
        return [Sample(Entity.HOST, "host", gauges={"cpu_util": 10.0})]

    def workloads(self) -> list[WorkloadRef]:
        return []

    def close(self) -> None:
        return None


def _agent(tmp_path: Path, gpus: list[FakeGpu], notifier: Notifier | None = None) -> tuple[Agent, Host]:
    gpu = open_gpu_collector(make_fake_nvml(gpus), Attributor(tmp_path, node="slow"))
    assert isinstance(gpu, NvmlGpuCollector)
    host = Host()
    config = AgentConfig(
        agent=AgentSettings(node="slow", site="lab", sample_interval=0.5, publish_interval=1.0, state_dir=tmp_path),
        mqtt=MqttSettings(port=free_port()),  # no broker: the link retries in the background, as in an outage
    )
    return Agent(config, [gpu, host], session=1, queue=MemoryQueue(100), notifier=notifier), host


async def _longest_stall(seconds: float) -> float:
    """The longest time the event loop went without running this task, over ``seconds``."""
    worst, step = 0.0, 0.02
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        before = time.perf_counter()
        await asyncio.sleep(step)
        worst = max(worst, time.perf_counter() - before - step)
    return worst


async def test_a_slow_gpu_never_stalls_the_event_loop(tmp_path: Path) -> None:
    """Two GPUs whose every NVML call blocks 0.12 s: one sample of them takes about 2 s. The event loop (broker
    link, metrics endpoint, signals) never waits more than 1.5 s, the GPU's late samples are skipped and counted,
    and the host is sampled every round all the same.

    Deliberate bug it catches: the NVML collector called on the event loop (``blocking`` left off
    NvmlGpuCollector, or ``sample_all`` calling ``c.sample()`` directly) stalls the loop for about 2 s a round."""
    gpus = [FakeGpu(), FakeGpu()]
    agent, host = _agent(tmp_path, gpus)
    task = asyncio.create_task(agent.run())
    try:
        await asyncio.sleep(0.2)  # started: the inventory read, the first round sampled
        rounds = host.rounds
        for g in gpus:
            g.delay_s = 0.12  # slow from now on
        stall = await _longest_stall(3.0)
        rounds = host.rounds - rounds
    finally:
        agent.should_exit.set()
        await asyncio.wait_for(task, 20)
    assert stall < 1.5, f"the event loop stalled {stall:.2f} s"
    assert agent.overruns.get("gpu", 0) >= 2  # skipped rounds while the GPU's call ran on
    assert rounds >= 5  # 3 s at 0.5 s: the host's samples did not wait for the GPU's
    text = render(agent.self_metrics())
    assert f'fleetfit_agent_collector_overruns_total{{collector="gpu"}} {agent.overruns["gpu"]}' in text


async def test_a_gpu_that_hangs_for_good_stops_the_watchdog(tmp_path: Path) -> None:
    """A GPU whose NVML calls stop returning: the watchdog (a real unix datagram socket as NOTIFY_SOCKET) is
    pinged while sampling progresses, then no more once the call has hung for the watchdog's period (1 s here),
    so systemd restarts the agent; the agent still stops promptly on request with the call still hung.

    Deliberate bug it catches: the watchdog pinged on the link's health alone (``_sampling_alive`` left out of
    the sampling loop's ping condition) keeps telling systemd all is well for ever."""
    path = tmp_path / "notify"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(path))
    server.setblocking(False)
    notifier = Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "1000000"})  # pings every 0.5 s
    gpu = FakeGpu()
    agent, host = _agent(tmp_path, [gpu], notifier)
    hang = threading.Event()
    pings: list[float] = []

    async def listen(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            with contextlib.suppress(BlockingIOError):
                while True:
                    if server.recv(64) == b"WATCHDOG=1":
                        pings.append(time.monotonic())
            await asyncio.sleep(0.02)

    task = asyncio.create_task(agent.run())
    try:
        await listen(1.0)
        assert pings, "no watchdog ping while the GPU answered"
        gpu.hang = hang
        hung_at = time.monotonic()
        await listen(3.0)
        # at most the call's deadline, the 1 s limit and one ping interval after the hang began, then silence
        assert pings[-1] < hung_at + 2.2, [round(p - hung_at, 2) for p in pings]
        assert agent.stuck == "gpu"
        assert host.rounds >= 7  # the host was sampled throughout
        stopping = time.monotonic()
        agent.should_exit.set()
        await asyncio.wait_for(task, 10)
        assert time.monotonic() - stopping < 3.0  # the hung call did not hold the shutdown
    finally:
        hang.set()  # the blocked thread returns and ends with the test
        agent.should_exit.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 10)
        server.close()
