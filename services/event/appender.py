"""The event log's appends to Kafka: the producer side of `services.event.kafka`.

Theory of operation.

Append: one idempotent producer (`acks=all`, `murmur2_random` so keys land
where Java clients put them). `produce` only queues. The event loop polls
the producer (no thread): every FAST_POLL_S while records wait for their
delivery reports, every POLL_INTERVAL_S otherwise (errors, statistics).
A report only notes its future and outcome in `_reports` (a deque: a poll
on another thread, `append_all`'s or a stop's flush, may serve it too);
the loop settles them after each poll, all at once. A poll thread that
handed each report to the loop (`call_soon_threadsafe`) took the GIL from
the busy loop once per record and woke it once per record: 19,000 session
ends at once (clients leaving together) cost the loop 80-100 us each and
held it up for seconds, long enough to starve the node's heartbeat. The
wait is bounded (`append_timeout_s`): past it `append` raises
EventLogUnavailable while the record stays queued (it may still land;
versions make that harmless). After such a timeout, until a record is
acknowledged again (any record, one whose wait was given up too), the
bound is DOWN_APPEND_TIMEOUT_S: a node cut off from Kafka refuses what
needs the log at once instead of after the full bound.
The producer queue is bounded (`max_pending` records): a full queue raises
EventLogBackpressure at once instead of growing memory. A fatal producer
error (an idempotent producer that lost its broker's state, e.g. an
embedded broker restart) fails the waiting appends and the next append
builds a new producer (one rebuild at a time; a retired producer is no
longer polled by the loop).

Bulk (`append_all`: a re-seed's hundreds of thousands of events): produced
from a worker thread, each record's delivery report noting only where it
landed (no future, no loop callback: those were most of a re-seed's time),
then waited for as a whole, bounded by `append_timeout_s` without progress.
A full producer queue there waits for delivery reports instead of raising.

Warm-up (`warm`, before the node opens its listeners): an idempotent
producer sends nothing until the broker has given it a producer id, which
librdkafka asks for on a 500 ms timer once a broker connection is up, so a
producer made at start gets its id about 0.5 s later and the first CONNACK
used to wait for it. librdkafka says when the id is there only in its
statistics (`eos.idemp_state`), so the producer reports them every
STATS_INTERVAL_MS and `warm` waits for "Assigned"; then it asks for the
three topics' metadata through the producer. Nothing is written to the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException, Producer

from services.event.api import EventLogBackpressure, EventLogUnavailable, Placements, placements
from services.event.schema import Event, encode

log = logging.getLogger("weir.event.kafka")

POLL_INTERVAL_S: Final = 0.05  # the producer's poll period while no append waits
FAST_POLL_S: Final = 0.001  # ... and while records wait for their reports (a timer tick)
# How long an append waits while the log is known down (the last append timed out
# and none was acknowledged since): a node cut off from Kafka refuses CONNECT and
# SUBSCRIBE (they need the log) within this, not the full append bound, and each
# such append still produces its record, so the first one acknowledged again
# (the log is back) ends the state.
DOWN_APPEND_TIMEOUT_S: Final = 0.5
# Consecutive append timeouts after which the producer is rebuilt. An idempotent
# producer whose broker forgot its id (a restarted embedded broker) retries
# forever without reporting an error; a new producer gets a new id.
REBUILD_AFTER_TIMEOUTS: Final = 3
# librdkafka's statistics period: how soon `warm` learns the producer has its
# id (a start waits at most this much longer than it must). The reports go on
# for the producer's life (librdkafka cannot stop them): a 2-3 KiB JSON text
# ten times a second, which the callback drops unread once the producer is warm.
STATS_INTERVAL_MS: Final = 100


class _Expired(Exception):
    """An append's wait passed its bound (`Appender._expire`)."""


Report = tuple[asyncio.Future[None], KafkaError | None]  # a record's future, its error


def _count(landed: dict[Any, list[int]], failed: list[Any]) -> int:
    return sum(map(len, list(landed.values()))) + len(failed)


