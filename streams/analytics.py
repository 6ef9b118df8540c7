"""The analytics job: connection history, churn, subscriptions per filter, sessions per node.

Theory of operation. A Structured Streaming query reads the event log
(`streams.source.read_log`) and, in `foreachBatch`, parses each micro-batch
(`streams.events.parse`) and derives from its valid rows, set-based in
Spark SQL (no Python per event), the tables below. Each batch's rows go to
``<data_dir>/analytics/<table>/query_id=<Q>/batch_id=<N>/``, written with
overwrite: a batch that Spark re-runs after a crash replaces its own
output, so the tables hold every batch exactly once (`BatchWriter`). Q is
the id Spark keeps in the checkpoint (`query_id`): a new checkpoint counts
batches from 0 again, and its batch 0 must not replace an older one's.
Readers see query_id and batch_id as Hive partition columns (Spark and
pyarrow both discover them).

- ``history``: one row per session event (opened, closed, expired,
  discarded): client_id, type, node, ts, ts_ms, version, epoch,
  clean_start, expiry_s, protocol, username, peer, reason, and where the
  record is in the log (topic, partition, offset).
- ``churn``: per client per minute of event time (tumbling windows on the
  event's ts_ms, not the log's timestamp): connects, disconnects, lost
  (closes for keepalive or error: the link broke).
- ``subscriptions``: per filter per minute: subscribes, unsubscribes, net
  (subscribes - unsubscribes). Subscriptions that a session end removes
  without an UNSUBSCRIBE are not counted here.
- ``sessions``: per node per minute: opened, closed, net.
- ``invalid``: where each record that is not an event this code reads is
  (topic, partition, offset). It is counted, logged (the first
  `INVALID_LOGGED_PER_BATCH` of a batch) and skipped: it never fails a batch.

The per-minute tables are additive partial counts: a minute that two
batches both touch has a row in each, and readers sum by key (`combine`).
What needs more than one batch at a time is derived when the tables are
read, from the whole table, so batch boundaries change nothing:
`flapping` (clients with at least `FLAPPING_CONNECTS` connects within any
`FLAPPING_WINDOW_MS` over ``history``: the node's own flapping rule and
defaults, those of EMQX's flapping detection)
and `online` (the running count of open connections per node, the
cumulative net of ``sessions``). `streams.report` computes the same two
with pandas, without a SparkSession.

`run` reads what the log holds and stops (`available_now`), or runs a
trigger every `trigger_s` until SIGTERM or Ctrl-C, which stop the query
between polls (`POLL_S`); a batch cut short is re-run from the checkpoint
next time. A failed query (Kafka unreachable) restarts from its checkpoint
after a back-off; a checkpoint ahead of the log (data loss) ends the job.

Each batch directory is a few small files; a long-running job makes many
(one per trigger per table), so a deployment that keeps weeks of it wants
a periodic compaction, which this job does not do.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

from services.config.settings import FLAPPING_MAX_CONNECTS, FLAPPING_WINDOW_S
from services.event.schema import SESSIONS, SUBSCRIPTIONS, topic_names
from streams.config import JobConfig
from streams.events import bad_records, parse
from streams.failures import is_data_loss, on_stop_signals, one_line, until_stopped

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger("weir.streams.analytics")

JOB: Final = "analytics"
HISTORY: Final = "history"
CHURN: Final = "churn"
SUBSCRIPTIONS_TABLE: Final = "subscriptions"
SESSIONS_TABLE: Final = "sessions"
INVALID: Final = "invalid"
TABLES: Final = (HISTORY, CHURN, SUBSCRIPTIONS_TABLE, SESSIONS_TABLE, INVALID)
# The keys the per-minute tables are summed by (`combine`), and the counts summed.
TABLE_KEYS: Final = {
    CHURN: (("client_id", "minute"), ("connects", "disconnects", "lost")),
    SUBSCRIPTIONS_TABLE: (("filter", "minute"), ("subscribes", "unsubscribes", "net")),
    SESSIONS_TABLE: (("node", "minute"), ("opened", "closed", "net")),
}

WINDOW: Final = "1 minute"  # the per-minute tables' tumbling window, in event time
# Flapping is the node's rule (services.auth.limits.Flapping), with its defaults: more
# than FLAPPING_MAX_CONNECTS CONNECTs of one client id within any window of
# FLAPPING_WINDOW_S. Here that is "at least FLAPPING_CONNECTS connects within any
# FLAPPING_WINDOW_MS" (the connect that the node refuses is the one that reaches it).
FLAPPING_CONNECTS: Final = FLAPPING_MAX_CONNECTS + 1
FLAPPING_WINDOW_MS: Final = round(FLAPPING_WINDOW_S * 1000)
LOST_REASONS: Final = ("keepalive", "error")  # close reasons where the link broke
INVALID_LOGGED_PER_BATCH: Final = 20  # offsets logged per batch; every one is counted
RETRY_BACKOFF_S: Final = (1.0, 2.0, 5.0, 10.0, 30.0)  # before restarting a failed query

OPENED: Final = "session_opened"
CLOSED: Final = "session_closed"


def analytics_dir(data_dir: str | Path) -> Path:
    return Path(data_dir) / JOB


# -- the transforms: pure functions of parsed events ------------------------------


def _valid(parsed: DataFrame, suffix: str) -> DataFrame:
    return parsed.where(parsed["valid"] & (parsed["suffix"] == suffix))


def _minute() -> Column:
    from pyspark.sql import functions as F

    return F.window(F.timestamp_millis(F.col("e.ts_ms")), WINDOW).start.alias("minute")


def _count_if(condition: Column, name: str) -> Column:
    from pyspark.sql import functions as F

    return F.sum(F.when(condition, 1).otherwise(0)).cast("long").alias(name)


def history(parsed: DataFrame) -> DataFrame:
    """One row per valid session event, with the fields a connection history needs."""
    from pyspark.sql import functions as F

    e = F.col("e")
    return _valid(parsed, SESSIONS).select(
        F.col("ekey").alias("client_id"),
        "type",
        e["node"].alias("node"),
        F.timestamp_millis(e["ts_ms"]).alias("ts"),
        e["ts_ms"].alias("ts_ms"),
        "version",
        e["epoch"].alias("epoch"),
        e["clean_start"].alias("clean_start"),
        e["expiry_s"].alias("expiry_s"),
        e["protocol"].alias("protocol"),
        e["username"].alias("username"),
        e["peer"].alias("peer"),
        e["reason"].alias("reason"),
        "topic",
        "partition",
        "offset",
    )


def churn(parsed: DataFrame) -> DataFrame:
    """Per client per minute: connects, disconnects, and lost (keepalive/error closes)."""
    from pyspark.sql import functions as F

    kind = F.col("type")
    return (
        _valid(parsed, SESSIONS)
        .where(kind.isin(OPENED, CLOSED))
        .groupBy(F.col("ekey").alias("client_id"), _minute())
        .agg(
            _count_if(kind == OPENED, "connects"),
            _count_if(kind == CLOSED, "disconnects"),
            _count_if((kind == CLOSED) & F.col("e.reason").isin(*LOST_REASONS), "lost"),
        )
    )


def subscriptions(parsed: DataFrame) -> DataFrame:
    """Per filter per minute: subscribes, unsubscribes and the net change."""
    from pyspark.sql import functions as F

    kind = F.col("type")
    counts = (
        _valid(parsed, SUBSCRIPTIONS)
        .groupBy("filter", _minute())
        .agg(_count_if(kind == "subscribed", "subscribes"), _count_if(kind != "subscribed", "un"))
    )
    return counts.select(
        "filter",
        "minute",
        "subscribes",
        F.col("un").alias("unsubscribes"),
        (F.col("subscribes") - F.col("un")).alias("net"),
    )


def sessions(parsed: DataFrame) -> DataFrame:
    """Per node per minute: sessions opened and closed there, and the net change."""
    from pyspark.sql import functions as F

    kind = F.col("type")
    counts = (
        _valid(parsed, SESSIONS)
        .where(kind.isin(OPENED, CLOSED))
        .groupBy(F.col("e.node").alias("node"), _minute())
        .agg(_count_if(kind == OPENED, "opened"), _count_if(kind == CLOSED, "closed"))
    )
    return counts.withColumn("net", F.col("opened") - F.col("closed"))


def invalid(parsed: DataFrame) -> DataFrame:
    """Where the records that are not events this code reads are in the log."""
    return bad_records(parsed)


TRANSFORMS: Final[dict[str, Callable[[DataFrame], DataFrame]]] = {
    HISTORY: history,
    CHURN: churn,
    SUBSCRIPTIONS_TABLE: subscriptions,
    SESSIONS_TABLE: sessions,
    INVALID: invalid,
}


# -- derived over whole tables (any number of batches) ----------------------------


def combine(table: str, df: DataFrame) -> DataFrame:
    """A per-minute table with the partial rows of different batches summed by key."""
    from pyspark.sql import functions as F

    keys, counts = TABLE_KEYS[table]
    return df.groupBy(*keys).agg(*(F.sum(c).cast("long").alias(c) for c in counts))


def flapping(
    history_df: DataFrame,
    *,
    connects: int = FLAPPING_CONNECTS,
    window_ms: int = FLAPPING_WINDOW_MS,
) -> DataFrame:
    """Clients with at least `connects` connects within some `window_ms` (sliding):
    client_id, connects (all), peak (the most within one window), peak_ms (when
    the first window with that peak ended), nodes (distinct nodes connected to)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    opened = history_df.where(F.col("type") == OPENED)
    span = Window.partitionBy("client_id").orderBy("ts_ms").rangeBetween(-(window_ms - 1), 0)
    counted = opened.withColumn("in_window", F.count(F.lit(1)).over(span))
    # the largest struct: the highest count first, then the earliest connect reaching it
    best = F.max(F.struct("in_window", (-F.col("ts_ms")).alias("neg_ms")))
    per_client = counted.groupBy("client_id").agg(
        F.count(F.lit(1)).alias("connects"),
        best.alias("best"),
        F.countDistinct("node").alias("nodes"),
    )
    return per_client.where(F.col("best.in_window") >= connects).select(
        "client_id",
        "connects",
        F.col("best.in_window").alias("peak"),
        (-F.col("best.neg_ms")).alias("peak_ms"),
        "nodes",
    )


