"""MQTT 5 enhanced authentication in the channel (4.12, 4.12.1): the AUTH exchange
of a CONNECT and re-authentication, sans-IO. The node's answers are fed by hand
(the channel does not know SCRAM: any method's data passes through)."""

from __future__ import annotations

from typing import Any

import pytest

from services.mqtt.actions import (
    Action,
    Authenticate,
    AuthExchange,
    CancelTimer,
    OpenSession,
    Route,
    Send,
    StartTimer,
)
from services.mqtt.channel import CONNECT_TIMER, Channel, State
from services.mqtt.channel_auth import REAUTH_TIMER
from services.mqtt.channel_config import ChannelConfig
from services.mqtt.packets import (
    Auth,
    Connack,
    Disconnect,
    Pingreq,
    Properties,
    Publish,
    Will,
)
from tests.support.channel import NOW, V311, closed, make_connect, new_channel, plain

CFG = ChannelConfig(authenticate=True, connect_timeout_s=3.0)
M = "SCRAM-SHA-256"
WILL = Will("will/t", b"gone")
CTX = object()


def props(data: bytes | None, method: str | None = M) -> Properties:
    return Properties(authentication_method=method, authentication_data=data)


def connect_with_method(ch: Channel, method: str = M, **kw: Any) -> list[Action]:
    connect = make_connect(properties=props(b"client-first", method), keep_alive=0, **kw)
    return ch.receive(connect, NOW)


def exchanging() -> Channel:
    """A channel whose CONNECT started an exchange, the server's challenge sent."""
    ch = new_channel(CFG)
    assert ch.opened() == [StartTimer(CONNECT_TIMER, 3.0)]
    assert connect_with_method(ch, username="alice", will=WILL) == [
        AuthExchange("c1", "alice", M, b"client-first")
    ]
    assert ch.state is State.AUTHENTICATING
    assert ch.auth_continue(b"server-first", CTX) == [Send(Auth(0x18, props(b"server-first")))]
    return ch


def connected_with_auth() -> Channel:
    ch = exchanging()
    assert ch.receive(Auth(0x18, props(b"client-final")), NOW) == [
        AuthExchange("c1", "alice", M, b"client-final", CTX)
    ]
    assert [type(a) for a in ch.authenticated(True, 0, b"server-final")] == [OpenSession]
    connack = ch.session_opened(False)[0]
    assert isinstance(connack, Send) and isinstance(connack.packet, Connack)
    assert connack.packet.reason_code == 0
    assert connack.packet.properties.authentication_method == M
    assert connack.packet.properties.authentication_data == b"server-final"
    assert ch.state is State.CONNECTED
    return ch


def test_connect_exchange_ends_in_connack_with_method_and_data() -> None:
    connected_with_auth()


def test_refused_exchange_is_a_refusing_connack_without_the_will() -> None:
    ch = exchanging()
    ch.receive(Auth(0x18, props(b"bad-proof")), NOW)
    assert plain(ch.authenticated(False, 0x86)) == [Send(Connack(False, 0x86)), closed("error")]
    assert ch.closed


def test_refused_on_the_first_data_and_unsupported_method() -> None:
    ch = new_channel(CFG)
    connect_with_method(ch, "SCRAM-SHA-1")
    assert plain(ch.authenticated(False, 0x8C)) == [Send(Connack(False, 0x8C)), closed("error")]


def test_a_node_that_authenticates_no_one_refuses_any_method_itself() -> None:
    ch = new_channel(ChannelConfig())
    assert plain(connect_with_method(ch)) == [Send(Connack(False, 0x8C)), closed("error")]


def test_a_connect_without_method_and_a_311_client_are_unaffected() -> None:
    for ch, level in ((new_channel(CFG), 5), (new_channel(CFG), V311)):
        acts = ch.receive(make_connect(level, username="u", password=b"p"), NOW)
        assert acts == [Authenticate("c1", "u", b"p")]
        assert [type(a) for a in ch.authenticated(True)] == [OpenSession]
        connack = ch.session_opened(False)[0]
        assert isinstance(connack, Send) and isinstance(connack.packet, Connack)
        assert connack.packet.properties.authentication_method is None


@pytest.mark.parametrize(
    "packet",
    [
        Auth(0x18, props(b"x", "OTHER")),  # another method
        Auth(0x18, props(b"x", None)),  # no method
        Auth(0x19, props(b"x")),  # re-authenticate before the CONNACK
        Auth(0x00, props(b"x")),  # success is the server's to send
        Publish("t", b"p"),  # MQTT-3.1.2-30: only AUTH or DISCONNECT
        Pingreq(),
    ],
)
def test_protocol_errors_during_the_exchange_are_connack_0x82(packet: Any) -> None:
    ch = exchanging()
    assert plain(ch.receive(packet, NOW)) == [Send(Connack(False, 0x82)), closed("error")]


