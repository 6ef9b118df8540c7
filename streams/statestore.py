"""The state-store job: the event log folded into Redis, newest version per key.

The fold's rules are services.state.view's (the reference; tests compare
this job with it): Spark's `fold` applies them within a batch,
state_apply.lua across batches.

Theory of operation. Each micro-batch of log records is parsed
(`streams.events.parse`) and folded set-based (`fold`, Spark SQL: the
newest event per key with `max_by`, the newest session end per client with
`max`), so no Python runs per event. The folded rows, a few per key, are
collected on the driver and written by `state_apply.lua` in chunks: a row
lands only when its version is above the one the store holds (DESIGN 3),
so a batch that Spark re-runs after a crash, or a chunk written twice,
changes nothing. The batch's log offsets are written last, in their own
call: the store always reflects at least the offsets it claims, which is
what a starting node needs (it replays the log from those offsets; events
it already holds are ignored by version).

What the store holds (its keys: services.state.keys; read by services.state):
sessions (the newest session event per client, as the log has it),
per-client clearing floors, subscriptions per client and filter (live or
tombstone, with options), routes (live subscriptions per filter and node),
retained (the newest retained event per topic), offsets, and meta (the
last batch, and the log generation the offsets belong to).

The log generation: the embedded Kafka keeps its log in memory, so after a
restart a node re-seeds the log from this store and sets a new generation
(services.state). A checkpoint made on an older generation is then
ahead of the log; `run` discards it and starts from the offsets the store
records instead, rather than failing with a data-loss error.
"""

from __future__ import annotations

import logging
import shutil
import signal
import threading
import time
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

from services.event.schema import SESSIONS, SUBSCRIPTIONS, topic_names
from services.state.keys import state_keys
from streams.config import JobConfig
from streams.events import parse
from streams.failures import is_data_loss, one_line, until_stopped

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from redis import Redis

log = logging.getLogger("weir.streams.state")

CHUNK_ROWS: Final = 2000  # rows per script call: ~1 ms of Redis time, no long stalls
PIPELINE_CALLS: Final = 16  # script calls in flight per round trip
BAD_LOGGED_PER_BATCH: Final = 20  # offsets of invalid records logged per batch; all are counted
RETRY_BACKOFF_S: Final = (1.0, 2.0, 5.0, 10.0, 30.0)  # restarts after a failed query
GENERATION_FILE: Final = "weir-log-generation"
RESEED_GRACE_S: Final = 60.0  # after a data-loss error, how long to wait for a re-seed
RESEED_POLL_S: Final = 2.0


# -- the fold: pure DataFrame functions ------------------------------------------


def fold(parsed: DataFrame) -> DataFrame:
    """The newest-per-key rows of one batch, in one DataFrame with columns
    (kind, k1, k2, version, node, text, floor), where kind is
    - "session":  k1 client, the newest session event (text its JSON, node its
      writer), floor the version of the newest session end in the batch or null;
    - "sub":      k1 client, k2 filter, text the stored value (`sub_value`);
    - "retained": k1 topic, text the newest retained event's JSON;
    - "offset":   k1 topic, k2 partition, version the next offset (every
      record read counts, the invalid ones too);
    - "bad":      an invalid record: k1 topic, k2 "partition@offset".
    One scan of the batch and one aggregation: each record becomes two rows
    (its event, its offset), grouped by (kind, k1, k2); a micro-batch is one
    shuffle, which keeps a small batch's latency low."""
    from pyspark.sql import functions as F

    valid = F.col("valid")
    suffix = F.col("suffix")
    kind = (
        F.when(~valid, F.lit("bad"))
        .when(suffix == SESSIONS, F.lit("session"))
        .when(suffix == SUBSCRIPTIONS, F.lit("sub"))
        .otherwise(F.lit("retained"))
    )
    position = F.concat_ws("@", F.col("partition").cast("string"), F.col("offset").cast("string"))
    event = F.struct(
        kind.alias("kind"),
        F.when(valid, F.col("ekey")).otherwise(F.col("topic")).alias("k1"),
        F.when(valid & (suffix == SUBSCRIPTIONS), F.col("filter"))
        .when(~valid, position)
        .alias("k2"),
        F.when(valid, F.col("version")).otherwise(F.col("offset")).alias("version"),
        F.col("e.node").alias("node"),
        F.when(valid & (suffix == SUBSCRIPTIONS), sub_value())
        .when(valid, F.col("value").cast("string"))
        .alias("text"),
        F.when(valid & F.col("ending"), F.col("version")).alias("floor"),
    )
    offset = F.struct(
        F.lit("offset").alias("kind"),
        F.col("topic").alias("k1"),
        F.col("partition").cast("string").alias("k2"),
        (F.col("offset") + 1).alias("version"),
        F.lit(None).cast("string").alias("node"),
        F.lit(None).cast("string").alias("text"),
        F.lit(None).cast("long").alias("floor"),
    )
    rows = parsed.select(F.explode(F.array(event, offset)).alias("r")).select("r.*")
    newest = F.max_by(F.struct("version", "node", "text"), F.col("version"))
    return (
        rows.groupBy("kind", "k1", "k2")
        .agg(newest.alias("n"), F.max("floor").alias("floor"))
        .select("kind", "k1", "k2", "n.version", "n.node", "n.text", "floor")
    )


