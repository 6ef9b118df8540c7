"""Every validation rule of the codec, each with hand-written bytes that break it."""

from __future__ import annotations

import pytest

from services.mqtt.codec import MAX_PACKET_SIZE, decode, encode, peek_connect_level
from services.mqtt.errors import (
    MalformedPacket,
    MQTTError,
    PacketTooLarge,
    PayloadFormatInvalid,
    ProtocolError,
    QuotaExceeded,
    TopicAliasInvalid,
    TopicNameInvalid,
    UnsupportedProtocolLevel,
    UnsupportedProtocolVersion,
)
from services.mqtt.packets import (
    Connect,
    Properties,
    Publish,
    Pubrel,
    ReasonCode,
    Subscribe,
    Subscription,
    Unsubscribe,
)
from services.mqtt.properties import MAX_USER_PROPERTIES
from tests.support.codec_golden import MQTT, h

BAD: list[tuple[str, int, str, type[MQTTError]]] = [
    # fixed header
    ("packet type 0", 4, "00 00", MalformedPacket),
    ("AUTH before 5.0", 4, "f0 00", MalformedPacket),
    ("PUBLISH QoS 3", 4, "36 05 00 01 61 00 01", MalformedPacket),
    ("PUBLISH DUP on QoS 0 (3.1.1)", 4, "38 03 00 01 61", MalformedPacket),
    ("PUBLISH DUP on QoS 0 (5.0)", 5, "38 04 00 01 61 00", MalformedPacket),
    ("SUBSCRIBE flags 0000", 4, "80 06 00 01 00 01 61 00", MalformedPacket),
    ("UNSUBSCRIBE flags 0000", 4, "a0 05 00 01 00 01 61", MalformedPacket),
    ("PUBREL flags 0000", 4, "60 02 00 01", MalformedPacket),
    ("PUBACK flags 0010", 5, "42 02 00 01", MalformedPacket),
    ("PINGREQ flags 0001", 4, "c1 00", MalformedPacket),
    ("CONNACK flags 1000", 4, "28 02 00 00", MalformedPacket),
    ("SUBSCRIBE with DUP (3.1.1)", 4, "8a 06 00 01 00 01 61 00", MalformedPacket),
    ("remaining length of 5 bytes", 4, "30 ff ff ff ff 01", MalformedPacket),
    ("remaining length not shortest", 4, "c0 80 00", MalformedPacket),
    # before CONNECT
    ("PUBLISH first", 0, "30 03 00 01 61", ProtocolError),
    ("PINGREQ first", 0, "c0 00", ProtocolError),
    # packet identifiers
    ("PUBLISH QoS 1 id 0", 4, "32 05 00 01 61 00 00", ProtocolError),
    ("PUBLISH QoS 2 id 0 (5.0)", 5, "34 06 00 01 61 00 00 00", ProtocolError),
    ("SUBSCRIBE id 0", 4, "82 06 00 00 00 01 61 00", ProtocolError),
    ("UNSUBSCRIBE id 0", 4, "a2 05 00 00 00 01 61", ProtocolError),
    ("PUBACK id 0", 4, "40 02 00 00", ProtocolError),
    ("PUBREL id 0 (5.0)", 5, "62 02 00 00", ProtocolError),
    ("SUBACK id 0", 4, "90 03 00 00 00", ProtocolError),
    # UTF-8 strings
    ("topic ill-formed UTF-8", 4, "30 04 00 02 c3 28", MalformedPacket),
    ("topic UTF-16 surrogate", 4, "30 05 00 03 ed a0 80", MalformedPacket),
    ("topic overlong NUL", 4, "30 04 00 02 c0 80", MalformedPacket),
    ("topic U+0000", 4, "30 04 00 02 61 00", MalformedPacket),
    ("client id U+0000", 4, f"10 0d {MQTT} 04 02 00 00 00 01 00", MalformedPacket),
    ("filter ill-formed UTF-8", 4, "82 06 00 01 00 01 ff 00", MalformedPacket),
    ("user property surrogate", 5,
     "30 0d 00 01 61 09 26 00 03 ed b0 80 00 01 76", MalformedPacket),
    # topic names
    ("topic with +", 4, "30 05 00 03 61 2f 2b", TopicNameInvalid),
    ("topic with #", 5, "30 04 00 01 23 00", TopicNameInvalid),
    ("empty topic (3.1.1)", 4, "30 02 00 00", TopicNameInvalid),
    ("empty topic, no alias (5.0)", 5, "30 03 00 00 00", ProtocolError),
    ("topic alias 0", 5, "30 07 00 01 61 03 23 00 00", TopicAliasInvalid),
    ("will topic with #", 4,
     f"10 12 {MQTT} 04 06 00 00 00 01 63 | 00 01 23 | 00 00", TopicNameInvalid),
    ("response topic with +", 5, "30 08 00 01 61 04 08 00 01 2b", ProtocolError),
    # properties
    ("duplicate property", 5,
     "30 0e 00 01 61 0a 02 00 00 00 01 02 00 00 00 02", ProtocolError),
    ("subscription id twice in SUBSCRIBE", 5,
     "82 0b 00 01 04 0b 01 0b 02 00 01 61 00", ProtocolError),
    ("subscription id 0", 5, "82 09 00 01 02 0b 00 00 01 61 00", ProtocolError),
    ("subscription id 0 in PUBLISH", 5, "30 06 00 01 61 02 0b 00", ProtocolError),
    ("session expiry in PUBLISH", 5, "30 09 00 01 61 05 11 00 00 00 01", MalformedPacket),
    ("topic alias in SUBSCRIBE", 5, "82 0a 00 01 03 23 00 01 00 01 61 00", MalformedPacket),
    ("reason string in UNSUBSCRIBE", 5,
     "a2 0a 00 01 04 1f 00 01 78 00 01 61", MalformedPacket),
    ("unknown property 0x7f", 5, "30 06 00 01 61 02 7f 00", MalformedPacket),
    ("property past its length", 5, "30 07 00 01 61 02 02 00 00", MalformedPacket),
    ("property length past packet", 5, "30 05 00 01 61 09 01", MalformedPacket),
    ("payload format 2", 5, "30 06 00 01 61 02 01 02", ProtocolError),
    ("receive maximum 0", 5,
     f"10 10 {MQTT} 05 02 00 00 03 21 00 00 00 01 63", ProtocolError),
    ("maximum packet size 0", 5,
     f"10 12 {MQTT} 05 02 00 00 05 27 00 00 00 00 00 01 63", ProtocolError),
    ("request problem information 2", 5,
     f"10 0f {MQTT} 05 02 00 00 02 17 02 00 01 63", ProtocolError),
    ("authentication data, no method", 5,
     f"10 11 {MQTT} 05 02 00 00 04 16 00 01 64 00 01 63", ProtocolError),
    ("maximum QoS 2 in CONNACK", 5, "20 05 00 00 02 24 02", ProtocolError),
    ("will delay in CONNECT properties", 5,
     f"10 12 {MQTT} 05 02 00 00 05 18 00 00 00 01 00 01 63", MalformedPacket),
    ("will payload format 1, bad UTF-8", 5,
     f"10 17 {MQTT} 05 06 00 00 00 00 01 63 | 02 01 01 | 00 01 77 | 00 01 ff",
     PayloadFormatInvalid),
    # CONNECT
    ("CONNECT reserved flag", 4, f"10 0d {MQTT} 04 03 00 3c 00 01 63", MalformedPacket),
    ("will QoS without will flag", 4, f"10 0d {MQTT} 04 0a 00 3c 00 01 63", MalformedPacket),
    ("will retain without will flag", 4,
     f"10 0d {MQTT} 04 22 00 3c 00 01 63", MalformedPacket),
    ("will QoS 3", 4,
     f"10 12 {MQTT} 04 1e 00 3c 00 01 63 00 01 77 00 00", MalformedPacket),
    ("password without user name (3.1.1)", 4,
     f"10 10 {MQTT} 04 42 00 3c 00 01 63 00 01 70", MalformedPacket),
    ("client id past the packet", 4, f"10 0d {MQTT} 04 02 00 3c 00 05 63", MalformedPacket),
    ("CONNECT cut before keep alive", 4, f"10 08 {MQTT} 04 02", MalformedPacket),
    ("CONNECT trailing byte", 4, f"10 0e {MQTT} 04 02 00 3c 00 01 63 00", MalformedPacket),
    ("user name flag, no user name", 4,
     f"10 0d {MQTT} 04 82 00 3c 00 01 63", MalformedPacket),
    # SUBSCRIBE / UNSUBSCRIBE
    ("SUBSCRIBE no filters", 4, "82 02 00 01", ProtocolError),
    ("SUBSCRIBE no filters (5.0)", 5, "82 03 00 01 00", ProtocolError),
    ("SUBSCRIBE filter without options", 4, "82 05 00 01 00 01 61", MalformedPacket),
    ("SUBSCRIBE options reserved bit (3.1.1)", 4, "82 06 00 01 00 01 61 04", MalformedPacket),
    ("SUBSCRIBE options reserved bit (5.0)", 5, "82 07 00 01 00 00 01 61 40", MalformedPacket),
    ("SUBSCRIBE QoS 3", 5, "82 07 00 01 00 00 01 61 03", MalformedPacket),
    ("SUBSCRIBE retain handling 3", 5, "82 07 00 01 00 00 01 61 30", ProtocolError),
    ("SUBSCRIBE filter past packet", 4, "82 06 00 01 00 09 61 00", MalformedPacket),
    ("UNSUBSCRIBE no filters", 4, "a2 02 00 01", ProtocolError),
    ("UNSUBSCRIBE no filters (5.0)", 5, "a2 03 00 01 00", ProtocolError),
    ("UNSUBSCRIBE half a filter", 4, "a2 04 00 01 00 01", MalformedPacket),
    # acknowledgements, reason codes, sizes
    ("PUBACK reason code on 3.1.1", 4, "40 03 00 01 00", MalformedPacket),
    ("PUBACK too short", 5, "40 01 00", MalformedPacket),
    ("PUBACK bad reason code", 5, "40 03 00 01 05", MalformedPacket),
    ("PUBREL reason 0x10", 5, "62 03 00 01 10", MalformedPacket),
    ("PUBACK trailing bytes after properties", 5, "40 05 00 01 00 00 ff", MalformedPacket),
    ("SUBACK code 3 (3.1.1)", 4, "90 03 00 01 03", MalformedPacket),
    ("SUBACK no codes", 4, "90 02 00 01", ProtocolError),
    ("UNSUBACK payload on 3.1.1", 4, "b0 03 00 01 00", MalformedPacket),
    ("UNSUBACK bad code", 5, "b0 04 00 01 00 01", MalformedPacket),
    ("CONNACK code 6 (3.1.1)", 4, "20 02 00 06", MalformedPacket),
    ("CONNACK reserved flag bit", 4, "20 02 02 00", MalformedPacket),
    ("CONNACK session present with failure", 4, "20 02 01 05", ProtocolError),
    ("CONNACK code 0x04 (5.0)", 5, "20 03 00 04 00", MalformedPacket),
    ("PINGREQ with a body", 4, "c0 01 00", MalformedPacket),
    ("DISCONNECT with a body (3.1.1)", 4, "e0 01 00", MalformedPacket),
    ("DISCONNECT bad reason code", 5, "e0 01 01", MalformedPacket),
    ("DISCONNECT trailing byte", 5, "e0 03 00 00 00", MalformedPacket),
    ("AUTH reason 0x04", 5, "f0 01 04", MalformedPacket),
    ("AUTH property not allowed", 5, "f0 04 18 02 23 00", MalformedPacket),
]


