"""SessionStore contract: one suite over the memory and the Redis store."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.broker.stores import TieredSessionStore, Tiers
from services.embedded.redis_server import RedisServer
from services.session.api import Fenced, SessionStore, StoreUnavailable
from services.session.memory import MemorySessionStore
from services.session.redis import RedisSessionStore
from tests.support.wait import until

URL = {"redis": "redis_url", "cluster": "redis_cluster_url"}  # the fixture giving each


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("tiered", marks=pytest.mark.redis),  # what a node runs: memory + Redis
        pytest.param("cluster", marks=pytest.mark.redis),  # Redis Cluster, 3 primaries
    ]
)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[SessionStore]:
    s: SessionStore
    if request.param == "memory":
        s = MemorySessionStore()
    elif request.param in ("redis", "cluster"):
        s = RedisSessionStore.from_url(request.getfixturevalue(URL[request.param]))
    else:
        durable = RedisSessionStore.from_url(request.getfixturevalue("redis_url"))
        s = TieredSessionStore(MemorySessionStore(), durable, Tiers())
    yield s
    await s.close()


async def test_first_claim_is_new_and_online(store: SessionStore) -> None:
    claim = await store.claim("c1", "n1", clean_start=False, expiry_s=60)
    assert claim.client_id == "c1"
    assert claim.epoch > 0
    assert not claim.session_present
    assert claim.previous_node is None
    info = await store.get("c1")
    assert info is not None
    assert (info.node, info.epoch, info.expiry_s, info.online) == ("n1", claim.epoch, 60, True)
    assert await store.get("other") is None


async def test_takeover_bumps_epoch_and_names_previous_node(store: SessionStore) -> None:
    first = await store.claim("c1", "n1", False, 60)
    second = await store.claim("c1", "n2", False, 60)
    assert second.epoch > first.epoch
    assert second.session_present
    assert second.previous_node == "n1"
    with pytest.raises(Fenced):
        await store.release("c1", first.epoch, 60)
    with pytest.raises(Fenced):
        await store.next_version("c1", first.epoch)
    info = await store.get("c1")
    assert info is not None and info.node == "n2" and info.online


async def test_clean_start_reports_no_session(store: SessionStore) -> None:
    await store.claim("c1", "n1", False, 60)
    claim = await store.claim("c1", "n1", clean_start=True, expiry_s=0)
    assert not claim.session_present
    assert claim.previous_node == "n1"


async def test_release_marks_offline_and_resume_is_present(store: SessionStore) -> None:
    first = await store.claim("c1", "n1", False, 60)
    await store.release("c1", first.epoch, 60)
    info = await store.get("c1")
    assert info is not None
    assert (info.online, info.node, info.epoch) == (False, None, first.epoch)
    again = await store.claim("c1", "n2", False, 60)
    assert again.session_present
    assert again.previous_node is None  # it was offline: nobody to take over from
    assert again.epoch > first.epoch


async def test_release_with_zero_expiry_discards_and_epochs_still_grow(
    store: SessionStore,
) -> None:
    first = await store.claim("c1", "n1", False, 0)
    v1 = await store.next_version("c1", first.epoch)
    await store.release("c1", first.epoch, 0)
    assert await store.get("c1") is None
    second = await store.claim("c1", "n1", False, 0)
    assert not second.session_present
    assert second.epoch > first.epoch  # a stale owner never becomes valid again
    assert await store.next_version("c1", second.epoch) > v1
    with pytest.raises(Fenced):
        await store.next_version("c1", first.epoch)


async def test_session_expires_after_release(store: SessionStore) -> None:
    claim = await store.claim("c1", "n1", False, 1)
    await store.release("c1", claim.epoch, 1)
    assert await store.get("c1") is not None

    async def gone() -> bool:
        return await store.get("c1") is None

    await until(gone)
    again = await store.claim("c1", "n1", False, 1)
    assert not again.session_present


async def test_never_expiring_session_stays(store: SessionStore) -> None:
    claim = await store.claim("c1", "n1", False, 0xFFFFFFFF)
    await store.release("c1", claim.epoch, 0xFFFFFFFF)
    info = await store.get("c1")
    assert info is not None and info.expiry_s == 0xFFFFFFFF and not info.online


async def test_versions_increase(store: SessionStore) -> None:
    claim = await store.claim("c1", "n1", False, 60)
    versions = [await store.next_version("c1", claim.epoch) for _ in range(20)]
    assert versions == sorted(set(versions))
    topic = [await store.next_topic_version("a/b") for _ in range(20)]
    assert topic == sorted(set(topic))
    assert await store.next_topic_version("other") > 0
    with pytest.raises(Fenced):
        await store.next_version("nobody", 1)


async def test_client_ids_with_braces_are_distinct(store: SessionStore) -> None:
    a = await store.claim("x}:s", "n1", False, 60)
    b = await store.claim("x", "n2", False, 60)
    info_a, info_b = await store.get("x}:s"), await store.get("x")
    assert info_a is not None and info_a.node == "n1" and info_a.epoch == a.epoch
    assert info_b is not None and info_b.node == "n2" and info_b.epoch == b.epoch


@pytest.mark.redis
async def test_redis_down_raises_unavailable_then_recovers(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    store = RedisSessionStore.from_url(server.url, timeout=1.0)
    try:
        claim = await store.claim("c1", "n1", False, 60)
        server.stop()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.next_version("c1", claim.epoch)
        with pytest.raises(StoreUnavailable):
            await store.get("c1")
        assert time.monotonic() - started < 5
        server.start()  # same port, same data dir (AOF)
        assert await store.next_version("c1", claim.epoch) > 0
        info = await store.get("c1")
        assert info is not None and info.epoch == claim.epoch
    finally:
        await store.close()
        server.stop()


@pytest.mark.redis
async def test_hung_redis_raises_unavailable_within_timeout(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    assert server.process is not None
    store = RedisSessionStore.from_url(server.url, timeout=0.5)
    try:
        await store.claim("c1", "n1", False, 60)
        server.process.send_signal(19)  # SIGSTOP: accepts nothing, answers nothing
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.get("c1")
        assert time.monotonic() - started < 3
        with pytest.raises(StoreUnavailable):
            await store.next_version("c1", 1)
        server.process.send_signal(18)  # SIGCONT
        # the late replies to the cancelled calls must not be read as answers to new ones
        for _ in range(3):
            info = await store.get("c1")
            assert info is not None and info.node == "n1"
            assert await store.next_topic_version("t") > 1000
            with pytest.raises(Fenced):
                await store.next_version("c1", 1)
    finally:
        if server.process is not None:
            server.process.send_signal(18)
        await store.close()
        server.stop()


@pytest.mark.redis
def test_durable_profile_keeps_writes_across_a_kill(tmp_path: Path) -> None:
    import redis as sync_redis

    server = RedisServer(tmp_path / "redis", profile="durable").start()
    try:
        with sync_redis.Redis.from_url(server.url) as client:
            assert client.config_get("appendfsync") == {"appendfsync": "always"}
            client.set("k", "v")
        server.kill()  # SIGKILL: no shutdown flush
        server.start()
        with sync_redis.Redis.from_url(server.url) as client:
            assert client.get("k") == b"v"
    finally:
        server.stop()


def test_missing_redis_server_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.embedded.redis_server import RedisServerError

    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RedisServerError, match="redis-server not found"):
        RedisServer(tmp_path / "redis").start()


async def test_a_burst_of_concurrent_claims_waits_for_connections(store: SessionStore) -> None:
    # More calls at once than the Redis pool has connections: each waits its turn
    # (bounded by the store's timeout) instead of failing with "too many connections".
    claims = await asyncio.gather(
        *(store.claim(f"burst-{i}", "n1", clean_start=False, expiry_s=60) for i in range(300))
    )
    assert len({c.client_id for c in claims}) == 300
    assert all(c.epoch > 0 and not c.session_present for c in claims)


# -- node death: a dead node's sessions (services.broker.orphans) --------------------


async def test_orphans_are_the_dead_nodes_online_sessions(store: SessionStore) -> None:
    dead, alive = name("dead"), name("alive")
    a, b, c = name("a"), name("b"), name("c")
    await store.claim(a, dead, False, 60)
    await store.claim(b, dead, False, 60)
    await store.claim(c, alive, False, 60)
    gone = await store.claim(name("d"), dead, False, 60)
    await store.release(gone.client_id, gone.epoch, 60)  # offline: not an orphan
    assert sorted(await store.orphans(dead)) == sorted([a, b])
    assert await store.orphans(name("nobody")) == []


async def test_adopt_takes_the_session_offline_under_a_new_epoch(store: SessionStore) -> None:
    dead, client = name("dead"), name("c")
    claim = await store.claim(client, dead, False, 60)
    version = await store.next_version(client, claim.epoch)
    adopted = await store.adopt(client, dead)
    assert adopted is not None
    assert adopted.epoch > claim.epoch and adopted.version > version
    assert adopted.expiry_s == 60
    info = await store.get(client)
    assert info is not None and not info.online and info.epoch == adopted.epoch
    with pytest.raises(Fenced):  # a late write of the dead node fails
        await store.next_version(client, claim.epoch)
    assert await store.adopt(client, dead) is None  # exactly once
    assert await store.orphans(dead) == []
    resumed = await store.claim(client, name("other"), False, 60)
    assert resumed.session_present  # the session lives on for its client


async def test_adopt_skips_a_session_resumed_elsewhere(store: SessionStore) -> None:
    dead, client = name("dead"), name("c")
    await store.claim(client, dead, False, 60)
    await store.claim(client, name("new"), False, 60)
    assert await store.adopt(client, dead) is None
    info = await store.get(client)
    assert info is not None and info.online


async def test_adopt_discards_a_session_without_expiry() -> None:
    store = MemorySessionStore()
    dead, client = name("dead"), name("c")
    await store.claim(client, dead, False, 0)
    adopted = await store.adopt(client, dead)
    assert adopted is not None and adopted.expiry_s == 0
    assert await store.get(client) is None


def name(what: str) -> str:
    """Unique per test: an orphan search scans every client of the store."""
    return f"{what}-{uuid.uuid4().hex[:8]}"
