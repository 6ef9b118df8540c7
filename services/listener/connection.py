"""One MQTT connection: bytes in, channel actions carried out, bytes out.

Theory of operation: `Connection` is an `asyncio.Protocol` (no task, no stream
objects) so an idle connection costs a few small objects. Incoming bytes go
through an incremental decode loop (the codec enforces the maximum packet size
from the fixed header, before the body is buffered); each packet goes to the
channel, and the returned actions are carried out in order. Actions that need
the broker to wait (open a session, subscribe, unsubscribe) mark the connection
busy: later packets stay in the buffer until the answer is back, so a client's
packets keep their order; past HELD_INPUT_BYTES of them we stop reading until
then. A client with a read budget (per-client message / byte rates,
`services.auth.limits`) takes packets while its budget lasts; past it the next
packet stays in the buffer and reading stops until the window refills, the same
pause as above.

Writes are batched: `write` appends to a list and registers the connection with
the broker, which flushes every dirty connection once per loop turn. When the
transport's buffer passes its high-water mark (`pause_writing`) we stop reading
from this client and hold further output; QoS 0 messages to it are dropped and
counted once the held output passes its bound. A publisher writing to such a
subscriber is held until it drains, bounded (`services.listener.holds`, the
back-pressure part of a connection).

While a trace runs (`services.metrics.trace`, `tracer.on`) every packet read
and every packet written is handed to the tracer; otherwise that is one
attribute check each way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from services.auth.api import ClientInfo
from services.auth.limits import Budget
from services.broker.ports import BrokerPort, ConnectionPort, PeerGate, Publisher, Session
from services.listener.holds import Hold
from services.mqtt import codec
from services.mqtt.actions import (
    Acked,
    Action,
    Authenticate,
    AuthExchange,
    CancelTimer,
    Close,
    Dropped,
    OpenSession,
    Received,
    Released,
    Route,
    Send,
    StartTimer,
    SubscribeRequest,
    UnsubscribeRequest,
)
from services.mqtt.channel import KEEPALIVE_FACTOR, KEEPALIVE_TIMER, Channel
from services.mqtt.channel_auth import REAUTH_TIMER
from services.mqtt.channel_ends import CONNECT_TIMER
from services.mqtt.errors import MQTTError
from services.mqtt.packets import Publish, ReasonCode

if TYPE_CHECKING:
    from services.listener.listeners import Listener

EARLY_FLUSH_BYTES = 64 * 1024  # bytes: hand output to the transport within the turn, so
#   its high-water mark (and pause_writing) reacts before a turn's output piles up
WORK_BUDGET = 4096  # packets + deliveries one connection may cause per loop turn: about
#   a millisecond of work, so a publisher with a full buffer cannot stall everyone else
HELD_INPUT_BYTES = 64 * 1024  # bytes a connection reads while the broker works for it
#   (CONNECT, SUBSCRIBE) before it stops reading: its packets wait in the buffer, so
#   without a bound a client pipelining behind its CONNECT filled the node's memory


# Every timer a channel asks for, by name -> the connection's slot that holds its deadline.
_TIMER_SLOTS: Final = {
    KEEPALIVE_TIMER: "_keepalive_at", CONNECT_TIMER: "_connect_at", REAUTH_TIMER: "_reauth_at",
}  # fmt: skip


class Connection(asyncio.Protocol):
    __slots__ = (
        "_buf",
        "_busy",
        "_connect_at",
        "_deferred",
        "_keepalive_at",
        "_out",
        "_out_bytes",
        "_read_paused",
        "_reauth_at",
        "_wake",
        "_write_paused",
        "broker",
        "budget",
        "cert_subject",
        "cert_user",
        "channel",
        "client",
        "closed",
        "dirty",
        "dropped",
        "ended",
        "hold",
        "listener",
        "max_outgoing_packet",
        "metrics",
        "session",
        "tally",
        "tracer",
        "transport",
        "will_token",
    )

    def __init__(self, broker: BrokerPort, listener: Listener | None = None) -> None:
        self.broker = broker
        self.metrics = broker.metrics  # counted on the hot path: attribute increments only
        self.tally = broker.metrics.tally  # the per-message counts (registry.SENT...)
        self.tracer = broker.tracer  # its `on` is checked per packet, in and out
        self.listener = listener  # None: a connection made by a test, on no listener
        self.cert_subject: str | None = None  # the client certificate's DN (TLS listeners)
        self.cert_user: str | None = None  # the user name the certificate gives, if it names it
        self.transport: asyncio.BaseTransport | None = None
        self.channel = Channel(broker.channel_config, broker.node_id)
        self.session: Session | None = None
        self.client: ClientInfo | None = None
        self.budget: Budget | None = None  # per-client read rates (services.auth.limits)
        self._buf: bytes | bytearray | None = None  # what is read and not yet handled
        self._out: list[bytes] | None = None
        self._out_bytes = 0
        self._busy = False
        self._deferred = False
        cls = type(self)
        self.hold = Hold(self, broker.loop, cls._pause_reading, cls._continue)  # back-pressure
        self._read_paused = False
        self._write_paused = False
        # The channel's timers (`_TIMER_SLOTS`): deadlines on the loop's clock, None when
        # not running (a dict of one was 184 bytes of every idle connection)
        self._keepalive_at: float | None = None
        self._connect_at: float | None = None
        self._reauth_at: float | None = None
        self._wake: int | None = None
        self.closed = False  # we asked the transport to close, or it is gone
        self.ended = False  # the broker was told the connection ended
        self.dirty = False
        self.dropped = 0
        self.max_outgoing_packet: int | None = None  # the client's Maximum Packet Size
        self.will_token: str | None = None  # its will in the will store (services.broker.wills)

    # -- asyncio.Protocol ---------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        admitted = self.broker.connection_made(self)
        listener = self.listener
        if listener is not None:
            admitted = listener.opened() and admitted
            if listener.ssl is not None:
                self.cert_subject, self.cert_user = listener.identity(transport)
        if not admitted:
            # Over the connection limit: its CONNECT gets "quota exceeded" (3.x:
            # "server unavailable") and the close, not a reset [MQTT-3.2.2-6].
            self.channel.refuse_connect(ReasonCode.QUOTA_EXCEEDED)
        flow = self.broker.flow
        transport.set_write_buffer_limits(  # type: ignore[attr-defined]
            flow.outbound_high_water, flow.outbound_low_water
        )
        self._carry_out(self.channel.opened())

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.metrics.bytes_received += len(data)
        buf = self._buf
        if not buf:
            buf = data if type(data) is bytes else bytes(data)  # kept as read: decoded fastest
        elif type(buf) is bytes and len(buf) < HELD_INPUT_BYTES:
            buf = buf + data  # a packet cut at the end of the last read
        else:  # a large packet arriving read by read: appended, not copied each time
            buf = buf if type(buf) is bytearray else bytearray(buf)
            buf += data
        self._buf = buf
        if not self._busy and not self._deferred and self.hold.blocked_on is None:
            self._process()
        elif self._busy and len(buf) > HELD_INPUT_BYTES:
            self._pause_reading()  # resume_processing reads again

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._buf = None
        self._out = None
        self._stop_timers()
        self.broker.wheel.cancel(self)
        if not self.ended:
            actions = self.channel.connection_lost()
            self._carry_out(actions)
            if not self.ended:
                self.ended = True
                self.broker.connection_ended(self, None, 0)
        self.broker.connection_lost(self)
        if self.listener is not None:
            self.listener.closed()

    def pause_writing(self) -> None:
        self._write_paused = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self.hold.slow = False
        self.flush()
        if not self._write_paused:
            self._resume_reading()
        self.wake_waiters()

    def add_waiter(self, publisher: Publisher) -> None:
        self.hold.add_waiter(publisher)

    def wake_waiters(self) -> None:
        self.hold.wake_waiters(self)

    def block_on(self, subscriber: ConnectionPort | PeerGate) -> None:
        if not self.closed:
            self.hold.block_on(subscriber)

    def unblock(self, subscriber: ConnectionPort | PeerGate) -> None:
        self.hold.unblock(subscriber)

    # -- incoming -----------------------------------------------------------

    def _process(self) -> None:
        buf = self._buf
        if not buf:
            return
        used = 0
        broker = self.broker
        max_size = broker.flow.max_packet_size
        channel = self.channel
        tracer, hold = self.tracer, self.hold
        turn = broker.turn
        budget = turn.work + WORK_BUDGET
        rate, over = self.budget, False
        if rate is not None:
            rate.refresh()
        outer = turn.handling(self)
        now, proto = broker.loop.time(), channel.protocol_level  # per batch; proto: 0 until CONNECT
        try:
            while not self._busy and not self.closed and hold.blocked_on is None:
                if turn.work > budget:
                    self._defer()
                    break
                result = codec.decode(buf, proto, max_size, used)
                if result is None:
                    break
                packet, size = result
                if rate is not None and not rate.take(packet, size):
                    over = True  # past its message or byte rate: the packet waits
                    break
                used += size
                turn.work += 1
                if tracer.on:
                    tracer.received(channel.client_id, self.peer, packet, channel.aliased_topic)
                self._carry_out(channel.receive(packet, now))
                proto = proto or channel.protocol_level
                if channel.inbound_full:  # past the Receive Maximum: on hold until `routed`
                    self.block_on(self)  # frees a place (re-checked each PUBLISHER_STALL_S)
        except MQTTError as err:
            # A CONNECT the codec refused: its level byte says whether a CONNACK can tell why.
            level = None if channel.protocol_level else codec.peek_connect_level(buf[used:])
            turn.handled(outer)
            self._buf = None
            self._carry_out(channel.protocol_error(err, level))
            if not self.closed:
                self.close()
            return
        turn.handled(outer)
        if self._buf is not None:
            if used == len(buf):
                self._buf = None
            elif used:  # the rest waits: a cut packet, or packets held while busy
                self._buf = buf[used:]
        if rate is not None:
            wait_s = rate.settle(over)
            if over:
                self._wait_for_rate(wait_s)

    def _defer(self) -> None:
        """This turn's work budget is spent: stop reading, go on next turn (after
        the flush), so one busy publisher cannot stall the loop."""
        self._deferred = True
        self._pause_reading()
        self.broker.loop.call_soon(self._continue)

    def _wait_for_rate(self, wait_s: float) -> None:
        """Over its message or byte rate: stop reading until its window refills,
        then go on; its packets wait in the buffer (nothing is dropped)."""
        self._deferred = True
        self._pause_reading()
        self.broker.loop.call_later(wait_s, self._continue)

    def _continue(self) -> None:
        self._deferred = False
        if self.closed:
            return
        if not self._busy and self.hold.blocked_on is None:
            self._process()
        if not self._deferred and not self._write_paused and self.hold.blocked_on is None:
            self._resume_reading()

    def resume_processing(self) -> None:
        """The broker answered a busy action: handle the packets held meanwhile."""
        self._busy = False
        if not self.closed and self._buf and not self._deferred and self.hold.blocked_on is None:
            self._process()
        held = self._busy or self._deferred or self._write_paused
        if not held and self.hold.blocked_on is None:
            self._resume_reading()

    def _carry_out(self, actions: Sequence[Action]) -> None:
        broker = self.broker
        for action in actions:
            match action:
                case Route():
                    broker.publish(self, action)
                case Send():
                    packet = action.packet
                    if type(packet) is Publish:
                        tally = self.tally
                        tally[packet.qos] += 1  # registry.SENT + qos
                        tally[3 + packet.qos] += len(packet.payload)  # SENT_BYTES + qos
                    self.write(codec.encode(packet, self.channel.protocol_level))
                case Acked():  # the three of every QoS 1 message first
                    broker.acked(self, action.packet_id)
                case StartTimer():
                    self.start_timer(action.name, action.delay_s)
                case CancelTimer():
                    setattr(self, _TIMER_SLOTS[action.name], None)
                case Received():
                    broker.received(self, action.packet_id)
                case Released():
                    broker.released(self, action.packet_id)
                case Authenticate():
                    self._busy = True
                    broker.spawn(broker.authenticate(self, action))
                case AuthExchange():
                    self._busy = self._busy or not action.reauth  # re-auth: reading goes on
                    broker.spawn(broker.auth_exchange(self, action))
                case OpenSession():
                    self._busy = True
                    if self.client is None:  # no authenticator asked who it is
                        self.client = self.client_info(action.client_id, action.connect.username)
                    broker.spawn(broker.open_session(self, action))
                case SubscribeRequest():
                    self._busy = True
                    broker.subscribe(self, action)
                case UnsubscribeRequest():
                    self._busy = True
                    broker.unsubscribe(self, action)
                case Close():
                    self._close_action(action)
                case Dropped():
                    self.metrics.messages_dropped[action.reason] += 1

    carry_out = _carry_out

    def _close_action(self, action: Close) -> None:
        self.close()
        if not self.ended:
            self.ended = True
            self.broker.connection_ended(
                self, action.will, action.will_delay_s, action.session_expiry_s
            )

    # -- timers -------------------------------------------------------------

    def start_timer(self, name: str, delay_s: float) -> None:
        if self.closed:
            return
        deadline = self.broker.loop.time() + delay_s
        setattr(self, _TIMER_SLOTS[name], deadline)
        self.broker.wheel.schedule(self, deadline)

    def _stop_timers(self) -> None:
        self._keepalive_at = self._connect_at = self._reauth_at = None

    def fire_timers(self, now: float) -> float | None:
        if self.closed:
            return None
        for name, slot in _TIMER_SLOTS.items():
            at = getattr(self, slot)
            if at is None or at > now:
                continue
            setattr(self, slot, None)
            if name == KEEPALIVE_TIMER and self.budget is not None and self.budget.waiting:
                # Its packets wait unread for its rate: it is not idle, we are not reading.
                self.start_timer(name, self.channel.keep_alive * KEEPALIVE_FACTOR)
                continue
            self._carry_out(self.channel.timer(name, now))
            if self.closed:
                return None
        left = [at for at in (self._keepalive_at, self._connect_at, self._reauth_at)
                if at is not None]  # fmt: skip
        return min(left) if left else None

    # -- outgoing -----------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        if self.tracer.on:
            channel = self.channel
            self.tracer.sent(channel.client_id, self.peer, data, channel.protocol_level,
                             channel.aliased_topic)  # fmt: skip
        if self._out is None:
            self._out = [data]
        else:
            self._out.append(data)
        self._out_bytes += len(data)
        if not self.dirty:
            self.dirty = True
            self.broker.mark_dirty(self)

    def write_qos0(self, data: bytes) -> bool:
        """A QoS 0 PUBLISH for this subscriber. While its transport is over the
        high-water mark the publishing connection waits (bounded); a subscriber
        that stays behind gets its QoS 0 messages dropped and counted."""
        if self._write_paused:
            broker = self.broker
            if self.hold.slow or self._out_bytes >= broker.flow.subscriber_queue_bytes:
                self.dropped += 1
                self.metrics.messages_dropped["qos0_slow_subscriber"] += 1
                return False
            publisher = broker.turn.publisher
            if publisher is not None and publisher is not self:
                publisher.block_on(self)
        self.write(data)
        if self._out_bytes >= EARLY_FLUSH_BYTES:
            self.flush()
        return True

    def flush(self) -> None:
        self.dirty = False
        out = self._out
        if not out or self._write_paused or self.transport is None:
            return
        self._out = None
        sent, self._out_bytes = self._out_bytes, 0
        self.metrics.bytes_sent += sent
        transport: asyncio.WriteTransport = self.transport  # type: ignore[assignment]
        transport.write(out[0] if len(out) == 1 else b"".join(out))

    def close(self) -> None:
        """Write what is queued, then close the transport."""
        if self.closed:
            return
        self._write_paused = False
        self.flush()
        self.closed = True
        self._stop_timers()
        if self.transport is not None:
            self.transport.close()

    def routed(
        self, token: int, ok: bool, no_subscribers: bool, reason_code: int | None = None
    ) -> None:
        if not self.closed:
            self._carry_out(self.channel.routed(token, ok, no_subscribers, reason_code))
            if self.hold.blocked_on is self and not self.channel.inbound_full:
                self.unblock(self)

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def _pause_reading(self) -> None:
        if not self._read_paused and self.transport is not None and not self.closed:
            self._read_paused = True
            self.transport.pause_reading()  # type: ignore[attr-defined]

    def _resume_reading(self) -> None:
        if self._read_paused and self.transport is not None and not self.closed:
            self._read_paused = False
            self.transport.resume_reading()  # type: ignore[attr-defined]

    def client_info(self, client_id: str, username: str | None) -> ClientInfo:
        level, peer = self.channel.protocol_level, self.peer
        if self.listener is None:  # a test's connection: no listener, no certificate
            return ClientInfo(client_id, username, peer, level, "", None, False)
        cert = (self.cert_subject, self.cert_user)
        return self.listener.client_info(cert, client_id, username, peer, level)

    @property
    def peer(self) -> str:
        if self.transport is None:
            return "?"
        peer = self.transport.get_extra_info("peername")
        return f"{peer[0]}:{peer[1]}" if peer else "?"
