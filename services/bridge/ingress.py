"""Kafka to MQTT: one consumer per `[[bridge.kafka_in]]` table.

Theory of operation. Every node runs a consumer for each table, all in one
consumer group (`group`, default `weir-bridge-<name>`): Kafka gives each
partition to one member, so each record is published once cluster-wide
(once per group, to be exact: a rebalance or a node death can repeat some,
below). The consumer lives on a thread of its own (`_run`), which is the
only one that calls it: it fetches batches, commits offsets and pauses or
resumes partitions; rebalance callbacks and librdkafka's error and
statistics callbacks run there too. Each batch goes to the event loop in
one `call_soon_threadsafe`, where each record is rendered (`mqtt_topic`,
`payload`: `services.bridge.templates`) into a message and handed to the
broker's `Publish` (`services.broker.inside`: a client QoS 1 PUBLISH's path).

At least once. A record's offset is committed only after its message was
routed, its copies for persistent subscribers stored in Redis and a
retained one in the log. Per partition the loop keeps the records in the
order they came (`Track`); the committable offset is the one after the
longest routed prefix, handed to the thread (`_to_commit`, under a lock),
which commits it synchronously, so a SIGKILL loses no record: what was not
committed is fetched again by whichever member gets the partition, and its
messages published again (duplicates, never gaps). A publish that fails
(Redis down, a full queue) is retried after a back-off that doubles up to
RETRY_MAX_S, holding its partition's commits until it succeeds; later
records of the partition go on meanwhile. A record whose topic renders no
valid MQTT topic name is skipped (committed) and counted in `dropped`.

Rebalance. The eager protocol revokes every partition of every member and
assigns anew. On revoke the thread commits what is committable for the
partitions it loses, then drops them; the loop forgets their tracks (a new
`epoch`), so answers for records of an old assignment commit nothing. The
new owner starts from the committed offsets.

Bounds. Records handed to the loop and not yet routed are at most
`max_inflight` (give or take one batch): past it the thread pauses its
partitions and keeps calling the consumer (heartbeats, rebalances), and
resumes them below half.

Figures (`stats`): records and payload bytes routed, failures, dropped,
in flight, and the lag, Kafka's high watermark minus the committed offset
summed over the assigned partitions (librdkafka's statistics, every
STATS_INTERVAL_MS; the high watermark comes from fetch responses, which the
embedded Kafka gets right where ListOffsets is wrong).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka import Message as KafkaMessage

from services.bridge.api import IN, BridgeStats, Publish
from services.bridge.health import KafkaHealth
from services.bridge.templates import Record, record_template
from services.config.bridges import KafkaIn
from services.mqtt.errors import TopicNameInvalid
from services.mqtt.packets import Message
from services.mqtt.topics import validate_topic_name

log = logging.getLogger("weir.bridge")

BATCH: Final = 500  # records per fetch handed to the loop at once
CONSUME_WAIT_S: Final = 0.05  # the thread's wait for records; commits and pauses wait this long
STATS_INTERVAL_MS: Final = 1000  # librdkafka's statistics: the lag and the state
METADATA_REFRESH_MS: Final = 10_000  # a subscribed topic created later is found within this
RETRY_FIRST_S: Final = 0.2  # back-off of a failed publish, doubled up to RETRY_MAX_S
RETRY_MAX_S: Final = 5.0
CLOSE_WAIT_S: Final = 5.0  # at stop, how long records in flight get to be routed
CLOSE_JOIN_S: Final = 10.0  # ... and the consumer to commit and leave the group
LOG_EVERY_S: Final = 10.0  # at most one warning per kind per bridge per this long

Key = tuple[str, int]  # (Kafka topic, partition)


@dataclass(slots=True)
class Entry:
    """One record in flight: its offset, whether it was routed, its message."""

    offset: int
    message: Message | None  # None: skipped (no valid topic)
    done: bool = False
    retry_s: float = RETRY_FIRST_S


@dataclass(slots=True)
class Track:
    """One assigned partition's records in flight, in offset order."""

    epoch: int
    entries: deque[Entry] = field(default_factory=deque)


