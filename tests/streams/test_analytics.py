"""The analytics transforms on small hand-made batches, the batch writer, and run()."""

from __future__ import annotations

import dataclasses
import datetime
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from services.event.schema import (
    SESSIONS,
    SUBSCRIPTIONS,
    Event,
    RetainedSet,
    SessionClosed,
    SessionDiscarded,
    SessionExpired,
    SessionOpened,
    Subscribed,
    Unsubscribed,
)
from streams import analytics
from streams.events import as_raw_rows, parse, raw_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

PREFIX = "weir."
T0 = 1_700_000_040_000  # ms, the start of a minute
MINUTE = 60_000


def opened(client: str, version: int, ts_ms: int, node: str = "n1") -> SessionOpened:
    return SessionOpened(
        client_id=client,
        version=version,
        node=node,
        ts_ms=ts_ms,
        epoch=version,
        clean_start=False,
        expiry_s=60,
        protocol=5,
        username="u-" + client,
        peer="127.0.0.1:4000",
    )


def closed(client: str, version: int, ts_ms: int, reason: Any, node: str = "n1") -> SessionClosed:
    return SessionClosed(
        client_id=client, version=version, node=node, ts_ms=ts_ms, reason=reason, expiry_s=60
    )


def sub(client: str, version: int, ts_ms: int, topic_filter: str) -> Subscribed:
    return Subscribed(
        client_id=client, version=version, node="n1", ts_ms=ts_ms, filter=topic_filter, qos=1
    )


def unsub(client: str, version: int, ts_ms: int, topic_filter: str) -> Unsubscribed:
    return Unsubscribed(
        client_id=client, version=version, node="n1", ts_ms=ts_ms, filter=topic_filter
    )


def raw(
    spark: SparkSession, items: list[Event | bytes], *, suffixes: list[str] | None = None
) -> DataFrame:
    """A raw log batch: each item in its event's topic (or `suffixes[i]`), offsets 0.."""
    records: list[tuple[str, int, int, Event | bytes]] = []
    for offset, item in enumerate(items):
        suffix = (
            suffixes[offset]
            if suffixes
            else (SESSIONS if isinstance(item, bytes) else item.topic_suffix)
        )
        records.append((suffix, 0, offset, item))
    return spark.createDataFrame(as_raw_rows(records, PREFIX), raw_schema())


def parsed(spark: SparkSession, items: list[Event | bytes]) -> DataFrame:
    return parse(raw(spark, items), PREFIX)


def minute(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC).replace(tzinfo=None)


def rows(df: DataFrame, *columns: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r[c] for c in columns) for r in df.collect())


# -- transforms ---------------------------------------------------------------------


def test_history_has_one_row_per_session_event_and_nothing_else(spark: SparkSession) -> None:
    items: list[Event | bytes] = [
        opened("a", 1, T0 + 1000, node="n2"),
        sub("a", 2, T0 + 1500, "x/#"),
        closed("a", 3, T0 + 2000, "keepalive", node="n2"),
        SessionExpired(client_id="a", version=4, node="n1", ts_ms=T0 + 9000),
        SessionDiscarded(client_id="b", version=1, node="n1", ts_ms=T0 + 9500),
        RetainedSet(topic="t", version=1, node="n1", ts_ms=T0, payload=b"p", qos=0),
        b"not json",
    ]
    out = analytics.history(parsed(spark, items))
    got = rows(out, "client_id", "type", "node", "ts_ms", "version", "reason", "protocol", "offset")
    assert got == [
        ("a", "session_closed", "n2", T0 + 2000, 3, "keepalive", None, 2),
        ("a", "session_expired", "n1", T0 + 9000, 4, None, None, 3),
        ("a", "session_opened", "n2", T0 + 1000, 1, None, 5, 0),
        ("b", "session_discarded", "n1", T0 + 9500, 1, None, None, 4),
    ]
    first = out.where("type = 'session_opened'").first()
    assert first is not None
    assert first["username"] == "u-a"
    assert first["peer"] == "127.0.0.1:4000"
    assert first["ts"] == minute(T0 + 1000)
    assert first["topic"] == PREFIX + SESSIONS