class Appender:
    """One producer at a time for the log's topics; `ensure_topics` is awaited
    before a producer is made, `forget_topics` called when one failed."""

    def __init__(
        self,
        bootstrap: str,
        topic_prefix: str,
        topics: tuple[str, ...],
        append_timeout_s: float,
        max_pending: int,
        linger_ms: int,
        producer_config: Mapping[str, Any],
        ensure_topics: Callable[[], Awaitable[None]],
        forget_topics: Callable[[], None],
    ) -> None:
        self.bootstrap = bootstrap
        self.topic_prefix = topic_prefix
        self.topics = topics
        self.append_timeout_s = append_timeout_s
        self.max_pending = max_pending
        self.linger_ms = linger_ms
        self.producer_config = producer_config
        self._ensure_topics = ensure_topics
        self._forget_topics = forget_topics
        self._producer: Producer | None = None
        self._producer_failed = False
        self._warm = threading.Event()  # set by the stats callback of the current producer
        self._timeouts = 0
        self._down = False  # the last append timed out and none was acknowledged since
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop that polls (`start`'s)
        self._polling = 0  # the slow polls' round: one per producer made or loop adopted
        self._fast_poll: asyncio.TimerHandle | None = None  # the next poll while appends wait
        self._deadlines: list[tuple[float, int, asyncio.Future[None]]] = []  # a heap, by loop time
        self._appended = 0  # appends made: the heap's tie-break
        self._reports: deque[Report] = deque()  # noted by the reports of a poll, settled after it
        self._waiting: set[asyncio.Future[None]] = set()
        self._renewing = asyncio.Lock()  # one rebuild at a time (`_renew`)

    async def start(self) -> None:
        """The topics, then the producer, unless there is one."""
        await self._ensure_topics()
        if self._producer is None:
            self._producer = self._make_producer()
            self._adopt(asyncio.get_running_loop())

    def _make_producer(self) -> Producer:
        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",
            "linger.ms": self.linger_ms,
            "queue.buffering.max.messages": self.max_pending,
            "error_cb": self._on_error,
            "statistics.interval.ms": STATS_INTERVAL_MS,
            "logger": log,
            **self.producer_config,
        }
        warm = self._warm = threading.Event()
        config["stats_cb"] = partial(self._on_stats, warm)
        producer = Producer(config)
        self._producer_failed = False
        self._timeouts = 0
        return producer

    # -- polling, on the loop --------------------------------------------

    def _adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        """Poll on `loop` from now on (a producer made, or used from another loop)."""
        if loop is not self._loop:  # a fast poll pending on the old loop is not ours
            self._fast_poll = None
        self._loop = loop
        self._polling += 1
        if self._producer is not None:
            loop.call_soon(self._poll_slow, self._polling)

    def _poll_slow(self, polling: int) -> None:
        """Every POLL_INTERVAL_S while `polling` is the current round (a new
        producer or loop starts another): the producer's errors, statistics
        and logs, and any report left. The timer holds no producer: a closed
        one must go (its sockets with it) though a timer is still pending."""
        producer = self._producer
        if polling != self._polling or producer is None or self._loop is None:
            return
        self._serve(producer)
        self._loop.call_later(POLL_INTERVAL_S, self._poll_slow, polling)

    def _poll_fast(self) -> None:
        """Every FAST_POLL_S while appends wait (an append starts it): their
        reports, and the waits past their bound ended (`_expire`)."""
        self._fast_poll = None
        loop = self._loop
        if loop is None:
            return
        if self._producer is not None:
            self._serve(self._producer)
        elif self._reports:  # a stop's flush served them
            self._settle()
        if self._waiting:
            self._expire(loop.time())
            self._fast_poll = loop.call_later(FAST_POLL_S, self._poll_fast)
        else:
            self._deadlines.clear()  # all settled

    def _expire(self, now: float) -> None:
        """The waits whose bound passed end with `_Expired`: one heap for all
        of them, checked by the fast poll. A timer per append (asyncio.timeout)
        cost 12 us of the loop's time each, 25 us under uvloop."""
        deadlines = self._deadlines
        while deadlines:  # the settled ones at the top go too (they hold their futures)
            deadline, _, fut = deadlines[0]
            if not fut.done():
                if deadline > now:
                    break
                fut.set_exception(_Expired())
            heapq.heappop(deadlines)

    def _serve(self, producer: Producer) -> None:
        producer.poll(0)
        if self._reports:
            self._settle()

    def _settle(self) -> None:
        """The reports noted since the last settle, at once (on the loop)."""
        acknowledged = False
        pop = self._reports.popleft  # deque: thread-safe append / popleft
        with contextlib.suppress(IndexError):
            while True:
                fut, err = pop()
                if err is None:
                    acknowledged = True
                    if not fut.done():
                        fut.set_result(None)
                elif not fut.done():
                    fut.set_exception(EventLogUnavailable(f"event log: delivery failed: {err}"))
        if acknowledged:  # the log takes records: whoever gave up waiting, it is up
            self._down = False
            self._timeouts = 0

    @staticmethod
    def _on_stats(warm: threading.Event, stats: str) -> None:
        if warm.is_set():
            return
        with contextlib.suppress(ValueError, AttributeError):
            if json.loads(stats).get("eos", {}).get("idemp_state") == "Assigned":
                warm.set()

    @property
    def warmed(self) -> bool:
        """The current producer has its id: an append goes out at once."""
        return self._producer is not None and self._warm.is_set()

    async def warm(self) -> None:
        """Return once an append would not wait for the producer's id (bounded)."""
        await self.start()
        if not await asyncio.to_thread(self._warm.wait, self.append_timeout_s):
            log.warning(
                "event log: no producer id within %s s; the first append waits for it",
                self.append_timeout_s,
            )
            return
        await asyncio.to_thread(self._topic_metadata)

    def _topic_metadata(self) -> None:
        """Ask for the topics' metadata now rather than at their first produce."""
        producer = self._producer
        if producer is None:
            return
        for topic in self.topics:
            try:
                producer.list_topics(topic, timeout=self.append_timeout_s)
            except KafkaException as exc:  # the first append will ask again
                log.warning("event log: no metadata for %s yet: %s", topic, exc)

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            log.error("event log producer failed: %s", err)
            self._producer_failed = True

    def _detach(self) -> Producer | None:
        """Take the producer out of use: the loop polls it no more."""
        retired, self._producer = self._producer, None
        return retired

    @staticmethod
    def _purge(producer: Producer | None) -> None:
        """Abandon what a failed producer still holds (callers were told); blocks."""
        if producer is not None:
            producer.purge()
            producer.flush(0)

    async def _renew(self) -> None:
        """Retire a failed producer and make a new one, one append at a time:
        appends that found the same failure wait for the first one's rebuild
        (two rebuilding at once made two producers, and an append could wait
        on the one retired: its event was never logged)."""
        async with self._renewing:
            if self._producer_failed:
                await asyncio.to_thread(self._purge, self._detach())
                self._forget_topics()  # a broker that forgot us may have forgotten them too
                for waiting in self._waiting:
                    if not waiting.done():
                        waiting.set_exception(EventLogUnavailable("event log producer failed"))
            if self._producer is None:
                await self.start()

    async def _ready_producer(self) -> Producer:
        """The producer to append with: a new one after a fatal error (`_renew`)."""
        if self._producer_failed or self._producer is None:
            await self._renew()
        assert self._producer is not None
        return self._producer

    async def append(self, event: Event) -> None:
        producer = await self._ready_producer()
        suffix, key, value = encode(event)
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._adopt(loop)
        fut: asyncio.Future[None] = loop.create_future()
        try:
            producer.produce(
                self.topic_prefix + suffix,
                key=key.encode(),
                value=value,
                on_delivery=partial(self._delivered, fut),
            )
        except BufferError:
            raise EventLogBackpressure(
                f"event log: {self.max_pending} records already waiting"
            ) from None
        except KafkaException as exc:
            raise EventLogUnavailable(f"event log: produce failed: {exc}") from None
        if self._fast_poll is None:
            self._fast_poll = loop.call_later(FAST_POLL_S, self._poll_fast)
        self._waiting.add(fut)
        bound = min(DOWN_APPEND_TIMEOUT_S, self.append_timeout_s) if self._down else None
        self._appended += 1
        deadline = loop.time() + (bound or self.append_timeout_s)
        heapq.heappush(self._deadlines, (deadline, self._appended, fut))
        try:
            await fut
            self._timeouts = 0
            self._down = False
        except _Expired:
            self._timeouts += 1
            self._down = True
            if self._timeouts >= REBUILD_AFTER_TIMEOUTS:
                log.warning(
                    "event log: %d appends timed out; rebuilding the producer", self._timeouts
                )
                self._producer_failed = True
            raise EventLogUnavailable(
                f"event log: no acknowledgement within {bound or self.append_timeout_s} s"
            ) from None
        finally:
            self._waiting.discard(fut)

    async def append_all(self, events: Sequence[Event]) -> Placements:
        """Produce `events` from a thread, with no future or loop callback
        per record (`append`'s cost, 130 us each, was most of a re-seed's),
        then wait for their delivery reports; bounded by `append_timeout_s`
        without progress."""
        producer = await self._ready_producer()
        return await asyncio.to_thread(self._produce_all, producer, events)

    def _produce_all(self, producer: Producer, events: Sequence[Event]) -> Placements:
        # Written by whichever thread polls: setdefault and append are atomic.
        landed: dict[tuple[str, int], list[int]] = {}
        failed: list[KafkaError] = []

        def delivered(err: KafkaError | None, msg: Any) -> None:
            if err is None:
                landed.setdefault((msg.topic(), msg.partition()), []).append(msg.offset())
            else:
                failed.append(err)

        prefix = self.topic_prefix
        for event in events:
            suffix, key, value = encode(event)
            while True:
                try:
                    producer.produce(
                        prefix + suffix, key=key.encode(), value=value, on_delivery=delivered
                    )
                    break
                except BufferError:  # the queue is full: serve delivery reports meanwhile
                    self._await_progress(producer, landed, failed, _count(landed, failed) + 1)
                except KafkaException as exc:
                    raise EventLogUnavailable(f"event log: produce failed: {exc}") from None
        self._await_progress(producer, landed, failed, len(events))
        if failed:
            raise EventLogUnavailable(
                f"event log: {len(failed)} of {len(events)} records not delivered: {failed[0]}"
            )
        return placements(landed)

    def _await_progress(
        self, producer: Producer, landed: dict[Any, list[int]], failed: list[Any], reports: int
    ) -> None:
        """Until `reports` delivery reports came; EventLogUnavailable after
        `append_timeout_s` without a new one."""
        seen, since = -1, time.monotonic()
        while (done := _count(landed, failed)) < reports:
            if done != seen:
                seen, since = done, time.monotonic()
            elif time.monotonic() - since > self.append_timeout_s:
                raise EventLogUnavailable(
                    f"event log: {reports - done} records not acknowledged within "
                    f"{self.append_timeout_s} s"
                )
            producer.poll(POLL_INTERVAL_S)

    def _delivered(self, fut: asyncio.Future[None], err: KafkaError | None, _: Any) -> None:
        """A record's report, in a poll on any thread: noted, settled on the loop."""
        self._reports.append((fut, err))

    def close(self) -> None:
        """Flush what is queued (bounded by the append timeout), then stop (any
        thread); the reports the flush served are settled on the loop."""
        producer = self._detach()
        if producer is None:
            return
        producer.flush(self.append_timeout_s)
        if self._reports and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is gone; nobody waits
                self._loop.call_soon_threadsafe(self._settle)
