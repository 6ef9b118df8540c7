"""The event log: typed events out, every event of the log back in.

The catalogue lives in `services.event.schema` (frozen, versioned
dataclasses, each with its topic and key). Implementations: memory (one
process) and Kafka (confluent-kafka producer, consumer to partition EOF).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeAlias

if TYPE_CHECKING:
    from services.event.schema import Event


class EventLogError(Exception):
    retriable = False


class EventLogUnavailable(EventLogError):
    """The log did not acknowledge in the bounded time: nothing may be
    acknowledged to a client on the strength of this event. The event may
    still land later (it was handed to the log); versions make that harmless."""

    retriable = True


class EventLogBackpressure(EventLogUnavailable):
    """Too many appends are waiting for the log: slow down and retry."""


class EventLogClosed(EventLogError):
    """The log was closed by its owner."""


class EventLogCorrupt(EventLogError):
    """A record in the log is not an event this code reads (unknown type or
    schema version). Names the topic, partition and offset."""


# A handler may return an awaitable (awaited before the next event) or anything else.
Handler: TypeAlias = Callable[["Event"], Awaitable[object] | object]
Offsets: TypeAlias = Mapping[tuple[str, int], int]  # (topic, partition) -> next offset to read


class Placed(NamedTuple):
    """Where one partition took the records of an `append_all`."""

    first: int  # the offset of the first of them
    next: int  # the offset after the last of them
    records: int  # how many (next - first when nothing else landed among them)


Placements: TypeAlias = dict[tuple[str, int], Placed]


def placements(landed: Mapping[tuple[str, int], list[int]]) -> Placements:
    """The offsets each partition gave the records -> where it took them."""
    return {tp: Placed(min(o), max(o) + 1, len(o)) for tp, o in landed.items() if o}


class EventLog(Protocol):
    append_timeout_s: float

    async def start(self) -> None:
        """Connect now (topics, producer) instead of at the first append."""
        ...

    async def warm(self) -> None:
        """After `start`: return once an append would not wait for the log's
        connection or producer id (Kafka: the idempotent producer's id comes
        about 0.5 s after it is made). Bounded by `append_timeout_s`; a log
        still cold then is only slower at its first append, so this never raises."""
        ...

    async def append(self, event: Event) -> None:
        """Return once the log has durably acknowledged the event
        (Kafka: acks=all). Raises EventLogUnavailable after a bounded wait,
        EventLogBackpressure at once when too many appends are waiting."""
        ...

    async def append_all(self, events: Sequence[Event]) -> Placements:
        """Append every event of `events` (in order per key) without waiting
        on each, and return once the log has acknowledged them all, with
        where they landed, per partition. A re-seed's bulk (services.node.
        bootstrap): hundreds of thousands at a time. Raises
        EventLogUnavailable, saying how many were not acknowledged, when
        the log stops taking them (some may have landed)."""
        ...

    async def replay(self, handler: Handler, start: Offsets | None = None) -> int:
        """Feed every event from the start (or from `start`, the offsets a
        loaded snapshot reflects; partitions it omits start at the
        beginning) to the end of every partition, found by consuming to
        partition EOF. Per key, events come in log order. Returns the
        number of events read."""
        ...

    async def is_empty(self) -> bool:
        """True if no partition holds a record (a restarted in-memory Kafka).
        Found by consuming from the beginning: a record or partition EOF."""
        ...

    async def tail(self, handler: Handler) -> None:
        """After replay: feed new events as they arrive, until closed
        (returns then). Without a replay first, starts at the beginning."""
        ...

    def positions(self) -> dict[tuple[str, int], int]:
        """The next offset to read per (topic, partition), as consumed so far."""
        ...

    async def close(self) -> None:
        """Stop tailing, wait (bounded) for appends in flight, release resources."""
        ...
