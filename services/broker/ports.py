"""Where a connection and the broker's parts meet: the session they share and
the small Protocols each side offers the other.

Theory of operation. The broker is several parts (`routes`, `delivery`,
`remote`, `dispatch`, `subscriptions`, `cm`, composed by `broker.Broker`),
and a connection (`connection.Connection`) is an asyncio edge. Neither
imports the other: the parts see a connection only as a `ConnectionPort`
(what it offers them: its channel, deliveries, closing, flow control), and
a connection sees the broker only as a `BrokerPort` (what it may ask: open a
session, subscribe, route a PUBLISH, acknowledgements). The log projection
(`logstate.LogState`) writes through a `RoutingTable`. A `Session` is the
per-client state they all read; each part changes only the fields it owns
(documented on the class).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Protocol

from services.auth.api import ClientInfo
from services.auth.limits import Budget
from services.metrics.registry import Metrics
from services.metrics.trace import Tracer
from services.mqtt.actions import (
    Action,
    Authenticate,
    AuthExchange,
    OpenSession,
    Route,
    SubscribeRequest,
    UnsubscribeRequest,
)
from services.mqtt.channel import Channel
from services.mqtt.channel_config import ChannelConfig
from services.mqtt.packets import Will
from services.mqtt.trie import TopicTrie


def now_ms() -> int:
    """Wall-clock milliseconds: event timestamps and message expiry mean the
    same on every node."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class SubOptions:
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    subscription_id: int | None = None
    sub_ids: tuple[int, ...] = ()  # (subscription_id,) or (): ready for the PUBLISH

    @classmethod
    def of(
        cls, qos: int, no_local: bool, retain_as_published: bool, subscription_id: int | None
    ) -> SubOptions:
        ids = (subscription_id,) if subscription_id else ()
        return cls(qos, no_local, retain_as_published, subscription_id, ids)


NO_SUBS: Final[dict[str, SubOptions]] = {}
"""The subscriptions of every session that has none (an empty dict is 64 bytes of
each idle connection): shared, so never written. `Session.subs` is written only
by `routes.Routes` (tests/test_wiring.py), which gives a session its own dict
before the first write (`Routes._own_subs`)."""


class Session:
    """A client's session on this node; outlives connections when persistent.

    Each field is written by one part only, its owner (`OWNERS`: part module
    by field; the others read it and ask the owner for a change):

    - the routing table (`routes`): `conn` and `epoch` (which connection
      and which claim the session is on), `ready` (deliveries may flow) and
      `subs` (what it routes for it);
    - the connection manager (`cm`): `durable` and `expiry_s`;
    - the expiry timers (`ports.Expiries`): `expiry_handle`;
    - delivery (`delivery`): `pumping`, `dirty`, `acks`, `ops` and `backlog`.

    Whoever builds one gives it its first values."""

    OWNERS: ClassVar[dict[str, str]] = {
        "conn": "routes", "epoch": "routes", "ready": "routes", "subs": "routes",
        "durable": "cm", "expiry_s": "cm",
        "expiry_handle": "ports",
        "pumping": "delivery", "dirty": "delivery", "acks": "delivery", "ops": "delivery",
        "backlog": "delivery",
    }  # fmt: skip

    __slots__ = (
        "acks",
        "backlog",
        "client_id",
        "conn",
        "dirty",
        "durable",
        "epoch",
        "expiry_handle",
        "expiry_s",
        "ops",
        "pumping",
        "ready",
        "subs",
    )

    def __init__(
        self,
        client_id: str,
        *,
        expiry_s: int = 0,
        durable: bool = False,
        subs: dict[str, SubOptions] | None = None,
    ) -> None:
        self.client_id = client_id
        self.conn: ConnectionPort | None = None
        self.epoch = 0
        self.durable = durable  # claimed in the durable (Redis) tier
        self.expiry_s = expiry_s
        self.subs: dict[str, SubOptions] = subs if subs is not None else NO_SUBS
        self.expiry_handle: asyncio.TimerHandle | None = None
        self.ready = False  # CONNACK sent and inflight resent: deliveries may flow
        self.pumping = False
        self.dirty = False
        # PUBACKs and PUBREC / PUBREL ids for the pump, made with the first (two empty
        # lists on every session were 112 bytes of an idle connection)
        self.acks: list[int] | None = None
        self.backlog = 0  # queued for this online session, not yet taken (approximate)
        self.ops: list[tuple[str, int]] | None = None  # ("received" | "released", packet id)


