"""A node whose NVIDIA driver loads after the agent started: the retained birth on a real broker first says why
there are no GPUs, then lists them, without an agent restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiomqtt
from conftest import MosquittoServer, wait_until, write_agent_config
from fake_nvml import FakeGpu, make_fake_nvml

from agent.config import AgentConfig, load_config
from agent.metrics import render
from agent.protocol import Birth, TopicKind, decode
from agent.service import Agent
from agent.spool import MemoryQueue
from collectors.attribution import Attributor
from collectors.gpu import RESCAN_S, open_gpu_collector


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_a_driver_loaded_late_is_announced_with_a_new_birth(
    mosquitto: MosquittoServer, prefix: str, tmp_path: Path
) -> None:
    config = load_config(AgentConfig, write_agent_config(tmp_path, mosquitto.port, prefix, "late-driver"), environ={})
    nvml = make_fake_nvml([FakeGpu(), FakeGpu()], init_error=9)  # DRIVER_NOT_LOADED
    clock = Clock()
    gpu = open_gpu_collector(nvml, Attributor(tmp_path, node="late-driver"), clock)
    agent = Agent(config, [gpu], session=1, queue=MemoryQueue(100))
    births: list[Birth] = []

    async def watch() -> None:
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            await client.subscribe(f"{prefix}/lab/late-driver/birth", qos=1)
            async for m in client.messages:
                message = decode(TopicKind.BIRTH, bytes(m.payload))  # type: ignore[arg-type]
                assert isinstance(message, Birth)
                births.append(message)

    watcher = asyncio.create_task(watch())
    runner = asyncio.create_task(agent.run())
    try:
        await wait_until(lambda: len(births) >= 1, 15, "the first birth")
        assert births[0].gpus == [] and "Driver Not Loaded" in (births[0].gpu_unavailable or "")
        nvml.init_error = None  # type: ignore[attr-defined]  # the driver module is loaded
        clock.now += RESCAN_S
        await wait_until(lambda: len(births) >= 2, 15, "a birth with the GPUs")
        assert [g.index for g in births[-1].gpus] == [0, 1] and births[-1].gpu_unavailable is None
        assert "fleetfit_agent_gpu_inventory_changes_total 1" in render(agent.self_metrics())
    finally:
        agent.should_exit.set()
        await asyncio.wait_for(runner, 20)
        watcher.cancel()
