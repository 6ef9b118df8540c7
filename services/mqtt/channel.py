"""The MQTT channel: one connection's protocol state machine, with no I/O.

Theory of operation. A `Channel` takes decoded packets (`receive`), timer
firings (`timer`) and the results of work the node did for it
(`session_opened`, `routed`, `subscribed`, `unsubscribed`), and returns the
actions the node carries out in order (services/mqtt/actions.py). Which
packet may arrive in which state is one table, `TRANSITIONS`
(channel_states); a pair that is not in it is a ProtocolError naming both.

    AWAIT_CONNECT --CONNECT--> CONNECTING --session_opened(ok)--> CONNECTED
         any close, refusal or error ------------------------------> CLOSED

Packets pipelined after CONNECT are held while CONNECTING and replayed
after the CONNACK (MQTT 5 3.1.4). An MQTTError while handling a packet
becomes "DISCONNECT with its reason code (5.0, where the spec allows it),
then Close with the will"; before the CONNACK, a refusing CONNACK.

The work per packet family lives beside this module: CONNECT negotiation
(channel_connect), inbound PUBLISH and the QoS 1/2 receiver flows
(channel_inbound), SUBSCRIBE / UNSUBSCRIBE (channel_subscribe), outgoing
PUBLISH shaping (channel_outbound). This module owns the states, the
table, the outbound QoS stages and every way a connection ends.

Outbound QoS: the node owns the inflight window and calls `deliver`; packet
id stages are in `channel_outbound.OutboundStages`.
`client_receive_maximum` is the window the node must respect (3.x:
config.inflight_window_3x). With `config.authenticate`, a valid CONNECT
first asks the node to `Authenticate` (answer: `authenticated`).

Keep alive: one timer, "keepalive"; fired early relative to the last packet,
it restarts itself for the time left (the node arms it once per period).
`now` (receive, timer) is any seconds clock the node uses consistently (the
loop's monotonic time). Message expiry is stamped in wall-clock ms (the same
on every node) from the `wall_ms` clock, injected by tests.

The will is published on every close except a DISCONNECT with reason 0x00
(or any 3.x DISCONNECT) and closes before the CONNACK.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet

from services.mqtt.actions import (
    Acked,
    Action,
    Authenticate,
    CancelTimer,
    Close,
    OpenSession,
    Send,
    StartTimer,
)
from services.mqtt.channel_config import ChannelConfig
from services.mqtt.channel_connect import (
    Negotiated,
    Refusal,
    connack_code,
    connack_properties,
    negotiate,
    random_client_id,
)
from services.mqtt.channel_connect import (
    wall_ms as default_wall_ms,
)
from services.mqtt.channel_inbound import InboundFlow
from services.mqtt.channel_outbound import (
    PUBACK_STAGE,
    PUBCOMP_STAGE,
    OutboundShaper,
    OutboundStages,
)
from services.mqtt.channel_states import SERVER_DISCONNECT_CODES, TRANSITIONS, State
from services.mqtt.channel_subscribe import SubscribeFlow
from services.mqtt.errors import MQTTError, ProtocolError, QuotaExceeded, UnsupportedProtocolVersion
from services.mqtt.packets import (
    NO_PROPERTIES,
    PACKET_TYPES,
    Connack,
    ConnackCode311,
    Connect,
    Disconnect,
    Message,
    Packet,
    PacketType,
    Pingreq,
    Pingresp,
    Properties,
    ProtocolLevel,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Subscribe,
    Unsubscribe,
    Will,
)

__all__ = ["CONNECT_TIMER", "KEEPALIVE_TIMER", "TRANSITIONS", "Channel", "ChannelConfig", "State"]

RC = ReasonCode
T = PacketType
KEEPALIVE_TIMER = "keepalive"
CONNECT_TIMER = "connect"
KEEPALIVE_FACTOR = 1.5  # MQTT 3.1.2.10: one and a half times the keep alive


class Channel:
    """One connection's MQTT state machine; see the module docstring."""

    def __init__(
        self,
        config: ChannelConfig,
        node: str,
        *,
        new_client_id: Callable[[], str] | None = None,
        wall_ms: Callable[[], int] | None = None,
    ) -> None:
        self.config = config
        self.node = node
        self.state = State.AWAIT_CONNECT
        self.protocol_level = 0
        self.client_id: str | None = None
        self.will: Will | None = None
        self.session_expiry_s = 0
        self._new_client_id = new_client_id or random_client_id(config.assign_client_id_prefix)
        self._wall_ms = wall_ms or default_wall_ms
        self._neg: Negotiated | None = None
        self._last_rx = 0.0
        self._keepalive_armed = False
        self._held: list[tuple[Packet, float]] = []
        self._inbound = InboundFlow(config, False, "", self._wall_ms)
        self._out = OutboundStages()
        self._subscriptions = SubscribeFlow(config, False)
        self._shaper = OutboundShaper(False, 0, None)
        self.outbound_aliases = False  # PUBLISHes to this client may carry topic aliases
        self._refusal: int | None = None  # a reason code every CONNECT is refused with
        self._opening: OpenSession | None = None  # while the node authenticates

    # -- what the node reads ------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    @property
    def v5(self) -> bool:
        return self.protocol_level == ProtocolLevel.MQTT_5

    @property
    def keep_alive(self) -> int:
        """Effective keep alive in seconds (0: none)."""
        return self._neg.keep_alive if self._neg else 0

    @property
    def client_receive_maximum(self) -> int:
        """The outgoing inflight window: the 5.0 client's Receive Maximum."""
        return self._neg.client_receive_maximum if self._neg else 0

    @property
    def send_quota(self) -> int:
        """How many more QoS 1/2 PUBLISHes may go out before an ack."""
        return max(0, self.client_receive_maximum - self._out.in_flight)

    @property
    def inbound_inflight(self) -> int:
        """Incoming QoS 1/2 messages not yet completed (routing or awaiting PUBREL)."""
        return self._inbound.inflight

    # -- inputs -------------------------------------------------------------

    def opened(self) -> list[Action]:
        """The network connection is up: CONNECT must arrive within the connect timeout."""
        if self.state is not State.AWAIT_CONNECT or not self.config.connect_timeout_s:
            return []
        return [StartTimer(CONNECT_TIMER, self.config.connect_timeout_s)]

    def refuse_connect(self, reason_code: int) -> None:
        """The node cannot take this connection (a limit): its CONNECT is answered
        with `reason_code` (3.x: "server unavailable") and the connection closed."""
        self._refusal = reason_code

    def receive(self, packet: Packet, now: float) -> list[Action]:
        try:
            return self._receive(packet, now)
        except MQTTError as err:
            return self.protocol_error(err)

    def _receive(self, packet: Packet, now: float) -> list[Action]:
        if self.state is State.CLOSED:
            return []
        ptype = PACKET_TYPES[type(packet)]
        nxt = TRANSITIONS.get((self.state, ptype))
        if nxt is None:
            raise ProtocolError(f"{ptype.name} not allowed in state {self.state.name}")
        self._last_rx = max(self._last_rx, now)
        if self.state is State.CONNECTING:
            if len(self._held) >= self.config.max_packets_before_connack:
                raise QuotaExceeded(f"more than {len(self._held)} packets before CONNACK")
            self._held.append((packet, now))
            return []
        actions = self._dispatch(packet)
        if not self.closed:
            self.state = nxt
        return actions

    def _dispatch(self, packet: Packet) -> list[Action]:
        match packet:
            case Connect():
                return self._on_connect(packet)
            case Publish():
                return self._inbound.on_publish(packet)
            case Puback(packet_id=pid):
                return self._out.on_ack(pid, PUBACK_STAGE)
            case Pubrec():
                return self._out.on_pubrec(packet, self.v5)
            case Pubrel(packet_id=pid):
                return self._inbound.on_pubrel(pid)
            case Pubcomp(packet_id=pid):
                return self._out.on_ack(pid, PUBCOMP_STAGE)
            case Subscribe():
                return self._subscriptions.on_subscribe(packet)
            case Unsubscribe():
                return self._subscriptions.on_unsubscribe(packet)
            case Pingreq():
                return [Send(Pingresp())]
            case Disconnect():
                return self._on_disconnect(packet)
        raise ProtocolError(f"{type(packet).__name__} has no handler")  # pragma: no cover

    # -- CONNECT ------------------------------------------------------------

    def _on_connect(self, connect: Connect) -> list[Action]:
        level = connect.protocol_level
        self.protocol_level = level if level in tuple(ProtocolLevel) else ProtocolLevel.MQTT_3_1_1
        if self._refusal is not None:
            busy = ConnackCode311.SERVER_UNAVAILABLE
            return self._refuse(self._refusal, "connection limit reached", v3_default=busy)
        result = negotiate(self.config, connect, self._new_client_id)
        if isinstance(result, Refusal):
            return self._refuse(result.reason_code, result.detail)
        self._neg = result
        self.client_id = result.client_id
        self.will = connect.will
        self.session_expiry_s = result.session_expiry_s
        self._subscriptions = SubscribeFlow(self.config, self.v5)
        self._inbound = InboundFlow(self.config, self.v5, result.client_id, self._wall_ms)
        aliases = result.client_topic_alias_maximum if self.config.outbound_topic_aliases else 0
        self._shaper = OutboundShaper(self.v5, aliases, result.client_max_packet_size)
        self.outbound_aliases = self.v5 and aliases > 0
        opening = OpenSession(
            connect, result.client_id, connect.clean_start, result.session_expiry_s
        )
        if not self.config.authenticate:
            return [opening]
        self._opening = opening
        return [Authenticate(result.client_id, connect.username, connect.password)]

    def authenticated(self, ok: bool, reason_code: int = RC.NOT_AUTHORIZED) -> list[Action]:
        """The node's answer to Authenticate: open the session, or refuse the
        CONNECT with `reason_code` (3.x: its return code, else "not authorized")."""
        opening, self._opening = self._opening, None
        if self.state is not State.CONNECTING or opening is None:
            return []
        if ok:
            return [opening]
        v3 = ConnackCode311.NOT_AUTHORIZED
        return self._refuse(reason_code, f"not authenticated: 0x{reason_code:02X}", v3_default=v3)

    def session_opened(
        self,
        session_present: bool,
        incoming_qos2_ids: AbstractSet[int] = frozenset(),
        reason_code: int = 0,
    ) -> list[Action]:
        """The node's answer to OpenSession: CONNACK, then any pipelined packets.

        A non-zero `reason_code` (MQTT 5 code, or a 3.x return code 1-5)
        refuses the connection. `incoming_qos2_ids` are the resumed
        session's QoS 2 packet ids still awaiting PUBREL.
        """
        if self.state is not State.CONNECTING or self._neg is None:
            return []
        if reason_code:
            return self._refuse(
                reason_code,
                f"session refused with 0x{reason_code:02X}",
                v3_default=ConnackCode311.SERVER_UNAVAILABLE,
            )
        neg = self._neg
        self.state = State.CONNECTED
        if session_present:
            self._inbound.resume(incoming_qos2_ids)
        props = connack_properties(self.config, neg) if self.v5 else NO_PROPERTIES
        actions: list[Action] = [Send(Connack(session_present, 0, props))]
        if neg.keep_alive:
            self._keepalive_armed = True
            actions.append(StartTimer(KEEPALIVE_TIMER, neg.keep_alive * KEEPALIVE_FACTOR))
        held, self._held = self._held, []
        for packet, at in held:
            actions += self.receive(packet, at)
        return actions

    def _refuse(
        self, reason_code: int, detail: str, *, v3_default: int | None = None
    ) -> list[Action]:
        """Refuse before CONNACK: a CONNACK with the code (if the level has
        one, else `v3_default` if given), then Close without the will."""
        code = connack_code(reason_code, self.protocol_level)
        if code is None:
            code = v3_default
        actions: list[Action] = []
        if code is not None:
            actions.append(Send(Connack(False, code)))
        actions += self._close("error", detail, with_will=False)
        return actions

    # -- inbound PUBLISH ----------------------------------------------------

    def routed(
        self,
        token: int,
        ok: bool,
        no_subscribers: bool = False,
        reason_code: int | None = None,
    ) -> list[Action]:
        """The node routed (ok) or failed to route the message of `token`.

        ok: PUBACK / PUBREC, 5.0 reason 0x10 when `no_subscribers`. Failed:
        a 5.0 client gets `reason_code` (default 0x80) on its ack; a 3.x
        client is disconnected (it resends after reconnecting), except for
        0x87 (not authorized), which is acknowledged and dropped.
        """
        if self.state is not State.CONNECTED:
            return []
        actions = self._inbound.routed(token, ok, no_subscribers, reason_code)
        if actions is None:
            return self._close("error", f"routing failed with 0x{reason_code or 0x80:02X}")
        return actions

    # -- outbound PUBLISH ---------------------------------------------------

    def deliver(
        self, message: Message, packet_id: int | None, dup: bool, now_ms: int
    ) -> list[Action]:
        """PUBLISH `message` to this client (packet_id None for QoS 0).

        Dropped (expired before delivery started, or larger than the
        client's Maximum Packet Size): nothing is sent and, for QoS 1/2,
        `Acked(packet_id)` frees the node's inflight slot.
        """
        if self.state is not State.CONNECTED:
            return []
        if message.qos and packet_id is None:
            raise ValueError(f"QoS {message.qos} delivery needs a packet id")
        publish = self._shaper.shape(message, packet_id, dup, now_ms)
        if publish is None:
            return [] if packet_id is None else [Acked(packet_id)]
        if packet_id is not None and message.qos:
            self._out.sent(packet_id, message.qos)
        return [Send(publish)]

    def resend_pubrel(self, packet_id: int) -> list[Action]:
        """PUBREL for an outgoing QoS 2 message whose PUBREC the node has stored
        (after `Received`, or when a resumed session's message was released)."""
        if self.state is not State.CONNECTED:
            return []
        self._out.released(packet_id)
        return [Send(Pubrel(packet_id))]

    # -- SUBSCRIBE / UNSUBSCRIBE --------------------------------------------

    def subscribed(self, packet_id: int, reason_codes: Sequence[int]) -> list[Action]:
        """SUBACK: `reason_codes` answer the SubscribeRequest's subscriptions in order."""
        if self.state is not State.CONNECTED:
            return []
        return self._subscriptions.subscribed(packet_id, reason_codes)

    def unsubscribed(self, packet_id: int, reason_codes: Sequence[int]) -> list[Action]:
        """UNSUBACK: `reason_codes` answer the UnsubscribeRequest's filters in order."""
        if self.state is not State.CONNECTED:
            return []
        return self._subscriptions.unsubscribed(packet_id, reason_codes)

    # -- ends ---------------------------------------------------------------

    def _on_disconnect(self, d: Disconnect) -> list[Action]:
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
        if self.state is State.CONNECTING:
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
        actions.append(
            Close(reason, will, delay, detail=detail, session_expiry_s=session_expiry_s)
        )
        return actions
