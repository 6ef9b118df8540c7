"""Conformance of MQTT 5 features, byte-exact over raw sockets.

Topic aliases both ways, message expiry, the request/response and
user properties, subscription identifiers, no-local, retain handling,
shared subscriptions and session expiry, each checked against the
normative statements of MQTT 5.0 (and 3.1.1 where the feature exists).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from services.mqtt.packets import (
    Disconnect,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from tests.integration.conftest import NodeRunner
from tests.integration.rawclient import (
    LEVELS,
    V5,
    V311,
    Raw,
    opened,
)


def publish1(pub: Raw, topic: str, payload: bytes, pid: int, **kw: Any) -> None:
    pub.send(Publish(topic, payload, qos=1, packet_id=pid, **kw))
    ack = pub.expect(Puback)
    assert ack.packet_id == pid


def test_topic_alias_from_client(node: NodeRunner, raws: list[Raw]) -> None:
    """3.3.2.3.4: an alias set with a topic, then used with an empty topic."""
    sub = opened(raws, node, "tas", V5)
    sub.subscribe(Subscription("ta/#", 1))
    pub = Raw(node.mqtt_port, V5)
    raws.append(pub)
    ack = pub.connect("tap")
    assert (ack.properties.topic_alias_maximum or 0) >= 1
    publish1(pub, "ta/one", b"1", 1, properties=Properties(topic_alias=1))
    publish1(pub, "", b"2", 2, properties=Properties(topic_alias=1))
    publish1(pub, "ta/two", b"3", 3, properties=Properties(topic_alias=1))  # remapped
    publish1(pub, "", b"4", 4, properties=Properties(topic_alias=1))
    got = [sub.expect(Publish) for _ in range(4)]
    assert [(p.topic, p.payload) for p in got] == [
        ("ta/one", b"1"),
        ("ta/one", b"2"),
        ("ta/two", b"3"),
        ("ta/two", b"4"),
    ]
    assert all(p.properties.topic_alias is None for p in got)  # client allowed none


def test_topic_alias_to_client(node: NodeRunner, raws: list[Raw]) -> None:
    """3.3.2.3.4: the server may alias up to the client's Topic Alias Maximum, never above."""
    sub = opened(raws, node, "tac", V5, properties=Properties(topic_alias_maximum=1))
    sub.subscribe(Subscription("tb/#", 0))
    pub = opened(raws, node, "tacp", V5)
    for i, topic in enumerate(["tb/a", "tb/a", "tb/b", "tb/a", "tb/b"], 1):
        publish1(pub, topic, b"%d" % i, i)
    aliases: dict[int, str] = {}
    seen: list[str] = []
    for _ in range(5):
        p = sub.expect(Publish)
        alias = p.properties.topic_alias
        if alias is not None:
            assert 1 <= alias <= 1
            if p.topic:
                aliases[alias] = p.topic
            else:
                assert alias in aliases
        else:
            assert p.topic
        seen.append(p.topic or aliases[alias])
    assert seen == ["tb/a", "tb/a", "tb/b", "tb/a", "tb/b"]


@pytest.mark.parametrize("qos", [0, 1])
def test_topic_alias_to_client_every_qos(node: NodeRunner, raws: list[Raw], qos: int) -> None:
    """Outbound aliases are used at QoS 0 too, when the client allows them."""
    sub = opened(raws, node, f"taq{qos}", V5, properties=Properties(topic_alias_maximum=2))
    sub.subscribe(Subscription("tq/#", qos))
    pub = opened(raws, node, f"taqp{qos}", V5)
    for i in range(1, 4):
        pub.send(Publish("tq/long/topic/name", b"%d" % i, qos=qos, packet_id=i if qos else None))
    got = [sub.expect(Publish) for _ in range(3)]
    assert [p.payload for p in got] == [b"1", b"2", b"3"]
    assert got[0].topic == "tq/long/topic/name" and got[0].properties.topic_alias == 1
    assert [(p.topic, p.properties.topic_alias) for p in got[1:]] == [("", 1), ("", 1)]


