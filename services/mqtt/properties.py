"""MQTT wire primitives and MQTT 5 properties (sections 1.5 and 2.2.2).

Theory of operation: every reader takes the buffer, a position and the end
of the packet it may not read past, and returns the value and the next
position; reading past `end` is a Malformed Packet, never "need more data"
(the codec only parses a packet once all of it has arrived). One table,
`_SPECS`, says for each property its identifier, field name, wire type and
the packet types that may carry it (`WILL` stands for the will properties
inside CONNECT); decoding and encoding both walk it. Decoding enforces the
spec's MUST rules on properties: unknown or misplaced identifier ->
Malformed, a repeat (other than user property, and subscription identifier
in PUBLISH) or a value out of range -> Protocol Error, topic alias 0 ->
Topic Alias Invalid. One limit is Weir's, not the spec's: more than
MAX_USER_PROPERTIES user properties in one block -> Quota Exceeded.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Final

from services.mqtt.errors import MalformedPacket, ProtocolError, QuotaExceeded, TopicAliasInvalid
from services.mqtt.packets import NO_PROPERTIES, PacketType, Properties, PropertyId

Buffer = bytes | bytearray | memoryview

WILL: Final = 0
"""Pseudo packet type for the will properties of a CONNECT."""

VARINT_MAX: Final = 268_435_455

MAX_USER_PROPERTIES: Final = 1024
"""User properties in one property block. The spec sets no bound, but a 1 MiB
packet of 100,000 of them took 70 ms of the node's loop to decode, 30 ms to
encode again per subscriber, and 11 MB of memory (CVE-2021-41039 was their
cost in Mosquitto). A thousand is far past what applications attach (cloud
IoT platforms allow 20)."""

BYTE, TWO, FOUR, VARINT, UTF8, BINARY, PAIR = range(7)

_T = PacketType
_ALL = frozenset(int(t) for t in PacketType)
_MESSAGE = frozenset({_T.PUBLISH, WILL})
_ACKS = frozenset(
    {
        _T.CONNACK,
        _T.PUBACK,
        _T.PUBREC,
        _T.PUBREL,
        _T.PUBCOMP,
        _T.SUBACK,
        _T.UNSUBACK,
        _T.DISCONNECT,
        _T.AUTH,
    }
)

_P = PropertyId
_SPECS: Final[tuple[tuple[int, str, int, frozenset[int]], ...]] = (
    (_P.PAYLOAD_FORMAT_INDICATOR, "payload_format_indicator", BYTE, _MESSAGE),
    (_P.MESSAGE_EXPIRY_INTERVAL, "message_expiry_interval", FOUR, _MESSAGE),
    (_P.CONTENT_TYPE, "content_type", UTF8, _MESSAGE),
    (_P.RESPONSE_TOPIC, "response_topic", UTF8, _MESSAGE),
    (_P.CORRELATION_DATA, "correlation_data", BINARY, _MESSAGE),
    (
        _P.SUBSCRIPTION_IDENTIFIER,
        "subscription_identifier",
        VARINT,
        frozenset({_T.PUBLISH, _T.SUBSCRIBE}),
    ),
    (
        _P.SESSION_EXPIRY_INTERVAL,
        "session_expiry_interval",
        FOUR,
        frozenset({_T.CONNECT, _T.CONNACK, _T.DISCONNECT}),
    ),
    (_P.ASSIGNED_CLIENT_IDENTIFIER, "assigned_client_identifier", UTF8, frozenset({_T.CONNACK})),
    (_P.SERVER_KEEP_ALIVE, "server_keep_alive", TWO, frozenset({_T.CONNACK})),
    (
        _P.AUTHENTICATION_METHOD,
        "authentication_method",
        UTF8,
        frozenset({_T.CONNECT, _T.CONNACK, _T.AUTH}),
    ),
    (
        _P.AUTHENTICATION_DATA,
        "authentication_data",
        BINARY,
        frozenset({_T.CONNECT, _T.CONNACK, _T.AUTH}),
    ),
    (_P.REQUEST_PROBLEM_INFORMATION, "request_problem_information", BYTE, frozenset({_T.CONNECT})),
    (_P.WILL_DELAY_INTERVAL, "will_delay_interval", FOUR, frozenset({WILL})),
    (
        _P.REQUEST_RESPONSE_INFORMATION,
        "request_response_information",
        BYTE,
        frozenset({_T.CONNECT}),
    ),
    (_P.RESPONSE_INFORMATION, "response_information", UTF8, frozenset({_T.CONNACK})),
    (_P.SERVER_REFERENCE, "server_reference", UTF8, frozenset({_T.CONNACK, _T.DISCONNECT})),
    (_P.REASON_STRING, "reason_string", UTF8, _ACKS),
    (_P.RECEIVE_MAXIMUM, "receive_maximum", TWO, frozenset({_T.CONNECT, _T.CONNACK})),
    (_P.TOPIC_ALIAS_MAXIMUM, "topic_alias_maximum", TWO, frozenset({_T.CONNECT, _T.CONNACK})),
    (_P.TOPIC_ALIAS, "topic_alias", TWO, frozenset({_T.PUBLISH})),
    (_P.MAXIMUM_QOS, "maximum_qos", BYTE, frozenset({_T.CONNACK})),
    (_P.RETAIN_AVAILABLE, "retain_available", BYTE, frozenset({_T.CONNACK})),
    (_P.USER_PROPERTY, "user_property", PAIR, _ALL | {WILL}),
    (_P.MAXIMUM_PACKET_SIZE, "maximum_packet_size", FOUR, frozenset({_T.CONNECT, _T.CONNACK})),
    (
        _P.WILDCARD_SUBSCRIPTION_AVAILABLE,
        "wildcard_subscription_available",
        BYTE,
        frozenset({_T.CONNACK}),
    ),
    (
        _P.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        "subscription_identifier_available",
        BYTE,
        frozenset({_T.CONNACK}),
    ),
    (
        _P.SHARED_SUBSCRIPTION_AVAILABLE,
        "shared_subscription_available",
        BYTE,
        frozenset({_T.CONNACK}),
    ),
)
_BY_ID: Final = {spec[0]: spec[1:] for spec in _SPECS}
_BOOLEAN_BYTES: Final = frozenset(
    {
        _P.PAYLOAD_FORMAT_INDICATOR,
        _P.REQUEST_PROBLEM_INFORMATION,
        _P.REQUEST_RESPONSE_INFORMATION,
        _P.MAXIMUM_QOS,
        _P.RETAIN_AVAILABLE,
        _P.WILDCARD_SUBSCRIPTION_AVAILABLE,
        _P.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        _P.SHARED_SUBSCRIPTION_AVAILABLE,
    }
)
_NON_ZERO: Final = frozenset({_P.RECEIVE_MAXIMUM, _P.MAXIMUM_PACKET_SIZE})
_fields_of = attrgetter(*(spec[1] for spec in _SPECS))
_NOTHING: Final = _fields_of(NO_PROPERTIES)

# Decoded property blocks by (packet type, bytes): a publisher repeats the
# same block, and building the 27-field frozen Properties costs ~6 us.
# Properties are immutable, so sharing one value is safe; errors are never
# cached. Small blocks only; the whole map is dropped when it fills.
_CACHED_BLOCK_MAX: Final = 256
_CACHE_ENTRIES: Final = 1024
_decoded: dict[tuple[int, bytes], Properties] = {}


def read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    value = 0
    shift = 0
    for i in range(4):
        if pos >= end:
            raise MalformedPacket("variable byte integer runs past the end of the packet")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            if b == 0 and i:
                raise MalformedPacket("variable byte integer not in its shortest form")
            return value, pos
        shift += 7
    raise MalformedPacket("variable byte integer longer than 4 bytes")


def encode_varint(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    if value > VARINT_MAX:
        raise ValueError(f"{value} does not fit a variable byte integer")
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def read_u16(buf: bytes, pos: int, end: int) -> int:
    if pos + 2 > end:
        raise MalformedPacket("two-byte integer runs past the end of the packet")
    return (buf[pos] << 8) | buf[pos + 1]


def read_binary(buf: bytes, pos: int, end: int) -> tuple[bytes, int]:
    if pos + 2 > end:
        raise MalformedPacket("length prefix runs past the end of the packet")
    stop = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if stop > end:
        raise MalformedPacket("binary data runs past the end of the packet")
    return bytes(buf[pos + 2 : stop]), stop


def decode_utf8(raw: bytes) -> str:
    """A UTF-8 encoded string's text: well-formed, no surrogates, no U+0000 (1.5.4)."""
    try:
        text = str(raw, "utf-8")
    except UnicodeDecodeError:
        raise MalformedPacket("ill-formed UTF-8 string") from None
    if "\x00" in text:
        raise MalformedPacket("UTF-8 string contains U+0000")
    return text


