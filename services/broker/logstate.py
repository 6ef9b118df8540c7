"""The node's state as the event log says it: one path from events to the routing table.

Theory of operation. Every event (this node's own, once the log has
acknowledged it; every node's, as replay and the tail deliver them) goes
through `LogState.apply`, which folds it into a `ClusterView` (latest
version per key wins, so an event seen twice is harmless). The view's hooks
mirror subscriptions into the routing table's `TopicTrie` and the local
sessions' `subs` (through the `RoutingTable` Protocol); retained events
update the retained index. Persistent
sessions the log shows offline get a local `Session` object (no connection)
so that publishes reach their durable queues.

At node start (`after_replay`), sessions of THIS node that the log shows
online are sessions of a previous run of this node: persistent ones become
offline local sessions (their clients will reconnect; their queues keep
filling meanwhile) and clean ones are gone. Both get a SessionClosed event
logged in the background (best effort) so the log says so too.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from services.broker.ports import Expiries, RoutingTable, Session, SubOptions, now_ms
from services.event.api import EventLog, EventLogClosed, EventLogError
from services.event.schema import (
    Event,
    RetainedCleared,
    RetainedSet,
    SessionClosed,
    SessionEvent,
    SessionOpened,
    Subscribed,
    Unsubscribed,
)
from services.metrics.registry import Metrics
from services.mqtt.packets import Message, Properties
from services.retain.api import RetainStore
from services.session.api import SessionError, SessionStore
from services.state.clientsubs import SubscriptionOptions
from services.state.view import ClusterView
from services.tasks import cancel_and_wait

log = logging.getLogger("weir.logstate")

NEVER_EXPIRES = 0xFFFFFFFF  # MQTT 5 session expiry meaning "never"
ENDED_KEPT = 100_000  # ended clients whose versions the view keeps (ClusterView rule 4)
RELOG_S = 1.0  # between attempts to log an event already applied here (the log is down)


_SUB_OPTIONS: dict[tuple[int, bool, bool, int | None], SubOptions] = {}
SUB_OPTIONS_CACHE = 4096  # distinct option sets kept; subscription ids make the rest


def sub_options(o: SubscriptionOptions) -> SubOptions:
    """The node's options for `o`, one shared (frozen) object per distinct set:
    a replay of a million subscriptions holds a handful, not a million."""
    key = (o.qos, o.no_local, o.retain_as_published, o.subscription_id)
    opts = _SUB_OPTIONS.get(key)
    if opts is None:
        opts = SubOptions.of(*key)
        if len(_SUB_OPTIONS) < SUB_OPTIONS_CACHE:
            _SUB_OPTIONS[key] = opts
    return opts


def retained_message(e: RetainedSet) -> Message:
    props = Properties(
        payload_format_indicator=e.payload_format_indicator,
        content_type=e.content_type,
        response_topic=e.response_topic,
        correlation_data=e.correlation_data,
        user_property=e.user_property,
    )
    return Message(
        topic=e.topic,
        payload=e.payload,
        qos=e.qos,
        retain=True,
        properties=props,
        sender=e.sender,
        expires_at_ms=e.expires_at_ms,
    )


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The garbage collector off while a start builds its state: replay builds
    millions of objects and frees few, so generational passes over the growing
    heap would cost about a third of the time. What was built is then frozen
    (kept out of later collections, as the node does after start anyway).
    Nested pauses are one pause (the outer one turns the collector back on)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
        gc.freeze()
    finally:
        if collecting:
            gc.enable()


class LogState:
    def __init__(
        self,
        *,
        table: RoutingTable,
        expiries: Expiries,
        events: EventLog,
        retained: RetainStore,
        store: SessionStore,
        spawn: Callable[[Coroutine[Any, Any, Any]], object],
        metrics: Metrics | None = None,
    ) -> None:
        self.table = table
        self.metrics = metrics if metrics is not None else Metrics()
        self.expiries = expiries
        self.retained = retained
        self.store = store
        self.spawn = spawn
        self.events = events
        self.view = ClusterView(self._on_subscribe, self._on_unsubscribe, self._on_subscribe_many)
        self._tail: asyncio.Task[None] | None = None

    # -- the one path -------------------------------------------------------

    def apply(self, event: Event) -> bool:
        """Fold `event` into the view and the broker; never raises."""
        try:
            changed = self.view.apply(event)
            if changed:
                if isinstance(event, RetainedSet):
                    self.retained.set(retained_message(event))
                elif isinstance(event, RetainedCleared):
                    self.retained.clear(event.topic)
                elif not isinstance(event, Subscribed | Unsubscribed):
                    self._session_changed(event)
            return changed
        except Exception:
            log.exception("applying %s failed", type(event).__name__)
            return False

    async def append(self, event: Event) -> None:
        """Append to the log (every part's appends come here); a failure is
        counted (`eventlog_produce_failures`, the eventlog_unavailable alarm)
        and raised (EventLogError)."""
        try:
            await self.events.append(event)
        except EventLogError:
            self.metrics.eventlog_produce_failures += 1
            raise

    async def append_until_logged(self, event: Event, what: str) -> None:
        """Append, again every RELOG_S until the log takes it or closes: for an
        event already applied here (a session's end), which the log must get or
        this node's view and the log disagree for good. A late copy is harmless:
        every view applies a client's events by version."""
        while True:
            try:
                await self.append(event)
                return
            except EventLogClosed:
                return
            except EventLogError as exc:
                log.warning("%s not logged yet: %s; again in %.0f s", what, exc, RELOG_S)
            await asyncio.sleep(RELOG_S)  # the log's outage, not a race: nothing to wait on

    async def append_and_apply(self, event: Event) -> None:
        """Append (raises EventLogError when the log cannot take it), then apply."""
        await self.append(event)
        self.apply(event)

    def _on_subscribe(self, client_id: str, filter_: str, options: SubscriptionOptions) -> None:
        opts = sub_options(options)
        table = self.table
        table.trie.add(filter_, client_id, opts, checked=True)  # validated at SUBSCRIBE
        table.invalidate_plans()
        session = table.sessions.get(client_id)
        if session is not None:
            table.subs_added(session, ((filter_, opts),))

    def _on_subscribe_many(
        self, client_id: str, items: list[tuple[str, SubscriptionOptions]]
    ) -> None:
        """One client's subscriptions from a snapshot: `_on_subscribe` in bulk."""
        cached = _SUB_OPTIONS.get  # sub_options(o), inlined for the usual hit
        pairs = [
            (f, cached((o.qos, o.no_local, o.retain_as_published, o.subscription_id))
             or sub_options(o))
            for f, o in items
        ]  # fmt: skip
        table = self.table
        table.trie.add_many(client_id, pairs, checked=True)
        table.invalidate_plans()
        session = table.sessions.get(client_id)
        if session is not None:
            table.subs_added(session, pairs)

    def _on_unsubscribe(self, client_id: str, filter_: str) -> None:
        table = self.table
        table.trie.remove(filter_, client_id)
        table.invalidate_plans()
        session = table.sessions.get(client_id)
        if session is not None:
            table.sub_removed(session, filter_)

    def _session_changed(self, event: SessionEvent) -> None:
        """Keep a local Session for every persistent session the log shows
        offline, or resumed on this node: the tail can bring this node's own
        SessionOpened before its append returns to the CONNECT that logged it
        (`cm`), and until that CONNECT's session is in the table, publishes
        here must still reach the session's queue (the plan sends a client
        without a local session to the node the view names: this one)."""
        client_id = event.client_id
        entry = self.view.session(client_id)
        table = self.table
        local = table.sessions.get(client_id)
        if entry is not None and entry.persistent and not entry.online:
            if local is None:
                session = self._offline_session(client_id, entry.expiry_s)
                self._expire_later(session, entry.expires_at_ms)
            return
        resumed_here = isinstance(event, SessionOpened) and not event.clean_start
        if resumed_here and entry is not None and entry.persistent and entry.node == table.node_id:
            if local is None:
                self._offline_session(client_id, entry.expiry_s)  # the CONNECT attaches it
            return
        moved = entry is not None and entry.online and entry.node != table.node_id
        if moved and local is not None and local.conn is not None:
            # A newer connection elsewhere: ours goes (a clean session has no
            # epoch to compare across nodes; this keeps one connection per client).
            table.take_over(local)
        ended = entry is None and local is not None and local.durable
        if local is not None and local.conn is None and (moved or ended):
            self.expiries.cancel(local)  # the log has its end, or it lives elsewhere
            del table.sessions[client_id]
            table.invalidate_plans()

    def _offline_session(self, client_id: str, expiry_s: int) -> Session:
        table = self.table
        subs = {f: sub_options(o) for f, o in self.view.subscriptions(client_id).items()}
        session = Session(client_id, expiry_s=expiry_s, durable=True, subs=subs)
        table.sessions[client_id] = session
        table.mark_durable(client_id)
        table.invalidate_plans()
        return session

    def _expire_later(self, session: Session, expires_at_ms: int | None) -> None:
        """Expire a recovered offline session when the log says it ends."""
        if expires_at_ms is None or session.expiry_s >= NEVER_EXPIRES:
            return
        delay_s = max(0.0, (expires_at_ms - now_ms()) / 1000)
        self.expiries.later(session, delay_s, session.epoch)

    # -- start: replay, then tail ------------------------------------------------

    async def replay(self) -> int:
        """Read the log to its end into the view and the broker (`gc_paused`)."""
        await self.events.start()
        started = time.monotonic()
        with gc_paused():
            count = await self.events.replay(self.apply)
        log.info("replayed %d events in %.2f s", count, time.monotonic() - started)
        return count

    def after_replay(self) -> None:
        node_id = self.table.node_id
        for client_id, entry in self.view.sessions().items():
            if entry.node != node_id or not entry.online:
                continue
            if entry.persistent:
                session = self.table.sessions.get(client_id)
                if session is None:
                    session = self._offline_session(client_id, entry.expiry_s)
                self.table.renew(session, entry.epoch)
                self._expire_later(session, now_ms() + entry.expiry_s * 1000)
            self.spawn(
                self._closed_by_restart(client_id, entry.epoch, entry.expiry_s, entry.version)
            )

    async def _closed_by_restart(
        self, client_id: str, epoch: int, expiry_s: int, version: int
    ) -> None:
        try:
            if expiry_s > 0:
                version = await self.store.next_version(client_id, epoch)
                await self.store.release(client_id, epoch, expiry_s)
            else:
                version = max(version + 1, time.time_ns() // 1000)
            event = SessionClosed(
                client_id=client_id,
                version=version,
                node=self.table.node_id,
                ts_ms=now_ms(),
                reason="error",
                expiry_s=expiry_s,
            )
            await self.append_and_apply(event)
        except (SessionError, EventLogError) as exc:
            log.warning("could not log the end of %s's previous connection: %s", client_id, exc)

    def start_tail(self) -> None:
        """Follow the log from where replay ended; from now on the view
        forgets the longest-ended clients past ENDED_KEPT (its rule 4)."""
        self.view.keep_ended = ENDED_KEPT
        forgotten = self.view.forget_ended()
        if forgotten:
            log.info("forgot %d clients whose sessions ended long ago", forgotten)
        self._tail = asyncio.get_running_loop().create_task(self._run_tail())

    async def _run_tail(self) -> None:
        try:
            await self.events.tail(self.apply)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("event log tail stopped")

    async def stop_tail(self) -> None:
        task, self._tail = self._tail, None
        await cancel_and_wait(task)
