"""Session ownership in Redis: one Lua script per atomic step.

The client's keys, bounded calls and scripts come from `services.store.redis`
(shared with the queue store): every call is bounded by `timeout` seconds
and a failure to answer becomes `StoreUnavailable`.

Expiry: `release` PEXPIREs every key of the client; `claim` PERSISTs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from services.session.api import Claim, Fenced, SessionInfo
from services.store.redis import (
    DEFAULT_TIMEOUT_S,
    FENCED,
    KEY_SUFFIXES,
    bounded,
    client_keys,
    connect,
    load_script,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "KEY_SUFFIXES",
    "RedisSessionStore",
    "bounded",
    "client_keys",
    "connect",
]

NEVER_EXPIRES = 0xFFFFFFFF  # MQTT 5 session expiry interval meaning "never"
TOPIC_VERSION_TTL_MS = 86_400_000  # versions are clocks, so the key may be forgotten


class RedisSessionStore:
    def __init__(self, client: aioredis.Redis, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self._client = client
        self._timeout = timeout
        self._claim = load_script(client, "services.session", "claim.lua")
        self._release = load_script(client, "services.session", "release.lua")
        self._version = load_script(client, "services.session", "version.lua")
        self._topic_version = load_script(client, "services.session", "topic_version.lua")

    @classmethod
    def from_url(cls, url: str, timeout: float = DEFAULT_TIMEOUT_S) -> RedisSessionStore:
        return cls(connect(url, timeout), timeout)

    async def _run(self, script: AsyncScript, keys: Sequence[bytes], args: list[Any]) -> Any:
        return await bounded(script(keys=keys, args=args), self._timeout)

    async def claim(self, client_id: str, node: str, clean_start: bool, expiry_s: int) -> Claim:
        epoch, present, previous = await self._run(
            self._claim, client_keys(client_id), [node, int(clean_start), expiry_s]
        )
        return Claim(client_id, int(epoch), bool(present), previous.decode() if previous else None)

    async def release(self, client_id: str, epoch: int, expiry_s: int) -> None:
        args = [epoch, max(expiry_s, 0), NEVER_EXPIRES]
        if await self._run(self._release, client_keys(client_id), args) == FENCED:
            raise Fenced(client_id)

    async def next_version(self, client_id: str, epoch: int) -> int:
        version = await self._run(self._version, client_keys(client_id)[:1], [epoch])
        if version == FENCED:
            raise Fenced(client_id)
        return int(version)

    async def next_topic_version(self, topic: str) -> int:
        key = ("{t:" + topic + "}:v").encode()
        return int(await self._run(self._topic_version, [key], [TOPIC_VERSION_TTL_MS]))

    async def get(self, client_id: str) -> SessionInfo | None:
        call = self._client.hmget(client_keys(client_id)[0], ["epoch", "node", "online", "expiry"])
        epoch, node, online, expiry = await bounded(call, self._timeout)
        if epoch is None:
            return None
        is_online = online == b"1"
        owner = node.decode() if isinstance(node, bytes) and is_online else None
        return SessionInfo(client_id, owner, int(epoch), int(expiry or 0), is_online)

    def mark_durable(self, client_id: str) -> None:
        return None  # one tier: nothing to choose

    async def close(self) -> None:
        await self._client.aclose()