def test_auth_before_the_server_answered_is_a_protocol_error() -> None:
    ch = new_channel(CFG)
    connect_with_method(ch)
    acts = ch.receive(Auth(0x18, props(b"again")), NOW)
    assert plain(acts) == [Send(Connack(False, 0x82)), closed("error")]
    assert ch.auth_continue(b"late", CTX) == [] and ch.authenticated(True) == []


def test_auth_before_connect_closes_without_connack() -> None:
    ch = new_channel(CFG)
    assert [type(a) for a in ch.receive(Auth(0x18, props(b"x")), NOW)] == [type(closed(""))]


def test_a_client_stopping_mid_exchange_is_closed_by_the_connect_timer() -> None:
    ch = exchanging()
    assert plain(ch.timer(CONNECT_TIMER, NOW + 3.0)) == [closed("connect_timeout")]
    assert ch.closed


def test_disconnect_during_the_exchange_closes_without_the_will() -> None:
    ch = exchanging()
    assert plain(ch.receive(Disconnect(0x04), NOW)) == [closed("normal")]


def test_server_disconnect_during_the_exchange_is_a_connack() -> None:
    ch = exchanging()
    assert plain(ch.server_disconnect(0x8B)) == [Send(Connack(False, 0x88)), closed("error")]


def test_auth_on_a_connection_without_method_is_disconnect_0x82_with_will() -> None:
    ch = new_channel(CFG)
    ch.receive(make_connect(username="u", password=b"p", will=WILL, keep_alive=0), NOW)
    ch.authenticated(True)
    ch.session_opened(False)
    acts = ch.receive(Auth(0x19, props(b"x")), NOW)
    assert plain(acts) == [Send(Disconnect(0x82)), closed("error", WILL)]


def reauthenticating() -> Channel:
    ch = connected_with_auth()
    assert ch.receive(Auth(0x19, props(b"client-first-2")), NOW) == [
        AuthExchange("c1", "alice", M, b"client-first-2", None, True),
        StartTimer(REAUTH_TIMER, 3.0),
    ]
    return ch


def test_reauthentication_succeeds_while_messages_flow() -> None:
    ch = reauthenticating()
    routed = ch.receive(Publish("t", b"during", qos=1, packet_id=7), NOW)
    assert [type(a) for a in routed] == [Route]
    assert ch.auth_continue(b"server-first-2", CTX) == [Send(Auth(0x18, props(b"server-first-2")))]
    assert ch.receive(Pingreq(), NOW) != []
    assert ch.receive(Auth(0x18, props(b"client-final-2")), NOW) == [
        AuthExchange("c1", "alice", M, b"client-final-2", CTX, True)
    ]
    assert ch.authenticated(True, 0, b"server-final-2") == [
        CancelTimer(REAUTH_TIMER),
        Send(Auth(0x00, props(b"server-final-2"))),
    ]
    assert ch.state is State.CONNECTED
    assert len(ch.receive(Auth(0x19, props(b"again")), NOW)) == 2, "another may start"


def test_failed_reauthentication_is_disconnect_0x87_with_the_will() -> None:
    ch = reauthenticating()
    ch.auth_continue(b"server-first-2", CTX)
    ch.receive(Auth(0x18, props(b"bad-proof")), NOW)
    assert plain(ch.authenticated(False, 0x86)) == [
        CancelTimer(REAUTH_TIMER),
        Send(Disconnect(0x87)),
        closed("error", WILL),
    ]


@pytest.mark.parametrize(
    "packet",
    [
        Auth(0x19, props(b"x", "OTHER")),
        Auth(0x19, props(b"x", None)),
        Auth(0x18, props(b"x")),  # continue without a challenge
        Auth(0x00, props(b"x")),
    ],
)
def test_bad_auth_while_connected_is_disconnect_0x82(packet: Any) -> None:
    ch = connected_with_auth()
    assert plain(ch.receive(packet, NOW)) == [Send(Disconnect(0x82)), closed("error", WILL)]


def test_second_reauthenticate_during_one_is_a_protocol_error() -> None:
    ch = reauthenticating()
    ch.auth_continue(b"server-first-2", CTX)
    acts = ch.receive(Auth(0x19, props(b"x")), NOW)
    assert plain(acts) == [Send(Disconnect(0x82)), closed("error", WILL)]


def test_a_stalled_reauthentication_ends_at_its_timer() -> None:
    ch = reauthenticating()
    ch.auth_continue(b"server-first-2", CTX)
    acts = ch.timer(REAUTH_TIMER, NOW + 3.0)
    assert plain(acts) == [Send(Disconnect(0x87)), closed("error", WILL)]


def test_the_reauth_timer_after_success_does_nothing() -> None:
    ch = reauthenticating()
    ch.auth_continue(b"s", CTX)
    ch.receive(Auth(0x18, props(b"c")), NOW)
    ch.authenticated(True, 0, b"v")
    assert ch.timer(REAUTH_TIMER, NOW + 3.0) == []
    assert ch.timer(CONNECT_TIMER, NOW + 3.0) == []
