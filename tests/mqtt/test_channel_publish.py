"""Channel: PUBLISH both ways, QoS 0/1/2 flows, topic aliases, limits, expiry, size."""

from __future__ import annotations

import pytest

from services.mqtt.actions import (
    Acked,
    Action,
    CancelTimer,
    Dropped,
    Received,
    Released,
    Route,
    Send,
)
from services.mqtt.channel import KEEPALIVE_TIMER, Channel
from services.mqtt.channel_config import ChannelConfig
from services.mqtt.channel_outbound import publish_size, remaining_expiry_s
from services.mqtt.packets import (
    NO_PROPERTIES,
    Disconnect,
    Message,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Will,
)
from tests.support.channel import NOW, V3, V5, V311, WALL_MS, closed, connected, plain

NOW_MS = WALL_MS
WILL = Will("wills/c1", b"gone")


def aliased(topic: str, alias: int) -> Publish:
    return Publish(topic, b"", properties=Properties(topic_alias=alias))


def error_close(level: int, code: int) -> list[Action]:
    sent: list[Action] = [Send(Disconnect(code))] if level == V5 else []
    return [*sent, closed("error", WILL)]


def conn(level: int, cfg: ChannelConfig | None = None, **kw: object) -> Channel:
    return connected(level, cfg or ChannelConfig(), keep_alive=0, will=WILL, **kw)  # type: ignore[arg-type]


# --- inbound -------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", [V3, V311, V5])
def test_qos0_is_routed_without_token(level: int) -> None:
    ch = conn(level)
    assert ch.receive(Publish("a/b", b"hi", retain=True), NOW) == [
        Route(Message("a/b", b"hi", 0, True, sender="c1"))
    ]


@pytest.mark.parametrize("level", [V3, V311, V5])
def test_qos1_inbound_exchange(level: int) -> None:
    ch = conn(level)
    assert ch.receive(Publish("a", b"1", qos=1, packet_id=10), NOW) == [
        Route(Message("a", b"1", qos=1, sender="c1"), token=1)
    ]
    assert ch.inbound_inflight == 1
    assert ch.routed(1, ok=True) == [Send(Puback(10))]
    assert ch.inbound_inflight == 0
    assert ch.routed(1, ok=True) == []


@pytest.mark.parametrize(("level", "code"), [(V311, 0), (V5, 0x10)])
def test_no_matching_subscribers(level: int, code: int) -> None:
    ch = conn(level)
    ch.receive(Publish("a", b"", qos=1, packet_id=1), NOW)
    ch.receive(Publish("a", b"", qos=2, packet_id=2), NOW)
    assert ch.routed(1, ok=True, no_subscribers=True) == [Send(Puback(1, code))]
    assert ch.routed(2, ok=True, no_subscribers=True) == [Send(Pubrec(2, code))]


@pytest.mark.parametrize(
    ("level", "qos", "reason", "expected"),
    [
        (V5, 1, None, [Send(Puback(7, 0x80))]),
        (V5, 1, 0x97, [Send(Puback(7, 0x97))]),
        (V5, 2, 0x87, [Send(Pubrec(7, 0x87))]),
        (V311, 1, 0x87, [Send(Puback(7))]),
        (V311, 2, 0x87, [Send(Pubrec(7))]),
        (V311, 1, None, [closed("error", WILL)]),
        (V3, 2, 0x80, [closed("error", WILL)]),
    ],
)
def test_routing_failure(level: int, qos: int, reason: int | None, expected: list[Action]) -> None:
    ch = conn(level)
    ch.receive(Publish("a", b"", qos=qos, packet_id=7), NOW)
    assert plain(ch.routed(1, ok=False, reason_code=reason)) == expected
    assert ch.inbound_inflight == 0