def read_utf8(buf: bytes, pos: int, end: int) -> tuple[str, int]:
    if pos + 2 > end:
        raise MalformedPacket("length prefix runs past the end of the packet")
    stop = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if stop > end:
        raise MalformedPacket("UTF-8 string runs past the end of the packet")
    return decode_utf8(buf[pos + 2 : stop]), stop


def encode_binary(data: bytes) -> bytes:
    n = len(data)
    if n > 0xFFFF:
        raise ValueError(f"{n} bytes do not fit a two-byte length prefix")
    return bytes((n >> 8, n & 0xFF)) + data


def encode_utf8(text: str) -> bytes:
    return encode_binary(text.encode())


def _name(packet_type: int) -> str:
    return "will properties" if packet_type == WILL else PacketType(packet_type).name


def decode_properties(buf: bytes, pos: int, end: int, packet_type: int) -> tuple[Properties, int]:
    """Read a property length and the properties it covers, validating them."""
    length, pos = read_varint(buf, pos, end)
    if not length:
        return NO_PROPERTIES, pos
    stop = pos + length
    if stop > end:
        raise MalformedPacket("property length runs past the end of the packet")
    key: tuple[int, bytes] | None = None
    if length <= _CACHED_BLOCK_MAX:
        key = (packet_type, bytes(buf[pos:stop]))
        cached = _decoded.get(key)
        if cached is not None:
            return cached, stop
    props = _parse(buf, pos, stop, packet_type)
    if key is not None:
        if len(_decoded) >= _CACHE_ENTRIES:
            _decoded.clear()
        _decoded[key] = props
    return props, stop


