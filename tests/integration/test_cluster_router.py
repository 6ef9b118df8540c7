"""ClusterRouter: membership drives real loopback links; hooks reach the local node."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence

import pytest

from services.cluster.api import Member, Membership
from services.cluster.membership import MemoryMembership, MemoryMembershipHub, RedisMembership
from services.cluster.router import ClusterRouter
from services.mqtt.packets import Message
from tests.support.wait import until

POLL_S = 0.02
HELD_TTL_S = 0.6
BARRIER_S = 10.0  # a bound on a held beat: it fails, never passes, by time


class Local:
    def __init__(self) -> None:
        self.forwarded: list[tuple[Message, tuple[str, ...]]] = []
        self.queued: list[tuple[str, ...]] = []
        self.kicks: list[tuple[str, int, str]] = []
        self.joined: list[str] = []
        self.died: list[str] = []
        self.drained: list[str] = []

    def deliver_forwarded(self, message: Message, client_ids: Sequence[str]) -> None:
        self.forwarded.append((message, tuple(client_ids)))

    def deliver_queued(self, client_ids: Sequence[str]) -> None:
        self.queued.append(tuple(client_ids))

    def kicked(self, client_id: str, epoch: int, node: str) -> None:
        self.kicks.append((client_id, epoch, node))

    def node_joined(self, node_id: str) -> None:
        self.joined.append(node_id)

    def node_died(self, node_id: str) -> None:
        self.died.append(node_id)

    def peer_drained(self, node_id: str) -> None:
        self.drained.append(node_id)


class Cluster:
    def __init__(self, make: Callable[[], Membership]) -> None:
        self.make = make
        self.routers: list[ClusterRouter] = []

    async def node(self, node_id: str) -> tuple[ClusterRouter, Local]:
        router = ClusterRouter(node_id, self.make(), poll_interval_s=POLL_S)
        local = Local()
        await router.start(local)
        self.routers.append(router)
        return router, local

    async def close(self) -> None:
        for r in self.routers:
            await r.stop()
            await r.membership.close()


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def cluster(request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    if request.param == "memory":
        hub = MemoryMembershipHub()
        c = Cluster(lambda: MemoryMembership(hub, ttl_s=1.0))
    else:
        url = request.getfixturevalue("redis_url")
        c = Cluster(lambda: RedisMembership.from_url(url, ttl_s=1.0))
    yield c
    await c.close()


async def test_nodes_find_each_other_and_forward(cluster: Cluster) -> None:
    a, _ = await cluster.node("a")
    b, b_local = await cluster.node("b")
    assert await a.wait_peers(["b"], 5.0)
    assert await b.wait_peers(["a"], 5.0)
    m0, m1 = Message("t", b"zero", 0), Message("t", b"one", 1)
    assert a.forward(m0, {"b": ["s1", "s2"]}) == 1
    assert a.forward(m1, {"b": ["s1"]}) == 1
    await until(lambda: len(b_local.forwarded) == 2)
    assert b_local.forwarded == [(m0, ("s1", "s2")), (m1, ("s1",))]


async def test_notifies_merge_per_turn_and_kick_arrives(cluster: Cluster) -> None:
    a, _ = await cluster.node("a")
    _, b_local = await cluster.node("b")
    assert await a.wait_peers(["b"], 5.0)
    for cid in ("p1", "p2", "p1", "p3", "p2"):
        a.notify("b", cid)
    a.kick("b", "p9", 42)
    await until(lambda: bool(b_local.kicks))
    assert b_local.queued == [("p1", "p2", "p3")]
    assert b_local.kicks == [("p9", 42, "a")]


async def test_a_dead_node_is_unlinked(cluster: Cluster) -> None:
    a, a_local = await cluster.node("a")
    b, _ = await cluster.node("b")
    assert await a.wait_peers(["b"], 5.0)
    assert a_local.joined == ["b"] and a_local.died == []
    await b.stop()
    await until(lambda: a.peers() == [])
    await until(lambda: "b" in a_local.died)  # told after the link is gone: take over
    assert a.forward(Message("t", b"", 1), {"b": ["x"]}) == 1  # held: b might be joining
    assert a.links.held() == ["b"]
    await until(lambda: a.links.held() == [], timeout=10.0)  # given up after a TTL


async def test_frames_for_a_node_not_yet_seen_are_held_until_it_joins(cluster: Cluster) -> None:
    a, _ = await cluster.node("a")
    m = Message("early", b"p", 1)
    assert a.forward(m, {"late": ["c"]}) == 1
    a.notify("late", "p")
    _, late_local = await cluster.node("late")
    await until(lambda: bool(late_local.queued))
    assert late_local.forwarded == [(m, ("c",))]
    assert late_local.queued == [("p",)]


async def test_three_nodes_fan_out(cluster: Cluster) -> None:
    a, _ = await cluster.node("a")
    _, b_local = await cluster.node("b")
    _, c_local = await cluster.node("c")
    assert await a.wait_peers(["b", "c"], 5.0)
    m = Message("x/y", b"p", 1, sender="pub")
    assert a.forward(m, {"b": ["b1"], "c": ["c1", "c2"]}) == 2
    await until(lambda: bool(b_local.forwarded and c_local.forwarded))
    assert b_local.forwarded == [(m, ("b1",))]
    assert c_local.forwarded == [(m, ("c1", "c2"))]


class SlowPolls(MemoryMembership):
    """Polls that take `slow_s` once `slow` is set (a SCAN behind a busy Redis);
    beats as fast as ever."""

    def __init__(self, hub: MemoryMembershipHub, ttl_s: float, slow_s: float) -> None:
        super().__init__(hub, ttl_s)
        self.slow = False
        self.slow_s = slow_s

    async def live_nodes(self) -> dict[str, Member]:
        if self.slow:
            await asyncio.sleep(self.slow_s)  # the slow answer itself, not a wait for something
        return await super().live_nodes()


class Fences(Local):
    def __init__(self) -> None:
        super().__init__()
        self.fences: list[bool] = []

    def fenced(self, fenced: bool) -> None:
        self.fences.append(fenced)


async def test_a_slow_poll_does_not_hold_the_heartbeat_back() -> None:
    """Beats keep their own pace while a poll hangs for longer than the fence
    bound (half the TTL): the node is not fenced. (When the poll and the beat
    took turns in one loop, the beat waited for the poll, and the node fenced
    itself though Redis stored every beat it was sent.)"""
    ttl_s = 0.6
    membership = SlowPolls(MemoryMembershipHub(), ttl_s, slow_s=3 * ttl_s)
    router = ClusterRouter("slow", membership, poll_interval_s=POLL_S)
    local = Fences()
    await router.start(local)
    try:
        membership.slow = True
        await asyncio.sleep(2 * ttl_s)  # past the fence bound four times over
        assert local.fences == [] and not router.fenced
    finally:
        membership.slow = False
        await router.stop()


class HeldBeats(MemoryMembership):
    """Beats that wait, once `held` is set, until `release` is (Redis not
    answering, or the whole process frozen); `stored` counts those stored."""

    def __init__(self, hub: MemoryMembershipHub, ttl_s: float) -> None:
        super().__init__(hub, ttl_s)
        self.held = threading.Event()
        self.release = threading.Event()
        self.stored = 0

    def beat_blocking(self) -> None:
        if self.held.is_set():
            self.release.wait(BARRIER_S)
        super().beat_blocking()
        self.stored += 1


async def after_overdue_timers() -> None:
    """A barrier: the loop's timers already due (a fence check among them)
    run before a timer due now."""
    await asyncio.sleep(1e-6)


@contextlib.asynccontextmanager
async def held_beats(node_id: str) -> AsyncIterator[tuple[HeldBeats, ClusterRouter, Fences]]:
    """A router on HeldBeats, TTL 0.6 s (fenced 0.3 s after its last stored beat)."""
    membership = HeldBeats(MemoryMembershipHub(), HELD_TTL_S)
    router = ClusterRouter(node_id, membership, poll_interval_s=POLL_S)
    local = Fences()
    await router.start(local)
    try:
        yield membership, router, local
    finally:
        await router.stop()


async def test_a_held_up_loop_is_not_fenced_while_its_beats_are_stored() -> None:
    """The loop held up past the fence bound (19,000 clients leaving at once
    and their garbage collections did that for seconds) while Redis stores
    every beat: the node is not fenced. (Beats were a task on the loop: none
    was sent while it was held up, and the node fenced itself, disconnecting
    every client.)"""
    async with held_beats("busy") as (membership, router, local):
        before = membership.stored
        time.sleep(2 * HELD_TTL_S)  # the loop held up: four fence bounds
        assert membership.stored > before  # the beats went on meanwhile
        await after_overdue_timers()
        assert local.fences == [] and not router.fenced


async def test_a_beat_stored_only_after_a_gap_fences_the_node_first() -> None:
    """Loop and beats held up together past the fence bound (the process
    frozen, SIGSTOP), and a beat stored before the loop runs again: survivors
    may have taken over meanwhile, so the node fences (every client
    disconnected) before it takes clients again."""
    async with held_beats("frozen") as (membership, router, local):
        membership.held.set()
        time.sleep(2 * HELD_TTL_S)  # frozen: the loop held up, and the beats
        stored = membership.stored
        membership.held.clear()
        membership.release.set()
        deadline = time.monotonic() + BARRIER_S
        while membership.stored == stored:  # a beat stored, the loop still held up
            assert time.monotonic() < deadline, "no beat stored"
            time.sleep(0.001)
        await after_overdue_timers()
        await until(lambda: local.fences == [True, False], "fenced, then clients taken again")
        assert not router.fenced
