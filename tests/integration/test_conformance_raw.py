"""Conformance with raw sockets: what no client library will send.

`Raw` speaks MQTT through the project codec over a plain socket, so a test
can send exact (also malformed) bytes and read exactly what the broker
answers, including whether and when it closes the connection. Statements
checked are the normative ones of MQTT 3.1.1 and 5.0 (section numbers in
the test names' docstrings where it helps).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from services.mqtt.codec import encode
from services.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
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
from tests.integration.conftest import NodeRunner, node_settings
from tests.integration.rawclient import (
    LEVELS,
    V5,
    V311,
    WAIT_S,
    Closed,
    Raw,
    assert_alive,
    opened,
    v5_disconnect_code,
)

# --- CONNECT / CONNACK -------------------------------------------------------


def test_first_packet_not_connect_closes(node: NodeRunner, raws: list[Raw]) -> None:
    r = Raw(node.mqtt_port)
    raws.append(r)
    r.send_bytes(bytes([0xC0, 0x00]))  # PINGREQ
    assert r.closed() == []
    assert_alive(raws, node)


@pytest.mark.parametrize("level", LEVELS)
def test_second_connect_is_a_protocol_violation(
    node: NodeRunner, raws: list[Raw], level: int
) -> None:
    r = opened(raws, node, "twice", level)
    r.send(Connect("twice", protocol_level=level))
    before = r.closed()
    assert not any(isinstance(p, Connack) for p in before)
    if level == V5:
        assert v5_disconnect_code(before) == 0x82
    assert_alive(raws, node, level)


def test_bad_protocol_level_311_gets_connack_01(node: NodeRunner, raws: list[Raw]) -> None:
    r = Raw(node.mqtt_port)
    raws.append(r)
    body = b"\x00\x04MQTT\x07\x02\x00\x3c\x00\x01x"
    r.send_bytes(bytes([0x10, len(body)]) + body)
    before = r.closed()
    assert before == [Connack(False, 0x01)], before


def test_bad_protocol_name_closes_without_connack(node: NodeRunner, raws: list[Raw]) -> None:
    """3.1.1 [MQTT-3.1.2-1]: a wrong protocol name may be disconnected without CONNACK."""
    r = Raw(node.mqtt_port)
    raws.append(r)
    body = b"\x00\x04MQTX\x04\x02\x00\x3c\x00\x01x"
    r.send_bytes(bytes([0x10, len(body)]) + body)
    before = r.closed()
    assert all(isinstance(p, Connack) and p.reason_code != 0 for p in before), before
    assert_alive(raws, node)


def test_unknown_level_6_connack_01(node: NodeRunner, raws: list[Raw]) -> None:
    r = Raw(node.mqtt_port, V311)  # the answer to an unknown level is read as 3.1.1
    raws.append(r)
    body = b"\x00\x04MQTT\x06\x02\x00\x3c\x00\x00\x01x"
    r.send_bytes(bytes([0x10, len(body)]) + body)
    before = r.closed()
    # A client claiming level 6 cannot be spoken to in 5.0; 3.1.1's 0x01 is the safe answer.
    assert len(before) <= 1
    if before:
        assert isinstance(before[0], Connack) and before[0].reason_code in (0x01, 0x84)


def test_connect_reserved_flag_closes(node: NodeRunner, raws: list[Raw]) -> None:
    """[MQTT-3.1.2-3]: the reserved connect flag must be 0."""
    r = Raw(node.mqtt_port)
    raws.append(r)
    body = b"\x00\x04MQTT\x04\x03\x00\x3c\x00\x01x"
    r.send_bytes(bytes([0x10, len(body)]) + body)
    assert not any(isinstance(p, Connack) and p.reason_code == 0 for p in r.closed())
    assert_alive(raws, node)


@pytest.mark.parametrize("level", LEVELS)
def test_will_qos_without_will_flag_closes(node: NodeRunner, raws: list[Raw], level: int) -> None:
    """[MQTT-3.1.2-13]: will QoS must be 0 when the will flag is 0."""
    r = Raw(node.mqtt_port, level)
    raws.append(r)
    props = b"\x00" if level == V5 else b""
    body = b"\x00\x04MQTT" + bytes([level, 0x0A]) + b"\x00\x3c" + props + b"\x00\x01x"
    r.send_bytes(bytes([0x10, len(body)]) + body)
    assert not any(isinstance(p, Connack) and p.reason_code == 0 for p in r.closed())


@pytest.mark.parametrize("level", LEVELS)
def test_will_retain_without_will_flag_closes(
    node: NodeRunner, raws: list[Raw], level: int
) -> None:
    r = Raw(node.mqtt_port, level)
    raws.append(r)
    props = b"\x00" if level == V5 else b""
    body = b"\x00\x04MQTT" + bytes([level, 0x22]) + b"\x00\x3c" + props + b"\x00\x01x"
    r.send_bytes(bytes([0x10, len(body)]) + body)
    assert not any(isinstance(p, Connack) and p.reason_code == 0 for p in r.closed())


def test_password_without_username_311_closes(node: NodeRunner, raws: list[Raw]) -> None:
    """3.1.1 [MQTT-3.1.2-22]: password flag set without the user name flag."""
    r = Raw(node.mqtt_port)
    raws.append(r)
    body = b"\x00\x04MQTT\x04\x42\x00\x3c\x00\x01x\x00\x02pw"
    r.send_bytes(bytes([0x10, len(body)]) + body)
    assert not any(isinstance(p, Connack) and p.reason_code == 0 for p in r.closed())


def test_v5_password_without_username_is_allowed(node: NodeRunner, raws: list[Raw]) -> None:
    """5.0 allows a password without a user name (3.1.2.9)."""
    r = opened(raws, node, "pw-only", V5, password=b"secret")
    r.send(Pingreq())
    assert isinstance(r.recv(), Pingresp)


def test_username_and_password_accepted(node: NodeRunner, raws: list[Raw]) -> None:
    r = opened(raws, node, "userpw", V311, username="u", password=b"p")
    r.send(Pingreq())
    assert isinstance(r.recv(), Pingresp)


def test_311_empty_client_id_needs_clean_session(node: NodeRunner, raws: list[Raw]) -> None:
    """[MQTT-3.1.3-8]: zero-length id with CleanSession=0 gets CONNACK 0x02 then close."""
    r = Raw(node.mqtt_port)
    raws.append(r)
    r.send(Connect("", clean_start=False))
    assert r.closed() == [Connack(False, 0x02)]
    ok = opened(raws, node, "", V311, clean_start=True)
    ok.send(Pingreq())
    assert isinstance(ok.recv(), Pingresp)


def test_v5_assigned_client_identifier(node: NodeRunner, raws: list[Raw]) -> None:
    r = Raw(node.mqtt_port, V5)
    raws.append(r)
    ack = r.connect("")
    assert ack.reason_code == 0
    assigned = ack.properties.assigned_client_identifier
    assert assigned
    other = Raw(node.mqtt_port, V5)
    raws.append(other)
    assert other.connect("").properties.assigned_client_identifier not in (None, assigned)


def test_v5_session_present_and_expiry(node: NodeRunner, raws: list[Raw]) -> None:
    r = opened(
        raws, node, "sp", V5, clean_start=False, properties=Properties(session_expiry_interval=60)
    )
    r.subscribe(Subscription("sp/t", 1))
    r.send(Disconnect())
    r.closed()
    again = Raw(node.mqtt_port, V5)
    raws.append(again)
    ack = again.connect("sp", clean_start=False, properties=Properties(session_expiry_interval=60))
    assert ack.session_present and ack.reason_code == 0
    fresh = Raw(node.mqtt_port, V5)
    raws.append(fresh)
    ack2 = fresh.connect("sp", clean_start=True)
    assert not ack2.session_present


@pytest.mark.parametrize("level", LEVELS)
def test_keep_alive_enforced_at_one_and_a_half(
    node: NodeRunner, raws: list[Raw], level: int
) -> None:
    """[MQTT-3.1.2-24]: no packet within 1.5 x keep alive: the server disconnects."""
    r = opened(raws, node, "ka", level, keep_alive=1)
    started = time.monotonic()
    before = r.closed(timeout=4.0)
    elapsed = time.monotonic() - started
    assert 1.4 <= elapsed < 3.0, elapsed
    if level == V5:
        assert v5_disconnect_code(before) in (None, 0x8D)


def test_keep_alive_pings_keep_the_connection(node: NodeRunner, raws: list[Raw]) -> None:
    r = opened(raws, node, "ka-ok", V311, keep_alive=1)
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        r.send(Pingreq())
        assert isinstance(r.recv(), Pingresp)
        assert r.nothing(within=0.6)
    r.send(Pingreq())
    assert isinstance(r.recv(), Pingresp)


def test_v5_server_keep_alive_caps_a_large_keep_alive(raws: list[Raw]) -> None:
    capped = NodeRunner(node_settings(max_keep_alive_s=100)).start()
    try:
        r = Raw(capped.mqtt_port, V5)
        raws.append(r)
        ack = r.connect("ska", keep_alive=1000)
        assert (ack.reason_code, ack.properties.server_keep_alive) == (0, 100)
        # keep alive 0 (off) is under any maximum: left alone, nothing announced
        off = Raw(capped.mqtt_port, V5)
        raws.append(off)
        ack = off.connect("ska-off", keep_alive=0)
        assert (ack.reason_code, ack.properties.server_keep_alive) == (0, None)
        # 3.1.1 cannot be told: refused (identifier rejected, as Mosquitto does)
        old = Raw(capped.mqtt_port, V311)
        raws.append(old)
        assert old.connect("ska-311", keep_alive=1000).reason_code == 2
    finally:
        capped.stop()


# --- QoS flows, both directions -----------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_qos2_inbound_exactly_once_with_duplicate(
    node: NodeRunner, raws: list[Raw], level: int
) -> None:
    sub = opened(raws, node, "q2sub", level)
    sub.subscribe(Subscription("q2/t", 2))
    pub = opened(raws, node, "q2pub", level)
    pub.send(Publish("q2/t", b"once", qos=2, packet_id=7))
    assert pub.expect(Pubrec).packet_id == 7
    pub.send(Publish("q2/t", b"once", qos=2, packet_id=7, dup=True))
    assert pub.expect(Pubrec).packet_id == 7
    pub.send(Pubrel(7))
    assert pub.expect(Pubcomp).packet_id == 7
    got = sub.expect(Publish)
    assert (got.payload, got.qos) == (b"once", 2)
    sub.send(Pubrec(got.packet_id))
    assert sub.expect(Pubrel).packet_id == got.packet_id
    sub.send(Pubcomp(got.packet_id))
    assert sub.before_barrier(pub, "q2/t", 1) == []


@pytest.mark.parametrize("level", LEVELS)
def test_pubrel_for_unknown_id_gets_pubcomp(node: NodeRunner, raws: list[Raw], level: int) -> None:
    r = opened(raws, node, "relunk", level)
    r.send(Pubrel(99))
    comp = r.expect(Pubcomp)
    assert comp.packet_id == 99
    if level == V5:
        assert comp.reason_code == 0x92  # packet identifier not found


@pytest.mark.parametrize("level", LEVELS)
def test_qos_downgrade_and_overlapping_subscriptions(
    node: NodeRunner, raws: list[Raw], level: int
) -> None:
    """[MQTT-3.3.5-1]: overlapping subscriptions: at most one copy at the max granted QoS
    (5.0 lets the server send one per subscription; Weir sends one)."""
    sub = opened(raws, node, "ov", level)
    ack = sub.subscribe(Subscription("ov/#", 0), Subscription("ov/+", 1))
    assert ack.reason_codes == (0, 1)
    pub = opened(raws, node, "ovp", level)
    pub.send(Publish("ov/a", b"x", qos=2, packet_id=1))
    pub.expect(Pubrec)
    pub.send(Pubrel(1))
    pub.expect(Pubcomp)
    got = sub.expect(Publish)
    assert got.qos == 1
    sub.send(Puback(got.packet_id))
    assert sub.before_barrier(pub, "ov/b", 1) == []


@pytest.mark.parametrize("level", LEVELS)
def test_unsubscribe_and_unsuback(node: NodeRunner, raws: list[Raw], level: int) -> None:
    r = opened(raws, node, "uns", level)
    r.subscribe(Subscription("u/1", 1), Subscription("u/barrier", 1))
    r.send(Unsubscribe(3, ("u/1", "u/never")))
    ack = r.expect(Unsuback)
    assert ack.packet_id == 3
    if level == V5:
        assert ack.reason_codes == (0x00, 0x11)
    r.send(Publish("u/1", b"x", qos=1, packet_id=4))
    assert r.expect(Puback).packet_id == 4
    assert r.before_barrier(r, "u/barrier", 1) == []  # u/1 no longer delivered


@pytest.mark.parametrize("level", LEVELS)
def test_sys_topics_not_publishable_dollar_topics_not_matched(
    node: NodeRunner, raws: list[Raw], level: int
) -> None:
    sub = opened(raws, node, "dollar", level)
    sub.subscribe(Subscription("#", 0), Subscription("+/x", 0), packet_id=1)
    # "$SYS/x", not "$SYS/#": the node's own $SYS/brokers/... figures are retained and
    # would reach a "$SYS/#" subscriber; the point is that a client's $SYS/x does not.
    sub.subscribe(Subscription("$SYS/x", 0), Subscription("$aws/#", 0), packet_id=2)
    pub = opened(raws, node, "dollarpub", level)
    pub.send(Publish("$SYS/x", b"no", qos=1, packet_id=1))
    ack = pub.expect(Puback)
    # Clients cannot publish to $SYS topics: 5.0 is told (PUBACK 0x87 not authorized),
    # 3.1.1 has no way to be told (PUBACK, dropped).
    assert ack.packet_id == 1
    assert ack.reason_code == (0x87 if level == V5 else 0x00)
    # Other $ topics are routed (device SDKs use $aws/..., as on Mosquitto and EMQX),
    # to an explicit subscription only: "#" and "+/x" do not match them.
    pub.send(Publish("$aws/x", b"sdk", qos=0))
    pub.send(Publish("plain/x", b"yes", qos=0))
    got = [sub.expect(Publish) for _ in range(2)]
    assert [(p.topic, p.payload) for p in got] == [("$aws/x", b"sdk"), ("plain/x", b"yes")]
    assert sub.before_barrier(pub, "plain/x", 0) == []


@pytest.mark.parametrize("level", LEVELS)
def test_wildcard_edges(node: NodeRunner, raws: list[Raw], level: int) -> None:
    sub = opened(raws, node, "wild", level)
    ack = sub.subscribe(
        Subscription("sport/#", 0),
        Subscription("+/+", 0),
        Subscription("/+", 0),
        Subscription("+", 0),
    )
    assert ack.reason_codes == (0, 0, 0, 0)
    pub = opened(raws, node, "wildpub", level)
    expect = {
        "sport": 2,  # sport/# and +
        "/finance": 2,  # +/+ and /+ (one copy)
        "a/b": 1,
        "a/b/c": 0,
        "sport/tennis/player1": 1,
    }
    for topic in expect:
        pub.send(Publish(topic, topic.encode(), qos=0))
    pub.send(Publish("end/end/end/end", b"", qos=0))  # unmatched
    pub.send(Publish("marker", b"", qos=0))
    got: list[str] = []
    while True:
        p = sub.expect(Publish)
        if p.topic == "marker":
            break
        got.append(p.topic)
        assert len(got) < 20
    assert sorted(got) == sorted(t for t, n in expect.items() for _ in range(min(n, 1)))


@pytest.mark.parametrize("level", LEVELS)
def test_invalid_topic_filters_refused(node: NodeRunner, raws: list[Raw], level: int) -> None:
    """[MQTT-4.7.1-2] [MQTT-4.7.1-3]: misplaced wildcards make a filter invalid."""
    r = opened(raws, node, "badfilt", level)
    r.send(Subscribe(1, (Subscription("a/#/b", 0), Subscription("a+/b", 0))))
    try:
        p = r.recv()
    except Closed:
        return  # both versions allow closing the connection
    if isinstance(p, Suback):
        assert p.reason_codes == ((0x80, 0x80) if level == V311 else (0x8F, 0x8F))
    else:
        assert level == V5 and isinstance(p, Disconnect) and p.reason_code in (0x81, 0x8F)


# --- malformed input ----------------------------------------------------------


BAD_311 = {
    "qos3-publish": bytes([0x36, 0x05, 0x00, 0x01, 0x61, 0x00, 0x01]),
    "subscribe-bad-flags": bytes([0x80, 0x06, 0x00, 0x01, 0x00, 0x01, 0x61, 0x00]),
    "subscribe-no-filters": bytes([0x82, 0x02, 0x00, 0x01]),
    "publish-wildcard-topic": bytes([0x30, 0x05, 0x00, 0x03, 0x61, 0x2F, 0x2B]),
    "publish-packet-id-0": bytes([0x32, 0x05, 0x00, 0x01, 0x61, 0x00, 0x00]),
    "publish-nul-topic": bytes([0x30, 0x03, 0x00, 0x01, 0x00]),
    "publish-bad-utf8": bytes([0x30, 0x04, 0x00, 0x02, 0xC3, 0x28]),
    "reserved-type-0": bytes([0x00, 0x00]),
    "reserved-type-15-on-311": bytes([0xF0, 0x00]),
    "pingreq-with-body": bytes([0xC0, 0x01, 0x00]),
    "remaining-length-5-bytes": bytes([0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]),
    "subscribe-qos3": bytes([0x82, 0x06, 0x00, 0x01, 0x00, 0x01, 0x61, 0x03]),
    "connack-from-client": bytes([0x20, 0x02, 0x00, 0x00]),
    "suback-from-client": bytes([0x90, 0x03, 0x00, 0x01, 0x00]),
    "unsubscribe-no-filters": bytes([0xA2, 0x02, 0x00, 0x01]),
}


@pytest.mark.parametrize("name", sorted(BAD_311))
def test_malformed_closes_only_that_connection_311(
    node: NodeRunner, raws: list[Raw], name: str
) -> None:
    bystander = opened(raws, node, "bystander", V311)
    bystander.subscribe(Subscription("by/#", 1))
    bad = opened(raws, node, "bad", V311)
    bad.send_bytes(BAD_311[name])
    before = bad.closed()
    assert not any(isinstance(p, Publish) for p in before)
    pub = opened(raws, node, "pub", V311)
    pub.send(Publish("by/x", b"still", qos=1, packet_id=1))
    pub.expect(Puback)
    assert bystander.expect(Publish).payload == b"still"


BAD_5 = {
    # (bytes, the DISCONNECT reason code the spec asks for)
    "qos3-publish": (bytes([0x36, 0x06, 0x00, 0x01, 0x61, 0x00, 0x01, 0x00]), 0x81),
    "topic-alias-0": (
        bytes([0x30, 0x07, 0x00, 0x01, 0x61, 0x03, 0x23, 0x00, 0x00]),
        0x94,
    ),
    "unknown-alias-empty-topic": (
        bytes([0x30, 0x06, 0x00, 0x00, 0x03, 0x23, 0x00, 0x05]),
        0x82,
    ),
    "duplicate-property": (
        bytes([0x30, 0x08, 0x00, 0x01, 0x61, 0x04, 0x01, 0x00, 0x01, 0x00]),
        0x82,
    ),
    "publish-wildcard-topic": (bytes([0x30, 0x06, 0x00, 0x03, 0x61, 0x2F, 0x23, 0x00]), 0x90),
    "subscribe-bad-flags": (bytes([0x80, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, 0x61, 0x00]), 0x81),
    "subscribe-reserved-option-bits": (
        bytes([0x82, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, 0x61, 0xC0]),
        0x81,
    ),
    "subscribe-retain-handling-3": (
        bytes([0x82, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, 0x61, 0x30]),
        0x82,
    ),
    "subscribe-sub-id-0": (
        bytes([0x82, 0x09, 0x00, 0x01, 0x02, 0x0B, 0x00, 0x00, 0x01, 0x61, 0x00]),
        0x82,
    ),
    "shared-no-local": (
        bytes([0x82, 0x10, 0x00, 0x01, 0x00, 0x00, 0x0A]) + b"$share/g/a" + bytes([0x04]),
        0x82,
    ),
    "unknown-property": (bytes([0x30, 0x06, 0x00, 0x01, 0x61, 0x01, 0x7F, 0x00]), 0x81),
    "disconnect-bad-reason": (bytes([0xE0, 0x01, 0x03]), 0x81),
    "pubrel-bad-flags": (bytes([0x60, 0x02, 0x00, 0x01]), 0x81),
}


@pytest.mark.parametrize("name", sorted(BAD_5))
def test_malformed_closes_only_that_connection_v5(
    node: NodeRunner, raws: list[Raw], name: str
) -> None:
    data, code = BAD_5[name]
    bystander = opened(raws, node, "bystander", V5)
    bystander.subscribe(Subscription("by/#", 1))
    bad = opened(raws, node, "bad", V5, properties=Properties(topic_alias_maximum=0))
    bad.send_bytes(data)
    before = bad.closed()
    assert not any(isinstance(p, Publish) for p in before)
    assert v5_disconnect_code(before) == code, before
    pub = opened(raws, node, "pub", V5)
    pub.send(Publish("by/x", b"still", qos=1, packet_id=1))
    pub.expect(Puback)
    assert bystander.expect(Publish).payload == b"still"


def test_v5_payload_not_utf8_as_its_format_says_is_refused_alone(
    node: NodeRunner, raws: list[Raw]
) -> None:
    """Payload Format Indicator 1 over bytes that are not UTF-8: PUBACK 0x99 for that
    message, nothing routed, the connection goes on (it was DISCONNECT 0x99; the
    spec allows either, and Mosquitto keeps the connection)."""
    sub = opened(raws, node, "pfi-sub", V5)
    sub.subscribe(Subscription("pfi/#", 0))
    pub = opened(raws, node, "pfi-pub", V5)
    utf8 = Properties(payload_format_indicator=1)
    pub.send(Publish("pfi/x", b"\xff", qos=1, packet_id=1, properties=utf8))
    assert pub.expect(Puback) == Puback(1, 0x99)
    pub.send(Publish("pfi/x", b"\xff", qos=0, properties=utf8))
    assert sub.before_barrier(pub, "pfi/x", 0) == []


def test_v5_past_receive_maximum_is_flow_control(node: NodeRunner, raws: list[Raw]) -> None:
    """A 5.0 client sending QoS 1 PUBLISHes past the Receive Maximum (as MQTT.js 5
    does) is not disconnected: every one is routed and acknowledged, in order."""
    sub = opened(raws, node, "rm-sub", V5)
    sub.subscribe(Subscription("rm/#", 0))
    r = Raw(node.mqtt_port, V5)
    raws.append(r)
    ack = r.connect("rmx")
    count = 3 * (ack.properties.receive_maximum or 65535)
    assert count <= 3000
    r.send_bytes(
        b"".join(
            encode(Publish("rm/x", b"%d" % i, qos=1, packet_id=i), V5) for i in range(1, count + 1)
        )
    )
    acks = [r.expect(Puback) for _ in range(count)]
    assert [(a.packet_id, a.reason_code) for a in acks] == [(i, 0) for i in range(1, count + 1)]
    assert [sub.expect(Publish).payload for _ in range(count)] == [
        b"%d" % i for i in range(1, count + 1)
    ]
    r.send(Pingreq())
    r.expect(Pingresp)


def test_v5_qos2_awaiting_pubrel_is_bounded(node: NodeRunner, raws: list[Raw]) -> None:
    """QoS 2 messages left awaiting PUBREL past max_awaiting_rel (100, as EMQX) get
    PUBREC 0x97 Quota exceeded and are not routed; the connection goes on, a PUBREL
    frees a place."""
    sub = opened(raws, node, "rel-sub", V5)
    sub.subscribe(Subscription("rel/#", 2))
    r = opened(raws, node, "rel", V5)
    for i in range(1, 103):
        r.send(Publish("rel/x", b"%d" % i, qos=2, packet_id=i))
    recs = [r.expect(Pubrec) for _ in range(102)]  # a refusal need not wait for routes
    assert sorted((p.packet_id, p.reason_code) for p in recs) == [
        *((i, 0) for i in range(1, 101)),
        (101, 0x97),
        (102, 0x97),
    ]
    r.send(Pubrel(1))
    assert r.expect(Pubcomp).packet_id == 1
    r.send(Publish("rel/x", b"101", qos=2, packet_id=101))
    assert (r.expect(Pubrec).reason_code, r.nothing()) == (0, True)


def test_v5_strict_receive_maximum_disconnects() -> None:
    """[MQTT-3.3.4-9] with --strict-receive-maximum: more unacked QoS 2 than the
    Receive Maximum (ids awaiting PUBREL count) is DISCONNECT 0x93."""
    runner = NodeRunner(node_settings(strict_receive_maximum=True, receive_maximum=4)).start()
    r = Raw(runner.mqtt_port, V5)
    try:
        ack = r.connect("rmx")
        assert ack.properties.receive_maximum == 4
        for i in range(1, 6):
            r.send(Publish("rm/x", b"", qos=2, packet_id=i))
        before = r.closed()
        assert v5_disconnect_code(before) == 0x93
        # PUBRECs still being prepared when the violation arrives may be lost with the
        # connection; the client resends those QoS 2 messages on its next session.
        assert sum(isinstance(p, Pubrec) for p in before) <= 4
    finally:
        r.close()
        runner.stop()


def test_v5_max_awaiting_rel_setting() -> None:
    runner = NodeRunner(node_settings(max_awaiting_rel=3)).start()
    r = Raw(runner.mqtt_port, V5)
    try:
        r.connect("rel3")
        for i in range(1, 5):
            r.send(Publish("rel3/x", b"", qos=2, packet_id=i))
        recs = sorted((p.packet_id, p.reason_code) for p in (r.expect(Pubrec) for _ in range(4)))
        assert recs == [(1, 0x10), (2, 0x10), (3, 0x10), (4, 0x97)]  # 0x10: no subscribers
    finally:
        r.close()
        runner.stop()


@pytest.fixture
def small_node() -> Iterator[NodeRunner]:
    runner = NodeRunner(node_settings(max_packet_size=256)).start()
    try:
        yield runner
    finally:
        runner.stop()


def test_v5_packet_too_large_from_client(small_node: NodeRunner, raws: list[Raw]) -> None:
    r = Raw(small_node.mqtt_port, V5)
    raws.append(r)
    ack = r.connect("big")
    assert ack.properties.maximum_packet_size == 256
    r.send(Publish("big", b"x" * 400, qos=0))
    assert v5_disconnect_code(r.closed()) == 0x95
    assert_alive(raws, small_node, V5)


def test_311_packet_too_large_closes(small_node: NodeRunner, raws: list[Raw]) -> None:
    r = opened(raws, small_node, "big311", V311)
    r.send(Publish("big", b"x" * 400, qos=0))
    assert r.closed() == []
    assert_alive(raws, small_node, V311)


def test_v5_server_never_sends_a_packet_over_client_maximum(
    node: NodeRunner, raws: list[Raw]
) -> None:
    """[MQTT-3.1.2-25]: too-large packets for the client are discarded, not sent."""
    sub = opened(raws, node, "tiny", V5, properties=Properties(maximum_packet_size=64))
    sub.subscribe(Subscription("mps/#", 1))
    pub = opened(raws, node, "mpspub", V5)
    pub.send(Publish("mps/big", b"x" * 200, qos=1, packet_id=1))
    pub.expect(Puback)
    pub.send(Publish("mps/small", b"ok", qos=1, packet_id=2))
    pub.expect(Puback)
    got = sub.expect(Publish)
    assert got.topic == "mps/small" or got.properties.topic_alias is not None
    assert got.payload == b"ok"
    assert len(encode(got, V5)) <= 64


def test_v5_server_honours_client_receive_maximum(node: NodeRunner, raws: list[Raw]) -> None:
    """[MQTT-3.3.4-7]: never more unacked QoS 1/2 than the client's Receive Maximum."""
    sub = opened(raws, node, "rm2", V5, properties=Properties(receive_maximum=2))
    sub.subscribe(Subscription("rmc/#", 1))
    pub = opened(raws, node, "rm2pub", V5)
    for i in range(1, 6):
        pub.send(Publish("rmc/x", b"%d" % i, qos=1, packet_id=i))
        pub.expect(Puback)
    first = [sub.expect(Publish), sub.expect(Publish)]
    assert sub.nothing(within=0.4)
    sub.send(Puback(first[0].packet_id))
    third = sub.expect(Publish)
    assert sub.nothing(within=0.3)
    rest = [third]
    for p in [first[1], third]:
        sub.send(Puback(p.packet_id))
    rest += [sub.expect(Publish), sub.expect(Publish)]
    assert [p.payload for p in first + rest] == [b"1", b"2", b"3", b"4", b"5"]