def sub_value() -> Any:
    """A subscription as the store keeps it (services.state reads it back):
    "version|live|qos|no_local|rap|rh|sid|ts_ms|node", sid empty for none."""
    from pyspark.sql import functions as F

    def flag(c: Any) -> Any:
        return F.when(F.coalesce(c, F.lit(False)), F.lit("1")).otherwise(F.lit("0"))

    live = F.when(F.col("type") == "subscribed", F.lit("1")).otherwise(F.lit("0"))
    return F.concat_ws(
        "|",
        F.col("version").cast("string"),
        live,
        F.coalesce(F.col("e.qos"), F.lit(0)).cast("string"),
        flag(F.col("e.no_local")),
        flag(F.col("e.retain_as_published")),
        F.coalesce(F.col("e.retain_handling"), F.lit(0)).cast("string"),
        F.coalesce(F.col("e.subscription_id").cast("string"), F.lit("")),
        F.coalesce(F.col("e.ts_ms"), F.lit(0)).cast("string"),
        F.coalesce(F.col("e.node"), F.lit("")),
    )


# -- writing a batch ----------------------------------------------------------------


class StateWriter:
    """Writes folded rows with state_apply.lua; one per job (driver side)."""

    def __init__(self, redis: Redis, topic_prefix: str) -> None:
        self.redis = redis
        self.keys = tuple(state_keys(topic_prefix).values())  # state_apply.lua's KEYS
        source = resources.files("streams").joinpath("scripts", "state_apply.lua").read_text()
        self.script = redis.register_script(source)
        self.bad_total = 0

    def write(self, rows: dict[str, list[Any]], batch_id: int | str) -> list[int]:
        """Apply one batch's folded rows (columns of `fold`); returns the
        changed counts (sessions, floors, subs, retained)."""
        kinds = rows["kind"]
        by_kind: dict[str, list[int]] = {}
        for index, kind in enumerate(kinds):
            by_kind.setdefault(kind, []).append(index)
        k1, k2, version, node, text, floor = (
            rows[c] for c in ("k1", "k2", "version", "node", "text", "floor")
        )
        sessions = by_kind.get("session", [])
        self._report_bad(by_kind.get("bad", []), k1, k2, version, batch_id)
        subs = sorted(by_kind.get("sub", []), key=lambda r: k1[r])  # one client's rows together
        changed = [0, 0, 0, 0]
        calls: list[list[Any]] = []
        groups: list[list[tuple[Any, ...]]] = [
            [(k1[r], version[r], node[r] or "", text[r]) for r in sessions],
            [(k1[r], floor[r]) for r in sessions if floor[r] is not None],
            [(k1[r], k2[r], version[r], text[r]) for r in subs],
            [(k1[r], version[r], text[r]) for r in by_kind.get("retained", [])],
        ]
        for position, group in enumerate(groups):
            for start in range(0, len(group), CHUNK_ROWS):
                chunk = group[start : start + CHUNK_ROWS]
                counts = [0, 0, 0, 0, 0]
                counts[position] = len(chunk)
                args: list[Any] = [*counts, "", 0]
                for row in chunk:
                    args.extend(row)
                calls.append(args)
        offsets = by_kind.get("offset", [])
        self._run(calls, changed)
        # Last, alone: the store reflects at least the offsets it records.
        final: list[Any] = [0, 0, 0, 0, len(offsets), str(batch_id), int(time.time() * 1000)]
        for r in offsets:
            final.extend((f"{k1[r]}:{k2[r]}", version[r]))
        self._run([final], changed)
        return changed

    def _run(self, calls: list[list[Any]], changed: list[int]) -> None:
        from redis.cluster import RedisCluster

        if isinstance(self.redis, RedisCluster):  # its pipelines refuse scripts: one call each
            for args in calls:  # (a call is up to CHUNK_ROWS rows: few round trips)
                for i, n in enumerate(self.script(keys=self.keys, args=args)):
                    changed[i] += int(n)
            return
        for start in range(0, len(calls), PIPELINE_CALLS):
            pipe = self.redis.pipeline(transaction=False)
            for args in calls[start : start + PIPELINE_CALLS]:
                self.script(keys=self.keys, args=args, client=pipe)
            for result in pipe.execute():
                for i, n in enumerate(result):
                    changed[i] += int(n)

    def _report_bad(
        self, indexes: list[int], k1: list[Any], k2: list[Any], version: list[Any], batch: Any
    ) -> None:
        if not indexes:
            return
        self.bad_total += len(indexes)
        for r in indexes[:BAD_LOGGED_PER_BATCH]:
            log.warning(
                "skipped a record that is not a Weir event: %s, partition@offset %s", k1[r], k2[r]
            )
        log.warning(
            "batch %s: %d invalid records skipped (%d in all since start)",
            batch,
            len(indexes),
            self.bad_total,
        )