@pytest.mark.parametrize(("name", "level", "data", "error"), BAD, ids=[b[0] for b in BAD])
def test_rejects(name: str, level: int, data: str, error: type[MQTTError]) -> None:
    raw = h(data)
    with pytest.raises(error) as info:
        decode(raw, level)
    assert type(info.value) is error or issubclass(type(info.value), error)
    assert info.value.reason_code == error.reason_code


def test_errors_carry_reason_codes() -> None:
    assert MalformedPacket.reason_code == ReasonCode.MALFORMED_PACKET
    assert ProtocolError.reason_code == ReasonCode.PROTOCOL_ERROR
    assert TopicNameInvalid.reason_code == 0x90
    assert TopicAliasInvalid.reason_code == 0x94
    assert PacketTooLarge.reason_code == 0x95
    assert PayloadFormatInvalid.reason_code == 0x99
    assert UnsupportedProtocolLevel.reason_code == 0x84


@pytest.mark.parametrize(
    ("connect", "level"),
    [
        (f"10 0d {MQTT} 06 02 00 3c 00 01 63", 6),
        (f"10 0d {MQTT} 03 02 00 3c 00 01 63", 3),  # MQTT 3.1 is named MQIsdp
        ("10 0f 00 06 4d 51 49 73 64 70 04 02 00 3c 00 01 63", 4),  # MQIsdp is only level 3
        ("10 0d 00 04 48 54 54 50 04 02 00 3c 00 01 63", 4),  # "HTTP"
    ],
)
def test_unknown_protocol_names_its_level(connect: str, level: int) -> None:
    with pytest.raises(UnsupportedProtocolVersion) as info:
        decode(h(connect), 0)
    assert isinstance(info.value, UnsupportedProtocolLevel)
    assert info.value.protocol_level == level
    assert peek_connect_level(h(connect)) == level