@pytest.mark.parametrize("level", [V3, V311, V5])
def test_qos2_inbound_exchange(level: int) -> None:
    ch = conn(level)
    publish = Publish("a", b"2", qos=2, packet_id=20)
    assert ch.receive(publish, NOW) == [
        Route(Message("a", b"2", qos=2, sender="c1"), token=1, qos2_packet_id=20)
    ]
    assert ch.receive(Publish("a", b"2", qos=2, packet_id=20, dup=True), NOW) == []
    assert ch.routed(1, ok=True) == [Send(Pubrec(20))]
    assert ch.receive(Publish("a", b"2", qos=2, packet_id=20, dup=True), NOW) == [
        Send(Pubrec(20))
    ]
    assert ch.inbound_inflight == 1
    assert ch.receive(Pubrel(20), NOW) == [Released(20), Send(Pubcomp(20))]
    assert ch.inbound_inflight == 0
    unknown = Pubcomp(20, 0x92) if level == V5 else Pubcomp(20)
    assert ch.receive(Pubrel(20), NOW) == [Send(unknown)]
    assert ch.receive(publish, NOW) == [
        Route(Message("a", b"2", qos=2, sender="c1"), token=2, qos2_packet_id=20)
    ]


def test_the_channel_counts_what_it_routes_per_qos_in_its_config() -> None:
    cfg = ChannelConfig()
    ch = conn(V5, cfg)
    ch.receive(Publish("a", b"zero"), NOW)
    ch.receive(Publish("a", b"one", qos=1, packet_id=1), NOW)
    ch.receive(Publish("a", b"two", qos=2, packet_id=2), NOW)
    ch.receive(Publish("a", b"two", qos=2, packet_id=2, dup=True), NOW)  # a repeat: not routed
    ch.receive(Publish("$SYS/x", b"refused"), NOW)  # not routed either
    assert cfg.received.take() == ((1, 1, 1), (4, 3, 3))
    assert cfg.received.take() == ((0, 0, 0), (0, 0, 0)), "a take empties it"


def test_an_idle_channel_holds_no_qos2_ids_aliases_or_pending_acks() -> None:
    """Every connection has these; most never use them (an empty dict is 64 bytes)."""
    ch = conn(V5)
    inbound = ch._inbound
    assert (inbound._routing_qos2, inbound._awaiting_rel, inbound._in_aliases) == (None,) * 3
    assert (ch._subscriptions._subs, ch._subscriptions._unsubs) == (None, None)


def test_qos2_refused_by_router_is_not_awaiting_pubrel() -> None:
    ch = conn(V5)
    ch.receive(Publish("a", b"", qos=2, packet_id=3), NOW)
    assert ch.routed(1, ok=False) == [Send(Pubrec(3, 0x80))]
    assert ch.receive(Pubrel(3), NOW) == [Send(Pubcomp(3, 0x92))]


def test_routed_after_close_is_ignored() -> None:
    ch = conn(V5)
    ch.receive(Publish("a", b"", qos=1, packet_id=3), NOW)
    ch.connection_lost()
    assert ch.routed(1, ok=True) == []


def test_message_carries_expiry_and_properties_without_alias_or_sub_ids() -> None:
    ch = conn(V5)
    props = Properties(
        message_expiry_interval=10,
        content_type="text/plain",
        user_property=(("k", "v"),),
        topic_alias=3,
        subscription_identifier=(5,),
    )
    assert ch.receive(Publish("a", b"", qos=1, packet_id=1, properties=props), NOW) == [
        Route(
            Message(
                "a",
                b"",
                qos=1,
                properties=Properties(
                    message_expiry_interval=10,
                    content_type="text/plain",
                    user_property=(("k", "v"),),
                ),
                sender="c1",
                expires_at_ms=NOW_MS + 10_000,
            ),
            token=1,
        )
    ]


def test_inbound_topic_alias() -> None:
    ch = conn(V5, ChannelConfig(topic_alias_maximum=4))
    set_alias = Publish("x/y", b"1", properties=Properties(topic_alias=4))
    assert ch.receive(set_alias, NOW) == [Route(Message("x/y", b"1", sender="c1"))]
    use_alias = Publish("", b"2", properties=Properties(topic_alias=4))
    assert ch.receive(use_alias, NOW) == [Route(Message("x/y", b"2", sender="c1"))]
    reset = Publish("z", b"3", properties=Properties(topic_alias=4))
    assert ch.receive(reset, NOW) == [Route(Message("z", b"3", sender="c1"))]
    assert ch.receive(use_alias, NOW) == [Route(Message("z", b"2", sender="c1"))]


