"""The cluster heartbeat does not queue behind the node's own Redis calls.

The stores share one connection pool (`services.store.redis.connect`: at most
POOL_CONNECTIONS calls at once, the rest wait for a free connection). A
heartbeat that waited there behind a busy node's calls could miss its half
TTL and fence the node (issue 23: nodes fenced themselves under load), so
membership has a connection of its own (`open_backends`).
"""

from __future__ import annotations

import asyncio
import time

from services.cluster.api import Member
from services.node.app import open_backends
from services.state.redis import RedisStateStore
from services.store.redis import POOL_CONNECTIONS, connect
from tests.support.backend_node import backend_settings

BUSY_S = 3.0  # how long the stores' pool is held (each call a BLPOP that waits this long)
BEAT_BOUND_S = 1.0  # the fence bound of a 2 s TTL; a beat on its own connection takes ms


async def blocked(redis_url: str, count: int) -> None:
    """Until Redis has `count` clients blocked (the BLPOPs hold their connections)."""
    probe = connect(redis_url)
    try:
        while int((await probe.info("clients"))["blocked_clients"]) < count:
            await asyncio.sleep(0.02)  # a poll of Redis's own count
    finally:
        await probe.aclose()


async def test_a_beat_goes_through_while_every_store_connection_is_busy(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    settings = backend_settings(redis_url, kafka_bootstrap, kafka_topic_prefix, "beat")
    async with open_backends(settings) as (services, _):
        assert services.cluster is not None and isinstance(services.state, RedisStateStore)
        membership = services.cluster.membership
        await membership.join(Member("beat", "127.0.0.1:1"))
        client = services.state.client  # the stores' pool
        busy = [
            asyncio.create_task(client.blpop([f"weir:test:busy:{i}"], timeout=BUSY_S))
            for i in range(POOL_CONNECTIONS)
        ]
        try:
            await blocked(redis_url, POOL_CONNECTIONS)
            began = time.monotonic()
            await asyncio.wait_for(membership.beat(), BEAT_BOUND_S)
            assert time.monotonic() - began < BEAT_BOUND_S
        finally:
            await asyncio.gather(*busy, return_exceptions=True)
            await membership.leave()
