"""CONNECT negotiation: what the server accepts of a CONNECT, and its CONNACK.

`negotiate` is a pure function of the config and the CONNECT: it either
refuses (with an MQTT 5 reason code; `connack_code` translates it for 3.x)
or returns the values the connection runs with. An Authentication Method is
refused (0x8C) here only when the node authenticates no one; else the node
says whether it takes the method (`channel_auth`).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from services.mqtt.channel_config import NEVER_EXPIRE, ChannelConfig
from services.mqtt.errors import TopicNameInvalid
from services.mqtt.packets import (
    ConnackCode311,
    Connect,
    Properties,
    ProtocolLevel,
    ReasonCode,
)
from services.mqtt.topics import validate_topic_name

RC = ReasonCode
DEFAULT_RECEIVE_MAXIMUM = 65535


@dataclass(frozen=True, slots=True)
class Refusal:
    reason_code: int
    detail: str


@dataclass(frozen=True, slots=True)
class Negotiated:
    client_id: str
    assigned: bool
    keep_alive: int
    """Effective seconds, 0 for none."""
    server_keep_alive: int | None
    """Announced in the 5.0 CONNACK when the server overrides the client's value."""
    session_expiry_s: int
    requested_expiry_s: int
    client_receive_maximum: int
    client_max_packet_size: int | None
    client_topic_alias_maximum: int
    will_delay_s: int


_V3_CONNACK: dict[int, int] = {
    RC.UNSPECIFIED_ERROR: ConnackCode311.SERVER_UNAVAILABLE,
    RC.UNSUPPORTED_PROTOCOL_VERSION: ConnackCode311.UNACCEPTABLE_PROTOCOL_VERSION,
    RC.CLIENT_IDENTIFIER_NOT_VALID: ConnackCode311.IDENTIFIER_REJECTED,
    RC.BAD_USER_NAME_OR_PASSWORD: ConnackCode311.BAD_USERNAME_OR_PASSWORD,
    RC.BAD_AUTHENTICATION_METHOD: ConnackCode311.BAD_USERNAME_OR_PASSWORD,
    RC.NOT_AUTHORIZED: ConnackCode311.NOT_AUTHORIZED,
    RC.BANNED: ConnackCode311.NOT_AUTHORIZED,
    RC.SERVER_UNAVAILABLE: ConnackCode311.SERVER_UNAVAILABLE,
    RC.SERVER_BUSY: ConnackCode311.SERVER_UNAVAILABLE,
    RC.SERVER_SHUTTING_DOWN: ConnackCode311.SERVER_UNAVAILABLE,
    RC.QUOTA_EXCEEDED: ConnackCode311.SERVER_UNAVAILABLE,
    RC.CONNECTION_RATE_EXCEEDED: ConnackCode311.SERVER_UNAVAILABLE,
    RC.USE_ANOTHER_SERVER: ConnackCode311.SERVER_UNAVAILABLE,
    RC.SERVER_MOVED: ConnackCode311.SERVER_UNAVAILABLE,
}


_V5_CONNACK = frozenset(
    {0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C}
    | {0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F}
)
"""Reason codes a 5.0 CONNACK may carry (MQTT 5 3.2.2.2)."""


def wall_ms() -> int:
    """Wall-clock milliseconds: message expiry means the same on every node."""
    return time.time_ns() // 1_000_000


def random_client_id(prefix: str) -> Callable[[], str]:
    """Client ids the server assigns (MQTT 5 3.2.2.3.7)."""
    return lambda: f"{prefix}{secrets.token_hex(8)}"


def connack_code(reason_code: int, protocol_level: int) -> int | None:
    """The CONNACK code for a refusal at `protocol_level`.

    5.0 takes the MQTT 5 reason codes a CONNACK allows (shutting down
    becomes 0x88 Server unavailable, any other becomes 0x80). 3.x takes its own codes 1-5
    unchanged and translates MQTT 5 ones; None means 3.x has no code for it
    (a protocol violation): close without a CONNACK.
    """
    if protocol_level == ProtocolLevel.MQTT_5:
        if reason_code in _V5_CONNACK:
            return reason_code
        if reason_code == RC.SERVER_SHUTTING_DOWN:
            return RC.SERVER_UNAVAILABLE
        return RC.UNSPECIFIED_ERROR
    if 0 < reason_code <= ConnackCode311.NOT_AUTHORIZED:
        return reason_code
    return _V3_CONNACK.get(reason_code)