@pytest.mark.parametrize(
    ("cfg", "publish", "code"),
    [
        (ChannelConfig(topic_alias_maximum=4), aliased("t", 5), 0x94),
        (ChannelConfig(topic_alias_maximum=4), aliased("t", 0), 0x94),
        (ChannelConfig(topic_alias_maximum=0), aliased("t", 1), 0x94),
        (ChannelConfig(), Publish("", b"", properties=Properties(topic_alias=2)), 0x82),
        (ChannelConfig(), Publish("", b""), 0x82),
        (ChannelConfig(), Publish("a/+", b""), 0x90),
        (ChannelConfig(), Publish("a/#", b"", qos=1, packet_id=1), 0x90),
        (ChannelConfig(max_qos=1), Publish("t", b"", qos=2, packet_id=1), 0x9B),
        (ChannelConfig(max_qos=0), Publish("t", b"", qos=1, packet_id=1), 0x9B),
        (ChannelConfig(retain_available=False), Publish("t", b"", retain=True), 0x9A),
        (ChannelConfig(), Publish("t", b"", qos=1), 0x82),
        (ChannelConfig(), Publish("t", b"", properties=Properties(response_topic="r/+")), 0x82),
    ],
)
def test_v5_publish_errors_disconnect_with_reason(
    cfg: ChannelConfig, publish: Publish, code: int
) -> None:
    ch = conn(V5, cfg)
    assert plain(ch.receive(publish, NOW)) == error_close(V5, code)


@pytest.mark.parametrize(
    ("cfg", "publish"),
    [
        (ChannelConfig(), Publish("", b"")),
        (ChannelConfig(), Publish("a/+", b"")),
        (ChannelConfig(max_qos=1), Publish("t", b"", qos=2, packet_id=1)),
        (ChannelConfig(retain_available=False), Publish("t", b"", retain=True)),
    ],
)
@pytest.mark.parametrize("level", [V3, V311])
def test_3x_publish_errors_close(level: int, cfg: ChannelConfig, publish: Publish) -> None:
    ch = conn(level, cfg)
    assert plain(ch.receive(publish, NOW)) == error_close(level, 0)


@pytest.mark.parametrize(
    ("level", "qos", "expected"),
    [
        (V5, 0, []),
        (V5, 1, [Send(Puback(9, 0x87))]),
        (V5, 2, [Send(Pubrec(9, 0x87))]),
        (V311, 0, []),
        (V311, 1, [Send(Puback(9))]),
        (V311, 2, [Send(Pubrec(9))]),
        (V3, 1, [Send(Puback(9))]),
    ],
)
def test_clients_cannot_publish_to_sys_topics(
    level: int, qos: int, expected: list[Action]
) -> None:
    ch = conn(level)
    pid = 9 if qos else None
    assert ch.receive(Publish("$SYS/broker/uptime", b"0", qos=qos, packet_id=pid), NOW) == expected
    assert ch.receive(Publish("$SYS", b"0", qos=qos, packet_id=pid), NOW) == expected
    assert ch.inbound_inflight == 0


@pytest.mark.parametrize("topic", ["$aws/things/t1/shadow/update", "$iothub/twin/x", "$SYSTEM"])
def test_other_dollar_topics_are_routed(topic: str) -> None:
    """Device SDKs publish to `$aws/...` and `$iothub/...`; Mosquitto and EMQX route them."""
    ch = conn(V5)
    assert ch.receive(Publish(topic, b"{}", qos=1, packet_id=3), NOW) == [
        Route(Message(topic, b"{}", qos=1, sender="c1"), token=1)
    ]


@pytest.mark.parametrize(("qos", "expected"), [(0, []), (1, [Send(Puback(4, 0x99))]),
                                               (2, [Send(Pubrec(4, 0x99))])])  # fmt: skip
def test_payload_not_utf8_as_its_format_says_is_refused_alone(
    qos: int, expected: list[Action]
) -> None:
    """Payload Format Indicator 1 over bytes that are not UTF-8: that message is
    refused (0x99), not routed; the connection goes on (the spec allows either)."""
    ch = conn(V5)
    bad = Properties(payload_format_indicator=1)
    pid = 4 if qos else None
    assert ch.receive(Publish("t", b"\xff\xfe", qos=qos, packet_id=pid, properties=bad), NOW) == (
        expected
    )
    good = Publish("t", "ok ✓".encode(), qos=1, packet_id=5, properties=bad)
    assert [type(a) for a in ch.receive(good, NOW)] == [Route]
    assert ch.state.name == "CONNECTED"