def test_churn_counts_connects_disconnects_and_lost_links_per_client_minute(
    spark: SparkSession,
) -> None:
    items: list[Event | bytes] = [
        opened("a", 1, T0 + 1_000),
        closed("a", 2, T0 + 2_000, "keepalive"),
        opened("a", 3, T0 + 3_000),
        closed("a", 4, T0 + 4_000, "normal"),
        opened("a", 5, T0 + 59_999),
        closed("a", 6, T0 + MINUTE, "error"),  # the next minute
        opened("b", 1, T0 + MINUTE + 5),
        closed("b", 2, T0 + MINUTE + 6, "takenover"),
        SessionExpired(client_id="b", version=3, node="n1", ts_ms=T0 + MINUTE + 7),
        sub("a", 7, T0, "x"),
    ]
    out = analytics.churn(parsed(spark, items))
    assert rows(out, "client_id", "minute", "connects", "disconnects", "lost") == [
        ("a", minute(T0), 3, 2, 1),
        ("a", minute(T0 + MINUTE), 0, 1, 1),
        ("b", minute(T0 + MINUTE), 1, 1, 0),
    ]


def test_subscriptions_per_filter_minute_count_both_ways_and_the_net(spark: SparkSession) -> None:
    items: list[Event | bytes] = [
        sub("a", 1, T0 + 10, "x/#"),
        sub("b", 1, T0 + 20, "x/#"),
        unsub("a", 2, T0 + 30, "x/#"),
        sub("a", 3, T0 + 40, "y"),
        unsub("b", 2, T0 + MINUTE + 1, "x/#"),
        opened("a", 4, T0 + 50),
    ]
    out = analytics.subscriptions(parsed(spark, items))
    assert rows(out, "filter", "minute", "subscribes", "unsubscribes", "net") == [
        ("x/#", minute(T0), 2, 1, 1),
        ("x/#", minute(T0 + MINUTE), 0, 1, -1),
        ("y", minute(T0), 1, 0, 1),
    ]


def test_sessions_per_node_minute_and_the_running_online_count(spark: SparkSession) -> None:
    first: list[Event | bytes] = [
        opened("a", 1, T0 + 1, node="n1"),
        opened("b", 1, T0 + 2, node="n1"),
        opened("c", 1, T0 + 3, node="n2"),
        closed("a", 2, T0 + MINUTE + 1, "takenover", node="n1"),
    ]
    second: list[Event | bytes] = [
        opened("a", 3, T0 + 4, node="n2"),  # same minute as the first batch's: partial rows
        closed("b", 2, T0 + 2 * MINUTE, "normal", node="n1"),
    ]
    one = analytics.sessions(parsed(spark, first))
    two = analytics.sessions(parsed(spark, second))
    assert rows(one, "node", "minute", "opened", "closed", "net") == [
        ("n1", minute(T0), 2, 0, 2),
        ("n1", minute(T0 + MINUTE), 0, 1, -1),
        ("n2", minute(T0), 1, 0, 1),
    ]
    out = analytics.online(one.unionByName(two))
    assert rows(out, "node", "minute", "opened", "closed", "online") == [
        ("n1", minute(T0), 2, 0, 2),
        ("n1", minute(T0 + MINUTE), 0, 1, 1),
        ("n1", minute(T0 + 2 * MINUTE), 0, 1, 0),
        ("n2", minute(T0), 2, 0, 2),
    ]


