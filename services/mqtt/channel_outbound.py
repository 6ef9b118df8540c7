"""Shaping an outgoing PUBLISH for one subscriber connection.

Theory of operation: the node hands the channel a routed `Message`; the
channel turns it into the PUBLISH this client gets. Three MQTT 5 rules
apply here, in this order:

1. Message expiry (3.3.2.3.3): a message whose expiry has passed before
   onward delivery started is dropped; otherwise the PUBLISH carries the
   remaining interval in whole seconds, rounded up.
2. Topic alias (3.3.2.3.4), only if the client's CONNECT allowed aliases:
   the first `topic_alias_maximum` distinct topics get aliases 1..N; a
   topic seen before goes out with an empty topic name and its alias.
   Aliases are never reassigned, so no mapping can go stale.
3. Maximum packet size (3.1.2.11.4): a PUBLISH larger than the client's
   limit is discarded as if it had been delivered. The size is computed
   after the alias (which shrinks it); a new alias is only committed when
   the PUBLISH is actually sent.
"""

from __future__ import annotations

from dataclasses import replace

from services.mqtt.actions import Acked, Action, Dropped, Received, Send
from services.mqtt.packets import (
    NO_PROPERTIES,
    Message,
    PacketType,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
)
from services.mqtt.properties import encode_properties

EXPIRED = Dropped("expired")
TOO_LARGE = Dropped("too_large")


def _varint_len(value: int) -> int:
    n = 1
    while value >= 0x80:
        value >>= 7
        n += 1
    return n


def publish_size(publish: Publish, with_properties: bool) -> int:
    """Bytes the PUBLISH takes on the wire (fixed header included)."""
    remaining = 2 + len(publish.topic.encode("utf-8")) + len(publish.payload)
    if publish.qos:
        remaining += 2
    if with_properties:
        props = publish.properties
        remaining += 1 if props is NO_PROPERTIES else len(
            encode_properties(props, PacketType.PUBLISH)
        )
    return 1 + _varint_len(remaining) + remaining


def remaining_expiry_s(expires_at_ms: int, now_ms: int) -> int:
    """Whole seconds left, rounded up; 0 when already expired."""
    return max(0, -((now_ms - expires_at_ms) // 1000))


class OutboundShaper:
    """Per-connection outgoing PUBLISH shaping (topic aliases, size, expiry)."""

    __slots__ = ("_alias_maximum", "_aliases", "_max_size", "_v5")

    def __init__(self, v5: bool, alias_maximum: int, max_packet_size: int | None) -> None:
        self._v5 = v5
        self._alias_maximum = alias_maximum if v5 else 0
        self._max_size = max_packet_size
        # topic -> alias; None for a client that takes none (3.x: all of them)
        self._aliases: dict[str, int] | None = {} if self._alias_maximum else None

    def aliased(self, alias: int) -> str | None:
        """The topic `alias` stands for on this connection (None: not set)."""
        if self._aliases is None:
            return None
        for topic, known in self._aliases.items():  # at most topic_alias_maximum
            if known == alias:
                return topic
        return None

    def shape(
        self, message: Message, packet_id: int | None, dup: bool, now_ms: int
    ) -> Publish | Dropped:
        """The PUBLISH to send, or why the message must be dropped (expired
        before delivery started, or too large for the client)."""
        props = message.properties
        if message.expires_at_ms is not None:
            left = remaining_expiry_s(message.expires_at_ms, now_ms)
            if left == 0 and not dup:
                return EXPIRED
            if self._v5:
                props = replace(props, message_expiry_interval=left)
        elif props.message_expiry_interval is not None:
            props = replace(props, message_expiry_interval=None)
        if props.topic_alias is not None:
            props = replace(props, topic_alias=None)

        topic = message.topic
        new_alias = False
        aliases = self._aliases
        alias = aliases.get(topic) if aliases is not None else None
        if alias is None and aliases is not None and len(aliases) < self._alias_maximum:
            alias, new_alias = len(aliases) + 1, True
        if alias is not None:
            props = replace(props, topic_alias=alias)
            if not new_alias:
                topic = ""

        publish = Publish(
            topic=topic,
            payload=message.payload,
            qos=message.qos,
            retain=message.retain,
            dup=dup and message.qos > 0,
            packet_id=packet_id,
            properties=props if self._v5 else NO_PROPERTIES,
        )
        if self._max_size is not None and publish_size(publish, self._v5) > self._max_size:
            return TOO_LARGE
        if new_alias and alias is not None and aliases is not None:
            aliases[message.topic] = alias
        return publish



PUBACK_STAGE, PUBREC_STAGE, STORING_STAGE, PUBCOMP_STAGE = 1, 2, 3, 4
"""Outgoing stages; STORING: PUBREC in, PUBREL waits for the node's store."""


class OutboundStages:
    """Each outgoing QoS 1/2 packet id's stage. PUBACK / PUBCOMP become
    `Acked`; a PUBREC becomes `Received` only: the node sends the PUBREL once
    its store holds the message as released (`released`)."""

    __slots__ = ("_stages",)

    def __init__(self) -> None:
        # packet id -> stage; made with the first QoS 1/2 message out (an empty dict is
        # 64 bytes, and most idle connections never get one)
        self._stages: dict[int, int] | None = None

    @property
    def in_flight(self) -> int:
        return len(self._stages) if self._stages is not None else 0

    def _made(self) -> dict[int, int]:
        if self._stages is None:
            self._stages = {}
        return self._stages

    def sent(self, packet_id: int, qos: int) -> None:
        self._made()[packet_id] = PUBACK_STAGE if qos == 1 else PUBREC_STAGE

    def released(self, packet_id: int) -> None:
        self._made()[packet_id] = PUBCOMP_STAGE

    def on_ack(self, pid: int, stage: int) -> list[Action]:
        stages = self._stages
        if stages is None or stages.get(pid) != stage:
            return []
        del stages[pid]
        return [Acked(pid)]

    def on_pubrec(self, p: Pubrec, v5: bool) -> list[Action]:
        pid = p.packet_id
        stages = self._made()
        stage = stages.get(pid)
        if stage == PUBREC_STAGE:
            if p.reason_code >= ReasonCode.UNSPECIFIED_ERROR:
                del stages[pid]
                return [Acked(pid)]
            stages[pid] = STORING_STAGE
            return [Received(pid)]
        if stage == STORING_STAGE:
            return []  # the PUBREL follows once the node has stored the first PUBREC
        if stage == PUBCOMP_STAGE or not v5:
            return [Send(Pubrel(pid))]
        return [Send(Pubrel(pid, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))]
