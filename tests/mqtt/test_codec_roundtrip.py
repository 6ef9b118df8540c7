"""Round trips: decode(encode(p)) == p, every proper prefix is "need more data".

The Hypothesis strategies build packets that are valid at their level (3.x
packets carry no properties or reason codes; each packet type carries only
the properties the spec allows it, written out here independently of the
codec's own table).
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from services.mqtt.codec import decode, encode, encode_publish
from services.mqtt.packets import (
    NO_PROPERTIES,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
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
from services.mqtt.properties import encode_properties
from tests.support.codec_golden import GOLDEN

LEVELS = (3, 4, 5)

text = st.text(
    st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12
)
topic_name = st.text(
    st.characters(codec="utf-8", exclude_characters="\x00+#"),
    min_size=1,
    max_size=20,
)
binary = st.binary(max_size=40)
u8bool = st.integers(0, 1)
u16 = st.integers(1, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)
pid = st.integers(1, 0xFFFF)
sub_id = st.integers(1, 268_435_455)
users = st.lists(st.tuples(text, text), max_size=3).map(tuple)

FIELD: dict[str, st.SearchStrategy[Any]] = {
    "payload_format_indicator": st.just(0),  # 1 needs a UTF-8 payload: see publishes
    "message_expiry_interval": u32,
    "content_type": text,
    "response_topic": topic_name,
    "correlation_data": binary,
    "session_expiry_interval": u32,
    "assigned_client_identifier": text,
    "server_keep_alive": st.integers(0, 0xFFFF),
    "authentication_method": text,
    "request_problem_information": u8bool,
    "will_delay_interval": u32,
    "request_response_information": u8bool,
    "response_information": text,
    "server_reference": text,
    "reason_string": text,
    "receive_maximum": u16,
    "topic_alias_maximum": st.integers(0, 0xFFFF),
    "topic_alias": u16,
    "maximum_qos": u8bool,
    "retain_available": u8bool,
    "maximum_packet_size": st.integers(1, 0xFFFF_FFFF),
    "wildcard_subscription_available": u8bool,
    "subscription_identifier_available": u8bool,
    "shared_subscription_available": u8bool,
}
MESSAGE = ["payload_format_indicator", "message_expiry_interval", "content_type",
           "response_topic", "correlation_data"]
ALLOWED: dict[str, list[str]] = {
    "CONNECT": ["session_expiry_interval", "authentication_method",
                "request_problem_information", "request_response_information",
                "receive_maximum", "topic_alias_maximum", "maximum_packet_size"],
    "CONNACK": ["session_expiry_interval", "assigned_client_identifier", "server_keep_alive",
                "authentication_method", "response_information", "server_reference",
                "reason_string", "receive_maximum", "topic_alias_maximum", "maximum_qos",
                "retain_available", "maximum_packet_size", "wildcard_subscription_available",
                "subscription_identifier_available", "shared_subscription_available"],
    "PUBLISH": [*MESSAGE, "topic_alias"],
    "WILL": [*MESSAGE, "will_delay_interval"],
    "ACK": ["reason_string"],
    "SUBSCRIBE": [],
    "UNSUBSCRIBE": [],
    "DISCONNECT": ["session_expiry_interval", "server_reference", "reason_string"],
    "AUTH": ["authentication_method", "reason_string"],
}


@st.composite
def properties(draw: st.DrawFn, kind: str, level: int) -> Properties:
    if level != 5:
        return NO_PROPERTIES
    values = {
        name: draw(FIELD[name]) for name in ALLOWED[kind] if draw(st.booleans())
    }
    values["user_property"] = draw(users)
    if kind == "PUBLISH":
        values["subscription_identifier"] = tuple(draw(st.lists(sub_id, max_size=3)))
    if kind == "SUBSCRIBE" and draw(st.booleans()):
        values["subscription_identifier"] = (draw(sub_id),)
    if "authentication_method" in values and draw(st.booleans()):
        values["authentication_data"] = draw(binary)
    return Properties(**values)


@st.composite
def message_payload(draw: st.DrawFn, props: Properties) -> tuple[bytes, Properties]:
    if props is NO_PROPERTIES or not draw(st.booleans()):
        return draw(binary), props
    fields = {f: getattr(props, f) for f in Properties.__slots__}
    fields["payload_format_indicator"] = 1
    return draw(text).encode(), Properties(**fields)


@st.composite
def publishes(draw: st.DrawFn, level: int) -> Publish:
    qos = draw(st.integers(0, 2))
    props = draw(properties("PUBLISH", level))
    payload, props = draw(message_payload(props))
    topic = draw(topic_name)
    if props.topic_alias is not None and draw(st.booleans()):
        topic = ""
    return Publish(topic, payload, qos, draw(st.booleans()),
                   qos > 0 and draw(st.booleans()), draw(pid) if qos else None, props)


@st.composite
def connects(draw: st.DrawFn, level: int) -> Connect:
    will = None
    if draw(st.booleans()):
        will_props = draw(properties("WILL", level))
        payload, will_props = draw(message_payload(will_props))
        will = Will(draw(topic_name), payload, draw(st.integers(0, 2)), draw(st.booleans()),
                    will_props)
    username = draw(st.none() | text)
    password = draw(st.none() | binary) if username is not None or level == 5 else None
    return Connect(draw(text), level, draw(st.booleans()), draw(st.integers(0, 0xFFFF)),
                   username, password, will, draw(properties("CONNECT", level)),
                   "MQIsdp" if level == 3 else "MQTT")


def codes(level: int, at5: list[int], at3: list[int]) -> st.SearchStrategy[int]:
    return st.sampled_from(at5 if level == 5 else at3)


@st.composite
def packets(draw: st.DrawFn, level: int) -> Packet:
    kind = draw(st.integers(1, 15 if level == 5 else 14))
    if kind == 1:
        return draw(connects(level))
    if kind == 2:
        code = draw(codes(level, [0, 0x80, 0x85, 0x9F], [0, 1, 2, 3, 4, 5]))
        present = level != 3 and not code and draw(st.booleans())
        return Connack(present, code, draw(properties("CONNACK", level)))
    if kind == 3:
        return draw(publishes(level))
    if kind in (4, 5, 6, 7):
        cls = (Puback, Pubrec, Pubrel, Pubcomp)[kind - 4]
        pool = [0, 0x10, 0x80, 0x99] if kind < 6 else [0, 0x92]
        return cls(draw(pid), draw(codes(level, pool, [0])), draw(properties("ACK", level)))
    if kind == 8:
        subs = draw(st.lists(
            st.builds(Subscription, text, st.integers(0, 2),
                      *(() if level != 5 else
                        (st.booleans(), st.booleans(), st.integers(0, 2)))),
            min_size=1, max_size=4))
        return Subscribe(draw(pid), tuple(subs), draw(properties("SUBSCRIBE", level)))
    if kind == 9:
        pool = [0, 1, 2, 0x80, 0x87, 0xA2] if level == 5 else [0, 1, 2, 0x80]
        return Suback(draw(pid), tuple(draw(st.lists(st.sampled_from(pool), min_size=1))),
                      draw(properties("ACK", level)))
    if kind == 10:
        return Unsubscribe(draw(pid), tuple(draw(st.lists(text, min_size=1, max_size=4))),
                           draw(properties("UNSUBSCRIBE", level)))
    if kind == 11:
        if level != 5:
            return Unsuback(draw(pid))
        return Unsuback(draw(pid), tuple(draw(st.lists(st.sampled_from([0, 0x11, 0x8F]),
                                                       min_size=1))),
                        draw(properties("ACK", level)))
    if kind == 12:
        return Pingreq()
    if kind == 13:
        return Pingresp()
    if kind == 14:
        return Disconnect(draw(codes(level, [0, 4, 0x8E, 0xA2], [0])),
                          draw(properties("DISCONNECT", level)))
    return Auth(draw(st.sampled_from([0, 0x18, 0x19])), draw(properties("AUTH", level)))


def assert_round_trip(packet: Packet, level: int) -> bytes:
    data = encode(packet, level)
    assert decode(data, level) == (packet, len(data))
    assert decode(bytearray(data), level) == (packet, len(data))
    assert decode(memoryview(data), level) == (packet, len(data))
    assert decode(data + b"\xc0\x00", level) == (packet, len(data))
    if isinstance(packet, Connect):
        assert decode(data, 0) == (packet, len(data))
    return data


def assert_prefixes_need_more(data: bytes, level: int) -> None:
    for cut in range(len(data)):
        assert decode(data[:cut], level) is None, cut
        assert decode(memoryview(data)[:cut], level) is None, cut


def test_golden_packets_round_trip_and_every_prefix_needs_more() -> None:
    for level, _, packet in GOLDEN:
        assert_prefixes_need_more(assert_round_trip(packet, level), level)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(LEVELS).flatmap(lambda lv: st.tuples(st.just(lv), packets(lv))))
def test_generated_packets_round_trip(case: tuple[int, Packet]) -> None:
    level, packet = case
    assert_round_trip(packet, level)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(LEVELS).flatmap(lambda lv: st.tuples(st.just(lv), packets(lv))))
def test_generated_packets_every_prefix_needs_more(case: tuple[int, Packet]) -> None:
    level, packet = case
    assert_prefixes_need_more(encode(packet, level), level)


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(LEVELS).flatmap(
    lambda lv: st.tuples(st.just(lv), st.lists(packets(lv), min_size=1, max_size=8))))
def test_a_stream_decodes_packet_by_packet(case: tuple[int, list[Packet]]) -> None:
    level, sent = case
    stream = memoryview(b"".join(encode(p, level) for p in sent))
    got: list[Packet] = []
    pos = 0
    for _ in range(len(sent) + 1):
        result = decode(stream[pos:], level)
        if result is None:
            break
        packet, used = result
        got.append(packet)
        pos += used
    assert got == sent
    assert pos == len(stream)
    for buffer in (bytes(stream), bytearray(stream)):  # in place, from where the last one ended
        pos, got = 0, []
        while (result := decode(buffer, level, start=pos)) is not None:
            got.append(result[0])
            pos += result[1]
        assert got == sent
        assert pos == len(stream)


def _outcome(buf: bytes | bytearray | memoryview, level: int, start: int) -> object:
    from services.mqtt.errors import MQTTError

    try:
        return decode(buf, level, start=start)
    except MQTTError as err:
        return type(err), str(err)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.binary(max_size=8), st.sampled_from((0, 3, 4, 5)))
def test_decoding_at_an_offset_is_decoding_the_rest(data: bytes, before: bytes, level: int) -> None:
    """`start` (the node decodes its read in place) and the buffer's type (bytes
    are decoded as they are; a bytearray or memoryview from copies of the fixed
    header and the packet) change nothing: the same packet and size, the same
    "need more", the same error."""
    expected = _outcome(data, level, 0)
    whole = before + data
    for buf in (whole, bytearray(whole), memoryview(whole)):
        assert _outcome(buf, level, len(before)) == expected


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(LEVELS).flatmap(lambda lv: st.tuples(st.just(lv), publishes(lv))))
def test_encode_publish_matches_encode(case: tuple[int, Publish]) -> None:
    level, p = case
    props = encode_properties(p.properties, 3) if level == 5 else None
    fast = encode_publish(p.topic.encode(), p.payload, p.qos, p.retain, p.dup, p.packet_id, props)
    assert fast == encode(p, level)


def test_big_publish_round_trips_across_varint_sizes() -> None:
    for size in (0, 125, 126, 16_380, 16_384, 2_097_152):
        packet = Publish("t", b"\xab" * size, 1, packet_id=9)
        for level in LEVELS:
            data = assert_round_trip(packet, level)
            assert decode(data[:-1], level) is None
            assert decode(data[:5], level) is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.sampled_from((0, 3, 4, 5)))
def test_arbitrary_bytes_decode_or_raise_mqtt_errors_only(data: bytes, level: int) -> None:
    from services.mqtt.errors import MQTTError

    try:
        result = decode(data, level)
    except MQTTError:
        return
    if result is not None:
        _, used = result
        assert 2 <= used <= len(data)


@settings(max_examples=200, deadline=None)
@given(properties("PUBLISH", 5), st.lists(sub_id, max_size=4))
def test_adding_subscription_identifiers_to_an_encoded_block(
    props: Properties, ids: list[int]
) -> None:
    from dataclasses import replace

    from services.mqtt.codec import add_subscription_identifiers

    base = replace(props, subscription_identifier=())
    block = add_subscription_identifiers(encode_properties(base, 3), tuple(ids))
    data = encode_publish(b"t", b"x", 0, False, False, None, block)
    expected = replace(base, subscription_identifier=tuple(ids))
    assert decode(data, 5) == (Publish("t", b"x", properties=expected), len(data))