def test_flapping_finds_clients_over_the_threshold_in_any_sliding_window(
    spark: SparkSession,
) -> None:
    n = analytics.FLAPPING_CONNECTS
    start = T0 + 50_000  # straddles a minute boundary: no tumbling minute holds n connects
    step = (analytics.FLAPPING_WINDOW_MS - 1) // (n - 1)  # n connects within one window
    items: list[Event | bytes] = [opened("flap", i + 1, start + i * step) for i in range(n)]
    # one short of the threshold in any window: n connects spread over 61 s
    items += [opened("calm", i + 1, T0 + i * (61_000 // (n - 1))) for i in range(n)]
    items += [opened("once", 1, T0), closed("flap", 99, start + 1, "keepalive")]
    history = analytics.history(parsed(spark, items))
    out = analytics.flapping(history)
    assert rows(out, "client_id", "connects", "peak", "peak_ms", "nodes") == [
        ("flap", n, n, start + (n - 1) * step, 1)
    ]
    per_minute = analytics.churn(parsed(spark, items)).where("client_id = 'flap'")
    assert max(r["connects"] for r in per_minute.collect()) < n
    # the threshold and window are options
    lower = analytics.flapping(history, connects=n - 1)
    assert rows(lower, "client_id", "peak") == [("calm", n - 1), ("flap", n)]
    short = analytics.flapping(history, connects=3, window_ms=8_001)
    assert rows(short, "client_id", "peak") == [("flap", 3)]


def test_invalid_records_are_marked_with_their_offsets_and_counted_nowhere_else(
    spark: SparkSession,
) -> None:
    good = opened("a", 1, T0)
    items: list[Event | bytes] = [
        good,
        b"not json",
        b'{"type":"mystery","schema_version":1}',
        b'{"type":"session_expired","schema_version":9,"client_id":"a","version":1,"node":"n","ts_ms":1}',
        good,  # a session event in the subscriptions topic
    ]
    suffixes = [SESSIONS, SESSIONS, SESSIONS, SESSIONS, SUBSCRIPTIONS]
    events = parse(raw(spark, items, suffixes=suffixes), PREFIX)
    assert rows(analytics.invalid(events), "topic", "partition", "offset") == [
        (PREFIX + SESSIONS, 0, 1),
        (PREFIX + SESSIONS, 0, 2),
        (PREFIX + SESSIONS, 0, 3),
        (PREFIX + SUBSCRIPTIONS, 0, 4),
    ]
    assert rows(analytics.history(events), "client_id", "offset") == [("a", 0)]
    assert analytics.subscriptions(events).count() == 0


# -- the batch writer ---------------------------------------------------------------


def read(spark: SparkSession, out: Path, table: str) -> DataFrame:
    return spark.read.parquet(str(out / table))


def test_batch_writer_writes_each_table_per_batch_and_a_rerun_replaces_itself(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "analytics"
    writer = analytics.BatchWriter(out, PREFIX, "q1")
    batch0 = raw(spark, [opened("a", 1, T0), sub("a", 2, T0 + 1, "x"), b"\xff garbage"])
    batch1 = raw(spark, [closed("a", 3, T0 + 5, "keepalive")])
    with caplog.at_level(logging.INFO, logger="weir.streams.analytics"):
        writer(batch0, 0)
        writer(batch1, 1)
        writer(batch0, 0)  # Spark re-runs batch 0 after a crash
    assert rows(read(spark, out, "history"), "batch_id", "client_id", "type") == [
        (0, "a", "session_opened"),
        (1, "a", "session_closed"),
    ]
    assert rows(read(spark, out, "churn"), "batch_id", "connects", "disconnects", "lost") == [
        (0, 1, 0, 0),
        (1, 0, 1, 1),
    ]
    assert rows(read(spark, out, "subscriptions"), "batch_id", "filter", "net") == [(0, "x", 1)]
    assert rows(read(spark, out, "sessions"), "batch_id", "node", "net") == [
        (0, "n1", 1),
        (1, "n1", -1),
    ]
    assert rows(read(spark, out, "invalid"), "batch_id", "topic", "offset") == [
        (0, PREFIX + SESSIONS, 2)
    ]
    assert writer.path("subscriptions", 0) == out / "subscriptions" / "query_id=q1" / "batch_id=0"
    assert writer.path("subscriptions", 0).is_dir()
    assert not writer.path("subscriptions", 1).exists()  # nothing of it in batch 1
    assert (writer.batches, writer.records, writer.invalid) == (3, 7, 2)
    skipped = [r.getMessage() for r in caplog.records if "not an event" in r.getMessage()]
    message = f"analytics: batch 0: skipped a record that is not an event: {PREFIX}sessions[0]"
    assert skipped == [message + " offset 2"] * 2


def test_batch_writer_logs_the_first_offsets_and_counts_every_invalid_record(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    many = analytics.INVALID_LOGGED_PER_BATCH + 5
    writer = analytics.BatchWriter(tmp_path, PREFIX, "q1")
    with caplog.at_level(logging.WARNING, logger="weir.streams.analytics"):
        writer(raw(spark, [b"x"] * many), 7)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("not an event" in m for m in messages) == analytics.INVALID_LOGGED_PER_BATCH
    assert any("5 more invalid records skipped" in m for m in messages)
    assert writer.invalid == many
    assert read(spark, tmp_path, "invalid").count() == many
    assert sorted(p.name for p in tmp_path.iterdir()) == ["invalid"]


def test_query_id_is_the_checkpoints_and_a_new_checkpoint_gets_a_new_one(tmp_path: Path) -> None:
    first = analytics.query_id(tmp_path / "cp")
    assert analytics.query_id(tmp_path / "cp") == first
    assert (tmp_path / "cp" / "metadata").exists()
    assert analytics.query_id(tmp_path / "other") != first
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "metadata").write_text("[1, 2]")
    with pytest.raises(RuntimeError, match="not a Spark checkpoint"):
        analytics.query_id(tmp_path / "bad")


# -- run(): the job over the embedded Kafka -----------------------------------------


def produce(bootstrap: str, prefix: str, items: list[Event | bytes]) -> list[tuple[str, int, int]]:
    """Write `items` to the log (bytes go to the sessions topic, key "junk");
    (topic, partition, offset) of each, in order."""
    from confluent_kafka import Producer, admin

    from services.event.schema import encode, topic_names

    client = admin.AdminClient({"bootstrap.servers": bootstrap})
    futures = client.create_topics([admin.NewTopic(t, 2, 1) for t in topic_names(prefix)])
    for future in futures.values():
        try:
            future.result(10)
        except Exception as exc:  # created by an earlier call of this test
            assert "already exists" in str(exc).lower(), exc
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "enable.idempotence": True,
        }
    )
    where: list[tuple[str, int, int] | None] = [None] * len(items)

    def delivered(i: int) -> Any:
        def report(err: Any, msg: Any) -> None:
            assert err is None, err
            where[i] = (msg.topic(), msg.partition(), msg.offset())

        return report

    for i, item in enumerate(items):
        if isinstance(item, bytes):
            suffix, key, value = SESSIONS, "junk", item
        else:
            suffix, key, value = encode(item)
        producer.produce(prefix + suffix, key=key, value=value, on_delivery=delivered(i))
    assert producer.flush(10) == 0
    assert all(w is not None for w in where)
    return [w for w in where if w is not None]


def table(data_dir: Path, name: str) -> Any:
    import pyarrow.dataset as ds

    path = data_dir / "analytics" / name
    return ds.dataset(path, format="parquet", partitioning="hive").to_table().to_pandas()


def job_config(bootstrap: str, prefix: str, data_dir: Path, **kw: Any) -> Any:
    from streams.config import JobConfig

    return JobConfig(
        bootstrap=bootstrap,
        redis_url="redis://unused",
        data_dir=str(data_dir),
        topic_prefix=prefix,
        **kw,
    )


@pytest.mark.kafka
def test_run_reads_the_log_once_across_runs_and_skips_invalid_records(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic_prefix: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from streams import report

    n = analytics.FLAPPING_CONNECTS
    first: list[Event | bytes] = [
        opened("flap", i + 1, T0 + i * 1_000, node=f"n{i % 2}") for i in range(n)
    ]
    first += [sub("s", 1, T0, "a/#"), unsub("s", 2, T0 + 5, "a/#"), b"{broken"]
    where = produce(kafka_bootstrap, kafka_topic_prefix, first)
    config = job_config(kafka_bootstrap, kafka_topic_prefix, tmp_path, available_now=True)
    with caplog.at_level(logging.INFO, logger="weir.streams.analytics"):
        assert analytics.run(config) == 0
    history = table(tmp_path, "history")
    assert sorted(history["version"]) == list(range(1, n + 1))
    bad_topic, bad_partition, bad_offset = where[-1]
    bad = table(tmp_path, "invalid")
    assert [tuple(r) for r in bad[["topic", "partition", "offset"]].itertuples(index=False)] == [
        (bad_topic, bad_partition, bad_offset)
    ]
    logged = (
        f"skipped a record that is not an event: {bad_topic}[{bad_partition}] offset {bad_offset}"
    )
    assert any(logged in r.getMessage() for r in caplog.records)
    subs = table(tmp_path, "subscriptions")
    assert (subs["subscribes"].sum(), subs["unsubscribes"].sum()) == (1, 1)
    assert list(report.flapping(history)["client_id"]) == ["flap"]

    # a second run over the same checkpoint reads only what is new
    produce(kafka_bootstrap, kafka_topic_prefix, [closed("flap", n + 1, T0 + n * 1_000, "normal")])
    assert analytics.run(config) == 0
    history = table(tmp_path, "history")
    assert sorted(history["version"]) == list(range(1, n + 2))
    assert len(table(tmp_path, "invalid")) == 1
    assert set(history["query_id"]) == {analytics.query_id(config.checkpoint("analytics"))}
    assert history["batch_id"].nunique() >= 2


@pytest.mark.kafka
def test_run_keeps_going_until_sigterm_and_then_stops_cleanly(
    spark: SparkSession, kafka_bootstrap: str, kafka_topic_prefix: str, tmp_path: Path
) -> None:
    import os
    import signal
    import threading
    import time

    produce(kafka_bootstrap, kafka_topic_prefix, [opened("a", 1, T0)])
    config = job_config(kafka_bootstrap, kafka_topic_prefix, tmp_path, trigger_s=0.2)
    history_dir = tmp_path / "analytics" / "history"
    seen: list[str] = []

    def watch() -> None:
        """Add an event once the first is written, then SIGTERM once both are."""
        deadline = time.monotonic() + 120
        wanted = 1
        while time.monotonic() < deadline:
            if history_dir.is_dir() and len(list(history_dir.rglob("*.parquet"))) >= wanted:
                if wanted == 2:
                    seen.extend(str(q.id) for q in spark.streams.active)
                    os.kill(os.getpid(), signal.SIGTERM)  # run() holds SIGTERM by now
                    return
                produce(kafka_bootstrap, kafka_topic_prefix, [closed("a", 2, T0 + 1, "normal")])
                wanted = 2
            threading.Event().wait(0.1)  # polling the file system, not standing in for a sync
        for query in spark.streams.active:  # give up: end run() without a signal
            query.stop()

    watcher = threading.Thread(target=watch, daemon=True)
    previous = signal.getsignal(signal.SIGTERM)
    watcher.start()
    assert analytics.run(config) == 0
    watcher.join(10)
    assert seen == [analytics.query_id(config.checkpoint("analytics"))]  # Spark took our id
    assert signal.getsignal(signal.SIGTERM) is previous
    assert not spark.streams.active
    assert sorted(table(tmp_path, "history")["type"]) == ["session_closed", "session_opened"]


@pytest.mark.kafka
def test_run_ends_with_1_when_the_checkpoint_is_ahead_of_the_log(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic_prefix: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from confluent_kafka import admin

    from services.event.schema import topic_names

    produce(kafka_bootstrap, kafka_topic_prefix, [opened("a", 1, T0), opened("a", 2, T0 + 1)])
    config = job_config(kafka_bootstrap, kafka_topic_prefix, tmp_path, trigger_s=0.2)
    assert analytics.run(dataclasses.replace(config, available_now=True)) == 0
    client = admin.AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in client.delete_topics(list(topic_names(kafka_topic_prefix))).values():
        future.result(10)
    produce(kafka_bootstrap, kafka_topic_prefix, [])  # the log, recreated empty
    with caplog.at_level(logging.INFO, logger="weir.streams.analytics"):
        assert analytics.run(config) == 1  # not available_now: it would retry anything else
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "data loss" in errors[0].lower()
    assert len(table(tmp_path, "history")) == 2  # what the first run wrote is kept
