"""An offline session's end: its timer fires, and its expiry is logged once.

Theory of operation. The connection manager (for a session whose connection
ended here) and the log projection (for a session it recovered) set an
offline session's end timer through the `ports.Expiries` port; this part
serves that port. When a timer fires and the session is still offline at
the same epoch, it leaves the routing table at once (`_expire`), and its
expiry is logged exactly once (`_expired`): by the node it was last on (the
others only drop it; a dead node's: every survivor's), only if nobody
claimed it again, and retried until the session store and the log have
taken it. A shared member's unacknowledged copies then go to the other
members of their groups: read before its state is discarded, or, if the
store's own expiry came first, from what the store keeps of an expired
session for a grace period (`QueueStore.leftovers`, taken once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Set
from typing import Any

from services.broker.logstate import LogState
from services.broker.ports import Expiries, Session, now_ms
from services.broker.routes import Routes
from services.broker.seams import Seams
from services.broker.shared import Shared, hand_over_left
from services.event.api import EventLogError
from services.event.schema import SessionExpired
from services.mqtt.packets import Message
from services.queue.api import QueueStore
from services.session.api import Fenced, SessionError, SessionStore

log = logging.getLogger("weir.cm")  # the connection manager's log, as before the split

EXPIRY_RETRY_S = 5.0  # an expiry the store or the log did not take is tried again after this


class Expiry:
    def __init__(
        self,
        *,
        node_id: str,
        expiries: Expiries,
        routes: Routes,
        logstate: LogState,
        store: SessionStore,
        queue: QueueStore,
        loop: asyncio.AbstractEventLoop,
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
        seams: Seams,
        dead: Set[str],
        shared: Shared,
    ) -> None:
        self.node_id = node_id
        self.routes = routes
        self.logstate = logstate
        self.store = store
        self.queue = queue
        self.loop = loop
        self.spawn = spawn
        self.seams = seams
        self.shared = shared  # an expiring member's shared copies go to the others
        self.dead = dead  # nodes seen dead (`orphans`): their sessions' expiry is ours too
        expiries.serve(self._expire)

    def _expire(self, session: Session, epoch: int) -> None:
        if session.conn is None and session.epoch == epoch:
            self.routes.drop(session)
            self.spawn(self._expired(session.client_id, epoch))

    async def _expired(self, client_id: str, epoch: int) -> None:
        """Log the expiry of an offline session, exactly once (see the module
        docstring). `epoch` is 0 for a session recovered from the log (its
        epoch is not there): Redis says which epoch is current."""
        entry = self.logstate.view.session(client_id)
        if entry is None or entry.online:
            return  # ended or reclaimed in the log already
        if entry.node != self.node_id and entry.node not in self.dead:
            return  # another node's to log (a dead node's: every survivor's)
        what = "the session store"
        try:
            version = await self._expiry_version(client_id, epoch, entry.version)
            if version is None:
                return  # claimed again meanwhile: not expired
            event = SessionExpired(
                client_id=client_id, version=version, node=self.node_id, ts_ms=now_ms()
            )
            what = "the event log"
            await self.logstate.append_and_apply(event)
            self.seams.metrics.sessions_expired += 1
            self.seams.hooks.run("session.terminated", client_id, "expired")
        except (SessionError, EventLogError) as exc:
            log.warning(
                "expiry of session %s not logged yet (%s failed: %s); retrying in %.0f s",
                client_id, what, exc, EXPIRY_RETRY_S,
            )  # fmt: skip
            self.loop.call_later(
                EXPIRY_RETRY_S, lambda: self.spawn(self._expired(client_id, epoch))
            )

    async def _hand_over_leftovers(self, client_id: str) -> None:
        """What the store kept of an expired session (its grace): the shared
        copies to other members, once (whoever takes them first)."""
        try:
            left = await self.queue.leftovers(client_id)
        except SessionError as exc:
            self.seams.metrics.shared_redispatch_failed += 1
            log.warning("shared copies of expired %s not redispatched (lost): %s", client_id, exc)
            return
        by_group: dict[tuple[str, str], list[Message]] = {}
        for message in left:
            if message.share is not None:
                by_group.setdefault(message.share, []).append(message)
        for (group, topic_filter), messages in by_group.items():
            self.shared.redispatch(group, topic_filter, messages, client_id)

    async def _expiry_version(self, client_id: str, epoch: int, logged: int) -> int | None:
        """The SessionExpired event's version, ending the session in the store;
        None if someone claimed it again. Redis expires the keys itself at the
        same moment, so a fenced write is looked at again: gone is expired."""
        for _ in range(2):
            info = await self.store.get(client_id)
            if info is not None and (info.online or (epoch and info.epoch != epoch)):
                return None
            if info is None:  # the store's own expiry came first: its leftovers
                await self._hand_over_leftovers(client_id)
                return max(logged + 1, time.time_ns() // 1000)
            try:
                version = await self.store.next_version(client_id, info.epoch)
                metrics = self.seams.metrics
                await hand_over_left(self.shared, self.queue, client_id, info.epoch, metrics)
                await self.queue.discard(client_id, info.epoch)
            except Fenced:
                continue  # expired by Redis, or claimed, between the read and the write
            return version
        return None
