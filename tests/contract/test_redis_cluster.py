"""What is particular to Redis Cluster (services/store/redis.py, queue/slots.py):
batches split per hash slot, node indexes kept beside the scripts, WAIT on
the keys' own primary, and a store that goes on after a primary failover.
The shared contract suites run on the cluster too (their "cluster" params)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis

from services.config.declare import SettingsError
from services.config.loader import load
from services.embedded.redis_cluster import LocalRedisCluster
from services.mqtt.packets import Message
from services.queue.api import IncomingMark
from services.queue.redis import RedisQueueStore
from services.queue.slots import slot_of
from services.session.api import StoreUnavailable
from services.session.redis import RedisSessionStore, RedisWillStore, connect, node_index

pytestmark = pytest.mark.redis


def name(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def client(redis_cluster_url: str) -> AsyncIterator[Any]:
    c = connect(redis_cluster_url)
    yield c
    await c.aclose()


def in_slots(count: int) -> list[str]:
    """`count` client ids in `count` different hash slots."""
    ids: dict[int, str] = {}
    while len(ids) < count:
        cid = name("c")
        ids.setdefault(slot_of(cid), cid)
    return list(ids.values())


async def test_a_batch_across_slots_stores_every_copy_and_its_mark_once(client: Any) -> None:
    sessions, queue = RedisSessionStore(client), RedisQueueStore(client)
    pub, *subs = in_slots(4)
    epochs = {cid: (await sessions.claim(cid, "n1", False, 60)).epoch for cid in [pub, *subs]}
    message = Message("t", b"once", 2)
    mark = IncomingMark(pub, epochs[pub], 9)
    items = [(cid, message) for cid in subs]
    first = await queue.enqueue_and_take(items, {}, {mark: [0, 1, 2]}, [[0, 1, 2]])
    assert (first.accepted, first.refused, first.duplicate_marks) == (3, frozenset(), frozenset())
    assert await queue.incoming_has(pub, epochs[pub], 9)
    again = await queue.enqueue_and_take(items, {}, {mark: [0, 1, 2]}, [[0, 1, 2]])
    assert again.accepted == 0 and again.duplicate_marks == frozenset({mark})
    for cid in subs:  # one copy each, the resend left out everywhere
        assert [i.message.payload for i in await queue.take(cid, epochs[cid], 10)] == [b"once"]


async def test_node_index_follows_claims_and_releases_across_slots(client: Any) -> None:
    a, b = name("a"), name("b")
    sessions_a, sessions_b = RedisSessionStore(client, node=a), RedisSessionStore(client, node=b)
    gone, moved = in_slots(2)
    claim = await sessions_a.claim(gone, a, False, 60)
    assert await client.smembers(node_index(a, "s")) == {gone.encode()}
    await sessions_a.release(gone, claim.epoch, 60)
    assert await client.smembers(node_index(a, "s")) == set()
    await sessions_a.claim(moved, a, False, 60)
    await sessions_b.claim(moved, b, False, 60)  # taken over: stale in a's index
    assert await sessions_a.orphans(a) == []  # and pruned by a search
    assert await client.smembers(node_index(a, "s")) == set()
    assert await sessions_b.orphans(b) == [moved]
    wills_a, wills_b = RedisWillStore(client, node=a), RedisWillStore(client, node=b)
    await wills_a.put(moved, a, "ta", b"w", 0)
    assert await wills_b.adopt(moved, a, b, "tb", 0) is not None
    assert await client.smembers(node_index(a, "w")) == set()
    assert await wills_b.take(moved, "tb") == b"w"
    assert await client.smembers(node_index(b, "w")) == set()


async def test_redis_wait_waits_on_the_keys_own_primary(client: Any) -> None:
    """WAIT on the connection that ran the script (the cluster client's own
    WAIT goes to every node): one replica per primary here, so 1 answers
    and 2 fails within the bound."""
    cid = name("c")
    waited = RedisSessionStore(client, replicas=1)
    claim = await waited.claim(cid, "n1", False, 60)
    assert claim.epoch > 0
    with pytest.raises(StoreUnavailable, match="1 of 2 replicas"):
        await RedisSessionStore(client, timeout=0.4, replicas=2).claim(cid, "n1", False, 60)


async def test_stores_go_on_after_a_primary_failover(
    redis_cluster: LocalRedisCluster, redis_cluster_url: str
) -> None:
    """CLUSTER FAILOVER on the replica of a client's primary: the store's
    next calls reach the new primary (which has none of the scripts loaded);
    at most the first call after the switch fails, and nothing is lost."""
    client = connect(redis_cluster_url)
    cid = name("c")
    try:
        for replicas in (0, 1):
            sessions = RedisSessionStore(client, replicas=replicas)
            queue = RedisQueueStore(client, replicas=replicas)
            epoch = (await sessions.claim(cid, "n1", False, 60)).epoch
            await queue.enqueue([(cid, Message("t", b"before", 1))])
            slot = slot_of(cid)
            primary = next(p for p in redis_cluster.primaries() if _serves(p, slot))
            await asyncio.to_thread(redis_cluster.failover, redis_cluster.replica_of(primary))
            failed = 0
            for _ in range(2):
                try:
                    await queue.enqueue([(cid, Message("t", b"after", 1))])
                    break
                except StoreUnavailable:
                    failed += 1
            assert failed <= 1
            taken = await queue.take(cid, epoch, 10)
            assert [i.message.payload for i in taken] == [b"before", b"after"]
            await queue.discard(cid)
    finally:
        await client.aclose()


def _serves(port: int, slot: int) -> bool:
    with redis.Redis(port=port, socket_timeout=2) as c:
        return int(c.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)) > 0


def test_a_bad_cluster_url_is_one_line() -> None:
    with pytest.raises(SettingsError, match="expected redis\\+cluster://HOST:PORT"):
        load({"redis_url": "redis+cluster://127.0.0.1"}, env={})
    settings = load({"redis_url": "redis+cluster://u:p@127.0.0.1:7000,127.0.0.1:7001"}, env={})
    assert settings.redis_url is not None and settings.redis_url.startswith("redis+cluster://")


CLUSTER = "redis+cluster://127.0.0.1:7000"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("up", "--redis", CLUSTER, "--rate-storage", "redis"),
         "weir up: --rate-storage redis does not run on Redis Cluster (yet): "
         "use --rate-storage memory"),
    ],
)  # fmt: skip
def test_what_does_not_run_on_a_cluster_yet_says_so_in_one_line(
    args: tuple[str, ...], says: str
) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "services", *args], input="pw\n",
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [says]


def _weir(*args: str, stdin: str = "") -> tuple[int, str, str]:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "services", *args], input=stdin,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    return done.returncode, done.stdout, done.stderr


async def test_weir_ban_works_on_a_cluster_and_the_nodes_store_reads_it(
    client: Any, redis_cluster_url: str
) -> None:
    """Before: `weir ban` refused a cluster URL in one line."""
    from services.auth.banned import RedisBans

    who = name("banned")
    rc, out, err = await asyncio.to_thread(
        _weir, "ban", "--redis", redis_cluster_url, "add", "--clientid", who, "--reason", "t"
    )
    assert (rc, err) == (0, ""), err
    rc, out, err = await asyncio.to_thread(_weir, "ban", "--redis", redis_cluster_url, "list")
    assert rc == 0 and who in out, (out, err)
    assert who in [ban.who for ban in await RedisBans(client).list()]
    rc, _, err = await asyncio.to_thread(
        _weir, "ban", "--redis", redis_cluster_url, "del", "--clientid", who
    )
    assert rc == 0, err
    assert who not in [ban.who for ban in await RedisBans(client).list()]


async def test_weir_passwd_works_on_a_cluster_and_the_nodes_users_check_it(
    client: Any, redis_cluster_url: str
) -> None:
    """Before: `weir passwd --redis` refused a cluster URL in one line."""
    from services.auth.api import ClientInfo, Decision
    from services.auth.redisusers import RedisUsers

    user = name("user")
    rc, _, err = await asyncio.to_thread(
        _weir, "passwd", "--redis", redis_cluster_url, user, "--password-stdin", stdin="s3cret\n"
    )
    assert rc == 0, err
    users = RedisUsers(client)
    info = ClientInfo("c", user, "127.0.0.1:1", 4)
    good, bad = await users.check(info, b"s3cret"), await users.check(info, b"wrong")
    assert isinstance(good, Decision) and good.ok
    assert isinstance(bad, Decision) and not bad.ok
