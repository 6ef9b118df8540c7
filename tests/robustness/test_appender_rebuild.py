"""Two appends that both find the producer failed rebuild it once, and neither hangs.

After REBUILD_AFTER_TIMEOUTS timeouts (a node cut off from Kafka) the next
append retires the producer (purged in a thread) and makes a new one. Two
appends arriving together (a session's end retried every second, a
SUBSCRIBE) both saw the failure: when each poll thread had a stop flag, the
second found no producer, made a new one at once and cleared the stop flag
the first one's thread had just set, so the old poller never stopped and
the first append waited for it for good. Its event (in the partition suite:
a session's end) was then never logged, and the node's view and the log
disagreed after the heal. (The loop polls now; the test still holds two
rebuilds at once to one.)
"""

from __future__ import annotations

import asyncio

import pytest

from services.event.api import EventLogError
from services.event.appender import REBUILD_AFTER_TIMEOUTS, Appender
from services.event.schema import SessionClosed

NOWHERE = "127.0.0.1:9"  # discard port: nothing answers Kafka there
BOUND_S = 10.0  # each append's wait is 0.2 s; a retire takes a poll period (50 ms)


def closed(n: int) -> SessionClosed:
    return SessionClosed(client_id=f"c{n}", version=n, node="n", ts_ms=0, reason="normal",
                         expiry_s=0)  # fmt: skip


async def _nothing() -> None:
    return None


async def test_appends_that_find_the_producer_failed_do_not_hang() -> None:
    appender = Appender(
        NOWHERE, "weir.", ("weir.sessions",), append_timeout_s=0.2, max_pending=100,
        linger_ms=0, producer_config={}, ensure_topics=_nothing, forget_topics=lambda: None,
    )  # fmt: skip
    try:
        for round_ in range(5):  # the race is between threads: several rebuilds
            for i in range(REBUILD_AFTER_TIMEOUTS):  # then the producer is to be rebuilt
                with pytest.raises(EventLogError):
                    await appender.append(closed(100 * round_ + i))
            appends = [appender.append(closed(100 * round_ + 10 + i)) for i in range(3)]
            async with asyncio.timeout(BOUND_S):
                results = await asyncio.gather(*appends, return_exceptions=True)
            assert all(isinstance(r, EventLogError) for r in results), results
    finally:
        await asyncio.to_thread(appender.close)

