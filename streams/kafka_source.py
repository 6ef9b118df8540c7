"""A PySpark streaming data source over confluent-kafka: the event log where
Spark's Kafka connector jar is missing (streams.source chooses).

Offsets live only in Spark's checkpoint (no consumer group commits), in the
Kafka connector's JSON shape {"<topic>": {"<partition>": next_offset}}, so a
checkpoint's offsets mean the same under both readers.

Theory of operation. Spark keeps one reader in a Python process on the
driver for the query's life (initialOffset, latestOffset, partitions);
copies pickled without clients run `read` in the Python workers.
- Partitions come from metadata. A query starts at its starting offsets
  (-2 earliest, -1 latest) and at the earliest offset (the low watermark,
  0 on Tansu) of every partition they omit. A partition that appears later
  enters the offsets at its earliest offset with an empty range.
- The end of a partition is never asked for (Tansu's ListOffsets(latest)
  is wrong after batched produce): `_Probe.ends` assigns each partition one
  record before where it must look from (the start, or the end found last
  time) and consumes to partition EOF, whose offset is the end; with
  nothing new that is one fetch round trip (about 20 ms). Starting one
  back is how a log that lost the start shows itself: EOF below the start,
  silence (Tansu stalls on a fetch past the end) or offset out of range
  (Kafka). Such a partition is read from its earliest offset to learn its
  real end, and a start beyond it fails the query with DataLoss naming
  topic, partition, checkpoint offset and log end: a log restarted empty
  or a topic recreated is never skipped or re-read silently.
- A record cap per trigger is Spark's ReadMaxRows (getDefaultReadLimit),
  shared max-min fairly among partitions with a backlog. Under
  availableNow the ends of the first probe are where the query stops.
- `partitions` spreads a batch's ranges over one task per core (`spread`),
  and `read` reads a task's ranges with one consumer, all assigned at once
  (read one after another, each would wait out the fetch the broker holds
  open at the previous one's end: 100 ms a range), pausing each partition
  at its range's end, asking `consume()` for exactly the records left, so
  it never fetches past a range; it yields Arrow record batches (tuples go
  through PySpark's per-value converters: slower).
Kafka unreachable, or silent, raises LogUnavailable after `timeout_s`; the
job's runner retries from the checkpoint. Options, offsets and errors live
in streams.kafka_client.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from streams.events import raw_schema
from streams.kafka_client import (
    BATCH,
    EARLIEST,
    LATEST,
    PROBE_FETCH_WAIT_MS,
    PROBE_POLL_S,
    READ_FETCH_WAIT_MS,
    READ_POLL_S,
    READ_TASKS,
    SOURCE_NAME,
    STALL_S,
    TP,
    DataLoss,
    LogUnavailable,
    Positions,
    SourceOptions,
    _kind,
    ahead_of_log,
    fair_cap,
    from_json,
    log,
    to_json,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from confluent_kafka import Consumer
    from pyspark.sql.types import StructType


class _Probe:
    """The driver's clients: topic metadata, earliest offsets, partition ends."""

    def __init__(self, opts: SourceOptions) -> None:
        from confluent_kafka.admin import AdminClient

        self.opts = opts
        config: dict[str, Any] = {"bootstrap.servers": opts.bootstrap, "logger": log}
        self.admin = AdminClient(config)
        self.consumer = opts.consumer(PROBE_FETCH_WAIT_MS)

    def partitions(self) -> list[TP]:
        """The partitions of the subscribed topics that exist now."""
        from confluent_kafka import KafkaError, KafkaException

        try:
            meta = self.admin.list_topics(timeout=self.opts.timeout_s)
        except KafkaException as exc:
            raise LogUnavailable(
                f"Kafka at {self.opts.bootstrap}: no metadata within {self.opts.timeout_s} s: {exc}"
            ) from None
        found: list[TP] = []
        for topic in self.opts.topics:
            t = meta.topics.get(topic)
            if t is not None and t.error is not None:
                if t.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise LogUnavailable(f"Kafka: topic {topic}: {t.error}")
            elif t is not None:  # a topic not created yet joins when it appears
                found.extend((topic, p) for p in sorted(t.partitions))
        return found

    def earliest(self, tps: Sequence[TP]) -> Positions:
        """The low watermarks (ListOffsets(earliest) is right on Tansu)."""
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

        if not tps:
            return {}
        spec = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
        try:
            futures = self.admin.list_offsets(
                {TopicPartition(t, p): spec for t, p in tps}, request_timeout=self.opts.timeout_s
            )
            return {
                (tp.topic, tp.partition): int(f.result(self.opts.timeout_s).offset)
                for tp, f in futures.items()
            }
        except Exception as exc:  # a timeout or a broker error: no answer either way
            raise LogUnavailable(f"Kafka: no earliest offsets for {sorted(tps)}: {exc}") from None

    def ends(self, start: Positions, known: Positions) -> Positions:
        """The end of each partition of `start`; DataLoss where the log ends
        before the start or no longer holds it."""
        look = {tp: max(at, known.get(tp, 0)) - 1 for tp, at in start.items()}
        found, lost = self._to_eof({tp: max(at, 0) for tp, at in look.items()}, STALL_S)
        if lost:  # silent or out of range: learn the real end from the earliest offset
            lows = self.earliest(sorted(lost))
            trimmed = [(tp, start[tp], lows[tp]) for tp in sorted(lost) if start[tp] < lows[tp]]
            if trimmed:
                raise DataLoss(
                    f"data loss: retention deleted records the checkpoint has not read "
                    f"((partition, checkpoint offset, earliest offset): {trimmed}); "
                    "remove or re-seed the checkpoint."
                )
            again, stuck = self._to_eof(lows, self.opts.timeout_s)
            if stuck:
                raise LogUnavailable(f"Kafka: no end of {sorted(stuck)} found")
            found.update(again)
        behind = [(tp, start[tp], found[tp]) for tp in sorted(start) if found[tp] < start[tp]]
        if behind:
            raise ahead_of_log(behind)
        return found

    def _to_eof(self, at: Positions, stall_s: float) -> tuple[Positions, set[TP]]:
        """Consume from `at` to partition EOF: the ends, and the partitions
        silent for `stall_s` or out of range."""
        from confluent_kafka import TopicPartition

        self.consumer.assign([TopicPartition(t, p, o) for (t, p), o in at.items()])
        pending, silent, lost = set(at), set(at), set[TP]()
        ends: Positions = {}
        began = last = time.monotonic()
        while pending:
            msgs = self.consumer.consume(BATCH, PROBE_POLL_S)
            now = time.monotonic()
            for msg in msgs:
                err = msg.error()
                kind = _kind(err) if err is not None else "record"
                if kind == "retry":
                    continue
                tp = (str(msg.topic()), int(msg.partition() or 0))
                silent.discard(tp)
                last = now
                if kind == "eof":
                    ends[tp] = int(msg.offset() or 0)
                if kind in ("eof", "gone"):
                    pending.discard(tp)
                    lost.update([tp] if kind == "gone" else [])
            if now - last > self.opts.timeout_s:
                raise LogUnavailable(
                    f"Kafka at {self.opts.bootstrap}: silent for {self.opts.timeout_s} s "
                    f"while looking for the end of {sorted(pending)}"
                )
            if now - began > stall_s and silent & pending:
                lost |= silent & pending
                pending -= silent
        self.consumer.assign([])
        return ends, lost

    def close(self) -> None:
        self.consumer.close()


