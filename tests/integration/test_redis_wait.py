"""`--redis-wait N`: each Redis script's writes reach N replicas before its answer.

A primary and one replica (two real redis-servers, `REPLICAOF`). With
`replicas=1` a message stored for an offline session is on the replica by
the time `enqueue` returns, and a client's session claim too; with the
replica frozen (SIGSTOP: connected, silent) the same calls fail with
StoreUnavailable within the call's bound instead of answering for a write
only the primary has, which a failover would lose. Without WAIT (today's
default) they answer. On a node: with the replica frozen, a QoS 1 PUBLISH
for a persistent session is not acknowledged as stored (5.0 PUBACK 0x80).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import pytest
import redis
import redis.asyncio as aioredis

from services.config import SettingsError, load
from services.embedded.redis_server import RedisServer
from services.mqtt.packets import Message, Properties, Puback, Publish, Subscription
from services.queue.redis import RedisQueueStore
from services.session.api import SessionError
from services.session.redis import RedisSessionStore, client_keys, connect
from tests.integration.rawclient import Raw
from tests.support.backend_node import backend_settings, start_node

pytestmark = pytest.mark.redis

TIMEOUT_S = 1.0  # the stores' call bound here: WAIT gets half of it


@pytest.fixture(scope="module")
def primary_replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, int]]:
    """(primary url, replica url, replica pid), the replica in sync."""
    base = tmp_path_factory.mktemp("wait")
    primary = RedisServer(base / "primary").start()
    replica = RedisServer(base / "replica").start()
    try:
        sync = redis.Redis.from_url(replica.url)
        sync.execute_command("REPLICAOF", primary.host, str(primary.port))
        deadline = time.monotonic() + 10.0
        while sync.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.02)
        sync.close()
        assert replica.process is not None
        yield primary.url, replica.url, replica.process.pid
    finally:
        replica.stop()
        primary.stop()


class Frozen:
    """The replica stopped (SIGSTOP) for a block: connected, answering nothing."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __enter__(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def __exit__(self, *exc: object) -> None:
        os.kill(self.pid, signal.SIGCONT)


@pytest.fixture
async def stores(
    primary_replica: tuple[str, str, int],
) -> AsyncIterator[tuple[RedisQueueStore, RedisQueueStore, RedisSessionStore, aioredis.Redis]]:
    """Queue stores with and without WAIT, a waiting session store, the replica's client."""
    primary, replica, _ = primary_replica
    waiting = RedisQueueStore(connect(primary, TIMEOUT_S), timeout=TIMEOUT_S, replicas=1)
    plain = RedisQueueStore(connect(primary, TIMEOUT_S), timeout=TIMEOUT_S)
    sessions = RedisSessionStore(connect(primary, TIMEOUT_S), TIMEOUT_S, node="n", replicas=1)
    reader = aioredis.Redis.from_url(replica)
    try:
        yield waiting, plain, sessions, reader
    finally:
        for closing in (waiting.close(), plain.close(), sessions.close(), reader.aclose()):
            await closing


async def test_an_acknowledged_write_is_on_the_replica(
    stores: tuple[RedisQueueStore, RedisQueueStore, RedisSessionStore, aioredis.Redis],
) -> None:
    waiting, _, sessions, replica = stores
    claim = await sessions.claim("w-on", "n", clean_start=False, expiry_s=3600)
    await sessions.release("w-on", claim.epoch, 3600)
    result = await waiting.enqueue([("w-on", Message("t", b"kept", qos=1))])
    assert result.accepted == 1
    # No wait here: WAIT returned only once the replica had both writes.
    assert await replica.exists(client_keys("w-on")[0]) == 1
    assert await replica.hlen(client_keys("w-on")[1]) == 1


async def test_a_write_no_replica_took_fails_instead_of_answering(
    stores: tuple[RedisQueueStore, RedisQueueStore, RedisSessionStore, aioredis.Redis],
    primary_replica: tuple[str, str, int],
) -> None:
    waiting, plain, sessions, _ = stores
    message = Message("t", b"primary only", qos=1)
    # The session must exist, or the enqueue writes nothing, and a WAIT after no
    # write is met by whatever the replica last acknowledged (CI saw it answer 1).
    claim = await sessions.claim("w-off", "n", clean_start=False, expiry_s=3600)
    await sessions.release("w-off", claim.epoch, 3600)
    with Frozen(primary_replica[2]):
        began = time.monotonic()
        with pytest.raises(SessionError, match="0 of 1 replicas"):
            await waiting.enqueue([("w-off", message)])
        assert time.monotonic() - began < TIMEOUT_S + 0.5
        with pytest.raises(SessionError, match="0 of 1 replicas"):
            await sessions.claim("w-off", "n", clean_start=False, expiry_s=3600)
        # Without WAIT the same write is acknowledged on the primary's word alone.
        assert (await plain.enqueue([("w-off", message)])).accepted == 1


def test_the_option_is_declared_once_and_checked() -> None:
    assert load({"redis_wait": 1}).redis_wait == 1
    assert load({}).redis_wait == 0
    with pytest.raises(SettingsError, match="redis-wait needs Redis"):
        load({"redis_wait": 1, "backend": "memory"})
    with pytest.raises(SettingsError):
        load({"redis_wait": -1})


def test_a_node_does_not_acknowledge_what_no_replica_has(
    primary_replica: tuple[str, str, int], kafka_bootstrap: str, kafka_topic_prefix: str,
) -> None:  # fmt: skip
    primary, _, pid = primary_replica
    settings = backend_settings(primary, kafka_bootstrap, kafka_topic_prefix, "waiter")
    node = start_node(replace(settings, redis_wait=1))
    try:
        sub = Raw(node.mqtt_port, 5)
        expiry = Properties(session_expiry_interval=3600)
        assert sub.connect("w-sub", clean_start=False, properties=expiry).reason_code == 0
        sub.subscribe(Subscription("w/t", 1))
        sub.close()
        pub = Raw(node.mqtt_port, 5)
        assert pub.connect("w-pub").reason_code == 0
        pub.send(Publish("w/t", b"stored", qos=1, packet_id=1))
        assert pub.expect(Puback) == Puback(1)
        with Frozen(pid):
            pub.send(Publish("w/t", b"primary only", qos=1, packet_id=2))
            acked = pub.expect(Puback, timeout=10.0)
        assert acked.packet_id == 2 and acked.reason_code == 0x80, acked
        pub.close()
    finally:
        node.stop()
