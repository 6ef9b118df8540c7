"""The log reader of the Spark jobs (streams.source, streams.kafka_source).

On this machine Spark's Kafka connector is absent, so `read_log` is the
Python source over confluent-kafka. Real embedded Kafka, real local
SparkSession: topics made with several partitions, events encoded by the
catalogue and produced with the Java partitioner; every micro-batch is
collected in `foreachBatch`. Spark's checkpoint is the only record of
progress, so a restart on it must go on exactly where it stopped, and a
checkpoint the log no longer matches must fail loudly.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka import Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from services.event.schema import SessionOpened, Subscribed, encode
from services.ports import free_port
from streams.events import RAW_COLUMNS, raw_schema
from streams.kafka_client import fair_cap, from_json, to_json
from streams.source import connector_available, connector_options, read_log
from tests.support.wait import wait_until

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

PARTITIONS = 4
QUERY_TIMEOUT_S = 120.0  # a 2-core machine shared with other suites: generous
Record = tuple[str, int, int, str, bytes]  # topic, partition, offset, key, value


@pytest.fixture
def topics(kafka_bootstrap: str, kafka_topic_prefix: str) -> Iterator[list[str]]:
    names = [kafka_topic_prefix + "sessions", kafka_topic_prefix + "subscriptions"]
    create(kafka_bootstrap, names)
    yield names
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for fut in admin.delete_topics(names).values():
        fut.result(10)


def create(bootstrap: str, names: list[str], partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = [NewTopic(name, partitions, 1) for name in names]  # type: ignore[attr-defined]
    for fut in admin.create_topics(new).values():
        fut.result(10)


def events(first: int, count: int) -> Iterator[tuple[str, str, bytes]]:
    """(topic suffix, key, value) of `count` catalogue events, alternating topics."""
    for i in range(first, first + count):
        client = f"client-{i % 37}"
        if i % 2:
            event: Any = Subscribed(
                client_id=client, version=i + 1, node="n1", ts_ms=i, filter=f"a/{i}", qos=1
            )
        else:
            event = SessionOpened(
                client_id=client,
                version=i + 1,
                node="n1",
                ts_ms=i,
                epoch=1,
                clean_start=False,
                expiry_s=60,
                protocol=5,
            )
        yield encode(event)


def produce(
    bootstrap: str,
    prefix: str,
    first: int,
    count: int,
    *,
    partition: int | None = None,
    only: str | None = None,
) -> list[Record]:
    """Produce events `first`.. (those of topic suffix `only`, if given) and
    return them as the broker stored them."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "acks": "all"}
    )
    stored: list[Record] = []

    def delivered(err: Any, msg: Message) -> None:
        assert err is None, err
        key, value = msg.key(), msg.value()
        assert isinstance(key, bytes) and isinstance(value, bytes)
        stored.append(
            (
                str(msg.topic()),
                int(msg.partition() or 0),
                int(msg.offset() or 0),
                key.decode(),
                value,
            )
        )

    for suffix, key, value in events(first, count):
        if only is not None and suffix != only:
            continue
        extra = {} if partition is None else {"partition": partition}
        producer.produce(prefix + suffix, value, key.encode(), on_delivery=delivered, **extra)
    assert producer.flush(30) == 0
    return stored


