"""The embedded default's state store, kept current by the nodes themselves.

Theory of operation. The embedded Kafka keeps its log in memory (DESIGN
10), so what a restart of `weir up` must find again (sessions, their
subscriptions, retained messages) has to be somewhere durable by the time a
client is told it happened. `WriteThroughLog` wraps the node's event log:
an append returns only after the log acknowledged the event AND the event
was written into the state store in Redis (whose AOF keeps it across a
stop or a SIGKILL). The node SUBACKs, CONNACKs and PUBACKs a retained
message after `append` returns, so nothing acknowledged is lost with the log.

The store is the one the Spark job keeps (streams/statestore.py), written
by the same script, `state_apply.lua`, with the same rows: the newest
event per key wins by version (DESIGN 3), session ends (`ends_session`,
the reference fold's rule 2) raise the client's floor. So the embedded
default folds by the same rule as the Spark job and the node's
`ClusterView`, and a starting node loads and re-seeds from it unchanged
(`services.node.bootstrap`). Appends that wait at the same moment share
one script call (group commit): a re-seed or a burst of connects costs a
call per loop turn, not per event.

Bounded: the store would keep every client id ever seen (its last session
event, version and floor). The node's own view forgets the longest-ended
clients and cleared topics past its bound (ClusterView rule 4); its
`on_forget` hook reaches `forget`, which deletes them from the store too
(`state_forget.lua`, only if nothing newer came since). So the store holds
what the view holds: live and offline-persistent sessions, live
subscriptions, retained messages, and a bounded tail of ended clients.

The store's offsets: the single `weir up`, the log's only writer, records
the positions it has read once everything below them is in the store
(`record_offsets`, every few seconds: services.node.logcut), which is what
`weir streams verify` compares the store at. Nodes of `--nodes` do not (one
cannot know that another's acknowledged events are in the store yet): a
node of theirs that restarts while the log lives replays the whole log
over the store, which the version rule makes harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from importlib import resources
from typing import Any, Final, TypeAlias, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from services.event.api import EventLog, EventLogUnavailable, Handler, Offsets, Placements
from services.event.schema import (
    Event,
    RetainedCleared,
    RetainedSet,
    Subscribed,
    Unsubscribed,
    encode,
)
from services.state.keys import state_keys
from services.state.view import ends_session
from services.store.errors import StoreUnavailable
from services.store.redis import bounded, load_script

log = logging.getLogger("weir.statewriter")

WRITE_TIMEOUT_S: Final = 5.0  # a script call over a few thousand rows takes milliseconds
BATCH_ROWS: Final = 2000  # events per script call (~1 ms of Redis time), as the Spark job
FORGET_BATCH: Final = 500  # forgotten keys per call; rule 4 forgets one per ended client

T = TypeVar("T")


def subscription_value(e: Subscribed | Unsubscribed) -> str:
    """A subscription as the store keeps it: "version|live|qos|no_local|rap|rh|sid|ts_ms|node"
    (the Spark job's `sub_value`; `services.state.redis.parse_subscriptions` reads it)."""
    if isinstance(e, Unsubscribed):
        return f"{e.version}|0|0|0|0|0||{e.ts_ms}|{e.node}"
    sid = "" if e.subscription_id is None else str(e.subscription_id)
    flags = f"{int(e.no_local)}|{int(e.retain_as_published)}|{e.retain_handling}"
    return f"{e.version}|1|{e.qos}|{flags}|{sid}|{e.ts_ms}|{e.node}"


def script_args(events: list[Event]) -> list[Any]:
    """state_apply.lua's ARGV for `events`: its four row groups in order."""
    sessions: list[Any] = []
    floors: list[Any] = []
    subs: list[Any] = []
    retained: list[Any] = []
    for event in events:
        if isinstance(event, Subscribed | Unsubscribed):
            subs += (event.client_id, event.filter, event.version, subscription_value(event))
        elif isinstance(event, RetainedSet | RetainedCleared):
            retained += (event.topic, event.version, encode(event)[2])
        else:
            sessions += (event.client_id, event.version, event.node, encode(event)[2])
            if ends_session(event):
                floors += (event.client_id, event.version)
    counts = [len(sessions) // 4, len(floors) // 2, len(subs) // 4, len(retained) // 3, 0]
    return [*counts, "", 0, *sessions, *floors, *subs, *retained]


class StoreWriter:
    """Writes events into the Redis state store; appends that wait together share a call."""

    def __init__(self, client: aioredis.Redis, topic_prefix: str) -> None:
        self.client = client
        self.keys = list(state_keys(topic_prefix).values())  # the scripts' KEYS order
        apply = resources.files("streams").joinpath("scripts", "state_apply.lua").read_text()
        self._apply = client.register_script(apply)
        self._forget = load_script(client, "services.state", "state_forget.lua")
        self._pending: list[tuple[Event, asyncio.Future[None]]] = []
        self._flushing: asyncio.Task[None] | None = None
        self._forgotten: list[str | int] = []
        self._forgotten_topics: list[str | int] = []
        self._forgetting: asyncio.Task[None] | None = None
        self.written = 0
        self.forgot = 0

    async def _call(self, call: Awaitable[T]) -> T:
        try:
            return await bounded(call, WRITE_TIMEOUT_S)
        except (StoreUnavailable, RedisError, OSError) as exc:
            raise EventLogUnavailable(f"state store: {exc}") from None

    async def write(self, event: Event) -> None:
        """Return once `event` is in the store (or raise EventLogUnavailable)."""
        await self.submit(event)

    def submit(self, event: Event) -> asyncio.Future[None]:
        """`write` as a future: done once `event` is in the store."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._pending.append((event, fut))
        if self._flushing is None or self._flushing.done():
            self._flushing = loop.create_task(self._flush())
        return fut

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # the appends of this loop turn join the batch
        while self._pending:
            batch, self._pending = self._pending[:BATCH_ROWS], self._pending[BATCH_ROWS:]
            try:
                args = script_args([e for e, _ in batch])
                await self._call(self._apply(keys=self.keys, args=args))
                self.written += len(batch)
                for _, fut in batch:
                    if not fut.done():
                        fut.set_result(None)
            except EventLogUnavailable as exc:
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)

    def forget(self, kind: str, key: str, version: int) -> None:
        """ClusterView's on_forget: delete the key from the store in the background."""
        target = self._forgotten if kind == "client" else self._forgotten_topics
        target += (key, version)
        if self._forgetting is None or self._forgetting.done():
            self._forgetting = asyncio.get_running_loop().create_task(
                self._forget_pending(), name="weir-state-forget"
            )

    async def _forget_pending(self) -> None:
        while self._forgotten or self._forgotten_topics:
            step = FORGET_BATCH * 2
            clients, self._forgotten = self._forgotten[:step], self._forgotten[step:]
            topics, self._forgotten_topics = (
                self._forgotten_topics[:step],
                self._forgotten_topics[step:],
            )
            args = [len(clients) // 2, len(topics) // 2, *clients, *topics]
            try:
                self.forgot += int(await self._call(self._forget(keys=self.keys, args=args)))
            except EventLogUnavailable as exc:  # best effort: the next start forgets again
                log.warning("could not forget ended clients in the state store: %s", exc)
                return

    async def write_offsets(self, positions: dict[tuple[str, int], int]) -> None:
        """Record `positions` as the offsets the store reflects (the Spark
        job's last call of a batch, without its rows)."""
        rows = [x for (topic, p), n in sorted(positions.items()) for x in (f"{topic}:{p}", n)]
        args = [0, 0, 0, 0, len(positions), "", 0, *rows]
        await self._call(self._apply(keys=self.keys, args=args))

    async def close(self) -> None:
        for task in (self._flushing, self._forgetting):
            if task is not None and not task.done():
                await asyncio.wait({task}, timeout=WRITE_TIMEOUT_S)


Renew: TypeAlias = Callable[[], Awaitable[EventLog]]


class WriteThroughLog:
    """An EventLog whose appends also land in the state store before they return.

    `held()` makes new appends wait and waits for those in flight: while it
    is held, the owner may replace `log` (the log cut: `renew` gives a new
    log on a restarted, empty embedded Kafka). `appended` counts the events
    appended to the current log."""

    def __init__(self, log: EventLog, writer: StoreWriter, renew: Renew | None = None) -> None:
        self.log = log
        self.writer = writer
        self.renew = renew
        self.append_timeout_s = log.append_timeout_s
        self.appended = 0
        self._open = asyncio.Event()
        self._open.set()
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._flights: set[asyncio.Future[None]] = set()

    async def start(self) -> None:
        await self.log.start()

    async def warm(self) -> None:
        await self.log.warm()

    async def append(self, event: Event) -> None:
        """Returns once the log acknowledged `event` and the store has it. The
        two writes run at once: the store's version rule makes its order moot
        (and versions are never reused: the session store hands them out), so
        an acknowledgement waits for the slower of the two, not for their sum.
        If either fails the caller is told (no SUBACK, CONNACK or PUBACK),
        whatever the other did: as with one write after the other, the event
        may then be in one of the two, which a client's retry makes whole."""
        async with self._flight():
            stored = self.writer.submit(event)  # a future, not a task: this path is per SUBSCRIBE
            try:
                await self.log.append(event)
            except BaseException:
                await asyncio.wait((stored,))  # moot now, but the flight lasts until it is known
                if not stored.cancelled():
                    stored.exception()  # retrieved: the log's failure is the one told
                raise
            self.appended += 1
            await stored

    async def append_all(self, events: Sequence[Event]) -> Placements:
        """The log's bulk append, then the store's (one script call per
        BATCH_ROWS). A re-seed, whose events come from the store, appends
        to `log` itself instead."""
        async with self._flight():
            placed = await self.log.append_all(events)
            self.appended += len(events)
            await asyncio.gather(*(self.writer.write(e) for e in events))
            return placed

    @contextlib.asynccontextmanager
    async def _flight(self) -> AsyncIterator[None]:
        """One append (or bulk): waits while `held`, counted in flight until
        done, its outcome a future `record_offsets` waits for."""
        while not self._open.is_set():
            await self._open.wait()
        self._inflight += 1
        self._idle.clear()
        flight: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flights.add(flight)
        try:
            yield
            flight.set_result(None)
        except BaseException as exc:
            flight.set_exception(EventLogUnavailable(f"not in the state store: {exc}"))
            flight.exception()  # retrieved: nobody need wait for it
            raise
        finally:
            self._flights.discard(flight)
            self._inflight -= 1
            if not self._inflight:
                self._idle.set()

    async def record_offsets(self) -> bool:
        """Write the log positions this node has read as the store's offsets,
        once every event below them is in the store: the appends in flight
        when the positions are taken (in the same step: an event read below
        them was acknowledged, so its append is done or among these) are
        waited for. False (nothing written) if one of them failed. For a
        node that is the log's only writer (the embedded default's single
        `weir up`): another node's acknowledged event may not be in the
        store yet."""
        positions = self.log.positions()
        # shielded: this wait cancelled (the log cut's task, at a stop) must not
        # cancel the appends' own outcomes, which they set when they end
        flights = [asyncio.shield(f) for f in self._flights]
        done = await asyncio.gather(*flights, return_exceptions=True)
        if not positions or any(isinstance(d, BaseException) for d in done):
            return False
        await self.writer.write_offsets(positions)
        return True

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """New appends wait until the block ends; the ones in flight end first."""
        self._open.clear()
        try:
            await self._idle.wait()
            yield
        finally:
            self._open.set()

    async def replay(self, handler: Handler, start: Offsets | None = None) -> int:
        return await self.log.replay(handler, start)

    async def is_empty(self) -> bool:
        return await self.log.is_empty()

    async def tail(self, handler: Handler) -> None:
        await self.log.tail(handler)

    def positions(self) -> dict[tuple[str, int], int]:
        return self.log.positions()

    async def close(self) -> None:
        await self.writer.close()
        await self.log.close()
