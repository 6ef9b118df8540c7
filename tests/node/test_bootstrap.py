"""Node start from a state store snapshot plus the log's tail (services.node.bootstrap).

The Kafka and Spark versions are in tests/streams/test_bootstrap_equality.py;
here the event log is the memory one, whose replay needs no wait: the tail's
replay starts before the snapshot loads, and must still apply nothing before it.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from services.broker.logstate import LogState
from services.broker.ports import Expiries, Session
from services.broker.routes import Routes
from services.event.api import EventLog, Placed
from services.event.memory import MemoryEventLog, MemoryLog
from services.event.schema import Event, SessionClosed, SessionOpened, Subscribed, Unsubscribed
from services.node import bootstrap
from services.retain.store import MemoryRetainStore
from services.session.memory import MemorySessionStore
from services.state.redis import RedisStateStore
from services.state.store import StateSnapshot, StoredSubscription
from services.state.writer import StoreWriter


class FixedStore:
    """A state store that holds one snapshot."""

    def __init__(self, snapshot: StateSnapshot) -> None:
        self.snapshot = snapshot

    async def load(self) -> StateSnapshot | None:
        return self.snapshot

    async def claim_reseed(self, owner: str, ttl_s: float) -> bool:
        raise AssertionError("the log is not empty: no re-seed")

    async def new_generation(self, owner: str) -> str:
        raise AssertionError("the log is not empty: no re-seed")

    async def release_reseed(self, owner: str) -> None:
        raise AssertionError("the log is not empty: no re-seed")

    async def close(self) -> None:
        pass


def stored(client: str, filter_: str, version: int, live: bool = True) -> StoredSubscription:
    return StoredSubscription(client, filter_, version, live, 1, False, False, 0, None, 1, "n0")


async def test_snapshot_loads_before_the_tail_and_both_reach_the_routing_table() -> None:
    log = MemoryLog()
    writer = MemoryEventLog(log)
    opened = SessionOpened(
        client_id="c1", version=1, node="n0", ts_ms=1, epoch=1, clean_start=False,
        expiry_s=3600, protocol=5,
    )  # fmt: skip
    folded: list[Event] = [
        opened,
        Subscribed(client_id="c1", version=2, node="n0", ts_ms=1, filter="a/+", qos=1),
        Subscribed(client_id="c1", version=3, node="n0", ts_ms=1, filter="b", qos=1),
        SessionClosed(
            client_id="c1", version=4, node="n0", ts_ms=1, reason="normal", expiry_s=3600
        ),
    ]
    for e in folded:
        await writer.append(e)
    offsets = {tp: len(records) for tp, records in log.records.items()}
    tail: list[Event] = [
        Unsubscribed(client_id="c1", version=5, node="n0", ts_ms=2, filter="b"),
        Subscribed(client_id="c1", version=6, node="n0", ts_ms=2, filter="c/#", qos=0),
    ]
    for e in tail:
        await writer.append(e)
    snapshot = StateSnapshot(
        offsets=offsets,
        generation="",
        sessions=[folded[-1]],  # type: ignore[list-item]
        subscriptions=[stored("c1", "a/+", 2), stored("c1", "b", 3)],
    )
    routes = Routes(node_id="n1", mark_durable=lambda c: None)
    events = MemoryEventLog(log)
    logstate = LogState(
        table=routes,
        expiries=Expiries(asyncio.get_running_loop()),
        events=events,
        retained=MemoryRetainStore(),
        store=MemorySessionStore(),
        spawn=lambda c: c.close(),
    )
    applied: list[Event] = []
    apply = logstate.apply

    def spy(event: Event) -> bool:
        applied.append(event)
        return apply(event)

    logstate.apply = spy  # type: ignore[method-assign]
    started = await bootstrap.start(logstate, FixedStore(snapshot), "n1")
    assert (started.source, started.loaded, started.replayed) == ("state store", 3, 2)
    assert applied == [folded[-1], *tail]  # the snapshot's session, then the tail in order
    assert set(logstate.view.subscriptions("c1")) == {"a/+", "c/#"}
    assert sorted(routes.trie.filters("c1")) == ["a/+", "c/#"]
    session = routes.sessions["c1"]
    assert isinstance(session, Session) and set(session.subs) == {"a/+", "c/#"}


def memory_logstate(events: MemoryEventLog) -> tuple[LogState, Routes]:
    routes = Routes(node_id="n1", mark_durable=lambda c: None)
    logstate = LogState(
        table=routes,
        expiries=Expiries(asyncio.get_running_loop()),
        events=events,
        retained=MemoryRetainStore(),
        store=MemorySessionStore(),
        spawn=lambda c: c.close(),
    )
    return logstate, routes


async def test_a_reseed_cut_short_leaves_no_old_offsets_and_every_node_starts_whole(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node n1 finds the log empty and re-seeds it from the store (real Redis),
    and dies after its first appended window. The store then holds no offsets
    of the old log and a new generation (a Spark checkpoint of the old log is
    void). n2, on the log as n1 left it (one record of the re-seed), starts
    at once from the snapshot and the whole log (no offsets: from its
    start); n3, on a log emptied again, takes n1's lapsed lease over and
    re-seeds it whole; n4 waits for another node's re-seed to show, then
    starts from the snapshot and that log."""
    monkeypatch.setattr(bootstrap, "RESEED_WINDOW", 1)
    monkeypatch.setattr(bootstrap, "RESEED_CLAIM_S", 0.3)
    client = aioredis.Redis.from_url(redis_url)
    try:
        store = RedisStateStore(client, "weir.")
        old = await store.new_generation("an earlier run")
        now_ms = int(time.time() * 1000)  # the offline session's expiry is an hour away
        common = {"client_id": "c1", "node": "n0", "ts_ms": now_ms}
        kept: list[Event] = [
            SessionOpened(version=1, epoch=1, clean_start=False, expiry_s=3600, protocol=5,
                          **common),
            Subscribed(version=2, filter="a/+", qos=1, **common),
            Subscribed(version=3, filter="b", qos=1, **common),
            SessionClosed(version=4, reason="normal", expiry_s=3600, **common),
        ]  # fmt: skip
        writer = StoreWriter(client, "weir.")
        for e in kept:
            await writer.write(e)
        await writer.write_offsets({("weir.sessions", 0): 9, ("weir.subscriptions", 0): 7})

        appended = bootstrap.reseed_window

        async def crash_after_one(events: EventLog, items: list[Event]) -> None:
            await appended(events, items)
            raise RuntimeError("n1 dies here")

        monkeypatch.setattr(bootstrap, "reseed_window", crash_after_one)
        log = MemoryLog()
        logstate, _ = memory_logstate(MemoryEventLog(log))
        with pytest.raises(RuntimeError, match="n1 dies here"):
            await bootstrap.start(logstate, store, "n1")
        monkeypatch.setattr(bootstrap, "reseed_window", appended)
        assert sum(len(r) for r in log.records.values()) == 1
        assert await store.offsets() == {}  # none of the old log's
        snapshot = await store.load()
        assert snapshot is not None and snapshot.generation not in ("", old)

        logstate, routes = memory_logstate(MemoryEventLog(log))  # n2: the log n1 left
        started = await bootstrap.start(logstate, store, "n2")
        assert (started.source, started.replayed) == ("state store", 1)  # the log from its start
        assert set(logstate.view.subscriptions("c1")) == {"a/+", "b"}
        assert sorted(routes.trie.filters("c1")) == ["a/+", "b"]
        assert sum(len(r) for r in log.records.values()) == 1  # n2 appended nothing

        fresh = MemoryLog()  # the log lost again; n1's lease lapses in 0.3 s
        logstate, routes = memory_logstate(MemoryEventLog(fresh))
        started = await bootstrap.start(logstate, store, "n3")
        assert started.source == "re-seeded log"
        assert sum(len(r) for r in fresh.records.values()) == 3  # opened/closed, 2 subs
        assert set(logstate.view.subscriptions("c1")) == {"a/+", "b"}
        assert sorted(routes.trie.filters("c1")) == ["a/+", "b"]

        # n4, on a log emptied again while n9 holds the lease: it waits for
        # n9's first record, then loads the snapshot and the whole log.
        third = MemoryLog()
        assert await store.claim_reseed("n9", 30.0)
        logstate, routes = memory_logstate(MemoryEventLog(third))
        starting = asyncio.ensure_future(bootstrap.start(logstate, store, "n4"))
        await asyncio.sleep(2 * bootstrap.RESEED_POLL_S)
        assert not starting.done()
        await MemoryEventLog(third).append(kept[0])  # n9's re-seed begins
        started = await asyncio.wait_for(starting, 10.0)
        assert (started.source, started.replayed) == ("re-seeded log", 1)
        assert sorted(routes.trie.filters("c1")) == ["a/+", "b"]
    finally:
        await client.aclose()


def test_a_replay_skips_only_a_seed_that_fills_its_partition_from_offset_0() -> None:
    """Where the re-seed's records are all a partition holds, a replay starts
    after them; where anything else landed before or among them (another
    node's append between two windows), that partition is read whole."""
    a, b, c = ("weir.sessions", 0), ("weir.sessions", 1), ("weir.subscriptions", 0)
    windows = [
        {a: Placed(0, 3, 3), b: Placed(0, 2, 2), c: Placed(1, 4, 3)},  # c: a record before
        {a: Placed(3, 5, 2), b: Placed(3, 4, 1)},  # b: one landed between the windows
    ]
    assert bootstrap.skip_seeded(windows) == {a: 5}
    assert bootstrap.skip_seeded([]) == {}