class Expiries:
    """Offline sessions' end timers (`Session.expiry_handle`): a port between
    the parts that say when a session ends (the log projection, for sessions
    it recovers; the connection manager, for those that go offline here) and
    the part that ends them (`expiry.Expiry`). That part logs the end through
    the log projection, which is built first and sets timers here: a true
    two-way call. So both get this port when they are built, and the ender,
    built last, names itself here once, from its constructor (`serve`)."""

    __slots__ = ("_end", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._end: Callable[[Session, int], None] | None = None

    def serve(self, end: Callable[[Session, int], None]) -> None:
        """`end(session, epoch)` is called when a timer fires (once per port)."""
        if self._end is not None:
            raise RuntimeError("session expiry has its ender already")
        self._end = end

    def later(self, session: Session, delay_s: float, epoch: int) -> None:
        """End `session` (if still at `epoch`) after `delay_s` unless cancelled."""
        if session.expiry_handle is not None:
            session.expiry_handle.cancel()
        session.expiry_handle = self._loop.call_later(delay_s, self._fire, session, epoch)

    def cancel(self, session: Session) -> None:
        if session.expiry_handle is not None:
            session.expiry_handle.cancel()
            session.expiry_handle = None

    def stop(self, sessions: Iterable[Session]) -> None:
        """The node stops: no timer of these sessions fires any more."""
        for session in sessions:
            if session.expiry_handle is not None:
                session.expiry_handle.cancel()

    def _fire(self, session: Session, epoch: int) -> None:
        session.expiry_handle = None
        if self._end is None:
            raise RuntimeError("a session's expiry fired before its ender was built")
        self._end(session, epoch)


class Turn:
    """What one loop turn's processing shares: the deliveries made so far (a
    connection budgets its processing per turn by it) and whose packets or
    frames are being handled (`publisher`: a subscriber that cannot keep up
    holds it back), set for a stretch of handling by `handling` and put back
    by `handled`."""

    __slots__ = ("publisher", "work")

    def __init__(self) -> None:
        self.work = 0
        self.publisher: Publisher | None = None

    def handling(self, publisher: Publisher | None) -> Publisher | None:
        """`publisher`'s messages are routed from now; returns the one before."""
        outer, self.publisher = self.publisher, publisher
        return outer

    def handled(self, outer: Publisher | None) -> None:
        """The stretch `handling` began is over: `outer` is back."""
        self.publisher = outer


class Publisher(Protocol):
    """Whose messages are being routed: a client's connection, or the cluster
    link a peer's forwarded messages come in on. A subscriber that cannot keep
    up holds it back (`block_on`) and lets it go (`unblock`)."""

    def block_on(self, subscriber: ConnectionPort | PeerGate) -> None: ...

    def unblock(self, subscriber: ConnectionPort | PeerGate) -> None: ...


PUBLISHER_STALL_S = 0.5  # seconds a publisher waits for one slow subscriber to drain


class PeerGate:
    """What publishers of QoS 1/2 messages wait on while the cluster link to
    `node` is backed up (`services.broker.remote`): each hold ends when the link
    drains or after PUBLISHER_STALL_S, and the next QoS 1/2 message for a link
    still backed up holds its publisher again, so what waits in the link's
    buffer grows by at most a turn's reading per publisher per stall."""

    __slots__ = ("holds", "node", "waiters")

    def __init__(self, node: str) -> None:
        self.node = node
        self.waiters: list[Publisher] = []
        self.holds = 0  # publishers held for it so far (a figure for tests and metrics)

    def add_waiter(self, publisher: Publisher) -> None:
        self.waiters.append(publisher)

    def wake_waiters(self) -> None:
        waiters, self.waiters = self.waiters, []
        for publisher in waiters:
            publisher.unblock(self)


class Answered(Protocol):
    """Who hears whether a PUBLISH was routed (`delivery.Delivery.token`): a
    client's connection (its PUBACK / PUBREC), or a publisher inside the node
    (`dispatch.Inside`: a future)."""

    def routed(
        self, token: int, ok: bool, no_subscribers: bool, reason_code: int | None = None
    ) -> None: ...

    def close(self) -> None: ...


class ConnectionPort(Protocol):
    """What a connection offers the broker's parts."""

    channel: Channel
    session: Session | None
    client: ClientInfo | None  # who it is, once its CONNECT was read
    closed: bool
    max_outgoing_packet: int | None  # the client's Maximum Packet Size
    will_token: str | None  # its will's token in the will store, once its session opened
    budget: Budget | None  # what it may still read (per-client rates), once admitted

    @property
    def peer(self) -> str: ...

    @property
    def transport(self) -> asyncio.BaseTransport | None: ...

    def carry_out(self, actions: Sequence[Action]) -> None:
        """Carry out the channel's actions (send, close, timers...), in order."""
        ...

    def client_info(self, client_id: str, username: str | None) -> ClientInfo:
        """Who the client is: its listener, its certificate (which may name the user)."""
        ...

    def write_qos0(self, data: bytes) -> bool:
        """An encoded QoS 0 PUBLISH; False if dropped (a subscriber too far behind)."""
        ...

    def routed(
        self, token: int, ok: bool, no_subscribers: bool, reason_code: int | None = None
    ) -> None:
        """The PUBLISH of `token` was routed (ok) or failed: its PUBACK / PUBREC."""
        ...

    def resume_processing(self) -> None:
        """The answer to a busy action is out: handle the packets held meanwhile."""
        ...

    def block_on(self, subscriber: ConnectionPort | PeerGate) -> None:
        """Back-pressure: stop reading this publisher until `subscriber` (a local
        subscriber's connection, or a peer's backed-up link) drains."""
        ...

    def unblock(self, subscriber: ConnectionPort | PeerGate) -> None:
        """What this publisher waited for drained: read on."""
        ...

    def add_waiter(self, publisher: Publisher) -> None:
        """`publisher` waits for this subscriber to drain (`wake_waiters` lets it go)."""
        ...

    def wake_waiters(self) -> None:
        """Publishers held back for this subscriber may go on."""
        ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Flow:
    """The limits a connection applies itself (`services.config.Limits`)."""

    max_packet_size: int  # bytes: a larger incoming packet is a protocol error
    outbound_high_water: int  # bytes buffered for the socket: above, the transport pauses
    outbound_low_water: int  # ... and below this it resumes
    subscriber_queue_bytes: int  # bytes a subscriber may have pending before it counts as slow


class BrokerPort(Protocol):
    """What the broker offers a connection."""

    node_id: str
    channel_config: ChannelConfig
    flow: Flow
    loop: asyncio.AbstractEventLoop
    metrics: Metrics  # the node's figures (services.metrics.registry)
    tracer: Tracer  # the node's packet traces (services.metrics.trace): `on` per packet
    turn: Turn

    @property
    def wheel(self) -> Any: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...

    def mark_dirty(self, conn: ConnectionPort) -> None:
        """`conn` has output: flush it once this loop turn ends."""
        ...

    def connection_made(self, conn: ConnectionPort) -> bool:
        """False: over the connection limit (refuse its CONNECT)."""
        ...

    def connection_lost(self, conn: ConnectionPort) -> None: ...

    def connection_ended(
        self,
        conn: ConnectionPort,
        will: Will | None,
        will_delay_s: int,
        session_expiry_s: int | None = None,
    ) -> None: ...

    async def authenticate(self, conn: ConnectionPort, action: Authenticate) -> None: ...

    async def auth_exchange(self, conn: ConnectionPort, action: AuthExchange) -> None: ...

    async def open_session(self, conn: ConnectionPort, action: OpenSession) -> None: ...

    def subscribe(self, conn: ConnectionPort, request: SubscribeRequest) -> None: ...

    def unsubscribe(self, conn: ConnectionPort, request: UnsubscribeRequest) -> None: ...

    def publish(self, conn: ConnectionPort, route: Route) -> None: ...

    def acked(self, conn: ConnectionPort, packet_id: int) -> None: ...

    def received(self, conn: ConnectionPort, packet_id: int) -> None: ...

    def released(self, conn: ConnectionPort, packet_id: int) -> None: ...


class RoutingTable(Protocol):
    """What the log projection (`logstate`) writes: routes and offline sessions."""

    node_id: str
    trie: TopicTrie[SubOptions]
    sessions: dict[str, Session]

    def invalidate_plans(self) -> None: ...

    def mark_durable(self, client_id: str) -> None:
        """A persistent session found in the log: its state is in the durable tier."""
        ...

    def subs_added(self, session: Session, pairs: Iterable[tuple[str, SubOptions]]) -> None:
        """The log routes these filters for the session too."""
        ...

    def sub_removed(self, session: Session, topic_filter: str) -> None: ...

    def renew(self, session: Session, epoch: int) -> None:
        """The session is on claim `epoch` now; deliveries wait for its CONNACK."""
        ...

    def take_over(self, session: Session) -> None:
        """A newer connection elsewhere: the session's connection here goes."""
        ...