class Collector:
    """A foreachBatch sink: every micro-batch's rows, by batch id."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, list[Record]]] = []
        self.lock = threading.Lock()

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        rows = [(r.topic, r.partition, r.offset, r.key, bytes(r.value)) for r in batch.collect()]
        with self.lock:
            self.batches.append((batch_id, rows))

    def records(self) -> list[Record]:
        with self.lock:
            return [r for _, rows in sorted(self.batches) for r in rows]


def start(
    df: DataFrame, checkpoint: Path, sink: Collector, *, available_now: bool = True
) -> StreamingQuery:
    stream = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
    if available_now:
        return stream.trigger(availableNow=True).start()
    return stream.trigger(processingTime="200 milliseconds").start()


def finish(query: StreamingQuery) -> None:
    if not query.awaitTermination(QUERY_TIMEOUT_S):
        query.stop()
        raise AssertionError(f"the query did not finish within {QUERY_TIMEOUT_S} s")


def assert_exactly(read: list[Record], produced: list[Record]) -> None:
    """Every produced record read once, and each partition in offset order."""
    assert sorted(read) == sorted(produced)
    per_partition: dict[tuple[str, int], list[int]] = {}
    for topic, partition, offset, _, _ in read:
        per_partition.setdefault((topic, partition), []).append(offset)
    for offsets in per_partition.values():
        assert offsets == sorted(offsets)


def test_connector_absent_here_so_the_python_source_reads(
    spark: SparkSession, kafka_bootstrap: str, topics: list[str]
) -> None:
    assert not connector_available(spark)  # no Maven on this machine: no connector jar
    df = read_log(spark, kafka_bootstrap, topics)
    assert df.isStreaming
    assert tuple(df.columns) == RAW_COLUMNS
    assert df.schema == raw_schema()


def test_every_record_once_in_offset_order_while_the_log_grows(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic_prefix: str,
    topics: list[str],
    tmp_path: Path,
) -> None:
    produced = produce(kafka_bootstrap, kafka_topic_prefix, 0, 400)
    sink = Collector()
    query = start(read_log(spark, kafka_bootstrap, topics), tmp_path, sink, available_now=False)
    try:
        wait_until(lambda: len(sink.records()) >= 400, "the first 400 records", QUERY_TIMEOUT_S)
        produced += produce(kafka_bootstrap, kafka_topic_prefix, 400, 300)
        wait_until(lambda: len(sink.records()) >= 700, "all 700 records", QUERY_TIMEOUT_S)
        produced += produce(kafka_bootstrap, kafka_topic_prefix, 700, 100)
        wait_until(lambda: len(sink.records()) >= 800, "all 800 records", QUERY_TIMEOUT_S)
    finally:
        query.stop()
    assert len([b for b in sink.batches if b[1]]) >= 3  # several non-empty micro-batches
    assert_exactly(sink.records(), produced)
    assert {p for _, p, _, _, _ in produced} == set(range(PARTITIONS))


def test_rows_carry_the_record_as_stored(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic_prefix: str,
    topics: list[str],
    tmp_path: Path,
) -> None:
    produce(kafka_bootstrap, kafka_topic_prefix, 0, 10)
    rows: list[Any] = []
    query = (
        read_log(spark, kafka_bootstrap, topics)
        .writeStream.foreachBatch(lambda batch, _: rows.extend(batch.collect()))
        .option("checkpointLocation", str(tmp_path))
        .trigger(availableNow=True)
        .start()
    )
    finish(query)
    assert len(rows) == 10
    expected = {key: value for _, key, value in events(0, 10)}
    for row in rows:
        assert bytes(row.value) == expected[row.key]
        assert abs(row.timestamp.timestamp() - time.time()) < 600


def test_restart_from_the_checkpoint_reads_only_new_records(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic_prefix: str,
    topics: list[str],
    tmp_path: Path,
) -> None:
    first = produce(kafka_bootstrap, kafka_topic_prefix, 0, 200)
    sink = Collector()
    finish(start(read_log(spark, kafka_bootstrap, topics), tmp_path, sink))
    assert_exactly(sink.records(), first)

    more = produce(kafka_bootstrap, kafka_topic_prefix, 200, 150)
    again = Collector()
    finish(start(read_log(spark, kafka_bootstrap, topics), tmp_path, again))
    assert_exactly(again.records(), more)

    idle = Collector()  # nothing new: the third run reads nothing
    finish(start(read_log(spark, kafka_bootstrap, topics), tmp_path, idle))
    assert idle.records() == []


def test_max_records_per_trigger_bounds_every_batch(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic_prefix: str,
    topics: list[str],
    tmp_path: Path,
) -> None:
    produced = produce(kafka_bootstrap, kafka_topic_prefix, 0, 300)
    sink = Collector()
    df = read_log(spark, kafka_bootstrap, topics, max_records_per_trigger=70)
    finish(start(df, tmp_path, sink))
    sizes = [len(rows) for _, rows in sorted(sink.batches)]
    assert max(sizes) <= 70
    assert len(sizes) >= 5  # 300 records / 70 per batch
    assert_exactly(sink.records(), produced)
    first_batch = sorted(sink.batches)[0][1]  # shared over the partitions, not one drained first
    assert len({(t, p) for t, p, _, _, _ in first_batch}) == 2 * PARTITIONS


def test_starting_offsets_are_honoured(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic_prefix: str,
    topics: list[str],
    tmp_path: Path,
) -> None:
    produced = produce(kafka_bootstrap, kafka_topic_prefix, 0, 200)
    sessions = topics[0]
    starting = {sessions: {"0": 5, 1: 0, "2": 3}}  # partition 3 omitted
    sink = Collector()
    df = read_log(spark, kafka_bootstrap, topics, starting_offsets=starting)
    finish(start(df, tmp_path, sink))
    skip = from_json(starting)
    expected = [r for r in produced if r[2] >= skip.get((r[0], r[1]), 0)]
    assert len(expected) < len(produced)
    assert_exactly(sink.records(), expected)


def test_a_checkpoint_ahead_of_the_log_fails_the_query(
    spark: SparkSession, kafka_bootstrap: str, kafka_topic_prefix: str, tmp_path: Path
) -> None:
    from pyspark.errors import StreamingQueryException

    topic = kafka_topic_prefix + "sessions"
    create(kafka_bootstrap, [topic], partitions=2)
    for partition in (0, 1):
        produce(kafka_bootstrap, kafka_topic_prefix, 0, 10, partition=partition, only="sessions")
    sink = Collector()
    finish(start(read_log(spark, kafka_bootstrap, [topic]), tmp_path, sink))
    assert len(sink.records()) == 10  # 5 session events per partition: offsets 0..4

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for fut in admin.delete_topics([topic]).values():  # the log starts over, shorter
        fut.result(10)
    create(kafka_bootstrap, [topic], partitions=2)
    produce(kafka_bootstrap, kafka_topic_prefix, 0, 8, partition=0, only="sessions")  # 4 records

    again = Collector()
    query = start(read_log(spark, kafka_bootstrap, [topic]), tmp_path, again)
    with pytest.raises(StreamingQueryException) as failure:
        finish(query)
    text = str(failure.value)
    assert "data loss: the checkpoint is ahead of the log" in text
    assert f"topic {topic} partition 0: checkpoint offset 5, log end 4" in text
    assert f"topic {topic} partition 1: checkpoint offset 5, log end 0" in text
    assert "remove the job's checkpoint" in text
    assert again.records() == []  # nothing skipped or read again


def test_kafka_unreachable_fails_after_a_bounded_wait(spark: SparkSession, tmp_path: Path) -> None:
    from pyspark.errors import StreamingQueryException

    nobody = f"127.0.0.1:{free_port()}"
    began = time.monotonic()
    query = start(read_log(spark, nobody, ["t.sessions"], timeout_s=2.0), tmp_path, Collector())
    with pytest.raises(StreamingQueryException) as failure:
        finish(query)
    assert "LogUnavailable" in str(failure.value)
    assert f"Kafka at {nobody}" in str(failure.value)
    assert time.monotonic() - began < 60


# -- pure parts --------------------------------------------------------------


def test_offsets_json_is_the_connectors_shape() -> None:
    positions = {("a", 1): 7, ("a", 0): 3, ("b", 0): 0}
    assert to_json(positions) == {"a": {"0": 3, "1": 7}, "b": {"0": 0}}
    assert from_json(json.loads(json.dumps(to_json(positions)))) == positions


def test_fair_cap_shares_the_limit_max_min_fairly() -> None:
    start = {("t", 0): 0, ("t", 1): 10, ("t", 2): 5, ("t", 3): 0}
    ends = {("t", 0): 100, ("t", 1): 12, ("t", 2): 105, ("t", 3): 0, ("t", 4): 0}
    capped = fair_cap(start, ends, 50)
    taken = {tp: capped[tp] - start.get(tp, capped[tp]) for tp in capped}
    assert taken == {("t", 0): 24, ("t", 1): 2, ("t", 2): 24, ("t", 3): 0, ("t", 4): 0}
    assert fair_cap(start, ends, 10**6) == ends
    assert sum(fair_cap(start, ends, 3)[tp] - start.get(tp, 0) for tp in start) == 3


def test_connector_options_name_every_partition() -> None:
    parts = [("a", 0), ("a", 1), ("b", 0)]
    options = connector_options("k:9092", ["a", "b"], {("a", 1): 42}, 500, parts)
    assert json.loads(options["startingOffsets"]) == {"a": {"0": -2, "1": 42}, "b": {"0": -2}}
    assert options["subscribe"] == "a,b"
    assert options["failOnDataLoss"] == "true"
    assert options["maxOffsetsPerTrigger"] == "500"
    assert connector_options("k:9092", ["a"], None, None, [])["startingOffsets"] == "earliest"