def test_peek_connect_level_needs_the_level_byte() -> None:
    data = h(f"10 13 {MQTT} 05 02 00 3c 05 11 00 00 00 0a 00 01 63")
    assert peek_connect_level(data) == 5
    assert peek_connect_level(data[:8]) is None
    assert peek_connect_level(data[:9]) == 5
    assert peek_connect_level(h("30 00")) is None


def test_fixed_header_errors_need_only_the_first_byte() -> None:
    for first, level in ((0x36, 4), (0x38, 4), (0x80, 4), (0x00, 4), (0xF0, 4), (0x30, 0)):
        with pytest.raises(MQTTError):
            decode(bytes((first,)), level)


def test_five_byte_remaining_length_fails_before_the_fifth_byte_arrives() -> None:
    with pytest.raises(MalformedPacket):
        decode(h("30 ff ff ff ff"), 4)
    assert decode(h("30 ff ff ff"), 4) is None


def test_max_packet_size_enforced_from_the_fixed_header_alone() -> None:
    header = h("30 ff ff ff 7f")  # remaining length 268,435,455: the largest there is
    with pytest.raises(PacketTooLarge):
        decode(header, 4, max_packet_size=1024)
    assert decode(header, 4) is None  # exactly the protocol maximum: wait for the body
    assert MAX_PACKET_SIZE == 268_435_455 + 5
    # remaining length 1021 -> 1 + 2 + 1021 = 1024 bytes in all
    assert decode(h("30 fd 07"), 4, max_packet_size=1024) is None
    with pytest.raises(PacketTooLarge):
        decode(h("30 fe 07"), 4, max_packet_size=1024)
    with pytest.raises(PacketTooLarge):
        decode(h("10 fe 07"), 0, max_packet_size=1024)


