"""Routing on one node: subscriptions, sessions, wills, retained.

Theory of operation. One `TopicTrie` holds every subscription (key = client
id, value = `SubOptions`). The first publish to a topic builds its routing
plan (one entry per session, a client's overlapping subscriptions folded:
highest QoS, every subscription identifier; shared groups apart), cached
per topic until a subscription or session changes. Per publish, one member
of each shared group is picked (an online one first), then:

- QoS 0 to an online client: the PUBLISH is encoded once per distinct
  (protocol family, retain flag, subscription ids) and the same bytes are
  written to every such subscriber (dropped and counted if it cannot keep up);
- QoS 1/2 (and QoS 0 for an offline persistent session): through the
  QueueStore, batched per loop turn (`services.node.delivery`).

The publishing connection is `self.publisher` while its packets are being
handled, so a subscriber that cannot keep up can hold it back.

Seams for the event log: every state change a cluster must agree on goes
through one coroutine each (`open_session`, `subscribe`, `unsubscribe`,
`end_session`, `set_retained`). Each takes a version (per client from the
session store, per retained topic), appends its event and applies it
through `LogState` (`services.node.logstate`), the one path from events to
the trie, the session directory and the retained index. CONNACK, SUBACK,
UNSUBACK and the PUBACK / PUBREC of a retained QoS 1/2 message wait for the
log's acknowledgement; when the log cannot take the event in its bounded
time the client gets a failure and nothing is applied:

- CONNECT: CONNACK "server unavailable" (3.x return code 3, 5.0 0x88);
- SUBSCRIBE: SUBACK 0x80 per filter (3.x), 0x83 "implementation specific
  error" (5.0);
- UNSUBSCRIBE: 5.0 UNSUBACK 0x80 per filter; a 3.x UNSUBACK cannot carry a
  failure, so the 3.x connection is closed instead (it resends);
- retained QoS 1/2 PUBLISH: 5.0 PUBACK / PUBREC 0x80; 3.x disconnected
  (it resends). The message itself was still routed to current subscribers.

Disconnects and expiries are applied locally at once and logged best effort.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import random
import time
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from services.event.api import EventLog, EventLogError
from services.event.memory import MemoryEventLog
from services.event.schema import (
    Event,
    RetainedCleared,
    RetainedSet,
    SessionClosed,
    SessionExpired,
    SessionOpened,
    Subscribed,
    Unsubscribed,
)
from services.mqtt import codec
from services.mqtt.actions import OpenSession, Route, SubscribeRequest, UnsubscribeRequest
from services.mqtt.errors import TopicFilterInvalid
from services.mqtt.packets import NO_PROPERTIES, Message, PacketType, ReasonCode, Will
from services.mqtt.topics import matches, parse_shared, validate_topic_filter
from services.mqtt.trie import TopicTrie
from services.node.delivery import Delivery
from services.node.logstate import LogState
from services.node.session import Session, SubOptions
from services.queue.api import IncomingMark, Inflight, QueueStore
from services.retain.api import RetainStore
from services.session.api import Fenced, SessionError, SessionStore
from services.settings import Limits

if TYPE_CHECKING:
    from services.cluster.router import ClusterRouter
    from services.mqtt.channel_config import ChannelConfig
    from services.node.connection import Connection
    from services.node.timers import TimerWheel

log = logging.getLogger("weir.broker")

NEVER_EXPIRES = 0xFFFFFFFF  # MQTT 5 session expiry meaning "never"
V3_SUBACK_FAILURE = 0x80
V5_UNSUBACK_FAILURE = 0x80  # unspecified error


PlanEntry = tuple["Session", "SubOptions | list[SubOptions]"]
RemoteEntry = tuple[str, "SubOptions | list[SubOptions]"]  # a client with no local session
Plan = tuple[
    list[PlanEntry],
    list[tuple[tuple[str, str], list[tuple[str, SubOptions]]]],
    list[RemoteEntry],
]
EXPIRY_RETRY_S = 5.0  # an expiry the store or the log did not take is tried again after this
ENDING_WAIT_S = 5.0  # a reconnect waits this long at most for its previous connection's end
PLAN_CACHE_SIZE = 4096  # topics whose routing plan is kept; cleared whole when full


class Broker:
    def __init__(
        self,
        node_id: str,
        channel_config: ChannelConfig,
        limits: Limits,
        sessions: SessionStore,
        queue: QueueStore,
        retain: RetainStore,
        loop: asyncio.AbstractEventLoop,
        wheel: TimerWheel,
        shared_strategy: str = "round_robin",
        events: EventLog | None = None,
    ) -> None:
        self.node_id = node_id
        self.channel_config = channel_config
        self.limits = limits
        self.store = sessions
        self.queue = queue
        self.retained = retain
        self.loop = loop
        self.wheel = wheel
        self.shared_strategy = shared_strategy
        self.trie: TopicTrie[SubOptions] = TopicTrie()
        self.sessions: dict[str, Session] = {}
        self.connections: set[Connection] = set()
        self.qos0_dropped = 0
        self._dirty: list[Connection] = []
        self._flush_scheduled = False
        self._wills: dict[str, tuple[asyncio.TimerHandle, Message]] = {}
        self._round_robin: dict[tuple[str, str], int] = {}
        self._held_routes: dict[Connection, list[Route]] = {}  # behind a QoS 2 being stored
        self._resend: dict[Connection, list[Inflight]] = {}  # newest last: pop() is next
        self._resending: set[Connection] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ending: dict[str, asyncio.Task[Any]] = {}  # client -> its session's end_session
        self._no_connections: asyncio.Event | None = None
        self._plans: dict[str, Plan] = {}
        self.work = 0  # deliveries made; connections budget their processing by it
        self.publisher: Connection | None = None  # the connection whose packets are in hand
        self.delivery = Delivery(queue, loop, self.spawn, limits.queue_limit, self._publisher)
        self.logstate = LogState(self, events if events is not None else MemoryEventLog())
        self.cluster: ClusterRouter | None = None  # set by the node when it joins a cluster
        self._remote_pending: dict[str, tuple[str, int]] = {}  # client -> (node, batches)
        self._moved: dict[str, str] = {}  # client -> the node that took it over from us
        self.delivery.on_stored = self._notify_remote

    def invalidate_plans(self) -> None:
        self._plans.clear()

    def mark_durable(self, client_id: str) -> None:
        """A persistent session found in the log: its state is in the durable tier."""
        mark = getattr(self.store, "mark_durable", None)
        if mark is not None:
            mark(client_id)

    def _publisher(self) -> Connection | None:
        return self.publisher

    # -- plumbing -----------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("broker task failed", exc_info=task.exception())

    def mark_dirty(self, conn: Connection) -> None:
        self._dirty.append(conn)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush_all)

    def _flush_all(self) -> None:
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, []
        for conn in dirty:
            conn.flush()

    def connection_made(self, conn: Connection) -> bool:
        if len(self.connections) >= self.limits.max_connections:
            return False
        self.connections.add(conn)
        return True

    def connection_lost(self, conn: Connection) -> None:
        self.connections.discard(conn)
        if not self.connections and self._no_connections is not None:
            self._no_connections.set()

    async def wait_no_connections(self, timeout_s: float) -> bool:
        """Wait until every connection is gone; False if the timeout passed first."""
        if not self.connections:
            return True
        self._no_connections = asyncio.Event()
        try:
            await asyncio.wait_for(self._no_connections.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    @staticmethod
    def now_ms() -> int:
        return time.time_ns() // 1_000_000

    # -- sessions -----------------------------------------------------------

    async def open_session(self, conn: Connection, action: OpenSession) -> None:
        client_id = action.client_id
        props = action.connect.properties
        conn.max_outgoing_packet = props.maximum_packet_size
        ending = self._ending.get(client_id)
        if ending is not None:  # the previous connection's end comes first
            await asyncio.wait({ending}, timeout=ENDING_WAIT_S)
        old = self.sessions.get(client_id)
        if old is not None and old.conn is not None and old.conn is not conn:
            old_conn = old.conn
            self._detach(old)
            old_conn.carry_out(old_conn.channel.taken_over())
            old_conn.session = None
        try:
            claim = await self.store.claim(
                client_id, self.node_id, action.clean_start, action.session_expiry_s
            )
        except SessionError as exc:
            log.warning("session claim failed for %s: %s", client_id, exc)
            conn.carry_out(
                conn.channel.session_opened(False, set(), ReasonCode.SERVER_UNAVAILABLE)
            )
            conn.resume_processing()
            return
        self._moved.pop(client_id, None)
        self._kick_previous(client_id, claim.previous_node, claim.epoch)
        fresh = action.clean_start or not claim.session_present
        try:
            version = await self.store.next_version(client_id, claim.epoch)
            await self.logstate.append_and_apply(
                SessionOpened(
                    client_id=client_id,
                    version=version,
                    node=self.node_id,
                    ts_ms=self.now_ms(),
                    epoch=claim.epoch,
                    clean_start=fresh,
                    expiry_s=action.session_expiry_s,
                    protocol=conn.channel.protocol_level,
                    username=action.connect.username,
                )
            )
        except (SessionError, EventLogError) as exc:
            log.warning("session of %s not opened: %s", client_id, exc)
            self.spawn(self._release_unlogged(client_id, claim.epoch, action.session_expiry_s))
            conn.carry_out(
                conn.channel.session_opened(False, set(), ReasonCode.SERVER_UNAVAILABLE)
            )
            conn.resume_processing()
            return
        session = self.sessions.get(client_id)
        if session is not None and session.conn is not None and session.conn is not conn:
            # Another connection claimed it while we waited; it wins only if newer.
            self._detach(session)
        if session is None or not claim.session_present:
            if session is not None:
                self._drop_subscriptions(session)
            session = Session(client_id)
            self.sessions[client_id] = session
            self._plans.clear()
        session.durable = action.session_expiry_s > 0 or claim.session_present
        if claim.session_present and not session.subs:
            session.subs = {
                f: SubOptions.of(o.qos, o.no_local, o.retain_as_published, o.subscription_id)
                for f, o in self.logstate.view.subscriptions(client_id).items()
            }
        if session.expiry_handle is not None:
            session.expiry_handle.cancel()
            session.expiry_handle = None
        pending_will = self._wills.pop(client_id, None)
        if pending_will is not None:
            pending_will[0].cancel()
            if fresh:  # the old session ended here: its delayed will goes now
                self.publish_message(pending_will[1])
        session.epoch = claim.epoch
        session.expiry_s = action.session_expiry_s
        session.ready = False
        session.backlog = 0
        if conn.closed:
            self.spawn(self.end_session(session, session.epoch, conn_gone=True))
            return
        session.conn = conn
        conn.session = session
        try:
            incoming = (
                await self.queue.incoming_ids(client_id, claim.epoch)
                if claim.session_present
                else set()
            )
        except SessionError as exc:  # Fenced, or the store went away: refuse
            log.warning("session of %s not resumed: %s", client_id, exc)
            self._detach(session)
            conn.session = None
            conn.carry_out(
                conn.channel.session_opened(False, set(), ReasonCode.SERVER_UNAVAILABLE)
            )
            conn.resume_processing()
            return
        conn.carry_out(conn.channel.session_opened(claim.session_present, incoming))
        try:
            pending = await self.queue.pending(client_id, claim.epoch)
        except SessionError as exc:  # after CONNACK: close; the client resumes later
            log.warning("inflight of %s not resent: %s", client_id, exc)
            conn.close()
            return
        if session.conn is not conn:
            return
        if pending:
            self._resend[conn] = list(reversed(pending))
            self._resend_some(conn)
        session.ready = True
        conn.resume_processing()
        self.delivery.kick(session)

    async def _release_unlogged(self, client_id: str, epoch: int, expiry_s: int) -> None:
        """A claim whose SessionOpened the log refused: let it go again."""
        with contextlib.suppress(SessionError):
            await self.store.release(client_id, epoch, expiry_s)

    async def _log_session_end(self, event: Event) -> None:
        self.logstate.apply(event)
        try:
            await self.logstate.events.append(event)
        except EventLogError as exc:
            log.warning("end of session %s not logged: %s", event.key, exc)

    def _detach(self, session: Session) -> None:
        session.conn = None
        session.ready = False

    def connection_ended(
        self,
        conn: Connection,
        will: Will | None,
        will_delay_s: int,
        session_expiry_s: int | None = None,
    ) -> None:
        """The connection closed (normally, by error, or taken over)."""
        self._resend.pop(conn, None)
        session = conn.session
        if session is not None and session_expiry_s is not None:
            session.expiry_s = session_expiry_s
        conn.session = None
        expiry_s = 0
        client_id = conn.channel.client_id
        if session is not None and session.conn is conn:
            self._detach(session)
            expiry_s = session.expiry_s
            ending = self.spawn(self.end_session(session, session.epoch, conn_gone=True))
            self._ending[session.client_id] = ending
            ending.add_done_callback(functools.partial(self._ended, session.client_id))
        elif session is not None:
            # Taken over on this node: the session lives on, so a delayed will
            # waits; open_session cancels it or, on a clean start, sends it now.
            expiry_s = session.expiry_s
        if will is not None and client_id is not None:
            self._schedule_will(client_id, will, min(will_delay_s, expiry_s))

    def _ended(self, client_id: str, task: asyncio.Task[Any]) -> None:
        if self._ending.get(client_id) is task:
            del self._ending[client_id]

    async def end_session(self, session: Session, epoch: int, conn_gone: bool) -> None:
        """Seam: a connection left its session (release) or the session ended."""
        client_id = session.client_id
        if session.conn is not None or session.epoch != epoch:
            return
        expiry_s = session.expiry_s if conn_gone else 0
        closed: Event | None = None
        try:
            closed = SessionClosed(
                client_id=client_id,
                version=await self.store.next_version(client_id, epoch),
                node=self.node_id,
                ts_ms=self.now_ms(),
                reason="normal",
                expiry_s=expiry_s,
            )
        except Fenced:
            return
        except SessionError as exc:
            log.warning("end of session %s not logged: %s", client_id, exc)
        if session.conn is not None or session.epoch != epoch:
            return
        if expiry_s == 0:
            await self._redistribute_shared(session)
            if self.sessions.get(client_id) is session:
                del self.sessions[client_id]
            self._drop_subscriptions(session)
        if closed is not None:
            self.spawn(self._log_session_end(closed))
        try:
            await self.store.release(client_id, epoch, expiry_s)
            if expiry_s == 0:
                await self.queue.discard(client_id, epoch)
        except Fenced:
            return
        except SessionError:
            log.exception("session release failed for %s", client_id)
            return
        if expiry_s and expiry_s < NEVER_EXPIRES and session.conn is None:
            session.expiry_handle = self.loop.call_later(expiry_s, self._expire, session, epoch)

    def _expire(self, session: Session, epoch: int) -> None:
        session.expiry_handle = None
        if session.conn is None and session.epoch == epoch:
            if self.sessions.get(session.client_id) is session:
                del self.sessions[session.client_id]
            self._drop_subscriptions(session)
            self.spawn(self._expired(session.client_id, epoch))

    async def _expired(self, client_id: str, epoch: int) -> None:
        """Log the expiry of an offline session, exactly once: by the node it
        was last on (the others only drop it), only if nobody claimed it again,
        and retried until the session store and the log have taken it.
        `epoch` is 0 for a session recovered from the log (its epoch is not
        there): Redis says which epoch is current."""
        entry = self.logstate.view.session(client_id)
        if entry is None or entry.online or entry.node != self.node_id:
            return  # ended or reclaimed in the log already, or another node's to log
        what = "the session store"
        try:
            info = await self.store.get(client_id)
            if info is not None and (info.online or (epoch and info.epoch != epoch)):
                return  # claimed again meanwhile: not expired
            if info is None:  # Redis's own expiry was first: the keys are gone
                version = max(entry.version + 1, time.time_ns() // 1000)
            else:
                version = await self.store.next_version(client_id, info.epoch)
                await self.queue.discard(client_id, info.epoch)
            event = SessionExpired(
                client_id=client_id, version=version, node=self.node_id, ts_ms=self.now_ms()
            )
            what = "the event log"
            await self.logstate.append_and_apply(event)
        except Fenced:
            return  # claimed again between the read and the write
        except (SessionError, EventLogError) as exc:
            log.warning(
                "expiry of session %s not logged yet (%s failed: %s); retrying in %.0f s",
                client_id, what, exc, EXPIRY_RETRY_S,
            )  # fmt: skip
            self.loop.call_later(
                EXPIRY_RETRY_S, lambda: self.spawn(self._expired(client_id, epoch))
            )

    def _drop_subscriptions(self, session: Session) -> None:
        self._plans.clear()
        for topic_filter in session.subs:
            self.trie.remove(topic_filter, session.client_id)
        session.subs = {}

    async def _redistribute_shared(self, session: Session) -> None:
        """A leaving clean member's unacknowledged shared messages go to another member."""
        shared = [parsed for f in session.subs if (parsed := parse_shared(f)) is not None]
        if not shared:
            return
        try:
            items = await self.queue.pending(session.client_id, session.epoch)
            items += await self.queue.take(session.client_id, session.epoch, 1 << 16)
        except SessionError:
            return
        for item in items:
            for group, topic_filter in shared:
                if matches(topic_filter, item.message.topic):
                    members = self.trie.match_shared(item.message.topic).get((group, topic_filter))
                    others = [m for m in members or () if m[0] != session.client_id]
                    if others:
                        self._deliver_shared(item.message, others, (group, topic_filter))
                    break
        self.delivery.schedule()

    def _schedule_will(self, client_id: str, will: Will, delay_s: int) -> None:
        props = will.properties
        expiry = props.message_expiry_interval
        message = Message(
            topic=will.topic,
            payload=will.payload,
            qos=will.qos,
            retain=will.retain,
            properties=dataclasses.replace(props, will_delay_interval=None)
            if props is not NO_PROPERTIES
            else props,
            sender=client_id,
            expires_at_ms=None if expiry is None else self.now_ms() + expiry * 1000,
        )
        if delay_s <= 0:
            self.publish_message(message)
            return
        old = self._wills.pop(client_id, None)
        if old is not None:
            old[0].cancel()
        handle = self.loop.call_later(delay_s, self._will_due, client_id, message)
        self._wills[client_id] = (handle, message)

    def _will_due(self, client_id: str, message: Message) -> None:
        self._wills.pop(client_id, None)
        self.publish_message(message)

    # -- subscriptions --------------------------------------------------------

    def subscribe(self, conn: Connection, request: SubscribeRequest) -> None:
        """Seam: apply a SUBSCRIBE, answer SUBACK, send retained messages.
        Routing starts here, as the packet is read; the SUBACK waits for the log."""
        session = conn.session
        if session is None or conn.closed:
            return
        v5 = conn.channel.protocol_level >= 5
        codes: list[int] = []
        retained: list[tuple[str, SubOptions]] = []
        events: list[Subscribed] = []
        undo: list[tuple[str, SubOptions | None]] = []  # (filter, what it routed before)
        max_qos = getattr(self.channel_config, "max_qos", 2)
        for sub in request.subscriptions:
            try:
                validate_topic_filter(sub.topic_filter)
            except TopicFilterInvalid:
                codes.append(ReasonCode.TOPIC_FILTER_INVALID if v5 else V3_SUBACK_FAILURE)
                continue
            granted = min(sub.qos, max_qos)
            options = SubOptions.of(
                granted, sub.no_local, sub.retain_as_published, request.subscription_id
            )
            is_new = sub.topic_filter not in session.subs
            events.append(
                Subscribed(
                    client_id=session.client_id,
                    version=0,
                    node=self.node_id,
                    ts_ms=0,
                    filter=sub.topic_filter,
                    qos=granted,
                    no_local=sub.no_local,
                    retain_as_published=sub.retain_as_published,
                    retain_handling=sub.retain_handling,
                    subscription_id=request.subscription_id,
                )
            )
            codes.append(granted)
            undo.append((sub.topic_filter, self._route(session, sub.topic_filter, options)))
            if parse_shared(sub.topic_filter) is None and (
                sub.retain_handling == 0 or (sub.retain_handling == 1 and is_new)
            ):
                retained.append((sub.topic_filter, options))
        packet_id = request.packet_id
        self.spawn(self._subscribed(conn, session, packet_id, codes, events, retained, undo))

    async def _subscribed(
        self,
        conn: Connection,
        session: Session,
        packet_id: int,
        codes: list[int],
        events: list[Subscribed],
        retained: list[tuple[str, SubOptions]],
        undo: list[tuple[str, SubOptions | None]],
    ) -> None:
        if events and not await self._log_client_events(session, events):
            v5 = conn.channel.protocol_level >= 5
            failure = ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR if v5 else V3_SUBACK_FAILURE
            codes = [c if c >= 0x80 else failure for c in codes]
            retained = []
            self._undo_routes(session, undo)
        if conn.closed:
            return
        conn.carry_out(conn.channel.subscribed(packet_id, codes))
        now_ms = self.now_ms()
        for topic_filter, options in retained:
            for message in self.retained.match(topic_filter, now_ms):
                self._deliver(session, self._for_subscriber(message, options, True))
        self.delivery.schedule()
        conn.resume_processing()

    def unsubscribe(self, conn: Connection, request: UnsubscribeRequest) -> None:
        """Seam: apply an UNSUBSCRIBE and answer UNSUBACK. Routing stops here;
        the UNSUBACK waits for the log."""
        session = conn.session
        if session is None or conn.closed:
            return
        codes: list[int] = []
        events: list[Unsubscribed] = []
        undo: list[tuple[str, SubOptions | None]] = []
        for topic_filter in request.topic_filters:
            existed = topic_filter in session.subs
            if existed:
                events.append(
                    Unsubscribed(
                        client_id=session.client_id,
                        version=0,
                        node=self.node_id,
                        ts_ms=0,
                        filter=topic_filter,
                    )
                )
                undo.append((topic_filter, self._route(session, topic_filter, None)))
            codes.append(
                ReasonCode.SUCCESS if existed else ReasonCode.NO_SUBSCRIPTION_EXISTED
            )
        self.spawn(self._unsubscribed(conn, session, request.packet_id, codes, events, undo))

    async def _unsubscribed(
        self,
        conn: Connection,
        session: Session,
        packet_id: int,
        codes: list[int],
        events: list[Unsubscribed],
        undo: list[tuple[str, SubOptions | None]],
    ) -> None:
        if events and not await self._log_client_events(session, events):
            self._undo_routes(session, undo)
            if conn.channel.protocol_level < 5:
                conn.close()  # a 3.x UNSUBACK cannot say it failed
                return
            codes = [V5_UNSUBACK_FAILURE] * len(codes)
        if conn.closed:
            return
        conn.carry_out(conn.channel.unsubscribed(packet_id, codes))
        conn.resume_processing()

    def _route(self, session: Session, topic_filter: str, options: SubOptions | None) -> (
        SubOptions | None
    ):
        """Route `topic_filter` for the session at once (None: stop routing it),
        before the log has the event [DESIGN 4]; returns what it routed before."""
        previous = session.subs.get(topic_filter)
        if options is None:
            self.trie.remove(topic_filter, session.client_id)
            session.subs.pop(topic_filter, None)
        else:
            self.trie.add(topic_filter, session.client_id, options)
            session.subs[topic_filter] = options
        self._plans.clear()
        return previous

    def _undo_routes(self, session: Session, undo: list[tuple[str, SubOptions | None]]) -> None:
        """The log refused the events: put back what was routed before, newest first."""
        if self.sessions.get(session.client_id) is not session:
            return  # the session ended meanwhile and took its routes with it
        for topic_filter, previous in reversed(undo):
            self._route(session, topic_filter, previous)

    async def _log_client_events(
        self, session: Session, events: list[Subscribed] | list[Unsubscribed]
    ) -> bool:
        """Version, append and apply one client's events; False if the log (or
        the session store) could not take them: then nothing was applied."""
        client_id = session.client_id
        epoch = session.epoch
        try:
            stamped: list[Event] = []
            ts_ms = self.now_ms()
            for unstamped in events:
                version = await self.store.next_version(client_id, epoch)
                stamped.append(dataclasses.replace(unstamped, version=version, ts_ms=ts_ms))
            await asyncio.gather(*(self.logstate.events.append(e) for e in stamped))
        except (SessionError, EventLogError) as exc:
            log.warning("%d events of %s not logged: %s", len(events), client_id, exc)
            return False
        for event in stamped:
            self.logstate.apply(event)
        return True

    async def set_retained(self, message: Message) -> bool:
        """Seam: a retained message was set (or cleared by an empty payload).
        True once the log holds it and it is applied; False if it could not."""
        topic = message.topic
        event: Event
        try:
            version = await self.store.next_topic_version(topic)
        except SessionError as exc:
            log.warning("retained %s not logged: %s", topic, exc)
            return False
        if message.payload:
            props = message.properties
            event = RetainedSet(
                topic=topic,
                version=version,
                node=self.node_id,
                ts_ms=self.now_ms(),
                payload=message.payload,
                qos=message.qos,
                expires_at_ms=message.expires_at_ms,
                payload_format_indicator=props.payload_format_indicator,
                content_type=props.content_type,
                response_topic=props.response_topic,
                correlation_data=props.correlation_data,
                user_property=props.user_property,
                sender=message.sender,
            )
        else:
            event = RetainedCleared(
                topic=topic, version=version, node=self.node_id, ts_ms=self.now_ms()
            )
        try:
            await self.logstate.append_and_apply(event)
        except EventLogError as exc:
            log.warning("retained %s not logged: %s", topic, exc)
            return False
        return True

    # -- publish --------------------------------------------------------------

    def publish(self, conn: Connection, route: Route) -> None:
        if self._held_routes:
            held = self._held_routes.get(conn)
            if held is not None:  # a QoS 2 ahead is still being stored: keep the order
                held.append(route)
                return
        message = route.message
        if route.qos2_packet_id is not None and conn.session is not None:
            self._held_routes[conn] = []
            self.spawn(self._publish_qos2(conn, conn.session, route))
            return
        since = self.delivery.batched
        if message.retain and route.token is not None:
            delivered = self.publish_message(message, store_retained=False)
            gate = self.loop.create_future()
            self.spawn(self._retain_gate(message, gate))
            self.delivery.token(conn, route.token, delivered == 0, gate, since=since)
            return
        delivered = self.publish_message(message)
        if route.token is not None:
            self.delivery.token(conn, route.token, delivered == 0, since=since)

    async def _retain_gate(self, message: Message, gate: asyncio.Future[bool]) -> None:
        ok = False
        try:
            ok = await self.set_retained(message)
        finally:
            if not gate.done():
                gate.set_result(ok)

    async def _publish_qos2(self, conn: Connection, session: Session, route: Route) -> None:
        """Route a QoS 2 PUBLISH once its packet id is stored; the publisher's later
        PUBLISHes wait behind it so one client's messages keep their order
        [MQTT-4.6.0-6] (concurrent store calls may complete in any order)."""
        try:
            await self._route_qos2(conn, session, route)
        finally:
            held = self._held_routes.pop(conn, None)
            if held and not conn.closed:
                for later in held:
                    self.publish(conn, later)

    async def _route_qos2(self, conn: Connection, session: Session, route: Route) -> None:
        """A read-only check first (a known resend reaches nobody, not even the
        memory-tier subscribers); the id is then stored in the same atomic step
        as the message's durable copies (`Delivery.mark`), so a crash between
        cannot make a resend look like a duplicate of a message never stored."""
        mark = IncomingMark(session.client_id, session.epoch, route.qos2_packet_id or 0)
        try:
            known = await self.queue.incoming_has(mark.client_id, mark.epoch, mark.packet_id)
        except Fenced:
            conn.close()
            return
        except SessionError as exc:  # the store is down: no PUBREC (5.0: 0x80)
            log.warning("QoS 2 publish of %s not stored: %s", session.client_id, exc)
            if route.token is not None:
                conn.routed(route.token, False, False)
            return
        if known:
            if route.token is not None:
                self.delivery.token(conn, route.token, False)
            return
        message = route.message
        gate: asyncio.Future[bool] | None = None
        if message.retain and route.token is not None:
            gate = self.loop.create_future()
            self.spawn(self._retain_gate(message, gate))
        since = self.delivery.batched
        delivered = self.publish_message(message, store_retained=gate is None)
        self.delivery.mark(mark, since)
        if route.token is not None:
            self.delivery.token(conn, route.token, delivered == 0, gate, mark, since)

    def publish_message(self, message: Message, store_retained: bool = True) -> int:
        """Route one message to every matching subscription; returns how many."""
        if message.retain and store_retained:
            self.spawn(self.set_retained(message))
        plan = self._plans.get(message.topic)
        if plan is None:
            plan = self._plan(message.topic)
        plain, shared, remote = plan
        count = self._deliver_plain(message, plain) if plain else 0
        for group_filter, members in shared:
            if self._deliver_shared(message, members, group_filter):
                count += 1
        if remote and self.cluster is not None:
            count += self._deliver_remote(message, remote, self.cluster)
        self.work += count
        self.delivery.schedule()
        return count

    def _plan(self, topic: str) -> Plan:
        """Who a topic reaches: one entry per local session, shared groups apart."""
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
        plan: Plan = (plain, list(self.trie.match_shared(topic).items()), remote)
        if len(self._plans) >= PLAN_CACHE_SIZE:
            self._plans.clear()
        self._plans[topic] = plan
        return plan

    def _deliver_plain(self, message: Message, plan: list[PlanEntry]) -> int:
        sender = message.sender
        encoded: dict[tuple[bool, bool, tuple[int, ...]], bytes] = {}
        qos_in = message.qos
        retain_in = message.retain
        fast = message.expires_at_ms is None
        count = 0
        for session, opts in plan:
            if type(opts) is SubOptions:
                if opts.no_local and session.client_id == sender:
                    continue
                qos = opts.qos if opts.qos < qos_in else qos_in
                retain = retain_in and opts.retain_as_published
                sub_ids = opts.sub_ids
            else:
                assert isinstance(opts, list)
                live = [o for o in opts if not (o.no_local and session.client_id == sender)]
                if not live:
                    continue
                qos = min(qos_in, max(o.qos for o in live))
                retain = retain_in and any(o.retain_as_published for o in live)
                sub_ids = tuple(o.subscription_id for o in live if o.subscription_id)
            count += 1
            conn = session.conn
            if (
                qos == 0
                and fast
                and conn is not None
                and session.ready
                and not conn.channel.outbound_aliases  # those go through the channel
            ):
                v5 = conn.channel.protocol_level >= 5
                key = (v5, retain, sub_ids if v5 else ())
                data = encoded.get(key)
                if data is None:
                    data = self._encode_qos0(message, retain, v5, sub_ids)
                    encoded[key] = data
                limit = conn.max_outgoing_packet
                if limit is None or len(data) <= limit:
                    conn.write_qos0(data)
            else:
                self._deliver(session, self._adjusted(message, qos, retain, sub_ids))
        return count

    @staticmethod
    def _encode_qos0(message: Message, retain: bool, v5: bool, sub_ids: tuple[int, ...]) -> bytes:
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

    @staticmethod
    def _adjusted(message: Message, qos: int, retain: bool, sub_ids: tuple[int, ...]) -> Message:
        properties = message.properties
        if sub_ids or properties.subscription_identifier:
            properties = dataclasses.replace(properties, subscription_identifier=sub_ids)
        if qos == message.qos and retain == message.retain and properties is message.properties:
            return message
        return dataclasses.replace(message, qos=qos, retain=retain, properties=properties)

    @classmethod
    def _for_subscriber(cls, message: Message, options: SubOptions, retained: bool) -> Message:
        sub_ids = options.sub_ids
        retain = True if retained else message.retain and options.retain_as_published
        return cls._adjusted(message, min(message.qos, options.qos), retain, sub_ids)

    def _deliver_shared(
        self,
        message: Message,
        members: list[tuple[str, SubOptions]],
        group_filter: tuple[str, str],
    ) -> bool:
        """One member of a shared group gets the message: an online one if any."""
        count = len(members)
        if self.shared_strategy == "random":
            start = random.randrange(count)
        else:
            start = self._round_robin.get(group_filter, 0) % count
            self._round_robin[group_filter] = start + 1
        fallback: tuple[Session, SubOptions] | None = None
        for i in range(count):
            client_id, options = members[(start + i) % count]
            session = self.sessions.get(client_id)
            if session is None:
                continue
            if session.conn is not None and session.ready:
                self._deliver(session, self._for_subscriber(message, options, False))
                return True
            if fallback is None and session.expiry_s > 0:
                fallback = (session, options)
        if fallback is not None:
            self._deliver(fallback[0], self._for_subscriber(message, fallback[1], False))
            return True
        return False

    def _deliver(self, session: Session, message: Message) -> None:
        """The general path: through the channel (QoS 0) or the queue (QoS 1/2, offline)."""
        conn = session.conn
        if message.qos == 0 and conn is not None and session.ready:
            conn.carry_out(conn.channel.deliver(message, None, False, self.now_ms()))
            return
        if message.qos == 0 and session.expiry_s == 0:
            return  # a clean session that is not connected yet: nothing to keep it for
        self.delivery.add(session, message)

    # -- other nodes (services.cluster.router) ----------------------------------------

    def _deliver_remote(
        self, message: Message, remote: list[RemoteEntry], cluster: ClusterRouter
    ) -> int:
        """Subscribers online on other nodes: clean ones get the message forwarded
        as published (their node applies their options); persistent ones get it
        in their Redis queue, then their node is told (`_notify_remote`)."""
        view = self.logstate.view
        targets: dict[str, list[str]] = {}
        count = 0
        for client_id, opts in remote:
            entry = view.session(client_id)
            if entry is None or not entry.online or entry.node == self.node_id:
                continue
            self._moved.pop(client_id, None)  # the log caught up
            if not entry.persistent:
                targets.setdefault(entry.node, []).append(client_id)
                count += 1
                continue
            delivered = self._delivered_form(message, client_id, opts)
            if delivered is None:
                continue
            count += 1
            self.mark_durable(client_id)
            stub = Session(client_id)  # no connection: enqueue only, its owner takes
            stub.expiry_s = entry.expiry_s
            self.delivery.add(stub, delivered)
            batches = self._remote_pending.get(client_id, (entry.node, 0))[1]
            self._remote_pending[client_id] = (entry.node, batches + 1)
        if targets:
            cluster.forward(message, targets)
        return count

    def _delivered_form(
        self, message: Message, client_id: str, opts: SubOptions | list[SubOptions]
    ) -> Message | None:
        live = opts if isinstance(opts, list) else [opts]
        live = [o for o in live if not (o.no_local and client_id == message.sender)]
        if not live:
            return None
        qos = min(message.qos, max(o.qos for o in live))
        retain = message.retain and any(o.retain_as_published for o in live)
        sub_ids = tuple(o.subscription_id for o in live if o.subscription_id)
        return self._adjusted(message, qos, retain, sub_ids)

    def _notify_remote(self, items: Sequence[tuple[str, Message]]) -> None:
        """A batch is stored: tell the owners of the remote persistent sessions in it."""
        pending, moved = self._remote_pending, self._moved
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

    def deliver_forwarded(self, message: Message, client_ids: Sequence[str]) -> None:
        """A peer's publish for local clean sessions: each gets it per its own subscriptions."""
        topic = message.topic
        plan: list[PlanEntry] = []
        for client_id in client_ids:
            session = self.sessions.get(client_id)
            if session is None:
                continue
            opts = [
                o
                for f, o in session.subs.items()
                if parse_shared(f) is None and matches(f, topic)
            ]
            if opts:
                plan.append((session, opts[0] if len(opts) == 1 else opts))
        if plan:
            self.work += self._deliver_plain(message, plan)
            self.delivery.schedule()

    def deliver_queued(self, client_ids: Sequence[str]) -> None:
        """A peer stored messages in these local sessions' queues."""
        for client_id in client_ids:
            session = self.sessions.get(client_id)
            if session is not None and session.conn is not None and session.ready:
                self.delivery.kick(session)

    def kicked(self, client_id: str, epoch: int, node: str) -> None:
        """`node` claimed client_id under `epoch`: close ours if it is older. Until
        the log tells us it moved, what we queue for it is announced to `node`."""
        session = self.sessions.get(client_id)
        if session is None or session.epoch >= epoch:
            return
        self._moved[client_id] = node
        if session.conn is None:
            return
        conn = session.conn
        self._detach(session)
        conn.session = None
        conn.carry_out(conn.channel.taken_over())

    def _kick_previous(self, client_id: str, previous: str | None, epoch: int) -> None:
        """Takeover across nodes: the node that had the client closes its connection."""
        if self.cluster is None:
            return
        if previous is None or previous == self.node_id:
            entry = self.logstate.view.session(client_id)
            previous = entry.node if entry is not None and entry.online else None
        if previous is not None and previous != self.node_id:
            self.cluster.kick(previous, client_id, epoch)

    # -- acknowledgements from subscribers -------------------------------------------

    def acked(self, conn: Connection, packet_id: int) -> None:
        if conn.session is not None:
            self.delivery.acked(conn.session, packet_id)
        if conn in self._resend:
            self._resend_some(conn)

    def _resend_some(self, conn: Connection) -> None:
        """Resend a resumed session's unacknowledged messages (DUP) or PUBRELs
        within the client's Receive Maximum; the rest wait for acks, and the
        queue behind them waits too [MQTT-3.3.4-7]."""
        backlog = self._resend.get(conn)
        if backlog is None or conn in self._resending:
            return
        self._resending.add(conn)
        try:
            now_ms = self.now_ms()
            channel = conn.channel
            while backlog and channel.send_quota > 0 and not conn.closed:
                item = backlog.pop()
                if item.released:
                    conn.carry_out(channel.resend_pubrel(item.packet_id))
                else:
                    conn.carry_out(channel.deliver(item.message, item.packet_id, True, now_ms))
        finally:
            self._resending.discard(conn)
        if not backlog or conn.closed:
            self._resend.pop(conn, None)

    def received(self, conn: Connection, packet_id: int) -> None:
        if conn.session is not None:
            self.delivery.received(conn.session, packet_id)

    def released(self, conn: Connection, packet_id: int) -> None:
        if conn.session is not None:
            self.delivery.released(conn.session, packet_id)

    # -- shutdown -----------------------------------------------------------------

    def disconnect_all(self, reason_code: int) -> None:
        for conn in list(self.connections):
            if not conn.closed:
                conn.carry_out(conn.channel.server_disconnect(reason_code))
                conn.close()

    async def drain_tasks(self, timeout_s: float) -> None:
        if self._tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(*self._tasks, return_exceptions=True), timeout_s
                )

    def close(self) -> None:
        for handle, _ in self._wills.values():
            handle.cancel()
        self._wills.clear()
        for session in self.sessions.values():
            if session.expiry_handle is not None:
                session.expiry_handle.cancel()