STRICT = ChannelConfig(receive_maximum=2, strict_receive_maximum=True)


def test_strict_receive_maximum_counts_routing_and_awaiting_pubrel() -> None:
    ch = conn(V5, STRICT)
    ch.receive(Publish("a", b"", qos=1, packet_id=1), NOW)
    ch.receive(Publish("a", b"", qos=2, packet_id=2), NOW)
    ch.routed(1, ok=True)
    ch.routed(2, ok=True)
    assert ch.inbound_inflight == 1
    ch.receive(Publish("a", b"", qos=1, packet_id=3), NOW)
    assert ch.receive(Publish("a", b"", qos=0), NOW) == [Route(Message("a", b"", sender="c1"))]
    assert ch.receive(Publish("a", b"", qos=2, packet_id=2, dup=True), NOW) == [Send(Pubrec(2))]
    assert plain(ch.receive(Publish("a", b"", qos=1, packet_id=4), NOW)) == error_close(V5, 0x93)


def test_strict_receive_maximum_frees_on_pubrel() -> None:
    ch = conn(V5, ChannelConfig(receive_maximum=1, strict_receive_maximum=True))
    ch.receive(Publish("a", b"", qos=2, packet_id=1), NOW)
    ch.routed(1, ok=True)
    ch.receive(Pubrel(1), NOW)
    assert ch.receive(Publish("a", b"", qos=1, packet_id=2), NOW) == [
        Route(Message("a", b"", qos=1, sender="c1"), token=2)
    ]


def test_3x_has_no_receive_maximum() -> None:
    ch = conn(V311, ChannelConfig(receive_maximum=1, strict_receive_maximum=True))
    for pid in (1, 2, 3):
        acts = ch.receive(Publish("a", b"", qos=1, packet_id=pid), NOW)
        assert [type(a) for a in acts] == [Route]
    assert ch.inbound_inflight == 3
    assert not ch.inbound_full


def test_past_receive_maximum_is_flow_control_not_a_disconnect() -> None:
    """MQTT.js 5 sends QoS 1 PUBLISHes past the Receive Maximum: by default the
    channel takes them and says it is full (the node stops reading) until a
    route ends and its PUBACK goes out."""
    ch = conn(V5, ChannelConfig(receive_maximum=2))
    for pid in (1, 2):
        assert [type(a) for a in ch.receive(Publish("a", b"", qos=1, packet_id=pid), NOW)] == [
            Route
        ]
    assert ch.inbound_full
    assert [type(a) for a in ch.receive(Publish("a", b"", qos=1, packet_id=3), NOW)] == [Route]
    assert ch.routed(1, ok=True) == [Send(Puback(1))]
    assert ch.inbound_full  # still two routes in progress (2 and 3)
    ch.routed(2, ok=True)
    assert not ch.inbound_full
    assert ch.routed(3, ok=True) == [Send(Puback(3))]
    assert ch.state.name == "CONNECTED"


def test_awaiting_pubrel_does_not_hold_reading() -> None:
    """Ids awaiting PUBREL do not count for flow control: the PUBREL that frees
    one may be queued behind PUBLISHes the node would stop reading."""
    ch = conn(V5, ChannelConfig(receive_maximum=1))
    ch.receive(Publish("a", b"", qos=2, packet_id=1), NOW)
    assert ch.inbound_full
    ch.routed(1, ok=True)
    assert not ch.inbound_full
    assert ch.inbound_inflight == 1


def test_strict_receive_maximum_never_holds_reading() -> None:
    ch = conn(V5, ChannelConfig(receive_maximum=1, strict_receive_maximum=True))
    ch.receive(Publish("a", b"", qos=1, packet_id=1), NOW)
    assert not ch.inbound_full


