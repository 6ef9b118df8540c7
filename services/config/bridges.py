"""Data bridge settings: `[[bridge.kafka_out]]` and `[[bridge.kafka_in]]`
tables, part of `services.config`.

Theory of operation. Each kafka_out table maps an MQTT topic filter to a
Kafka topic (`services.bridge` does the work):

    [[bridge.kafka_out]]
    name = "telemetry"
    filter = "tele/#"                # MQTT topic filter (no $share/: see docs/bridges.md)
    topic = "mqtt-telemetry"         # Kafka topic
    key = "${clientid}"              # default: the publisher's client id
    value = "${payload}"             # default: a JSON envelope of the message
    headers = { device = "${clientid}", via = "weir" }
    mode = "sync"                    # sync | async
    bootstrap = "kafka:9092"         # default: the event log's Kafka

Each kafka_in table maps Kafka topics to MQTT messages:

    [[bridge.kafka_in]]
    name = "commands"
    topics = ["device-commands"]     # Kafka topics, consumed by one group
    mqtt_topic = "devices/${key}/cmd"
    qos = 1
    retain = false
    payload = "${value}"             # default: the record's value
    group = "weir-bridge-commands"   # default: weir-bridge-<name>
    bootstrap = "kafka:9092"         # default: the event log's Kafka

Templates are text with `${variable}` in it. A kafka_out template names
`VARIABLES` and `${user_property.NAME}` (the message's first user property
NAME, empty if it has none); a kafka_in template names `RECORD_VARIABLES`
and `${header.NAME}` (the record's first header NAME). This module only
checks them (an unknown variable, an unclosed `${`: one line naming the
table); `services.bridge.templates` renders them. A filter is checked here
by the MQTT rules, written out again because config sits below the protocol
package and may not import it.
"""

from __future__ import annotations

import enum
import re
from typing import Annotated, Any, Final

from pydantic import AfterValidator, BeforeValidator, Field, model_validator
from pydantic.dataclasses import dataclass

from services.config.declare import FROZEN, Bool, Int, KafkaBootstrap, Seconds, Text, opt

VARIABLES: Final = ("clientid", "username", "topic", "payload", "qos", "retain", "timestamp")
USER_PROPERTY: Final = "user_property."  # ${user_property.NAME}
RECORD_VARIABLES: Final = ("key", "value", "payload", "topic", "partition", "offset", "timestamp")
HEADER: Final = "header."  # ${header.NAME}
TEMPLATE_VARIABLE: Final = re.compile(r"\$\{([^}]*)\}")
KAFKA_TOPIC: Final = re.compile(r"[A-Za-z0-9._-]{1,249}")  # Kafka's own rule for topic names

# Defaults, per bridge.
DEFAULT_KEY: Final = "${clientid}"  # one device's records in one partition, in order
DEFAULT_PARTITIONS: Final = 8  # partitions of a topic the bridge creates (as the event log's)
# ms a record waits for others to share its batch. A sync publisher's PUBACK waits that
# much longer: with 128 QoS 1 messages in flight (bench.bridge) 2 ms gave 26,700 PUBACK/s
# where 5 ms gave 17,400 (1 ms: 23,800, smaller batches cost more); async records wait for
# no one, and 5 ms makes batches of hundreds under load (less CPU per record).
SYNC_LINGER_MS: Final = 2
ASYNC_LINGER_MS: Final = 5
DEFAULT_BUFFER_BYTES: Final = 64 << 20  # bytes of records produced and not yet acknowledged
#   by Kafka; past it async records are dropped (counted) and sync publishers refused (0x80).
#   async counts them as records held times their mean size (docs/bridges.md)
SYNC_TIMEOUT_S: Final = 5.0  # a sync record's wait for Kafka, as the event log's append
ASYNC_TIMEOUT_S: Final = 60.0  # an async record's: how long an outage the buffer rides out


class Mode(enum.StrEnum):
    SYNC = "sync"  # PUBACK / PUBREC after Kafka acknowledged the record
    ASYNC = "async"  # acknowledged at once; records buffered in memory


class Compression(enum.StrEnum):  # librdkafka's compression.type
    NONE = "none"
    GZIP = "gzip"
    SNAPPY = "snappy"
    LZ4 = "lz4"
    ZSTD = "zstd"


