"""The channel's states and its transition table (see `services.mqtt.channel`)."""

from __future__ import annotations

from enum import Enum

from services.mqtt.packets import PacketType

T = PacketType


class State(Enum):
    AWAIT_CONNECT = "await_connect"
    AUTHENTICATING = "authenticating"  # a CONNECT's enhanced authentication (AUTH packets)
    CONNECTING = "connecting"
    CONNECTED = "connected"
    CLOSED = "closed"


_FROM_CLIENT = (
    T.PUBLISH,
    T.PUBACK,
    T.PUBREC,
    T.PUBREL,
    T.PUBCOMP,
    T.SUBSCRIBE,
    T.UNSUBSCRIBE,
    T.PINGREQ,
    T.DISCONNECT,
)

TRANSITIONS: dict[tuple[State, PacketType], State] = {
    (State.AWAIT_CONNECT, T.CONNECT): State.CONNECTING,
    (State.AUTHENTICATING, T.AUTH): State.AUTHENTICATING,
    (State.AUTHENTICATING, T.DISCONNECT): State.CLOSED,  # MQTT-3.1.2-30: AUTH or DISCONNECT
    (State.CONNECTED, T.AUTH): State.CONNECTED,  # re-authentication
    **{(State.CONNECTING, t): State.CONNECTING for t in _FROM_CLIENT},  # held
    **{(State.CONNECTED, t): State.CONNECTED for t in _FROM_CLIENT},
    (State.CONNECTED, T.DISCONNECT): State.CLOSED,
}
"""(state, packet type from the client) -> next state. Not here: ProtocolError."""

SERVER_DISCONNECT_CODES = frozenset(
    {0x00, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90}
    | set(range(0x93, 0xA3))
)
"""Reason codes a server may put in DISCONNECT (MQTT 5 3.14.2.1)."""
