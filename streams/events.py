"""The event log as Spark rows: the catalogue's wire form as a Spark schema, and parsing.

Theory of operation. A raw log row (`RAW_COLUMNS`, what `streams.source`
reads whatever the connector) carries the record's value bytes; `parse`
decodes them with Spark's own JSON reader (`from_json`, in the JVM: no
Python per row) against `EVENT_SCHEMA`, the union of every event type's
wire fields derived from `services.event.schema`, so the two cannot drift
apart (a test checks it). A parsed row keeps the raw value: the state
store keeps the newest event of each key verbatim, in the log's own bytes.

A record that is not an event this code reads (not JSON, an unknown type,
a schema version it does not know, an event in the wrong topic, no key or
version) is marked `valid = false`; jobs count those and log their offsets
(`bad_records`), and never fail on them, as the node's replay does.
"""

from __future__ import annotations

import types
import typing
from typing import TYPE_CHECKING, Any, Final

from services.event.schema import EVENT_TYPES, SESSIONS, SUBSCRIPTIONS, Event, wire_fields

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType, StructType

# What every log reader yields (streams.source): the Kafka connector's columns,
# key cast to a string.
RAW_COLUMNS: Final = ("topic", "partition", "offset", "key", "value", "timestamp")

# Session events that end a session: they clear the client's subscriptions
# with a lower version (services.state.view, rule 2).
ENDING_TYPES: Final = ("session_expired", "session_discarded")


def _spark_type(hint: Any) -> DataType:
    from pyspark.sql.types import ArrayType, BooleanType, LongType, StringType

    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _spark_type(inner)
    if typing.get_origin(hint) is typing.Literal:
        return StringType()
    if typing.get_origin(hint) is tuple:
        return ArrayType(ArrayType(StringType()))  # user properties: (name, value) pairs
    if hint is bool:
        return BooleanType()
    if hint is int:
        return LongType()
    if hint in (str, bytes):  # bytes travel as base64 text
        return StringType()
    raise TypeError(f"no Spark type for event field type {hint!r}")


def field_types() -> dict[str, DataType]:
    """Every wire field of every event type, with its Spark type."""
    from pyspark.sql.types import LongType, StringType

    found: dict[str, DataType] = {"type": StringType(), "schema_version": LongType()}
    for cls in EVENT_TYPES:
        hints = typing.get_type_hints(cls)
        for name in wire_fields(cls)[2:]:
            spark_type = _spark_type(hints[name])
            if found.setdefault(name, spark_type) != spark_type:
                raise TypeError(f"event field {name!r} has two types across the catalogue")
    return found


def event_schema() -> StructType:
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(n, t, nullable=True) for n, t in field_types().items()])


def _catalogue_condition(e: Column, suffix: Column) -> Column:
    """True where the parsed record is an event of the catalogue, in its topic."""
    from pyspark.sql import functions as F

    cond = F.lit(False)
    for cls in EVENT_TYPES:
        cond = cond | (
            (e["type"] == cls.type_name)
            & (e["schema_version"] == cls.schema_version)
            & (suffix == cls.topic_suffix)
        )
    return cond


def topic_suffix(topic: Column, prefix: str) -> Column:
    from pyspark.sql import functions as F

    return F.when(topic.startswith(prefix), topic.substr(len(prefix) + 1, 1 << 20))


def parse(raw: DataFrame, prefix: str) -> DataFrame:
    """Parsed events: the raw columns plus `suffix` (sessions, subscriptions,
    retained), `valid`, `type`, `ekey` (client id or retained topic),
    `version`, `ending` (a session end that clears subscriptions below its
    version) and `e`, the struct of every field."""
    from pyspark.sql import functions as F

    suffix = topic_suffix(F.col("topic"), prefix)
    e = F.from_json(F.col("value").cast("string"), event_schema(), {"mode": "PERMISSIVE"})
    parsed = raw.withColumn("suffix", suffix).withColumn("e", e)
    ekey = F.when(parsed["suffix"] == "retained", parsed["e.topic"]).otherwise(
        parsed["e.client_id"]
    )
    valid = (
        parsed["e"].isNotNull()
        & _catalogue_condition(parsed["e"], parsed["suffix"])
        & ekey.isNotNull()
        & parsed["e.version"].isNotNull()
    )
    kind = parsed["e.type"]
    ending = (
        kind.isin(*ENDING_TYPES)
        | ((kind == "session_opened") & parsed["e.clean_start"])
        | ((kind == "session_closed") & (F.coalesce(parsed["e.expiry_s"], F.lit(0)) == 0))
    )
    return parsed.select(
        *RAW_COLUMNS,
        "suffix",
        F.coalesce(valid, F.lit(False)).alias("valid"),
        kind.alias("type"),
        ekey.alias("ekey"),
        parsed["e.version"].alias("version"),
        F.coalesce((parsed["suffix"] == SESSIONS) & ending, F.lit(False)).alias("ending"),
        F.when(parsed["suffix"] == SUBSCRIPTIONS, parsed["e.filter"]).alias("filter"),
        "e",
    )


def bad_records(parsed: DataFrame) -> DataFrame:
    """The records `parse` marked invalid, with where they are in the log."""
    return parsed.where(~parsed["valid"]).select("topic", "partition", "offset")


def as_raw_rows(records: list[tuple[str, int, int, Event | bytes]], prefix: str) -> list[Any]:
    """Raw rows for tests and tools: (topic suffix, partition, offset, event or raw bytes)."""
    import datetime

    from services.event.schema import encode

    rows = []
    for suffix, partition, offset, item in records:
        if isinstance(item, bytes):
            key, value = "", item
        else:
            _, key, value = encode(item)
        stamp = datetime.datetime.fromtimestamp(0, tz=datetime.UTC)
        rows.append((prefix + suffix, partition, offset, key, value, stamp))
    return rows


def raw_schema() -> StructType:
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    return StructType(
        [
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("key", StringType()),
            StructField("value", BinaryType()),
            StructField("timestamp", TimestampType()),
        ]
    )