def check_template(
    text: str, variables: tuple[str, ...] = VARIABLES, prefix: str = USER_PROPERTY
) -> str:
    """`text` if every `${...}` in it names one of `variables` or `prefix`NAME;
    ValueError (one line) if not."""
    for found in TEMPLATE_VARIABLE.finditer(text):
        name = found.group(1)
        if name in variables:
            continue
        if name.startswith(prefix) and len(name) > len(prefix):
            continue
        known = ", ".join(variables)
        raise ValueError(f"unknown template variable ${{{name}}} (known: {known}, {prefix}NAME)")
    if "${" in TEMPLATE_VARIABLE.sub("", text):
        raise ValueError(f"unclosed ${{ in template {text!r}")
    return text


def check_record_template(text: str) -> str:
    """A kafka_in template: the record's variables (`RECORD_VARIABLES`, header.NAME)."""
    return check_template(text, RECORD_VARIABLES, HEADER)


def check_topic_template(text: str) -> str:
    """An MQTT topic template: a record template whose literal text is a valid
    topic name (no wildcard, no U+0000); what the variables render is checked
    per record (a record that renders no valid topic is skipped and counted)."""
    check_record_template(text)
    literal = TEMPLATE_VARIABLE.sub("x", text)
    if "+" in literal or "#" in literal or "\x00" in literal:
        raise ValueError(f"mqtt_topic {text!r}: a topic name has no wildcard or U+0000")
    if literal.startswith("$"):
        raise ValueError(f"mqtt_topic {text!r}: $ topics are the broker's")
    return text


def check_filter(topic_filter: str) -> str:
    """An MQTT topic filter (`services.mqtt.topics`' rules), not a shared one."""
    if not topic_filter or "\x00" in topic_filter:
        raise ValueError("a topic filter is non-empty text without U+0000")
    if topic_filter.startswith(("$share/", "$queue/")):
        raise ValueError(
            f"filter {topic_filter!r}: give the plain filter; a bridge already takes each "
            "message once cluster-wide"
        )
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if level == "#" and i != len(levels) - 1:
            raise ValueError(f"filter {topic_filter!r}: '#' must be the last level")
        if level not in ("+", "#") and ("+" in level or "#" in level):
            raise ValueError(f"filter {topic_filter!r}: a wildcard must be a whole level")
    return topic_filter


def _kafka_topic(name: str) -> str:
    if not KAFKA_TOPIC.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"topic {name!r}: a Kafka topic is 1-249 of A-Z a-z 0-9 . _ -")
    return name


def _headers(raw: Any) -> Any:
    """A TOML table {name = template} as (name, template) pairs, in file order."""
    if isinstance(raw, dict):
        return tuple((str(k), v) for k, v in raw.items())
    return raw


Template = Annotated[str, AfterValidator(check_template)]
RecordTemplate = Annotated[str, AfterValidator(check_record_template)]
TopicTemplate = Annotated[str, Field(min_length=1), AfterValidator(check_topic_template)]
Filter = Annotated[str, AfterValidator(check_filter)]
KafkaTopic = Annotated[str, AfterValidator(_kafka_topic)]
Headers = Annotated[tuple[tuple[str, Template], ...], BeforeValidator(_headers)]


@dataclass(frozen=True, slots=True, config=FROZEN)
class KafkaOut:
    """One `[[bridge.kafka_out]]` table: MQTT messages matching `filter` to Kafka `topic`."""

    name: Text
    filter: Filter
    topic: KafkaTopic
    key: Template = DEFAULT_KEY  # "": no key (records spread over the partitions)
    value: Template | None = None  # None: the JSON envelope (docs/bridges.md)
    headers: Headers = ()
    user_properties: Bool = True  # each MQTT user property also a Kafka header
    mode: Mode = Mode.SYNC
    bootstrap: KafkaBootstrap | None = None  # None: the event log's Kafka
    compression: Compression = Compression.LZ4
    linger_ms: Annotated[Int, Field(ge=0, le=900_000)] | None = None  # None: by mode (above)
    buffer_bytes: Annotated[Int, Field(ge=1 << 16, le=2 << 30)] = DEFAULT_BUFFER_BYTES
    timeout_s: Annotated[Seconds, Field(ge=0.1)] | None = None  # None: by mode (above)
    partitions: Annotated[Int, Field(ge=0)] = DEFAULT_PARTITIONS  # 0: never create the topic

    @property
    def delivery_timeout_s(self) -> float:
        if self.timeout_s is not None:
            return self.timeout_s
        return SYNC_TIMEOUT_S if self.mode == Mode.SYNC else ASYNC_TIMEOUT_S

    @property
    def batch_linger_ms(self) -> int:
        if self.linger_ms is not None:
            return self.linger_ms
        return SYNC_LINGER_MS if self.mode == Mode.SYNC else ASYNC_LINGER_MS