def test_max_packet_size_counts_the_whole_packet() -> None:
    data = encode(Publish("a", b"x" * 10), 4)
    assert decode(data, 4, max_packet_size=len(data)) == (Publish("a", b"x" * 10), len(data))
    with pytest.raises(PacketTooLarge):
        decode(data, 4, max_packet_size=len(data) - 1)


def test_3_1_is_lenient_where_3_1_said_less() -> None:
    assert decode(h("38 03 00 01 61"), 3) == (Publish("a", b"", dup=True), 5)
    assert decode(h("8a 06 00 01 00 01 61 00"), 3) == (
        Subscribe(1, (Subscription("a"),)), 8)
    assert decode(h("aa 05 00 01 00 01 61"), 3) == (Unsubscribe(1, ("a",)), 7)
    assert decode(h("6a 02 00 01"), 3) == (Pubrel(1), 4)


def test_5_allows_empty_topic_with_alias_and_repeated_user_properties() -> None:
    data = h("30 15 00 00 | 11 23 00 05 | 26 00 01 6b 00 01 31 | 26 00 01 6b 00 01 32 | 78")
    packet, used = decode(data, 5) or (None, 0)
    assert used == len(data)
    assert packet == Publish("", b"x", properties=Properties(
        topic_alias=5, user_property=(("k", "1"), ("k", "2"))))