def test_message_expiry_offline_queue(node: NodeRunner, raws: list[Raw]) -> None:
    """3.3.2.3.3: an expired message is not delivered; the interval sent is what is left."""
    kw: dict[str, Any] = {
        "clean_start": False,
        "properties": Properties(session_expiry_interval=60),
    }
    sub = opened(raws, node, "mexp", V5, **kw)
    sub.subscribe(Subscription("mx/#", 1))
    sub.send(Disconnect())
    sub.closed()
    pub = opened(raws, node, "mexpp", V5)
    publish1(pub, "mx/short", b"s", 1, properties=Properties(message_expiry_interval=1))
    publish1(pub, "mx/long", b"l", 2, properties=Properties(message_expiry_interval=100))
    publish1(pub, "mx/none", b"n", 3)
    started = time.monotonic()
    # Wait out the short expiry with a bounded, condition-free wait on a live socket.
    while time.monotonic() - started < 2.1:
        assert pub.nothing(within=0.3)
    again = Raw(node.mqtt_port, V5)
    raws.append(again)
    assert again.connect("mexp", **kw).session_present
    got = [again.expect(Publish) for _ in range(2)]
    assert [p.payload for p in got] == [b"l", b"n"]
    left = got[0].properties.message_expiry_interval
    assert left is not None and 95 <= left <= 98
    assert got[1].properties.message_expiry_interval is None
    for p in got:
        again.send(Puback(p.packet_id))
    assert again.before_barrier(pub, "mx/barrier", 1) == []


def test_properties_pass_through_unchanged(node: NodeRunner, raws: list[Raw]) -> None:
    """3.3.2.3: the server forwards these properties unaltered to every subscriber."""
    sub = opened(raws, node, "pp", V5)
    sub.subscribe(Subscription("pp/#", 2))
    pub = opened(raws, node, "ppp", V5)
    props = Properties(
        payload_format_indicator=1,
        content_type="application/json; charset=utf-8",
        response_topic="pp/reply/ü",
        correlation_data=b"\x00\x01corr\xff",
        user_property=(("k", "v1"), ("k", "v2"), ("a", ""), ("Ünï", "çødé")),
    )
    pub.send(Publish("pp/req", b'{"x": 1}', qos=2, packet_id=5, properties=props))
    pub.expect(Pubrec)
    pub.send(Pubrel(5))
    pub.expect(Pubcomp)
    got = sub.expect(Publish)
    gp = got.properties
    assert got.payload == b'{"x": 1}'
    assert gp.payload_format_indicator == 1
    assert gp.content_type == props.content_type
    assert gp.response_topic == props.response_topic
    assert gp.correlation_data == props.correlation_data
    assert gp.user_property == props.user_property


def test_subscription_identifiers(node: NodeRunner, raws: list[Raw]) -> None:
    """3.3.4: each matching subscription's identifier; none for one without."""
    sub = opened(raws, node, "sid", V5)
    sub.subscribe(Subscription("si/+", 0), properties=Properties(subscription_identifier=(11,)))
    sub.subscribe(
        Subscription("si/#", 0), packet_id=2, properties=Properties(subscription_identifier=(22,))
    )
    sub.subscribe(Subscription("other", 0), packet_id=3)
    pub = opened(raws, node, "sidp", V5)
    publish1(pub, "si/a", b"1", 1)
    publish1(pub, "si/a/b", b"2", 2)
    publish1(pub, "other", b"3", 3)
    a, b, c = (sub.expect(Publish) for _ in range(3))
    assert sorted(a.properties.subscription_identifier) == [11, 22]
    assert b.properties.subscription_identifier == (22,)
    assert c.properties.subscription_identifier == ()
    # Re-subscribing replaces the identifier.
    sub.subscribe(
        Subscription("si/#", 0), packet_id=4, properties=Properties(subscription_identifier=(33,))
    )
    publish1(pub, "si/a/b", b"4", 4)
    assert sub.expect(Publish).properties.subscription_identifier == (33,)


