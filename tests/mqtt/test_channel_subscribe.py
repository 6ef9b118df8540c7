"""Channel: SUBSCRIBE / UNSUBSCRIBE validation, requests to the node, SUBACK / UNSUBACK."""

from __future__ import annotations

import pytest

from services.mqtt.actions import Action, Send, SubscribeRequest, UnsubscribeRequest
from services.mqtt.channel import Channel
from services.mqtt.channel_config import ChannelConfig
from services.mqtt.packets import (
    Disconnect,
    Properties,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
)
from tests.support.channel import NOW, V3, V5, V311, closed, connected, plain


def conn(level: int, cfg: ChannelConfig | None = None) -> Channel:
    return connected(level, cfg or ChannelConfig(), keep_alive=0)


def error_close(level: int, code: int) -> list[Action]:
    sent: list[Action] = [Send(Disconnect(code))] if level == V5 else []
    return [*sent, closed("error")]


S = Subscription


@pytest.mark.parametrize("level", [V3, V311, V5])
def test_subscribe_round_trip(level: int) -> None:
    ch = conn(level)
    subs = (S("a/+", 1), S("b/#", 2))
    assert ch.receive(Subscribe(5, subs), NOW) == [SubscribeRequest(5, subs)]
    assert ch.subscribed(5, [1, 2]) == [Send(Suback(5, (1, 2)))]
    assert ch.subscribed(5, [1, 2]) == []


@pytest.mark.parametrize(("level", "bad"), [(V3, 0x80), (V311, 0x80), (V5, 0x8F)])
def test_invalid_filters_fail_only_their_entry(level: int, bad: int) -> None:
    ch = conn(level)
    subs = (S("a/#", 1), S("a/#/b", 1), S("$share/g", 0), S("c", 2))
    assert ch.receive(Subscribe(6, subs), NOW) == [SubscribeRequest(6, (S("a/#", 1), S("c", 2)))]
    assert ch.subscribed(6, [1, 2]) == [Send(Suback(6, (1, bad, bad, 2)))]


@pytest.mark.parametrize(("level", "bad"), [(V311, 0x80), (V5, 0x8F)])
def test_all_filters_invalid_answers_at_once(level: int, bad: int) -> None:
    ch = conn(level)
    assert ch.receive(Subscribe(7, (S("+a"), S(""))), NOW) == [Send(Suback(7, (bad, bad)))]


@pytest.mark.parametrize(("level", "denied"), [(V311, 0x80), (V5, 0x87)])
def test_node_failure_codes(level: int, denied: int) -> None:
    ch = conn(level)
    ch.receive(Subscribe(1, (S("a"), S("b", 1))), NOW)
    assert ch.subscribed(1, [0x87, 1]) == [Send(Suback(1, (denied, 1)))]


def test_requested_qos_is_capped_to_maximum_qos() -> None:
    ch = conn(V5, ChannelConfig(max_qos=1))
    assert ch.receive(Subscribe(1, (S("a", 2), S("b", 0))), NOW) == [
        SubscribeRequest(1, (S("a", 1), S("b", 0)))
    ]


def test_subscription_identifier_is_passed_on() -> None:
    ch = conn(V5)
    sub = Subscribe(2, (S("a"),), Properties(subscription_identifier=(42,)))
    assert ch.receive(sub, NOW) == [SubscribeRequest(2, (S("a"),), 42)]


@pytest.mark.parametrize(
    ("cfg", "subscribe", "code"),
    [
        (
            ChannelConfig(subscription_identifiers=False),
            Subscribe(1, (S("a"),), Properties(subscription_identifier=(1,))),
            0xA1,
        ),
        (ChannelConfig(), Subscribe(1, (S("a"),), Properties(subscription_identifier=(0,))), 0x82),
        (ChannelConfig(), Subscribe(1, (S("$share/g/a", no_local=True),)), 0x82),
        (ChannelConfig(), Subscribe(1, ()), 0x82),
    ],
)
def test_v5_subscribe_connection_errors(
    cfg: ChannelConfig, subscribe: Subscribe, code: int
) -> None:
    assert plain(conn(V5, cfg).receive(subscribe, NOW)) == error_close(V5, code)