class KafkaIngress:
    """One table's consumer and counters (see the module docstring)."""

    def __init__(
        self, config: KafkaIn, bootstrap: str, publish: Publish, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.config = config
        self.name = config.name
        self.bootstrap = bootstrap
        self.publish = publish
        self.loop = loop
        self.topic = record_template(config.mqtt_topic)
        self.payload = record_template(config.payload)
        self.health = KafkaHealth()
        self.records = self.bytes = self.failures = self.dropped = 0
        self.lag = 0  # from the last statistics (thread)
        self._handed = 0  # records handed to the loop (thread)
        self._settled = 0  # ... and done with there: routed, skipped or forgotten (loop)
        self._inflight_bytes = 0
        self._tracks: dict[Key, Track] = {}  # loop
        self._epoch = 0  # bumped by each assignment change (thread), read with each batch
        self._lock = threading.Lock()
        self._to_commit: dict[Key, int] = {}  # next offset per partition (loop -> thread)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closing = False
        self._drained = asyncio.Event()  # set when closing and nothing is in flight
        self._retries: set[asyncio.TimerHandle] = set()
        self._logged: dict[str, float] = {}

    def describe(self) -> str:
        c = self.config
        return (f"bridge {c.name}: kafka {','.join(c.topics)} at {self.bootstrap} "
                f"(group {c.group_id}) -> mqtt {c.mqtt_topic} (qos {c.qos})")  # fmt: skip

    # -- lifecycle (loop) ---------------------------------------------------

    async def start(self) -> None:
        """Subscribe and start the thread (a Kafka that cannot be reached now is
        no error: the consumer joins the group when it can)."""
        consumer = Consumer(self._consumer_config())
        consumer.subscribe(list(self.config.topics), on_assign=self._assigned,
                           on_revoke=self._revoked)  # fmt: skip
        self._thread = threading.Thread(
            target=self._run, args=(consumer,), name=f"weir-bridge-in-{self.name}", daemon=True
        )
        self._thread.start()

    def _consumer_config(self) -> dict[str, Any]:
        c = self.config
        session_ms = int(c.session_timeout_s * 1000)
        return {
            "bootstrap.servers": self.bootstrap,
            "group.id": c.group_id,
            "enable.auto.commit": False,  # committed after the publish (module docstring)
            "enable.auto.offset.store": False,
            "auto.offset.reset": str(c.offset_reset),
            "session.timeout.ms": session_ms,
            "heartbeat.interval.ms": max(100, session_ms // 6),
            "fetch.wait.max.ms": c.fetch_wait_ms,
            "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
            "statistics.interval.ms": STATS_INTERVAL_MS,
            "stats_cb": self._on_stats,
            "error_cb": self.health.error,
            "logger": log,
        }

    async def close(self) -> None:
        """Stop taking records, give those in flight CLOSE_WAIT_S to be routed,
        then commit and leave the group (the others take the partitions now)."""
        self._closing = True  # the thread pauses every partition
        if self._handed != self._settled:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), CLOSE_WAIT_S)
        for handle in self._retries:
            handle.cancel()
        self._stop.set()
        if self._thread is not None:  # its consumer's close waits for Kafka: bounded
            await asyncio.to_thread(self._thread.join, CLOSE_JOIN_S)
            if self._thread.is_alive():
                log.warning("bridge %s: the consumer did not close in %.0f s (Kafka away?); "
                            "its partitions move after the session timeout", self.name,
                            CLOSE_JOIN_S)  # fmt: skip

    # -- the consumer's thread ----------------------------------------------

    def _run(self, consumer: Consumer) -> None:
        paused = False
        paused_epoch = -1
        try:
            while not self._stop.is_set():
                inflight = self._handed - self._settled
                want = self._closing or inflight >= self.config.max_inflight or (
                    paused and inflight > self.config.max_inflight // 2)  # fmt: skip
                if want != paused or (want and paused_epoch != self._epoch):
                    self._pause(consumer, want)
                    paused, paused_epoch = want, self._epoch
                self._commit(consumer, None)
                batch = consumer.consume(BATCH, CONSUME_WAIT_S)
                records = [r for m in batch if (r := self._record(m)) is not None]
                if records:
                    self.health.ok()
                    self._handed += len(records)
                    with contextlib.suppress(RuntimeError):  # the loop is gone
                        self.loop.call_soon_threadsafe(self._take, records, self._epoch)
        except Exception:  # never silently: the bridge stops taking records, shows stopped
            log.exception("bridge %s: consumer thread failed", self.name)
            self._stop.set()
        finally:
            self._commit(consumer, None)
            with contextlib.suppress(KafkaException, RuntimeError):
                consumer.close()  # revokes (commits) and leaves the group

    def _record(self, m: KafkaMessage) -> Record | None:
        err = m.error()
        if err is not None:
            self.health.error(err)
            self._warn("consume", "cannot consume: %s", err)
            return None
        topic, partition, offset = m.topic(), m.partition(), m.offset()
        assert topic is not None and partition is not None and offset is not None
        headers = tuple((str(h[0]), _bytes(h[1])) for h in m.headers() or ())
        _, timestamp = m.timestamp()
        key = m.key()
        return Record(topic, partition, offset, None if key is None else _bytes(key),
                      _bytes(m.value()), timestamp, headers)  # fmt: skip

    def _pause(self, consumer: Consumer, pause: bool) -> None:
        partitions = consumer.assignment()
        if not partitions:
            return
        with contextlib.suppress(KafkaException):
            if pause:
                consumer.pause(partitions)
            else:
                consumer.resume(partitions)

    def _commit(self, consumer: Consumer, only: set[Key] | None) -> None:
        """Commit what the loop released (of `only`, if given), synchronously."""
        with self._lock:
            offsets = {k: v for k, v in self._to_commit.items() if only is None or k in only}
            for key in offsets:
                del self._to_commit[key]
        if not offsets:
            return
        try:
            consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                            asynchronous=False)  # fmt: skip
            self.health.ok()
        except KafkaException as exc:
            err = exc.args[0]
            self.health.error(err)
            self._warn("commit", "offsets not committed (records will repeat): %s", err)
            if only is None:  # tried again with the next commit (unless revoked meanwhile)
                with self._lock:
                    for key, offset in offsets.items():
                        self._to_commit[key] = max(offset, self._to_commit.get(key, 0))

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._epoch += 1
        keys = [(tp.topic, tp.partition) for tp in partitions]
        log.info("bridge %s: partitions assigned: %s", self.name, keys)
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._retrack, keys, self._epoch)

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = {(tp.topic, tp.partition) for tp in partitions}
        self._commit(consumer, keys)
        with self._lock:
            for key in keys:
                self._to_commit.pop(key, None)
        self._epoch += 1
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._untrack, keys)

    def _on_stats(self, raw: str) -> None:
        stats = self.health.stats(raw)
        lag = 0
        for topic in (stats.get("topics") or {}).values():
            for number, part in (topic.get("partitions") or {}).items():
                if number != "-1":  # librdkafka's internal unassigned partition
                    lag += max(0, part.get("consumer_lag", -1))
        self.lag = lag

    def _warn(self, kind: str, text: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._logged.get(kind, -LOG_EVERY_S) >= LOG_EVERY_S:
            self._logged[kind] = now
            log.warning("bridge %s: " + text, self.name, *args)

    # -- the loop: publish and release ---------------------------------------

    def _retrack(self, keys: list[Key], epoch: int) -> None:
        for key in keys:
            self._forget(key)
            self._tracks[key] = Track(epoch)

    def _untrack(self, keys: set[Key]) -> None:
        for key in keys:
            self._forget(key)

    def _forget(self, key: Key) -> None:
        """An old assignment's records: whatever becomes of them commits nothing."""
        track = self._tracks.pop(key, None)
        if track is not None:
            for entry in track.entries:
                if not entry.done:
                    entry.done = True  # its answer, if one comes, is for nobody
                    self._settle(entry)

    def _take(self, records: list[Record], epoch: int) -> None:
        for record in records:
            key = (record.topic, record.partition)
            track = self._tracks.get(key)
            if track is None or track.epoch != epoch:  # revoked since it was fetched
                self._settle(None)
                continue
            message = self._message(record)
            entry = Entry(record.offset, message)
            track.entries.append(entry)
            if message is None:
                entry.done = True
                self._settle(entry)
                self._release(key, track)
                continue
            self._inflight_bytes += len(message.payload)
            self._send(key, track, entry)

    def _message(self, record: Record) -> Message | None:
        try:
            topic = self.topic.render(record).decode()
            validate_topic_name(topic)
        except (UnicodeDecodeError, TopicNameInvalid) as exc:
            self.dropped += 1
            self._warn("topic", "record %s/%d@%d skipped: no topic name: %s",
                       record.topic, record.partition, record.offset, exc)  # fmt: skip
            return None
        if topic.startswith("$"):
            self.dropped += 1
            self._warn("topic", "record %s/%d@%d skipped: topic %r is the broker's",
                       record.topic, record.partition, record.offset, topic)  # fmt: skip
            return None
        return Message(topic, self.payload.render(record), self.config.qos, self.config.retain)

    def _send(self, key: Key, track: Track, entry: Entry) -> None:
        assert entry.message is not None
        future = self.publish(entry.message)
        future.add_done_callback(lambda f: self._routed(key, track, entry, f))

    def _routed(self, key: Key, track: Track, entry: Entry, future: asyncio.Future[bool]) -> None:
        if entry.done:  # forgotten (revoked) meanwhile
            return
        if not future.cancelled() and future.exception() is None and future.result():
            entry.done = True
            self.records += 1
            self.bytes += len(entry.message.payload) if entry.message is not None else 0
            self._settle(entry)
            self._release(key, track)
            return
        self.failures += 1
        self._warn("publish", "publish failed (retried in %.1f s)", entry.retry_s)
        delay, entry.retry_s = entry.retry_s, min(RETRY_MAX_S, entry.retry_s * 2)

        def again() -> None:
            self._retries.discard(handle)
            if not entry.done and self._tracks.get(key) is track:
                self._send(key, track, entry)

        handle = self.loop.call_later(delay, again)
        self._retries.add(handle)

    def _settle(self, entry: Entry | None) -> None:
        self._settled += 1
        if entry is not None and entry.message is not None:
            self._inflight_bytes -= len(entry.message.payload)
        if self._closing and self._handed == self._settled:
            self._drained.set()

    def _release(self, key: Key, track: Track) -> None:
        """The routed prefix of the partition's records may be committed."""
        entries = track.entries
        last = None
        while entries and entries[0].done:
            last = entries.popleft().offset
        if last is not None and self._tracks.get(key) is track:
            with self._lock:
                self._to_commit[key] = last + 1

    def stats(self) -> BridgeStats:
        return BridgeStats(
            name=self.name,
            records=self.records,
            bytes=self.bytes,
            failures=self.failures,
            dropped=self.dropped,
            buffered_records=self._handed - self._settled,
            buffered_bytes=self._inflight_bytes,
            lag=self.lag,
            direction=IN,
            state=self.health.state(self._thread is not None and not self._stop.is_set()),
        )


def _bytes(value: str | bytes | None) -> bytes:
    if isinstance(value, str):
        return value.encode()
    return value or b""


class KafkaIngresses:
    """Every kafka_in bridge of a node."""

    def __init__(self, bridges: Sequence[KafkaIngress]) -> None:
        self.bridges = tuple(bridges)

    @classmethod
    def build(
        cls,
        tables: Sequence[KafkaIn],
        bootstrap: str | None,
        publish: Publish,
        loop: asyncio.AbstractEventLoop,
    ) -> KafkaIngresses:
        """One bridge per table; a table without its own bootstrap uses `bootstrap`."""
        bridges = []
        for table in tables:
            where = table.bootstrap or bootstrap
            assert where is not None, "config checks that a memory node's bridges name one"
            bridges.append(KafkaIngress(table, where, publish, loop))
        return cls(bridges)

    async def start(self) -> None:
        for bridge in self.bridges:
            await bridge.start()

    async def close(self) -> None:
        await asyncio.gather(*(bridge.close() for bridge in self.bridges))

    def stats(self) -> list[BridgeStats]:
        return [bridge.stats() for bridge in self.bridges]
