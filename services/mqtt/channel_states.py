"""The channel's states, its transition table, and the `Link` its parts share
(see `services.mqtt.channel`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from services.mqtt.packets import PacketType, ProtocolLevel

if TYPE_CHECKING:
    from services.mqtt.channel_auth import EnhancedAuth
    from services.mqtt.channel_connect import Negotiated
    from services.mqtt.packets import Packet, Will

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


@dataclass(slots=True)
class Link:
    """What the channel and its ends (channel_ends) both know of one connection.

    Who writes what: the channel moves `state` forward, stamps `last_rx` with
    each packet it takes in (the keep alive the ends keep counts from it) and
    sets the rest as the CONNECT is negotiated, authenticated and its session
    opened; the ends write only what ending the connection changes: `state` to
    CLOSED (nothing else does), `held` emptied, `session_expiry_s` from a
    DISCONNECT, and `protocol_level` for a CONNECT the codec refused before it
    was decoded.
    """

    state: State = State.AWAIT_CONNECT
    protocol_level: int = 0  # 0 until a CONNECT (or a refused CONNECT's level byte)
    will: Will | None = None
    session_expiry_s: int = 0
    neg: Negotiated | None = None  # the accepted CONNECT's terms
    auth: EnhancedAuth | None = None  # a CONNECT with an Authentication Method
    held: list[tuple[Packet, float]] = field(default_factory=list)  # pipelined while CONNECTING
    last_rx: float = 0.0  # when the latest packet arrived (the node's monotonic clock)

    @property
    def v5(self) -> bool:
        return self.protocol_level == ProtocolLevel.MQTT_5

    @property
    def keep_alive(self) -> int:
        """Effective keep alive in seconds (0: none)."""
        return self.neg.keep_alive if self.neg else 0