def negotiate(
    config: ChannelConfig, connect: Connect, new_client_id: Callable[[], str]
) -> Negotiated | Refusal:
    level = connect.protocol_level
    props = connect.properties
    if level not in (ProtocolLevel.MQTT_3_1, ProtocolLevel.MQTT_3_1_1, ProtocolLevel.MQTT_5):
        return Refusal(RC.UNSUPPORTED_PROTOCOL_VERSION, f"protocol level {level}")
    v5 = level == ProtocolLevel.MQTT_5
    if v5 and props.authentication_method is not None and not config.authenticate:
        return Refusal(
            RC.BAD_AUTHENTICATION_METHOD,
            f"enhanced authentication {props.authentication_method!r} is not supported",
        )
    if v5 and (props.receive_maximum == 0 or props.maximum_packet_size == 0):
        return Refusal(RC.PROTOCOL_ERROR, "receive maximum or maximum packet size of 0")
    refusal = _check_client_id(config, connect)
    if refusal is None:
        refusal = _check_will(config, connect)
    if refusal is not None:
        return refusal

    client_id, assigned = connect.client_id, False
    if not client_id:
        client_id, assigned = new_client_id(), True

    keep_alive, server_keep_alive = connect.keep_alive, None
    if v5 and config.server_keep_alive is not None:
        keep_alive = server_keep_alive = config.server_keep_alive
    elif keep_alive > config.max_keep_alive:
        if not v5:  # 3.x cannot be told a Server Keep Alive: refused, as Mosquitto does
            detail = f"keep alive {keep_alive} s over the maximum {config.max_keep_alive} s"
            return Refusal(RC.CLIENT_IDENTIFIER_NOT_VALID, detail)
        keep_alive = server_keep_alive = config.max_keep_alive

    if v5:
        requested = props.session_expiry_interval or 0
    else:
        requested = 0 if connect.clean_start else NEVER_EXPIRE
    expiry = min(requested, config.max_session_expiry_s)

    will_delay = 0
    if v5 and connect.will is not None:
        will_delay = connect.will.properties.will_delay_interval or 0

    window = (props.receive_maximum or DEFAULT_RECEIVE_MAXIMUM) if v5 else config.inflight_window_3x
    if config.max_inflight:
        window = min(window, config.max_inflight) if v5 else config.max_inflight

    return Negotiated(
        client_id=client_id,
        assigned=assigned,
        keep_alive=keep_alive,
        server_keep_alive=server_keep_alive,
        session_expiry_s=expiry,
        requested_expiry_s=requested,
        client_receive_maximum=window,
        client_max_packet_size=props.maximum_packet_size if v5 else None,
        client_topic_alias_maximum=(props.topic_alias_maximum or 0) if v5 else 0,
        will_delay_s=will_delay,
    )


def _check_client_id(config: ChannelConfig, connect: Connect) -> Refusal | None:
    cid = connect.client_id
    bad = RC.CLIENT_IDENTIFIER_NOT_VALID
    # MQTT 3.1 asked for 1 to 23 characters; Mosquitto and EMQX take longer ids from
    # 3.1 clients (old libraries send their long default ids), and so do we.
    if connect.protocol_level == ProtocolLevel.MQTT_3_1 and not cid:
        return Refusal(bad, "MQTT 3.1 has no empty client id")
    if len(cid) > config.max_client_id_length:
        return Refusal(bad, f"client id longer than {config.max_client_id_length}")
    if not cid and connect.protocol_level == ProtocolLevel.MQTT_3_1_1 and not connect.clean_start:
        return Refusal(bad, "empty client id with clean_session=0")
    return None


def _check_will(config: ChannelConfig, connect: Connect) -> Refusal | None:
    will = connect.will
    if will is None:
        return None
    try:
        validate_topic_name(will.topic)
    except TopicNameInvalid as err:
        return Refusal(RC.TOPIC_NAME_INVALID, f"will topic: {err}")
    if will.qos > config.max_qos:
        return Refusal(RC.QOS_NOT_SUPPORTED, f"will QoS {will.qos} > {config.max_qos}")
    if will.retain and not config.retain_available:
        return Refusal(RC.RETAIN_NOT_SUPPORTED, "retained will, retain is not available")
    return None


def connack_properties(config: ChannelConfig, neg: Negotiated) -> Properties:
    """The 5.0 CONNACK properties: every limit the client must respect."""
    return Properties(
        receive_maximum=config.receive_maximum,
        maximum_packet_size=config.max_packet_size,
        topic_alias_maximum=config.topic_alias_maximum,
        retain_available=int(config.retain_available),
        maximum_qos=config.max_qos if config.max_qos < 2 else None,
        wildcard_subscription_available=int(config.wildcard_subscriptions),
        subscription_identifier_available=int(config.subscription_identifiers),
        shared_subscription_available=int(config.shared_subscriptions),
        server_keep_alive=neg.server_keep_alive,
        assigned_client_identifier=neg.client_id if neg.assigned else None,
        session_expiry_interval=(
            neg.session_expiry_s if neg.session_expiry_s < neg.requested_expiry_s else None
        ),
    )
