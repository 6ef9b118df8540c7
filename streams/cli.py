"""`weir streams run NAME`: run one of Weir's Spark jobs.

Jobs: `state` (the state store, streams.statestore) and `analytics`
(Parquet tables for `weir report`, streams.analytics). Where the log and
the store are comes from Weir's settings (--kafka / --redis, or
WEIR_KAFKA_BOOTSTRAP / WEIR_REDIS_URL, or the config file); the embedded
default starts the state job itself with `weir up --spark`.

Exit codes: 0 after a clean stop (or, with --available-now, once the log
as it was is folded), 1 when the job fails for good (a data-loss error),
2 for bad arguments or settings.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Final

from services.settings import SettingsError, load
from streams.config import DEFAULT_TRIGGER_S, MAX_RECORDS_PER_TRIGGER, JobConfig

JOBS: Final = {"state": "streams.statestore", "analytics": "streams.analytics"}
EXIT_BAD_ARGS: Final = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise SettingsError(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="weir streams run", description="Run a Weir Spark job.")
    p.add_argument("job", help=f"the job: {', '.join(JOBS)}")
    p.add_argument("--config", help="TOML config file (default: $WEIR_CONFIG)")
    p.add_argument("--kafka", dest="kafka_bootstrap", help="Kafka bootstrap HOST:PORT[,...]")
    p.add_argument("--redis", dest="redis_url", help="the state store's Redis (redis://...)")
    p.add_argument("--data-dir", dest="data_dir", help="checkpoints and Parquet live under it")
    p.add_argument("--kafka-topic-prefix", dest="kafka_topic_prefix", help="topic prefix (weir.)")
    p.add_argument("--checkpoint-dir", help="default: <data-dir>/checkpoints/<job>")
    p.add_argument(
        "--trigger-s",
        type=float,
        default=DEFAULT_TRIGGER_S,
        help=f"seconds between micro-batches ({DEFAULT_TRIGGER_S})",
    )
    p.add_argument(
        "--max-records-per-trigger",
        type=int,
        default=MAX_RECORDS_PER_TRIGGER,
        help=f"records per micro-batch at most ({MAX_RECORDS_PER_TRIGGER})",
    )
    p.add_argument(
        "--available-now",
        action="store_true",
        help="fold what the log holds now, then stop",
    )
    return p


def config_from(argv: Sequence[str]) -> tuple[str, JobConfig]:
    """(job name, config); raises SettingsError with a one-line message."""
    args = parser().parse_args(list(argv))
    if args.job not in JOBS:
        raise SettingsError(f"unknown job {args.job!r}: expected one of {', '.join(JOBS)}")
    if args.trigger_s <= 0:
        raise SettingsError(f"--trigger-s must be above 0, got {args.trigger_s}")
    if args.max_records_per_trigger < 1:
        raise SettingsError("--max-records-per-trigger must be at least 1")
    settings = load(
        {
            "config": args.config,
            "kafka_bootstrap": args.kafka_bootstrap,
            "redis_url": args.redis_url,
            "data_dir": args.data_dir,
            "kafka_topic_prefix": args.kafka_topic_prefix,
        }
    )
    if settings.kafka_bootstrap is None:
        raise SettingsError(
            "needs the log: --kafka HOST:PORT (or WEIR_KAFKA_BOOTSTRAP); the embedded default "
            "runs the state job itself: weir up --spark"
        )
    if args.job == "state" and settings.redis_url is None:
        raise SettingsError("the state job needs the store: --redis URL (or WEIR_REDIS_URL)")
    return args.job, JobConfig(
        bootstrap=settings.kafka_bootstrap,
        redis_url=settings.redis_url,
        data_dir=settings.data_dir,
        topic_prefix=settings.kafka_topic_prefix,
        trigger_s=args.trigger_s,
        available_now=args.available_now,
        max_records_per_trigger=args.max_records_per_trigger,
        checkpoint_dir=args.checkpoint_dir,
    )


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    if not args or args[0] != "run":
        print("usage: weir streams run NAME [options]   (NAME: state, analytics)", file=sys.stderr)
        return EXIT_BAD_ARGS
    try:
        job, config = config_from(args[1:])
    except SettingsError as exc:
        print(f"weir streams run: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGS
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # at INFO it logs every JVM call
    run: Callable[[JobConfig], int] = importlib.import_module(JOBS[job]).run
    return run(config)
