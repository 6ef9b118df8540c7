"""The event log on Kafka (confluent-kafka; Apache Kafka or embedded Tansu).

Theory of operation.

Append and warm-up: `services.event.appender` (one idempotent producer;
after a timed-out append, appends wait only briefly until the log
acknowledges again).

Replay and tail: one consumer with `assign` (no group), each partition of
the three topics from the beginning or from given offsets, consumed in
batches on one worker thread and decoded there; the handler runs on the
event loop, in log order per partition. The end of the log is where every
partition has reported EOF (`enable.partition.eof`): Tansu's ListOffsets is
wrong after batched produce, so watermarks are never asked for. Tail keeps
the same consumer going.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as _TP

from services.event.api import (
    EventLogClosed,
    EventLogCorrupt,
    EventLogError,
    EventLogUnavailable,
    Handler,
    Offsets,
    Placements,
)
from services.event.appender import Appender
from services.event.schema import (
    DEFAULT_TOPIC_PREFIX,
    Event,
    EventSchemaError,
    decode,
    topic_names,
)
from services.event.topics import ADMIN_TIMEOUT_S, create_topics

log = logging.getLogger("weir.event.kafka")

DEFAULT_PARTITIONS: Final = 8  # per topic; enough for a few nodes' consumers, cheap on Tansu
DEFAULT_APPEND_TIMEOUT_S: Final = 5.0  # a CONNACK/SUBACK waits at most this for the log
DEFAULT_MAX_PENDING: Final = 20_000  # queued records; about 10 MiB of events at most
BATCH: Final = 1000  # records per consume() call
REPLAY_POLL_S: Final = 0.2
TAIL_POLL_S: Final = 0.05  # tail latency added on top of the broker's fetch wait
# How long the broker may hold a fetch that finds nothing new. A replay's
# consumer sees each partition's end that much after reaching it (Tansu holds
# the fetch), so it asks briefly; the tail's consumer, idle most of the
# time, asks ten times a second.
REPLAY_FETCH_WAIT_MS: Final = 10
TAIL_FETCH_WAIT_MS: Final = 100
# A replay that reads nothing and reaches no partition end for this long gives
# up: the broker is gone or stalled (Tansu also stalls silently on a fetch past
# the end of a partition). Generous: a busy broker can pause for seconds.
DEFAULT_REPLAY_STALL_S: Final = 30.0
_PLAIN: Final = frozenset({type(None), bool})  # handler results that are surely not awaitable


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    bootstrap: str
    topic_prefix: str = DEFAULT_TOPIC_PREFIX
    partitions: int = DEFAULT_PARTITIONS
    replication_factor: int = 1
    append_timeout_s: float = DEFAULT_APPEND_TIMEOUT_S
    max_pending: int = DEFAULT_MAX_PENDING
    linger_ms: int = 2
    replay_stall_s: float = DEFAULT_REPLAY_STALL_S
    producer_config: Mapping[str, Any] = field(default_factory=dict)
    consumer_config: Mapping[str, Any] = field(default_factory=dict)


def _is_eof(err: KafkaError) -> bool:
    return bool(err.code() == KafkaError._PARTITION_EOF)


def _trim_heap() -> None:
    """Give back to the OS the C heap a replay used and freed (librdkafka's
    prefetched records, the decode thread's malloc arena): glibc keeps it
    otherwise, about 70 MiB of RSS after a 1M-event replay. No-op off glibc."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


class KafkaEventLog:
    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self.topics = topic_names(settings.topic_prefix)
        self._appender = Appender(
            settings.bootstrap, settings.topic_prefix, self.topics, settings.append_timeout_s,
            settings.max_pending, settings.linger_ms, settings.producer_config,
            self.ensure_topics, self._forget_topics,
        )  # fmt: skip
        self._consumer: Consumer | None = None
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="weir-event-consume")
        self._positions: dict[tuple[str, int], int] = {}
        self._assigned: list[tuple[str, int]] = []
        self._closed = False
        self._topics_ready = False

    # -- topics ---------------------------------------------------------

    async def ensure_topics(self) -> None:
        """Create the three topics with `partitions` each; existing is fine."""
        if not self._topics_ready:
            await asyncio.to_thread(
                create_topics, self.settings.bootstrap, self.topics,
                self.settings.partitions, self.settings.replication_factor,
            )  # fmt: skip
            self._topics_ready = True

    @property
    def append_timeout_s(self) -> float:
        return self._appender.append_timeout_s

    @append_timeout_s.setter
    def append_timeout_s(self, seconds: float) -> None:
        self._appender.append_timeout_s = seconds

    def _forget_topics(self) -> None:
        self._topics_ready = False

    async def start(self) -> None:
        """Create the topics and the producer now rather than at the first
        append (an idempotent producer needs about 0.5-1 s to get its id)."""
        await self._appender.start()

    # -- append (services.event.appender) --------------------------------

    @property
    def warmed(self) -> bool:
        """The current producer has its id: an append goes out at once."""
        return self._appender.warmed

    async def warm(self) -> None:
        await self._appender.warm()

    async def append(self, event: Event) -> None:
        if self._closed:
            raise EventLogClosed("event log is closed")
        await self._appender.append(event)

    async def append_all(self, events: Sequence[Event]) -> Placements:
        if self._closed:
            raise EventLogClosed("event log is closed")
        return await self._appender.append_all(events)

    # -- replay and tail ------------------------------------------------

    def positions(self) -> dict[tuple[str, int], int]:
        return dict(self._positions)

    async def replay(self, handler: Handler, start: Offsets | None = None) -> int:
        await self.ensure_topics()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(
            self._worker, self._assign, dict(start or {}), REPLAY_FETCH_WAIT_MS
        )
        try:
            count = await self._consume(handler, until_eof=True)
        finally:  # the tail makes its own consumer (TAIL_FETCH_WAIT_MS) from the positions
            await loop.run_in_executor(self._worker, self._retire_consumer)
        _trim_heap()
        return count

    async def is_empty(self) -> bool:
        await self.ensure_topics()
        return await asyncio.to_thread(self._probe_empty)

    def _probe_empty(self) -> bool:
        """Read from the beginning of every partition until one yields a
        record (not empty) or all report EOF (empty); bounded by replay_stall_s."""
        consumer = self._new_consumer(REPLAY_FETCH_WAIT_MS)
        try:
            parts: list[_TP] = []
            for topic in self.topics:
                meta = consumer.list_topics(topic, timeout=ADMIN_TIMEOUT_S).topics[topic]
                if meta.error is not None:
                    raise EventLogUnavailable(f"event log: topic {topic}: {meta.error}")
                parts.extend(_TP(topic, p, OFFSET_BEGINNING) for p in sorted(meta.partitions))
            consumer.assign(parts)
            pending = {(tp.topic, tp.partition) for tp in parts}
            deadline = time.monotonic() + self.settings.replay_stall_s
            while pending:
                if time.monotonic() > deadline:
                    raise EventLogUnavailable(
                        f"event log: no record and no partition end within "
                        f"{self.settings.replay_stall_s} s: {sorted(pending)}"
                    )
                for msg in consumer.consume(len(pending), REPLAY_POLL_S):
                    err = msg.error()
                    if err is None:
                        return False
                    if _is_eof(err):
                        pending.discard((str(msg.topic()), int(msg.partition() or 0)))
                    elif err.fatal() or not err.retriable():
                        raise EventLogUnavailable(f"event log: consume failed: {err}")
            return True
        except KafkaException as exc:
            raise EventLogUnavailable(f"event log: cannot probe the log: {exc}") from None
        finally:
            consumer.close()

    async def tail(self, handler: Handler) -> None:
        if self._consumer is None:
            await self.ensure_topics()
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._worker, self._assign, {})
        await self._consume(handler, until_eof=False)

    def _retire_consumer(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    def _new_consumer(self, fetch_wait_ms: int = TAIL_FETCH_WAIT_MS) -> Consumer:
        """A consumer for `assign` (no group is ever joined), reporting partition EOF."""
        config: dict[str, Any] = {
            "bootstrap.servers": self.settings.bootstrap,
            "group.id": "weir-event-replay",  # required by the client; assign never joins
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": fetch_wait_ms,
            "logger": log,
            **self.settings.consumer_config,
        }
        return Consumer(config)

    def _assign(
        self, start: dict[tuple[str, int], int], fetch_wait_ms: int = TAIL_FETCH_WAIT_MS
    ) -> None:
        if self._consumer is None:
            self._consumer = self._new_consumer(fetch_wait_ms)
        consumer = self._consumer
        parts: list[_TP] = []
        assigned: list[tuple[str, int]] = []
        for topic in self.topics:
            try:
                timeout = min(ADMIN_TIMEOUT_S, self.settings.replay_stall_s)
                meta = consumer.list_topics(topic, timeout=timeout).topics[topic]
            except KafkaException as exc:
                raise EventLogUnavailable(f"event log: no metadata for {topic}: {exc}") from None
            if meta.error is not None:
                raise EventLogUnavailable(f"event log: topic {topic}: {meta.error}")
            for p in sorted(meta.partitions):
                offset = start.get((topic, p), self._positions.get((topic, p), OFFSET_BEGINNING))
                if offset >= 0:  # a replay from given offsets is at them before it reads
                    self._positions[(topic, p)] = offset
                parts.append(_TP(topic, p, offset))
                assigned.append((topic, p))
        consumer.assign(parts)
        self._assigned = assigned

    def _next_batch(
        self, timeout_s: float
    ) -> tuple[list[tuple[str, int, int, Event]], list[tuple[str, int]]]:
        consumer = self._consumer
        if consumer is None:
            raise EventLogClosed("event log is closed")
        events: list[tuple[str, int, int, Event]] = []
        eofs: list[tuple[str, int]] = []
        # What is fetched already, else wait for the first record only:
        # consume(BATCH, t) waits out t unless BATCH records come, which
        # added REPLAY_POLL_S to the end of every replay.
        for msg in consumer.consume(BATCH, 0) or consumer.consume(1, timeout_s):
            err = msg.error()
            if err is not None:
                if _is_eof(err):
                    eofs.append((str(msg.topic()), int(msg.partition() or 0)))
                    continue
                if err.fatal() or not err.retriable():
                    raise EventLogUnavailable(f"event log: consume failed: {err}")
                log.warning("event log consume: %s", err)
                continue
            topic, partition = str(msg.topic()), int(msg.partition() or 0)
            offset = int(msg.offset() or 0)
            try:
                event = decode(topic, msg.value() or b"")
            except EventSchemaError as exc:
                raise EventLogCorrupt(f"{topic}[{partition}]@{offset}: {exc}") from None
            events.append((topic, partition, offset, event))
        return events, eofs

    async def _consume(self, handler: Handler, *, until_eof: bool) -> int:
        loop = asyncio.get_running_loop()
        pending_eof = set(self._assigned)
        count = 0
        poll_s = REPLAY_POLL_S if until_eof else TAIL_POLL_S
        progress = loop.time()
        while not self._closed and not (until_eof and not pending_eof):
            try:
                batch, eofs = await loop.run_in_executor(self._worker, self._next_batch, poll_s)
            except EventLogClosed:
                break
            if batch or eofs:
                progress = loop.time()
            elif until_eof and loop.time() - progress > self.settings.replay_stall_s:
                raise EventLogUnavailable(
                    f"event log: replay read nothing for {self.settings.replay_stall_s} s; "
                    f"partitions not at their end: {sorted(pending_eof)}"
                )
            for topic, partition, offset, event in batch:
                result = handler(event)
                if result.__class__ not in _PLAIN and inspect.isawaitable(result):
                    await result
                self._positions[(topic, partition)] = offset + 1
                count += 1
            pending_eof.difference_update(eofs)
        return count

    # -- close ----------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._shutdown)

    def _shutdown(self) -> None:
        self._appender.close()
        # On the worker, after what it is doing: a tail's assignment still running
        # there (its task cancelled) may be about to make the consumer.
        self._worker.submit(self._retire_consumer).result()
        self._worker.shutdown(wait=True)


__all__ = ["EventLogError", "KafkaEventLog", "KafkaSettings"]