def test_no_local(node: NodeRunner, raws: list[Raw]) -> None:
    me = opened(raws, node, "nl", V5)
    me.subscribe(Subscription("nl/#", 1, no_local=True))
    me.subscribe(Subscription("nl/+", 0), packet_id=2)  # overlapping, local allowed
    me.send(Publish("nl/x", b"own", qos=1, packet_id=7))
    got = [me.recv(), me.recv()]
    kinds = sorted(type(p).__name__ for p in got)
    assert kinds == ["Puback", "Publish"]
    pub = next(p for p in got if isinstance(p, Publish))
    assert pub.qos == 0  # only the local-allowed subscription matched
    assert me.before_barrier(me, "nl/barrier", 1) == []


@pytest.mark.parametrize("level", LEVELS)
def test_retained_set_replace_clear(node: NodeRunner, raws: list[Raw], level: int) -> None:
    """3.3.1.3: retain stores (replacing), an empty retained payload clears; live
    deliveries to existing subscribers carry retain 0 (3.1.1 [MQTT-3.3.1-9])."""
    pub = opened(raws, node, "rp", level)
    publish1(pub, "rt/a", b"v1", 1, retain=True)
    publish1(pub, "rt/a", b"v2", 2, retain=True)
    publish1(pub, "rt/b", b"b", 3, retain=True)
    pub.send(Publish("rt/c", b"q0", qos=0, retain=True))
    sub = opened(raws, node, "rs", level)
    sub.subscribe(Subscription("rt/#", 1))
    got = {p.topic: p for p in (sub.expect(Publish) for _ in range(3))}
    assert {t: p.payload for t, p in got.items()} == {"rt/a": b"v2", "rt/b": b"b", "rt/c": b"q0"}
    assert all(p.retain for p in got.values())
    assert got["rt/c"].qos == 0 and got["rt/a"].qos == 1
    for p in got.values():
        if p.qos:
            sub.send(Puback(p.packet_id))
    publish1(pub, "rt/a", b"", 4, retain=True)
    live = sub.expect(Publish)
    assert (live.topic, live.payload, live.retain) == ("rt/a", b"", False)
    sub.send(Puback(live.packet_id))
    publish1(pub, "rt/b", b"live", 5, retain=False)
    live2 = sub.expect(Publish)
    assert (live2.payload, live2.retain) == (b"live", False)
    sub.send(Puback(live2.packet_id))
    late = opened(raws, node, "rl", level)
    late.subscribe(Subscription("rt/#", 0))
    left = {p.topic: p.payload for p in (late.expect(Publish) for _ in range(2))}
    assert left == {"rt/b": b"b", "rt/c": b"q0"}
    assert late.before_barrier(pub, "rt/barrier", 0) == []


def test_retain_handling_1_only_new_subscription(node: NodeRunner, raws: list[Raw]) -> None:
    pub = opened(raws, node, "rh1p", V5)
    publish1(pub, "rh1/x", b"kept", 1, retain=True)
    sub = opened(raws, node, "rh1", V5)
    sub.subscribe(Subscription("rh1/#", 0, retain_handling=1))
    assert sub.expect(Publish).payload == b"kept"
    sub.subscribe(Subscription("rh1/#", 0, retain_handling=1), packet_id=2)
    assert sub.before_barrier(pub, "rh1/barrier", 0) == []
    sub.subscribe(Subscription("rh1/#", 0, retain_handling=0), packet_id=3)
    assert sub.expect(Publish).payload == b"kept"


def test_retain_as_published(node: NodeRunner, raws: list[Raw]) -> None:
    rap = opened(raws, node, "rap", V5)
    rap.subscribe(Subscription("rap/#", 0, retain_as_published=True))
    plain = opened(raws, node, "rapn", V5)
    plain.subscribe(Subscription("rap/#", 0))
    pub = opened(raws, node, "rapp", V5)
    publish1(pub, "rap/x", b"r", 1, retain=True)
    assert rap.expect(Publish).retain is True
    assert plain.expect(Publish).retain is False
    publish1(pub, "rap/x", b"", 2, retain=True)