@pytest.mark.parametrize("level", [V311, V5])
def test_more_topic_filters_than_the_maximum_end_the_connection(level: int) -> None:
    """max_topic_filters per SUBSCRIBE / UNSUBSCRIBE; one more: 0x97 (3.x: close)."""
    cfg = ChannelConfig(max_topic_filters=3)
    at_max = Subscribe(1, tuple(S(f"t/{i}") for i in range(3)))
    assert isinstance(conn(level, cfg).receive(at_max, NOW)[0], SubscribeRequest)
    over = Subscribe(1, tuple(S(f"t/{i}") for i in range(4)))
    assert plain(conn(level, cfg).receive(over, NOW)) == error_close(level, 0x97)
    unsub = Unsubscribe(1, tuple(f"t/{i}" for i in range(4)))
    assert plain(conn(level, cfg).receive(unsub, NOW)) == error_close(level, 0x97)


def test_packet_id_in_use_is_a_protocol_error() -> None:
    ch = conn(V5)
    ch.receive(Subscribe(3, (S("a"),)), NOW)
    assert plain(ch.receive(Subscribe(3, (S("b"),)), NOW)) == error_close(V5, 0x82)


@pytest.mark.parametrize(
    ("cfg", "topic_filter", "v5_code"),
    [
        (ChannelConfig(shared_subscriptions=False), "$share/g/a", 0x9E),
        (ChannelConfig(wildcard_subscriptions=False), "a/+", 0xA2),
        (ChannelConfig(wildcard_subscriptions=False), "#", 0xA2),
        (ChannelConfig(wildcard_subscriptions=False), "$share/g/a/#", 0xA2),
    ],
)
@pytest.mark.parametrize("level", [V311, V5])
def test_unavailable_features_fail_the_entry(
    cfg: ChannelConfig, topic_filter: str, v5_code: int, level: int
) -> None:
    ch = conn(level, cfg)
    expected = v5_code if level == V5 else 0x80
    assert ch.receive(Subscribe(1, (S(topic_filter),)), NOW) == [Send(Suback(1, (expected,)))]


def test_shared_and_plain_filters_allowed_by_default() -> None:
    ch = conn(V311)
    subs = (S("$share/g/a/+", 1), S("$SYS/#"))
    assert ch.receive(Subscribe(1, subs), NOW) == [SubscribeRequest(1, subs)]


def test_subscribed_with_wrong_number_of_codes_is_a_node_bug() -> None:
    ch = conn(V5)
    ch.receive(Subscribe(1, (S("a"), S("b"))), NOW)
    with pytest.raises(ValueError, match="expected 2 codes"):
        ch.subscribed(1, [0])


@pytest.mark.parametrize("level", [V3, V311, V5])
def test_unsubscribe_round_trip(level: int) -> None:
    ch = conn(level)
    assert ch.receive(Unsubscribe(9, ("a", "b/#")), NOW) == [UnsubscribeRequest(9, ("a", "b/#"))]
    expected = Unsuback(9, (0, 0x11)) if level == V5 else Unsuback(9)
    assert ch.unsubscribed(9, [0, 0x11]) == [Send(expected)]
    assert ch.unsubscribed(9, [0, 0x11]) == []


@pytest.mark.parametrize("level", [V311, V5])
def test_unsubscribe_invalid_filter(level: int) -> None:
    ch = conn(level)
    assert ch.receive(Unsubscribe(2, ("a/#/b", "ok")), NOW) == [UnsubscribeRequest(2, ("ok",))]
    expected = Unsuback(2, (0x8F, 0)) if level == V5 else Unsuback(2)
    assert ch.unsubscribed(2, [0]) == [Send(expected)]
    only_bad = Unsuback(3, (0x8F,)) if level == V5 else Unsuback(3)
    assert ch.receive(Unsubscribe(3, ("#/x",)), NOW) == [Send(only_bad)]


def test_empty_unsubscribe_is_a_protocol_error() -> None:
    assert plain(conn(V311).receive(Unsubscribe(1, ()), NOW)) == error_close(V311, 0)


def test_acks_after_close_are_dropped() -> None:
    ch = conn(V5)
    ch.receive(Subscribe(1, (S("a"),)), NOW)
    ch.receive(Unsubscribe(2, ("a",)), NOW)
    ch.connection_lost()
    assert ch.subscribed(1, [0]) == []
    assert ch.unsubscribed(2, [0]) == []
