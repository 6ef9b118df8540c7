"""An event log that counts its failed appends.

The node hands its broker `CountedEventLog(events, metrics)` instead of the
log itself: every append that raises (`EventLogError`: the log did not
acknowledge, pushed back, or was closed) adds one to
`metrics.eventlog_produce_failures`, which the eventlog_unavailable alarm
watches. Appends are per session and subscription event, not per message,
so the extra await costs nothing that shows. Everything else passes through.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.event.api import EventLog, EventLogError, Handler, Offsets
from services.metrics.registry import Metrics

if TYPE_CHECKING:
    from services.event.schema import Event


class CountedEventLog:
    def __init__(self, events: EventLog, metrics: Metrics) -> None:
        self.events = events
        self.metrics = metrics
        self.append_timeout_s = events.append_timeout_s  # the log's bound, as it was given

    async def start(self) -> None:
        await self.events.start()

    async def append(self, event: Event) -> None:
        try:
            await self.events.append(event)
        except EventLogError:
            self.metrics.eventlog_produce_failures += 1
            raise

    async def replay(self, handler: Handler, start: Offsets | None = None) -> int:
        return await self.events.replay(handler, start)

    async def is_empty(self) -> bool:
        return await self.events.is_empty()

    async def tail(self, handler: Handler) -> None:
        await self.events.tail(handler)

    def positions(self) -> dict[tuple[str, int], int]:
        return self.events.positions()

    async def close(self) -> None:
        await self.events.close()
