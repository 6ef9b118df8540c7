"""The embedded default's state store writer (services.state.writer) against real Redis.

The store it writes must be the one the Spark job writes: loaded by a
node (`bootstrap.load_snapshot`), or re-seeded into an empty log
(`StateSnapshot.events`, `live_events`), it gives the view the reference
fold (`ClusterView`) gives the events themselves, whatever order they were
written in. What the view forgets (rule 4) the store forgets, unless the
client came back meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncIterator, Sequence

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.event.api import EventLogUnavailable
from services.event.memory import MemoryEventLog, MemoryLog
from services.event.schema import Event, SessionClosed, SessionOpened, Subscribed, Unsubscribed
from services.node.bootstrap import load_snapshot
from services.state.redis import RedisStateStore
from services.state.view import ClusterView
from services.state.writer import StoreWriter, WriteThroughLog, script_args
from tests.contract.test_cluster_view import ops_strategy, to_events
from tests.support.wait import until

PREFIX = "weir."


def folded(events: Sequence[Event]) -> ClusterView:
    view = ClusterView()
    for e in events:
        view.apply(e)
    return view


async def write_and_load(url: str, events: Sequence[Event], seed: int) -> tuple[ClusterView, ...]:
    client = aioredis.Redis.from_url(url)
    try:
        await client.flushdb()
        writer = StoreWriter(client, PREFIX)
        shuffled = list(events)
        random.Random(seed).shuffle(shuffled)  # the version rule makes the order moot
        half = len(shuffled) // 2
        await asyncio.gather(*(writer.write(e) for e in shuffled[:half]))  # one call
        for e in shuffled[half:]:
            await writer.write(e)  # a call each
        snapshot = await RedisStateStore(client, PREFIX).load()
    finally:
        await client.aclose()
    loaded = ClusterView()
    if snapshot is not None:
        load_snapshot(loaded, loaded.apply, snapshot)
    reseeded = folded(snapshot.events() if snapshot is not None else [])
    live = folded(snapshot.live_events() if snapshot is not None else [])
    return loaded, reseeded, live


# Each example flushes the database first (write_and_load): the fixture is safe to share.
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=ops_strategy, seed=st.integers(0, 2**16))
def test_the_written_store_loads_and_reseeds_to_the_reference_fold(
    redis_url: str, ops: list[tuple[str, str, int, str]], seed: int
) -> None:
    events = to_events(ops)
    expected = folded(events).snapshot()
    loaded, reseeded, live = asyncio.run(write_and_load(redis_url, events, seed))
    assert loaded.snapshot() == expected
    assert reseeded.snapshot() == expected
    assert live.snapshot() == expected


def test_script_args_are_state_apply_rows() -> None:
    opened = SessionOpened(
        client_id="c", version=1, node="n", ts_ms=5, epoch=1, clean_start=True, expiry_s=0,
        protocol=4,
    )  # fmt: skip
    sub = Subscribed(client_id="c", version=2, node="n", ts_ms=6, filter="a/b", qos=1)
    args = script_args([opened, sub])
    assert args[:7] == [1, 1, 1, 0, 0, "", 0]  # a session, its floor (clean start), a sub
    assert args[7:10] == ["c", 1, "n"] and args[11:13] == ["c", 1]
    assert args[13:] == ["c", "a/b", 2, "2|1|1|0|0|0||6|n"]


async def test_the_store_forgets_what_the_view_forgets(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        writer = StoreWriter(client, PREFIX)
        log = WriteThroughLog(MemoryEventLog(MemoryLog()), writer)
        view = ClusterView()
        view.keep_ended = 3
        view.on_forget = writer.forget
        kept = SessionClosed(
            client_id="offline", version=2, node="n", ts_ms=1, reason="normal", expiry_s=60
        )
        opened = SessionOpened(
            client_id="offline", version=1, node="n", ts_ms=1, epoch=1, clean_start=False,
            expiry_s=60, protocol=5,
        )  # fmt: skip
        for e in (opened, kept):
            await log.append(e)
            view.apply(e)
        ended: list[Event] = []
        for i in range(10):
            common = {"client_id": f"gone-{i}", "node": "n", "ts_ms": 1}
            ended += (
                SessionOpened(version=1, epoch=1, clean_start=True, expiry_s=0, protocol=4,
                              **common),
                Subscribed(version=2, filter=f"t/{i}", qos=0, **common),
                SessionClosed(version=3, reason="normal", expiry_s=0, **common),
            )
        for e in ended:
            await log.append(e)
        # gone-0 is back in the store by the time the view forgets its end:
        await log.append(
            SessionOpened(
                client_id="gone-0", version=4, node="n", ts_ms=2, epoch=2, clean_start=False,
                expiry_s=60, protocol=5,
            )
        )  # fmt: skip
        for e in ended:
            view.apply(e)  # the view forgets gone-0 .. gone-6
        await writer.close()  # the forgetting in the background is done
        sessions = {k.decode() for k in await client.hkeys("{weir.state}:sessions")}
        assert sessions == {"offline", "gone-0", "gone-7", "gone-8", "gone-9"}
        assert await client.hlen("{weir.state}:subs") == 0  # cleared by the floors
        assert await client.hlen("{weir.state}:floors") == 4  # gone-0 and the three kept
        assert writer.forgot == 6  # gone-1 .. gone-6; gone-0 was back
    finally:
        await client.aclose()


async def test_a_reseed_claim_of_a_killed_run_is_taken_again_by_the_same_node(
    redis_url: str,
) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        store = RedisStateStore(client, PREFIX)
        assert await store.claim_reseed("n1", 300.0)  # then n1 is SIGKILLed mid-re-seed
        assert not await store.claim_reseed("n2", 300.0)  # another node waits for it
        assert await store.claim_reseed("n1", 300.0)  # n1 again: its own claim
    finally:
        await client.aclose()


async def test_the_loop_keeps_turning_while_the_store_is_decoded(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node reads the store while it serves (the log cut): decoding 100,000
    sessions took seconds of its loop, its heartbeat missed 5 s and the node
    fenced itself in a soak. Here the decode is made slow on purpose (0.5 s
    per call); the loop must tick through it."""
    import time

    from services.state import redis as state_redis

    decode_all = state_redis.decode_all

    def slow(suffix: str, entries: dict[bytes, bytes]) -> tuple[list[Event], int]:
        time.sleep(0.5)  # blocks whichever thread runs it
        return decode_all(suffix, entries)

    monkeypatch.setattr(state_redis, "decode_all", slow)
    client = aioredis.Redis.from_url(redis_url)
    try:
        writer = StoreWriter(client, PREFIX)
        await writer.write(
            SessionOpened(
                client_id="c1", version=1, node="n", ts_ms=1, epoch=1, clean_start=False,
                expiry_s=60, protocol=5,
            )
        )  # fmt: skip
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.ensure_future(tick())
        snapshot = await RedisStateStore(client, PREFIX).load()
        ticker.cancel()
        assert snapshot is not None and len(snapshot.sessions) == 1
        assert ticks >= 20  # 1 s of decoding (two calls): ~100 ticks of 10 ms, 0 on the loop
    finally:
        await client.aclose()