def test_5_user_properties_are_capped() -> None:
    """MAX_USER_PROPERTIES in one block decode; one more is Quota Exceeded (0x97)."""
    pairs = tuple((f"k{i}", "v") for i in range(MAX_USER_PROPERTIES + 1))
    at_cap = encode(Publish("a", b"", properties=Properties(user_property=pairs[:-1])), 5)
    packet, _ = decode(at_cap, 5) or (None, 0)
    assert isinstance(packet, Publish) and len(packet.properties.user_property) == len(pairs) - 1
    over = encode(Publish("a", b"", properties=Properties(user_property=pairs)), 5)
    with pytest.raises(QuotaExceeded):
        decode(over, 5)
    connect = encode(Connect("c", 5, properties=Properties(user_property=pairs)), 5)
    with pytest.raises(QuotaExceeded):
        decode(connect, 0)


def test_5_allows_password_without_user_name() -> None:
    data = h(f"10 11 {MQTT} 05 40 00 3c 00 | 00 01 63 | 00 01 70")
    assert decode(data, 0) == (Connect("c", 5, False, 60, None, b"p"), len(data))


def test_encoder_refuses_what_it_cannot_say() -> None:
    with pytest.raises(ValueError):
        encode(Publish("a", b"", properties=Properties(session_expiry_interval=1)), 5)
    with pytest.raises(ValueError):
        encode(Subscribe(1, (Subscription("a"),),
                         Properties(subscription_identifier=(1, 2))), 5)
    with pytest.raises(ValueError):
        encode(Publish("a", b"", 1), 4)
    with pytest.raises(ValueError):
        encode(Connect("c", 4, password=b"p"), 4)


def test_property_blocks_shared_between_packets_are_still_checked_per_packet_type() -> None:
    alias = h("30 09 00 01 61 03 23 00 07 68 69")  # PUBLISH, topic alias 7
    first = decode(alias, 5)
    again = decode(bytearray(alias), 5)
    assert first is not None and again is not None
    assert first[0] == again[0] == Publish("a", b"hi", properties=Properties(topic_alias=7))
    with pytest.raises(MalformedPacket):  # the same block is not allowed in SUBSCRIBE
        decode(h("82 0a 00 01 03 23 00 07 00 01 61 00"), 5)
    will = h(f"10 17 {MQTT} 05 06 00 00 00 00 01 63 | 02 01 01 | 00 01 77 | 00 01 ff")
    for _ in range(2):  # will payload format 1 on a non-UTF-8 payload
        with pytest.raises(PayloadFormatInvalid):
            decode(will, 5)


def test_publish_payload_format_is_left_to_the_channel() -> None:
    """It refuses such a message alone (PUBACK 0x99), not the connection."""
    data = h("30 08 00 01 61 02 01 01 ff fe")  # payload format 1 on a non-UTF-8 payload
    assert decode(data, 5) == (
        Publish("a", b"\xff\xfe", properties=Properties(payload_format_indicator=1)),
        len(data),
    )


def test_byte_order_mark_is_kept_not_stripped() -> None:
    data = h("30 06 00 04 ef bb bf 61")
    assert decode(data, 4) == (Publish("\ufeffa", b""), len(data))