def collect(df: DataFrame) -> dict[str, list[Any]]:
    """A small DataFrame's columns as Python lists (through Arrow)."""
    table = df.toArrow()
    return {name: table.column(name).to_pylist() for name in table.column_names}


def apply_batch(writer: StateWriter, raw: DataFrame, batch_id: int, topic_prefix: str) -> None:
    """foreachBatch: parse, fold and write one micro-batch of raw log rows."""
    started = time.monotonic()
    rows = collect(fold(parse(raw, topic_prefix)))  # one scan, one shuffle
    folded = time.monotonic() - started
    started = time.monotonic()
    changed = writer.write(rows, batch_id)
    log.info(
        "batch %d: read and folded in %.2f s, %d rows written in %.2f s (changed: %d "
        "sessions, %d floors, %d subscriptions, %d retained)",
        batch_id,
        folded,
        len(rows["kind"]),
        time.monotonic() - started,
        *changed,
    )


# -- the job ----------------------------------------------------------------------


def stored_offsets(redis: Redis, topic_prefix: str) -> dict[str, dict[str, int]] | None:
    """The offsets the store reflects, in the Kafka connector's JSON shape."""
    raw = cast(
        dict[bytes, bytes], redis.hgetall(state_keys(topic_prefix)["offsets"])
    )
    if not raw:
        return None
    offsets: dict[str, dict[str, int]] = {}
    for field, value in raw.items():
        topic, _, partition = field.decode().rpartition(":")
        offsets.setdefault(topic, {})[partition] = int(value)
    return offsets


def log_generation(redis: Redis, topic_prefix: str) -> str:
    meta = state_keys(topic_prefix)["meta"]
    value = cast(bytes | None, redis.hget(meta, "generation"))
    return value.decode() if value is not None else ""


def prepare_checkpoint(path: Path, generation: str) -> bool:
    """Keep the checkpoint if it belongs to the log's generation, else
    remove it. True if a checkpoint is kept (Spark resumes from it)."""
    marker = path / GENERATION_FILE
    if path.exists():
        held = marker.read_text() if marker.exists() else ""
        if held == generation:
            return True
        log.warning(
            "checkpoint %s was made on another log (generation %r, the log is now %r: "
            "re-seeded after an embedded Kafka restart); starting from the offsets the "
            "state store records instead",
            path,
            held,
            generation,
        )
        shutil.rmtree(path)
    path.mkdir(parents=True)
    marker.write_text(generation)
    return False


