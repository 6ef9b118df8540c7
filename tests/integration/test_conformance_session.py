"""Conformance of sessions, flow control and CONNECT validation over raw sockets.

Send quota (PUBREC does not free it, PUBCOMP does), topic aliases not
surviving a reconnect, shared members leaving with unacked messages,
re-subscribing, takeover with and without clean start, CONNECT property
rules, and DISCONNECT 0x8B when the node shuts down.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from services.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
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
    opened,
    v5_disconnect_code,
)

PERSIST: dict[str, Any] = {
    "clean_start": False,
    "properties": Properties(session_expiry_interval=60),
}


def publish1(pub: Raw, topic: str, payload: bytes, pid: int, **kw: Any) -> None:
    pub.send(Publish(topic, payload, qos=1, packet_id=pid, **kw))
    assert pub.expect(Puback).packet_id == pid


def test_send_quota_held_until_pubcomp(node: NodeRunner, raws: list[Raw]) -> None:
    """4.9: PUBREC (success) does not free a send-quota slot; PUBCOMP does."""
    sub = opened(raws, node, "quota", V5, properties=Properties(receive_maximum=1))
    sub.subscribe(Subscription("quota", 2))
    pub = opened(raws, node, "quotap", V5)
    for i in (1, 2):
        pub.send(Publish("quota", b"%d" % i, qos=2, packet_id=i))
        pub.expect(Pubrec)
        pub.send(Pubrel(i))
        pub.expect(Pubcomp)
    first = sub.expect(Publish)
    sub.send(Pubrec(first.packet_id))
    assert sub.expect(Pubrel).packet_id == first.packet_id
    assert sub.nothing(within=0.4)
    sub.send(Pubcomp(first.packet_id))
    second = sub.expect(Publish)
    assert second.payload == b"2"


def test_pubrec_error_ends_the_flow(node: NodeRunner, raws: list[Raw]) -> None:
    """4.3.3: PUBREC >= 0x80 completes the exchange: no PUBREL, and the slot frees."""
    sub = opened(raws, node, "recerr", V5, properties=Properties(receive_maximum=1))
    sub.subscribe(Subscription("recerr", 2))
    pub = opened(raws, node, "recerrp", V5)
    for i in (1, 2):
        pub.send(Publish("recerr", b"%d" % i, qos=2, packet_id=i))
        pub.expect(Pubrec)
        pub.send(Pubrel(i))
        pub.expect(Pubcomp)
    first = sub.expect(Publish)
    sub.send(Pubrec(first.packet_id, 0x80))
    second = sub.expect(Publish)
    assert second.payload == b"2"


def test_server_topic_aliases_reset_on_reconnect(node: NodeRunner, raws: list[Raw]) -> None:
    """3.3.2.3.4: aliases live for one network connection; after reconnecting the
    server must send the topic name again before using an alias."""
    props = Properties(session_expiry_interval=60, topic_alias_maximum=5)
    sub = opened(raws, node, "tar", V5, clean_start=False, properties=props)
    sub.subscribe(Subscription("tar/#", 1))
    pub = opened(raws, node, "tarp", V5)
    publish1(pub, "tar/x", b"1", 1)
    first = sub.expect(Publish)
    assert first.topic == "tar/x"
    sub.send(Puback(first.packet_id))
    sub.send(Disconnect())
    sub.closed()
    publish1(pub, "tar/x", b"2", 2)
    again = Raw(node.mqtt_port, V5)
    raws.append(again)
    assert again.connect("tar", clean_start=False, properties=props).session_present
    p = again.expect(Publish)
    assert p.topic == "tar/x" and p.payload == b"2"


def test_shared_member_leaving_hands_over_unacked(node: NodeRunner, raws: list[Raw]) -> None:
    """4.8.2: a member that disconnects without acknowledging: its QoS 1 messages go
    to another member (clean-session member) rather than being lost."""
    a = opened(raws, node, "sha", V5, properties=Properties(receive_maximum=1))
    a.subscribe(Subscription("$share/h/hand/#", 1))
    pub = opened(raws, node, "shap", V5)
    publish1(pub, "hand/x", b"1", 1)
    got_a = a.expect(Publish)
    b = opened(raws, node, "shb", V5)
    b.subscribe(Subscription("$share/h/hand/#", 1))
    a.close()  # without PUBACK
    p = b.expect(Publish)
    assert p.payload == got_a.payload


@pytest.mark.parametrize("level", LEVELS)
def test_resubscribe_replaces_and_resends_retained(
    node: NodeRunner, raws: list[Raw], level: int
) -> None:
    """[MQTT-3.8.4-3]: an identical filter replaces the subscription (new QoS) and
    the retained messages are sent again (5.0: retain handling 0)."""
    pub = opened(raws, node, "rsp", level)
    publish1(pub, "rs/x", b"kept", 1, retain=True)
    sub = opened(raws, node, "rss", level)
    sub.subscribe(Subscription("rs/#", 0))
    assert sub.expect(Publish).qos == 0
    sub.subscribe(Subscription("rs/#", 1), packet_id=2)
    again = sub.expect(Publish)
    assert (again.payload, again.qos, again.retain) == (b"kept", 1, True)
    sub.send(Puback(again.packet_id))
    publish1(pub, "rs/y", b"live", 2)
    live = sub.expect(Publish)
    assert (live.payload, live.qos) == (b"live", 1)
    assert sub.before_barrier(pub, "rs/barrier", 1) == []


def test_v5_takeover_with_clean_start_drops_session(node: NodeRunner, raws: list[Raw]) -> None:
    old = opened(raws, node, "tcs", V5, **PERSIST)
    old.subscribe(Subscription("tcs", 1))
    new = Raw(node.mqtt_port, V5)
    raws.append(new)
    ack = new.connect("tcs", clean_start=True)
    assert ack.reason_code == 0 and not ack.session_present
    assert v5_disconnect_code(old.closed()) == 0x8E
    pub = opened(raws, node, "tcsp", V5)
    publish1(pub, "tcs", b"x", 1)
    assert new.nothing()


@pytest.mark.parametrize("level", LEVELS)
def test_takeover_keeps_persistent_session(node: NodeRunner, raws: list[Raw], level: int) -> None:
    kw: dict[str, Any] = PERSIST if level == V5 else {"clean_start": False}
    old = opened(raws, node, "tks", level, **kw)
    old.subscribe(Subscription("tks", 1))
    new = Raw(node.mqtt_port, level)
    raws.append(new)
    ack = new.connect("tks", **kw)
    assert ack.reason_code == 0 and ack.session_present
    old.closed()
    pub = opened(raws, node, "tksp", level)
    publish1(pub, "tks", b"x", 1)
    assert new.expect(Publish).payload == b"x"


def test_v5_takeover_with_will_delay_keeps_will(node: NodeRunner, raws: list[Raw]) -> None:
    """3.1.3.2.2: the session continues under the new connection: a delayed will is
    not published."""
    watcher = opened(raws, node, "twd", V5)
    watcher.subscribe(Subscription("twd/#", 1))
    will = Will("twd/dead", b"bye", 1, properties=Properties(will_delay_interval=2))
    opened(raws, node, "twdc", V5, will=will, **PERSIST)
    opened(raws, node, "twdc", V5, **PERSIST)
    assert watcher.nothing(within=2.6)


BAD_CONNECT_5 = {
    "receive-maximum-0": Properties(receive_maximum=0),
    "maximum-packet-size-0": Properties(maximum_packet_size=0),
    "request-problem-information-2": Properties(request_problem_information=2),
    "request-response-information-2": Properties(request_response_information=2),
}


@pytest.mark.parametrize("name", sorted(BAD_CONNECT_5))
def test_v5_connect_property_protocol_errors(node: NodeRunner, raws: list[Raw], name: str) -> None:
    """3.1.2.11: these values are a Protocol Error: CONNACK >= 0x80 (0x82 or 0x81)."""
    r = Raw(node.mqtt_port, V5)
    raws.append(r)
    r.send(Connect(name, protocol_level=V5, properties=BAD_CONNECT_5[name]))
    before = r.closed()
    assert len(before) <= 1
    if before:
        assert isinstance(before[0], Connack) and before[0].reason_code in (0x81, 0x82)


def test_v5_property_not_allowed_in_packet(node: NodeRunner, raws: list[Raw]) -> None:
    """2.2.2.2: a property not defined for the packet type makes it malformed."""
    r = opened(raws, node, "propx", V5)
    # PUBLISH carrying Session Expiry Interval (0x11)
    r.send_bytes(bytes([0x30, 0x0A, 0x00, 0x01, 0x61, 0x05, 0x11, 0x00, 0x00, 0x00, 0x05, 0x78]))
    assert v5_disconnect_code(r.closed()) in (0x81, 0x82)


def test_v5_will_payload_format_invalid(node: NodeRunner, raws: list[Raw]) -> None:
    """3.1.3.2.3: will PFI 1 with a non-UTF-8 will payload: CONNACK 0x99 (or close)."""
    r = Raw(node.mqtt_port, V5)
    raws.append(r)
    will = Will("w/x", b"\xff\xfe", properties=Properties(payload_format_indicator=1))
    r.send(Connect("wpfi", protocol_level=V5, will=will))
    before = r.closed()
    assert len(before) <= 1
    if before:
        assert isinstance(before[0], Connack) and before[0].reason_code in (0x99, 0x81)


@pytest.mark.parametrize("level", LEVELS)
def test_client_id_with_nul_refused(node: NodeRunner, raws: list[Raw], level: int) -> None:
    r = Raw(node.mqtt_port, level)
    raws.append(r)
    r.send(Connect("bad\x00id", protocol_level=level))
    assert not any(isinstance(p, Connack) and p.reason_code == 0 for p in r.closed())


@pytest.mark.parametrize("level", LEVELS)
def test_shared_filter_rules(node: NodeRunner, raws: list[Raw], level: int) -> None:
    """4.8.2: ShareName has no wildcards and is followed by a non-empty filter."""
    r = opened(raws, node, "shf", level)
    bad = ("$share/a+b/x", "$share/g", "$share//x", "$share/a#/x")
    r.send(Subscribe(1, tuple(Subscription(f, 0) for f in bad)))
    try:
        p = r.recv()
    except Closed:
        return
    if isinstance(p, Suback):
        assert all(code >= 0x80 for code in p.reason_codes), p
    else:
        assert level == V5 and isinstance(p, Disconnect) and p.reason_code >= 0x80


def test_granted_qos_and_subscribe_many(node: NodeRunner, raws: list[Raw]) -> None:
    r = opened(raws, node, "many", V311)
    subs = tuple(Subscription(f"m/{i}", i % 3) for i in range(60))
    ack = r.subscribe(*subs)
    assert ack.reason_codes == tuple(i % 3 for i in range(60))


@pytest.fixture
def doomed_node() -> Iterator[NodeRunner]:
    runner = NodeRunner(node_settings()).start()
    try:
        yield runner
    finally:
        runner.stop()


def test_v5_server_shutdown_sends_0x8b(doomed_node: NodeRunner, raws: list[Raw]) -> None:
    v5 = opened(raws, doomed_node, "sd5", V5)
    v3 = opened(raws, doomed_node, "sd3", V311)
    doomed_node.stop()
    assert v5_disconnect_code(v5.closed()) == 0x8B
    assert v3.closed() == []


def test_v5_takeover_with_clean_start_sends_delayed_will(node: NodeRunner, raws: list[Raw]) -> None:
    """3.1.4 (note): with Clean Start 1 the old session ends, so its will goes now."""
    watcher = opened(raws, node, "twc", V5)
    watcher.subscribe(Subscription("twc/#", 1))
    will = Will("twc/dead", b"bye", 1, properties=Properties(will_delay_interval=30))
    opened(raws, node, "twcc", V5, will=will, **PERSIST)
    opened(raws, node, "twcc", V5, clean_start=True)
    assert watcher.expect(Publish, timeout=2.0).payload == b"bye"


def test_v5_clean_start_reconnect_sends_pending_delayed_will(
    node: NodeRunner, raws: list[Raw]
) -> None:
    """[MQTT-3.1.3-9] covers a reconnect to *this* session; a Clean Start ends it,
    and a session that ends publishes its pending will."""
    watcher = opened(raws, node, "pdw", V5)
    watcher.subscribe(Subscription("pdw/#", 1))
    will = Will("pdw/dead", b"bye", 1, properties=Properties(will_delay_interval=30))
    w = opened(raws, node, "pdwc", V5, will=will, **PERSIST)
    w.close()
    assert watcher.nothing(within=0.3)
    opened(raws, node, "pdwc", V5, clean_start=True)
    assert watcher.expect(Publish, timeout=2.0).payload == b"bye"


def test_v5_resend_on_resume_respects_new_receive_maximum(
    node: NodeRunner, raws: list[Raw]
) -> None:
    """[MQTT-3.3.4-7]: on resume the unacked resend plus the queue stay within the
    Receive Maximum of the new connection."""
    props = Properties(session_expiry_interval=60, receive_maximum=10)
    sub = opened(raws, node, "rmr", V5, clean_start=False, properties=props)
    sub.subscribe(Subscription("rmr", 1))
    pub = opened(raws, node, "rmrp", V5)
    for i in range(1, 6):
        publish1(pub, "rmr", b"%d" % i, i)
    first = [sub.expect(Publish) for _ in range(5)]
    assert len({p.packet_id for p in first}) == 5
    sub.close()  # none acknowledged
    for i in range(6, 9):
        publish1(pub, "rmr", b"%d" % i, i)
    again = Raw(node.mqtt_port, V5)
    raws.append(again)
    small = Properties(session_expiry_interval=60, receive_maximum=2)
    assert again.connect("rmr", clean_start=False, properties=small).session_present
    got: list[bytes] = []
    window = [again.expect(Publish), again.expect(Publish)]
    assert again.nothing(within=0.4), "more than Receive Maximum unacked"
    while window:
        p = window.pop(0)
        got.append(p.payload)
        again.send(Puback(p.packet_id))
        if len(got) + len(window) < 8:
            window.append(again.expect(Publish))
        assert len(got) <= 8
    assert got == [b"%d" % i for i in range(1, 9)]


def test_v5_retained_on_subscribe_respect_receive_maximum_and_size(
    node: NodeRunner, raws: list[Raw]
) -> None:
    pub = opened(raws, node, "rrp", V5)
    for i in range(1, 5):
        publish1(pub, f"rr/{i}", b"%d" % i, i, retain=True)
    publish1(pub, "rr/big", b"x" * 500, 9, retain=True)
    sub = opened(
        raws,
        node,
        "rrs",
        V5,
        properties=Properties(receive_maximum=1, maximum_packet_size=200),
    )
    sub.subscribe(Subscription("rr/#", 1))
    got: list[bytes] = []
    for _ in range(4):
        p = sub.expect(Publish)
        assert sub.nothing(within=0.2), "a second unacked PUBLISH with Receive Maximum 1"
        got.append(p.payload)
        sub.send(Puback(p.packet_id))
    assert sorted(got) == [b"1", b"2", b"3", b"4"]
    assert sub.before_barrier(pub, "rr/barrier", 1) == []
