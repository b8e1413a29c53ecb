"""CPU a subscriber spends per message at a fleet's live rate: aiomqtt's message iterator (a task and a wait
per message, each acknowledgement written after a thread-safe wake-up) against the optimizer's intake
(``optimizer/serve/intake.py``: every packet the socket holds read in one round, handled there, acknowledged
together, a short pause after a quiet round). Both take the same stream, from the same publisher, in the same run.

    .venv/bin/python bench/intake.py [--rate 300] [--messages 6000] [--rounds 3] [--size 5900]

Each subscriber runs in a process of its own, handles nothing (what remains is the cost of taking messages in),
and acknowledges each message at QoS 1 as the optimizer does; its CPU is read from the scheduler over the time
between its first and last message. A publisher in another process sends ``--size``-byte messages at ``--rate``
a second, one at a time as nodes' windows arrive. Variants alternate; medians of rounds and their ratio are
printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import free_port, mosquitto_command

from agent.config import MqttSettings
from agent.mqtt import make_client
from optimizer.commands.cliargs import number
from optimizer.serve.intake import Intake

VARIANTS = ("iterator", "intake")


async def subscribe(variant: str, port: int, expected: int) -> None:
    """Take ``expected`` messages in; print CPU seconds and wall seconds from the first to the last."""
    settings = MqttSettings(host="127.0.0.1", port=port, protocol="5")
    client = make_client(settings, f"bench-{variant}")
    taken = 0
    first: tuple[float, float] | None = None
    done = asyncio.get_running_loop().create_future()

    def handle(topic: str, payload: bytes | bytearray) -> None:
        nonlocal taken, first
        if first is None:
            first = (time.process_time(), time.monotonic())
        taken += 1
        if taken >= expected and not done.done():
            done.set_result(None)

    if variant == "intake":
        intake = Intake(client, handle)
    else:
        client._client.manual_ack_set(True)
    async with client:
        await client.subscribe("bench/#", qos=1)
        print("ready", flush=True)
        if variant == "intake":
            intake.start()
            await done
        else:
            async for message in client.messages:
                handle(str(message.topic), message.payload)
                client._client.ack(message.mid, message.qos)
                if done.done():
                    break
    assert first is not None
    print(f"{time.process_time() - first[0]} {time.monotonic() - first[1]}", flush=True)


def publish(port: int, rate: float, count: int, size: int) -> None:
    """``count`` QoS 1 messages at ``rate`` a second, each on a node's own topic."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.connect("127.0.0.1", port)
    client.loop_start()
    payload = os.urandom(size // 2).hex().encode()
    started = time.monotonic()
    for i in range(count):
        client.publish(f"bench/site/n{i % 2000}/telemetry", payload, qos=1)
        delay = started + (i + 1) / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    time.sleep(0.5)
    client.loop_stop()
    client.disconnect()


def one(variant: str, port: int, args: argparse.Namespace) -> tuple[float, float]:
    """µs of CPU per message and share of a core for ``variant``, taking one stream."""
    here = Path(__file__).resolve()
    sub = subprocess.Popen(
        [sys.executable, str(here), "--subscriber", variant, "--port", str(port), "--messages", str(args.messages)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert sub.stdout is not None
    if sub.stdout.readline().strip() != "ready":
        raise RuntimeError(f"{variant} subscriber did not start")
    publish(port, args.rate, args.messages, args.size)
    out, _ = sub.communicate(timeout=120)
    cpu, wall = (float(v) for v in out.split())
    return cpu / args.messages * 1e6, cpu / wall * 100


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    positive, count = number(float, above=0), number(int, above=0)
    parser.add_argument("--rate", type=positive, default=300.0, help="messages a second (300: 3,000 nodes)")
    parser.add_argument("--messages", type=count, default=6000)
    parser.add_argument("--rounds", type=count, default=3)
    parser.add_argument("--size", type=count, default=5900, help="bytes a message (a window is ~5.8 KiB)")
    parser.add_argument("--subscriber", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.subscriber:
        asyncio.run(subscribe(args.subscriber, args.port, args.messages))
        return 0
    port = free_port()
    results: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        broker = subprocess.Popen(mosquitto_command(Path(tmp), port), stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        try:
            for r in range(args.rounds):
                for variant in VARIANTS if r % 2 == 0 else reversed(VARIANTS):
                    us, share = one(variant, port, args)
                    results[variant].append((us, share))
                    print(f"round {r + 1}: {variant:8s} {us:6.0f} µs CPU per message, {share:5.1f} % of a core")
        finally:
            broker.terminate()
            broker.wait()
    medians = {v: statistics.median(us for us, _ in results[v]) for v in VARIANTS}
    shares = {v: statistics.median(s for _, s in results[v]) for v in VARIANTS}
    print()
    print(
        f"median, {args.messages} messages of {args.size} bytes at {args.rate:g} a second: aiomqtt's iterator "
        f"{medians['iterator']:.0f} µs per message ({shares['iterator']:.1f} % of a core), the intake "
        f"{medians['intake']:.0f} µs ({shares['intake']:.1f} %): {medians['intake'] / medians['iterator']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