class Range:
    """One Kafka partition's records [start, end) in one micro-batch."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        self.topic, self.partition, self.start, self.end = topic, partition, start, end

    def __repr__(self) -> str:
        return f"{self.topic}[{self.partition}] {self.start}..{self.end}"


class Ranges(InputPartition):
    """The ranges one Spark task reads, together, with one consumer: a task
    per Kafka partition would pay a consumer's start (a connection, a
    fetch) two dozen times per micro-batch, which is most of a small batch's time."""

    def __init__(self, ranges: list[Range]) -> None:
        self.ranges = ranges

    def __repr__(self) -> str:
        return ", ".join(map(repr, self.ranges))


def spread(ranges: list[Range], tasks: int) -> list[Ranges]:
    """`ranges` in at most `tasks` groups of about equal record counts."""
    groups: list[list[Range]] = [[] for _ in range(max(1, min(tasks, len(ranges))))]
    loads = [0] * len(groups)
    for r in sorted(ranges, key=lambda r: r.end - r.start, reverse=True):
        least = loads.index(min(loads))
        groups[least].append(r)
        loads[least] += r.end - r.start
    return [Ranges(sorted(g, key=lambda r: (r.topic, r.partition))) for g in groups if g]


class KafkaLogReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._probe: _Probe | None = None  # driver only, made on first use
        self._known: Positions = {}  # the ends the last probe found
        self._available_now = False
        self._target: Positions | None = None  # availableNow: where to stop

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts}  # the workers need only the options

    def __setstate__(self, state: dict[str, Any]) -> None:
        KafkaLogReader.__init__(self, state["opts"])

    def probe(self) -> _Probe:
        if self._probe is None:
            self._probe = _Probe(self.opts)
        return self._probe

    def initialOffset(self) -> dict[str, Any]:
        probe = self.probe()
        parts = probe.partitions()
        starting = dict(self.opts.starting or {})
        gone = [(tp, at, None) for tp, at in sorted(starting.items()) if tp not in set(parts)]
        if gone:
            raise ahead_of_log(gone)
        wanted = {tp: starting.get(tp, EARLIEST) for tp in parts}
        lows = probe.earliest([tp for tp, at in wanted.items() if at in (EARLIEST, LATEST)])
        pos = {tp: lows.get(tp, at) for tp, at in wanted.items()}
        latest = {tp: pos[tp] for tp, at in wanted.items() if at == LATEST}
        pos.update(probe.ends(latest, {}) if latest else {})
        return to_json(pos)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records is None:
            return super().getDefaultReadLimit()
        return ReadMaxRows(self.opts.max_records)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True  # the next probe's ends are the target

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        pos = from_json(start)
        if self._target is not None:
            ends = {tp: max(at, self._target.get(tp, at)) for tp, at in pos.items()}
        else:
            probe = self.probe()
            current = set(probe.partitions())
            gone = [(tp, at, None) for tp, at in sorted(pos.items()) if tp not in current]
            if gone:
                raise ahead_of_log(gone)
            ends = probe.ends(pos, self._known)
            self._known.update(ends)
            ends.update(probe.earliest(sorted(current - set(pos))))
            self._target = dict(ends) if self._available_now else None
        if isinstance(limit, ReadMaxRows):
            ends = fair_cap(pos, ends, limit.max_rows)
        return to_json(ends)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return to_json(self._known) if self._known else None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = from_json(start)
        ranges: list[Range] = []
        for (topic, partition), stop in sorted(from_json(end).items()):
            first = begin.get((topic, partition), stop)  # a new partition enters empty
            if stop > first:
                ranges.append(Range(topic, partition, first, stop))
        return spread(ranges, READ_TASKS)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, Ranges)
        consumer = self.opts.consumer(READ_FETCH_WAIT_MS)
        try:
            yield from read_ranges(self.opts, partition.ranges, consumer)
        finally:
            consumer.close()

    def commit(self, end: dict[str, Any]) -> None:
        pass  # Spark's checkpoint is the only record of progress

    def stop(self) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None


