"""MQTT plumbing shared by the agent and the optimizer: client construction from settings, and the agent's
publishing link (birth and state on every connect, the last will, queued windows at QoS 1, reconnect with
jittered exponential backoff, windows sent again when the optimizer asks for ones it never received)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable

import aiomqtt
import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.backoff import Backoff
from agent.config import MqttSettings
from agent.pacing import Pacer
from agent.protocol import (
    NODE_TOPIC_KINDS,
    Birth,
    NodeStatus,
    Resend,
    State,
    TopicKind,
    encode,
    node_topic,
    resend_topic,
)
from agent.spool import WindowQueue

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT_S = 10.0


def _read_loss_when_it_comes(client: aiomqtt.Client) -> None:
    """Have the loss of ``client``'s connection read when it comes, whoever waits at that moment.

    aiomqtt records a connection lost after CONNACK as an exception in a future that only a waiter on the whole
    connection reads. Lost while a SUBSCRIBE or PUBLISH waits for its acknowledgement (a broker that drops the
    connection without a word), the call's own timeout reports it instead; the future is never read, and asyncio
    logs it with a traceback as "Future exception was never retrieved" once the client is collected. The future
    made with the client is the one a connection's loss is recorded in (aiomqtt replaces it on connecting only when
    the loss came already, between CONNACK and the end of ``async with``)."""
    lost = getattr(client, "_disconnected", None)
    if isinstance(lost, asyncio.Future):  # an aiomqtt that keeps it elsewhere costs a log line, never a connection
        lost.add_done_callback(lambda f: None if f.cancelled() else f.exception())


def make_client(
    settings: MqttSettings,
    identifier: str,
    will: aiomqtt.Will | None = None,
    max_queued_incoming: int | None = None,
    max_packet_size: int | None = None,
) -> aiomqtt.Client:
    """An aiomqtt client configured from ``settings``; connect it with ``async with``. The loss of its connection is
    read whenever it comes (see ``_read_loss_when_it_comes``)."""
    tls_context = None
    if settings.tls:
        tls_context = ssl.create_default_context(cafile=str(settings.ca_file) if settings.ca_file else None)
        if settings.cert_file and settings.key_file:
            tls_context.load_cert_chain(str(settings.cert_file), str(settings.key_file))
    v5 = settings.protocol == "5"
    protocol = aiomqtt.ProtocolVersion.V5 if v5 else aiomqtt.ProtocolVersion.V311
    # A persistent session lets the broker queue QoS 1 messages while this client restarts.
    persistent = settings.session_expiry > 0
    properties = None
    if persistent and v5:
        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.SessionExpiryInterval = settings.session_expiry
    if max_packet_size and v5:  # the broker then never forwards this client a larger packet
        properties = properties or Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.MaximumPacketSize = max_packet_size
    client = aiomqtt.Client(
        settings.host,
        settings.port,
        username=settings.username,
        password=settings.password.get_secret_value() if settings.password else None,
        identifier=identifier,
        protocol=protocol,
        will=will,
        keepalive=settings.keepalive,
        tls_context=tls_context,
        timeout=PUBLISH_TIMEOUT_S,
        max_queued_incoming_messages=max_queued_incoming,
        clean_session=False if persistent and not v5 else None,
        # MQTT 3.1.1 has no clean start (paho refuses one): its persistent session is clean_session=False
        clean_start=False if persistent and v5 else mqtt.MQTT_CLEAN_START_FIRST_ONLY,
        properties=properties,
    )
    _read_loss_when_it_comes(client)
    return client


def _raise_if_cancelled() -> None:
    """Python 3.11's asyncio.wait_for (inside aiomqtt's publish) swallows a cancellation that arrives as the
    acknowledgement does; the task is still marked cancelling, and a loop must end there rather than wait on."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def stop_tasks(tasks: set[asyncio.Task[None]] | list[asyncio.Task[None]], every: float = 0.5) -> None:
    """Cancel ``tasks`` and wait until each has ended, cancelling again any that swallowed the cancellation."""
    for task in tasks:
        task.cancel()
    pending = {t for t in tasks if not t.done()}
    while pending:
        _, pending = await asyncio.wait(pending, timeout=every)
        for task in pending:
            task.cancel()
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: an error of a task being stopped is no news


