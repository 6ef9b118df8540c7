"""Every way a connection ends: the base class `services.mqtt.channel.Channel` builds on.

Theory of operation. A connection ends by the client (DISCONNECT; the
socket closing), by a timer (no CONNECT within the connect timeout, keep
alive), by the server (takeover, kick, shutdown) or by a protocol error.
Each way ends in `_close`: state CLOSED, the keep alive timer cancelled and
one `Close` action carrying the will (or None) and its delay, clamped to
the session expiry. Connected 5.0 clients get a DISCONNECT with the reason
first (`_server_close`); before the CONNACK a refusal is the channel's
`_refuse` (a CONNACK, then Close without the will).

The will is published on every close except a DISCONNECT with reason 0x00
(or any 3.x DISCONNECT) and closes before the CONNACK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.mqtt.actions import Action, CancelTimer, Close, Send, StartTimer
from services.mqtt.channel_auth import REAUTH_TIMER
from services.mqtt.channel_states import SERVER_DISCONNECT_CODES, State
from services.mqtt.errors import MQTTError, ProtocolError, UnsupportedProtocolVersion
from services.mqtt.packets import (
    NO_PROPERTIES,
    ConnackCode311,
    Disconnect,
    Properties,
    ProtocolLevel,
    ReasonCode,
)

if TYPE_CHECKING:
    from services.mqtt.channel_auth import EnhancedAuth
    from services.mqtt.channel_config import ChannelConfig
    from services.mqtt.channel_connect import Negotiated
    from services.mqtt.packets import Packet, Will

RC = ReasonCode
KEEPALIVE_TIMER = "keepalive"
CONNECT_TIMER = "connect"
KEEPALIVE_FACTOR = 1.5  # MQTT 3.1.2.10: one and a half times the keep alive


class ChannelEnds:
    """The closing half of a channel; `Channel` holds the state it reads."""

    config: ChannelConfig
    state: State
    protocol_level: int
    will: Will | None
    session_expiry_s: int
    _neg: Negotiated | None
    _last_rx: float
    _keepalive_armed: bool
    _held: list[tuple[Packet, float]]
    _auth: EnhancedAuth | None

    @property
    def v5(self) -> bool:
        return self.protocol_level == ProtocolLevel.MQTT_5

    @property
    def keep_alive(self) -> int:
        """Effective keep alive in seconds (0: none)."""
        return self._neg.keep_alive if self._neg else 0

    def _refuse(
        self, reason_code: int, detail: str, *, v3_default: int | None = None
    ) -> list[Action]:
        raise NotImplementedError  # Channel's: a refusing CONNACK, then Close

    def _on_disconnect(self, d: Disconnect) -> list[Action]:
        if self.state is State.AUTHENTICATING:  # before the CONNACK: no will
            return self._close_early(
                "normal", f"DISCONNECT 0x{d.reason_code:02X} while authenticating"
            )
        new_expiry = None
        with_will = False
        if self.v5 and self._neg is not None:
            requested = d.properties.session_expiry_interval
            if requested is not None:
                if requested and self._neg.requested_expiry_s == 0:
                    raise ProtocolError("DISCONNECT sets a session expiry after CONNECT set 0")
                new_expiry = min(requested, self.config.max_session_expiry_s)
                self.session_expiry_s = new_expiry
            with_will = d.reason_code != RC.SUCCESS
        detail = f"client DISCONNECT 0x{d.reason_code:02X}"
        return self._close("normal", detail, with_will=with_will, session_expiry_s=new_expiry)

    def timer(self, name: str, now: float) -> list[Action]:
        """A StartTimer the channel asked for has fired."""
        if name == CONNECT_TIMER:
            if self.state is State.AWAIT_CONNECT:
                return self._close_early("connect_timeout", "no CONNECT within the connect timeout")
            if self.state is State.AUTHENTICATING:
                return self._close_early("connect_timeout", "authentication not finished in time")
            return []
        if name == REAUTH_TIMER:
            if self.state is State.CONNECTED and self._auth is not None and self._auth.reauth:
                detail = "re-authentication not finished in time"
                return self._server_close(RC.NOT_AUTHORIZED, "error", detail)
            return []
        if name != KEEPALIVE_TIMER or not self._keepalive_armed:
            return []
        deadline = self._last_rx + self.keep_alive * KEEPALIVE_FACTOR
        if now < deadline:
            return [StartTimer(KEEPALIVE_TIMER, deadline - now)]
        self._keepalive_armed = False
        return self._server_close(RC.KEEP_ALIVE_TIMEOUT, "keepalive", "keep alive timed out")

    def taken_over(self) -> list[Action]:
        """Another connection claimed this session: DISCONNECT 0x8E (5.0), Close."""
        if self.state is State.CONNECTED:
            return self._server_close(RC.SESSION_TAKEN_OVER, "takenover", "session taken over")
        return self._close_early("takenover", "session taken over before CONNACK")

    def server_disconnect(self, reason_code: int, reference: str | None = None) -> list[Action]:
        """The server ends it (shutdown 0x8B, kick 0x98, drain 0x9C + `reference`)."""
        detail = f"server disconnect 0x{reason_code:02X}"
        if self.state is State.CONNECTED:
            return self._server_close(reason_code, "kicked", detail, reference)
        if self.state in (State.CONNECTING, State.AUTHENTICATING):
            return self._refuse(reason_code, detail, v3_default=ConnackCode311.SERVER_UNAVAILABLE)
        return self._close_early("kicked", detail)

    def connection_lost(self) -> list[Action]:
        """The socket closed without a DISCONNECT: the will goes out."""
        if self.state is State.CONNECTED:
            return self._close("error", "connection lost")
        return self._close_early("error", "connection lost before CONNACK")

    def protocol_error(self, err: MQTTError, connect_level: int | None = None) -> list[Action]:
        """What to do about an MQTTError (from the channel or the codec).

        Connected: DISCONNECT with the error's reason code (5.0; 0x82 when
        the spec does not allow that code in DISCONNECT), then Close with the
        will. Before the CONNACK: a refusing CONNACK where the level has a code
        for it (always on 5.0; for a CONNECT the codec refused, its level byte
        is `connect_level`, from `codec.peek_connect_level`), then Close without the will.
        """
        detail = f"{type(err).__name__}: {err}"
        if self.state is State.CLOSED:
            return []
        if self.state is State.CONNECTED:
            code = err.reason_code
            if code not in SERVER_DISCONNECT_CODES:
                code = RC.PROTOCOL_ERROR
            return self._server_close(code, "error", detail)
        if self.state is State.CONNECTING or self.protocol_level:
            return self._refuse(err.reason_code, detail)
        level = getattr(err, "protocol_level", connect_level)
        unsupported = isinstance(err, UnsupportedProtocolVersion)
        if self.state is State.AWAIT_CONNECT and (unsupported or level == ProtocolLevel.MQTT_5):
            self.protocol_level = ProtocolLevel.MQTT_5 if level == 5 else ProtocolLevel.MQTT_3_1_1
            return self._refuse(err.reason_code, detail)
        return self._close_early("error", detail)

    def _server_close(
        self, reason_code: int, reason: str, detail: str, reference: str | None = None
    ) -> list[Action]:
        props = Properties(server_reference=reference) if reference else NO_PROPERTIES
        actions: list[Action] = [Send(Disconnect(reason_code, props))] if self.v5 else []
        actions += self._close(reason, detail)
        return actions

    def _close_early(self, reason: str, detail: str) -> list[Action]:
        if self.state is State.CLOSED:
            return []
        return self._close(reason, detail, with_will=False)

    def _close(
        self,
        reason: str,
        detail: str,
        *,
        with_will: bool = True,
        session_expiry_s: int | None = None,
    ) -> list[Action]:
        self.state = State.CLOSED
        self._held.clear()
        actions: list[Action] = []
        if self._keepalive_armed:
            self._keepalive_armed = False
            actions.append(CancelTimer(KEEPALIVE_TIMER))
        will = self.will if with_will else None
        delay = 0
        if will is not None and self._neg is not None:
            delay = min(self._neg.will_delay_s, self.session_expiry_s)
        actions.append(Close(reason, will, delay, detail=detail, session_expiry_s=session_expiry_s))
        return actions
