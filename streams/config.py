"""What a Spark job is told: where the log, the state store and its checkpoints are.

Built by `weir streams run NAME` (streams.cli) from Weir's settings and
its own options; jobs take it as their one argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from services.config.rules import Rule
from services.event.schema import DEFAULT_TOPIC_PREFIX

DEFAULT_TRIGGER_S: Final = 1.0  # micro-batch period: the state store lags the log by about this
MAX_RECORDS_PER_TRIGGER: Final = 500_000  # per batch: bounds a batch's memory after a backlog


@dataclass(frozen=True, slots=True)
class JobConfig:
    bootstrap: str  # Kafka bootstrap servers
    redis_url: str | None  # the state store's Redis (the analytics job needs none)
    data_dir: str  # checkpoints and Parquet output live under it
    topic_prefix: str = DEFAULT_TOPIC_PREFIX
    trigger_s: float = DEFAULT_TRIGGER_S
    available_now: bool = False  # read what the log holds now, then stop
    max_records_per_trigger: int = MAX_RECORDS_PER_TRIGGER
    checkpoint_dir: str | None = None  # default: <data_dir>/checkpoints/<job>
    rules: tuple[Rule, ...] = ()  # the rules job's [[rule]] tables

    def checkpoint(self, job: str) -> str:
        if self.checkpoint_dir is not None:
            return self.checkpoint_dir
        return str(Path(self.data_dir) / "checkpoints" / job)
