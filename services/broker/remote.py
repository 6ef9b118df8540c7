"""The remote side: this node's part in the cluster (services.cluster.router).

Theory of operation. A publish whose subscribers are online on other nodes
(`deliver`): clean ones get the message forwarded as published (their node
applies their options); persistent ones get it in their Redis queue through
this node's delivery batch, and once that batch is stored their node is told
to take it (`Notices`, which delivery tells of every stored batch). A
shared group's member elsewhere gets its copy through the same two paths,
one client at a time (`forward_to`, `enqueue`; `services.broker.shared`
picks it). A takeover by another node (`kicked`) closes
our connection if it is older; until the log says the client moved, what we
queue for it is announced to its new node (`moved`). When this node claims a
session another node held, that node is told to close its connection
(`kick_previous`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from services.broker.delivery import Delivery
from services.broker.ports import (
    PUBLISHER_STALL_S,
    ConnectionPort,
    PeerGate,
    Publisher,
    Session,
    Turn,
)
from services.broker.routes import RemoteEntry, Routes, delivered_form
from services.cluster.api import InboundLink
from services.hooks.api import Hooks
from services.metrics.registry import Metrics
from services.mqtt.packets import Message
from services.state.entries import SessionEntry
from services.state.view import ClusterView

if TYPE_CHECKING:
    from services.cluster.router import ClusterRouter


class LinkHold:
    """The publisher of a peer's forwarded messages, as a local subscriber sees
    it: one that cannot keep up stops the link they come in on (at most
    PUBLISHER_STALL_S, as for a local publisher). The peer's buffer for us then
    grows past its limit and the peer holds its own publishers (`Remote._hold_for`
    there): back-pressure from a slow subscriber to a publisher on another node."""

    def __init__(self, link: InboundLink) -> None:
        self.link = link
        self.blocked_on: ConnectionPort | PeerGate | None = None
        self.holds = 0  # times it stopped the link (a figure for tests)
        self._stall: asyncio.TimerHandle | None = None  # this hold's bound

    def block_on(self, subscriber: ConnectionPort | PeerGate) -> None:
        if self.blocked_on is not None:
            return
        self.blocked_on = subscriber
        self.holds += 1
        subscriber.add_waiter(self)
        self.link.pause()
        loop = asyncio.get_running_loop()
        self._stall = loop.call_later(PUBLISHER_STALL_S, self.unblock, subscriber)

    def unblock(self, subscriber: ConnectionPort | PeerGate) -> None:
        """The hold ends: the subscriber drained, or its bound passed. Its
        timer goes with it, so it cannot cut a later hold short."""
        if self.blocked_on is subscriber:
            self.blocked_on = None
            if self._stall is not None:
                self._stall.cancel()
                self._stall = None
            self.link.resume()


class Notices:
    """What the owners of remote persistent sessions are told once a delivery
    batch holding their messages is stored (delivery calls `stored` per batch;
    the remote side records who waits, `pending` and `moved`)."""

    def __init__(self, cluster: ClusterRouter | None) -> None:
        self.cluster = cluster
        self.pending: dict[str, tuple[str, int]] = {}  # client -> (node, batches)
        self.moved: dict[str, str] = {}  # client -> the node that took it over from us

    def stored(self, items: Sequence[tuple[str, Message]]) -> None:
        """A batch is stored: tell the owners of the remote persistent sessions in it."""
        pending, moved = self.pending, self.moved
        if not (pending or moved) or self.cluster is None:
            return
        for client_id in {c for c, _ in items if c in pending or c in moved}:
            if client_id in moved:  # queued through our stale session: its new node takes
                self.cluster.notify(moved[client_id], client_id)
            if client_id not in pending:
                continue
            node, batches = pending[client_id]
            self.cluster.notify(node, client_id)
            if batches <= 1:
                del pending[client_id]
            else:
                pending[client_id] = (node, batches - 1)


class Remote:
    def __init__(
        self,
        *,
        node_id: str,
        cluster: ClusterRouter | None,
        routes: Routes,
        delivery: Delivery,
        notices: Notices,
        view: ClusterView,
        turn: Turn,
        mark_durable: Callable[[str], None],
        metrics: Metrics,
        hooks: Hooks,
    ) -> None:
        self.node_id = node_id
        self.metrics = metrics  # copies a backed-up link dropped (messages_dropped)
        self.hooks = hooks  # ... and message.dropped for each
        self.cluster = cluster  # None: a node on its own
        self.routes = routes
        self.delivery = delivery
        self.view = view
        self.turn = turn  # whose messages are being routed (a backed-up link holds it)
        self.mark_durable = mark_durable
        self.notices = notices
        self.pending = notices.pending  # (the notices' own) client -> (node, batches)
        self.moved = notices.moved  # (the notices' own) client -> the node that took it over
        self.gates: dict[str, PeerGate] = {}  # peer -> the publishers its backed-up link holds
        self._deferred: list[Callable[[], object]] | None = None  # see Dispatch._route_qos2

    def deliver(self, message: Message, remote: list[RemoteEntry]) -> int:
        """Subscribers online on other nodes (see the module docstring)."""
        cluster = self.cluster
        if cluster is None:
            return 0
        view = self.view
        targets: dict[str, list[str]] = {}
        count = 0
        for client_id, opts in remote:
            entry = view.session(client_id)
            if entry is None or not entry.online or entry.node == self.node_id:
                continue
            self.moved.pop(client_id, None)  # the log caught up
            if not entry.persistent:
                targets.setdefault(entry.node, []).append(client_id)
                count += 1
                continue
            delivered = delivered_form(message, client_id, opts)
            if delivered is None:
                continue
            count += 1
            self.enqueue(client_id, entry, delivered)
        if targets:
            self._forward(message, targets)
        return count

    def _forward(self, message: Message, targets: dict[str, list[str]]) -> None:
        """Over the links now, or (`deferring`) once a QoS 2 message's id is stored."""
        if self._deferred is not None:
            self._deferred.append(functools.partial(self._forward, message, targets))
            return
        if self.cluster is not None:
            missed = self.cluster.forward_missed(message, targets)
            if missed:
                self._dropped(message, [c for node in missed for c in targets[node]])
            if message.qos:
                for node in targets:
                    self._hold_for(node)

    def _dropped(self, message: Message, client_ids: list[str]) -> None:
        """Copies for clients on a peer whose link did not take them (a QoS 0
        message past the link's buffer limit, or a node no longer known)."""
        self.metrics.messages_dropped["cluster_link"] += len(client_ids)
        if self.hooks.has("message.dropped"):
            for client_id in client_ids:
                self.hooks.run("message.dropped", message, "cluster_link", client_id)

    def link_publisher(self) -> Publisher | None:
        """The hold on the peer link whose frame is being handled, if any."""
        link = self.cluster.receiving() if self.cluster is not None else None
        if link is None:
            return None
        hold = link.holder
        if not isinstance(hold, LinkHold):
            hold = link.holder = LinkHold(link)
        return hold

    def _hold_for(self, node: str) -> None:
        """A QoS 1/2 message went into `node`'s link: if that is backed up, its
        publisher waits (bounded, as for a slow local subscriber) until it drains."""
        cluster = self.cluster
        if cluster is None or not cluster.hold(node):
            return
        gate = self.gates.get(node)
        if gate is None:
            gate = self.gates[node] = PeerGate(node)
        publisher = self.turn.publisher
        if publisher is not None:
            gate.holds += 1
            publisher.block_on(gate)

    def peer_drained(self, node: str) -> None:
        gate = self.gates.get(node)
        if gate is not None:
            gate.wake_waiters()

    def is_live(self, node: str) -> bool:
        """Membership says `node` is alive (this node is not a peer)."""
        return self.cluster is not None and self.cluster.is_live(node)

    def enqueue(self, client_id: str, entry: SessionEntry, delivered: Message) -> None:
        """A persistent session online on node `entry.node`: into its queue through
        this node's delivery batch; its node is told once the batch is stored."""
        self.moved.pop(client_id, None)  # the log caught up
        self.mark_durable(client_id)
        stub = Session(client_id, expiry_s=entry.expiry_s)  # no connection: enqueue only
        self.delivery.add(stub, delivered)
        batches = self.pending.get(client_id, (entry.node, 0))[1]
        self.pending[client_id] = (entry.node, batches + 1)

    def forward_to(self, node: str, client_id: str, message: Message) -> None:
        """A clean session online on `node`: the message goes over the link to it alone."""
        self.moved.pop(client_id, None)
        self._forward(message, {node: [client_id]})

    def deliver_queued(self, client_ids: Sequence[str]) -> None:
        """A peer stored messages in these local sessions' queues."""
        for client_id in client_ids:
            session = self.routes.sessions.get(client_id)
            if session is not None and session.conn is not None and session.ready:
                self.delivery.kick(session)

    def kicked(self, client_id: str, epoch: int, node: str) -> bool:
        """`node` claimed client_id under `epoch`: close ours if it is older (True:
        taken over). Until the log tells us it moved, what we queue for it is
        announced to `node`."""
        session = self.routes.sessions.get(client_id)
        if session is None or session.epoch >= epoch:
            return False
        self.moved[client_id] = node
        self.routes.take_over(session)
        return True

    def deferring(self, deferred: list[Callable[[], object]] | None) -> None:
        """While a QoS 2 message is routed, forwards wait in `deferred` (None: go now)."""
        self._deferred = deferred

    def kick_previous(self, client_id: str, previous: str | None, epoch: int) -> None:
        """Takeover across nodes: the node that had the client closes its connection."""
        self.moved.pop(client_id, None)
        if self.cluster is None:
            return
        if previous is None or previous == self.node_id:
            entry = self.view.session(client_id)
            previous = entry.node if entry is not None and entry.online else None
        if previous is not None and previous != self.node_id:
            self.cluster.kick(previous, client_id, epoch)
