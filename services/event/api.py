"""The event log: typed events out, every event of the log back in.

The catalogue lives in `services.event.schema` (frozen, versioned
dataclasses, each with its topic and key). Implementations: memory (one
process) and Kafka (confluent-kafka producer, consumer to partition EOF).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from services.event.schema import Event


class EventLogError(Exception):
    retriable = False


class EventLogUnavailable(EventLogError):
    """The log did not acknowledge in the bounded time: nothing may be
    acknowledged to a client on the strength of this event."""

    retriable = True


Handler = Callable[["Event"], Awaitable[None] | None]


class EventLog(Protocol):
    async def append(self, event: Event) -> None:
        """Return once the log has durably acknowledged the event
        (Kafka: acks=all). Raises EventLogUnavailable after a bounded wait."""
        ...

    async def replay(self, handler: Handler) -> int:
        """Feed every event from the start (or the loaded snapshot offsets)
        to the end of every partition, found by consuming to partition EOF.
        Returns the number of events read."""
        ...

    async def tail(self, handler: Handler) -> None:
        """After replay: feed new events as they arrive, until closed."""
        ...

    async def close(self) -> None:
        ...
