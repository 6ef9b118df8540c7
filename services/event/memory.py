"""The event log in memory, shaped like Kafka.

A `MemoryLog` holds topics of partitions; a key goes to partition
`crc32(key) % partitions` of its topic, and append order is log order
within a partition. Each `MemoryEventLog` is one reader/writer over a
shared `MemoryLog` (one per node in a multi-node test) with its own
positions. Replay interleaves partitions (a seeded shuffle of the
partition to read next), so only per-partition order can be relied on, as
with Kafka. Events are stored encoded and decoded on read, so the wire
form is exercised too. `available = False` makes appends fail like a
stalled broker, after `append_timeout_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from services.event.api import (
    EventLogBackpressure,
    EventLogClosed,
    EventLogCorrupt,
    EventLogUnavailable,
    Handler,
    Offsets,
    Placements,
    placements,
)
from services.event.schema import (
    DEFAULT_TOPIC_PREFIX,
    Event,
    EventSchemaError,
    decode,
    encode,
    topic_names,
)

DEFAULT_PARTITIONS = 8


@dataclass
class MemoryLog:
    partitions: int = DEFAULT_PARTITIONS
    topic_prefix: str = DEFAULT_TOPIC_PREFIX
    available: bool = True
    records: dict[tuple[str, int], list[bytes]] = field(default_factory=dict)
    _grew: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def __post_init__(self) -> None:
        for topic in topic_names(self.topic_prefix):
            for p in range(self.partitions):
                self.records[(topic, p)] = []

    def partition_of(self, key: str) -> int:
        return zlib.crc32(key.encode()) % self.partitions

    def grew(self) -> asyncio.Event:
        """An event set at the next append."""
        return self._grew

    def notify(self) -> None:
        grew, self._grew = self._grew, asyncio.Event()
        grew.set()


class MemoryEventLog:
    def __init__(
        self,
        log: MemoryLog | None = None,
        *,
        append_timeout_s: float = 5.0,
        max_pending: int = 20_000,
        seed: int | None = 0,
    ) -> None:
        self.log = log if log is not None else MemoryLog()
        self.append_timeout_s = append_timeout_s
        self.max_pending = max_pending
        self._waiting = 0
        self._rng = random.Random(seed)
        self._positions: dict[tuple[str, int], int] = {}
        self._closed = False
        self._stop = asyncio.Event()

    async def start(self) -> None:
        pass

    async def warm(self) -> None:
        pass

    async def append(self, event: Event) -> None:
        if self._closed:
            raise EventLogClosed("event log is closed")
        if not self.log.available:
            if self._waiting >= self.max_pending:
                raise EventLogBackpressure(f"event log: {self.max_pending} appends already waiting")
            self._waiting += 1
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.append_timeout_s)
            finally:
                self._waiting -= 1
            raise EventLogUnavailable(
                f"event log: no acknowledgement within {self.append_timeout_s} s"
            )
        suffix, key, value = encode(event)
        topic = self.log.topic_prefix + suffix
        self.log.records[(topic, self.log.partition_of(key))].append(value)
        self.log.notify()

    async def append_all(self, events: Sequence[Event]) -> Placements:
        landed: dict[tuple[str, int], list[int]] = {}
        for event in events:
            await self.append(event)
            suffix, key, _ = encode(event)
            tp = (self.log.topic_prefix + suffix, self.log.partition_of(key))
            landed.setdefault(tp, []).append(len(self.log.records[tp]) - 1)
        return placements(landed)

    def positions(self) -> dict[tuple[str, int], int]:
        return dict(self._positions)

    async def replay(self, handler: Handler, start: Offsets | None = None) -> int:
        if start is not None:
            self._positions.update(start)
        return await self._drain(handler)

    async def _drain(self, handler: Handler) -> int:
        count = 0
        while not self._closed:
            positions = self._positions
            ready = [tp for tp, rs in self.log.records.items() if positions.get(tp, 0) < len(rs)]
            if not ready:
                return count
            tp = self._rng.choice(ready)
            recs = self.log.records[tp]
            pos = self._positions.get(tp, 0)
            end = min(len(recs), pos + self._rng.randint(1, 8))
            for offset in range(pos, end):
                try:
                    event = decode(tp[0], recs[offset])
                except EventSchemaError as exc:
                    raise EventLogCorrupt(f"{tp[0]}[{tp[1]}]@{offset}: {exc}") from None
                result = handler(event)
                if inspect.isawaitable(result):
                    await result
                self._positions[tp] = offset + 1
                count += 1
        return count

    async def is_empty(self) -> bool:
        return not any(self.log.records.values())

    async def tail(self, handler: Handler) -> None:
        while not self._closed:
            grew = self.log.grew()
            await self._drain(handler)
            if self._closed or self._has_unread():
                continue
            waiter = asyncio.ensure_future(grew.wait())
            stop = asyncio.ensure_future(self._stop.wait())
            try:
                await asyncio.wait({waiter, stop}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
                waiter.cancel()

    def _has_unread(self) -> bool:
        return any(self._positions.get(tp, 0) < len(r) for tp, r in self.log.records.items())

    async def close(self) -> None:
        self._closed = True
        self._stop.set()


__all__ = ["MemoryEventLog", "MemoryLog"]
