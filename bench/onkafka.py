"""A bench's Kafka: the one `--bootstrap` names, or the embedded one, started for the run."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import uvloop

from services.embedded.kafka import EmbeddedKafka

T = TypeVar("T")


def on_kafka(bootstrap: str | None, run: Callable[[str], Coroutine[Any, Any, T]]) -> T:
    """`run(bootstrap)` on uvloop, against `bootstrap` or an embedded Kafka."""
    if bootstrap:
        return uvloop.run(run(bootstrap))
    with EmbeddedKafka().start() as kafka:
        return uvloop.run(run(kafka.bootstrap))
