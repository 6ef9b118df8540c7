"""Where a rule's rows go: the `foreachBatch` writers of `streams.rules`.

Theory of operation. Spark's own Kafka sink is in the connector jar this
machine cannot fetch, and its file sink only appends, so each sink is a
`foreachBatch` function, called with one micro-batch of the rule's result
and its batch id:

- `KafkaSink`: each row as one JSON object (`to_json` of the row, in the
  JVM) to the sink topic, keyed by the rule's `key` column (as text), with
  headers `weir-rule` (the rule's name) and `weir-batch` ("<query
  id>:<batch id>"). Rows are produced from the executors
  (`foreachPartition`, one confluent-kafka producer per Python worker,
  kept across batches), `acks=all`, idempotent; a partition's task waits
  for every delivery and fails when one fails, which fails the batch, so
  Spark re-runs it from the checkpoint. That makes the sink at least once: a
  batch re-run after a crash produces its rows again, with the same
  `weir-batch` header, by which a consumer can drop the repeats.
- `ParquetSink`: `<data-dir>/rules/<name>/query_id=<Q>/batch_id=<N>/`,
  overwritten, so a re-run batch replaces its own output (exactly once);
  an empty batch writes nothing. In update mode an aggregate's row is
  written again by every batch that changes it: the newest batch_id of a
  key is its current value.
- `ConsoleSink`: the first `CONSOLE_ROWS` rows of each batch as JSON lines
  in the job's log.

Each writer persists the batch while it reads it twice (emptiness, then
the rows), so a stateful query's batch is computed once.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from confluent_kafka import Producer
    from pyspark.sql import DataFrame

log = logging.getLogger("weir.streams.rules")

CONSOLE_ROWS: Final = 20  # rows of a batch logged by the console sink; the rest are counted
DELIVERY_TIMEOUT_S: Final = 30.0  # a batch's records must be in Kafka within this, or it fails
LINGER_MS: Final = 5  # a rule's output is small and latency is the point: short batches
RULE_HEADER: Final = "weir-rule"
BATCH_HEADER: Final = "weir-batch"


class KafkaSink:
    """The `foreachBatch` writer of a rule with sink = "kafka"."""

    def __init__(self, rule: str, bootstrap: str, topic: str, key: str | None,
                 partitions: int) -> None:  # fmt: skip
        self.rule, self.bootstrap, self.topic, self.key = rule, bootstrap, topic, key
        self.partitions = partitions
        self.query_id = ""  # the checkpoint's (streams.analytics.query_id), set at start
        self.rows = 0
        self.batches = 0

    def create_topic(self, timeout_s: float = 10.0) -> None:
        """Create the sink topic when it is missing (partitions = 0: never)."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        if self.partitions == 0:
            return
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        future = admin.create_topics([NewTopic(self.topic, self.partitions, 1)])[self.topic]
        try:
            future.result(timeout_s)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc.args[0].name() if exc.args else exc):
                raise

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F

        key = F.col(f"`{self.key}`").cast("string") if self.key else F.lit(None).cast("string")
        out = df.select(key.alias("key"), F.to_json(F.struct("*")).alias("value"))
        started = time.monotonic()
        headers = ((RULE_HEADER, self.rule), (BATCH_HEADER, f"{self.query_id}:{batch_id}"))
        target = (self.bootstrap, self.topic, headers)
        counter = df.sparkSession.sparkContext.accumulator(0)

        def write(rows: Iterable[Any]) -> None:
            counter.add(produce_rows(target, ((r["key"], r["value"]) for r in rows)))

        out.foreachPartition(write)
        self.batches += 1
        self.rows += counter.value
        if counter.value:
            log.info("rule %s: batch %d: %d rows to Kafka topic %s in %.2f s", self.rule, batch_id,
                     counter.value, self.topic, time.monotonic() - started)  # fmt: skip


# One producer per Python worker process and Kafka cluster, kept across batches
# (Spark reuses its Python workers): a producer's start is a connection and a
# metadata round trip, which a small batch would pay every trigger.
_producers: dict[str, Producer] = {}
_producers_lock = threading.Lock()


def _producer(bootstrap: str) -> Producer:
    from confluent_kafka import Producer

    with _producers_lock:
        found = _producers.get(bootstrap)
        if found is None:
            found = _producers[bootstrap] = Producer({
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "partitioner": "murmur2_random",  # a key lands where a Java client puts it
                "linger.ms": LINGER_MS,
                "delivery.timeout.ms": int(DELIVERY_TIMEOUT_S * 1000),
            })  # fmt: skip
        return found


def produce_rows(
    target: tuple[str, str, tuple[tuple[str, str], ...]], rows: Iterable[tuple[Any, Any]]
) -> int:
    """Produce (key, value) rows to target = (bootstrap, topic, headers) and
    wait for every delivery: how many; RuntimeError (one line) when one fails."""
    bootstrap, topic, headers = target
    producer = _producer(bootstrap)
    failed: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    sent = 0
    for key, value in rows:
        while True:
            try:
                producer.produce(topic, key=key, value=value, headers=list(headers),
                                 on_delivery=report)  # fmt: skip
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.1)
        sent += 1
    left = producer.flush(DELIVERY_TIMEOUT_S)
    if failed or left:
        what = failed[0] if failed else f"{left} not acknowledged in {DELIVERY_TIMEOUT_S:.0f} s"
        raise RuntimeError(f"Kafka topic {topic}: {len(failed) or left} of {sent} rows "
                           f"not delivered: {what}")  # fmt: skip
    return sent


class ParquetSink:
    """The `foreachBatch` writer of a rule with sink = "parquet"."""

    def __init__(self, rule: str, out_dir: Path) -> None:
        self.rule, self.out_dir = rule, out_dir
        self.query_id = ""  # the checkpoint's (streams.analytics.query_id), set at start
        self.rows = 0
        self.batches = 0

    def path(self, batch_id: int) -> Path:
        return self.out_dir / f"query_id={self.query_id}" / f"batch_id={batch_id}"

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        target = self.path(batch_id)
        df.persist()
        try:
            count = df.count()
            if count:
                df.coalesce(1).write.mode("overwrite").parquet(str(target))
            else:  # nothing this batch (a re-run finds the same)
                shutil.rmtree(target, ignore_errors=True)
        finally:
            df.unpersist()
        self.batches += 1
        self.rows += count
        if count:
            log.info("rule %s: batch %d: %d rows to %s", self.rule, batch_id, count, target)


class ConsoleSink:
    """The `foreachBatch` writer of a rule with sink = "console": rows in the log."""

    def __init__(self, rule: str) -> None:
        self.rule = rule
        self.query_id = ""
        self.rows = 0
        self.batches = 0

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F

        rows = df.select(F.to_json(F.struct("*")).alias("row")).take(CONSOLE_ROWS + 1)
        for row in rows[:CONSOLE_ROWS]:
            log.info("rule %s: batch %d: %s", self.rule, batch_id, row["row"])
        if len(rows) > CONSOLE_ROWS:
            log.info("rule %s: batch %d: more rows not shown", self.rule, batch_id)
        self.batches += 1
        self.rows += min(len(rows), CONSOLE_ROWS)  # the rows shown


def describe(sink: KafkaSink | ParquetSink | ConsoleSink) -> str:
    if isinstance(sink, KafkaSink):
        return f"Kafka topic {sink.topic}" + (f" keyed by {sink.key}" if sink.key else "")
    if isinstance(sink, ParquetSink):
        return str(sink.out_dir)
    return "the log"

