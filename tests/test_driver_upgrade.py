"""A GPU driver upgraded under a running agent: `fleetfit agent` exits with a clear line and status 75, and started
again (as systemd does) it reads the new driver. The agent runs as its own process against a real broker; only
NVML is a stand-in, loaded as `pynvml` and failing as the real binding does once the kernel module is replaced."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import aiomqtt
from conftest import MosquittoServer, start_agent, wait_until, write_agent_config

from agent.protocol import Birth, TopicKind, decode
from agent.service import EXIT_RESTART

TESTS = Path(__file__).resolve().parent

# Imported as `pynvml` by the agent: the real binding is imported under it (fake_nvml copies its error classes),
# then the stand-in replaces it; the loaded kernel module's version follows a file the test writes.
SHIM = """
import importlib, os, sys, threading, time
from pathlib import Path

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
del sys.modules["pynvml"]
importlib.import_module("pynvml")
sys.path.insert(0, os.environ["FAKE_NVML_TESTS"])
import fake_nvml

state = Path(os.environ["FAKE_NVML_DRIVER"])
fake = fake_nvml.make_fake_nvml([fake_nvml.FakeGpu(), fake_nvml.FakeGpu()], driver=state.read_text().strip())


def follow():
    while True:
        fake.driver = fake.library = state.read_text().strip()  # packages upgraded and the module reloaded
        time.sleep(0.05)


threading.Thread(target=follow, daemon=True).start()
sys.modules["pynvml"] = fake
"""


async def test_a_driver_upgrade_ends_the_agent_and_its_restart_reads_the_new_driver(
    mosquitto: MosquittoServer, prefix: str, tmp_path: Path
) -> None:
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "pynvml.py").write_text(SHIM)
    driver = tmp_path / "driver"
    driver.write_text("550.54.15\n")
    env = dict(os.environ, PYTHONPATH=str(shim), FAKE_NVML_TESTS=str(TESTS), FAKE_NVML_DRIVER=str(driver))
    config = write_agent_config(tmp_path, mosquitto.port, prefix, "upgraded")
    # the node's PCI bus: two NVIDIA GPUs (3D controllers), so the agent opens NVML on whatever machine runs this
    for address in ("0000:18:00.0", "0000:2a:00.0"):
        device = tmp_path / "sys" / "bus" / "pci" / "devices" / address
        device.mkdir(parents=True)
        (device / "vendor").write_text("0x10de\n")
        (device / "class").write_text("0x030200\n")
    config.write_text(config.read_text().replace("[mqtt]", f'sysfs_root = "{tmp_path / "sys"}"\n[mqtt]'))
    births: list[Birth] = []

    async def watch() -> None:
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            await client.subscribe(f"{prefix}/lab/upgraded/birth", qos=1)
            async for m in client.messages:
                message = decode(TopicKind.BIRTH, bytes(m.payload))  # type: ignore[arg-type]
                assert isinstance(message, Birth)
                births.append(message)

    watcher = asyncio.create_task(watch())
    agent = await start_agent(config, stderr=asyncio.subprocess.PIPE, env=env)
    try:
        await wait_until(lambda: bool(births), 30, "the first birth")
        assert births[-1].driver_version == "550.54.15" and len(births[-1].gpus) == 2
        driver.write_text("560.35.03\n")
        assert agent.stderr is not None
        _, stderr = await asyncio.wait_for(agent.communicate(), 30)
        assert agent.returncode == EXIT_RESTART != 0
        said = stderr.decode()
        assert "driver was replaced" in said and "exiting (status 75) for systemd to restart the agent" in said
        # systemd's Restart=on-failure: a new process loads the new library
        restarted = await start_agent(config, env=env)
        try:
            await wait_until(lambda: births[-1].driver_version == "560.35.03", 30, "a birth with the new driver")
            assert len(births[-1].gpus) == 2 and births[-1].gpu_unavailable is None
        finally:
            restarted.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(restarted.wait(), 30) == 0
    finally:
        if agent.returncode is None:
            agent.kill()
            await agent.wait()
        watcher.cancel()