def online(sessions_df: DataFrame) -> DataFrame:
    """Per node per minute: opened, closed and `online`, the connections open at
    the end of that minute (the running sum of opened - closed from the start of
    what the table holds). A node that died without logging its closes keeps them."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    summed = combine(SESSIONS_TABLE, sessions_df)
    upto = Window.partitionBy("node").orderBy("minute").rowsBetween(Window.unboundedPreceding, 0)
    return summed.withColumn("online", F.sum("net").over(upto).cast("long"))


# -- the job: reading and writing at the edges --------------------------------------

# The event types each table is made of: a batch with none of them writes no directory.
_TABLE_TYPES: Final = {
    HISTORY: (OPENED, CLOSED, "session_expired", "session_discarded"),
    CHURN: (OPENED, CLOSED),
    SUBSCRIPTIONS_TABLE: ("subscribed", "unsubscribed"),
    SESSIONS_TABLE: (OPENED, CLOSED),
}


class BatchWriter:
    """The `foreachBatch` function: one micro-batch of raw log rows into every
    table, each under ``query_id=<Q>/batch_id=<N>``, overwritten, so a batch
    that runs twice leaves what one run leaves. `query_id` names the
    checkpoint: a new checkpoint numbers its batches from 0 again, and must
    not overwrite what an older one wrote."""

    def __init__(self, out_dir: str | Path, topic_prefix: str, query_id: str) -> None:
        self.out_dir = Path(out_dir)
        self.topic_prefix = topic_prefix
        self.query_id = query_id
        self.batches = 0
        self.records = 0
        self.invalid = 0

    def path(self, table: str, batch_id: int) -> Path:
        return self.out_dir / table / f"query_id={self.query_id}" / f"batch_id={batch_id}"

    def __call__(self, raw: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        parsed = parse(raw, self.topic_prefix).persist()
        try:
            by_type = {
                (row["valid"], row["type"]): int(row["count"])
                for row in parsed.groupBy("valid", "type").count().collect()
            }
            valid = {kind: n for (ok, kind), n in by_type.items() if ok}
            bad = sum(n for (ok, _), n in by_type.items() if not ok)
            for table, transform in TRANSFORMS.items():
                wanted = (
                    bad if table == INVALID else sum(valid.get(t, 0) for t in _TABLE_TYPES[table])
                )
                target = self.path(table, batch_id)
                if wanted:
                    transform(parsed).coalesce(1).write.mode("overwrite").parquet(str(target))
                else:  # nothing of this table in the batch (a re-run finds the same)
                    shutil.rmtree(target, ignore_errors=True)
            if bad:
                self._log_invalid(parsed, batch_id, bad)
        finally:
            parsed.unpersist()
        total = sum(by_type.values())
        self.batches += 1
        self.records += total
        self.invalid += bad
        log.info(
            "analytics: batch %d: %d records (%s; %d invalid) in %.1f s",
            batch_id,
            total,
            ", ".join(f"{n} {kind}" for kind, n in sorted(valid.items())) or "no events",
            bad,
            time.monotonic() - started,
        )

    def _log_invalid(self, parsed: DataFrame, batch_id: int, count: int) -> None:
        first = (
            invalid(parsed)
            .orderBy("topic", "partition", "offset")
            .limit(INVALID_LOGGED_PER_BATCH)
            .collect()
        )
        for row in first:
            log.warning(
                "analytics: batch %d: skipped a record that is not an event: %s[%d] offset %d",
                batch_id,
                row["topic"],
                row["partition"],
                row["offset"],
            )
        if count > len(first):
            log.warning(
                "analytics: batch %d: %d more invalid records skipped (all in %s)",
                batch_id,
                count - len(first),
                self.path(INVALID, batch_id),
            )


def query_id(checkpoint: str | Path) -> str:
    """The id of the query that `checkpoint` belongs to. Spark keeps it in the
    checkpoint's ``metadata`` file ({"id": ...}) and adopts one it finds there,
    so a new checkpoint gets a new id written here before the query starts."""
    path = Path(checkpoint) / "metadata"
    try:
        found = json.loads(path.read_text(encoding="utf-8")).get("id")
    except (OSError, ValueError, AttributeError):
        found = None
    if isinstance(found, str) and found:
        return found
    if path.exists():
        raise RuntimeError(f"{path} is not a Spark checkpoint's metadata file")
    path.parent.mkdir(parents=True, exist_ok=True)
    new = str(uuid.uuid4())
    path.write_text(json.dumps({"id": new}) + "\n", encoding="utf-8")
    return new


def run(config: JobConfig) -> int:
    """Run the analytics job until the log as it is now is read
    (`config.available_now`) or until stopped (SIGTERM, Ctrl-C): 0. A failed
    query restarts from its checkpoint after a back-off, and says so; with
    available_now, or on data loss (the checkpoint is ahead of the log), it
    logs the error in one line and returns 1. The SparkSession is left
    running: the process that called this owns it."""
    from streams.spark import session

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    spark = session("weir-analytics")
    checkpoint = config.checkpoint(JOB)
    writer = BatchWriter(analytics_dir(config.data_dir), config.topic_prefix, query_id(checkpoint))
    log.info("analytics: writing %s (checkpoint %s)", writer.out_dir, checkpoint)
    stop = threading.Event()
    restore = on_stop_signals(stop, JOB)
    failures = 0
    try:
        while True:
            done_before = writer.batches
            failure = until_stopped(_start(spark, config, writer), stop)
            if failure is None or stop.is_set():
                return 0
            reason = one_line(failure)
            if config.available_now or is_data_loss(failure):
                log.error("analytics: the query failed: %s", reason)
                return 1
            failures = 0 if writer.batches > done_before else failures
            delay = RETRY_BACKOFF_S[min(failures, len(RETRY_BACKOFF_S) - 1)]
            failures += 1
            log.warning("analytics: the query failed (%s); retrying in %.0f s", reason, delay)
            if stop.wait(delay):
                return 0
    finally:
        restore()
        log.info(
            "analytics: stopped after %d batches, %d records, %d invalid skipped",
            writer.batches,
            writer.records,
            writer.invalid,
        )


def _start(spark: SparkSession, config: JobConfig, writer: BatchWriter) -> StreamingQuery:
    from streams.source import read_log

    raw = read_log(
        spark,
        config.bootstrap,
        topic_names(config.topic_prefix),
        max_records_per_trigger=config.max_records_per_trigger,
    )
    stream = (
        raw.writeStream.queryName("weir-analytics")
        .foreachBatch(writer)
        .option("checkpointLocation", config.checkpoint(JOB))
    )
    if config.available_now:
        stream = stream.trigger(availableNow=True)
    else:
        stream = stream.trigger(processingTime=f"{round(config.trigger_s * 1000)} milliseconds")
    return stream.start()