def test_awaiting_pubrel_is_bounded() -> None:
    """Past max_awaiting_rel a 5.0 client's new QoS 2 message gets PUBREC 0x97 and is
    not routed; the connection goes on. A repeat of an id already awaiting PUBREL
    is still answered, and PUBREL frees a place."""
    ch = conn(V5, ChannelConfig(max_awaiting_rel=2))
    for pid in (1, 2):
        ch.receive(Publish("a", b"", qos=2, packet_id=pid), NOW)
    ch.routed(1, ok=True)
    over = ch.receive(Publish("a", b"", qos=2, packet_id=3), NOW)  # 1 awaiting, 2 routing
    assert over == [Send(Pubrec(3, 0x97))]
    assert ch.receive(Publish("a", b"", qos=2, packet_id=1, dup=True), NOW) == [Send(Pubrec(1))]
    ch.routed(2, ok=True)
    assert ch.receive(Pubrel(1), NOW) == [Released(1), Send(Pubcomp(1))]
    assert [type(a) for a in ch.receive(Publish("a", b"", qos=2, packet_id=3), NOW)] == [Route]


def test_3x_awaiting_pubrel_is_not_bounded() -> None:
    """A 3.1.1 client cannot be told (no reason codes, no Receive Maximum): amqtt
    and MQTT.js write a whole QoS 2 burst before their first PUBREL."""
    ch = conn(V311, ChannelConfig(max_awaiting_rel=2))
    for pid in range(1, 6):
        assert [type(a) for a in ch.receive(Publish("a", b"", qos=2, packet_id=pid), NOW)] == [
            Route
        ]
        assert ch.routed(pid, ok=True) == [Send(Pubrec(pid))]
    assert ch.inbound_inflight == 5


def test_awaiting_pubrel_bound_zero_means_none() -> None:
    ch = conn(V5, ChannelConfig(max_awaiting_rel=0, receive_maximum=500))
    for pid in range(1, 301):
        ch.receive(Publish("a", b"", qos=2, packet_id=pid), NOW)
        ch.routed(pid, ok=True)
    assert ch.inbound_inflight == 300


# --- outbound ------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", [V3, V311, V5])
def test_qos1_outbound_exchange(level: int) -> None:
    ch = conn(level)
    msg = Message("out/1", b"p", qos=1, sender="other")
    assert ch.deliver(msg, 7, dup=False, now_ms=NOW_MS) == [
        Send(Publish("out/1", b"p", qos=1, packet_id=7))
    ]
    assert ch.receive(Puback(7), NOW) == [Acked(7)]
    assert ch.receive(Puback(7), NOW) == []


@pytest.mark.parametrize("level", [V3, V311, V5])
def test_qos2_outbound_exchange(level: int) -> None:
    ch = conn(level)
    msg = Message("out/2", b"p", qos=2, retain=True)
    assert ch.deliver(msg, 8, dup=False, now_ms=NOW_MS) == [
        Send(Publish("out/2", b"p", qos=2, retain=True, packet_id=8))
    ]
    assert ch.receive(Pubcomp(8), NOW) == []
    assert ch.receive(Pubrec(8), NOW) == [Received(8)]
    assert ch.receive(Pubrec(8), NOW) == []  # the PUBREL waits for the store
    assert ch.receive(Pubcomp(8), NOW) == []
    assert ch.resend_pubrel(8) == [Send(Pubrel(8))]  # the node stored the PUBREC
    assert ch.receive(Pubrec(8), NOW) == [Send(Pubrel(8))]
    assert ch.receive(Puback(8), NOW) == []
    assert ch.receive(Pubcomp(8), NOW) == [Acked(8)]
    assert ch.receive(Pubcomp(8), NOW) == []


def test_pubrec_with_error_code_finishes_the_message() -> None:
    ch = conn(V5)
    ch.deliver(Message("t", b"", qos=2), 3, dup=False, now_ms=NOW_MS)
    assert ch.receive(Pubrec(3, 0x80), NOW) == [Acked(3)]
    assert ch.receive(Pubcomp(3), NOW) == []


@pytest.mark.parametrize(("level", "pubrel"), [(V311, Pubrel(5)), (V5, Pubrel(5, 0x92))])
def test_pubrec_for_unknown_id(level: int, pubrel: Pubrel) -> None:
    assert conn(level).receive(Pubrec(5), NOW) == [Send(pubrel)]


def test_resend_pubrel_after_reconnect() -> None:
    ch = conn(V5)
    assert ch.resend_pubrel(9) == [Send(Pubrel(9))]
    assert ch.receive(Pubcomp(9), NOW) == [Acked(9)]


