"""Read a Kafka event log back, from its start, as a test checks what was logged."""

from __future__ import annotations

import asyncio

from services.event.kafka import KafkaEventLog, KafkaSettings
from services.event.schema import Event, Subscribed


def log_events(bootstrap: str, prefix: str) -> list[Event]:
    """Every event in the log under topic prefix `prefix`, in log order."""

    async def read() -> list[Event]:
        reader = KafkaEventLog(KafkaSettings(bootstrap=bootstrap, topic_prefix=prefix))
        events: list[Event] = []
        try:
            await reader.replay(events.append)
        finally:
            await reader.close()
        return events

    return asyncio.run(read())


def subscribed_in_log(bootstrap: str, prefix: str, client_id: str, topic_filter: str) -> bool:
    """Whether the log holds a Subscribed event of `client_id` for `topic_filter`."""
    return any(
        isinstance(e, Subscribed) and e.client_id == client_id and e.filter == topic_filter
        for e in log_events(bootstrap, prefix)
    )