class OffsetReset(enum.StrEnum):  # where a group with no committed offset starts
    EARLIEST = "earliest"  # the start of each partition (the default: see KafkaIn)
    LATEST = "latest"  # records produced from now on (not on the embedded Kafka)


DEFAULT_INFLIGHT: Final = 1000  # records of one kafka_in bridge handed to MQTT and not yet
#   routed (stored for persistent subscribers); past it the consumer pauses its partitions
DEFAULT_SESSION_TIMEOUT_S: Final = 6.0  # a dead node's partitions go to another after this;
#   also how long the embedded Kafka makes a group join wait (about half of it)
DEFAULT_FETCH_WAIT_MS: Final = 100  # a fetch with no records waits this long for some


@dataclass(frozen=True, slots=True, config=FROZEN)
class KafkaIn:
    """One `[[bridge.kafka_in]]` table: records of Kafka `topics` as MQTT messages."""

    name: Text
    topics: Annotated[tuple[KafkaTopic, ...], Field(min_length=1)]
    mqtt_topic: TopicTemplate
    qos: Annotated[Int, Field(ge=0, le=2)] = 1
    retain: Bool = False
    payload: RecordTemplate = "${value}"
    bootstrap: KafkaBootstrap | None = None  # None: the event log's Kafka
    group: Text | None = None  # None: weir-bridge-<name>
    # A group with no committed offset starts at the beginning: "latest" relies on
    # ListOffsets, which the embedded Kafka gets wrong (KAFKA-NOTES.md).
    offset_reset: OffsetReset = OffsetReset.EARLIEST
    max_inflight: Annotated[Int, Field(ge=1, le=1_000_000)] = DEFAULT_INFLIGHT
    session_timeout_s: Annotated[Seconds, Field(ge=1.0, le=300.0)] = DEFAULT_SESSION_TIMEOUT_S
    fetch_wait_ms: Annotated[Int, Field(ge=1, le=10_000)] = DEFAULT_FETCH_WAIT_MS

    @property
    def group_id(self) -> str:
        return self.group or f"weir-bridge-{self.name}"


def named_tables(label: str, plural: str) -> Any:
    """A check that each table of a list names itself and no two share a name
    (figures and checkpoints are per name): `label` starts the message for a
    table without one (`bridge.kafka_out 2: needs a name`), `plural` the one
    for a repeat (`two bridges are named 'x'`)."""

    def check(raw: Any) -> Any:
        if isinstance(raw, list):
            seen: set[str] = set()
            for number, table in enumerate(raw, start=1):
                if isinstance(table, dict):
                    name = table.get("name")
                    if name is None:
                        raise ValueError(f"{label} {number}: needs a name")
                    if name in seen:
                        raise ValueError(f"two {plural} are named {name!r}")
                    seen.add(str(name))
        return raw

    return check


@dataclass(frozen=True, slots=True, config=FROZEN)
class Bridges:
    """The [bridge] section: its tables."""

    kafka_out: Annotated[
        tuple[KafkaOut, ...], BeforeValidator(named_tables("bridge.kafka_out", "bridges"))
    ] = opt(
        (), "the config file's [[bridge.kafka_out]] tables (docs/bridges.md)", flag=False
    )
    kafka_in: Annotated[
        tuple[KafkaIn, ...], BeforeValidator(named_tables("bridge.kafka_in", "bridges"))
    ] = opt(
        (), "the config file's [[bridge.kafka_in]] tables (docs/bridges.md)", flag=False
    )

    @model_validator(mode="after")
    def _names_unique_across_kinds(self) -> Bridges:
        both = {b.name for b in self.kafka_out} & {b.name for b in self.kafka_in}
        if both:
            raise ValueError(f"two bridges are named {sorted(both)[0]!r}")
        return self