def test_v5_disconnect_with_will_message(node: NodeRunner, raws: list[Raw]) -> None:
    watcher = opened(raws, node, "ww", V5)
    watcher.subscribe(Subscription("w5/#", 1))
    w = opened(raws, node, "willer", V5, will=Will("w5/dead", b"bye", 1))
    w.send(Disconnect(0x04))
    w.closed()
    got = watcher.expect(Publish)
    assert (got.topic, got.payload) == ("w5/dead", b"bye")


def test_v5_normal_disconnect_discards_will(node: NodeRunner, raws: list[Raw]) -> None:
    watcher = opened(raws, node, "ww2", V5)
    watcher.subscribe(Subscription("w6/#", 1))
    w = opened(raws, node, "willer2", V5, will=Will("w6/dead", b"bye", 1))
    w.send(Disconnect(0x00))
    w.closed()
    assert watcher.before_barrier(watcher, "w6/barrier", 1) == []


@pytest.mark.parametrize("level", LEVELS)
def test_will_on_protocol_violation(node: NodeRunner, raws: list[Raw], level: int) -> None:
    """A connection closed for a protocol error publishes its will [MQTT-3.1.2-8]."""
    watcher = opened(raws, node, "wpv", level)
    watcher.subscribe(Subscription("wpv/#", 1))
    w = opened(raws, node, "wpvc", level, will=Will("wpv/dead", b"bye", 1))
    w.send_bytes(bytes([0x00, 0x00]))
    w.closed()
    got = watcher.expect(Publish)
    assert got.payload == b"bye"


