"""The routing table: every subscription on this node's view, the local
sessions, and the routing plans cached per topic.

Theory of operation. One `TopicTrie` holds every subscription of the cluster
(key = client id, value = `SubOptions`); `sessions` holds the sessions this
node has (online here, or persistent and offline, so publishes reach their
durable queues). A topic's routing plan (one entry per local session, a
client's overlapping subscriptions folded; clients without a local session
apart; shared groups apart) is built on first use and cached until any
subscription or session changes (`invalidate_plans`). The log projection
(`logstate`) and the SUBSCRIBE path (`subscriptions`) are the writers.

It owns which connection and claim each local session is on and whether
deliveries may flow to it (`attach`, `renew`, `open_deliveries`, `detach`,
`take_over`), and what it routes for it (`subs`): the connection manager,
the log projection and the remote side ask it for those changes. A
connection whose session was taken over goes through `taken_over`.

The functions at the bottom give a message its delivered form for one
subscriber (QoS, retain flag, subscription identifiers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from services.broker.ports import NO_SUBS, ConnectionPort, Session, SubOptions
from services.mqtt import codec
from services.mqtt.packets import Message, PacketType
from services.mqtt.trie import TopicTrie

PLAN_CACHE_SIZE = 4096  # topics whose routing plan is kept; cleared whole when full

PlanEntry = tuple[Session, "SubOptions | list[SubOptions]"]
RemoteEntry = tuple[str, "SubOptions | list[SubOptions]"]  # a client with no local session
Plan = tuple[
    list[PlanEntry],
    list[tuple[tuple[str, str], list[tuple[str, SubOptions]]]],
    list[RemoteEntry],
]


class Routes:
    def __init__(self, *, node_id: str, mark_durable: Callable[[str], None]) -> None:
        self.node_id = node_id
        self.trie: TopicTrie[SubOptions] = TopicTrie()
        self.sessions: dict[str, Session] = {}
        self.plans: dict[str, Plan] = {}
        self._mark_durable = mark_durable

    def invalidate_plans(self) -> None:
        self.plans.clear()

    def mark_durable(self, client_id: str) -> None:
        self._mark_durable(client_id)

    # -- the session's connection ----------------------------------------------

    def renew(self, session: Session, epoch: int) -> None:
        """The session is on claim `epoch` now; deliveries wait for its CONNACK."""
        session.epoch = epoch
        session.ready = False

    def attach(self, session: Session, conn: ConnectionPort) -> None:
        session.conn = conn

    def open_deliveries(self, session: Session) -> None:
        """CONNACK sent and inflight resent: deliveries may flow."""
        session.ready = True

    def detach(self, session: Session) -> None:
        session.conn = None
        session.ready = False

    def take_over(self, session: Session) -> None:
        """A newer connection (here or elsewhere) has the session: ours goes.
        Its will waits for the session's expiry."""
        if session.conn is not None:
            taken_over(session.conn)

    def drop(self, session: Session) -> None:
        """The session ended here: out of the table, with its routes."""
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        self.drop_subscriptions(session)

    # -- the session's routes ------------------------------------------------------

    def restore(self, session: Session, subs: dict[str, SubOptions]) -> None:
        """A resumed session's subscriptions, as the log has them."""
        session.subs = subs

    @staticmethod
    def _own_subs(session: Session) -> dict[str, SubOptions]:
        """The session's subscriptions, to write: its own dict, never `NO_SUBS`."""
        if session.subs is NO_SUBS:
            session.subs = {}
        return session.subs

    def subs_added(self, session: Session, pairs: Iterable[tuple[str, SubOptions]]) -> None:
        self._own_subs(session).update(pairs)

    def sub_removed(self, session: Session, topic_filter: str) -> None:
        if session.subs is not NO_SUBS:
            session.subs.pop(topic_filter, None)

    def route(self, session: Session, topic_filter: str, options: SubOptions | None) -> (
        SubOptions | None
    ):
        """Route `topic_filter` for the session at once (None: stop routing it),
        before the log has the event [DESIGN 4]; returns what it routed before."""
        previous = session.subs.get(topic_filter)
        if options is None:
            self.trie.remove(topic_filter, session.client_id)
            if previous is not None:
                session.subs.pop(topic_filter, None)
        else:
            self.trie.add(topic_filter, session.client_id, options)
            self._own_subs(session)[topic_filter] = options
        self.plans.clear()
        return previous

    def undo(self, session: Session, undo: list[tuple[str, SubOptions | None]]) -> None:
        """The log refused the events: put back what was routed before, newest first."""
        if self.sessions.get(session.client_id) is not session:
            return  # the session ended meanwhile and took its routes with it
        for topic_filter, previous in reversed(undo):
            self.route(session, topic_filter, previous)

    def drop_subscriptions(self, session: Session) -> None:
        self.plans.clear()
        for topic_filter in session.subs:
            self.trie.remove(topic_filter, session.client_id)
        session.subs = NO_SUBS

    def plan(self, topic: str) -> Plan:
        """Who a topic reaches: one entry per local session, shared groups apart."""
        plan = self.plans.get(topic)
        if plan is not None:
            return plan
        per_client: dict[str, SubOptions | list[SubOptions]] = {}
        for client_id, options in self.trie.match(topic):
            prev = per_client.get(client_id)
            if prev is None:
                per_client[client_id] = options
            elif isinstance(prev, list):
                prev.append(options)
            else:
                per_client[client_id] = [prev, options]
        sessions = self.sessions
        plain: list[PlanEntry] = []
        remote: list[RemoteEntry] = []
        for client_id, opts in per_client.items():
            session = sessions.get(client_id)
            if session is not None:
                plain.append((session, opts))
            else:
                remote.append((client_id, opts))
        plan = (plain, list(self.trie.match_shared(topic).items()), remote)
        if len(self.plans) >= PLAN_CACHE_SIZE:
            self.plans.clear()
        self.plans[topic] = plan
        return plan