class HeldLog(MemoryEventLog):
    """A log whose appends wait for `gate`: an acknowledgement still on its way."""

    def __init__(self) -> None:
        super().__init__(MemoryLog(), append_timeout_s=0.01)
        self.gate = asyncio.Event()

    async def append(self, event: Event) -> None:
        await self.gate.wait()
        await super().append(event)


@contextlib.asynccontextmanager
async def held_append(
    redis_url: str,
) -> AsyncIterator[tuple[StoreWriter, HeldLog, WriteThroughLog, asyncio.Task[None]]]:
    """An append of one event whose store write is done and whose log
    acknowledgement waits for `HeldLog.gate`."""
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.flushdb()
        writer = StoreWriter(client, PREFIX)
        held = HeldLog()
        log = WriteThroughLog(held, writer)
        event = Subscribed(client_id="c", version=1, node="n", ts_ms=1, filter="t/1", qos=1)
        append = asyncio.create_task(log.append(event))
        await until(lambda: writer.written == 1, "the store's write", interval=0)
        yield writer, held, log, append
    finally:
        await client.aclose()


async def test_the_store_is_written_while_the_log_acknowledges(redis_url: str) -> None:
    """The two writes of an append run at once (a SUBACK waits for the slower,
    not for both in turn); either failing fails the append."""
    async with held_append(redis_url) as (writer, held, log, append):
        assert not append.done() and log.appended == 0  # stored before the log answered
        held.gate.set()
        await append
        assert log.appended == 1
        held.log.available = False  # the log refuses; the store still takes it
        later = Subscribed(client_id="c", version=2, node="n", ts_ms=2, filter="t/2", qos=1)
        with pytest.raises(EventLogUnavailable):
            await log.append(later)
        assert log.appended == 1 and writer.written == 2