def test_dup_resend_after_reconnect() -> None:
    ch = conn(V5)
    assert ch.deliver(Message("t", b"", qos=1), 4, dup=True, now_ms=NOW_MS) == [
        Send(Publish("t", b"", qos=1, dup=True, packet_id=4))
    ]
    assert ch.receive(Puback(4), NOW) == [Acked(4)]


@pytest.mark.parametrize(
    ("level", "connect_props", "window"),
    [(V5, Properties(receive_maximum=3), 3), (V5, NO_PROPERTIES, 65535), (V311, NO_PROPERTIES, 2)],
)
def test_send_quota_follows_client_receive_maximum(
    level: int, connect_props: Properties, window: int
) -> None:
    ch = conn(level, ChannelConfig(inflight_window_3x=2), properties=connect_props)
    assert ch.client_receive_maximum == window
    ch.deliver(Message("t", b"", qos=1), 1, dup=False, now_ms=NOW_MS)
    ch.deliver(Message("t", b"", qos=2), 2, dup=False, now_ms=NOW_MS)
    ch.deliver(Message("t", b""), None, dup=False, now_ms=NOW_MS)
    assert ch.send_quota == window - 2
    ch.receive(Puback(1), NOW)
    assert ch.send_quota == window - 1


def test_deliver_sets_remaining_expiry() -> None:
    ch = conn(V5)
    msg = Message("t", b"", qos=1, properties=Properties(message_expiry_interval=60),
                  expires_at_ms=NOW_MS + 10_500)
    assert ch.deliver(msg, 1, dup=False, now_ms=NOW_MS) == [
        Send(Publish("t", b"", qos=1, packet_id=1,
                     properties=Properties(message_expiry_interval=11)))
    ]


@pytest.mark.parametrize("level", [V311, V5])
def test_expired_message_is_dropped_and_freed(level: int) -> None:
    ch = conn(level)
    msg = Message("t", b"", qos=1, expires_at_ms=NOW_MS)
    expired = Dropped("expired")
    assert ch.deliver(msg, 1, dup=False, now_ms=NOW_MS) == [expired, Acked(1)]
    assert ch.deliver(Message("t", b"", expires_at_ms=NOW_MS - 1), None, False, NOW_MS) == [
        expired
    ]
    assert ch.send_quota == ch.client_receive_maximum


def test_expired_message_already_sent_once_is_resent() -> None:
    ch = conn(V5)
    msg = Message("t", b"", qos=1, expires_at_ms=NOW_MS - 5000)
    assert ch.deliver(msg, 1, dup=True, now_ms=NOW_MS) == [
        Send(Publish("t", b"", qos=1, dup=True, packet_id=1,
                     properties=Properties(message_expiry_interval=0)))
    ]


def test_3x_delivery_carries_no_properties() -> None:
    ch = conn(V311, properties=NO_PROPERTIES)
    msg = Message("t", b"", properties=Properties(user_property=(("a", "b"),)),
                  expires_at_ms=NOW_MS + 1000)
    assert ch.deliver(msg, None, False, NOW_MS) == [Send(Publish("t", b""))]


def test_outbound_topic_aliases() -> None:
    ch = conn(V5, properties=Properties(topic_alias_maximum=2))

    def out(topic: str) -> list[Action]:
        return ch.deliver(Message(topic, b"x"), None, False, NOW_MS)

    assert out("a") == [Send(Publish("a", b"x", properties=Properties(topic_alias=1)))]
    assert out("a") == [Send(Publish("", b"x", properties=Properties(topic_alias=1)))]
    assert out("b") == [Send(Publish("b", b"x", properties=Properties(topic_alias=2)))]
    assert out("c") == [Send(Publish("c", b"x"))]
    assert out("b") == [Send(Publish("", b"x", properties=Properties(topic_alias=2)))]


@pytest.mark.parametrize(
    ("cfg", "connect_props"),
    [
        (ChannelConfig(), NO_PROPERTIES),
        (ChannelConfig(outbound_topic_aliases=False), Properties(topic_alias_maximum=5)),
    ],
)
def test_no_outbound_aliases_unless_allowed(cfg: ChannelConfig, connect_props: Properties) -> None:
    ch = conn(V5, cfg, properties=connect_props)
    for _ in range(2):
        assert ch.deliver(Message("a", b""), None, False, NOW_MS) == [Send(Publish("a", b""))]


