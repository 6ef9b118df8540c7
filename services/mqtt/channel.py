"""The MQTT channel: one connection's protocol state machine, with no I/O.

Theory of operation. A `Channel` takes decoded packets (`receive`), timer
firings (`timer`) and the results of work the node did for it
(`session_opened`, `routed`, `subscribed`, `unsubscribed`), and returns the
actions the node carries out in order (services/mqtt/actions.py). Which
packet may arrive in which state is one table, `TRANSITIONS`
(channel_states); a pair that is not in it is a ProtocolError naming both.

    AWAIT_CONNECT --CONNECT--> CONNECTING --session_opened(ok)--> CONNECTED
         |                          ^
         +--CONNECT with an Authentication Method--> AUTHENTICATING (AUTH ...)
         any close, refusal or error ------------------------------> CLOSED

Packets pipelined after CONNECT are held while CONNECTING and replayed
after the CONNACK (MQTT 5 3.1.4). An MQTTError while handling a packet
becomes "DISCONNECT with its reason code (5.0, where the spec allows it),
then Close with the will"; before the CONNACK, a refusing CONNACK.

The work per packet family lives beside this module: CONNECT negotiation
(channel_connect), enhanced authentication and re-authentication with
AUTH (channel_auth), inbound PUBLISH and the QoS 1/2 receiver flows
(channel_inbound), SUBSCRIBE / UNSUBSCRIBE (channel_subscribe), outgoing
PUBLISH shaping (channel_outbound), every way a connection ends and the
keep alive (channel_ends). Each is an object the channel holds and calls;
the ends share the connection's state with it through one `Link` record
(channel_states), which says who writes which field. This module owns the
state moves, the dispatch by the table and the answers the node feeds back.

Outbound QoS: the node owns the inflight window and calls `deliver`; packet
id stages are in `channel_outbound.OutboundStages`.
`client_receive_maximum` is the window the node must respect (3.x:
config.inflight_window_3x). With `config.authenticate`, a valid CONNECT
first asks the node to `Authenticate` (answer: `authenticated`), or, when it
names an Authentication Method, to take part in an `AuthExchange`.

Keep alive: one timer, "keepalive"; fired early relative to the last packet,
it restarts itself for the time left (the node arms it once per period).
`now` (receive, timer) is any seconds clock the node uses consistently (the
loop's monotonic time). Message expiry is stamped in wall-clock ms (the same
on every node) from the `wall_ms` clock, injected by tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet

from services.mqtt.actions import (
    Acked,
    Action,
    Authenticate,
    CancelTimer,
    Dropped,
    OpenSession,
    Send,
    StartTimer,
)
from services.mqtt.channel_auth import REAUTH_TIMER, EnhancedAuth
from services.mqtt.channel_config import ChannelConfig
from services.mqtt.channel_connect import (
    Refusal,
    connack_properties,
    negotiate,
    random_client_id,
)
from services.mqtt.channel_connect import (
    wall_ms as default_wall_ms,
)
from services.mqtt.channel_ends import (
    CONNECT_TIMER,
    KEEPALIVE_FACTOR,
    KEEPALIVE_TIMER,
    ChannelEnds,
)
from services.mqtt.channel_inbound import InboundFlow
from services.mqtt.channel_outbound import (
    PUBACK_STAGE,
    PUBCOMP_STAGE,
    OutboundShaper,
    OutboundStages,
)
from services.mqtt.channel_states import SERVER_DISCONNECT_CODES, TRANSITIONS, Link, State
from services.mqtt.channel_subscribe import SubscribeFlow
from services.mqtt.errors import MQTTError, ProtocolError, QuotaExceeded
from services.mqtt.packets import (
    NO_PROPERTIES,
    PACKET_TYPES,
    Auth,
    Connack,
    ConnackCode311,
    Connect,
    Disconnect,
    Message,
    Packet,
    PacketType,
    Pingreq,
    Pingresp,
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

__all__ = [
    "CONNECT_TIMER",
    "KEEPALIVE_FACTOR",
    "KEEPALIVE_TIMER",
    "TRANSITIONS",
    "Channel",
    "ChannelConfig",
    "State",
]

RC = ReasonCode
T = PacketType


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
        self.client_id: str | None = None
        # None: `random_client_id`'s, made when a CONNECT needs it (a closure kept per
        # channel was 200 bytes of every idle connection)
        self._new_client_id = new_client_id
        self._wall_ms = wall_ms or default_wall_ms
        self._link = Link()
        self._ends = ChannelEnds(self._link, config)
        self._inbound = InboundFlow(config, False, "", self._wall_ms)
        self._out = OutboundStages()
        self._subscriptions = SubscribeFlow(config, False)
        self._shaper = OutboundShaper(False, 0, None)
        self.outbound_aliases = False  # PUBLISHes to this client may carry topic aliases
        self._refusal: int | None = None  # a reason code every CONNECT is refused with
        self._opening: OpenSession | None = None  # while the node authenticates

    # -- what the node reads ------------------------------------------------

    @property
    def state(self) -> State:
        return self._link.state

    @property
    def protocol_level(self) -> int:
        return self._link.protocol_level

    @property
    def v5(self) -> bool:
        return self._link.v5

    @property
    def will(self) -> Will | None:
        return self._link.will

    @property
    def session_expiry_s(self) -> int:
        """The session expiry negotiated, or as the client's DISCONNECT changed it."""
        return self._link.session_expiry_s

    @property
    def keep_alive(self) -> int:
        """Effective keep alive in seconds (0: none)."""
        return self._link.keep_alive

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    @property
    def client_receive_maximum(self) -> int:
        """The outgoing inflight window: the 5.0 client's Receive Maximum."""
        neg = self._link.neg
        return neg.client_receive_maximum if neg else 0

    @property
    def send_quota(self) -> int:
        """How many more QoS 1/2 PUBLISHes may go out before an ack."""
        return max(0, self.client_receive_maximum - self._out.in_flight)

    def aliased_topic(self, inbound: bool, alias: int) -> str | None:
        """The topic a topic alias stands for, from the client (`inbound`) or to
        it; None if it was never set (a trace names an alias-only PUBLISH's topic)."""
        return (self._inbound if inbound else self._shaper).aliased(alias)

    @property
    def inbound_inflight(self) -> int:
        """Incoming QoS 1/2 messages not yet completed (routing or awaiting PUBREL)."""
        return self._inbound.inflight

    @property
    def inbound_full(self) -> bool:
        """The client has a Receive Maximum of QoS 1/2 PUBLISHes whose acks have
        not gone out: read nothing more from it until `routed` (flow control)."""
        return self._inbound.full and self._link.state is State.CONNECTED

    # -- inputs -------------------------------------------------------------

    def opened(self) -> list[Action]:
        """The network connection is up: CONNECT must arrive within the connect timeout."""
        if self.state is not State.AWAIT_CONNECT or not self.config.connect_timeout_s:
            return []
        return [StartTimer(CONNECT_TIMER, self.config.connect_timeout_s)]

    @property
    def refused_with(self) -> int | None:
        """The code of the CONNACK that refused this connection (3.x: its return
        code), None if none did (accepted, or closed without a CONNACK)."""
        return self._ends.refused_with

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
        link = self._link
        state = link.state
        link.last_rx = now  # the keep alive counts from the latest packet (a monotonic clock)
        if state is State.CONNECTED:  # the packets of every message: no table, no state change
            if type(packet) is Publish:
                return self._inbound.on_publish(packet)
            if type(packet) is Puback:
                return self._out.on_ack(packet.packet_id, PUBACK_STAGE)
        if state is State.CLOSED:
            return []
        ptype = PACKET_TYPES[type(packet)]
        nxt = TRANSITIONS.get((state, ptype))
        if nxt is None:
            raise ProtocolError(f"{ptype.name} not allowed in state {state.name}")
        if state is State.CONNECTING:
            if len(link.held) >= self.config.max_packets_before_connack:
                raise QuotaExceeded(f"more than {len(link.held)} packets before CONNACK")
            link.held.append((packet, now))
            return []
        actions = self._dispatch(packet)
        if link.state is state:
            link.state = nxt
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
                return self._ends.on_disconnect(packet)
            case Auth():
                return self._on_auth(packet)
        raise ProtocolError(f"{type(packet).__name__} has no handler")  # pragma: no cover

    # -- how it ends: the node's and the timers' inputs to channel_ends ------

    def timer(self, name: str, now: float) -> list[Action]:
        """A StartTimer the channel asked for has fired."""
        return self._ends.timer(name, now)

    def taken_over(self) -> list[Action]:
        """Another connection claimed this session: DISCONNECT 0x8E (5.0), Close."""
        return self._ends.taken_over()

    def server_disconnect(self, reason_code: int, reference: str | None = None) -> list[Action]:
        """The server ends it (shutdown 0x8B, kick 0x98, drain 0x9C + `reference`)."""
        return self._ends.server_disconnect(reason_code, reference)

    def connection_lost(self) -> list[Action]:
        """The socket closed without a DISCONNECT: the will goes out."""
        return self._ends.connection_lost()

    def protocol_error(self, err: MQTTError, connect_level: int | None = None) -> list[Action]:
        """What to do about an MQTTError (from the channel or the codec): see
        `ChannelEnds.protocol_error`."""
        return self._ends.protocol_error(err, connect_level)

    # -- CONNECT ------------------------------------------------------------

    def _on_connect(self, connect: Connect) -> list[Action]:
        level = connect.protocol_level
        link = self._link
        link.protocol_level = level if level in tuple(ProtocolLevel) else ProtocolLevel.MQTT_3_1_1
        if self._refusal is not None:
            busy = ConnackCode311.SERVER_UNAVAILABLE
            return self._ends.refuse(self._refusal, "connection limit reached", v3_default=busy)
        new_id = self._new_client_id or random_client_id(self.config.assign_client_id_prefix)
        result = negotiate(self.config, connect, new_id)
        if isinstance(result, Refusal):
            return self._ends.refuse(result.reason_code, result.detail)
        link.neg = result
        self.client_id = result.client_id
        link.will = connect.will
        link.session_expiry_s = result.session_expiry_s
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
        method = connect.properties.authentication_method
        if method is None:
            return [Authenticate(result.client_id, connect.username, connect.password)]
        link.auth = EnhancedAuth(method, result.client_id, connect.username)
        link.state = State.AUTHENTICATING
        return [link.auth.step(connect.properties.authentication_data)]

    def _on_auth(self, packet: Auth) -> list[Action]:
        auth = self._link.auth
        if auth is None:
            raise ProtocolError("AUTH on a connection whose CONNECT named no method")
        reauth = auth.reauth
        actions = auth.on_auth(packet, self.state is State.CONNECTED)
        if auth.reauth and not reauth and self.config.connect_timeout_s:
            actions.append(StartTimer(REAUTH_TIMER, self.config.connect_timeout_s))
        return actions

    def auth_continue(self, data: bytes | None, context: object) -> list[Action]:
        """The node's answer to AuthExchange when the method needs another round:
        AUTH 0x18 with `data`; the client's next data comes back with `context`."""
        auth = self._link.auth
        if auth is None or self.state not in (State.AUTHENTICATING, State.CONNECTED):
            return []
        return auth.challenge(data, context)

    def authenticated(
        self, ok: bool, reason_code: int = RC.NOT_AUTHORIZED, data: bytes | None = None
    ) -> list[Action]:
        """The node's answer to Authenticate, or the end of an AuthExchange
        (`data`: the server's last Authentication Data): open the session, or
        refuse the CONNECT with `reason_code` (3.x: its return code, else "not
        authorized"). Re-authentication: AUTH 0x00, or DISCONNECT (0x87 where
        DISCONNECT cannot carry `reason_code`) and the will."""
        auth = self._link.auth
        if auth is not None:
            reauth = auth.reauth
            if not auth.finish(data):
                return []
            if reauth and self.state is State.CONNECTED:
                return self._reauthenticated(ok, reason_code, data)
            if self.state is State.AUTHENTICATING:
                self._link.state = State.CONNECTING
        opening, self._opening = self._opening, None
        if self.state is not State.CONNECTING or opening is None:
            return []
        if ok:
            return [opening]
        detail = f"not authenticated: 0x{reason_code:02X}"
        return self._ends.refuse(reason_code, detail, v3_default=ConnackCode311.NOT_AUTHORIZED)

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
        if self.state is not State.CONNECTING or self._link.neg is None:
            return []
        if reason_code:
            return self._ends.refuse(
                reason_code,
                f"session refused with 0x{reason_code:02X}",
                v3_default=ConnackCode311.SERVER_UNAVAILABLE,
            )
        neg = self._link.neg
        self._link.state = State.CONNECTED
        if session_present:
            self._inbound.resume(incoming_qos2_ids)
        props = connack_properties(self.config, neg) if self.v5 else NO_PROPERTIES
        if self._link.auth is not None:
            props = self._link.auth.connack(props)
        actions: list[Action] = [Send(Connack(session_present, 0, props))]
        actions += self._ends.start_keepalive()
        held, self._link.held = self._link.held, []
        for packet, at in held:
            actions += self.receive(packet, at)
        return actions

    def _reauthenticated(self, ok: bool, reason_code: int, data: bytes | None) -> list[Action]:
        auth = self._link.auth
        assert auth is not None
        cancel: list[Action] = [CancelTimer(REAUTH_TIMER)] if self.config.connect_timeout_s else []
        if ok:
            return [*cancel, Send(Auth(RC.SUCCESS, auth.properties(data)))]
        code = reason_code if reason_code in SERVER_DISCONNECT_CODES else RC.NOT_AUTHORIZED
        detail = f"re-authentication refused: 0x{reason_code:02X}"
        return [*cancel, *self._ends.server_close(code, "error", detail)]

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
            return self._ends.close("error", f"routing failed with 0x{reason_code or 0x80:02X}")
        return actions

    # -- outbound PUBLISH ---------------------------------------------------

    def deliver(
        self, message: Message, packet_id: int | None, dup: bool, now_ms: int
    ) -> list[Action]:
        """PUBLISH `message` to this client (packet_id None for QoS 0).

        Dropped (expired before delivery started, or larger than the
        client's Maximum Packet Size): nothing is sent, `Dropped(reason)`
        says why and, for QoS 1/2, `Acked(packet_id)` frees the node's
        inflight slot.
        """
        if self.state is not State.CONNECTED:
            return []
        if message.qos and packet_id is None:
            raise ValueError(f"QoS {message.qos} delivery needs a packet id")
        publish = self._shaper.shape(message, packet_id, dup, now_ms)
        if isinstance(publish, Dropped):
            return [publish] if packet_id is None else [publish, Acked(packet_id)]
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