class Link:
    """Keeps one node's MQTT session up and drains its window queue into it.

    Each (re)connect publishes the retained birth and ``online`` state; the broker publishes the retained
    ``offline`` last will if the connection dies. A window leaves the queue only once the broker has
    acknowledged it (QoS 1 PUBACK), so a connection lost mid-publish resends rather than loses it.
    """

    def __init__(
        self,
        settings: MqttSettings,
        site: str,
        node: str,
        session: int,
        birth: Callable[[], Birth],
        queue: WindowQueue,
        clock: Callable[[], float],
        pacer: Pacer | None = None,
    ) -> None:
        self._settings = settings
        self._pacer = pacer
        self._node = node
        self._session = session
        self._birth = birth
        self._clock = clock
        self.queue = queue
        self._topics = {k: node_topic(settings.prefix, site, node, k) for k in NODE_TOPIC_KINDS}
        self._resend_topic = resend_topic(settings.prefix, site, node)
        # The broker binds client ids to accounts (use_username_as_clientid): the id is the username, which is the
        # node's own name, so no node can take over another's session.
        self.client_id = settings.username or node
        self.connected = asyncio.Event()
        self.published = 0
        self.connects = 0
        self.resent = 0  # windows queued again because the optimizer asked for them
        self.last_error: str | None = None  # why the latest connection attempt failed or was lost
        self._backoff = Backoff(cap=settings.reconnect_max_delay)
        self._client: aiomqtt.Client | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def republish_birth(self) -> None:
        """Publish the birth again now (the inventory changed); without a connection the next connect does."""
        client = self._client
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a one-shot run): nothing is connected either
            return
        if client is None:
            return
        payload = encode(self._birth())

        async def publish() -> None:
            try:
                await client.publish(self._topics[TopicKind.BIRTH], payload, qos=1, retain=True)
            except aiomqtt.MqttError as exc:
                log.info("birth not re-published (%s); the next connect publishes it", exc)

        task = loop.create_task(publish())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _state(self, status: NodeStatus) -> bytes:
        return encode(State(node=self._node, session=self._session, status=status, timestamp=self._clock()))

    async def run(self) -> None:
        """Connect, publish, reconnect on failure, whatever the failure (a broker gone, a CA file unreadable for a
        moment); runs until cancelled."""
        will = aiomqtt.Will(self._topics[TopicKind.STATE], self._state(NodeStatus.OFFLINE), qos=1, retain=True)
        while True:
            try:
                async with make_client(self._settings, self.client_id, will) as client:
                    self._client = client
                    await client.publish(self._topics[TopicKind.BIRTH], encode(self._birth()), qos=1, retain=True)
                    await client.publish(
                        self._topics[TopicKind.STATE], self._state(NodeStatus.ONLINE), qos=1, retain=True
                    )
                    await client.subscribe(self._resend_topic, qos=1)
                    self.connects += 1
                    self._backoff.reset()
                    self.connected.set()
                    log.info("connected to %s:%d as %s", self._settings.host, self._settings.port, self._node)
                    await self._serve(client)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.last_error = str(exc) or type(exc).__name__
                delay = self._backoff.next_delay()
                if not isinstance(exc, aiomqtt.MqttError | OSError):
                    log.exception("broker link failed; retrying in %.1f s", delay)
                elif not isinstance(exc, aiomqtt.MqttError):  # the agent's own side: a CA or key file unreadable
                    log.warning("cannot connect to the broker (%s); retrying in %.1f s", self.last_error, delay)
                elif self.connected.is_set():
                    log.warning("broker connection lost (%s); %d window(s) queued", self.last_error, len(self.queue))
                else:
                    log.info("broker unreachable (%s); retrying in %.1f s", self.last_error, delay)
                self.connected.clear()
                self._client = None
                await asyncio.sleep(delay)

    async def _serve(self, client: aiomqtt.Client) -> None:
        """Drain the queue and listen for requests until either ends: a connection that drops while the queue is
        empty is noticed by the listener at once, not at the next window."""
        tasks = {
            asyncio.create_task(self._drain(client), name=f"drain-{self._node}"),
            asyncio.create_task(self._listen(client), name=f"resend-{self._node}"),
        }
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await stop_tasks(tasks)
        for task in done:
            if not task.cancelled() and (error := task.exception()) is not None:
                raise error
        raise aiomqtt.MqttError("the connection ended")

    async def _listen(self, client: aiomqtt.Client) -> None:
        """Queue again the windows the optimizer asks for (the only messages this node may read)."""
        async for message in client.messages:
            payload = message.payload
            if str(message.topic) != self._resend_topic or not isinstance(payload, bytes | bytearray):
                continue
            try:
                request = Resend.model_validate_json(payload)
            except ValueError as exc:
                log.warning("ignoring a malformed resend request: %s", str(exc).splitlines()[0])
                continue
            if request.node != self._node:
                continue
            count = self.queue.resend(request.windows)
            self.resent += count
            asked = sum(last - first + 1 for _, first, last in request.windows)
            log.info("the optimizer missed %d window(s); %d still kept are sent again", asked, count)

    async def _drain(self, client: aiomqtt.Client) -> None:
        while True:
            head = self.queue.peek()
            if head is None:
                await self.queue.wait()
                continue
            token, payload = head
            if self._pacer is not None:
                await self._pacer.take()
            await client.publish(self._topics[TopicKind.TELEMETRY], payload, qos=1)
            self.queue.pop(token)
            self.published += 1
            _raise_if_cancelled()

    async def say_goodbye(self) -> None:
        """Publish the retained ``offline`` state on a clean shutdown (the will covers unclean ones)."""
        if self._client is not None and self.connected.is_set():
            try:
                await self._client.publish(
                    self._topics[TopicKind.STATE],
                    self._state(NodeStatus.OFFLINE),
                    qos=1,
                    retain=True,
                    timeout=2.0,
                )
            except aiomqtt.MqttError as exc:
                log.info("could not publish offline state: %s", exc)
