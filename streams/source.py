"""The event log as a streaming DataFrame: Spark's Kafka connector where the
JVM has it, else the Python source of streams.kafka_source.

Theory of operation. `read_log` asks the JVM for the connector's class
(`spark-submit --packages spark-sql-kafka-0-10`, as docker compose runs
the job). With it, the log is `format("kafka")`: subscribe, failOnDataLoss,
maxOffsetsPerTrigger, startingOffsets as JSON with every partition the
caller omits at -2 (earliest; the connector wants them all). Without it
(this machine: no Maven; and the connector must not meet Tansu, whose
ListOffsets it relies on), it is `KafkaLogSource` over confluent-kafka.

Either way the DataFrame has exactly `streams.events.RAW_COLUMNS`, the key
as a string, and Spark's checkpoint is the only record of progress, in the
connector's offsets JSON {"<topic>": {"<partition>": next_offset}}; a
checkpoint still belongs to the reader that wrote it (switching needs a new
checkpoint seeded from the offsets recorded with the state). A checkpoint
ahead of the log fails the query with a message that starts "data loss:"
(DataLoss in the Python source, the connector's own words otherwise);
Kafka unreachable fails after a bounded wait (LogUnavailable), and the
job's runner retries from the checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from streams.events import RAW_COLUMNS
from streams.kafka_client import (
    DEFAULT_TIMEOUT_S,
    EARLIEST,
    TP,
    DataLoss,
    LogUnavailable,
    Positions,
    SourceError,
    from_json,
    to_json,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

KAFKA_PROVIDER: Final = "org.apache.spark.sql.kafka010.KafkaSourceProvider"

__all__ = [
    "DataLoss",
    "LogUnavailable",
    "SourceError",
    "connector_available",
    "connector_options",
    "read_log",
]


def connector_available(spark: SparkSession) -> bool:
    """Whether the JVM can load Spark's Kafka connector."""
    jvm = getattr(spark, "_jvm", None)  # None on Spark Connect
    if jvm is None:
        return False
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(KAFKA_PROVIDER, False, loader)
    except Exception:  # py4j's ClassNotFoundException
        return False
    return True


def connector_options(
    bootstrap: str,
    topics: Sequence[str],
    starting: Positions | None,
    max_records: int | None,
    partitions: Sequence[TP],
) -> dict[str, str]:
    """The Kafka connector's options. Specific starting offsets must name
    every partition, so `partitions` missing from `starting` get -2."""
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": ",".join(topics),
        "failOnDataLoss": "true",
        "startingOffsets": "earliest",
    }
    if starting:
        every = {**dict.fromkeys(partitions, EARLIEST), **starting}
        options["startingOffsets"] = json.dumps(to_json(every))
    if max_records is not None:
        options["maxOffsetsPerTrigger"] = str(max_records)
    return options


def read_log(
    spark: SparkSession,
    bootstrap: str,
    topics: Sequence[str],
    *,
    starting_offsets: Mapping[str, Mapping[Any, int]] | None = None,
    max_records_per_trigger: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> DataFrame:
    """The records of `topics` as a streaming DataFrame of RAW_COLUMNS.

    `starting_offsets`, {topic: {partition: offset}} (-2 earliest, -1
    latest), applies to a new checkpoint only; partitions it omits start at
    their earliest offset. `max_records_per_trigger` caps every micro-batch
    (shared fairly among partitions). `timeout_s` bounds every wait for
    Kafka in the Python source."""
    from pyspark.sql import functions as F

    from streams.kafka_client import SourceOptions
    from streams.kafka_source import KafkaLogSource, partitions_of

    if not topics:
        raise ValueError("read_log needs at least one topic")
    if max_records_per_trigger is not None and max_records_per_trigger < 1:
        raise ValueError(f"max_records_per_trigger must be positive: {max_records_per_trigger}")
    starting = from_json(starting_offsets) if starting_offsets else None
    strangers = sorted({t for t, _ in starting or {}} - set(topics))
    if strangers:
        raise ValueError(f"starting_offsets names topics that are not read: {strangers}")
    if connector_available(spark):
        parts = partitions_of(bootstrap, topics, timeout_s) if starting else []
        options = connector_options(bootstrap, topics, starting, max_records_per_trigger, parts)
        raw = spark.readStream.format("kafka").options(**options).load()
        return raw.select(
            *[F.col(c).cast("string").alias(c) if c == "key" else c for c in RAW_COLUMNS]
        )
    spark.dataSource.register(KafkaLogSource)
    opts = SourceOptions(
        bootstrap, tuple(topics), starting, max_records_per_trigger, timeout_s=timeout_s
    )
    return spark.readStream.format(KafkaLogSource.name()).options(**opts.to_options()).load()