def test_shared_subscription_each_message_once(node: NodeRunner, raws: list[Raw]) -> None:
    """4.8.2: each message to exactly one member; a leaving member stops getting any."""
    members = [opened(raws, node, f"sh{i}", V5) for i in range(3)]
    for m in members:
        m.subscribe(Subscription("$share/g/sh/#", 1))
    plain = opened(raws, node, "shplain", V5)
    plain.subscribe(Subscription("sh/#", 1))
    pub = opened(raws, node, "shp", V5)
    n = 12
    for i in range(1, n + 1):
        publish1(pub, "sh/x", b"%d" % i, i)
    got: list[bytes] = []
    for _ in range(n):
        p = plain.expect(Publish)
        plain.send(Puback(p.packet_id))
    for m in members:
        while True:
            try:
                p = m.expect(Publish, timeout=0.3)
            except TimeoutError:
                break
            got.append(p.payload)
            m.send(Puback(p.packet_id))
            assert len(got) <= n
    assert sorted(got) == sorted(b"%d" % i for i in range(1, n + 1))
    leaver = members.pop()
    leaver.send(Unsubscribe(9, ("$share/g/sh/#",)))
    assert leaver.expect(Unsuback).reason_codes == (0,)
    for i in range(n + 1, n + 5):
        publish1(pub, "sh/y", b"%d" % i, i)
    assert leaver.nothing()
    rest: list[bytes] = []
    for m in members:
        while True:
            try:
                p = m.expect(Publish, timeout=0.3)
            except TimeoutError:
                break
            rest.append(p.payload)
            m.send(Puback(p.packet_id))
            assert len(rest) <= 4
    assert sorted(rest) == sorted(b"%d" % i for i in range(n + 1, n + 5))


def test_shared_subscription_retained_not_sent(node: NodeRunner, raws: list[Raw]) -> None:
    """4.8.2: retained messages are not sent on subscribing to a shared subscription."""
    pub = opened(raws, node, "shrp", V5)
    publish1(pub, "shr/x", b"kept", 1, retain=True)
    m = opened(raws, node, "shr", V5)
    m.subscribe(Subscription("$share/g/shr/#", 0))
    assert m.before_barrier(pub, "shr/barrier", 0) == []


@pytest.mark.parametrize("level", LEVELS)
def test_persistent_session_queues_qos1_and_qos2(
    node: NodeRunner, raws: list[Raw], level: int
) -> None:
    kw: dict[str, Any] = {"clean_start": False}
    if level == V5:
        kw["properties"] = Properties(session_expiry_interval=60)
    sub = opened(raws, node, "ps", level, **kw)
    sub.subscribe(Subscription("ps/#", 2))
    sub.close()
    pub = opened(raws, node, "psp", level)
    pub.send(Publish("ps/0", b"q0", qos=0))
    publish1(pub, "ps/1", b"q1", 1)
    pub.send(Publish("ps/2", b"q2", qos=2, packet_id=2))
    pub.expect(Pubrec)
    pub.send(Pubrel(2))
    pub.expect(Pubcomp)
    again = Raw(node.mqtt_port, level)
    raws.append(again)
    assert again.connect("ps", **kw).session_present
    got = []
    for p in again.before_barrier(pub, "ps/barrier", 1):
        assert isinstance(p, Publish), p
        got.append((p.payload, p.qos))
        if p.qos == 1:
            again.send(Puback(p.packet_id))
        elif p.qos == 2:
            again.send(Pubrec(p.packet_id))
            assert again.expect(Pubrel).packet_id == p.packet_id
            again.send(Pubcomp(p.packet_id))
        assert len(got) <= 3
    qos12 = [g for g in got if g[1]]
    assert qos12 == [(b"q1", 1), (b"q2", 2)]
    assert set(got) - set(qos12) <= {(b"q0", 0)}  # queuing QoS 0 offline is optional


def test_v5_session_expiry_zero_discards_on_close(node: NodeRunner, raws: list[Raw]) -> None:
    first = opened(raws, node, "se0", V5, clean_start=False)
    first.subscribe(Subscription("se0", 1))
    first.send(Disconnect())
    first.closed()
    again = Raw(node.mqtt_port, V5)
    raws.append(again)
    assert not again.connect("se0", clean_start=False).session_present