def _parse(buf: bytes, pos: int, stop: int, packet_type: int) -> Properties:
    values: dict[str, Any] = {}
    users: list[tuple[str, str]] = []
    sub_ids: list[int] = []
    value: Any
    while pos < stop:
        pid = buf[pos]
        pos += 1
        spec = _BY_ID.get(pid)
        if spec is None:
            raise MalformedPacket(f"unknown property identifier 0x{pid:02x}")
        name, kind, allowed = spec
        if packet_type not in allowed:
            raise MalformedPacket(f"property {name} not allowed in {_name(packet_type)}")
        if kind == BYTE:
            if pos >= stop:
                raise MalformedPacket(f"property {name} runs past the property length")
            value = buf[pos]
            pos += 1
        elif kind == TWO:
            value = read_u16(buf, pos, stop)
            pos += 2
        elif kind == FOUR:
            if pos + 4 > stop:
                raise MalformedPacket(f"property {name} runs past the property length")
            value = int.from_bytes(buf[pos : pos + 4], "big")
            pos += 4
        elif kind == VARINT:
            value, pos = read_varint(buf, pos, stop)
        elif kind == UTF8:
            value, pos = read_utf8(buf, pos, stop)
        elif kind == BINARY:
            value, pos = read_binary(buf, pos, stop)
        else:
            if len(users) == MAX_USER_PROPERTIES:
                raise QuotaExceeded(f"more than {MAX_USER_PROPERTIES} user properties")
            key, pos = read_utf8(buf, pos, stop)
            val, pos = read_utf8(buf, pos, stop)
            users.append((key, val))
            continue
        if pid == _P.SUBSCRIPTION_IDENTIFIER:
            if not value:
                raise ProtocolError("subscription identifier 0")
            if sub_ids and packet_type != _T.PUBLISH:
                raise ProtocolError(f"subscription identifier repeated in {_name(packet_type)}")
            sub_ids.append(value)
            continue
        if name in values:
            raise ProtocolError(f"property {name} repeated")
        if pid in _BOOLEAN_BYTES and value > 1:
            raise ProtocolError(f"property {name} must be 0 or 1, got {value}")
        if not value:
            if pid in _NON_ZERO:
                raise ProtocolError(f"property {name} must not be 0")
            if pid == _P.TOPIC_ALIAS:
                raise TopicAliasInvalid("topic alias 0")
        if pid == _P.RESPONSE_TOPIC and ("+" in value or "#" in value):
            raise ProtocolError("response topic contains a wildcard")
        values[name] = value
    if users:
        values["user_property"] = tuple(users)
    if sub_ids:
        values["subscription_identifier"] = tuple(sub_ids)
    if "authentication_data" in values and "authentication_method" not in values:
        raise ProtocolError("authentication data without an authentication method")
    return Properties(**values)


def encode_properties(props: Properties, packet_type: int) -> bytes:
    """The property length and properties for `packet_type` (or `WILL`).

    Raises ValueError for a property that packet type may not carry: that
    is a bug in the caller, not something to drop silently.
    """
    if props is NO_PROPERTIES:
        return b"\x00"
    values = _fields_of(props)
    if values == _NOTHING:
        return b"\x00"
    out = bytearray()
    for (pid, name, kind, allowed), value in zip(_SPECS, values, strict=True):
        if value is None or value == ():
            continue
        if packet_type not in allowed:
            raise ValueError(f"property {name} not allowed in {_name(packet_type)}")
        if kind == PAIR:
            for key, val in value:
                out.append(pid)
                out += encode_utf8(key)
                out += encode_utf8(val)
        elif kind == VARINT:
            if len(value) > 1 and packet_type != _T.PUBLISH:
                raise ValueError(f"only PUBLISH may repeat {name}")
            for v in value:
                out.append(pid)
                out += encode_varint(v)
        else:
            out.append(pid)
            if kind == BYTE:
                out.append(value)
            elif kind == TWO:
                out += value.to_bytes(2, "big")
            elif kind == FOUR:
                out += value.to_bytes(4, "big")
            elif kind == UTF8:
                out += encode_utf8(value)
            else:
                out += encode_binary(value)
    return encode_varint(len(out)) + out


def add_subscription_identifiers(block: bytes, sub_ids: tuple[int, ...]) -> bytes:
    """A PUBLISH property block (from `encode_properties`) with `sub_ids` appended.

    For fan-out: encode a message's properties once, then add each
    subscriber's identifiers here instead of rebuilding a Properties value.
    `block` must not already carry subscription identifiers.
    """
    if not sub_ids:
        return block
    length, start = read_varint(block, 0, len(block))
    extra = b"".join(b"\x0b" + encode_varint(i) for i in sub_ids)
    return encode_varint(length + len(extra)) + block[start:] + extra