def adjusted(message: Message, qos: int, retain: bool, sub_ids: tuple[int, ...]) -> Message:
    """`message` with this QoS, retain flag and subscription identifiers."""
    properties = message.properties
    if sub_ids or properties.subscription_identifier:
        properties = dataclasses.replace(properties, subscription_identifier=sub_ids)
    if qos == message.qos and retain == message.retain and properties is message.properties:
        return message
    return dataclasses.replace(message, qos=qos, retain=retain, properties=properties)


def for_subscriber(message: Message, options: SubOptions, retained: bool) -> Message:
    """The form one subscription gets (`retained`: sent as a retained message)."""
    retain = True if retained else message.retain and options.retain_as_published
    return adjusted(message, min(message.qos, options.qos), retain, options.sub_ids)


def delivered_form(
    message: Message, client_id: str, opts: SubOptions | list[SubOptions]
) -> Message | None:
    """The form a client gets for all its matching subscriptions; None if none
    applies (no local)."""
    live = opts if isinstance(opts, list) else [opts]
    live = [o for o in live if not (o.no_local and client_id == message.sender)]
    if not live:
        return None
    qos = min(message.qos, max(o.qos for o in live))
    retain = message.retain and any(o.retain_as_published for o in live)
    sub_ids = tuple(o.subscription_id for o in live if o.subscription_id)
    return adjusted(message, qos, retain, sub_ids)


def taken_over(conn: ConnectionPort) -> None:
    """A newer connection has `conn`'s session: `conn` goes with DISCONNECT 0x8E
    (5.0), detached first, so its end is not its session's end. The kick of a
    takeover (`Routes.take_over`) ends here, and so does a store call of ours
    that met the new owner's epoch (`Fenced`) before that kick came over the
    cluster link: either way the session lives on with its new owner."""
    session = conn.session
    if session is not None and session.conn is conn:
        session.conn = None
        session.ready = False
    conn.carry_out(conn.channel.taken_over())
    conn.session = None


def encode_qos0(message: Message, retain: bool, v5: bool, sub_ids: tuple[int, ...]) -> bytes:
    """A QoS 0 copy of `message` on the wire, as one kind of subscriber gets it
    (5.0 or 3.x, retain flag, subscription identifiers): encoded once per kind."""
    props: bytes | None = None
    if v5:
        properties = message.properties
        if properties.subscription_identifier:  # the subscriber's ids replace any carried
            properties = dataclasses.replace(properties, subscription_identifier=())
        props = codec.add_subscription_identifiers(
            codec.encode_properties(properties, PacketType.PUBLISH), sub_ids
        )
    return codec.encode_publish(
        message.topic.encode(), message.payload, 0, retain, False, None, props
    )