def read_ranges(
    opts: SourceOptions, ranges: Sequence[Range], consumer: Consumer
) -> Iterator[pa.RecordBatch]:
    """The records of `ranges` as Arrow batches of the raw schema, each
    partition's in offset order. All are assigned at once and a partition is
    paused at its range's end: read one after another, each range would wait
    out a fetch the broker holds open at the previous one's end."""
    from confluent_kafka import TopicPartition

    open_ = {(r.topic, r.partition): r for r in ranges if r.end > r.start}
    at = {tp: r.start for tp, r in open_.items()}
    consumer.assign([TopicPartition(t, p, r.start) for (t, p), r in open_.items()])
    last = time.monotonic()
    while open_:
        rows: dict[TP, list[tuple[int, Any, Any, int | None]]] = {}
        left = sum(r.end - at[tp] for tp, r in open_.items())
        finished: list[TP] = []
        for msg in consumer.consume(min(left, BATCH), READ_POLL_S):
            tp = (str(msg.topic()), int(msg.partition() or 0))
            r = open_.get(tp)
            if r is None:
                continue  # a partition already at its range's end
            err, offset = msg.error(), int(msg.offset() or 0)
            kind = _kind(err) if err is not None else "record"
            if kind == "gone":
                raise DataLoss(f"data loss: {r} is no longer in the log: {err}")
            if kind == "eof" and offset < r.end:  # the log shrank under a planned batch
                raise ahead_of_log([(tp, r.end, offset)])
            if kind == "record" and offset < r.end:
                stamp_type, stamp = msg.timestamp()
                rows.setdefault(tp, []).append(
                    (offset, msg.key(), msg.value(), stamp if stamp_type else None)
                )
                at[tp] = offset + 1
            if at[tp] >= r.end or kind == "eof" or (kind == "record" and offset >= r.end):
                finished.append(tp)  # done (a compacted range may end before its end)
                del open_[tp]
        for tp, batch in rows.items():
            yield arrow_batch(tp[0], tp[1], batch)
        if finished:
            consumer.pause([TopicPartition(t, p) for t, p in finished])
        if rows or finished:
            last = time.monotonic()
        elif time.monotonic() - last > opts.timeout_s:
            raise LogUnavailable(
                f"Kafka: nothing of {sorted(open_.values(), key=repr)} for {opts.timeout_s} s: "
                "the broker is unreachable, or the log no longer holds the range"
            )


