"""The rules job: each `[[rule]]` a Spark SQL query over the bridged messages.

Theory of operation. A rule (`services.config.rules.Rule`) names Kafka
topics that a `[[bridge.kafka_out]]` bridge fills with JSON envelopes, a
SQL statement and a sink. `plan` turns one into a streaming DataFrame:
the topics read by `streams.source.read_log`, parsed into message rows
(`streams.messages`), a watermark on `ts`, registered as the temporary
view `table` (default `messages`) and handed to `spark.sql`. Everything
Spark can say about a rule without running it is asked here, before any
rule starts: the SQL's syntax and columns, the payload schema, the
watermark, the key column, and whether the output mode suits the query
(Spark's own streaming checker, which `start()` would otherwise run). A
bad rule is `RuleError`: one line naming the rule, exit 2.

Each rule is its own streaming query, `foreachBatch` into its sink
(`streams.rule_sinks`), with its own checkpoint,
`<checkpoint-dir>/<name>` (default `<data-dir>/checkpoints/rules/<name>`).
A checkpoint belongs to one query: `weir-rule.json` in it records the
rule's query (SQL, topics, table, schema, watermark, output mode), and a
rule that changed since is refused with the directory to remove, rather
than resumed on state that Spark kept for another query.

`run` starts every rule and watches them (`supervise`). A rule whose query
fails is logged in one line and restarted from its checkpoint after a
back-off; the other rules carry on. A failure no retry can mend (data loss:
the checkpoint is ahead of the log; Spark refusing the query at start)
ends that rule alone. SIGTERM or Ctrl-C stop them all.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import click

from services.config.rules import OutputMode, Rule, Sink
from streams.analytics import query_id
from streams.config import JobConfig
from streams.failures import POLL_S, is_data_loss, on_stop_signals, one_line
from streams.messages import messages
from streams.rule_sinks import ConsoleSink, KafkaSink, ParquetSink, describe

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger("weir.streams.rules")

JOB: Final = "rules"
RULE_FILE: Final = "weir-rule.json"  # in a rule's checkpoint: the query it belongs to
RETRY_BACKOFF_S: Final = (1.0, 2.0, 5.0, 10.0, 30.0)  # before restarting a failed rule


class RuleError(click.UsageError):
    """A rule Spark cannot run (or a checkpoint of another query): one line,
    exit 2, before any rule runs."""


SinkWriter = KafkaSink | ParquetSink | ConsoleSink


@dataclass
class Planned:
    """One rule, checked: its streaming result and its sink."""

    rule: Rule
    frame: DataFrame
    sink: SinkWriter
    checkpoint: Path
    query: StreamingQuery | None = None
    failures: int = 0  # in a row, without a batch between them
    batches_at_start: int = 0
    next_start: float = 0.0  # monotonic
    ended: str | None = None  # why it stopped for good ("done", or the failure)


def rules_dir(data_dir: str | Path) -> Path:
    """Where the Parquet sinks write: <data-dir>/rules/<name>/."""
    return Path(data_dir) / JOB


def fingerprint(rule: Rule) -> dict[str, object]:
    """What makes a rule's query the same query (its sink may change freely)."""
    return {
        "sql": rule.sql.strip(),
        "topics": list(rule.topics),
        "table": rule.table,
        "payload_schema": rule.payload_schema,
        "watermark": rule.watermark,
        "output_mode": rule.output_mode.value,
    }


def check_checkpoint(rule: Rule, checkpoint: Path) -> None:
    """RuleError when `checkpoint` holds the state of another query than `rule`'s."""
    recorded = checkpoint / RULE_FILE
    try:
        before = json.loads(recorded.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:
        raise RuleError(f"rule {rule.name!r}: {recorded}: {exc}") from None
    now = fingerprint(rule)
    changed = sorted(k for k in now if before.get(k) != now[k])
    if changed:
        raise RuleError(
            f"rule {rule.name!r}: its {', '.join(changed)} changed since its checkpoint "
            f"{checkpoint} was written; remove that directory to start the rule over "
            "(from the start of its topics), or give the rule a new name"
        )


def _quiet_query_context_loggers() -> None:
    """PySpark logs every analysis error it raises, as JSON with the JVM stack,
    on loggers of its own; a bad rule is reported here, in one line."""
    from pyspark.logger import PySparkLogger

    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)


