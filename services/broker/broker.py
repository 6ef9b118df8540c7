"""The broker of one node: a thin facade over its parts.

Theory of operation. The parts, each owning its state, in the order their
imports run (each imports only parts above it):

- `routes.Routes`: the routing table (every subscription's trie, the local
  sessions, routing plans per topic);
- `logstate.LogState`: the event log's projection into the table (replay,
  then the live tail);
- `delivery.Delivery`: the durable pump (QoS 1/2 and offline QoS 0 through
  the queue store, one ordered batch at a time, PUBACK / PUBREC after it);
- `remote.Remote`: the cluster side (forwarding, remote queues, takeover);
- `shared.Shared`: which member of a shared group gets a message,
  cluster-wide, and redispatch when a member leaves;
- `dispatch.Dispatch`: PUBLISH to every matching session, shared groups
  (through `shared`), QoS 2 ordering, retained messages;
- `inside.InsidePublish`: messages from inside the node (a Kafka -> MQTT
  bridge) down the same path, answered by a future;
- `subscriptions.Subscriptions`: SUBSCRIBE / UNSUBSCRIBE, retained on subscribe;
- `wills.Wills`: wills stored with the session, published once cluster-wide;
- `expiry.Expiry`: an offline session's end when its timer fires, logged once;
- `cm.ConnectionManager`: connections, session open / takeover / end, wills,
  resume;
- `orphans.Orphans`: a dead node's sessions and wills, taken over.

Each part gets what it calls when it is built (STYLE 18): the broker builds
them in that order (the orphans before the expiry, which asks which nodes
are dead) with keyword arguments, and nothing is handed to a part later.
Where two parts call each other a small port built first sits between them:
`remote.Notices` (delivery tells it of each stored batch; the remote side
records whom to tell), `ports.Expiries` (the log projection and the
connection manager set offline sessions' end timers; `expiry` serves them,
as it logs through the log projection) and `ports.Turn` (whose messages are
being routed). A `Session` field is written only by the part that owns it
(`Session.OWNERS`).

`Broker` builds them (the composition root, `services.node.app`, picks the
stores and the event log) and is what a connection sees (`ports.BrokerPort`)
and what the cluster router calls (`services.cluster.router.LocalNode`).
A CONNECT is admitted (`Seams.admit`: bans, flapping, connection rates)
before it is authenticated (enhanced authentication: with the user name its
first data claims, when the CONNECT gave none), or before its session opens
when no authenticator is asked; a ban new to this node disconnects the connected
clients it covers (`seams.Kicks`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.broker.cm import ConnectionManager
from services.broker.delivery import Delivery
from services.broker.dispatch import Dispatch
from services.broker.expiry import Expiry
from services.broker.inside import InsidePublish
from services.broker.logstate import LogState
from services.broker.orphans import Orphans
from services.broker.ports import ConnectionPort, Expiries, Flow, Session, SubOptions, Turn
from services.broker.remote import Notices, Remote
from services.broker.routes import Routes
from services.broker.seams import Seams
from services.broker.subscriptions import Subscriptions
from services.broker.timers import TimerWheel
from services.broker.wills import Wills
from services.event.api import EventLog
from services.metrics.registry import Metrics
from services.metrics.trace import Tracer
from services.mqtt.actions import (
    Authenticate,
    AuthExchange,
    OpenSession,
    Route,
    SubscribeRequest,
    UnsubscribeRequest,
)
from services.mqtt.channel_config import ChannelConfig
from services.mqtt.packets import Message, Will
from services.mqtt.trie import TopicTrie
from services.queue.api import QueueStore
from services.retain.api import RetainStore
from services.session.api import SessionStore, WillStore
from services.session.memory import MemoryWillStore

if TYPE_CHECKING:
    from services.cluster.router import ClusterRouter

log = logging.getLogger("weir.broker")


class Broker:
    def __init__(
        self,
        *,
        node_id: str,
        channel_config: ChannelConfig,
        flow: Flow,
        max_connections: int,
        queue_limit: int,
        sessions: SessionStore,
        queue: QueueStore,
        retain: RetainStore,
        loop: asyncio.AbstractEventLoop,
        wheel: TimerWheel,
        events: EventLog,
        cluster: ClusterRouter | None = None,
        shared_strategy: str = "round_robin",
        seams: Seams | None = None,
        shared_local: bool = False,
        wills: WillStore | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self.node_id = node_id
        # packet traces (the node's, which the management API drives); none: never on
        self.tracer = tracer if tracer is not None else Tracer(Path("trace"), node_id)
        self.channel_config = channel_config
        self.flow = flow
        self.store = sessions
        self.queue = queue
        self.retained = retain
        self.loop = loop
        self.wheel = wheel
        self.turn = turn = Turn()
        self.seams = seams = seams if seams is not None else Seams()
        self.metrics = seams.metrics
        self._expired_folded = 0  # of queue.expired, in metrics already (`figures`)
        self._tasks: set[asyncio.Task[Any]] = set()
        spawn = self.spawn
        self.routes = routes = Routes(node_id=node_id, mark_durable=sessions.mark_durable)
        self.expiries = expiries = Expiries(loop)  # offline sessions' end timers
        self.logstate = logstate = LogState(
            table=routes,
            expiries=expiries,
            events=events,
            retained=retain,
            store=sessions,
            spawn=spawn,
            metrics=seams.metrics,
        )
        notices = Notices(cluster)
        self.delivery = delivery = Delivery(
            queue=queue,
            loop=loop,
            spawn=spawn,
            queue_limit=queue_limit,
            turn=turn,
            stored=notices.stored,
            metrics=seams.metrics,
            hooks=seams.hooks,
        )
        self.remote = remote = Remote(
            node_id=node_id,
            cluster=cluster,
            routes=routes,
            delivery=delivery,
            notices=notices,
            view=logstate.view,
            turn=turn,
            mark_durable=sessions.mark_durable,
            metrics=seams.metrics,
            hooks=seams.hooks,
        )
        self.dispatch = dispatch = Dispatch(
            node_id=node_id,
            routes=routes,
            delivery=delivery,
            remote=remote,
            store=sessions,
            queue=queue,
            logstate=logstate,
            loop=loop,
            spawn=spawn,
            shared_strategy=shared_strategy,
            shared_local=shared_local,
            seams=seams,
            turn=turn,
        )
        self.inside = InsidePublish(
            dispatch=dispatch, delivery=delivery, metrics=seams.metrics, loop=loop, spawn=spawn
        )
        self.subscriptions = subscriptions = Subscriptions(
            node_id=node_id,
            channel_config=channel_config,
            routes=routes,
            dispatch=dispatch,
            delivery=delivery,
            logstate=logstate,
            store=sessions,
            retained=retain,
            spawn=spawn,
            seams=seams,
        )
        self.wills = Wills(
            node_id=node_id,
            store=wills if wills is not None else MemoryWillStore(),
            publish=dispatch.publish_will,
            loop=loop,
            spawn=spawn,
        )
        self.orphans = Orphans(
            node_id=node_id,
            cluster=cluster,
            store=sessions,
            wills=self.wills,
            logstate=logstate,
            spawn=spawn,
        )
        self.expiry = Expiry(
            node_id=node_id,
            expiries=expiries,
            routes=routes,
            logstate=logstate,
            store=sessions,
            queue=queue,
            loop=loop,
            spawn=spawn,
            seams=seams,
            dead=self.orphans.dead,
            shared=dispatch.shared,
        )
        self.cm = ConnectionManager(
            node_id=node_id,
            max_connections=max_connections,
            routes=routes,
            dispatch=dispatch,
            remote=remote,
            delivery=delivery,
            logstate=logstate,
            store=sessions,
            queue=queue,
            loop=loop,
            spawn=spawn,
            seams=seams,
            wills=self.wills,
            expiries=expiries,
            recheck=subscriptions.recheck,  # resumed subscriptions, under the ACL
        )
        # The per-packet calls go straight to their part (no facade hop).
        self.publish: Callable[[ConnectionPort, Route], None] = dispatch.publish
        self.acked: Callable[[ConnectionPort, int], None] = self.cm.acked
        self.mark_dirty: Callable[[ConnectionPort], None] = self.cm.mark_dirty

    # -- state the parts share, as tests and tools read it -----------------------

    @property
    def trie(self) -> TopicTrie[SubOptions]:
        return self.routes.trie

    @property
    def sessions(self) -> dict[str, Session]:
        return self.routes.sessions

    @property
    def connections(self) -> set[ConnectionPort]:
        return self.cm.connections

    @property
    def cluster(self) -> ClusterRouter | None:
        return self.remote.cluster

    def invalidate_plans(self) -> None:
        self.routes.invalidate_plans()

    # -- plumbing -------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("broker task failed", exc_info=task.exception())

    async def drain_tasks(self, timeout_s: float) -> None:
        if self._tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(*self._tasks, return_exceptions=True), timeout_s
                )

    # -- what a connection asks (ports.BrokerPort) -------------------------------------

    def connection_made(self, conn: ConnectionPort) -> bool:
        return self.cm.connection_made(conn)

    def connection_lost(self, conn: ConnectionPort) -> None:
        refused = conn.channel.refused_with  # every refusing CONNACK, whoever refused
        if refused is not None:
            self.seams.hooks.run("client.connack", conn.channel.client_id, refused)
        self.cm.connection_lost(conn)
        self.seams.disconnected(conn)

    def connection_ended(
        self,
        conn: ConnectionPort,
        will: Will | None,
        will_delay_s: int,
        session_expiry_s: int | None = None,
    ) -> None:
        self.cm.connection_ended(conn, will, will_delay_s, session_expiry_s)

    async def authenticate(self, conn: ConnectionPort, action: Authenticate) -> None:
        code = await self.seams.admit(conn, action.client_id, action.username)
        if code:
            conn.carry_out(conn.channel.authenticated(False, code))
            conn.resume_processing()
            return
        await self.seams.authenticate(conn, action)

    async def auth_exchange(self, conn: ConnectionPort, action: AuthExchange) -> None:
        if action.context is None and not action.reauth:  # a CONNECT's: admitted first
            user = action.username or self.seams.claimed_user(action)
            code = await self.seams.admit(conn, action.client_id, user)
            if code:
                conn.carry_out(conn.channel.authenticated(False, code))
                conn.resume_processing()
                return
        await self.seams.auth_exchange(conn, action)

    async def open_session(self, conn: ConnectionPort, action: OpenSession) -> None:
        if not self.channel_config.authenticate:  # else admitted before authentication
            code = await self.seams.admit(conn, action.client_id, action.connect.username)
            if code:
                conn.carry_out(conn.channel.session_opened(False, set(), code))
                conn.resume_processing()
                return
        await self.seams.connected(conn)
        await self.cm.open_session(conn, action)

    def subscribe(self, conn: ConnectionPort, request: SubscribeRequest) -> None:
        self.subscriptions.subscribe(conn, request)

    def unsubscribe(self, conn: ConnectionPort, request: UnsubscribeRequest) -> None:
        self.subscriptions.unsubscribe(conn, request)

    def received(self, conn: ConnectionPort, packet_id: int) -> None:
        self.cm.received(conn, packet_id)

    def released(self, conn: ConnectionPort, packet_id: int) -> None:
        self.cm.released(conn, packet_id)

    def publish_message(self, message: Message, store_retained: bool = True) -> int:
        return self.dispatch.publish_message(message, store_retained)

    def publish_inside(self, message: Message) -> asyncio.Future[bool]:
        return self.inside.publish(message)

    # -- what the cluster router calls (services.cluster.router.LocalNode) -------------

    def deliver_forwarded(self, message: Message, client_ids: Sequence[str]) -> None:
        outer = self.turn.handling(self.remote.link_publisher())
        try:  # a subscriber that cannot keep up holds the link (remote.LinkHold)
            self.dispatch.deliver_forwarded(message, client_ids)
        finally:
            self.turn.handled(outer)

    def deliver_queued(self, client_ids: Sequence[str]) -> None:
        self.remote.deliver_queued(client_ids)

    def kicked(self, client_id: str, epoch: int, node: str) -> None:
        if self.remote.kicked(client_id, epoch, node):  # on the node it was taken from
            self.seams.hooks.run("session.takenover", client_id)

    def node_joined(self, node_id: str) -> None:
        self.metrics.dead_nodes.discard(node_id)  # its node_down alarm clears
        self.orphans.node_joined(node_id)

    def peer_drained(self, node_id: str) -> None:
        self.remote.peer_drained(node_id)

    def node_died(self, node_id: str) -> None:
        self.metrics.dead_nodes.add(node_id)  # the node_down/<id> alarm
        self.orphans.node_died(node_id)

    def fenced(self, fenced: bool) -> None:
        self.cm.fence(fenced)

    # -- what the node's metrics read (services.metrics.service) ---------------------------

    def publish_sys(self, topic: str, payload: bytes, retain: bool) -> None:
        """A message of the node's own ($SYS figures, alarms): from no client, so
        no ACL and no hook; routed as any other. Retained here only, in this
        node's retained store, not through the log: the log and the state store
        stay the clients' state (the drift check and a replay compare them), and
        a restarted node publishes its tree again. So a node's $SYS tree comes
        retained to subscribers on that node (as Mosquitto's), live to all."""
        message = Message(topic, payload, 0, retain)
        if retain:
            self.retained.set(message)
        self.dispatch.publish_message(message, store_retained=False)

    def publish_local(self, topic: str, payload: bytes, retain: bool) -> None:
        """`publish_sys` to this node's own subscribers only (no shared group, no
        peer): what every node publishes alike ($SYS/cluster/...) reaches each
        subscriber once, from its own node."""
        message = Message(topic, payload, 0, retain)
        if retain:
            self.retained.set(message)
        plain = self.routes.plan(topic)[0]
        if plain:
            self.turn.work += self.dispatch.deliver_plain(message, plain)
            self.delivery.schedule()

    def figures(self, m: Metrics) -> None:
        """The gauges only the routing table knows, filled before a read."""
        sessions = self.routes.sessions
        m.sessions = len(sessions)
        m.subscriptions = sum(len(s.subs) for s in sessions.values())
        m.retained = len(self.retained)
        cluster = self.remote.cluster
        m.nodes_live = 1 + (len(cluster.peers()) if cluster is not None else 0)
        # Queued messages that expired before delivery: the store counts what its
        # takes removed (no call per message here); the new ones are added now.
        expired = self.queue.expired
        m.messages_dropped["expired"] += expired - self._expired_folded
        self._expired_folded = expired

    # -- shutdown -------------------------------------------------------------------------

    async def wait_no_connections(self, timeout_s: float) -> bool:
        return await self.cm.wait_no_connections(timeout_s)

    def disconnect_all(self, reason_code: int, reference: str | None = None) -> None:
        self.cm.disconnect_all(reason_code, reference)

    def close(self) -> None:
        self.cm.close()