def test_v5_disconnect_can_set_session_expiry(node: NodeRunner, raws: list[Raw]) -> None:
    kw: dict[str, Any] = {
        "clean_start": False,
        "properties": Properties(session_expiry_interval=60),
    }
    first = opened(raws, node, "sed", V5, **kw)
    first.send(Disconnect(properties=Properties(session_expiry_interval=0)))
    first.closed()
    again = Raw(node.mqtt_port, V5)
    raws.append(again)
    assert not again.connect("sed", **kw).session_present


def test_v5_disconnect_expiry_after_zero_is_protocol_error(
    node: NodeRunner, raws: list[Raw]
) -> None:
    """3.14.2.2.2: non-zero session expiry on DISCONNECT after 0 on CONNECT: 0x82."""
    r = opened(raws, node, "sez", V5)
    r.send(Disconnect(properties=Properties(session_expiry_interval=30)))
    codes = [p.reason_code for p in r.closed() if isinstance(p, Disconnect)]
    assert codes == [0x82]


@pytest.mark.parametrize("level", [V311])
def test_311_qos2_to_subscriber_resends_pubrel_state(
    node: NodeRunner, raws: list[Raw], level: int
) -> None:
    """A subscriber that answers PUBREC gets PUBREL even after reconnecting."""
    sub = opened(raws, node, "rel", level, clean_start=False)
    sub.subscribe(Subscription("rel", 2))
    pub = opened(raws, node, "relp", level)
    pub.send(Publish("rel", b"x", qos=2, packet_id=1))
    pub.expect(Pubrec)
    pub.send(Pubrel(1))
    pub.expect(Pubcomp)
    p = sub.expect(Publish)
    sub.send(Pubrec(p.packet_id))
    assert sub.expect(Pubrel).packet_id == p.packet_id
    sub.close()
    again = Raw(node.mqtt_port, level)
    raws.append(again)
    assert again.connect("rel", clean_start=False).session_present
    rel = again.expect(Pubrel)
    assert rel.packet_id == p.packet_id
    again.send(Pubcomp(rel.packet_id))
    assert again.before_barrier(again, "rel", 1) == []


def test_retained_on_subscribe_carry_subscription_identifier(
    node: NodeRunner, raws: list[Raw]
) -> None:
    """3.8.2.1.2: retained messages sent for a SUBSCRIBE carry its identifier."""
    pub = opened(raws, node, "rsip", V5)
    publish1(pub, "rsi/x", b"kept", 1, retain=True)
    sub = opened(raws, node, "rsis", V5)
    sub.subscribe(Subscription("rsi/#", 1), properties=Properties(subscription_identifier=(77,)))
    p = sub.expect(Publish)
    assert (p.payload, p.retain) == (b"kept", True)
    assert p.properties.subscription_identifier == (77,)


def test_will_retain_as_published_and_expiry(node: NodeRunner, raws: list[Raw]) -> None:
    rap = opened(raws, node, "wrap", V5)
    rap.subscribe(Subscription("wrap/#", 1, retain_as_published=True))
    will = Will(
        "wrap/state", b"gone", 1, retain=True, properties=Properties(message_expiry_interval=60)
    )
    w = opened(raws, node, "wrapc", V5, will=will)
    w.close()
    p = rap.expect(Publish)
    assert (p.payload, p.retain) == (b"gone", True)
    left = p.properties.message_expiry_interval
    assert left is not None and 58 <= left <= 60
    rap.send(Puback(p.packet_id))
    publish1(opened(raws, node, "wrapclr", V5), "wrap/state", b"", 1, retain=True)


def test_qos0_retained_empty_payload_clears(node: NodeRunner, raws: list[Raw]) -> None:
    pub = opened(raws, node, "r0p", V5)
    publish1(pub, "r0/x", b"kept", 1, retain=True)
    pub.send(Publish("r0/x", b"", qos=0, retain=True))
    pub.send(Pingreq())
    pub.expect(Pingresp)
    sub = opened(raws, node, "r0s", V5)
    sub.subscribe(Subscription("r0/#", 1))
    assert sub.before_barrier(pub, "r0/barrier", 1) == []