def _spark_line(exc: BaseException) -> str:
    """A Spark error's first line, without its JVM plan."""
    return one_line(exc).split("; line ")[0].split(";\n")[0]


def _check_output_mode(frame: DataFrame, mode: OutputMode) -> None:
    """Spark's streaming check of `frame` under `mode`, which `start()` would
    run: AnalysisException when the query cannot have that mode."""
    jvm = getattr(frame.sparkSession, "_jvm", None)
    if jvm is None:  # Spark Connect: start() checks it
        return
    output_modes = jvm.org.apache.spark.sql.streaming.OutputMode
    chosen = {OutputMode.APPEND: output_modes.Append, OutputMode.UPDATE: output_modes.Update,
              OutputMode.COMPLETE: output_modes.Complete}[mode]()  # fmt: skip
    checker = jvm.org.apache.spark.sql.catalyst.analysis.UnsupportedOperationChecker
    checker.checkForStreaming(frame._jdf.queryExecution().analyzed(), chosen)


def plan(spark: SparkSession, rule: Rule, config: JobConfig) -> Planned:
    """`rule` as a streaming DataFrame and its sink; RuleError (one line) if Spark
    cannot run it."""
    from pyspark.errors import AnalysisException, PySparkException

    from streams.source import read_log

    def bad(what: str, exc: BaseException) -> RuleError:
        return RuleError(f"rule {rule.name!r}: {what}: {_spark_line(exc)}")

    bootstrap = rule.bootstrap or config.bootstrap
    raw = read_log(spark, bootstrap, rule.topics,
                   max_records_per_trigger=config.max_records_per_trigger)  # fmt: skip
    try:
        rows = messages(raw, rule.payload_schema)
    except PySparkException as exc:
        raise bad("payload_schema", exc) from None
    try:
        rows = rows.withWatermark("ts", rule.watermark)
    except (PySparkException, ValueError) as exc:
        raise bad("watermark", exc) from None
    rows.createOrReplaceTempView(rule.table)
    try:
        frame = spark.sql(rule.sql)
    except PySparkException as exc:
        raise bad("sql", exc) from None
    if not frame.isStreaming:
        raise RuleError(f"rule {rule.name!r}: sql: reads no streaming table (FROM {rule.table})")
    if rule.key is not None and rule.key not in frame.columns:
        raise RuleError(f"rule {rule.name!r}: key: no column {rule.key!r} in the result "
                        f"(columns: {', '.join(frame.columns)})")  # fmt: skip
    try:
        _check_output_mode(frame, rule.output_mode)
    except AnalysisException as exc:
        raise bad("output_mode", exc) from None
    checkpoint = Path(config.checkpoint(JOB)) / rule.name
    check_checkpoint(rule, checkpoint)
    return Planned(rule, frame, _sink(rule, bootstrap, config), checkpoint)


def _sink(rule: Rule, bootstrap: str, config: JobConfig) -> SinkWriter:
    if rule.sink == Sink.KAFKA:
        assert rule.sink_topic is not None  # the table's check
        return KafkaSink(rule.name, bootstrap, rule.sink_topic, rule.key, rule.partitions)
    if rule.sink == Sink.PARQUET:
        return ParquetSink(rule.name, rules_dir(config.data_dir) / rule.name)
    return ConsoleSink(rule.name)


