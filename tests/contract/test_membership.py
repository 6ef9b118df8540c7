"""Membership contract: one suite over the memory and the Redis implementation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from services.cluster.api import Member, Membership, MembershipChange, MembershipUnavailable
from services.cluster.membership import (
    MemoryMembership,
    MemoryMembershipHub,
    RedisMembership,
    Roster,
    watch,
)
from tests.support.wait import until

SHORT_TTL_S = 1.0  # real time on Redis: long enough that a loaded machine's poll (SCAN + MGET on
# every primary of a cluster) does not outlast a record it should first see alive (it did at 0.3)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class World:
    """Makes members that share one store, and lets their records lapse."""

    def __init__(self, kind: str, redis_url: str | None) -> None:
        self.kind = kind
        self.clock = FakeClock()
        self.hub = MemoryMembershipHub(self.clock)
        self.url = redis_url
        self.made: list[Membership] = []

    def member(self, ttl_s: float = 5.0) -> Membership:
        m: Membership
        if self.kind == "memory":
            m = MemoryMembership(self.hub, ttl_s)
        else:
            assert self.url is not None
            m = RedisMembership.from_url(self.url, ttl_s)
        self.made.append(m)
        return m

    async def lapse(self, ttl_s: float) -> None:
        """Move time past ttl_s: the fake clock for memory, real time for Redis."""
        if self.kind == "memory":
            self.clock.now += ttl_s + 0.001
        else:
            await asyncio.sleep(ttl_s + 0.05)  # a TTL is the behaviour under test


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("cluster", marks=pytest.mark.redis),  # Redis Cluster, 3 primaries
    ]
)
async def world(request: pytest.FixtureRequest) -> AsyncIterator[World]:
    fixture = {"redis": "redis_url", "cluster": "redis_cluster_url"}.get(request.param)
    url = request.getfixturevalue(fixture) if fixture else None
    w = World(request.param, url)
    yield w
    for m in w.made:
        await m.close()


async def test_join_is_visible_to_everyone_with_its_address(world: World) -> None:
    a, b = world.member(), world.member()
    await a.join(Member("a", "127.0.0.1:7001"))
    await b.join(Member("b", "127.0.0.1:7002"))
    expected = {"a": Member("a", "127.0.0.1:7001"), "b": Member("b", "127.0.0.1:7002")}
    assert await a.live_nodes() == expected
    assert await b.live_nodes() == expected


async def test_poll_reports_joins_once_and_never_self(world: World) -> None:
    a, b = world.member(), world.member()
    await a.join(Member("a", "127.0.0.1:7001"))
    first = await a.poll()
    assert first == MembershipChange((), ())
    assert not first
    await b.join(Member("b", "127.0.0.1:7002"))
    assert await a.poll() == MembershipChange((Member("b", "127.0.0.1:7002"),), ())
    assert await a.poll() == MembershipChange((), ())


async def test_leave_is_reported_as_death(world: World) -> None:
    a, b = world.member(), world.member()
    await a.join(Member("a", "127.0.0.1:7001"))
    await b.join(Member("b", "127.0.0.1:7002"))
    await a.poll()
    await b.leave()
    assert await a.poll() == MembershipChange((), ("b",))
    assert "b" not in await a.live_nodes()


async def test_missed_heartbeats_are_a_death_and_a_beat_keeps_alive(world: World) -> None:
    a, b, c = world.member(), world.member(SHORT_TTL_S), world.member(SHORT_TTL_S)
    await a.join(Member("a", "127.0.0.1:7001"))
    await b.join(Member("b", "127.0.0.1:7002"))
    await c.join(Member("c", "127.0.0.1:7003"))
    await a.poll()
    await world.lapse(SHORT_TTL_S / 2)
    await c.beat()
    await world.lapse(SHORT_TTL_S / 2)
    change = await a.poll()
    assert change.died == ("b",)
    assert "c" in await a.live_nodes()


async def test_rejoin_with_new_address_is_reported(world: World) -> None:
    a, b = world.member(), world.member()
    await a.join(Member("a", "127.0.0.1:7001"))
    await b.join(Member("b", "127.0.0.1:7002"))
    await a.poll()
    await b.join(Member("b", "127.0.0.1:7999"))
    assert await a.poll() == MembershipChange((Member("b", "127.0.0.1:7999"),), ())


async def test_beat_recreates_a_lapsed_record(world: World) -> None:
    a, b = world.member(), world.member(SHORT_TTL_S)
    await a.join(Member("a", "127.0.0.1:7001"))
    await b.join(Member("b", "127.0.0.1:7002"))
    await world.lapse(SHORT_TTL_S)
    assert "b" not in await a.live_nodes()
    await b.beat()
    assert (await a.live_nodes())["b"] == Member("b", "127.0.0.1:7002")


async def test_a_blocking_beat_from_another_thread_recreates_a_lapsed_record(world: World) -> None:
    a, b = world.member(), world.member(SHORT_TTL_S)
    await a.join(Member("a", "127.0.0.1:7001"))
    await b.join(Member("b", "127.0.0.1:7002"))
    await world.lapse(SHORT_TTL_S)
    assert "b" not in await a.live_nodes()
    await asyncio.to_thread(b.beat_blocking)  # as the heartbeat thread calls it
    assert (await a.live_nodes())["b"] == Member("b", "127.0.0.1:7002")


async def test_a_blocking_beat_needs_the_url_to_connect_with(redis_url: str) -> None:
    made = RedisMembership.from_url(redis_url)
    bare = RedisMembership(made._client)  # as `weir verify` makes one: to list nodes only
    try:
        await bare.join(Member("x", "127.0.0.1:7001"))
        with pytest.raises(MembershipUnavailable, match="without a URL"):
            bare.beat_blocking()
        await bare.leave()
    finally:
        await made.close()


def test_roster_diff_is_pure() -> None:
    r = Roster("me")
    x, y = Member("x", "h:1"), Member("y", "h:2")
    assert r.update({"me": Member("me", "h:0"), "x": x}) == MembershipChange((x,), ())
    assert r.update({"x": x, "y": y}) == MembershipChange((y,), ())
    assert r.update({"y": Member("y", "h:3")}) == MembershipChange((Member("y", "h:3"),), ("x",))
    assert r.known == {"y": Member("y", "h:3")}


async def test_watch_reports_a_peer_joining_and_dying(world: World) -> None:
    a, b = world.member(), world.member(SHORT_TTL_S)
    await a.join(Member("a", "127.0.0.1:7001"))
    changes: list[MembershipChange] = []
    task = asyncio.create_task(watch(a, changes.append, 0.02))
    try:
        await b.join(Member("b", "127.0.0.1:7002"))
        await until(lambda: any(c.joined for c in changes))
        assert changes[-1].joined == (Member("b", "127.0.0.1:7002"),)
        await b.leave()
        await until(lambda: any(c.died for c in changes))
        assert changes[-1].died == ("b",)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
