"""The per-node indexes behind a dead node's work (services/session/redis.py):
finding its sessions and wills reads its own index, not the keyspace, and the
index does not keep clients that left the node."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.session.api import Fenced
from services.session.redis import RedisSessionStore, RedisWillStore, connect, node_index

pytestmark = pytest.mark.redis


def name(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Any]:
    c = connect(redis_url)
    yield c
    await c.aclose()


async def calls(client: Any, command: str) -> int:
    stats = await client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_a_dead_nodes_work_is_its_own_clients_not_the_keyspace(client: Any) -> None:
    """Before: every orphan search SCANned every key of Redis and read the hash
    of every client of every node."""
    sessions, wills = RedisSessionStore(client), RedisWillStore(client)
    dead, busy = name("dead"), name("busy")
    for i in range(300):  # another node's clients: none of the dead node's work
        await sessions.claim(f"{busy}-{i}", busy, False, 60)
        await wills.put(f"{busy}-{i}", busy, "t", b"w", 0)
    mine = [name("c") for _ in range(3)]
    for cid in mine:
        await sessions.claim(cid, dead, False, 60)
        await wills.put(cid, dead, "t", b"w", 0)
    await client.config_resetstat()
    assert sorted(await sessions.orphans(dead)) == sorted(mine)
    assert sorted(await wills.orphans(dead)) == sorted(mine)
    assert await calls(client, "scan") == 0
    assert await calls(client, "hmget") == 2 * len(mine)  # one per client, per store


async def test_the_index_forgets_clients_that_left(client: Any) -> None:
    a, b = name("a"), name("b")
    sessions_a = RedisSessionStore(client, node=a)
    sessions_b = RedisSessionStore(client, node=b)
    gone, moved = name("gone"), name("moved")
    claim = await sessions_a.claim(gone, a, False, 60)
    await sessions_a.release(gone, claim.epoch, 60)  # offline: out of a's index
    old = await sessions_a.claim(moved, a, False, 60)
    await sessions_b.claim(moved, b, False, 60)  # taken over: b's now
    assert await client.smembers(node_index(a, "s")) == {moved.encode()}  # stale till...
    with pytest.raises(Fenced):
        await sessions_a.release(moved, old.epoch, 60)  # ...a's (fenced) release
    assert await client.smembers(node_index(a, "s")) == set()
    assert await client.smembers(node_index(b, "s")) == {moved.encode()}
    # An orphan search prunes what nothing else did (a will replaced elsewhere).
    wills_a, wills_b = RedisWillStore(client, node=a), RedisWillStore(client, node=b)
    await wills_a.put(moved, a, "ta", b"w", 0)
    await wills_b.put(moved, b, "tb", b"w", 0)
    assert await wills_a.orphans(a) == []
    assert await client.smembers(node_index(a, "w")) == set()
    assert await wills_b.take(moved, "tb") == b"w"
    assert await client.smembers(node_index(b, "w")) == set()
