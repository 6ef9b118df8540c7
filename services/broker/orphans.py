"""A dead node's sessions and wills, taken over by a survivor (DESIGN 5).

Theory of operation. When membership reports a node dead (its heartbeat
lapsed: within the membership TTL plus one poll), every survivor runs
`node_died`:

- persistent sessions the dead node held online (found in the session
  store, which outlives the node): each is adopted, i.e. taken offline
  under epoch + 1 in one Lua step, so exactly one survivor wins it and a
  late write of the dead node fails its epoch check; the winner logs its
  SessionClosed (reason "nodedown", the session's expiry), so every node's
  directory shows it offline and its queue keeps filling until the client
  comes back on any node (or the session expires: logged by the winner);
- clean sessions the log shows online on the dead node (they lived in its
  memory only): a SessionClosed with expiry 0, so their subscriptions and
  routes disappear everywhere; two survivors racing log the same end twice,
  which the view folds as one;
- wills the dead node was to publish: adopted (`Wills.adopt_from`), each
  by one survivor, and published when due, will delay included. Wills go
  first (they are what others wait for), then the sessions; each kind runs
  TAKEOVER_WIDTH items at once, so a store call or a log append is not one
  round trip per session in a row (5,000 sessions took 20 s that way).

A step that fails (store or log down) is retried every RETRY_S until it
succeeds or the node comes back. A node restarted under the same id
within the TTL is not reported dead: it ends its previous run's sessions
itself (`LogState.after_replay`) and adopts its own wills (`restarted`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from services.broker.logstate import LogState
from services.broker.ports import now_ms
from services.broker.wills import TAKEOVER_WIDTH, Wills
from services.event.api import EventLogError
from services.event.schema import SessionClosed
from services.session.api import SessionError, SessionStore
from services.tasks import each

if TYPE_CHECKING:
    from services.cluster.router import ClusterRouter

log = logging.getLogger("weir.orphans")

RETRY_S = 2.0  # a takeover step the store or the log refused is tried again after this


class Orphans:
    def __init__(
        self,
        *,
        node_id: str,
        cluster: ClusterRouter | None,
        store: SessionStore,
        wills: Wills,
        logstate: LogState,
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
    ) -> None:
        self.node_id = node_id
        self.cluster = cluster
        self.store = store
        self.wills = wills
        self.logstate = logstate
        self.spawn = spawn
        self.taken_over: dict[str, tuple[int, int, int]] = {}  # dead -> sessions, clean, wills
        self.dead: set[str] = set()  # nodes seen dead: their offline sessions' expiry is ours

    def alive(self, node_id: str) -> bool:
        """Whether membership shows the node live (again)."""
        return self.cluster is not None and node_id in self.cluster.peers()

    def node_died(self, dead: str) -> None:
        if dead != self.node_id:
            self.dead.add(dead)
            self.spawn(self._take_over(dead))

    def node_joined(self, node_id: str) -> None:
        self.dead.discard(node_id)

    def restarted(self) -> None:
        """This node started again: the wills its previous run was to publish."""
        self.spawn(self._wills_of(self.node_id))

    async def _take_over(self, dead: str) -> None:
        started = time.monotonic()
        while not self.alive(dead):
            try:  # wills first: they are what the dead node's clients' peers wait for
                wills = await self.wills.adopt_from(dead)
                sessions = await self._sessions_of(dead)
                clean = await self._clean_sessions_of(dead)
            except (SessionError, EventLogError) as exc:
                log.warning("taking over node %s: %s; retrying in %.0f s", dead, exc, RETRY_S)
                await asyncio.sleep(RETRY_S)  # a retry interval, not a synchronisation
                continue
            self.taken_over[dead] = (sessions, clean, wills)
            log.info(
                "node %s died: took over %d persistent sessions, ended %d clean ones, "
                "adopted %d wills (%.2f s)",
                dead, sessions, clean, wills, time.monotonic() - started,
            )  # fmt: skip
            return

    async def _sessions_of(self, dead: str) -> int:
        async def adopt(client_id: str) -> bool:
            if self.alive(dead):
                return False  # it came back: what is online there now is its own
            adopted = await self.store.adopt(client_id, dead)
            if adopted is None:
                return False  # resumed elsewhere, or another survivor won it
            await self.logstate.append_and_apply(
                SessionClosed(
                    client_id=client_id,
                    version=adopted.version,
                    node=self.node_id,
                    ts_ms=now_ms(),
                    reason="nodedown",
                    expiry_s=adopted.expiry_s,
                )
            )
            return True

        return await each(await self.store.orphans(dead), adopt, TAKEOVER_WIDTH)

    async def _clean_sessions_of(self, dead: str) -> int:
        gone = [
            (client_id, entry.version)
            for client_id, entry in self.logstate.view.sessions().items()
            if entry.node == dead and entry.online and entry.expiry_s == 0
        ]

        async def end(item: tuple[str, int]) -> bool:
            client_id, version = item
            await self.logstate.append_and_apply(
                SessionClosed(
                    client_id=client_id,
                    version=max(version + 1, time.time_ns() // 1000),
                    node=self.node_id,
                    ts_ms=now_ms(),
                    reason="nodedown",
                    expiry_s=0,
                )
            )
            return True

        return await each(gone, end, TAKEOVER_WIDTH)

    async def _wills_of(self, node: str) -> None:
        while True:
            try:
                count = await self.wills.adopt_from(node)
            except SessionError as exc:
                log.warning("wills of the previous run not adopted yet: %s", exc)
                await asyncio.sleep(RETRY_S)  # a retry interval, not a synchronisation
                continue
            if count:
                log.info("adopted %d wills of this node's previous run", count)
            return
