"""`weir streams run NAME`: run one of Weir's Spark jobs.

Jobs: `state` (the state store, streams.statestore), `analytics`
(Parquet tables for `weir report`, streams.analytics) and `rules` (the
config file's `[[rule]]` tables: Spark SQL over bridged MQTT messages,
streams.rules, docs/rules.md). Where the log and
the store are comes from Weir's settings (--kafka / --redis, or
WEIR_KAFKA_BOOTSTRAP / WEIR_REDIS_URL, or the config file); with neither,
from the `weir up` running on the data dir (its endpoints.json: the
embedded default's random ports), or one line saying none runs there. The
embedded default also starts the state job itself with `weir up --spark`.

Exit codes: 0 after a clean stop (or, with --available-now, once the log
as it was is folded), 1 when the job fails for good (a data-loss error),
2 for bad arguments or settings (a rule Spark cannot run among them).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Final

import click

from services.cli import CONTEXT, Command, fail
from services.cli import run as run_command
from services.config import load
from services.config.flags import given, settings_flags, some
from services.embedded.endpoints import backends
from streams.config import DEFAULT_TRIGGER_S, MAX_RECORDS_PER_TRIGGER, JobConfig

JOBS: Final = {
    "state": "streams.statestore",
    "analytics": "streams.analytics",
    "rules": "streams.rules",
}


@click.command("run", cls=Command, context_settings=CONTEXT,
               help=f"Run a Weir Spark job: JOB is one of {', '.join(JOBS)}.")  # fmt: skip
@click.argument("job")
@click.option("--config", help="TOML config file (default: $WEIR_CONFIG)")
@settings_flags(some("kafka_bootstrap", "redis_url", "data_dir", "kafka_topic_prefix"))
@click.option("--checkpoint-dir", help="default: <data-dir>/checkpoints/<job>")
@click.option("--trigger-s", type=click.FloatRange(min=0, min_open=True),
              default=DEFAULT_TRIGGER_S, help="seconds between micro-batches",
              show_default=True)  # fmt: skip
@click.option("--max-records-per-trigger", type=click.IntRange(min=1),
              default=MAX_RECORDS_PER_TRIGGER, help="records per micro-batch at most",
              show_default=True)  # fmt: skip
@click.option("--available-now", is_flag=True, help="fold what the log holds now, then stop")
def command(
    job: str, config: str | None, checkpoint_dir: str | None, trigger_s: float,
    max_records_per_trigger: int, available_now: bool, **flags: Any,
) -> int:  # fmt: skip
    if job not in JOBS:
        fail(f"unknown job {job!r}: expected one of {', '.join(JOBS)}")
    settings = load({"config": config, **given(flags)})
    if settings.kafka_bootstrap is None and settings.redis_url is None:
        # Neither named: the weir up running on the data dir (the embedded default).
        redis_url, kafka, prefix = backends(settings.data_dir, "weir streams run", 2)
        settings = replace(settings, kafka_bootstrap=kafka, redis_url=redis_url,
                           kafka_topic_prefix=prefix)  # fmt: skip
    if settings.kafka_bootstrap is None:
        fail(
            "needs the log: --kafka HOST:PORT (or WEIR_KAFKA_BOOTSTRAP), or neither --kafka "
            "nor --redis for the weir up running on --data-dir"
        )
    if job == "state" and settings.redis_url is None:
        fail("the state job needs the store: --redis URL (or WEIR_REDIS_URL)")
    if job == "rules" and not settings.rule:
        fail("no [[rule]] tables in the config file (--config FILE or WEIR_CONFIG; docs/rules.md)")
    assert settings.kafka_bootstrap is not None
    job_config = JobConfig(
        bootstrap=settings.kafka_bootstrap,
        redis_url=settings.redis_url,
        data_dir=settings.data_dir,
        topic_prefix=settings.kafka_topic_prefix,
        trigger_s=trigger_s,
        available_now=available_now,
        max_records_per_trigger=max_records_per_trigger,
        checkpoint_dir=checkpoint_dir,
        rules=settings.rule,
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # at INFO it logs every JVM call
    run: Callable[[JobConfig], int] = importlib.import_module(JOBS[job]).run
    return run(job_config)


def main(argv: Sequence[str]) -> int:
    """`weir streams run ...` (argv without `streams run`)."""
    return run_command(command, argv, "weir streams run")
