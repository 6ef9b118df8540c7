"""Inbound PUBLISH: topic aliases, limits, and the QoS 1 / QoS 2 receiver flows.

Theory of operation: a QoS 1 or 2 PUBLISH becomes a `Route` with a token;
its PUBACK / PUBREC waits for the node's `routed(token, ...)`. An incoming
QoS 2 packet id stays "awaiting PUBREL" from a successful route until
PUBREL, which yields `Released` + PUBCOMP; a repeat of such a PUBLISH is
answered with PUBREC and not routed again (exactly once).

Receive Maximum. A 5.0 client that sends more QoS 1/2 PUBLISHes than the
Receive Maximum we announced is not disconnected by default (MQTT.js 5 does
not hold back to it): `full` tells the node to stop reading the connection
while routes in progress (acks not yet sent) are at the limit, and the acks
going out let it read on, the flow control TCP gives 3.x clients. Only routes
count: ids awaiting PUBREL wait for the client's PUBREL, which may sit behind
the very PUBLISHes we would stop reading. Those are bounded on their own by
`max_awaiting_rel` (past it PUBREC 0x97 Quota exceeded, as Mosquitto; EMQX
sends 0x93, which is not a PUBREC reason code (MQTT 5 3.5.2.1): a strict
decoder, ours or paho's, would take the packet as malformed). A 3.x client
cannot be told and has no Receive Maximum to keep to: its ids awaiting PUBREL
are bounded only by the packet id space (65,535 small integers), and a burst
of QoS 2 PUBLISHes (amqtt's, MQTT.js's) is taken whole. With
`strict_receive_maximum` the spec's count (routes plus ids awaiting PUBREL)
past the limit is DISCONNECT 0x93 and nothing pauses.

Clients may not publish to `$SYS` topics (the broker's own): the message is
dropped and acknowledged (5.0: with 0x87, Not authorized). Other `$` topics
are routed, as Mosquitto and EMQX do: device SDKs use them (AWS IoT's
`$aws/things/...`, Azure's `$iothub/...`), the spec only says SHOULD, and
wildcards at the first level never match them. A PUBLISH whose Payload Format
Indicator says UTF-8 over a payload that is not is refused on its own (PUBACK
/ PUBREC 0x99; QoS 0 dropped), not with DISCONNECT: the spec allows either,
and the connection's other messages are worth keeping. Checks that break a
MUST raise an MQTTError.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import replace

from services.mqtt.actions import Action, Released, Route, Send
from services.mqtt.channel_config import ChannelConfig
from services.mqtt.channel_errors import RetainNotSupported
from services.mqtt.errors import (
    ProtocolError,
    QosNotSupported,
    ReceiveMaximumExceeded,
    TopicAliasInvalid,
    TopicNameInvalid,
)
from services.mqtt.packets import Message, Puback, Pubcomp, Publish, Pubrec, ReasonCode
from services.mqtt.topics import validate_topic_name

RC = ReasonCode


def _is_topic_name(text: str) -> bool:
    try:
        validate_topic_name(text)
    except TopicNameInvalid:
        return False
    return True


def _refusal(topic: str, p: Publish) -> int | None:
    """Why this PUBLISH is acknowledged and dropped, or None: it is routed."""
    if topic.startswith("$SYS") and topic[4:5] in ("", "/"):
        return RC.NOT_AUTHORIZED
    if p.properties.payload_format_indicator == 1:
        try:
            p.payload.decode()
        except UnicodeDecodeError:
            return RC.PAYLOAD_FORMAT_INVALID
    return None


class InboundFlow:
    """One connection's incoming application messages."""

    __slots__ = (
        "_awaiting_rel",
        "_config",
        "_hold_at",
        "_in_aliases",
        "_next_token",
        "_routes",
        "_routing_qos2",
        "_sender",
        "_v5",
        "_wall_ms",
    )

    def __init__(
        self, config: ChannelConfig, v5: bool, sender: str, wall_ms: Callable[[], int]
    ) -> None:
        self._config = config
        self._v5 = v5
        self._sender = sender
        self._wall_ms = wall_ms
        # What most connections never use is made with its first entry (None: empty;
        # an empty dict is 64 bytes, and every idle connection held these three).
        self._in_aliases: dict[int, str] | None = None  # alias -> topic
        self._routes: dict[int, tuple[int, int]] | None = None  # token -> (qos, packet id)
        # QoS 2 packet ids as dict keys (an empty set is 216 bytes)
        self._routing_qos2: dict[int, None] | None = None
        self._next_token = 1
        self._awaiting_rel: dict[int, None] | None = None
        # Flow control holds a 5.0 client's reading at its Receive Maximum (unless the
        # node refuses past it instead: strict); nothing holds a 3.x client's.
        hold = v5 and not config.strict_receive_maximum
        self._hold_at = config.receive_maximum if hold else 1 << 32

    @property
    def inflight(self) -> int:
        awaiting = self._awaiting_rel
        routes = self._routes
        return (len(routes) if routes is not None else 0) + (
            len(awaiting) if awaiting is not None else 0)

    @property
    def full(self) -> bool:
        """Flow control: the node should read no more packets until a route ends."""
        return self._routes is not None and len(self._routes) >= self._hold_at

    def resume(self, awaiting_rel: AbstractSet[int]) -> None:
        """A resumed session's QoS 2 packet ids still awaiting PUBREL."""
        self._awaiting_rel = dict.fromkeys(awaiting_rel) if awaiting_rel else None

    def on_publish(self, p: Publish) -> list[Action]:
        # The path of every message a client sends: locals, and the rare cases
        # ($ topics, payload format, aliases, QoS 2) behind one test each.
        cfg = self._config
        pid = p.packet_id
        qos = p.qos
        props = p.properties
        if qos > cfg.max_qos:
            raise QosNotSupported(f"PUBLISH QoS {qos} > maximum QoS {cfg.max_qos}")
        if p.retain and not cfg.retain_available:
            raise RetainNotSupported("retained PUBLISH, retain is not available")
        if qos and not pid:
            raise ProtocolError(f"QoS {qos} PUBLISH without a packet id")
        topic = p.topic if props.topic_alias is None and p.topic else self._inbound_topic(p)
        validate_topic_name(topic)
        response_topic = props.response_topic
        if response_topic is not None and not _is_topic_name(response_topic):
            raise ProtocolError(f"response topic {response_topic!r} is not a topic name")
        if qos == 2:
            assert pid is not None
            awaiting = self._awaiting_rel
            if awaiting is not None and pid in awaiting:
                return [Send(self._ack(2, pid, RC.SUCCESS))]
            routing = self._routing_qos2
            if routing is not None and pid in routing:
                return []
            bound = cfg.max_awaiting_rel
            if bound and self._v5 and self._qos2_ids() >= bound:
                return [Send(Pubrec(pid, RC.QUOTA_EXCEEDED))]
        strict = qos and self._v5 and cfg.strict_receive_maximum
        if strict and self.inflight >= cfg.receive_maximum:
            raise ReceiveMaximumExceeded(f"more than {cfg.receive_maximum} QoS 1/2 in flight")
        if topic[0] == "$" or props.payload_format_indicator == 1:
            refused = _refusal(topic, p)
            if refused is not None:
                if pid is None:
                    return []
                return [Send(self._ack(qos, pid, refused if self._v5 else RC.SUCCESS))]
        if props.topic_alias is not None or props.subscription_identifier:
            props = replace(props, topic_alias=None, subscription_identifier=())
        expiry = props.message_expiry_interval
        expires_at_ms = None if expiry is None else self._wall_ms() + expiry * 1000
        message = Message(topic, p.payload, qos, p.retain, props, self._sender, expires_at_ms)
        cfg.received.add(qos, len(p.payload))
        if not qos:
            return [Route(message)]
        assert pid is not None
        token = self._next_token
        self._next_token += 1
        if self._routes is None:  # made with the first QoS 1/2 PUBLISH, kept
            self._routes = {}
        self._routes[token] = (qos, pid)
        if qos == 2:
            if self._routing_qos2 is None:
                self._routing_qos2 = {}
            self._routing_qos2[pid] = None
            return [Route(message, token, pid)]
        return [Route(message, token)]

    def _qos2_ids(self) -> int:
        """Incoming QoS 2 ids held: being routed or awaiting PUBREL."""
        awaiting, routing = self._awaiting_rel, self._routing_qos2
        return (len(awaiting) if awaiting else 0) + (len(routing) if routing else 0)

    def aliased(self, alias: int) -> str | None:
        """The topic the client set `alias` to (None: not set)."""
        return self._in_aliases.get(alias) if self._in_aliases is not None else None

    def _inbound_topic(self, p: Publish) -> str:
        alias = p.properties.topic_alias
        if alias is None:
            if not p.topic and self._v5:
                raise ProtocolError("PUBLISH with neither a topic name nor a topic alias")
            return p.topic
        if alias == 0 or alias > self._config.topic_alias_maximum:
            raise TopicAliasInvalid(
                f"topic alias {alias} outside 1..{self._config.topic_alias_maximum}"
            )
        if p.topic:
            if self._in_aliases is None:
                self._in_aliases = {}
            self._in_aliases[alias] = p.topic
            return p.topic
        topic = self.aliased(alias)
        if topic is None:
            raise ProtocolError(f"topic alias {alias} was never set")
        return topic

    def routed(
        self, token: int, ok: bool, no_subscribers: bool, reason_code: int | None
    ) -> list[Action] | None:
        """The ack for `token`'s message; None: a 3.x client must be disconnected."""
        entry = self._routes.pop(token, None) if self._routes is not None else None
        if entry is None:
            return []
        qos, pid = entry
        if qos == 2 and self._routing_qos2 is not None:
            self._routing_qos2.pop(pid, None)
        if ok:
            if qos == 2:
                if self._awaiting_rel is None:
                    self._awaiting_rel = {}
                self._awaiting_rel[pid] = None
            ok_code = RC.NO_MATCHING_SUBSCRIBERS if no_subscribers else RC.SUCCESS
            return [Send(self._ack(qos, pid, ok_code))]
        code: int = RC.UNSPECIFIED_ERROR if reason_code is None else reason_code
        if self._v5:
            return [Send(self._ack(qos, pid, code))]
        if code == RC.NOT_AUTHORIZED:
            return [Send(self._ack(qos, pid, RC.SUCCESS))]
        return None

    def _ack(self, qos: int, pid: int, code: int) -> Puback | Pubrec:
        if not self._v5:
            code = RC.SUCCESS
        return Puback(pid, code) if qos == 1 else Pubrec(pid, code)

    def on_pubrel(self, pid: int) -> list[Action]:
        awaiting = self._awaiting_rel
        if awaiting is not None and pid in awaiting:
            del awaiting[pid]
            return [Released(pid), Send(Pubcomp(pid))]
        if self._v5:
            return [Send(Pubcomp(pid, RC.PACKET_IDENTIFIER_NOT_FOUND))]
        return [Send(Pubcomp(pid))]