def test_router_alias_on_message_is_never_forwarded() -> None:
    ch = conn(V5)
    msg = Message("a", b"", properties=Properties(topic_alias=9, subscription_identifier=(4,)))
    assert ch.deliver(msg, None, False, NOW_MS) == [
        Send(Publish("a", b"", properties=Properties(subscription_identifier=(4,))))
    ]


def test_too_large_for_client_is_dropped_and_freed() -> None:
    ch = conn(V5, properties=Properties(maximum_packet_size=40, topic_alias_maximum=5))
    big = Message("t", b"x" * 40, qos=1)
    too_large = Dropped("too_large")
    assert ch.deliver(big, 1, False, NOW_MS) == [too_large, Acked(1)]
    assert ch.deliver(Message("t", b"x" * 40), None, False, NOW_MS) == [too_large]
    small = Message("t", b"x", qos=1)
    assert ch.deliver(small, 2, False, NOW_MS) == [
        Send(Publish("t", b"x", qos=1, packet_id=2, properties=Properties(topic_alias=1)))
    ]
    assert ch.send_quota == ch.client_receive_maximum - 1


def test_packet_size_limit_is_exact() -> None:
    publish = Publish("t", b"x" * 10, qos=1, packet_id=1)
    size = publish_size(publish, with_properties=True)
    assert size == 2 + 2 + 1 + 2 + 1 + 10
    at_limit = conn(V5, properties=Properties(maximum_packet_size=size))
    over_limit = conn(V5, properties=Properties(maximum_packet_size=size - 1))
    msg = Message("t", b"x" * 10, qos=1)
    assert [type(a) for a in at_limit.deliver(msg, 1, False, NOW_MS)] == [Send]
    assert over_limit.deliver(msg, 1, False, NOW_MS) == [Dropped("too_large"), Acked(1)]


@pytest.mark.parametrize(
    "publish",
    [
        Publish("t", b""),
        Publish("a/b/c", b"x" * 200, qos=2, packet_id=9, retain=True),
        Publish("ü/ß", b"y" * 20000, qos=1, packet_id=1,
                properties=Properties(message_expiry_interval=5, user_property=(("k", "v"),),
                                      subscription_identifier=(1, 300), topic_alias=2,
                                      correlation_data=b"c", content_type="ct")),
    ],
)
@pytest.mark.parametrize("level", [V311, V5])
def test_publish_size_matches_the_codec(publish: Publish, level: int) -> None:
    codec = pytest.importorskip("services.mqtt.codec")
    assert publish_size(publish, level == V5) == len(codec.encode(publish, level))


@pytest.mark.parametrize(
    ("expires", "now", "left"),
    [(10_000, 0, 10), (10_001, 0, 11), (1, 0, 1), (0, 0, 0), (0, 5000, 0)],
)
def test_remaining_expiry_rounds_up(expires: int, now: int, left: int) -> None:
    assert remaining_expiry_s(expires, now) == left


def test_deliver_before_connack_or_after_close_is_ignored() -> None:
    ch = conn(V5)
    ch.receive(Disconnect(), NOW)
    assert ch.deliver(Message("t", b"", qos=1), 1, False, NOW_MS) == []
    assert ch.resend_pubrel(1) == []


def test_keepalive_cancel_precedes_close_on_error() -> None:
    ch = connected(V5, keep_alive=10, will=WILL)
    acts = plain(ch.receive(Publish("a/+", b""), NOW))
    assert acts == [Send(Disconnect(0x90)), CancelTimer(KEEPALIVE_TIMER), closed("error", WILL)]


def test_qos1_delivery_without_packet_id_is_a_node_bug() -> None:
    with pytest.raises(ValueError, match="needs a packet id"):
        conn(V5).deliver(Message("t", b"", qos=1), None, False, NOW_MS)


def test_qos0_delivery_never_sets_dup() -> None:
    assert conn(V5).deliver(Message("t", b""), None, True, NOW_MS) == [Send(Publish("t", b""))]


def test_response_topic_passes_through() -> None:
    props = Properties(response_topic="reply/c1", correlation_data=b"42")
    assert conn(V5).receive(Publish("t", b"", properties=props), NOW) == [
        Route(Message("t", b"", properties=props, sender="c1"))
    ]
