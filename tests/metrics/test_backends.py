"""Failures of the backends, counted where every call passes."""

from __future__ import annotations

import asyncio

import pytest

from services.event.api import EventLog, EventLogUnavailable
from services.event.memory import MemoryEventLog
from services.event.schema import RetainedCleared
from services.metrics.eventlog import CountedEventLog
from services.metrics.registry import Metrics
from services.store.errors import StoreUnavailable
from services.store.redis import UNANSWERED, bounded


class Failing(MemoryEventLog):
    async def append(self, event: object) -> None:
        raise EventLogUnavailable("no ack")


def event() -> RetainedCleared:
    return RetainedCleared(topic="t", version=1, node="n1", ts_ms=0)


async def test_failed_appends_are_counted_and_still_raised() -> None:
    m = Metrics()
    good: EventLog = CountedEventLog(MemoryEventLog(), m)
    await good.append(event())
    assert m.eventlog_produce_failures == 0
    bad = CountedEventLog(Failing(), m)
    with pytest.raises(EventLogUnavailable):
        await bad.append(event())
    assert m.eventlog_produce_failures == 1


async def test_what_is_not_an_append_passes_through() -> None:
    inner = MemoryEventLog()
    log = CountedEventLog(inner, Metrics())
    await log.append(event())
    seen: list[object] = []
    assert await log.replay(seen.append) == 1 and seen == [event()]
    assert log.positions() == inner.positions() and not await log.is_empty()
    assert log.append_timeout_s == inner.append_timeout_s


async def test_a_redis_call_without_an_answer_is_counted() -> None:
    before = UNANSWERED.count

    async def never() -> None:
        await asyncio.Event().wait()

    with pytest.raises(StoreUnavailable):
        await bounded(never(), 0.01)
    assert UNANSWERED.count == before + 1
    assert await bounded(asyncio.sleep(0, "ok"), 1) == "ok"
    assert UNANSWERED.count == before + 1