def arrow_batch(
    topic: str, partition: int, rows: list[tuple[int, Any, Any, int | None]]
) -> pa.RecordBatch:
    """(offset, key bytes, value bytes, timestamp ms) rows as a batch of the raw schema."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    offsets, keys, values, stamps = zip(*rows, strict=True)
    try:
        key_col = pa.array(keys, pa.binary()).cast(pa.string())
    except pa.ArrowInvalid:  # not UTF-8: replaced, as Spark shows a cast of such bytes
        key_col = pa.array([None if k is None else k.decode(errors="replace") for k in keys])
    stamp_col = pa.array(stamps, pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
    columns = [
        pa.repeat(pa.scalar(topic, pa.string()), len(rows)),
        pa.repeat(pa.scalar(partition, pa.int32()), len(rows)),
        pa.array(offsets, pa.int64()),
        key_col,
        pa.array(values, pa.binary()),
        stamp_col.cast(pa.timestamp("us", tz="UTC")),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=to_arrow_schema(raw_schema(), timezone="UTC"))


class KafkaLogSource(DataSource):
    """Options: bootstrap, topics (comma-separated), startingOffsets (the
    connector's JSON), maxRecordsPerTrigger, timeoutS."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return raw_schema()

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaLogReader(SourceOptions.parse({k.lower(): v for k, v in self.options.items()}))


def partitions_of(bootstrap: str, topics: Sequence[str], timeout_s: float) -> list[TP]:
    """The partitions of `topics` that exist now."""
    probe = _Probe(SourceOptions(bootstrap, tuple(topics), timeout_s=timeout_s))
    try:
        return probe.partitions()
    finally:
        probe.close()
