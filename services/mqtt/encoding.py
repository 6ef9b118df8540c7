"""MQTT control packets to bytes, with no I/O (the other half of `codec`).

Theory of operation: `encode` puts on the wire what the level can say:
properties and reason codes exist only at level 5, and 5.0 short forms
(PUBACK with only a packet id, DISCONNECT with nothing) are used whenever
they say the same thing. A CONNECT is always encoded at its own
`protocol_level`. `encode_publish` takes a pre-encoded topic and property
block so a node can encode one message once per subscriber with a few byte
joins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from services.mqtt.packets import (
    NO_PROPERTIES,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from services.mqtt.properties import (
    WILL,
    encode_binary,
    encode_properties,
    encode_utf8,
    encode_varint,
)

# Fixed-header flags each packet type must carry (PUBLISH is checked apart).
FIXED_FLAGS: Final = (-1, 0, 0, -1, 0, 0, 2, 0, 2, 0, 2, 0, 0, 0, 0, 0)

_T = PacketType
# A 5.0 CONNACK reason code said in 3.1.1's words, for a node that picked one.
_CONNACK_TO_3: Final = {0x84: 1, 0x85: 2, 0x88: 3, 0x89: 3, 0x86: 4, 0x8C: 4, 0x87: 5, 0x8A: 5}


def _frame(first: int, body: bytes | bytearray) -> bytes:
    n = len(body)
    if n < 0x80:
        return bytes((first, n)) + body
    return bytes((first,)) + encode_varint(n) + body


def _empty(props: Properties) -> bool:
    return props is NO_PROPERTIES or props == NO_PROPERTIES


def encode_publish(
    topic: bytes,
    payload: bytes,
    qos: int,
    retain: bool,
    dup: bool,
    packet_id: int | None,
    properties: bytes | None,
) -> bytes:
    """A PUBLISH from an encoded topic and (5.0) an encoded property block."""
    first = 0x30 | (qos << 1) | (0x01 if retain else 0) | (0x08 if dup else 0)
    tl = len(topic)
    if tl > 0xFFFF:
        raise ValueError("topic longer than 65535 bytes")
    if qos:
        if not packet_id:
            raise ValueError("PUBLISH with QoS > 0 needs a packet id")
        tail = topic + bytes((packet_id >> 8, packet_id & 0xFF))
    else:
        tail = topic
    if properties is not None:
        tail += properties
    rl = 2 + len(tail) + len(payload)
    if rl < 0x80:
        return bytes((first, rl, tl >> 8, tl & 0xFF)) + tail + payload
    return b"".join(
        (bytes((first,)), encode_varint(rl), bytes((tl >> 8, tl & 0xFF)), tail, payload)
    )


def encode(packet: Packet, protocol_level: int) -> bytes:
    """The bytes of `packet` as a connection at `protocol_level` says it."""
    return _ENCODERS[type(packet)](packet, protocol_level)


def _encode_publish(p: Publish, level: int) -> bytes:
    props = encode_properties(p.properties, _T.PUBLISH) if level == 5 else None
    return encode_publish(p.topic.encode(), p.payload, p.qos, p.retain, p.dup, p.packet_id, props)


def _encode_connect(p: Connect, _: int) -> bytes:
    level = p.protocol_level
    flags = 0x02 if p.clean_start else 0
    if p.will is not None:
        flags |= 0x04 | (p.will.qos << 3) | (0x20 if p.will.retain else 0)
    if p.username is not None:
        flags |= 0x80
    if p.password is not None:
        if p.username is None and level != 5:
            raise ValueError("MQTT 3.x CONNECT cannot carry a password without a user name")
        flags |= 0x40
    body = bytearray(encode_utf8("MQIsdp" if level == 3 else "MQTT"))
    body += bytes((level, flags, p.keep_alive >> 8, p.keep_alive & 0xFF))
    if level == 5:
        body += encode_properties(p.properties, _T.CONNECT)
    body += encode_utf8(p.client_id)
    if p.will is not None:
        if level == 5:
            body += encode_properties(p.will.properties, WILL)
        body += encode_utf8(p.will.topic)
        body += encode_binary(p.will.payload)
    if p.username is not None:
        body += encode_utf8(p.username)
    if p.password is not None:
        body += encode_binary(p.password)
    return _frame(0x10, body)


def _encode_connack(p: Connack, level: int) -> bytes:
    if level != 5:
        code = _CONNACK_TO_3.get(p.reason_code, 3) if p.reason_code >= 0x80 else p.reason_code
        present = p.session_present and level == 4
        return bytes((0x20, 2, 1 if present else 0, code))
    body = bytes((1 if p.session_present else 0, p.reason_code))
    return _frame(0x20, body + encode_properties(p.properties, _T.CONNACK))


def _encode_ack(p: Puback | Pubrec | Pubrel | Pubcomp, level: int) -> bytes:
    ptype = _PACKET_TYPE[type(p)]
    first = (ptype << 4) | FIXED_FLAGS[ptype]
    pid = bytes((p.packet_id >> 8, p.packet_id & 0xFF))
    if level != 5 or (not p.reason_code and _empty(p.properties)):
        return bytes((first, 2)) + pid
    if _empty(p.properties):
        return bytes((first, 3)) + pid + bytes((p.reason_code,))
    return _frame(first, pid + bytes((p.reason_code,)) + encode_properties(p.properties, ptype))


def _encode_subscribe(p: Subscribe, level: int) -> bytes:
    body = bytearray((p.packet_id >> 8, p.packet_id & 0xFF))
    if level == 5:
        body += encode_properties(p.properties, _T.SUBSCRIBE)
    for s in p.subscriptions:
        body += encode_utf8(s.topic_filter)
        options = s.qos
        if level == 5:
            options |= (
                (4 if s.no_local else 0)
                | (8 if s.retain_as_published else 0)
                | (s.retain_handling << 4)
            )
        body.append(options)
    return _frame(0x82, body)


def _encode_suback(p: Suback, level: int) -> bytes:
    body = bytearray((p.packet_id >> 8, p.packet_id & 0xFF))
    if level == 5:
        body += encode_properties(p.properties, _T.SUBACK)
        body += bytes(p.reason_codes)
    else:
        body += bytes(c if c < 0x80 else 0x80 for c in p.reason_codes)
    return _frame(0x90, body)


def _encode_unsubscribe(p: Unsubscribe, level: int) -> bytes:
    body = bytearray((p.packet_id >> 8, p.packet_id & 0xFF))
    if level == 5:
        body += encode_properties(p.properties, _T.UNSUBSCRIBE)
    for topic_filter in p.topic_filters:
        body += encode_utf8(topic_filter)
    return _frame(0xA2, body)


def _encode_unsuback(p: Unsuback, level: int) -> bytes:
    body = bytearray((p.packet_id >> 8, p.packet_id & 0xFF))
    if level == 5:
        body += encode_properties(p.properties, _T.UNSUBACK)
        body += bytes(p.reason_codes)
    return _frame(0xB0, body)


def _encode_pingreq(p: Pingreq, level: int) -> bytes:
    return b"\xc0\x00"


def _encode_pingresp(p: Pingresp, level: int) -> bytes:
    return b"\xd0\x00"


def _encode_disconnect(p: Disconnect | Auth, level: int) -> bytes:
    ptype = _PACKET_TYPE[type(p)]
    first = ptype << 4
    if level != 5:
        if ptype == _T.AUTH:
            raise ValueError(f"AUTH does not exist at protocol level {level}")
        return b"\xe0\x00"
    if _empty(p.properties):
        return bytes((first, 0)) if not p.reason_code else bytes((first, 1, p.reason_code))
    return _frame(first, bytes((p.reason_code,)) + encode_properties(p.properties, ptype))


_PACKET_TYPE: Final[dict[type[Any], int]] = {
    Puback: _T.PUBACK,
    Pubrec: _T.PUBREC,
    Pubrel: _T.PUBREL,
    Pubcomp: _T.PUBCOMP,
    Disconnect: _T.DISCONNECT,
    Auth: _T.AUTH,
}

_ENCODERS: Final[dict[type[Any], Callable[[Any, int], bytes]]] = {
    Connect: _encode_connect,
    Connack: _encode_connack,
    Publish: _encode_publish,
    Puback: _encode_ack,
    Pubrec: _encode_ack,
    Pubrel: _encode_ack,
    Pubcomp: _encode_ack,
    Subscribe: _encode_subscribe,
    Suback: _encode_suback,
    Unsubscribe: _encode_unsubscribe,
    Unsuback: _encode_unsuback,
    Pingreq: _encode_pingreq,
    Pingresp: _encode_pingresp,
    Disconnect: _encode_disconnect,
    Auth: _encode_disconnect,
}
