"""Membership: a heartbeat record per node with a TTL, in memory or in Redis.

Theory of operation. `join` writes `weir:node:<id>` = address with a TTL;
`beat` rewrites it with a fresh TTL. A node is alive while its record is;
`leave` deletes it. `poll` lists the live records and diffs them against
the previous poll (`Roster`), so every node learns joins and deaths on its
own, without any node deciding for the others. Death is detected within
ttl + one poll interval; a node that comes back under the same id with
another address is reported as joined again.

`watch` is the loop a node runs: beat, poll, report, every ttl / 3.

On Redis Cluster the records sit in many hash slots: SCAN goes to every
primary (redis-py's cluster `scan_iter`) and the MGET is one per slot.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import cast

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from services.cluster.api import (
    DEFAULT_TTL_S,
    HEARTBEAT_FRACTION,
    Member,
    Membership,
    MembershipChange,
    MembershipUnavailable,
)
from services.config.redisurl import connect_sync
from services.store.redis import connect, is_cluster

log = logging.getLogger("weir.cluster")

KEY_PREFIX = "weir:node:"
CALL_TIMEOUT_S = 3.0  # per Redis call; well under a TTL, so a slow answer is no death
SCAN_COUNT = 500  # keys per SCAN step; clusters here are a handful of nodes


class Roster:
    """The diff between successive views of the live nodes."""

    def __init__(self, self_id: str) -> None:
        self._self_id = self_id
        self._known: dict[str, Member] = {}

    def update(self, live: dict[str, Member]) -> MembershipChange:
        live = {k: v for k, v in live.items() if k != self._self_id}
        joined = tuple(m for k, m in sorted(live.items()) if self._known.get(k) != m)
        died = tuple(sorted(k for k in self._known if k not in live))
        self._known = live
        return MembershipChange(joined, died)

    @property
    def known(self) -> dict[str, Member]:
        return dict(self._known)


class MemoryMembershipHub:
    """The shared table that memory members of one process see; `clock` is
    injectable so tests can let records lapse without waiting."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.records: dict[str, tuple[Member, float]] = {}

    def live(self) -> dict[str, Member]:
        now = self.clock()
        return {k: m for k, (m, until) in self.records.items() if until > now}


class _Base:
    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self.member: Member | None = None
        self._roster: Roster | None = None

    async def live_nodes(self) -> dict[str, Member]:
        raise NotImplementedError

    async def poll(self) -> MembershipChange:
        if self._roster is None:
            self._roster = Roster(self.member.node_id if self.member else "")
        return self._roster.update(await self.live_nodes())


class MemoryMembership(_Base):
    def __init__(self, hub: MemoryMembershipHub, ttl_s: float = DEFAULT_TTL_S) -> None:
        super().__init__(ttl_s)
        self._hub = hub

    async def join(self, member: Member) -> None:
        self.member = member
        await self.beat()

    async def beat(self) -> None:
        self.beat_blocking()

    def beat_blocking(self) -> None:
        if self.member is not None:
            self._hub.records[self.member.node_id] = (self.member, self._hub.clock() + self.ttl_s)

    async def leave(self) -> None:
        if self.member is not None:
            self._hub.records.pop(self.member.node_id, None)

    async def live_nodes(self) -> dict[str, Member]:
        return self._hub.live()

    async def close(self) -> None:
        pass


class RedisMembership(_Base):
    def __init__(
        self, client: aioredis.Redis, ttl_s: float = DEFAULT_TTL_S, prefix: str = KEY_PREFIX,
        url: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(ttl_s)
        self._client = client
        self._prefix = prefix
        self._cluster = is_cluster(client)
        self._url = url  # for beat_blocking's client: None, no heartbeat thread
        self._blocking: redis.Redis | None = None  # made in the heartbeat thread

    @classmethod
    def from_url(cls, url: str, ttl_s: float = DEFAULT_TTL_S) -> RedisMembership:
        return cls(connect(url, CALL_TIMEOUT_S), ttl_s, url=url)

    def _key(self) -> str:
        assert self.member is not None, "join first"
        return self._prefix + self.member.node_id

    async def join(self, member: Member) -> None:
        self.member = member
        await self.beat()

    @property
    def _ttl_ms(self) -> int:
        return max(1, int(self.ttl_s * 1000))

    async def beat(self) -> None:
        if self.member is None:
            return
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                await self._client.set(self._key(), self.member.address.encode(), px=self._ttl_ms)
        except (RedisError, OSError, TimeoutError) as exc:
            raise MembershipUnavailable(f"heartbeat failed: {exc!r}") from exc

    def beat_blocking(self) -> None:
        if self.member is None:
            return
        if self._url is None:
            raise MembershipUnavailable("heartbeat failed: a membership made without a URL")
        try:
            if self._blocking is None:
                self._blocking = connect_sync(self._url, CALL_TIMEOUT_S)
            self._blocking.set(self._key(), self.member.address.encode(), px=self._ttl_ms)
        except (RedisError, OSError) as exc:
            raise MembershipUnavailable(f"heartbeat failed: {exc!r}") from exc

    async def leave(self) -> None:
        if self.member is None:
            return
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                await self._client.delete(self._key())
        except (RedisError, OSError, TimeoutError) as exc:
            raise MembershipUnavailable(f"leave failed: {exc!r}") from exc

    async def live_nodes(self) -> dict[str, Member]:
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                keys = [k async for k in self._client.scan_iter(self._prefix + "*", SCAN_COUNT)]
                values = await self._values(keys) if keys else []
        except (RedisError, OSError, TimeoutError) as exc:
            raise MembershipUnavailable(f"listing nodes failed: {exc!r}") from exc
        cut = len(self._prefix)
        out: dict[str, Member] = {}
        for key, value in zip(keys, values, strict=True):
            if value is not None:  # lapsed between SCAN and MGET
                node_id = _text(key)[cut:]
                out[node_id] = Member(node_id, _text(value))
        return out

    async def _values(self, keys: list[bytes]) -> list[bytes | str | None]:
        if self._cluster:  # the records sit in many slots: one MGET per slot
            return await cast(RedisCluster, self._client).mget_nonatomic(keys)
        return await self._client.mget(keys)

    async def close(self) -> None:
        await self._client.aclose()
        if self._blocking is not None:  # the heartbeat thread has stopped (the router's stop)
            self._blocking.close()
            self._blocking = None


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


ChangeHook = Callable[[MembershipChange], None]


async def watch(membership: Membership, on_change: ChangeHook, interval_s: float) -> None:
    """Beat and poll every interval_s until cancelled, reporting each change.
    A store that does not answer is logged and retried on the next turn
    (peers keep the links they have meanwhile)."""
    while True:
        try:
            await membership.beat()
            change = await membership.poll()
        except MembershipUnavailable as exc:
            log.warning("membership: %s", exc)
        else:
            if change:
                on_change(change)
        await asyncio.sleep(interval_s)


def beat_interval(ttl_s: float) -> float:
    return ttl_s / HEARTBEAT_FRACTION


__all__ = [
    "MemoryMembership",
    "MemoryMembershipHub",
    "RedisMembership",
    "Roster",
    "beat_interval",
    "watch",
]
