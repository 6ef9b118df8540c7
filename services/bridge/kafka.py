"""MQTT to Kafka: one producer per `[[bridge.kafka_out]]` table.

Theory of operation. `KafkaBridges.publish` finds the bridges whose filter matches a
message's topic (remembered per topic) and each renders its key, value and headers
(`templates`) and produces the record with confluent-kafka: `acks=all`, idempotent
(a retried batch neither repeats nor reorders records), `partitioner=murmur2_random`
(a key lands where a Java client puts it: by default the client id, so one device's
records stay in one partition, in order), the table's compression and linger
(batching). `produce` only queues. The event loop polls each producer (no thread):
sync, every SYNC_POLL_S while records wait for their reports, which settle the
counters and futures of that poll at once; async, every POLL_INTERVAL_S, asking for
failed records' reports only (`delivery.report.only.error`), its figures counted
(`Counted`). A thread that polled took the GIL from the loop once per report
(confluent-kafka's trampoline takes it per record, even for a report it then drops):
that held async to 30-38k PUBACK/s where it now makes 43-50k, and sync to 26-27k
(docs/bridges.md, "Cost").

Modes. sync: `publish` returns a future resolved by Kafka's reports; the broker
holds the publisher's PUBACK / PUBREC on it. The records a bridge produces in one
loop turn share that future (`Turn`): True once Kafka acknowledged all of them,
False if it refused any. async: nothing to wait for; the record is acknowledged to
the publisher at once and is only in this process's memory until Kafka's report
(`buffered_*`): that is the loss window of async mode (a SIGKILL loses it; a Kafka
outage longer than `timeout_s` fails its records, counted in `failures`).

Bounds. Records produced and not yet reported are at most `buffer_bytes` (key +
value; async: the records librdkafka holds times their mean size, and librdkafka's
own bound of twice that in values holds exactly); past it an async record is dropped
and a sync one refused, both counted in `dropped` and logged at most every
DROP_LOG_EVERY_S. A record Kafka has not acknowledged within `timeout_s` fails
(librdkafka's `message.timeout.ms`). A fatal producer error, or a record refused as
from a fenced producer (after a timeout the idempotent producer bumps its epoch,
which Tansu does not follow), fails what the producer holds and the bridge builds a
new one; records produced meanwhile are refused (`dropped`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka import admin as _admin

from services.bridge.api import OUT, BridgeStats, all_true
from services.bridge.health import KafkaHealth
from services.bridge.producers import Headers, flushed, produce, purge
from services.bridge.tally import Counted, Report, Turn
from services.bridge.templates import Fields, envelope, message_template, render_headers
from services.config.bridges import KafkaOut, Mode
from services.mqtt.packets import Message
from services.mqtt.topics import matches

log = logging.getLogger("weir.bridge")

POLL_INTERVAL_S: Final = 0.05  # a producer's poll period (sync: while nothing waits)
SYNC_POLL_S: Final = 0.001  # sync: the poll period while records wait (uvloop's timer tick)
STATS_INTERVAL_MS: Final = 5000  # librdkafka's statistics (the bridge's state): a small JSON
ADMIN_TIMEOUT_S: Final = 5.0  # topic creation at start; a Kafka down then is only a warning
CLOSE_FLUSH_S: Final = 5.0  # at stop, how long buffered records get to reach Kafka
DROP_LOG_EVERY_S: Final = 10.0  # at most one warning about dropped records per this long
TOPIC_CACHE: Final = 10_000  # topics whose matching bridges are remembered; past it: start over
MAX_QUEUED_MESSAGES: Final = 2_000_000  # librdkafka's own count bound; bytes bind first

# An idempotent producer whose records timed out bumps its epoch; a broker that
# does not follow (Tansu) then refuses every record with one of these, for good.
FENCED: Final = frozenset({
    KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
    KafkaError.UNKNOWN_PRODUCER_ID, KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
})  # fmt: skip


class KafkaBridge:
    """One table's producer and counters (see the module docstring)."""

    def __init__(self, config: KafkaOut, bootstrap: str, loop: asyncio.AbstractEventLoop) -> None:
        self.config = config
        self.name = config.name
        self.bootstrap = bootstrap
        self.loop = loop
        self.sync = config.mode == Mode.SYNC
        self.key = message_template(config.key) if config.key else None
        self.value = message_template(config.value) if config.value is not None else None
        self.headers = tuple((name, message_template(text)) for name, text in config.headers)
        # Bound once: the per-record path reads no config.
        self._topic = config.topic
        self._limit = config.buffer_bytes
        self._key_of = self.key.renderer if self.key is not None else None
        self._value_of = self.value.renderer if self.value is not None else envelope
        self._user_properties = config.user_properties  # as headers
        self._room = config.buffer_bytes  # async: bytes that surely still fit (`_room_now`)
        self.records = self.bytes = self.failures = self.dropped = 0
        self.buffered_records = self.buffered_bytes = 0
        self.latency_us_total = self.latency_us_max = 0
        self._dropped_logged = self._failed_logged = -DROP_LOG_EVERY_S
        self.health = KafkaHealth()
        self._producer: Producer | None = None
        self._polling = 0  # the slow poll's round: one per producer (`_poll_slow`)
        self._sync_poll: asyncio.TimerHandle | None = None  # sync: the next fast poll
        self._reports: deque[Report] = deque()  # appended by a poll's callbacks, taken after it
        self._counted = Counted()  # async mode's figures
        self._acknowledged = 0  # async: acknowledged records at the last poll
        self._old: Producer | None = None  # async: a producer being purged (its records count)
        self._on_async_report = self._async_failed  # bound once, not per record
        self._turn: Turn | None = None  # sync mode: this loop turn's records' future
        self._failed = False  # a fatal producer error: rebuild before the next record
        self._rebuilding = False
        self._rebuild_task: asyncio.Task[None] | None = None
        self._started = self._closed = False

    def describe(self) -> str:
        c = self.config
        value = "JSON envelope" if c.value is None else repr(c.value)
        return (f"bridge {c.name}: {c.filter} -> kafka {c.topic} at {self.bootstrap} "
                f"({c.mode}, key {c.key!r}, value {value})")  # fmt: skip

    # -- lifecycle ------------------------------------------------------

    async def start(self) -> None:
        """The producer, and the topic if `partitions` asks for it (a Kafka
        that cannot be reached now is a warning: records wait or fail)."""
        self._producer = self._make_producer()
        self._started = True
        if self.config.partitions:
            try:
                await asyncio.to_thread(self._ensure_topic)
            except KafkaException as exc:
                log.warning("bridge %s: cannot create topic %s: %s", self.name,
                            self.config.topic, exc)  # fmt: skip

    def _ensure_topic(self) -> None:
        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "logger": log}
        admin = _admin.AdminClient(config)
        new = _admin.NewTopic(self.config.topic, num_partitions=self.config.partitions)  # type: ignore[attr-defined]
        futures = admin.create_topics([new], request_timeout=ADMIN_TIMEOUT_S)
        try:
            futures[self.config.topic].result(timeout=ADMIN_TIMEOUT_S)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
        except TimeoutError:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT)) from None

    def _make_producer(self) -> Producer:
        c = self.config
        timeout_ms = int(c.delivery_timeout_s * 1000)
        producer = Producer({
            "bootstrap.servers": self.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "partitioner": "murmur2_random",
            "compression.type": str(c.compression),
            "linger.ms": c.batch_linger_ms,
            "message.timeout.ms": timeout_ms,
            "request.timeout.ms": min(timeout_ms, 30_000),
            # The byte bound is ours (buffer_bytes); librdkafka's must not bind first.
            "queue.buffering.max.kbytes": min(2_097_151, c.buffer_bytes // 1024 * 2),
            "queue.buffering.max.messages": MAX_QUEUED_MESSAGES,
            "error_cb": self._on_error,
            "stats_cb": self.health.stats,
            "statistics.interval.ms": STATS_INTERVAL_MS,
            "logger": log,
            # async: a report for failed records only; successes are counted (`Counted`)
            "delivery.report.only.error": not self.sync,
        })  # fmt: skip
        self._polling += 1
        self.loop.call_soon(self._poll_slow, self._polling)
        return producer

    async def close(self) -> None:
        """Give buffered records CLOSE_FLUSH_S to reach Kafka, then stop."""
        self._closed = True
        if self._rebuild_task is not None:
            await self._rebuild_task
        if self._producer is None:
            return
        box, self._producer = [self._producer], None  # gone with `flushed`, off the loop
        left = await asyncio.to_thread(flushed, box, CLOSE_FLUSH_S)  # its reports: appended
        self._settle(self._take_reports())
        if not self.sync:  # lost with the producer: not acknowledged
            self._counted.failed += left
        if left:
            log.warning("bridge %s: %d records not in Kafka at stop", self.name, left)

    # -- polling, on the loop --------------------------------------------

    def _poll_sync(self) -> None:
        """sync: the reports of what Kafka answered since the last poll; again
        in SYNC_POLL_S while records wait (a produce starts this)."""
        self._sync_poll = None
        producer = self._producer
        if producer is None or self._closed:  # a rebuild settles the old producer's records
            return
        self._serve(producer)
        if self.buffered_records:
            self._sync_poll = self.loop.call_later(SYNC_POLL_S, self._poll_sync)

    def _on_error(self, err: KafkaError) -> None:
        self.health.error(err)
        if err.fatal():
            log.error("bridge %s: producer failed: %s", self.name, err)
            self._failed = True

    def _poll_slow(self, polling: int) -> None:
        """Every POLL_INTERVAL_S while `polling` is the producer's round: its errors,
        stats and logs; async, failed records' reports and the acknowledged count. The
        timer holds no producer: a closed one goes at once, not when the timer fires."""
        producer = self._producer
        if polling != self._polling or producer is None or self._closed:
            return
        self._serve(producer)
        if not self.sync:
            self._room = self._limit - self._held()[1]
            acknowledged = self._counted.acknowledged(len(producer))
            if acknowledged > self._acknowledged:
                self._acknowledged = acknowledged
                self.health.ok()  # what a success report says in sync mode
        self.loop.call_later(POLL_INTERVAL_S, self._poll_slow, polling)

    def _serve(self, producer: Producer) -> None:
        """librdkafka's events now (async: its count of what it holds includes them)."""
        producer.poll(0)
        if self._reports:
            self._settle(self._take_reports())

    def _async_failed(self, err: KafkaError | None, _: Any) -> None:
        """async: the report of a failed record (successes are not reported)."""
        if err is None:  # not asked for; an acknowledged record is counted anyway
            return
        self._counted.failed += 1
        self._reports.append((None, 0, 0, err))

    def _take_reports(self) -> list[Report]:
        reports, pop = [], self._reports.popleft  # deque: thread-safe append / popleft
        with contextlib.suppress(IndexError):
            while True:
                reports.append(pop())
        return reports

    def _settle(self, reports: list[Report]) -> None:
        """A poll's reports at once: the counters change once per call, not
        per record (a poll brings a produce request's worth)."""
        now = time.monotonic_ns()
        settled_bytes = acked = acked_bytes = latency_ns = 0
        oldest = now
        for turn, size, started, err in reports:
            settled_bytes += size
            if err is None:
                acked += 1
                acked_bytes += size
                latency_ns += now - started
                oldest = min(oldest, started)
            else:
                self._failed_record(err)
            if turn is not None:
                turn.left -= 1
                turn.ok = turn.ok and err is None
                turn.settle()
        if self.sync:
            self.buffered_records -= len(reports)
            self.buffered_bytes -= settled_bytes
        if acked:
            self.health.ok()
            self.records += acked
            self.bytes += acked_bytes
            self.latency_us_total += latency_ns // 1000
            self.latency_us_max = max(self.latency_us_max, (now - oldest) // 1000)

    def _failed_record(self, err: KafkaError) -> None:
        self.health.error(err)
        self.failures += 1
        self._log_failure(err)
        if err.fatal() or err.code() in FENCED:
            self._failed = True

    def _log_failure(self, err: KafkaError) -> None:
        now = time.monotonic()
        if now - self._failed_logged >= DROP_LOG_EVERY_S:
            self._failed_logged = now
            log.warning("bridge %s: records not taken by Kafka (%d so far): %s",
                        self.name, self.failures, err)  # fmt: skip

    # -- produce ----------------------------------------------------------

    def produce(self, fields: Fields) -> asyncio.Future[bool] | None:
        """Queue one record; a future (sync mode) resolved by Kafka's report."""
        if self._failed:
            self._rebuild()
        key_of = self._key_of
        key = key_of(fields) if key_of is not None else None
        value = self._value_of(fields)
        size = len(value) + (len(key) if key is not None else 0)
        headers = None
        if self.headers or (self._user_properties and fields.message.properties.user_property):
            headers = render_headers(self.headers, self._user_properties, fields)
        if self.sync:
            return self._produce_sync(value, key, headers, size)
        # async: the room at librdkafka's last count less what was produced since
        # (records only leave meanwhile); it counts again only when that is "full".
        producer = self._producer
        room = self._room - size
        if room < 0:
            room = self._room_now() - size
        if producer is None or self._failed or room < 0:
            return self._drop()
        try:  # one callback for every record: called for failed ones only; positional (`produce`)
            if headers is None:
                producer.produce(self._topic, value, key, -1, self._on_async_report)
            else:
                produce(producer, self._topic, value, key, self._on_async_report, headers)
        except (BufferError, KafkaException):
            return self._drop()
        self._room = room
        counted = self._counted
        counted.produced += 1
        counted.produced_bytes += size
        return None

    def _produce_sync(self, value: bytes, key: bytes | None, headers: Headers | None,
                      size: int) -> asyncio.Future[bool] | None:  # fmt: skip
        producer = self._producer
        if producer is None or self._failed or self.buffered_bytes + size > self._limit:
            return self._drop()
        turn = self._this_turn()
        started = time.monotonic_ns()

        def delivered(err: KafkaError | None, _: Any) -> None:  # in a poll
            self._reports.append((turn, size, started, err))

        try:
            produce(producer, self._topic, value, key, delivered, headers)
        except (BufferError, KafkaException):
            return self._drop()
        self.buffered_records += 1
        self.buffered_bytes += size
        turn.left += 1
        if self._sync_poll is None:
            self._sync_poll = self.loop.call_later(SYNC_POLL_S, self._poll_sync)
        return turn.future

    def _room_now(self) -> int:
        """async: the buffer's room by librdkafka's count, its events served
        first (its count includes them: CI once dropped a record that fit)."""
        if self._producer is not None:
            self._serve(self._producer)
        self._room = self._limit - self._held()[1]
        return self._room

    def _held(self) -> tuple[int, int]:
        """async: the records the producers hold (a purged one's too) and their bytes.
        librdkafka's count includes its queued events (an error event for each
        failed connection attempt: CI once read 21 of 20), so it is capped by
        what was produced and is neither failed nor known acknowledged."""
        held = 0 if self._producer is None else len(self._producer)
        if self._old is not None:
            held += len(self._old)
        counted = self._counted
        held = max(0, min(held, counted.produced - counted.failed - self.records))
        return held, round(held * counted.mean())

    def _this_turn(self) -> Turn:
        turn = self._turn
        if turn is None:
            self._turn = turn = Turn(self.loop.create_future())
            self.loop.call_soon(self._end_turn)
        return turn

    def _end_turn(self) -> None:
        turn, self._turn = self._turn, None
        if turn is not None:
            turn.open = False
            turn.settle()

    def _drop(self) -> asyncio.Future[bool] | None:
        self.dropped += 1
        now = time.monotonic()
        if now - self._dropped_logged >= DROP_LOG_EVERY_S:
            self._dropped_logged = now
            if not self.sync:
                self.buffered_records, self.buffered_bytes = self._held()
            log.warning(
                "bridge %s: %s (%d records, %d bytes waiting for Kafka; %d dropped so far)",
                self.name, "producer failed" if self._failed else "buffer full",
                self.buffered_records, self.buffered_bytes, self.dropped,
            )  # fmt: skip
        if not self.sync:
            return None
        refused: asyncio.Future[bool] = self.loop.create_future()
        refused.set_result(False)
        return refused

    def _rebuild(self) -> None:
        """After a fatal error: fail what the old producer holds, build a new one."""
        if self._rebuilding or self._closed:
            return
        self._rebuilding = True
        old, self._producer = self._producer, None
        self._old = old

        async def rebuild() -> None:
            try:
                if old is not None:
                    await asyncio.to_thread(purge, old)  # its reports: appended
                    self._settle(self._take_reports())
                if not self._closed:
                    self._producer = self._make_producer()
                    self._failed = False
            finally:
                self._rebuilding = False
                self._old = None

        self._rebuild_task = self.loop.create_task(rebuild())  # held: the loop keeps weak refs

    def stats(self) -> BridgeStats:
        if not self.sync:
            if self._producer is not None and not self._closed:
                self._serve(self._producer)
            self.buffered_records, self.buffered_bytes = self._held()
            counted = self._counted
            self.records = max(self.records, counted.acknowledged(self.buffered_records))
            self.bytes = max(self.bytes, round(self.records * counted.mean()))
        return BridgeStats(
            name=self.name,
            records=self.records,
            bytes=self.bytes,
            failures=self.failures,
            dropped=self.dropped,
            buffered_records=self.buffered_records,
            buffered_bytes=self.buffered_bytes,
            latency_us_total=self.latency_us_total,
            latency_us_max=self.latency_us_max,
            direction=OUT,
            state=self.health.state(self._started and not self._closed),
        )


class KafkaBridges:
    """Every bridge of a node: the broker's `Egress` (`services.bridge.api`)."""

    def __init__(self, bridges: Sequence[KafkaBridge]) -> None:
        self.bridges = tuple(bridges)
        self._by_topic: dict[str, tuple[KafkaBridge, ...]] = {}

    @classmethod
    def build(
        cls, tables: Sequence[KafkaOut], bootstrap: str | None, loop: asyncio.AbstractEventLoop
    ) -> KafkaBridges:
        """One bridge per table; a table without its own bootstrap uses `bootstrap`."""
        bridges = []
        for table in tables:
            where = table.bootstrap or bootstrap
            assert where is not None, "config checks that a memory node's bridges name one"
            bridges.append(KafkaBridge(table, where, loop))
        return cls(bridges)

    async def start(self) -> None:
        for bridge in self.bridges:
            await bridge.start()

    async def close(self) -> None:
        for bridge in self.bridges:
            await bridge.close()

    def publish(self, message: Message, username: str | None) -> asyncio.Future[bool] | bool:
        topic = message.topic
        matched = self._by_topic.get(topic)
        if matched is None:
            matched = tuple(b for b in self.bridges if matches(b.config.filter, topic))
            if len(self._by_topic) >= TOPIC_CACHE:
                self._by_topic.clear()
            self._by_topic[topic] = matched
        if not matched:
            return False
        fields = Fields(message, username, time.time_ns() // 1_000_000)
        if len(matched) == 1:  # the common case: no list
            waited = matched[0].produce(fields)
            return True if waited is None else waited
        waits = [f for b in matched if (f := b.produce(fields)) is not None]
        if not waits:
            return True
        return waits[0] if len(waits) == 1 else all_true(waits)

    def stats(self) -> list[BridgeStats]:
        return [bridge.stats() for bridge in self.bridges]
