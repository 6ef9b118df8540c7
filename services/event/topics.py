"""The event log's topics on Kafka: created once, by an admin client, at start."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import admin as _admin

from services.event.api import EventLogUnavailable

log = logging.getLogger("weir.event.kafka")

ADMIN_TIMEOUT_S: Final = 10.0  # a metadata or create-topics request; a live broker answers in ms


def create_topics(
    bootstrap: str, topics: Sequence[str], partitions: int, replication_factor: int
) -> None:
    """Create `topics` with `partitions` each; one that exists already is fine.
    Raises EventLogUnavailable (one line) when the broker refuses or does not answer."""
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": log}
    admin = _admin.AdminClient(config)
    new = [
        _admin.NewTopic(t, partitions, replication_factor)  # type: ignore[attr-defined]
        for t in topics
    ]
    # Each future's error is looked at, never raised here: raised, it would hold
    # this frame (and so the admin client, its threads and its connection) in a
    # cycle through the future that the garbage collector alone can free.
    for topic, fut in admin.create_topics(new, request_timeout=ADMIN_TIMEOUT_S).items():
        try:
            exc = fut.exception(ADMIN_TIMEOUT_S)
        except Exception as late:  # a timeout: the broker did not answer
            raise EventLogUnavailable(f"event log: cannot create {topic}: {late!r}") from None
        if exc is None:
            continue
        err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
        if not isinstance(err, KafkaError):
            raise EventLogUnavailable(f"event log: cannot create {topic}: {exc!r}")
        if err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise EventLogUnavailable(f"event log: cannot create {topic}: {err}")