def start(planned: Planned, config: JobConfig) -> StreamingQuery:
    """Start one rule's query (its Kafka sink's topic created first)."""
    if isinstance(planned.sink, KafkaSink):
        planned.sink.create_topic()
    planned.sink.query_id = query_id(planned.checkpoint)  # makes the directory
    (planned.checkpoint / RULE_FILE).write_text(
        json.dumps(fingerprint(planned.rule), indent=1) + "\n", encoding="utf-8"
    )
    stream = (
        planned.frame.writeStream.queryName(f"weir-rule-{planned.rule.name}")
        .outputMode(planned.rule.output_mode.value)
        .foreachBatch(planned.sink)
        .option("checkpointLocation", str(planned.checkpoint))
    )
    if config.available_now:
        stream = stream.trigger(availableNow=True)
    else:
        stream = stream.trigger(processingTime=f"{round(config.trigger_s * 1000)} milliseconds")
    planned.batches_at_start = planned.sink.batches
    return stream.start()


def supervise(rules: list[Planned], config: JobConfig, stop: threading.Event) -> None:
    """Start the rules and keep them running until `stop` (or, with
    available_now, until each has read what its topics held); a failed rule
    is restarted after a back-off, or ends alone (`Planned.ended`)."""
    try:
        while not stop.is_set():
            now = time.monotonic()
            for p in rules:
                if p.ended is not None:
                    continue
                if p.query is None:
                    if now >= p.next_start:
                        _start_or_fail(p, config)
                elif not p.query.isActive:
                    failure = p.query.exception()
                    p.query = None
                    if failure is None:
                        p.ended = "done"  # available_now: read what there was
                    else:
                        _failed(p, failure, config, retriable=not is_data_loss(failure))
            if all(p.ended is not None for p in rules):
                return
            stop.wait(POLL_S)
    finally:
        for p in rules:
            if p.query is not None:
                p.query.stop()


def _start_or_fail(p: Planned, config: JobConfig) -> None:
    from pyspark.errors import AnalysisException

    try:
        p.query = start(p, config)
    except AnalysisException as exc:  # Spark refused the query itself: no retry mends it
        _failed(p, exc, config, retriable=False)
    except Exception as exc:  # Kafka unreachable for the sink's topic, a checkpoint error
        _failed(p, exc, config, retriable=True)
    else:
        log.info("rule %s: started (%s -> %s; checkpoint %s)", p.rule.name,
                 ", ".join(p.rule.topics), describe(p.sink), p.checkpoint)  # fmt: skip


def _failed(p: Planned, failure: BaseException, config: JobConfig, *, retriable: bool) -> None:
    reason = one_line(failure)
    if not retriable or config.available_now:
        p.ended = reason
        log.error("rule %s: failed, stopped (the other rules go on): %s", p.rule.name, reason)
        return
    if p.sink.batches > p.batches_at_start:
        p.failures = 0  # it got somewhere since its last start: back-off from the start
    delay = RETRY_BACKOFF_S[min(p.failures, len(RETRY_BACKOFF_S) - 1)]
    p.failures += 1
    p.next_start = time.monotonic() + delay
    log.warning("rule %s: failed (%s); restarting from its checkpoint in %.0f s",
                p.rule.name, reason, delay)  # fmt: skip


def run(config: JobConfig) -> int:
    """Run every rule of `config.rules` until stopped (SIGTERM, Ctrl-C) or, with
    available_now, until each has read what its topics hold: 0, or 1 when a
    rule ended failed. RuleError (exit 2) for a rule Spark cannot run, before
    any rule runs. The SparkSession is left running: the caller owns it."""
    from streams.spark import session

    if not config.rules:
        raise RuleError("no [[rule]] tables in the config file (docs/rules.md)")
    spark = session("weir-rules")
    _quiet_query_context_loggers()
    planned = [plan(spark, rule, config) for rule in config.rules]
    stop = threading.Event()
    restore = on_stop_signals(stop, JOB)
    try:
        supervise(planned, config, stop)
    finally:
        restore()
        for p in planned:
            log.info("rule %s: stopped after %d batches, %d rows", p.rule.name,
                     p.sink.batches, p.sink.rows)  # fmt: skip
    failed = [p.rule.name for p in planned if p.ended not in (None, "done")]
    return 1 if failed else 0