@pytest.mark.parametrize("level", LEVELS)
def test_will_retain(node: NodeRunner, raws: list[Raw], level: int) -> None:
    w = opened(raws, node, "wr", level, will=Will("wr/state", b"offline", 1, retain=True))
    w.close()
    late = opened(raws, node, "wrlate", level)
    deadline = time.monotonic() + WAIT_S
    while True:
        late.subscribe(Subscription("wr/state", 1))
        try:
            got = late.expect(Publish, timeout=0.3)
            break
        except TimeoutError:
            assert time.monotonic() < deadline
            late.send(Unsubscribe(2, ("wr/state",)))
            late.expect(Unsuback)
    assert (got.payload, got.retain) == (b"offline", True)


@pytest.mark.parametrize("level", LEVELS)
def test_takeover_closes_old_connection(node: NodeRunner, raws: list[Raw], level: int) -> None:
    old = opened(raws, node, "tk", level)
    opened(raws, node, "tk", level)
    before = old.closed()
    if level == V5:
        assert v5_disconnect_code(before) == 0x8E
    else:
        assert before == []


@pytest.mark.parametrize("level", LEVELS)
def test_inflight_resent_with_dup_on_resume(node: NodeRunner, raws: list[Raw], level: int) -> None:
    kw: dict[str, Any] = {"clean_start": False}
    if level == V5:
        kw["properties"] = Properties(session_expiry_interval=60)
    sub = opened(raws, node, "dup", level, **kw)
    sub.subscribe(Subscription("dup/#", 2))
    pub = opened(raws, node, "duppub", level)
    pub.send(Publish("dup/1", b"q1", qos=1, packet_id=1))
    pub.expect(Puback)
    pub.send(Publish("dup/2", b"q2", qos=2, packet_id=2))
    pub.expect(Pubrec)
    pub.send(Pubrel(2))
    pub.expect(Pubcomp)
    a = sub.expect(Publish)
    b = sub.expect(Publish)
    assert not a.dup and not b.dup
    sub.send(Pubrec(b.packet_id))
    assert sub.expect(Pubrel).packet_id == b.packet_id
    sub.close()  # neither the PUBACK for a nor the PUBCOMP for b
    again = Raw(node.mqtt_port, level)
    raws.append(again)
    ack = again.connect("dup", **kw)
    assert ack.session_present
    first = again.recv()
    second = again.recv()
    got = {type(first), type(second)}
    assert got == {Publish, Pubrel}, (first, second)
    resent = first if isinstance(first, Publish) else second
    rel = second if isinstance(first, Publish) else first
    assert isinstance(resent, Publish) and isinstance(rel, Pubrel)
    assert resent.dup and resent.packet_id == a.packet_id and resent.payload == b"q1"
    assert rel.packet_id == b.packet_id
    again.send(Puback(a.packet_id))
    again.send(Pubcomp(rel.packet_id))
    assert again.before_barrier(again, "dup/barrier", 1) == []
