"""The Kafka side of the log reader: its options, consumers, offsets and errors.

Shared by the driver's probe and the workers' reads (streams.kafka_source).
Offsets are in the Kafka connector's JSON shape, {"<topic>": {"<partition>":
next_offset}}; every DataLoss message starts with "data loss:" because
only text crosses the JVM to the job's runner.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final

if TYPE_CHECKING:
    from confluent_kafka import Consumer, KafkaError

log = logging.getLogger("weir.streams.source")

SOURCE_NAME: Final = "weir_kafka"
EARLIEST: Final = -2  # in starting offsets, as in the Kafka connector's JSON
LATEST: Final = -1
DEFAULT_TIMEOUT_S: Final = 30.0  # Kafka silent this long: unreachable (the runner retries)
# A probed partition silent this long (no record, no EOF) while others answer
# was asked for an offset past its end (Tansu stalls there without an error).
STALL_S: Final = 3.0
PROBE_FETCH_WAIT_MS: Final = 10  # how long the broker holds a fetch at the end: probe latency
PROBE_POLL_S: Final = 0.01
READ_FETCH_WAIT_MS: Final = 100
READ_POLL_S: Final = 0.5
BATCH: Final = 10_000  # records per consume() call and per Arrow record batch
READ_TASKS: Final = os.cpu_count() or 2  # Spark tasks per micro-batch: one per core

TP = tuple[str, int]  # (topic, partition)
Positions = dict[TP, int]  # the next offset per partition


class SourceError(Exception):
    retriable: ClassVar[bool] = False


class LogUnavailable(SourceError):
    """Kafka did not answer in time; a retry from the checkpoint can succeed."""

    retriable = True


class DataLoss(SourceError):
    """The checkpoint and the log disagree; a retry reads the same log."""


def to_json(positions: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(positions.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def from_json(offsets: Mapping[str, Mapping[Any, int]]) -> Positions:
    return {(t, int(p)): int(o) for t, parts in offsets.items() for p, o in parts.items()}


def fair_cap(start: Positions, ends: Positions, max_records: int) -> Positions:
    """`ends` cut so that at most `max_records` lie past `start`, shared
    max-min fairly: each partition an equal share of what is left, the
    unused share of a partition with less going to the others."""
    backlog = {tp: end - start.get(tp, end) for tp, end in ends.items()}
    given = dict.fromkeys(ends, 0)
    left = max_records
    open_ = sorted(tp for tp, n in backlog.items() if n > 0)
    while left > 0 and open_:
        share = max(left // len(open_), 1)
        for tp in open_:
            take = min(share, backlog[tp] - given[tp], left)
            given[tp] += take
            left -= take
        open_ = [tp for tp in open_ if given[tp] < backlog[tp]]
    return {tp: end - max(backlog[tp], 0) + given[tp] for tp, end in ends.items()}


def ahead_of_log(found: Sequence[tuple[TP, int, int | None]]) -> DataLoss:
    """DataLoss for (partition, checkpoint offset, log end or None if gone)."""
    where = "; ".join(
        f"topic {t} partition {p}: checkpoint offset {at}, log end "
        + ("none (the partition is gone)" if end is None else str(end))
        for (t, p), at, end in found
    )
    return DataLoss(
        f"data loss: the checkpoint is ahead of the log ({where}). The log was emptied or its "
        "topics recreated (an embedded Kafka restarted?): remove the job's checkpoint, or "
        "re-seed it with offsets the log holds, before restarting the job."
    )


@dataclass(frozen=True, slots=True)
class SourceOptions:
    bootstrap: str
    topics: tuple[str, ...]
    starting: Positions | None = None
    max_records: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """From the data source's string options (keys in lower case)."""
        starting, limit = options.get("startingoffsets"), options.get("maxrecordspertrigger")
        return cls(
            bootstrap=options["bootstrap"],
            topics=tuple(t for t in options["topics"].split(",") if t),
            starting=from_json(json.loads(starting)) if starting else None,
            max_records=int(limit) if limit else None,
            timeout_s=float(options.get("timeouts", DEFAULT_TIMEOUT_S)),
        )

    def to_options(self) -> dict[str, str]:
        options = {"bootstrap": self.bootstrap, "topics": ",".join(self.topics)}
        options["timeoutS"] = str(self.timeout_s)
        if self.starting:
            options["startingOffsets"] = json.dumps(to_json(self.starting))
        if self.max_records is not None:
            options["maxRecordsPerTrigger"] = str(self.max_records)
        return options

    def consumer(self, fetch_wait_ms: int) -> Consumer:
        from confluent_kafka import Consumer

        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "group.id": "weir-streams-source",  # required by the client; assign never joins
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",  # out of range is reported, never skipped
            "fetch.wait.max.ms": fetch_wait_ms,
            "logger": log,
        }
        return Consumer(config)


def _kind(err: KafkaError) -> str:
    """A consume error: "eof", "gone" (offset out of range) or "retry" (the
    client reconnects; callers bound the silence); fatal ones raise."""
    from confluent_kafka import KafkaError

    if err.code() == KafkaError._PARTITION_EOF:
        return "eof"
    if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
        return "gone"
    if err.fatal():
        raise LogUnavailable(f"Kafka: {err}")
    log.warning("Kafka: %s", err)
    return "retry"
