"""MQTT 3.1 / 3.1.1 / 5.0 control packets to and from bytes, with no I/O.

Theory of operation: `decode` looks at a buffer that starts at a packet
boundary. It validates the fixed header's first byte as soon as it has it
(packet type allowed at this level, reserved flag bits, QoS 3, DUP on QoS 0),
then reads the remaining length and checks the maximum packet size before it
waits for the body; only once the whole packet is there does it parse it,
and returns the packet with the number of bytes it used. Anything short of a
whole packet is None ("need more data"); anything that breaks a MUST of the
spec raises an `MQTTError` carrying the reason code the node should send.
`protocol_level` is the level of the connection's CONNECT, or 0 before one:
then only CONNECT is accepted, and every CONNECT is parsed at its own level.

`encode` and `encode_publish` (the other direction) live in
`services.mqtt.encoding` and are re-exported here.

PUBLISH is the hot path on both sides: its decoding is written out inline
in `decode` and `encode_publish` takes pre-encoded topic and properties so
a node can encode one message once per subscriber with a few byte joins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from services.mqtt import reasons
from services.mqtt.encoding import FIXED_FLAGS, encode, encode_publish
from services.mqtt.errors import (
    MalformedPacket,
    PacketTooLarge,
    PayloadFormatInvalid,
    ProtocolError,
    TopicNameInvalid,
    UnsupportedProtocolLevel,
)
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
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from services.mqtt.properties import (
    VARINT_MAX,
    WILL,
    Buffer,
    add_subscription_identifiers,
    decode_properties,
    encode_properties,
    read_binary,
    read_u16,
    read_utf8,
)

__all__ = [
    "MAX_PACKET_SIZE",
    "WILL",
    "add_subscription_identifiers",
    "decode",
    "encode",
    "encode_properties",
    "encode_publish",
    "peek_connect_level",
]

MAX_PACKET_SIZE: Final = VARINT_MAX + 5
"""Largest packet MQTT can frame: 1 type byte, 4 length bytes, the body."""

_PROTOCOLS: Final = {("MQIsdp", 3), ("MQTT", 4), ("MQTT", 5)}
_T = PacketType
_NAMES: Final = {t.value: t.name for t in PacketType}  # names for messages, no enum call per packet


# --- decoding ---------------------------------------------------------------


def decode(
    buf: Buffer, protocol_level: int, max_packet_size: int = MAX_PACKET_SIZE, start: int = 0
) -> tuple[Packet, int] | None:
    """The packet at `start` in `buf` and the bytes it used, or None for more data.

    The decoders read `bytes` (compiled, an index or a slice of bytes is a C
    call; of a memoryview or bytearray, a generic one: about 0.6 us more per
    PUBLISH). Any other buffer is framed from a copy of its fixed header, and
    a whole packet is then decoded from a copy of its own bytes."""
    if type(buf) is bytes:
        return _decode(buf, start, protocol_level, max_packet_size)
    head = bytes(buf[start : start + 5])  # the fixed header, at most 5 bytes
    framed = _frame(head, 0, protocol_level, max_packet_size)
    if framed is None or len(buf) - start < framed[1]:
        return None
    return _decode(bytes(buf[start : start + framed[1]]), 0, protocol_level, max_packet_size)


def _frame(
    buf: bytes, start: int, protocol_level: int, max_packet_size: int
) -> tuple[int, int] | None:
    """The fixed header at `start`, checked: (where the variable header starts,
    where the packet ends), both in `buf`; None while the header is cut short."""
    n = len(buf)
    if start >= n:
        return None
    first = buf[start]
    ptype = first >> 4
    if ptype == 3:
        if first & 6 == 6:
            raise MalformedPacket("PUBLISH with QoS 3")
        if first & 0x0E == 0x08 and protocol_level != 3:
            raise MalformedPacket("PUBLISH with DUP set on QoS 0")
        if not protocol_level:
            raise ProtocolError("first packet is PUBLISH, not CONNECT")
    else:
        _check_first_byte(first, ptype, protocol_level)
    if n < start + 2:
        return None
    rl = buf[start + 1]
    if rl < 0x80:
        pos = start + 2
    else:
        rl, pos = _remaining_length(buf, start, n)
        if not pos:
            return None
    end = pos + rl
    if end - start > max_packet_size:
        raise PacketTooLarge(
            f"packet of {end - start} bytes exceeds the maximum of {max_packet_size}"
        )
    return pos, end


def _decode(
    buf: bytes, start: int, protocol_level: int, max_packet_size: int
) -> tuple[Packet, int] | None:
    framed = _frame(buf, start, protocol_level, max_packet_size)
    if framed is None:
        return None
    pos, end = framed
    if len(buf) < end:
        return None
    first = buf[start]
    ptype = first >> 4
    if ptype != 3:
        return _DECODERS[ptype](buf, first, pos, end, protocol_level), end - start

    if pos + 2 > end:
        raise MalformedPacket("PUBLISH topic length runs past the end of the packet")
    p = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if p > end:
        raise MalformedPacket("PUBLISH topic runs past the end of the packet")
    try:
        topic = str(buf[pos + 2 : p], "utf-8")
    except UnicodeDecodeError:
        raise MalformedPacket("PUBLISH topic is ill-formed UTF-8") from None
    qos = (first >> 1) & 3
    packet_id: int | None = None
    if qos:
        if p + 2 > end:
            raise MalformedPacket("PUBLISH packet id runs past the end of the packet")
        packet_id = (buf[p] << 8) | buf[p + 1]
        if not packet_id:
            raise ProtocolError("PUBLISH with QoS > 0 and packet id 0")
        p += 2
    props = NO_PROPERTIES
    if protocol_level == 5:
        if p < end and not buf[p]:
            p += 1
        else:
            props, p = decode_properties(buf, p, end, _T.PUBLISH)
    payload = buf[p:end]
    if "+" in topic or "#" in topic or "\x00" in topic or not topic:
        _check_topic_name(topic, props, protocol_level)
    packet = Publish(topic, payload, qos, bool(first & 1), bool(first & 8), packet_id, props)
    return packet, end - start  # a payload format indicator is checked by the channel


def _check_first_byte(first: int, ptype: int, level: int) -> None:
    if not ptype:
        raise MalformedPacket("reserved packet type 0")
    if not level:
        if ptype != _T.CONNECT:
            raise ProtocolError(f"first packet is {_T(ptype).name}, not CONNECT")
        level = 5
    elif ptype == _T.AUTH and level != 5:
        raise MalformedPacket(f"AUTH does not exist at protocol level {level}")
    flags = first & 0x0F
    expected = FIXED_FLAGS[ptype]
    if flags != expected and not (level == 3 and expected == 2 and flags == 0x0A):
        raise MalformedPacket(f"{_T(ptype).name} with fixed-header flags {flags:#06b}")


def _remaining_length(buf: bytes, start: int, n: int) -> tuple[int, int]:
    """(length, position after it) for the packet at `start`, or (0, 0) when
    the buffer ends inside it."""
    value = 0
    shift = 0
    pos = start + 1
    while True:
        if pos >= n:
            return 0, 0
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            if not b:
                raise MalformedPacket("remaining length not in its shortest form")
            return value, pos
        if pos == start + 5:
            raise MalformedPacket("remaining length longer than 4 bytes")
        shift += 7


def _check_topic_name(topic: str, props: Properties, level: int) -> None:
    if "\x00" in topic:
        raise MalformedPacket("topic name contains U+0000")
    if "+" in topic or "#" in topic:
        raise TopicNameInvalid(f"wildcard in topic name {topic!r}")
    if not topic and props.topic_alias is None:
        if level == 5:
            raise ProtocolError("empty topic name without a topic alias")
        raise TopicNameInvalid("empty topic name")


def _check_utf8_payload(payload: bytes) -> None:
    try:
        payload.decode()
    except UnicodeDecodeError:
        raise PayloadFormatInvalid("payload format indicator 1 on non-UTF-8 payload") from None


def _expect_end(pos: int, end: int, what: str) -> None:
    if pos != end:
        raise MalformedPacket(f"{end - pos} trailing bytes in {what}")


def _packet_id(buf: bytes, pos: int, end: int, what: str) -> int:
    packet_id = read_u16(buf, pos, end)
    if not packet_id:
        raise ProtocolError(f"{what} with packet id 0")
    return packet_id


def _reason(buf: bytes, pos: int, codes: frozenset[int], what: str) -> int:
    code = buf[pos]
    if code not in codes:
        raise MalformedPacket(f"reason code {code:#04x} not valid in {what}")
    return code


def _decode_connect(buf: bytes, first: int, pos: int, end: int, _: int) -> Connect:
    name, pos = read_utf8(buf, pos, end)
    if pos + 4 > end:
        raise MalformedPacket("CONNECT variable header runs past the end of the packet")
    level = buf[pos]
    if (name, level) not in _PROTOCOLS:
        raise UnsupportedProtocolLevel(f"protocol {name!r} level {level}", level)
    flags = buf[pos + 1]
    keep_alive = (buf[pos + 2] << 8) | buf[pos + 3]
    pos += 4
    if flags & 0x01:
        raise MalformedPacket("CONNECT reserved flag set")
    will_flag = flags & 0x04
    will_qos = (flags >> 3) & 3
    will_retain = bool(flags & 0x20)
    if will_qos == 3:
        raise MalformedPacket("CONNECT will QoS 3")
    if not will_flag and (will_qos or will_retain):
        raise MalformedPacket("CONNECT will QoS or retain without the will flag")
    if flags & 0x40 and not flags & 0x80 and level != 5:
        raise MalformedPacket("CONNECT password without a user name")
    props = NO_PROPERTIES
    if level == 5:
        props, pos = decode_properties(buf, pos, end, _T.CONNECT)
    client_id, pos = read_utf8(buf, pos, end)
    will = None
    if will_flag:
        will_props = NO_PROPERTIES
        if level == 5:
            will_props, pos = decode_properties(buf, pos, end, WILL)
        will_topic, pos = read_utf8(buf, pos, end)
        if "+" in will_topic or "#" in will_topic or not will_topic:
            raise TopicNameInvalid(f"will topic {will_topic!r} is not a valid topic name")
        will_payload, pos = read_binary(buf, pos, end)
        if will_props.payload_format_indicator == 1:
            _check_utf8_payload(will_payload)
        will = Will(will_topic, will_payload, will_qos, will_retain, will_props)
    username = password = None
    if flags & 0x80:
        username, pos = read_utf8(buf, pos, end)
    if flags & 0x40:
        password, pos = read_binary(buf, pos, end)
    _expect_end(pos, end, "CONNECT")
    return Connect(
        client_id, level, bool(flags & 0x02), keep_alive, username, password, will, props, name
    )


def _decode_connack(buf: bytes, first: int, pos: int, end: int, level: int) -> Connack:
    if pos + 2 > end:
        raise MalformedPacket("CONNACK shorter than 2 bytes")
    flags = buf[pos]
    if level == 3:
        flags = 0
    elif flags & 0xFE:
        raise MalformedPacket("CONNACK reserved flags set")
    code = _reason(buf, pos + 1, reasons.CONNACK_5 if level == 5 else reasons.CONNACK_3, "CONNACK")
    if flags and code:
        raise ProtocolError("CONNACK with session present and a failure code")
    props = NO_PROPERTIES
    pos += 2
    if level == 5:
        props, pos = decode_properties(buf, pos, end, _T.CONNACK)
    _expect_end(pos, end, "CONNACK")
    return Connack(bool(flags), code, props)


_AckClass = Callable[[int, int, Properties], Packet]
_ACKS: Final[dict[int, tuple[_AckClass, frozenset[int]]]] = {
    _T.PUBACK: (Puback, reasons.PUBACK_5),
    _T.PUBREC: (Pubrec, reasons.PUBACK_5),
    _T.PUBREL: (Pubrel, reasons.PUBREL_5),
    _T.PUBCOMP: (Pubcomp, reasons.PUBREL_5),
}


def _decode_ack(buf: bytes, first: int, pos: int, end: int, level: int) -> Packet:
    ptype = first >> 4
    cls, codes = _ACKS[ptype]
    what = _NAMES[ptype]
    size = end - pos
    if size < 2 or (size != 2 and level != 5):
        raise MalformedPacket(f"{what} of {size} bytes")
    packet_id = _packet_id(buf, pos, end, what)
    if size == 2:
        return cls(packet_id, 0, NO_PROPERTIES)
    code = _reason(buf, pos + 2, codes, what)
    props = NO_PROPERTIES
    if size > 3:
        props, pos = decode_properties(buf, pos + 3, end, ptype)
        _expect_end(pos, end, what)
    return cls(packet_id, code, props)


def _decode_subscribe(buf: bytes, first: int, pos: int, end: int, level: int) -> Subscribe:
    packet_id = _packet_id(buf, pos, end, "SUBSCRIBE")
    pos += 2
    props = NO_PROPERTIES
    if level == 5:
        props, pos = decode_properties(buf, pos, end, _T.SUBSCRIBE)
    subs: list[Subscription] = []
    while pos < end:
        topic_filter, pos = read_utf8(buf, pos, end)
        if pos >= end:
            raise MalformedPacket("SUBSCRIBE topic filter without options")
        options = buf[pos]
        pos += 1
        qos = options & 3
        if qos == 3:
            raise MalformedPacket("SUBSCRIBE with QoS 3")
        if level != 5:
            if options & 0xFC:
                raise MalformedPacket("SUBSCRIBE options reserved bits set")
            subs.append(Subscription(topic_filter, qos))
            continue
        if options & 0xC0:
            raise MalformedPacket("SUBSCRIBE options reserved bits set")
        retain_handling = (options >> 4) & 3
        if retain_handling == 3:
            raise ProtocolError("SUBSCRIBE with retain handling 3")
        subs.append(
            Subscription(topic_filter, qos, bool(options & 4), bool(options & 8), retain_handling)
        )
    if not subs:
        raise ProtocolError("SUBSCRIBE without topic filters")
    return Subscribe(packet_id, tuple(subs), props)


def _decode_codes(buf: bytes, pos: int, end: int, codes: frozenset[int], what: str
) -> tuple[int, ...]:
    result = tuple(buf[pos:end])
    if not result:
        raise ProtocolError(f"{what} without reason codes")
    for code in result:
        if code not in codes:
            raise MalformedPacket(f"reason code {code:#04x} not valid in {what}")
    return result


def _decode_suback(buf: bytes, first: int, pos: int, end: int, level: int) -> Suback:
    packet_id = _packet_id(buf, pos, end, "SUBACK")
    pos += 2
    props = NO_PROPERTIES
    if level == 5:
        props, pos = decode_properties(buf, pos, end, _T.SUBACK)
    allowed = reasons.SUBACK_5 if level == 5 else reasons.SUBACK_3
    codes = _decode_codes(buf, pos, end, allowed, "SUBACK")
    return Suback(packet_id, codes, props)


def _decode_unsubscribe(buf: bytes, first: int, pos: int, end: int, level: int) -> Unsubscribe:
    packet_id = _packet_id(buf, pos, end, "UNSUBSCRIBE")
    pos += 2
    props = NO_PROPERTIES
    if level == 5:
        props, pos = decode_properties(buf, pos, end, _T.UNSUBSCRIBE)
    filters: list[str] = []
    while pos < end:
        topic_filter, pos = read_utf8(buf, pos, end)
        filters.append(topic_filter)
    if not filters:
        raise ProtocolError("UNSUBSCRIBE without topic filters")
    return Unsubscribe(packet_id, tuple(filters), props)


def _decode_unsuback(buf: bytes, first: int, pos: int, end: int, level: int) -> Unsuback:
    packet_id = _packet_id(buf, pos, end, "UNSUBACK")
    if level != 5:
        _expect_end(pos + 2, end, "UNSUBACK")
        return Unsuback(packet_id)
    props, pos = decode_properties(buf, pos + 2, end, _T.UNSUBACK)
    return Unsuback(packet_id, _decode_codes(buf, pos, end, reasons.UNSUBACK_5, "UNSUBACK"), props)


def _decode_empty(buf: bytes, first: int, pos: int, end: int, level: int) -> Packet:
    ptype = first >> 4
    _expect_end(pos, end, _NAMES[ptype])
    return Pingreq() if ptype == _T.PINGREQ else Pingresp()


def _decode_disconnect(buf: bytes, first: int, pos: int, end: int, level: int
) -> Disconnect | Auth:
    ptype = first >> 4
    what = _NAMES[ptype]
    if level != 5:
        _expect_end(pos, end, what)
        return Disconnect()
    code = 0
    props = NO_PROPERTIES
    if pos < end:
        code = _reason(buf, pos, reasons.AUTH_5 if ptype == _T.AUTH else reasons.DISCONNECT_5, what)
        if pos + 1 < end:
            props, pos = decode_properties(buf, pos + 1, end, ptype)
            _expect_end(pos, end, what)
    return Auth(code, props) if ptype == _T.AUTH else Disconnect(code, props)


_Decoder = Callable[[bytes, int, int, int, int], Packet]
_DECODERS: Final[tuple[_Decoder, ...]] = (
    _decode_empty,  # 0: refused by _check_first_byte
    _decode_connect,
    _decode_connack,
    _decode_empty,  # 3: PUBLISH is decoded inline
    _decode_ack,
    _decode_ack,
    _decode_ack,
    _decode_ack,
    _decode_subscribe,
    _decode_suback,
    _decode_unsubscribe,
    _decode_unsuback,
    _decode_empty,
    _decode_empty,
    _decode_disconnect,
    _decode_disconnect,
)


def peek_connect_level(buf: Buffer) -> int | None:
    """The protocol level byte of the CONNECT at the start of `buf`, if readable.

    For a node whose `decode(..., 0)` raised: it tells whether to answer in
    5.0's words (CONNACK with the error's reason code) or 3.x's.
    """
    n = len(buf)
    if n < 2 or buf[0] != 0x10:
        return None
    pos = 1
    while pos < min(n, 5) and buf[pos] & 0x80:
        pos += 1
    pos += 1
    if pos + 2 > n:
        return None
    pos += 2 + ((buf[pos] << 8) | buf[pos + 1])
    return buf[pos] if pos < n else None