async def test_a_cancelled_wait_for_the_offsets_leaves_the_appends_in_flight_whole(
    redis_url: str,
) -> None:
    """At a stop the log cut's task is cancelled while `record_offsets` waits for
    the appends in flight: they must still end as they would (a session end
    logged and stored), not fail on an outcome already set (InvalidStateError)."""
    async with held_append(redis_url) as (_, held, log, append):
        offsets = asyncio.create_task(log.record_offsets())
        await asyncio.sleep(0)  # it waits for the append now
        offsets.cancel()
        with pytest.raises(asyncio.CancelledError):
            await offsets
        held.gate.set()
        await asyncio.wait_for(append, 5.0)  # raised InvalidStateError before the fix
        assert log.appended == 1


ODD_FILTERS = ('a/"b"/#', "c\\/d", 'e,"f":"g', "h\\", "ü/ñ/+", "{x}", "a/#")


async def test_filters_of_any_spelling_are_edited_into_the_stored_json(redis_url: str) -> None:
    """A client's few rows in a call are edited into its stored JSON as text;
    keys with quotes, backslashes, '/' and what looks like JSON must land
    where a decode would put them: one member per filter, the newest value."""
    node = 'n"\\1'
    common = {"client_id": "odd", "node": node, "ts_ms": 7}
    events: list[Event] = [
        SessionOpened(version=1, epoch=1, clean_start=False, expiry_s=60, protocol=5, **common)
    ]
    version = 1
    for qos in (0, 1):  # each filter subscribed, then subscribed again with another QoS
        for f in ODD_FILTERS:
            version += 1
            events.append(Subscribed(version=version, filter=f, qos=qos, **common))
    version += 1
    events.append(Unsubscribed(version=version, filter=ODD_FILTERS[2], **common))
    expected = folded(events).snapshot()
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.flushdb()
        writer = StoreWriter(client, PREFIX)
        for e in events:
            await writer.write(e)  # a call each: the text edits
        raw = await client.hget("{weir.state}:subs", "odd")
        assert raw is not None
        members = json.loads(raw, object_pairs_hook=lambda pairs: pairs)
        assert sorted(f for f, _ in members) == sorted(ODD_FILTERS)  # no filter twice
        snapshot = await RedisStateStore(client, PREFIX).load()
    finally:
        await client.aclose()
    assert snapshot is not None
    loaded = ClusterView()
    load_snapshot(loaded, loaded.apply, snapshot)
    assert loaded.snapshot() == expected
    live = loaded.subscriptions("odd")
    assert sorted(live) == sorted(f for f in ODD_FILTERS if f != ODD_FILTERS[2])
    assert {o.qos for o in live.values()} == {1}  # the second SUBSCRIBE's options
