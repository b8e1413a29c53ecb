"""MQTT plumbing shared by the agent and the optimizer: client construction from settings, and the agent's
publishing link (birth and state on every connect, the last will, queued windows at QoS 1, reconnect with
jittered exponential backoff, windows sent again when the optimizer asks for ones it never received)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import Counter
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import aiomqtt
import paho.mqtt.client as mqtt
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from agent.backoff import Backoff
from agent.config import MqttSettings
from agent.metrics import Family, labelled
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
NOT_AUTHORIZED = 0x87  # MQTT 5 reason code 135 (OASIS MQTT 5.0, section 2.4): the broker's ACL refused the topic
# the message id paho gave the latest publish of the task that reads it (aiomqtt's publish does not return it)
_MID: ContextVar[int | None] = ContextVar("fleetfit_publish_mid", default=None)


def reason_label(text: str) -> str:
    """A metric label for a reason the broker or TLS gave: ``Not authorized`` -> ``not_authorized``."""
    return "_".join("".join(c if c.isalnum() else " " for c in text.lower()).split())[:40] or "unknown"


class PublishRefused(aiomqtt.MqttError):
    """The broker answered a QoS 1 publish with a failure (an MQTT 5 PUBACK reason code of 0x80 or above): it
    took the message and dropped it, most often because its ACL does not let this client publish there."""

    def __init__(self, topic: str, reason: ReasonCode) -> None:
        self.topic = topic
        self.code = int(reason.value)
        self.reason = str(reason)
        super().__init__(f"the broker refused the publish to {topic}: {self.reason} (reason code {self.code})")


class Client(aiomqtt.Client):
    """aiomqtt's client that keeps the broker's answer to each publish: aiomqtt waits for the PUBACK but drops
    its reason code, so a publish the broker refused would read as delivered (``publish_confirmed`` raises)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refusals: dict[int, ReasonCode] = {}
        publish = self._client.publish

        def publish_noting_mid(*a: Any, **k: Any) -> mqtt.MQTTMessageInfo:
            info = publish(*a, **k)
            _MID.set(info.mid)  # in the caller's task: aiomqtt's publish runs in it, without a task of its own
            return info

        self._client.publish = publish_noting_mid  # type: ignore[method-assign]

    def _on_publish(
        self, client: mqtt.Client, userdata: Any, mid: int, reason_code: ReasonCode, properties: Properties
    ) -> None:
        # the latest answer for a message id: ids are reused, and a publish nobody confirmed leaves its answer here
        if reason_code.is_failure:
            self._refusals[mid] = reason_code
        else:
            self._refusals.pop(mid, None)
        super()._on_publish(client, userdata, mid, reason_code, properties)

    async def publish_confirmed(self, topic: str, payload: bytes, retain: bool = False) -> None:
        """Publish at QoS 1 and wait for the broker's acknowledgement; PublishRefused when it refused the message
        (MQTT 5 only: a 3.1.1 PUBACK carries no reason, and such a broker drops a refused publish unsaid)."""
        _MID.set(None)
        try:
            await self.publish(topic, payload, qos=1, retain=retain)
        finally:
            mid = _MID.get()
            refused = self._refusals.pop(mid, None) if mid is not None else None
        if refused is not None:
            raise PublishRefused(topic, refused)


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
) -> Client:
    """An aiomqtt client configured from ``settings``; connect it with ``async with``. The loss of its connection is
    read whenever it comes (see ``_read_loss_when_it_comes``), and ``publish_confirmed`` says whether the broker took
    a message."""
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
    client = Client(
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


# CONNACK reason codes that retrying cannot mend, only the broker's accounts or this node's settings (OASIS MQTT 5.0,
# section 3.2.2.2): unsupported protocol, client id not valid, bad user name or password, not authorized, banned,
# bad authentication method; and MQTT 3.1.1's (section 3.2.2.3) 1, 2, 4 and 5, which paho gives as the same codes
REFUSING_CONNACK = {0x84, 0x85, 0x86, 0x87, 0x8A, 0x8C}
_HINTS = {
    0x85: "the broker binds client ids to accounts: is [mqtt] username this node's account?",
    0x86: "check [mqtt] username and password (or password_file) against the broker's password file",
    # Mosquitto answers a wrong password with this one too
    0x87: "check [mqtt] username and password (or password_file): the broker refuses this account or its password",
    0x8A: "the broker has banned this client",
}


def refusal(exc: BaseException) -> tuple[str, str, str] | None:
    """(metric label, reason, what to check) when the broker or TLS refused this client: its credentials, its account,
    the broker's certificate. None for a failure that retrying alone may mend (a broker away, a network down)."""
    if isinstance(exc, MqttConnectError) and isinstance(exc.rc, ReasonCode):
        if exc.rc.value in REFUSING_CONNACK:
            why = str(exc.rc)
            return reason_label(why), why, _HINTS.get(exc.rc.value, "check the broker's accounts and [mqtt] settings")
        return None
    cause = exc if isinstance(exc, ssl.SSLError) else exc.__context__  # aiomqtt raises MqttError from None
    if isinstance(cause, ssl.SSLCertVerificationError):
        why = cause.verify_message or cause.reason or str(cause)
        check = "is [mqtt] ca_file the CA that signed the broker's certificate, and host a name on it?"
        return "tls_certificate", f"TLS: {why}", check
    if isinstance(cause, ssl.SSLError):
        check = "check [mqtt] tls, ca_file, cert_file and key_file against the broker"
        return "tls", f"TLS: {cause.reason or cause}", check
    return None


def raise_if_cancelled() -> None:
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
        self.publishes_refused: Counter[str] = Counter()  # publishes the broker refused, by reason
        self.connects_refused: Counter[str] = Counter()  # connections the broker or TLS refused, by reason
        self._backoff = Backoff(cap=settings.reconnect_max_delay)
        # a publish was refused and none taken since: a connect alone does not reset the backoff, or a node the ACL
        # refuses would reconnect and be refused again twice a second
        self._refusing = False
        self._client: Client | None = None
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
                await client.publish_confirmed(self._topics[TopicKind.BIRTH], payload, retain=True)
            except PublishRefused as exc:
                self._refused(exc, 0.0)
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
                    await client.publish_confirmed(self._topics[TopicKind.BIRTH], encode(self._birth()), retain=True)
                    await client.publish_confirmed(
                        self._topics[TopicKind.STATE], self._state(NodeStatus.ONLINE), retain=True
                    )
                    await client.subscribe(self._resend_topic, qos=1)
                    self.connects += 1
                    if not self._refusing:
                        self._backoff.reset()
                    self.connected.set()
                    log.info("connected to %s:%d as %s", self._settings.host, self._settings.port, self._node)
                    await self._serve(client)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.last_error = str(exc) or type(exc).__name__
                delay = self._backoff.next_delay()
                refused = refusal(exc)
                if isinstance(exc, PublishRefused):
                    self._refused(exc, delay)
                elif refused is not None:  # retried (an account minted, a certificate renewed), never in silence
                    label, reason, check = refused
                    self.last_error = reason
                    self.connects_refused[label] += 1
                    log.error(
                        "the broker refused node %s's connection to %s:%d: %s — %s; retrying in %.1f s",
                        self._node,
                        self._settings.host,
                        self._settings.port,
                        reason,
                        check,
                        delay,
                    )
                elif not isinstance(exc, aiomqtt.MqttError | OSError):
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

    async def _serve(self, client: Client) -> None:
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

    async def _drain(self, client: Client) -> None:
        while True:
            head = self.queue.peek()
            if head is None:
                await self.queue.wait()
                continue
            token, payload = head
            if self._pacer is not None:
                await self._pacer.take()
            await client.publish_confirmed(self._topics[TopicKind.TELEMETRY], payload)
            self.queue.pop(token)
            self.published += 1
            if self._refusing:
                self._refusing = False
                self._backoff.reset()
            raise_if_cancelled()

    def refusal_metrics(self) -> list[Family]:
        return [
            labelled(
                "fleetfit_agent_publishes_refused_total",
                "counter",
                "Publishes the broker refused (an MQTT 5 PUBACK reason code of 0x80 or above), by reason; the window "
                "stays spooled.",
                "reason",
                self.publishes_refused,
            ),
            labelled(
                "fleetfit_agent_broker_refused_total",
                "counter",
                "Connections the broker or TLS refused (credentials, account, certificate), by reason.",
                "reason",
                self.connects_refused,
            ),
        ]

    def _refused(self, exc: PublishRefused, delay: float) -> None:
        """Count and tell a publish the broker refused; what it carried stays queued (a window stays spooled)."""
        self._refusing = True
        self.last_error = str(exc)
        self.publishes_refused[reason_label(exc.reason)] += 1
        hint = (
            " — is [agent] site the site its credentials were minted for?"
            if exc.code == NOT_AUTHORIZED
            else " — see the broker's log for why"
        )
        log.error(
            "the broker refused node %s's publish to %s: %s%s; %d window(s) kept in the spool%s",
            self._node,
            exc.topic,
            exc.reason.lower(),
            hint,
            len(self.queue),
            f", retrying in {delay:.1f} s" if delay else "",
        )

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
