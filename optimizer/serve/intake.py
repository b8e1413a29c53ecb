"""Taking the broker's messages in: read in batches, handled as they are read, acknowledged after.

aiomqtt reads one packet each time the socket turns readable, hands it to an asyncio queue and wakes a task
per message; each acknowledgement is written on a later round of the event loop, after a thread-safe wake-up.
At a fleet's rate (a 10 s window from each node, arriving one at a time) that cost more than validating the
window: ~670 µs of CPU per 5.8 KiB message at 300 a second, against ~180 µs taken as here (``bench/intake.py``).
Most of it is the wake-ups, each with a cold cache.

Here every packet the socket holds is read at once, each message handled right there (no queue, no task) and
acknowledged once handled, and the acknowledgements are written together in the same round. After a round of
few messages the socket is left alone for a moment, so that the next round finds several: the pause aims at
``GATHER`` messages at the recent rate and never exceeds ``MAX_PAUSE``. Every round has a fixed cost beyond its
messages (the wake-up, the reader's registration, the timer, a write of acknowledgements, caches refilled), so
pausing for ~24 messages took each one in for about half the CPU of pausing for ~8 (63-76 µs against 148-161
at 200 a second: ``bench/intake.py --rate 200``, docs/benchmarks.md).

A round of ``BATCH`` or more reads on at once, with no pause: a broker that holds back deliveries for want of
acknowledgements must never be kept waiting. ``BATCH`` is below every broker's default window of unacknowledged
deliveries to a client (Mosquitto's ``max_inflight_messages``, 20 by default per mosquitto.conf(5), for MQTT 3.1.1
clients; EMQX the smaller of its ``max_inflight`` and an MQTT 5 client's Receive Maximum, 65,535 unless set, per
its "In-flight and Message Queue" page), so a round cut short by the window is always followed by the next at
once; ``GATHER`` may exceed the window, as it only sizes the pause.

This leans on aiomqtt's and paho's internals (the paho client inside aiomqtt, its packet reader, its
write-registration hook); ``tests/test_intake.py`` holds it to a real broker, so an upgrade that changes them
fails there.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import aiomqtt
import paho.mqtt.client as mqtt

log = logging.getLogger(__name__)

BATCH = 8  # a round of this many reads on at once: below any broker's default window (see above)
GATHER = 24  # messages a pause after a smaller round aims to let arrive
MAX_PAUSE = 0.15  # seconds the socket may wait after a quiet round: added to ingest lag at most
MAX_ROUND = 256  # packets read in one round before other work on the event loop gets its turn
RATE_SPAN = 0.1  # seconds, at least, that the arrival rate is counted over

Handler = Callable[[str, bytes | bytearray], None]
WriteHook = Callable[[mqtt.Client, Any, Any], None]


class Intake:
    """Messages of one aiomqtt client, handed to ``handle(topic, payload)`` as they are read and acknowledged
    once it returns (QoS 1: an unread message is delivered again after a restart). Install before connecting,
    ``start()`` once connected, then ``await closed()``."""

    def __init__(self, client: aiomqtt.Client, handle: Handler) -> None:
        self._client = client
        self._paho: mqtt.Client = client._client
        self._handle = handle
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._paho.manual_ack_set(True)
        self._paho.on_message = self._on_message
        registered = self._paho.on_socket_register_write  # aiomqtt's: add_writer from any thread
        if registered is None:
            raise RuntimeError("aiomqtt no longer registers writes with paho: the intake needs updating")
        self._registered: WriteHook = registered
        self._paho.on_socket_register_write = self._register_write
        self._sock: Any = None
        self._stopped = False
        self._span_start = 0.0
        self._span_messages = 0
        self.rate = 0.0  # messages a second, over the latest RATE_SPAN
        self.rounds = 0  # reads of the socket
        self.pauses = 0
        self.paused_seconds = 0.0  # asked for, in all
        self.messages = 0
        self.failures = 0  # messages whose handler raised (the handler counts and logs its own)

    def start(self) -> None:
        """Read the connected socket in rounds from now on (in place of aiomqtt's reader)."""
        sock = self._paho.socket()
        if sock is None:
            raise aiomqtt.MqttError("not connected")
        self._sock = sock
        self._span_start = time.monotonic()
        self._loop.add_reader(sock.fileno(), self._round)

    def stop(self) -> None:
        """Take nothing more in: messages read from now on stay unacknowledged, for the next session to take.
        The socket is still read, for the acknowledgements of what the client publishes meanwhile."""
        self._stopped = True

    async def closed(self) -> None:
        """Wait until the connection ends; raise MqttError as aiomqtt's message iterator does."""
        disconnected: asyncio.Future[None] = self._client._disconnected
        try:
            await asyncio.shield(disconnected)
        except aiomqtt.MqttError:
            raise
        except Exception as exc:  # a broken pipe met while reading
            raise aiomqtt.MqttError(f"connection lost: {exc}") from exc
        raise aiomqtt.MqttError("disconnected")

    def _on_message(self, paho: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        if self._stopped:
            return  # read by paho while the connection closes: delivered again, to the next session
        try:
            topic = message.topic
        except UnicodeDecodeError:  # brokers check topics are UTF-8; one that does not costs only its message
            topic = ""
        try:
            self._handle(topic, message.payload)
        except Exception:  # the handler counts its own failures; one that escapes must not end paho's reading
            self.failures += 1
            if self.failures <= 5 or self.failures % 1000 == 0:
                log.exception("message on %r: its handler raised (%d so far)", topic[:200], self.failures)
        finally:
            self.messages += 1
            if message.qos:
                paho.ack(message.mid, message.qos)

    def _round(self) -> None:
        """Every packet the socket holds, then a pause when they were few."""
        paho, sock = self._paho, self._sock
        if sock is None or paho.socket() is not sock:
            return  # closed meanwhile (aiomqtt removed the reader then)
        before = self.messages
        try:
            for _ in range(MAX_ROUND):
                rc = paho._packet_read()
                if rc == mqtt.MQTT_ERR_AGAIN:
                    break
                if rc > 0:
                    paho._loop_rc_handle(rc)  # closes the socket and tells aiomqtt, as paho's loop_read does
                    return
            else:  # more waits, perhaps inside TLS where the socket will not say so: read on next round
                self._loop.call_soon(self._round)
        except Exception as exc:  # a broken pipe and the like: the connection is gone, as aiomqtt treats it
            if not self._client._disconnected.done():
                self._client._disconnected.set_exception(exc)
            return
        self.rounds += 1
        now = time.monotonic()
        taken = self.messages - before
        # counted over a span, not per round: a round that reads on right after a large one took a message or
        # two in microseconds, and a per-round rate would take that for the fleet's
        self._span_messages += taken
        span = now - self._span_start
        if span >= RATE_SPAN:
            self.rate = self._span_messages / span
            self._span_start, self._span_messages = now, 0
        if taken >= BATCH or self.rate <= 0:
            return
        pause = min(MAX_PAUSE, GATHER / self.rate)
        self.pauses += 1
        self.paused_seconds += pause
        fd: int = self._sock.fileno()
        self._loop.remove_reader(fd)
        self._loop.call_later(pause, self._resume, self._sock)

    def _resume(self, sock: Any) -> None:
        current = self._paho.socket()
        if current is not None and current is sock:  # not closed (nor its descriptor reused) during the pause
            self._loop.add_reader(current.fileno(), self._round)
            self._round()

    def _register_write(self, paho: mqtt.Client, userdata: object, sock: Any) -> None:
        """Something to send: on the event loop's thread it is written at the end of this round, together with
        what else the round queues; from another thread (connecting) aiomqtt's way."""
        if threading.get_ident() != self._thread:
            self._registered(paho, userdata, sock)
        else:
            self._loop.call_soon(self._write, paho, userdata, sock)

    def _write(self, paho: mqtt.Client, userdata: object, sock: Any) -> None:
        try:
            paho.loop_write()
        except Exception:  # aiomqtt's writer meets the same failure and ends the connection
            self._registered(paho, userdata, sock)
            return
        if paho.want_write():  # the socket is full: wait until it is writable
            self._registered(paho, userdata, sock)
