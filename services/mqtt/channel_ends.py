"""Every way a connection ends: `ChannelEnds`, one part of a `Channel`.

Theory of operation. A connection ends by the client (DISCONNECT; the
socket closing), by a timer (no CONNECT within the connect timeout, keep
alive), by the server (takeover, kick, shutdown) or by a protocol error.
Each way ends in `_close`: state CLOSED, the keep alive timer cancelled and
one `Close` action carrying the will (or None) and its delay, clamped to
the session expiry. Connected 5.0 clients get a DISCONNECT with the reason
first (`server_close`); before the CONNACK a refusal (`refuse`) is a
CONNACK with the reason, where the level has a code for it, then Close
without the will. The keep alive lives here too: it is a timer that ends
the connection, counted from the last packet the channel took in (`Link.last_rx`).

The ends read and write the connection through the `Link` they share with
the channel (channel_states); the channel calls them and they call nothing
back.

The will is published on every close except a DISCONNECT with reason 0x00
(or any 3.x DISCONNECT) and closes before the CONNACK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.mqtt.actions import Action, CancelTimer, Close, Send, StartTimer
from services.mqtt.channel_auth import REAUTH_TIMER
from services.mqtt.channel_connect import connack_code
from services.mqtt.channel_states import SERVER_DISCONNECT_CODES, Link, State
from services.mqtt.errors import MQTTError, ProtocolError, UnsupportedProtocolVersion
from services.mqtt.packets import (
    NO_PROPERTIES,
    Connack,
    ConnackCode311,
    Disconnect,
    Properties,
    ProtocolLevel,
    ReasonCode,
)

if TYPE_CHECKING:
    from services.mqtt.channel_config import ChannelConfig

RC = ReasonCode
KEEPALIVE_TIMER = "keepalive"
CONNECT_TIMER = "connect"
KEEPALIVE_FACTOR = 1.5  # MQTT 3.1.2.10: one and a half times the keep alive


class ChannelEnds:
    """How one channel's connection ends; the `Link` holds what it reads and sets."""

    def __init__(self, link: Link, config: ChannelConfig) -> None:
        self._link = link
        self._config = config
        self._keepalive_armed = False
        self.refused_with: int | None = None  # the refusing CONNACK's code, once sent

    # -- the keep alive -----------------------------------------------------

    def start_keepalive(self) -> list[Action]:
        """At the CONNACK: the keep alive timer, if the client has one."""
        keep_alive = self._link.keep_alive
        if not keep_alive:
            return []
        self._keepalive_armed = True
        return [StartTimer(KEEPALIVE_TIMER, keep_alive * KEEPALIVE_FACTOR)]

    # -- the ways it ends ---------------------------------------------------

    def on_disconnect(self, d: Disconnect) -> list[Action]:
        link = self._link
        if link.state is State.AUTHENTICATING:  # before the CONNACK: no will
            return self._close_early(
                "normal", f"DISCONNECT 0x{d.reason_code:02X} while authenticating"
            )
        new_expiry = None
        with_will = False
        if link.v5 and link.neg is not None:
            requested = d.properties.session_expiry_interval
            if requested is not None:
                if requested and link.neg.requested_expiry_s == 0:
                    raise ProtocolError("DISCONNECT sets a session expiry after CONNECT set 0")
                new_expiry = min(requested, self._config.max_session_expiry_s)
                link.session_expiry_s = new_expiry
            with_will = d.reason_code != RC.SUCCESS
        detail = f"client DISCONNECT 0x{d.reason_code:02X}"
        return self.close("normal", detail, with_will=with_will, session_expiry_s=new_expiry)

    def timer(self, name: str, now: float) -> list[Action]:
        """A StartTimer the channel asked for has fired."""
        state = self._link.state
        if name == CONNECT_TIMER:
            if state is State.AWAIT_CONNECT:
                return self._close_early("connect_timeout", "no CONNECT within the connect timeout")
            if state is State.AUTHENTICATING:
                return self._close_early("connect_timeout", "authentication not finished in time")
            return []
        if name == REAUTH_TIMER:
            auth = self._link.auth
            if state is State.CONNECTED and auth is not None and auth.reauth:
                detail = "re-authentication not finished in time"
                return self.server_close(RC.NOT_AUTHORIZED, "error", detail)
            return []
        if name != KEEPALIVE_TIMER or not self._keepalive_armed:
            return []
        deadline = self._link.last_rx + self._link.keep_alive * KEEPALIVE_FACTOR
        if now < deadline:
            return [StartTimer(KEEPALIVE_TIMER, deadline - now)]
        self._keepalive_armed = False
        return self.server_close(RC.KEEP_ALIVE_TIMEOUT, "keepalive", "keep alive timed out")

    def taken_over(self) -> list[Action]:
        """Another connection claimed this session: DISCONNECT 0x8E (5.0), Close."""
        if self._link.state is State.CONNECTED:
            return self.server_close(RC.SESSION_TAKEN_OVER, "takenover", "session taken over")
        return self._close_early("takenover", "session taken over before CONNACK")

    def server_disconnect(self, reason_code: int, reference: str | None = None) -> list[Action]:
        """The server ends it (shutdown 0x8B, kick 0x98, drain 0x9C + `reference`)."""
        detail = f"server disconnect 0x{reason_code:02X}"
        state = self._link.state
        if state is State.CONNECTED:
            return self.server_close(reason_code, "kicked", detail, reference)
        if state in (State.CONNECTING, State.AUTHENTICATING):
            return self.refuse(reason_code, detail, v3_default=ConnackCode311.SERVER_UNAVAILABLE)
        return self._close_early("kicked", detail)

    def connection_lost(self) -> list[Action]:
        """The socket closed without a DISCONNECT: the will goes out."""
        if self._link.state is State.CONNECTED:
            return self.close("error", "connection lost")
        return self._close_early("error", "connection lost before CONNACK")

    def protocol_error(self, err: MQTTError, connect_level: int | None = None) -> list[Action]:
        """What to do about an MQTTError (from the channel or the codec).

        Connected: DISCONNECT with the error's reason code (5.0; 0x82 when
        the spec does not allow that code in DISCONNECT), then Close with the
        will. Before the CONNACK: a refusing CONNACK where the level has a code
        for it (always on 5.0; for a CONNECT the codec refused, its level byte
        is `connect_level`, from `codec.peek_connect_level`), then Close without the will.
        """
        link = self._link
        detail = f"{type(err).__name__}: {err}"
        if link.state is State.CLOSED:
            return []
        if link.state is State.CONNECTED:
            code = err.reason_code
            if code not in SERVER_DISCONNECT_CODES:
                code = RC.PROTOCOL_ERROR
            return self.server_close(code, "error", detail)
        if link.state is State.CONNECTING or link.protocol_level:
            return self.refuse(err.reason_code, detail)
        level = getattr(err, "protocol_level", connect_level)
        unsupported = isinstance(err, UnsupportedProtocolVersion)
        if link.state is State.AWAIT_CONNECT and (unsupported or level == ProtocolLevel.MQTT_5):
            link.protocol_level = ProtocolLevel.MQTT_5 if level == 5 else ProtocolLevel.MQTT_3_1_1
            return self.refuse(err.reason_code, detail)
        return self._close_early("error", detail)

    def refuse(
        self, reason_code: int, detail: str, *, v3_default: int | None = None
    ) -> list[Action]:
        """Refuse before CONNACK: a CONNACK with the code (if the level has
        one, else `v3_default` if given), then Close without the will."""
        code = connack_code(reason_code, self._link.protocol_level)
        if code is None:
            code = v3_default
        actions: list[Action] = []
        if code is not None:
            actions.append(Send(Connack(False, code)))
            self.refused_with = code
        actions += self.close("error", detail, with_will=False)
        return actions

    def server_close(
        self, reason_code: int, reason: str, detail: str, reference: str | None = None
    ) -> list[Action]:
        """After the CONNACK: DISCONNECT `reason_code` (5.0), then Close with the will."""
        props = Properties(server_reference=reference) if reference else NO_PROPERTIES
        actions: list[Action] = [Send(Disconnect(reason_code, props))] if self._link.v5 else []
        actions += self.close(reason, detail)
        return actions

    def _close_early(self, reason: str, detail: str) -> list[Action]:
        if self._link.state is State.CLOSED:
            return []
        return self.close(reason, detail, with_will=False)

    def close(
        self,
        reason: str,
        detail: str,
        *,
        with_will: bool = True,
        session_expiry_s: int | None = None,
    ) -> list[Action]:
        """State CLOSED, the keep alive cancelled, one Close (the will, if any)."""
        link = self._link
        link.state = State.CLOSED
        link.held.clear()
        actions: list[Action] = []
        if self._keepalive_armed:
            self._keepalive_armed = False
            actions.append(CancelTimer(KEEPALIVE_TIMER))
        will = link.will if with_will else None
        delay = 0
        if will is not None and link.neg is not None:
            delay = min(link.neg.will_delay_s, link.session_expiry_s)
        actions.append(Close(reason, will, delay, detail=detail, session_expiry_s=session_expiry_s))
        return actions
