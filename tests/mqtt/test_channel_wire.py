"""A client and the channel talking through the codec, with no sockets.

Every packet the client sends is encoded and decoded the way the node does
(`decode(buf, channel.protocol_level)`); every packet the channel sends is
encoded at the channel's level and decoded by the client. So these tests
show that what the channel emits is valid on the wire at each level.
"""

from __future__ import annotations

import time

import pytest

from services.mqtt import codec
from services.mqtt.actions import (
    Acked,
    Action,
    OpenSession,
    Received,
    Released,
    Route,
    Send,
    SubscribeRequest,
)
from services.mqtt.channel import Channel
from services.mqtt.channel_config import ChannelConfig
from services.mqtt.packets import (
    Connack,
    Disconnect,
    Message,
    Packet,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
)
from tests.support.channel import NOW, V3, V5, V311, make_connect


class Wire:
    """The client's end: sends through the codec, collects what the channel sends back."""

    def __init__(self, level: int, cfg: ChannelConfig | None = None) -> None:
        self.level = level
        self.channel = Channel(cfg or ChannelConfig(), "n1")
        self.actions: list[Action] = []

    def send(self, packet: Packet) -> list[Packet]:
        data = codec.encode(packet, self.level)
        decoded = codec.decode(data, self.channel.protocol_level)
        assert decoded is not None
        assert decoded[1] == len(data)
        return self.take(self.channel.receive(decoded[0], NOW))

    def take(self, actions: list[Action]) -> list[Packet]:
        """Carry out Sends through the codec; keep the other actions for the test."""
        received: list[Packet] = []
        for action in actions:
            if isinstance(action, Send):
                data = codec.encode(action.packet, self.channel.protocol_level)
                decoded = codec.decode(data, self.level)
                assert decoded is not None
                received.append(decoded[0])
            else:
                self.actions.append(action)
        return received

    def pop(self) -> list[Action]:
        out, self.actions = self.actions, []
        return out


def open_wire(level: int, cfg: ChannelConfig | None = None, **connect_kw: object) -> Wire:
    wire = Wire(level, cfg)
    assert wire.send(make_connect(level, keep_alive=0, **connect_kw)) == []  # type: ignore[arg-type]
    assert [type(a) for a in wire.pop()] == [OpenSession]
    (connack,) = wire.take(wire.channel.session_opened(False))
    assert isinstance(connack, Connack)
    assert connack.reason_code == 0
    return wire


@pytest.mark.parametrize("level", [V3, V311, V5])
def test_qos1_and_qos2_both_ways_over_the_codec(level: int) -> None:
    wire = open_wire(level)
    ch = wire.channel

    assert wire.send(Subscribe(1, (Subscription("s/#", 2),))) == []
    (request,) = wire.pop()
    assert isinstance(request, SubscribeRequest)
    assert wire.take(ch.subscribed(1, [2])) == [Suback(1, (2,))]

    assert wire.send(Publish("in/1", b"a", qos=1, packet_id=11)) == []
    (route,) = wire.pop()
    assert isinstance(route, Route)
    assert route.token is not None
    assert wire.take(ch.routed(route.token, True)) == [Puback(11)]

    assert wire.send(Publish("in/2", b"b", qos=2, packet_id=12)) == []
    (route,) = wire.pop()
    assert isinstance(route, Route)
    assert route.token is not None
    assert route.qos2_packet_id == 12
    assert wire.take(ch.routed(route.token, True)) == [Pubrec(12)]
    assert wire.send(Pubrel(12)) == [Pubcomp(12)]
    assert wire.pop() == [Released(12)]

    (out1,) = wire.take(ch.deliver(Message("s/1", b"c", qos=1), 1, False, 0))
    assert out1 == Publish("s/1", b"c", qos=1, packet_id=1)
    assert wire.send(Puback(1)) == []
    assert wire.pop() == [Acked(1)]

    (out2,) = wire.take(ch.deliver(Message("s/2", b"d", qos=2), 2, False, 0))
    assert isinstance(out2, Publish)
    assert (out2.topic, out2.qos, out2.packet_id) == ("s/2", 2, 2)
    assert wire.send(Pubrec(2)) == []
    assert wire.pop() == [Received(2)]
    assert wire.take(ch.resend_pubrel(2)) == [Pubrel(2)]
    assert wire.send(Pubcomp(2)) == []
    assert wire.pop() == [Acked(2)]


def test_v5_limits_and_errors_encode() -> None:
    cfg = ChannelConfig(max_qos=1, retain_available=False, server_keep_alive=30)
    wire = Wire(V5, cfg)
    wire.send(make_connect(V5, "", properties=Properties(topic_alias_maximum=3)))
    (connack,) = wire.take(wire.channel.session_opened(False))
    assert isinstance(connack, Connack)
    assert connack.properties.maximum_qos == 1
    assert connack.properties.retain_available == 0
    assert connack.properties.server_keep_alive == 30
    assigned = connack.properties.assigned_client_identifier
    assert assigned is not None
    assert assigned.startswith("weir-")

    for _ in range(2):
        (pub,) = wire.take(wire.channel.deliver(Message("x/y", b"z"), None, False, 0))
        assert isinstance(pub, Publish)
        assert pub.properties.topic_alias == 1
    assert isinstance(pub, Publish)
    assert pub.topic == ""

    assert wire.send(Publish("$SYS/x", b"", qos=1, packet_id=3)) == [Puback(3, 0x87)]
    assert wire.send(Publish("t", b"", retain=True)) == [Disconnect(0x9A)]


def test_inbound_expiry_uses_the_wall_clock_by_default() -> None:
    wire = open_wire(V5)
    before = time.time_ns() // 1_000_000
    wire.send(Publish("t", b"", properties=Properties(message_expiry_interval=30)))
    after = time.time_ns() // 1_000_000
    (route,) = wire.pop()
    assert isinstance(route, Route)
    assert route.message.expires_at_ms is not None
    assert before + 30_000 <= route.message.expires_at_ms <= after + 30_000
