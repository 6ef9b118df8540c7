"""WillStore contract (wills stored with the session: services.broker.wills), over
the memory and the Redis store. Client and node names are unique per test,
since an orphan search scans every will of the store."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from services.session.api import WillStore
from services.session.memory import MemoryWillStore
from services.session.redis import RedisWillStore


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("cluster", marks=pytest.mark.redis),  # Redis Cluster, 3 primaries
    ]
)
async def wills(request: pytest.FixtureRequest) -> AsyncIterator[WillStore]:
    if request.param == "memory":
        yield MemoryWillStore()
        return
    url = "redis_cluster_url" if request.param == "cluster" else "redis_url"
    s = RedisWillStore.from_url(request.getfixturevalue(url))
    yield s
    await s.close()


def name(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


async def test_take_is_once_and_only_with_the_token(wills: WillStore) -> None:
    client = name("c")
    assert await wills.put(client, "n1", "t1", b"will", 0) is None
    assert await wills.take(client, "other") is None
    assert await wills.take(client, "t1") == b"will"
    assert await wills.take(client, "t1") is None


async def test_put_returns_the_replaced_will(wills: WillStore) -> None:
    client = name("c")
    await wills.put(client, "n1", "t1", b"old", 30)
    assert await wills.arm(client, "t1", 123_000)
    old = await wills.put(client, "n2", "t2", b"new", 0)
    assert old is not None
    assert (old.message, old.delay_s, old.node, old.due_ms) == (b"old", 30, "n1", 123_000)
    assert await wills.take(client, "t1") is None  # the old connection's take fails
    assert not await wills.arm(client, "t1", 1)
    assert await wills.put(client, "n2", "t3", None, 0) is not None  # no will: cleared
    assert await wills.take(client, "t2") is None
    assert await wills.put(client, "n2", "t4", None, 0) is None


async def test_adopt_moves_a_dead_nodes_wills(wills: WillStore) -> None:
    dead, survivor = name("dead"), name("survivor")
    open_, armed, elsewhere = name("open"), name("armed"), name("elsewhere")
    await wills.put(open_, dead, "t1", b"w1", 5)
    await wills.put(armed, dead, "t2", b"w2", 5)
    await wills.arm(armed, "t2", 1_000_000)
    await wills.put(elsewhere, name("alive"), "t3", b"w3", 0)
    assert sorted(await wills.orphans(dead)) == sorted([open_, armed])
    got = await wills.adopt(open_, dead, survivor, "s1", now_ms=2_000_000)
    assert got is not None and got.message == b"w1"
    assert got.due_ms == 2_005_000  # an open connection's will: its delay from now
    got = await wills.adopt(armed, dead, survivor, "s2", now_ms=2_000_000)
    assert got is not None and got.due_ms == 1_000_000  # an armed one keeps its due time
    assert await wills.adopt(open_, dead, survivor, "s9", now_ms=0) is None  # once
    assert await wills.orphans(dead) == []
    assert sorted(await wills.orphans(survivor)) == sorted([open_, armed])
    assert await wills.take(open_, "t1") is None  # the dead node's token no longer takes it
    assert await wills.take(open_, "s1") == b"w1"


async def test_a_will_keeps_who_set_it(wills: WillStore) -> None:
    """The user name (none, empty or a name) and the peer come back from `put`
    and `adopt`, so whoever publishes the will asks the ACL as its client."""
    dead, survivor = name("dead"), name("survivor")
    named, anonymous, empty = name("named"), name("anon"), name("empty")
    await wills.put(named, dead, "t1", b"w1", 0, "alice", "10.0.0.7:5000")
    await wills.put(anonymous, dead, "t2", b"w2", 0, None, "10.0.0.8:5000")
    await wills.put(empty, dead, "t3", b"w3", 0, "", "[::1]:5000")
    got = await wills.adopt(named, dead, survivor, "s1", now_ms=1)
    assert got is not None and (got.username, got.peer) == ("alice", "10.0.0.7:5000")
    got = await wills.adopt(anonymous, dead, survivor, "s2", now_ms=1)
    assert got is not None and (got.username, got.peer) == (None, "10.0.0.8:5000")
    old = await wills.put(empty, survivor, "s3", None, 0)
    assert old is not None and (old.username, old.peer) == ("", "[::1]:5000")
