"""Spark SQL rule settings: `[[rule]]` tables, part of `services.config`.

Theory of operation. Each table names one Spark SQL statement over the
messages that `[[bridge.kafka_out]]` bridges put in Kafka, and where its
rows go (`weir streams run rules` runs them; docs/rules.md):

    [[rule]]
    name = "hot"
    topics = ["mqtt-telemetry"]          # Kafka topics holding the bridge's JSON envelopes
    payload_schema = "temp DOUBLE"       # the payload parsed as JSON: the `json` column
    sql = '''SELECT clientid, avg(json.temp) AS avg_temp FROM messages
             GROUP BY window(ts, '1 minute'), clientid HAVING avg(json.temp) > 30'''
    sink = "kafka"                       # kafka | parquet | console
    sink_topic = "alerts"
    key = "clientid"                     # the column that keys each Kafka record

What this module checks needs no Spark: the keys, the names, that a sink
is named and a Kafka sink has its topic. The SQL itself (syntax, columns,
an output mode the query cannot have) is checked by the job, with Spark,
before any rule runs (`streams.rules.plan`).
"""

from __future__ import annotations

import enum
import re
from typing import Annotated, Final

from pydantic import AfterValidator, BeforeValidator, Field, model_validator
from pydantic.dataclasses import dataclass

from services.config.bridges import DEFAULT_PARTITIONS, KafkaTopic, named_tables
from services.config.declare import FROZEN, Int, KafkaBootstrap, Text

RULE_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")  # it names a checkpoint directory
DEFAULT_TABLE: Final = "messages"  # the streaming table a rule's SQL reads
DEFAULT_WATERMARK: Final = "1 minute"  # how late (event time) a message may come and count:
#   a window's state is kept this long past its end, then dropped with later messages for it
SQL_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")  # a table or column name


class Sink(enum.StrEnum):
    KAFKA = "kafka"  # JSON rows to `sink_topic` (the Kafka -> MQTT bridge can publish them)
    PARQUET = "parquet"  # <data-dir>/rules/<name>/
    CONSOLE = "console"  # the job's log


class OutputMode(enum.StrEnum):  # Spark's streaming output modes
    UPDATE = "update"  # the rows that changed in this trigger (an aggregate: as soon as it does)
    APPEND = "append"  # rows that will not change (an aggregate: once the watermark passes it)
    COMPLETE = "complete"  # the whole result every trigger (aggregates only)


def _rule_name(name: str) -> str:
    if not RULE_NAME.fullmatch(name):
        raise ValueError(f"name {name!r}: 1-64 of A-Z a-z 0-9 _ - (it names a directory)")
    return name


def _sql_name(name: str) -> str:
    if not SQL_NAME.fullmatch(name):
        raise ValueError(f"{name!r}: a SQL name is a letter or _, then letters, digits, _")
    return name


RuleName = Annotated[str, AfterValidator(_rule_name)]
SqlName = Annotated[str, AfterValidator(_sql_name)]


@dataclass(frozen=True, slots=True, config=FROZEN)
class Rule:
    """One `[[rule]]` table: `sql` over `table` (the messages of `topics`) into `sink`."""

    name: RuleName
    sql: Text
    topics: Annotated[tuple[KafkaTopic, ...], Field(min_length=1)]
    sink: Sink
    sink_topic: KafkaTopic | None = None  # sink = "kafka": the topic its rows go to
    key: SqlName | None = None  # sink = "kafka": the column keying each record (None: no key)
    table: SqlName = DEFAULT_TABLE
    payload_schema: Text | None = None  # Spark DDL ("temp DOUBLE, unit STRING"): `json` column
    watermark: Text = DEFAULT_WATERMARK  # a Spark interval on `ts`
    output_mode: OutputMode = OutputMode.UPDATE
    bootstrap: KafkaBootstrap | None = None  # default: the event log's Kafka
    partitions: Annotated[Int, Field(ge=0)] = DEFAULT_PARTITIONS  # of a sink topic it creates

    @model_validator(mode="after")
    def _sink_needs(self) -> Rule:
        if self.sink == Sink.KAFKA and self.sink_topic is None:
            raise ValueError("sink_topic: sink = \"kafka\" needs the Kafka topic")
        if self.sink != Sink.KAFKA and (self.sink_topic is not None or self.key is not None):
            raise ValueError(f'sink_topic and key are for sink = "kafka", not {self.sink.value!r}')
        return self



Rules = Annotated[tuple[Rule, ...], BeforeValidator(named_tables("rule", "rules"))]
