"""Channel: CONNECT, the transition table, keep alive, and every way a connection ends.

Pure tests: packets in, exact actions out. `plain()` (tests/support/channel.py)
blanks Close.detail (free log text) so whole action lists can be compared; a
few tests check the detail where it is the point.
"""

from __future__ import annotations

from typing import Any

import pytest

from services.mqtt.actions import (
    Action,
    CancelTimer,
    Close,
    OpenSession,
    Released,
    Route,
    Send,
    StartTimer,
)
from services.mqtt.channel import KEEPALIVE_TIMER, TRANSITIONS, Channel, State
from services.mqtt.channel_config import NEVER_EXPIRE, ChannelConfig
from services.mqtt.errors import (
    MalformedPacket,
    MQTTError,
    PacketTooLarge,
    QuotaExceeded,
    TopicAliasInvalid,
    UnsupportedProtocolVersion,
)
from services.mqtt.packets import (
    NO_PROPERTIES,
    Auth,
    Connack,
    Disconnect,
    Message,
    Packet,
    PacketType,
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
from tests.support.channel import (
    ASSIGNED,
    CFG,
    NOW,
    V3,
    V5,
    V311,
    closed,
    connected,
    make_connect,
    new_channel,
    plain,
)

WILL = Will("wills/c1", b"gone", qos=1)


def v5_connack_props(**kw: Any) -> Properties:
    base: dict[str, Any] = {
        "receive_maximum": 32,
        "maximum_packet_size": 1 << 20,
        "topic_alias_maximum": 65535,
        "retain_available": 1,
        "wildcard_subscription_available": 1,
        "subscription_identifier_available": 1,
        "shared_subscription_available": 1,
    }
    base.update(kw)
    return Properties(**base)


KA_CANCEL = CancelTimer(KEEPALIVE_TIMER)

# --- CONNECT -------------------------------------------------------------------------------


def test_v5_connect_opens_session_then_connacks_with_limits() -> None:
    ch = new_channel()
    connect = make_connect(V5, keep_alive=60, properties=Properties(session_expiry_interval=120))
    assert ch.receive(connect, NOW) == [OpenSession(connect, "c1", True, 120)]
    assert (ch.state, ch.protocol_level, ch.client_id) == (State.CONNECTING, 5, "c1")
    assert ch.session_opened(False) == [
        Send(Connack(False, 0, v5_connack_props())),
        StartTimer(KEEPALIVE_TIMER, 90.0),
    ]
    assert ch.state is State.CONNECTED


@pytest.mark.parametrize("level", [V3, V311])
def test_3x_connect_connack_has_no_properties(level: int) -> None:
    ch = new_channel()
    connect = make_connect(level, keep_alive=10)
    assert ch.receive(connect, NOW) == [OpenSession(connect, "c1", True, 0)]
    assert ch.session_opened(True) == [
        Send(Connack(True, 0)),
        StartTimer(KEEPALIVE_TIMER, 15.0),
    ]


def test_connack_announces_restricted_features() -> None:
    cfg = ChannelConfig(
        receive_maximum=5,
        max_packet_size=4096,
        topic_alias_maximum=0,
        max_qos=1,
        retain_available=False,
        wildcard_subscriptions=False,
        shared_subscriptions=False,
        subscription_identifiers=False,
    )
    ch = new_channel(cfg)
    ch.receive(make_connect(V5, keep_alive=0), NOW)
    assert ch.session_opened(False) == [
        Send(
            Connack(
                False,
                0,
                Properties(
                    receive_maximum=5,
                    maximum_packet_size=4096,
                    topic_alias_maximum=0,
                    retain_available=0,
                    maximum_qos=1,
                    wildcard_subscription_available=0,
                    subscription_identifier_available=0,
                    shared_subscription_available=0,
                ),
            )
        )
    ]


@pytest.mark.parametrize(
    ("level", "client_id", "clean", "outcome"),
    [
        (V311, "", True, ASSIGNED),
        (V311, "", False, 0x02),
        (V5, "", True, ASSIGNED),
        (V5, "", False, ASSIGNED),
        (V3, "", True, 0x02),
        (V3, "x" * 23, True, "x" * 23),
        (V3, "x" * 40, True, "x" * 40),  # past 3.1's 23: taken, as Mosquitto and EMQX do
        (V311, "x" * 24, True, "x" * 24),
        (V5, "x" * 200, True, "x" * 200),
    ],
)
def test_client_identifier_rules(level: int, client_id: str, clean: bool, outcome: Any) -> None:
    ch = new_channel()
    connect = make_connect(level, client_id, clean_start=clean)
    acts = ch.receive(connect, NOW)
    if isinstance(outcome, str):
        expiry = 0 if clean or level == V5 else NEVER_EXPIRE
        assert acts == [OpenSession(connect, outcome, clean, expiry)]
        assert ch.client_id == outcome
        connack = ch.session_opened(False)[0]
        assert isinstance(connack, Send)
        assert isinstance(connack.packet, Connack)
        assigned = connack.packet.properties.assigned_client_identifier
        assert assigned == (ASSIGNED if level == V5 and not client_id else None)
    else:
        assert plain(acts) == [Send(Connack(False, outcome)), closed("error")]
        assert ch.state is State.CLOSED


def test_v5_client_id_longer_than_limit_is_refused_0x85() -> None:
    ch = new_channel(ChannelConfig(max_client_id_length=8))
    assert plain(ch.receive(make_connect(V5, "123456789"), NOW)) == [
        Send(Connack(False, 0x85)),
        closed("error"),
    ]


def test_default_assigned_client_id_is_random_with_prefix() -> None:
    ids = set()
    for _ in range(3):
        ch = Channel(ChannelConfig(assign_client_id_prefix="pre-"), "n")
        acts = ch.receive(make_connect(V311, ""), NOW)
        assert isinstance(acts[0], OpenSession)
        assert acts[0].client_id.startswith("pre-")
        assert len(acts[0].client_id) == len("pre-") + 16
        ids.add(acts[0].client_id)
    assert len(ids) == 3


@pytest.mark.parametrize(
    ("level", "keep_alive", "cfg", "timer", "announced"),
    [
        (V5, 60, CFG, 90.0, None),
        (V5, 0, CFG, None, None),
        (V5, 60, ChannelConfig(server_keep_alive=10), 15.0, 10),
        (V5, 0, ChannelConfig(server_keep_alive=10), 15.0, 10),
        (V5, 1000, ChannelConfig(max_keep_alive=100), 150.0, 100),
        (V311, 60, ChannelConfig(server_keep_alive=10), 90.0, None),
        (V311, 0, CFG, None, None),
        (V3, 4, CFG, 6.0, None),
    ],
)
def test_keep_alive_negotiation(
    level: int, keep_alive: int, cfg: ChannelConfig, timer: float | None, announced: int | None
) -> None:
    ch = new_channel(cfg)
    ch.receive(make_connect(level, keep_alive=keep_alive), NOW)
    acts = ch.session_opened(False)
    timers = [a for a in acts if isinstance(a, StartTimer)]
    assert timers == ([StartTimer(KEEPALIVE_TIMER, timer)] if timer else [])
    assert isinstance(acts[0], Send)
    assert isinstance(acts[0].packet, Connack)
    assert acts[0].packet.properties.server_keep_alive == announced


@pytest.mark.parametrize("level", [V3, V311])
def test_3x_keep_alive_over_the_maximum_is_refused(level: int) -> None:
    """3.x cannot be told a Server Keep Alive: CONNACK 2 (identifier rejected, as
    Mosquitto does), no will, close. At the maximum, or 0, it is accepted."""
    cfg = ChannelConfig(max_keep_alive=100)
    ch = new_channel(cfg)
    acts = ch.receive(make_connect(level, keep_alive=101), NOW)
    assert isinstance(acts[0], Send) and acts[0].packet == Connack(False, 2)
    assert isinstance(acts[-1], Close) and acts[-1].will is None
    for keep_alive in (100, 0):
        ok = new_channel(cfg)
        assert isinstance(ok.receive(make_connect(level, keep_alive=keep_alive), NOW)[0],
                          OpenSession)


@pytest.mark.parametrize(
    ("level", "clean", "requested", "cfg", "expiry", "announced"),
    [
        (V5, True, None, CFG, 0, None),
        (V5, False, 100, CFG, 100, None),
        (V5, True, NEVER_EXPIRE, ChannelConfig(max_session_expiry_s=3600), 3600, 3600),
        (V311, True, None, CFG, 0, None),
        (V311, False, None, CFG, NEVER_EXPIRE, None),
        (V311, False, None, ChannelConfig(max_session_expiry_s=3600), 3600, None),
        (V3, False, None, CFG, NEVER_EXPIRE, None),
    ],
)
def test_session_expiry(
    level: int,
    clean: bool,
    requested: int | None,
    cfg: ChannelConfig,
    expiry: int,
    announced: int | None,
) -> None:
    ch = new_channel(cfg)
    props = Properties(session_expiry_interval=requested) if level == V5 else NO_PROPERTIES
    connect = make_connect(level, clean_start=clean, properties=props)
    assert ch.receive(connect, NOW) == [OpenSession(connect, "c1", clean, expiry)]
    assert ch.session_expiry_s == expiry
    connack = ch.session_opened(False)[0]
    assert isinstance(connack, Send)
    assert isinstance(connack.packet, Connack)
    assert connack.packet.properties.session_expiry_interval == announced


@pytest.mark.parametrize(
    ("level", "connect_kw", "cfg", "expected"),
    [
        (V5, {"properties": Properties(authentication_method="SCRAM-SHA-1")}, CFG, 0x8C),
        (V5, {"properties": Properties(receive_maximum=0)}, CFG, 0x82),
        (V5, {"properties": Properties(maximum_packet_size=0)}, CFG, 0x82),
        (V5, {"will": Will("w", b"", qos=2)}, ChannelConfig(max_qos=1), 0x9B),
        (V311, {"will": Will("w", b"", qos=2)}, ChannelConfig(max_qos=1), None),
        (V5, {"will": Will("w", b"", retain=True)}, ChannelConfig(retain_available=False), 0x9A),
        (V5, {"will": Will("w/+", b"")}, CFG, 0x90),
        (V311, {"will": Will("w/#", b"")}, CFG, None),
        (V3, {"will": Will("", b"")}, CFG, None),
    ],
)
def test_connect_refusals(
    level: int, connect_kw: dict[str, Any], cfg: ChannelConfig, expected: int | None
) -> None:
    ch = new_channel(cfg)
    acts = plain(ch.receive(make_connect(level, **connect_kw), NOW))
    if expected is None:
        assert acts == [closed("error")]
    else:
        assert acts == [Send(Connack(False, expected)), closed("error")]
    assert ch.state is State.CLOSED
    assert ch.session_opened(False) == []


def test_unknown_protocol_level_gets_311_connack_0x01() -> None:
    ch = new_channel()
    acts = plain(ch.receive(make_connect(7), NOW))
    assert acts == [Send(Connack(False, 0x01)), closed("error")]
    assert ch.protocol_level == V311


class _LevelError(UnsupportedProtocolVersion):
    def __init__(self, level: int) -> None:
        super().__init__("unsupported")
        self.protocol_level = level


@pytest.mark.parametrize(
    ("err", "level", "connack"),
    [
        (UnsupportedProtocolVersion("?"), V311, 0x01),
        (_LevelError(6), V311, 0x01),
        (_LevelError(5), V5, 0x84),
    ],
)
def test_codec_version_error_before_connect_answers_with_connack(
    err: UnsupportedProtocolVersion, level: int, connack: int
) -> None:
    ch = new_channel()
    assert plain(ch.protocol_error(err)) == [Send(Connack(False, connack)), closed("error")]
    assert ch.protocol_level == level


def test_codec_error_before_connect_closes_silently() -> None:
    ch = new_channel()
    assert plain(ch.protocol_error(MalformedPacket("junk"))) == [closed("error")]


@pytest.mark.parametrize(
    ("err", "connect_level", "expected"),
    [
        (MalformedPacket("bad client id"), V5, [Send(Connack(False, 0x81))]),
        (QuotaExceeded("user properties"), V5, [Send(Connack(False, 0x97))]),
        (UnsupportedProtocolVersion("?"), V5, [Send(Connack(False, 0x84))]),
        (MalformedPacket("bad client id"), V311, []),  # 3.1.1 has no code for it
        (MalformedPacket("not a CONNECT"), None, []),
    ],
)
def test_connect_the_codec_refused_is_answered_at_its_level(
    err: MQTTError, connect_level: int | None, expected: list[Action]
) -> None:
    """5.0 (3.1.4): a CONNECT the server refuses may get a CONNACK with the reason."""
    ch = new_channel()
    assert plain(ch.protocol_error(err, connect_level)) == [*expected, closed("error")]


@pytest.mark.parametrize(
    ("level", "code", "sent"),
    [
        (V5, 0x86, 0x86),
        (V5, 0x8A, 0x8A),
        (V311, 0x86, 0x04),
        (V311, 0x87, 0x05),
        (V311, 0x8A, 0x05),
        (V311, 0x88, 0x03),
        (V311, 0x05, 0x05),
        (V311, 0x99, 0x03),
        (V3, 0x85, 0x02),
    ],
)
def test_session_refused_by_node(level: int, code: int, sent: int) -> None:
    ch = new_channel()
    ch.receive(make_connect(level, will=WILL), NOW)
    assert plain(ch.session_opened(False, reason_code=code)) == [
        Send(Connack(False, sent)),
        closed("error"),
    ]
    assert ch.state is State.CLOSED


# --- the transition table -------------------------------------------------------------------

SAMPLES: dict[PacketType, Packet] = {
    PacketType.CONNECT: make_connect(V5),
    PacketType.CONNACK: Connack(),
    PacketType.PUBLISH: Publish("t", b""),
    PacketType.PUBACK: Puback(1),
    PacketType.PUBREC: Pubrec(1),
    PacketType.PUBREL: Pubrel(1),
    PacketType.PUBCOMP: Pubcomp(1),
    PacketType.SUBSCRIBE: Subscribe(1, (Subscription("t"),)),
    PacketType.SUBACK: Suback(1, (0,)),
    PacketType.UNSUBSCRIBE: Unsubscribe(1, ("t",)),
    PacketType.UNSUBACK: Unsuback(1),
    PacketType.PINGREQ: Pingreq(),
    PacketType.PINGRESP: Pingresp(),
    PacketType.DISCONNECT: Disconnect(),
    PacketType.AUTH: Auth(),
}


@pytest.mark.parametrize("ptype", [t for t in PacketType if t is not PacketType.CONNECT])
def test_first_packet_must_be_connect(ptype: PacketType) -> None:
    ch = new_channel()
    acts = ch.receive(SAMPLES[ptype], NOW)
    assert plain(acts) == [closed("error")]
    assert isinstance(acts[0], Close)
    assert f"{ptype.name} not allowed in state AWAIT_CONNECT" in acts[0].detail


@pytest.mark.parametrize(
    "ptype", [t for t in PacketType if (State.CONNECTED, t) not in TRANSITIONS]
)
@pytest.mark.parametrize("level", [V311, V5])
def test_packets_outside_the_table_are_protocol_errors(ptype: PacketType, level: int) -> None:
    ch = connected(level, will=WILL)
    acts = ch.receive(SAMPLES[ptype], NOW)
    expected: list[Action] = [Send(Disconnect(0x82))] if level == V5 else []
    expected += [KA_CANCEL, closed("error", WILL)]
    assert plain(acts) == expected
    close = acts[-1]
    assert isinstance(close, Close)
    assert f"{ptype.name} not allowed in state CONNECTED" in close.detail


def test_table_covers_exactly_the_client_packets() -> None:
    connected_types = {t for (s, t) in TRANSITIONS if s is State.CONNECTED}
    assert PacketType.CONNECT not in connected_types
    assert TRANSITIONS[(State.CONNECTED, PacketType.AUTH)] is State.CONNECTED  # re-auth
    assert {PacketType.SUBACK, PacketType.CONNACK, PacketType.PINGRESP}.isdisjoint(connected_types)
    assert TRANSITIONS[(State.CONNECTED, PacketType.DISCONNECT)] is State.CLOSED


@pytest.mark.parametrize(
    ("level", "expected"),
    [(V5, [Send(Connack(False, 0x82)), closed("error")]), (V311, [closed("error")])],
)
def test_second_connect_while_connecting_is_refused(level: int, expected: list[Action]) -> None:
    ch = new_channel()
    ch.receive(make_connect(level, will=WILL), NOW)
    assert plain(ch.receive(make_connect(level), NOW)) == expected
    assert ch.session_opened(False) == []


@pytest.mark.parametrize(
    ("level", "err", "expected"),
    [
        (V5, MalformedPacket("x"), [Send(Connack(False, 0x81)), closed("error")]),
        (V5, PacketTooLarge("x"), [Send(Connack(False, 0x95)), closed("error")]),
        (V5, TopicAliasInvalid("x"), [Send(Connack(False, 0x80)), closed("error")]),
        (V311, MalformedPacket("x"), [closed("error")]),
        (V3, PacketTooLarge("x"), [closed("error")]),
    ],
)
def test_codec_error_while_connecting(level: int, err: MQTTError, expected: list[Action]) -> None:
    ch = new_channel()
    ch.receive(make_connect(level, will=WILL), NOW)
    assert plain(ch.protocol_error(err)) == expected


def test_packets_after_close_are_ignored() -> None:
    ch = connected(V5)
    ch.receive(Disconnect(), NOW)
    assert ch.receive(Pingreq(), NOW) == []
    assert ch.connection_lost() == []
    assert ch.protocol_error(MalformedPacket("x")) == []


# --- pipelining before CONNACK ---------------------------------------------------------------


def test_packets_pipelined_after_connect_wait_for_the_connack() -> None:
    ch = new_channel()
    ch.receive(make_connect(V311, keep_alive=0), NOW)
    assert ch.receive(Publish("a/b", b"x", qos=1, packet_id=3), NOW + 1) == []
    assert ch.receive(Pingreq(), NOW + 2) == []
    assert ch.session_opened(False) == [
        Send(Connack(False, 0)),
        Route(Message("a/b", b"x", qos=1, sender="c1"), 1),
        Send(Pingresp()),
    ]


def test_pipelined_disconnect_is_processed_after_connack() -> None:
    ch = new_channel()
    ch.receive(make_connect(V311, keep_alive=0, will=WILL), NOW)
    ch.receive(Disconnect(), NOW)
    assert plain(ch.session_opened(False)) == [Send(Connack(False, 0)), closed("normal")]


def test_too_many_packets_before_connack_closes() -> None:
    ch = new_channel(ChannelConfig(max_packets_before_connack=2))
    ch.receive(make_connect(V5), NOW)
    assert ch.receive(Pingreq(), NOW) == []
    assert ch.receive(Pingreq(), NOW) == []
    assert plain(ch.receive(Pingreq(), NOW)) == [Send(Connack(False, 0x97)), closed("error")]


def test_refused_session_drops_pipelined_packets() -> None:
    ch = new_channel()
    ch.receive(make_connect(V5), NOW)
    ch.receive(Publish("t", b"", qos=0), NOW)
    assert plain(ch.session_opened(False, reason_code=0x87)) == [
        Send(Connack(False, 0x87)),
        closed("error"),
    ]


def test_resumed_session_keeps_incoming_qos2_ids() -> None:
    ch = connected(V5, session_present=True, qos2_ids=frozenset({4, 5}))
    assert ch.inbound_inflight == 2
    assert ch.receive(Pubrel(4), NOW) == [Released(4), Send(Pubcomp(4))]
    assert ch.receive(Publish("t", b"", qos=2, packet_id=5, dup=True), NOW) == [Send(Pubrec(5))]


def test_new_session_ignores_stale_qos2_ids() -> None:
    ch = connected(V5, session_present=False, qos2_ids=frozenset({4}))
    assert ch.receive(Pubrel(4), NOW) == [Send(Pubcomp(4, 0x92))]


# --- keep alive -------------------------------------------------------------------------------


@pytest.mark.parametrize("level", [V3, V311, V5])
def test_keep_alive_timeout_closes_with_will(level: int) -> None:
    ch = connected(level, keep_alive=60, will=WILL)
    assert ch.receive(Pingreq(), NOW + 50) == [Send(Pingresp())]
    assert ch.timer(KEEPALIVE_TIMER, NOW + 90) == [StartTimer(KEEPALIVE_TIMER, 50.0)]
    expected: list[Action] = [Send(Disconnect(0x8D))] if level == V5 else []
    expected.append(closed("keepalive", WILL))
    assert plain(ch.timer(KEEPALIVE_TIMER, NOW + 140)) == expected
    assert ch.timer(KEEPALIVE_TIMER, NOW + 300) == []


def test_unknown_timer_is_ignored() -> None:
    ch = connected(V5, keep_alive=60)
    assert ch.timer("other", NOW + 1000) == []


def test_no_keep_alive_no_timer() -> None:
    ch = connected(V5, keep_alive=0)
    assert ch.timer(KEEPALIVE_TIMER, NOW + 10**6) == []
    assert plain(ch.connection_lost()) == [closed("error")]


# --- DISCONNECT and other ends ------------------------------------------------------------------

WILL_DELAYED = Will("wills/c1", b"gone", properties=Properties(will_delay_interval=30))


@pytest.mark.parametrize(
    ("level", "connect_expiry", "disconnect", "expected"),
    [
        (V311, None, Disconnect(), [KA_CANCEL, closed("normal")]),
        (V3, None, Disconnect(), [KA_CANCEL, closed("normal")]),
        (V5, 100, Disconnect(), [KA_CANCEL, closed("normal")]),
        (V5, 100, Disconnect(0x04), [KA_CANCEL, closed("normal", WILL_DELAYED, 30)]),
        (V5, 100, Disconnect(0x80), [KA_CANCEL, closed("normal", WILL_DELAYED, 30)]),
        (
            V5,
            100,
            Disconnect(0x04, Properties(session_expiry_interval=10)),
            [KA_CANCEL, closed("normal", WILL_DELAYED, 10, session_expiry_s=10)],
        ),
        (
            V5,
            100,
            Disconnect(0, Properties(session_expiry_interval=0)),
            [KA_CANCEL, closed("normal", session_expiry_s=0)],
        ),
        (
            V5,
            0,
            Disconnect(0, Properties(session_expiry_interval=10)),
            [Send(Disconnect(0x82)), KA_CANCEL, closed("error", WILL_DELAYED, 0)],
        ),
        (
            V5,
            0,
            Disconnect(0, Properties(session_expiry_interval=0)),
            [KA_CANCEL, closed("normal", session_expiry_s=0)],
        ),
    ],
)
def test_client_disconnect(
    level: int, connect_expiry: int | None, disconnect: Disconnect, expected: list[Action]
) -> None:
    props = Properties(session_expiry_interval=connect_expiry) if level == V5 else NO_PROPERTIES
    will = WILL_DELAYED if level == V5 else WILL
    ch = connected(level, keep_alive=60, will=will, properties=props)
    assert plain(ch.receive(disconnect, NOW)) == expected
    assert ch.state is State.CLOSED


def test_disconnect_session_expiry_is_capped() -> None:
    ch = connected(
        V5,
        ChannelConfig(max_session_expiry_s=50),
        keep_alive=0,
        properties=Properties(session_expiry_interval=10),
    )
    acts = plain(ch.receive(Disconnect(0, Properties(session_expiry_interval=99)), NOW))
    assert acts == [closed("normal", session_expiry_s=50)]


@pytest.mark.parametrize(
    ("expiry", "delay"), [(100, 30), (10, 10), (0, 0)]
)
def test_will_delay_is_clamped_to_session_expiry(expiry: int, delay: int) -> None:
    ch = connected(
        V5, keep_alive=0, will=WILL_DELAYED, properties=Properties(session_expiry_interval=expiry)
    )
    assert plain(ch.connection_lost()) == [closed("error", WILL_DELAYED, delay)]


@pytest.mark.parametrize("level", [V311, V5])
def test_taken_over(level: int) -> None:
    ch = connected(level, keep_alive=30, will=WILL)
    expected: list[Action] = [Send(Disconnect(0x8E))] if level == V5 else []
    expected += [KA_CANCEL, closed("takenover", WILL)]
    assert plain(ch.taken_over()) == expected
    assert ch.taken_over() == []


def test_taken_over_before_connack_closes_without_will() -> None:
    ch = new_channel()
    ch.receive(make_connect(V5, will=WILL), NOW)
    assert plain(ch.taken_over()) == [closed("takenover")]


@pytest.mark.parametrize("level", [V311, V5])
def test_server_disconnect(level: int) -> None:
    ch = connected(level, keep_alive=30, will=WILL)
    expected: list[Action] = [Send(Disconnect(0x8B))] if level == V5 else []
    expected += [KA_CANCEL, closed("kicked", WILL)]
    assert plain(ch.server_disconnect(0x8B)) == expected


@pytest.mark.parametrize(
    ("level", "code", "connack"),
    [(V311, 0x8B, 0x03), (V5, 0x8B, 0x88), (V5, 0x89, 0x89), (V5, 0x98, 0x80)],
)
def test_server_disconnect_before_connack_refuses(level: int, code: int, connack: int) -> None:
    ch = new_channel()
    ch.receive(make_connect(level, will=WILL), NOW)
    assert plain(ch.server_disconnect(code)) == [Send(Connack(False, connack)), closed("error")]


def test_server_disconnect_before_connect() -> None:
    assert plain(new_channel().server_disconnect(0x8B)) == [closed("kicked")]


@pytest.mark.parametrize("level", [V3, V311, V5])
def test_connection_lost_publishes_will(level: int) -> None:
    ch = connected(level, keep_alive=0, will=WILL)
    assert plain(ch.connection_lost()) == [closed("error", WILL)]


def test_connection_lost_before_connack_has_no_will() -> None:
    ch = new_channel()
    ch.receive(make_connect(V5, will=WILL), NOW)
    assert plain(ch.connection_lost()) == [closed("error")]


def test_protocol_error_code_not_allowed_in_disconnect_becomes_0x82() -> None:
    from services.mqtt.errors import ClientIdentifierNotValid, PacketTooLarge

    ch = connected(V5, keep_alive=0)
    assert plain(ch.protocol_error(ClientIdentifierNotValid("?"))) == [
        Send(Disconnect(0x82)),
        closed("error"),
    ]
    ch = connected(V5, keep_alive=0)
    assert plain(ch.protocol_error(PacketTooLarge("big"))) == [
        Send(Disconnect(0x95)),
        closed("error"),
    ]


def test_pingreq_gets_pingresp() -> None:
    for level in (V3, V311, V5):
        assert connected(level).receive(Pingreq(), NOW) == [Send(Pingresp())]
