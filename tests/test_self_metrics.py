"""Self-metrics: the agent's optional endpoint on a real port, tracking a real broker outage; the text format."""

from __future__ import annotations

import asyncio
import re
import signal
from pathlib import Path

import aiohttp
from conftest import free_port, private_broker, start_agent, write_agent_config

from agent.metrics import Family, counter, labelled, render

SAMPLE = re.compile(r'^[a-z_]+(\{([a-z_]+="[^"]*",?)+\})? -?[0-9.e+]+$')


def parse(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) [a-z_]+ .+$", line), line
            continue
        assert SAMPLE.match(line), line
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def test_text_format_escapes_labels_and_keeps_integers_integral() -> None:
    text = render(
        [
            counter("fleetfit_x_total", "X.", 3),
            labelled("fleetfit_y", "gauge", "Y.", "site", {'eu"1\\': 0.5}),
            Family("fleetfit_empty", "counter", "Nothing yet."),
        ]
    )
    assert "fleetfit_x_total 3\n" in text and 'fleetfit_y{site="eu\\"1\\\\"} 0.5' in text
    assert "# TYPE fleetfit_empty counter" in text


async def _metrics(port: int) -> dict[str, float]:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return parse(await r.text())


async def _listening(port: int, within: float = 30.0) -> None:
    """Wait for the agent (a fresh process, slow to start on a loaded machine) to open its metrics port."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)
        else:
            writer.close()
            return


async def _until(port: int, check: str, predicate: object, within: float = 30.0) -> dict[str, float]:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        got = await _metrics(port)
        if predicate(got.get(check, -1)):  # type: ignore[operator]
            return got
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{check} never satisfied: {got}")
        await asyncio.sleep(0.3)


async def test_agent_metrics_follow_a_broker_outage(tmp_path: Path, prefix: str) -> None:
    broker = private_broker(tmp_path)
    port = broker.port
    broker.start()
    metrics_port = free_port()
    config = write_agent_config(tmp_path, port, prefix, "metrics-node")
    config.write_text(config.read_text().replace("[mqtt]", f"metrics_port = {metrics_port}\n[mqtt]"))
    proc = await start_agent(config)
    try:
        await _listening(metrics_port)
        first = await _until(metrics_port, "fleetfit_agent_windows_published_total", lambda v: v >= 2)
        assert first["fleetfit_agent_broker_connected"] == 1 and first["fleetfit_agent_samples_total"] >= 2
        broker.stop()
        down = await _until(metrics_port, "fleetfit_agent_windows_spooled", lambda v: v >= 2)
        assert down["fleetfit_agent_broker_connected"] == 0
        broker.start()
        back = await _until(metrics_port, "fleetfit_agent_windows_spooled", lambda v: v == 0)
        assert back["fleetfit_agent_windows_published_total"] >= first["fleetfit_agent_windows_published_total"] + 2
        assert back["fleetfit_agent_windows_dropped_total"] == 0
        assert back["fleetfit_agent_windows_paced_total"] == 0  # a short outage replays within the burst
        # a garbage request is refused without harm; other paths are not found
        reader, writer = await asyncio.open_connection("127.0.0.1", metrics_port)
        writer.write(b"\x00\xff garbage without an end")
        writer.write_eof()
        assert (await reader.read()).startswith(b"HTTP/1.1 400")
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{metrics_port}/") as r:
            assert r.status == 404
        await _until(metrics_port, "fleetfit_agent_samples_total", lambda v: v > back["fleetfit_agent_samples_total"])
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
        broker.stop()
