"""Failures of the backends, counted where every call passes."""

from __future__ import annotations

import asyncio

import pytest

from services.event.api import EventLogUnavailable
from services.event.memory import MemoryEventLog
from services.event.schema import RetainedCleared
from services.metrics.registry import Metrics
from services.store.errors import StoreUnavailable
from services.store.redis import UNANSWERED, bounded


class Failing(MemoryEventLog):
    async def append(self, event: object) -> None:
        raise EventLogUnavailable("no ack")


def event() -> RetainedCleared:
    return RetainedCleared(topic="t", version=1, node="n1", ts_ms=0)


async def test_failed_appends_are_counted_and_still_raised() -> None:
    """Every part appends through LogState.append, which counts what fails."""
    from services.broker.logstate import LogState
    from services.broker.ports import Expiries
    from services.broker.routes import Routes
    from services.retain.store import MemoryRetainStore
    from services.session.memory import MemorySessionStore

    m = Metrics()
    sessions = MemorySessionStore()

    def logstate(events: MemoryEventLog) -> LogState:
        return LogState(
            table=Routes(node_id="n1", mark_durable=sessions.mark_durable),
            expiries=Expiries(asyncio.get_running_loop()), events=events,
            retained=MemoryRetainStore(), store=sessions, spawn=lambda c: None, metrics=m,
        )  # fmt: skip

    await logstate(MemoryEventLog()).append(event())
    assert m.eventlog_produce_failures == 0
    with pytest.raises(EventLogUnavailable):
        await logstate(Failing()).append_and_apply(event())
    assert m.eventlog_produce_failures == 1


async def test_a_redis_call_without_an_answer_is_counted() -> None:
    before = UNANSWERED.count

    async def never() -> None:
        await asyncio.Event().wait()

    with pytest.raises(StoreUnavailable):
        await bounded(never(), 0.01)
    assert UNANSWERED.count == before + 1
    assert await bounded(asyncio.sleep(0, "ok"), 1) == "ok"
    assert UNANSWERED.count == before + 1