def start_query(spark: SparkSession, config: JobConfig, redis: Redis, *, once: bool) -> Any:
    """Start the streaming query; `once`: fold what the log holds now, then stop."""
    from streams.source import read_log

    checkpoint = Path(config.checkpoint("state"))
    kept = prepare_checkpoint(checkpoint, log_generation(redis, config.topic_prefix))
    starting = None if kept else stored_offsets(redis, config.topic_prefix)
    raw = read_log(
        spark,
        config.bootstrap,
        topic_names(config.topic_prefix),
        starting_offsets=starting,
        max_records_per_trigger=config.max_records_per_trigger,
    )
    writer = StateWriter(redis, config.topic_prefix)
    prefix = config.topic_prefix

    def each(batch: DataFrame, batch_id: int) -> None:
        apply_batch(writer, batch, batch_id, prefix)

    stream = raw.writeStream.foreachBatch(each).option("checkpointLocation", str(checkpoint))
    if once:
        stream = stream.trigger(availableNow=True)
    else:
        stream = stream.trigger(processingTime=f"{int(config.trigger_s * 1000)} milliseconds")
    return stream.queryName("weir-state").start()


def await_query(query: Any, stopping: threading.Event) -> None:
    """Until the query ends (raising its failure) or `stopping` is set (then stop it)."""
    failure = until_stopped(query, stopping)
    if failure is not None:
        raise RuntimeError(str(failure))


def run(config: JobConfig) -> int:
    """Run the state-store job until SIGTERM/SIGINT (then fold what the log
    holds at that moment, so a node's last events are in the store), or,
    with available_now, until the log as it is now is folded. A failed query
    (Redis or Kafka down) restarts from its checkpoint after a back-off, and
    says so; a data-loss error (the checkpoint is ahead of the log) ends it."""
    from services.config.redisurl import connect_sync
    from streams.spark import session

    stopping = threading.Event()

    def stop(signum: int, _frame: object) -> None:
        # Not stopping.set() here: a handler runs between the main thread's
        # bytecodes, and a second signal landing inside the first handler's
        # set() deadlocked on the event's own lock (a weir up SIGKILLed during
        # Spark's start left the job and its JVM behind). A thread takes the lock.
        if not stopping.is_set():
            threading.Thread(target=stopping.set, daemon=True).start()

    for sig in (signal.SIGTERM, signal.SIGINT):  # first: a stop during Spark's start still folds
        signal.signal(sig, stop)
    if config.redis_url is None:
        raise ValueError("the state-store job needs a Redis URL")
    spark = session("weir-state")
    redis = connect_sync(config.redis_url, 10.0)  # one Redis or a cluster (one hash tag)
    failures = 0
    try:
        while True:
            try:
                if not config.available_now and not stopping.is_set():
                    await_query(start_query(spark, config, redis, once=False), stopping)
                log.info("folding what the log holds now")
                await_query(start_query(spark, config, redis, once=True), threading.Event())
                log.info("the state store is up to date with the log; stopping")
                return 0
            except Exception as exc:
                if is_data_loss(exc):
                    if not reseeded_soon(redis, config, stopping):
                        log.error("%s", one_line(exc))
                        return 1
                    continue  # the log was re-seeded: prepare_checkpoint drops the old one
                if stopping.is_set():
                    log.error("stopping; the last fold failed: %s", one_line(exc))
                    return 1
                delay = RETRY_BACKOFF_S[min(failures, len(RETRY_BACKOFF_S) - 1)]
                failures += 1
                log.warning(
                    "state-store query failed (%s); retrying from its checkpoint in %.0f s",
                    one_line(exc),
                    delay,
                )
                stopping.wait(delay)  # a stop request ends the wait
    finally:
        redis.close()
        spark.stop()


def reseeded_soon(redis: Redis, config: JobConfig, stopping: threading.Event) -> bool:
    """After a data-loss error: wait (bounded) for a node to re-seed the log
    (a new generation). A job started beside nodes may see the emptied log
    a moment before the node that re-seeds it does."""
    marker = Path(config.checkpoint("state")) / GENERATION_FILE
    held = marker.read_text() if marker.exists() else ""
    deadline = time.monotonic() + RESEED_GRACE_S
    while time.monotonic() < deadline and not stopping.is_set():
        if log_generation(redis, config.topic_prefix) != held:
            log.warning("the log was re-seeded from the state store; starting over on it")
            return True
        log.warning("the checkpoint is ahead of the log; waiting for a node to re-seed it")
        stopping.wait(RESEED_POLL_S)
    return False
