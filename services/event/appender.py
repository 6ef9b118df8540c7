"""The event log's appends to Kafka: the producer side of `services.event.kafka`.

Theory of operation.

Append: one idempotent producer (`acks=all`, `murmur2_random` so keys land
where Java clients put them). `produce` only queues; a poll thread serves
delivery reports and hands each to the event loop with
`call_soon_threadsafe`, which resolves the future `append` awaits. The wait
is bounded (`append_timeout_s`): past it `append` raises
EventLogUnavailable while the record stays queued (it may still land;
versions make that harmless). After such a timeout, until a record is
acknowledged again (any record, one whose wait was given up too), the
bound is DOWN_APPEND_TIMEOUT_S: a node cut off from Kafka refuses what
needs the log at once instead of after the full bound.
The producer queue is bounded (`max_pending` records): a full queue raises
EventLogBackpressure at once instead of growing memory. A fatal producer
error (an idempotent producer that lost its broker's state, e.g. an
embedded broker restart) fails the waiting appends and the next append
builds a new producer (one rebuild at a time; each producer's poll thread
has its own stop flag).

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
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException, Producer

from services.event.api import EventLogBackpressure, EventLogUnavailable, Placements, placements
from services.event.schema import Event, encode

log = logging.getLogger("weir.event.kafka")

POLL_INTERVAL_S: Final = 0.05  # delivery-report poll period of the producer thread
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
        self._poller: threading.Thread | None = None
        self._stop_polling = threading.Event()  # the current poller's: each producer has its own
        self._waiting: set[asyncio.Future[None]] = set()
        self._renewing = asyncio.Lock()  # one rebuild at a time (`_renew`)

    async def start(self) -> None:
        """The topics, then the producer, unless there is one."""
        await self._ensure_topics()
        if self._producer is None:
            self._producer = self._make_producer()


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
        stop = self._stop_polling = threading.Event()
        self._poller = threading.Thread(
            target=self._poll_loop, args=(producer, stop), name="weir-event-produce", daemon=True
        )
        self._poller.start()
        return producer

    @staticmethod
    def _poll_loop(producer: Producer, stop: threading.Event) -> None:
        while not stop.is_set():
            producer.poll(POLL_INTERVAL_S)

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

    def _retire_producer(self, purge: bool = False) -> None:
        self._stop_retired(*self._detach(), purge)

    def _detach(self) -> tuple[Producer | None, threading.Event, threading.Thread | None]:
        """Take the producer out of use, with its own poller and stop flag."""
        retired = (self._producer, self._stop_polling, self._poller)
        self._producer = self._poller = None
        return retired

    @staticmethod
    def _stop_retired(
        producer: Producer | None, stop: threading.Event, poller: threading.Thread | None,
        purge: bool,
    ) -> None:  # fmt: skip
        """Stop a detached producer's poller (blocks: a thread's work), maybe purge it."""
        if producer is None:
            return
        stop.set()
        if poller is not None:
            poller.join()
        if purge:  # abandon what the failed producer still holds (callers were told)
            producer.purge()
            producer.flush(0)

    async def _renew(self) -> None:
        """Retire a failed producer and make a new one, one append at a time:
        appends that found the same failure wait for the first one's rebuild.
        (Two rebuilding at once made a new producer while the old one's poller
        was being stopped; they shared one stop flag, which the new producer
        cleared, so that poller never stopped and the append joining it hung:
        its event was never logged.)"""
        async with self._renewing:
            if self._producer_failed:
                retired = self._detach()
                await asyncio.to_thread(self._stop_retired, *retired, True)
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
        fut: asyncio.Future[None] = loop.create_future()
        try:
            producer.produce(
                self.topic_prefix + suffix,
                key=key.encode(),
                value=value,
                on_delivery=partial(self._delivered, loop, fut),
            )
        except BufferError:
            raise EventLogBackpressure(
                f"event log: {self.max_pending} records already waiting"
            ) from None
        except KafkaException as exc:
            raise EventLogUnavailable(f"event log: produce failed: {exc}") from None
        self._waiting.add(fut)
        bound = min(DOWN_APPEND_TIMEOUT_S, self.append_timeout_s) if self._down else None
        try:
            await asyncio.wait_for(asyncio.shield(fut), bound or self.append_timeout_s)
            self._timeouts = 0
            self._down = False
        except TimeoutError:
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
            if not fut.done():  # given up: its outcome (maybe a purge) is nobody's error
                fut.add_done_callback(lambda f: f.cancelled() or f.exception())

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

    def _delivered(
        self,
        loop: asyncio.AbstractEventLoop,
        fut: asyncio.Future[None],
        err: KafkaError | None,
        _: Any,
    ) -> None:
        def settle() -> None:
            if err is None:  # the log takes records: whoever gave up waiting, it is up
                self._down = False
                self._timeouts = 0
            if fut.done():
                return
            if err is None:
                fut.set_result(None)
            else:
                fut.set_exception(EventLogUnavailable(f"event log: delivery failed: {err}"))

        with contextlib.suppress(RuntimeError):  # the loop is gone; nobody waits
            loop.call_soon_threadsafe(settle)

    def close(self) -> None:
        """Flush what is queued (bounded by the append timeout), then stop (any thread)."""
        if self._producer is not None:
            self._producer.flush(self.append_timeout_s)
        self._retire_producer()
