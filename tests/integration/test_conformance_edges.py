"""Conformance edge cases an independent checker probes, over raw sockets.

Framing (byte-by-byte and pipelined input, multi-byte lengths), packet id
reuse, will timing on takeover and reconnect, keep-alive limits, topic
name rules, MQTT 3.1 (MQIsdp), and retained-message expiry.
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
    Will,
)
from tests.integration.conftest import NodeRunner, node_settings
from tests.integration.rawclient import (
    LEVELS,
    V5,
    V311,
    Closed,
    Raw,
    assert_alive,
    opened,
    v5_disconnect_code,
)


def publish1(pub: Raw, topic: str, payload: bytes, pid: int, **kw: Any) -> None:
    pub.send(Publish(topic, payload, qos=1, packet_id=pid, **kw))
    assert pub.expect(Puback).packet_id == pid


@pytest.mark.parametrize("level", LEVELS)
def test_byte_by_byte_input(node: NodeRunner, raws: list[Raw], level: int) -> None:
    sub = opened(raws, node, "bbs", level)
    sub.subscribe(Subscription("bb", 1))
    r = Raw(node.mqtt_port, level)
    raws.append(r)
    data = encode(Connect("bb1", protocol_level=level), level)
    data += encode(Publish("bb", b"z" * 200, qos=1, packet_id=3), level)
    for i in range(len(data)):
        r.send_bytes(data[i : i + 1])
    assert isinstance(r.recv(), Connack)
    assert r.expect(Puback).packet_id == 3
    assert sub.expect(Publish).payload == b"z" * 200


@pytest.mark.parametrize("level", LEVELS)
def test_pipelined_connect_subscribe_publish(node: NodeRunner, raws: list[Raw], level: int) -> None:
    r = Raw(node.mqtt_port, level)
    raws.append(r)
    data = encode(Connect("pipe", protocol_level=level), level)
    data += encode(Subscribe(1, (Subscription("pipe", 1),)), level)
    data += encode(Publish("pipe", b"self", qos=1, packet_id=2), level)
    data += encode(Pingreq(), level)
    r.send_bytes(data)
    assert isinstance(r.recv(), Connack)
    assert isinstance(r.recv(), Suback)
    rest = [r.recv() for _ in range(3)]
    assert sorted(type(p).__name__ for p in rest) == ["Pingresp", "Puback", "Publish"]


@pytest.mark.parametrize("level", LEVELS)
def test_large_payload_multi_byte_length(node: NodeRunner, raws: list[Raw], level: int) -> None:
    sub = opened(raws, node, "lps", level)
    sub.subscribe(Subscription("lp", 1))
    pub = opened(raws, node, "lpp", level)
    big = bytes(range(256)) * 1000  # 256000 bytes: a 3-byte remaining length
    publish1(pub, "lp", big, 1)
    assert sub.expect(Publish).payload == big


@pytest.mark.parametrize("level", LEVELS)
def test_packet_id_reuse_after_qos2_completes(
    node: NodeRunner, raws: list[Raw], level: int
) -> None:
    """After PUBCOMP a packet id is free: the same id is a new message [MQTT-2.3.1-2]."""
    sub = opened(raws, node, "reuse", level)
    sub.subscribe(Subscription("reuse", 0))
    pub = opened(raws, node, "reusep", level)
    for payload in (b"first", b"second"):
        pub.send(Publish("reuse", payload, qos=2, packet_id=42))
        pub.expect(Pubrec)
        pub.send(Pubrel(42))
        pub.expect(Pubcomp)
    assert [sub.expect(Publish).payload for _ in range(2)] == [b"first", b"second"]


@pytest.mark.parametrize("level", LEVELS)
def test_qos2_not_delivered_twice_before_pubrel(
    node: NodeRunner, raws: list[Raw], level: int
) -> None:
    """Method B/A both: a resent PUBLISH before PUBREL is not a second delivery."""
    sub = opened(raws, node, "q2d", level)
    sub.subscribe(Subscription("q2d", 0))
    kw: dict[str, Any] = {"clean_start": False}
    if level == V5:
        kw["properties"] = Properties(session_expiry_interval=60)
    pub = opened(raws, node, "q2dp", level, **kw)
    pub.send(Publish("q2d", b"x", qos=2, packet_id=5))
    pub.expect(Pubrec)
    pub.close()
    again = Raw(node.mqtt_port, level)
    raws.append(again)
    assert again.connect("q2dp", **kw).session_present
    again.send(Publish("q2d", b"x", qos=2, packet_id=5, dup=True))
    again.expect(Pubrec)
    again.send(Pubrel(5))
    again.expect(Pubcomp)
    assert sub.expect(Publish).payload == b"x"
    assert sub.before_barrier(again, "q2d", 0) == []


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("qos", [1, 2, 3], ids=["qos1", "qos2", "mixed"])
def test_ordered_delivery_per_topic(
    node: NodeRunner, raws: list[Raw], level: int, qos: int
) -> None:
    """[MQTT-4.6.0-6]: one publisher, one topic, one QoS: delivered in the order sent.

    The spec orders only within a QoS; Weir also keeps a mix of QoS 1 and 2 in order."""
    sub = opened(raws, node, "ord", level)
    sub.subscribe(Subscription("ord", 2))
    pub = opened(raws, node, "ordp", level)
    n = 30
    for i in range(1, n + 1):
        pub.send(Publish("ord", b"%d" % i, qos=qos if qos < 3 else 1 + i % 2, packet_id=i))
    got: list[bytes] = []
    while len(got) < n:
        p = sub.recv()
        if isinstance(p, Publish):
            assert p.packet_id is not None
            got.append(p.payload)
            if p.qos == 1:
                sub.send(Puback(p.packet_id))
            else:
                sub.send(Pubrec(p.packet_id))
        elif isinstance(p, Pubrel):
            sub.send(Pubcomp(p.packet_id))
    assert got == [b"%d" % i for i in range(1, n + 1)], got


@pytest.mark.parametrize("level", LEVELS)
def test_will_published_on_takeover(node: NodeRunner, raws: list[Raw], level: int) -> None:
    """The old connection closes without DISCONNECT: its will (no delay) is published."""
    watcher = opened(raws, node, "wt", level)
    watcher.subscribe(Subscription("wt/#", 1))
    opened(raws, node, "wtc", level, will=Will("wt/old", b"taken", 1))
    opened(raws, node, "wtc", level)
    got = watcher.expect(Publish)
    assert (got.topic, got.payload) == ("wt/old", b"taken")


def test_will_delay_cancelled_by_reconnect(node: NodeRunner, raws: list[Raw]) -> None:
    """3.1.3.2.2: the will is not sent if the session resumes before the delay ends."""
    watcher = opened(raws, node, "wdc", V5)
    watcher.subscribe(Subscription("wdc/#", 1))
    kw: dict[str, Any] = {
        "clean_start": False,
        "properties": Properties(session_expiry_interval=60),
    }
    w = opened(
        raws,
        node,
        "wdcc",
        V5,
        will=Will("wdc/dead", b"bye", 1, properties=Properties(will_delay_interval=1)),
        **kw,
    )
    w.close()
    opened(raws, node, "wdcc", V5, **kw)
    assert watcher.nothing(within=1.6)


def test_will_delay_longer_than_session_expiry(node: NodeRunner, raws: list[Raw]) -> None:
    """3.1.3.2.2: the will goes at the earlier of will delay and session end."""
    watcher = opened(raws, node, "wse", V5)
    watcher.subscribe(Subscription("wse/#", 1))
    w = opened(
        raws,
        node,
        "wsec",
        V5,
        will=Will("wse/dead", b"bye", 1, properties=Properties(will_delay_interval=30)),
        properties=Properties(session_expiry_interval=1),
    )
    started = time.monotonic()
    w.close()
    got = watcher.expect(Publish, timeout=4.0)
    assert got.payload == b"bye"
    assert time.monotonic() - started < 3.0


def test_will_properties_pass_through(node: NodeRunner, raws: list[Raw]) -> None:
    watcher = opened(raws, node, "wpp", V5)
    watcher.subscribe(Subscription("wpp/#", 1))
    props = Properties(
        content_type="text/plain",
        response_topic="wpp/resp",
        correlation_data=b"cd",
        user_property=(("who", "me"),),
        payload_format_indicator=1,
    )
    w = opened(raws, node, "wppc", V5, will=Will("wpp/dead", b"bye", 1, properties=props))
    w.close()
    got = watcher.expect(Publish).properties
    assert (got.content_type, got.response_topic, got.correlation_data) == (
        "text/plain",
        "wpp/resp",
        b"cd",
    )
    assert got.user_property == (("who", "me"),)
    assert got.payload_format_indicator == 1


@pytest.mark.parametrize("level", LEVELS)
def test_will_topic_with_wildcard_refused(node: NodeRunner, raws: list[Raw], level: int) -> None:
    r = Raw(node.mqtt_port, level)
    raws.append(r)
    r.send(Connect("wwild", protocol_level=level, will=Will("a/+", b"x")))
    before = r.closed()
    assert not any(isinstance(p, Connack) and p.reason_code == 0 for p in before)


def test_mqtt_31_mqisdp(node: NodeRunner, raws: list[Raw]) -> None:
    r = Raw(node.mqtt_port, 3)
    raws.append(r)
    ack = r.connect("old-client", protocol_name="MQIsdp")
    assert ack.reason_code == 0
    r.subscribe(Subscription("v31", 1))
    r.send(Publish("v31", b"hi", qos=1, packet_id=2))
    got = [r.recv(), r.recv()]
    assert sorted(type(p).__name__ for p in got) == ["Puback", "Publish"]


def test_311_long_client_id_accepted(node: NodeRunner, raws: list[Raw]) -> None:
    r = opened(raws, node, "c" * 200, V311)
    r.send(Pingreq())
    assert isinstance(r.recv(), Pingresp)


def test_keep_alive_zero_means_no_timeout(node: NodeRunner, raws: list[Raw]) -> None:
    r = opened(raws, node, "ka0", V311, keep_alive=0)
    assert r.nothing(within=1.0)
    r.send(Pingreq())
    assert isinstance(r.recv(), Pingresp)


def test_keep_alive_reset_by_any_packet(node: NodeRunner, raws: list[Raw]) -> None:
    r = opened(raws, node, "kaany", V311, keep_alive=1)
    deadline = time.monotonic() + 2.5
    i = 0
    while time.monotonic() < deadline:
        i += 1
        r.send(Publish("kaany", b"", qos=1, packet_id=i))
        assert r.expect(Puback).packet_id == i
        assert r.nothing(within=0.7)
    assert i >= 3


@pytest.fixture
def capped_node() -> Iterator[NodeRunner]:
    runner = NodeRunner(node_settings(max_keep_alive_s=1)).start()
    try:
        yield runner
    finally:
        runner.stop()


def test_v5_server_keep_alive_is_announced_and_enforced(
    capped_node: NodeRunner, raws: list[Raw]
) -> None:
    """3.2.2.3.14: the client must use Server Keep Alive; the server enforces 1.5x of it."""
    r = Raw(capped_node.mqtt_port, V5)
    raws.append(r)
    ack = r.connect("ska", keep_alive=300)
    assert ack.properties.server_keep_alive == 1
    started = time.monotonic()
    before = r.closed(timeout=4.0)
    assert 1.4 <= time.monotonic() - started < 3.0
    assert v5_disconnect_code(before) in (None, 0x8D)


@pytest.mark.parametrize("level", LEVELS)
def test_topic_levels_and_empty_levels(node: NodeRunner, raws: list[Raw], level: int) -> None:
    sub = opened(raws, node, "lv", level)
    sub.subscribe(Subscription("#", 0), Subscription("+/+/+", 0), Subscription("a//b", 0))
    pub = opened(raws, node, "lvp", level)
    for t in ("/", "a//b", "//", "ü/€/𝄞"):
        pub.send(Publish(t, t.encode(), qos=0))
    got = [sub.expect(Publish) for _ in range(4)]
    assert [p.topic for p in got] == ["/", "a//b", "//", "ü/€/𝄞"]
    assert sub.before_barrier(pub, "barrier", 0) == []


@pytest.mark.parametrize("level", LEVELS)
def test_empty_filter_refused(node: NodeRunner, raws: list[Raw], level: int) -> None:
    """[MQTT-4.7.3-1]: topic filters are at least one character."""
    r = opened(raws, node, "ef", level)
    r.send(Subscribe(1, (Subscription("", 0),)))
    try:
        p = r.recv()
    except Closed:
        return
    if isinstance(p, Suback):
        assert p.reason_codes[0] >= 0x80
    else:
        assert isinstance(p, Disconnect) and p.reason_code >= 0x80


@pytest.mark.parametrize("level", LEVELS)
def test_retained_qos_is_min_of_stored_and_granted(
    node: NodeRunner, raws: list[Raw], level: int
) -> None:
    pub = opened(raws, node, "rqp", level)
    pub.send(Publish("rq/2", b"two", qos=2, retain=True, packet_id=1))
    pub.expect(Pubrec)
    pub.send(Pubrel(1))
    pub.expect(Pubcomp)
    s0 = opened(raws, node, "rq0", level)
    s0.subscribe(Subscription("rq/#", 0))
    assert s0.expect(Publish).qos == 0
    s2 = opened(raws, node, "rq2", level)
    s2.subscribe(Subscription("rq/#", 2))
    p = s2.expect(Publish)
    assert (p.qos, p.retain) == (2, True)


def test_retained_message_expires(node: NodeRunner, raws: list[Raw]) -> None:
    """3.3.2.3.3: a retained message past its expiry is not delivered on subscribe."""
    pub = opened(raws, node, "rxp", V5)
    publish1(
        pub, "rx/short", b"s", 1, retain=True, properties=Properties(message_expiry_interval=1)
    )
    publish1(
        pub, "rx/long", b"l", 2, retain=True, properties=Properties(message_expiry_interval=60)
    )
    started = time.monotonic()
    while time.monotonic() - started < 2.1:
        assert pub.nothing(within=0.3)
    sub = opened(raws, node, "rxs", V5)
    sub.subscribe(Subscription("rx/#", 1))
    p = sub.expect(Publish)
    assert p.payload == b"l"
    left = p.properties.message_expiry_interval
    assert left is not None and 55 <= left <= 58
    assert sub.before_barrier(pub, "rx/barrier", 1) == []


def test_v5_auth_method_unsupported(node: NodeRunner, raws: list[Raw]) -> None:
    """4.12: an authentication method the server does not support: CONNACK 0x8C (or 0x87)."""
    r = Raw(node.mqtt_port, V5)
    raws.append(r)
    r.send(Connect("am", protocol_level=V5, properties=Properties(authentication_method="X-NOPE")))
    before = r.closed()
    assert len(before) == 1 and isinstance(before[0], Connack)
    assert before[0].reason_code in (0x8C, 0x87)


def test_v5_auth_packet_without_method_is_protocol_error(node: NodeRunner, raws: list[Raw]) -> None:
    r = opened(raws, node, "authx", V5)
    r.send_bytes(bytes([0xF0, 0x00]))
    assert v5_disconnect_code(r.closed()) == 0x82
    assert_alive(raws, node, V5)


def test_v5_request_problem_information_0(node: NodeRunner, raws: list[Raw]) -> None:
    """3.1.2.11.7: with RPI 0 no Reason String / User Property except on PUBLISH,
    CONNACK and DISCONNECT."""
    r = opened(raws, node, "rpi", V5, properties=Properties(request_problem_information=0))
    r.send(Subscribe(1, (Subscription("a/#/b", 0), Subscription("ok", 0))))
    try:
        p = r.recv()
    except Closed:
        return
    if isinstance(p, Suback):
        assert p.properties.reason_string is None and p.properties.user_property == ()


def test_v5_puback_no_matching_subscribers(node: NodeRunner, raws: list[Raw]) -> None:
    """PUBACK 0x10 (no matching subscribers) or 0x00 are both success codes."""
    r = opened(raws, node, "nms", V5)
    r.send(Publish("nobody/here", b"", qos=1, packet_id=1))
    assert r.expect(Puback).reason_code in (0x00, 0x10)


@pytest.mark.parametrize("level", LEVELS)
def test_server_packet_ids_unique_while_inflight(
    node: NodeRunner, raws: list[Raw], level: int
) -> None:
    sub = opened(raws, node, "pid", level)
    sub.subscribe(Subscription("pid", 2))
    pub = opened(raws, node, "pidp", level)
    for i in range(1, 11):
        pub.send(Publish("pid", b"%d" % i, qos=1 + i % 2, packet_id=i))
    got = [sub.expect(Publish) for _ in range(10)]
    ids = [p.packet_id for p in got]
    assert len(set(ids)) == 10 and all(ids)


@pytest.mark.parametrize("level", LEVELS)
def test_disconnect_then_no_more_packets(node: NodeRunner, raws: list[Raw], level: int) -> None:
    """[MQTT-3.14.4-1]: after DISCONNECT the server closes and acts on nothing else."""
    sub = opened(raws, node, "dis", level)
    sub.subscribe(Subscription("dis", 0))
    r = opened(raws, node, "disc", level)
    r.send_bytes(encode(Disconnect(), level) + encode(Publish("dis", b"after", qos=0), level))
    r.closed()
    assert sub.before_barrier(sub, "dis", 0) == []


@pytest.mark.parametrize("level", LEVELS)
def test_announced_oversize_refused_before_the_body(
    node: NodeRunner, raws: list[Raw], level: int
) -> None:
    """The maximum packet size is checked from the fixed header: a PUBLISH announcing
    ~256 MB is refused at once (5.0: DISCONNECT 0x95) without the body being sent."""
    r = opened(raws, node, "huge", level)
    r.send_bytes(bytes([0x30, 0xFF, 0xFF, 0xFF, 0x7F, 0x00, 0x01]))
    before = r.closed(timeout=2.0)
    if level == V5:
        assert v5_disconnect_code(before) == 0x95
    else:
        assert before == []
    assert_alive(raws, node, level)


def test_v5_empty_client_id_without_clean_start(node: NodeRunner, raws: list[Raw]) -> None:
    """5.0 3.1.3.1: a zero-length id gets an assigned one whatever Clean Start says."""
    r = Raw(node.mqtt_port, V5)
    raws.append(r)
    ack = r.connect("", clean_start=False)
    assert ack.reason_code == 0 and ack.properties.assigned_client_identifier
    assert not ack.session_present


def test_mqtt_31_client_id_over_23_accepted(node: NodeRunner, raws: list[Raw]) -> None:
    """MQTT 3.1 asked for client ids of 1 to 23 characters; Mosquitto and EMQX take
    longer ones (old libraries send long default ids), and so does Weir. An empty
    one, which 3.1 has no meaning for, is still refused with CONNACK 0x02."""
    r = Raw(node.mqtt_port, 3)
    raws.append(r)
    r.send(Connect("x" * 40, protocol_level=3, protocol_name="MQIsdp"))
    assert r.recv() == Connack(False, 0)
    empty = Raw(node.mqtt_port, 3)
    raws.append(empty)
    empty.send(Connect("", protocol_level=3, protocol_name="MQIsdp"))
    assert empty.closed() == [Connack(False, 0x02)]


@pytest.fixture
def quick_connect_node() -> Iterator[NodeRunner]:
    from dataclasses import replace

    runner = NodeRunner(node_settings()).start()
    broker = runner.node.broker

    def shorten() -> None:
        broker.channel_config = replace(broker.channel_config, connect_timeout_s=0.5)

    runner.call(shorten)
    try:
        yield runner
    finally:
        runner.stop()


@pytest.mark.parametrize("sent", [b"", b"\x10\x20\x00\x04MQ"], ids=["silent", "half-connect"])
def test_no_connect_in_time_closes(
    quick_connect_node: NodeRunner, raws: list[Raw], sent: bytes
) -> None:
    """3.1.4 (5.0): no CONNECT within a reasonable time: the server closes the connection."""
    r = Raw(quick_connect_node.mqtt_port)
    raws.append(r)
    if sent:
        r.send_bytes(sent)
    started = time.monotonic()
    assert r.closed(timeout=4.0) == []
    assert 0.4 <= time.monotonic() - started < 3.0
    ok = opened(raws, quick_connect_node, "in-time", V311)
    assert ok.nothing(within=1.0)  # a connected client is not cut by the connect timer
    ok.send(Pingreq())
    assert isinstance(ok.recv(), Pingresp)
