"""Bridged MQTT messages as Spark rows: the table a rule's SQL reads.

Theory of operation. A `[[bridge.kafka_out]]` bridge with the default value
writes each MQTT message to Kafka as a JSON envelope
(`services.bridge.templates.envelope`, docs/bridges.md). `messages` turns
raw Kafka rows (`streams.events.RAW_COLUMNS`, what `streams.source` reads)
into one row per message, parsed in the JVM by `from_json` (no Python per
row), with the columns of `COLUMNS`:

- the envelope's fields: topic, payload (text; base64 when
  payload_encoding says so), payload_encoding, qos, retain, clientid,
  username;
- ts: the envelope's `timestamp` (ms, when the node received the PUBLISH)
  as a timestamp: the event time windows and the watermark use;
- user_properties: a map, name -> the first value of that name (as the
  bridge's `${user_property.NAME}`; MQTT allows a name twice);
- json: the payload parsed as JSON with the rule's `payload_schema` (Spark
  DDL, "temp DOUBLE, unit STRING"), NULL where the payload is not such JSON
  (or not text); only with a schema. Without one, `get_json_object(payload,
  '$.temp')` reads a field as text;
- key, kafka_topic, partition, offset: where the record is in Kafka.

A record that is not an envelope (a bridge with its own `value` template,
anything else written to the topic) has NULL envelope columns; the
where-it-is columns are always there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

# The envelope as the bridge writes it: the schema from_json reads it with.
ENVELOPE_DDL: Final = (
    "topic STRING, payload STRING, payload_encoding STRING, qos INT, retain BOOLEAN, "
    "clientid STRING, username STRING, timestamp LONG, user_properties ARRAY<ARRAY<STRING>>"
)
COLUMNS: Final = (
    "topic", "payload", "payload_encoding", "qos", "retain", "clientid", "username", "ts",
    "user_properties", "key", "kafka_topic", "partition", "offset",
)  # fmt: skip
JSON_COLUMN: Final = "json"  # with a payload_schema


def _first_wins(pairs: Column) -> Column:
    """[[name, value], ...] as a map name -> the first value of that name (a map
    built straight from pairs fails on a repeated name)."""
    from pyspark.sql import functions as F

    names = F.array_distinct(F.transform(pairs, lambda p: p[0]))
    first = F.transform(names, lambda n: F.filter(pairs, lambda p: p[0] == n)[0][1])
    return F.map_from_arrays(names, first)


def messages(raw: DataFrame, payload_schema: str | None = None) -> DataFrame:
    """Raw Kafka rows of bridged topics as message rows (`COLUMNS`, and `json`
    with a payload schema). A bad `payload_schema` raises Spark's parse error."""
    from pyspark.sql import functions as F

    e = F.from_json(F.col("value").cast("string"), ENVELOPE_DDL).alias("e")
    parsed = raw.select(e, "key", F.col("topic").alias("kafka_topic"), "partition", "offset")
    columns: list[Column | str] = [
        F.col("e.topic").alias("topic"),
        F.col("e.payload").alias("payload"),
        F.col("e.payload_encoding").alias("payload_encoding"),
        F.col("e.qos").alias("qos"),
        F.col("e.retain").alias("retain"),
        F.col("e.clientid").alias("clientid"),
        F.col("e.username").alias("username"),
        F.timestamp_millis(F.col("e.timestamp")).alias("ts"),
        _first_wins(F.coalesce(F.col("e.user_properties"), F.array())).alias("user_properties"),
        "key",
        "kafka_topic",
        "partition",
        "offset",
    ]
    if payload_schema is not None:
        text = F.when(F.col("e.payload_encoding") == "utf-8", F.col("e.payload"))
        columns.append(F.from_json(text, payload_schema).alias(JSON_COLUMN))
    return parsed.select(*columns)
