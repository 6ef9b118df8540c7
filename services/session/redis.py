"""Session ownership in Redis: one Lua script per atomic step.

The client's keys, bounded calls and scripts come from `services.store.redis`
(shared with the queue store): every call is bounded by `timeout` seconds
and a failure to answer becomes `StoreUnavailable`.

Expiry: `release` PEXPIREs every key of the client; `claim` PERSISTs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from services.session.api import Adopted, Claim, Fenced, SessionInfo, StoredWill
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
    "RedisWillStore",
    "bounded",
    "client_keys",
    "connect",
]

NEVER_EXPIRES = 0xFFFFFFFF  # MQTT 5 session expiry interval meaning "never"
TOPIC_VERSION_TTL_MS = 86_400_000  # versions are clocks, so the key may be forgotten
SCAN_COUNT = 2000  # keys per SCAN step of an orphan search (node death: rare, so a scan)


class _ScriptStore:
    """A store of Lua scripts on one client, each call bounded by `timeout`."""

    def __init__(self, client: aioredis.Redis, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self._client = client
        self._timeout = timeout

    @classmethod
    def from_url(cls, url: str, timeout: float = DEFAULT_TIMEOUT_S) -> Self:
        return cls(connect(url, timeout), timeout)

    async def _run(self, script: AsyncScript, keys: Sequence[bytes], args: list[Any]) -> Any:
        return await bounded(script(keys=keys, args=args), self._timeout)

    async def close(self) -> None:
        await self._client.aclose()


class RedisSessionStore(_ScriptStore):
    def __init__(self, client: aioredis.Redis, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(client, timeout)
        self._claim = load_script(client, "services.session", "claim.lua")
        self._release = load_script(client, "services.session", "release.lua")
        self._version = load_script(client, "services.session", "version.lua")
        self._topic_version = load_script(client, "services.session", "topic_version.lua")
        self._adopt = load_script(client, "services.session", "adopt.lua")

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

    async def orphans(self, node: str) -> list[str]:
        fields = await _scan(self._client, b"{c:*}:s", ("node", "online"), self._timeout)
        return [cid for cid, (owner, online) in fields if owner == node.encode() and online == b"1"]

    async def adopt(self, client_id: str, dead: str) -> Adopted | None:
        keys = client_keys(client_id)
        got = await self._run(self._adopt, keys, [dead, NEVER_EXPIRES])
        if not got:
            return None
        epoch, version, expiry = got
        return Adopted(client_id, int(epoch), int(version), int(expiry))

    def mark_durable(self, client_id: str) -> None:
        return None  # one tier: nothing to choose


async def _scan(
    client: aioredis.Redis, pattern: bytes, fields: tuple[str, ...], limit_s: float
) -> list[tuple[str, list[Any]]]:
    """(client id, the hash fields) for every `{c:<id>}:<suffix>` key matching pattern."""
    out: list[tuple[str, list[Any]]] = []
    cursor = 0
    while True:
        cursor, keys = await bounded(client.scan(cursor, match=pattern, count=SCAN_COUNT), limit_s)
        if keys:
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.hmget(key, list(fields))
            values = await bounded(pipe.execute(), limit_s)
            for key, got in zip(keys, values, strict=True):
                raw = key if isinstance(key, bytes) else key.encode()
                out.append((raw[3 : raw.rindex(b"}")].decode(), got))
        if cursor == 0:
            return out


class RedisWillStore(_ScriptStore):
    """Wills in Redis: one hash `{c:<id>}:w` per client, changed only by Lua."""

    def __init__(self, client: aioredis.Redis, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(client, timeout)
        self._put = load_script(client, "services.session", "will_put.lua")
        self._arm = load_script(client, "services.session", "will_arm.lua")
        self._take = load_script(client, "services.session", "will_take.lua")
        self._adopt = load_script(client, "services.session", "will_adopt.lua")

    @staticmethod
    def _key(client_id: str) -> list[bytes]:
        return [("{c:" + client_id + "}:w").encode()]

    async def put(
        self,
        client_id: str,
        node: str,
        token: str,
        message: bytes | None,
        delay_s: int,
        username: str | None = None,
        peer: str = "",
    ) -> StoredWill | None:
        named = username is not None
        args = [node, token, message or b"", delay_s, int(named), username or "", peer]
        old = await self._run(self._put, self._key(client_id), args)
        if not old:
            return None
        blob, delay, owner, due, user, at = old
        return StoredWill(
            blob, int(delay or 0), (owner or b"").decode(), int(due or 0), _text(user),
            (at or b"").decode(),
        )  # fmt: skip

    async def arm(self, client_id: str, token: str, due_ms: int) -> bool:
        return bool(await self._run(self._arm, self._key(client_id), [token, due_ms]))

    async def take(self, client_id: str, token: str) -> bytes | None:
        got = await self._run(self._take, self._key(client_id), [token])
        return bytes(got) if got else None

    async def orphans(self, node: str) -> list[str]:
        fields = await _scan(self._client, b"{c:*}:w", ("n",), self._timeout)
        return [cid for cid, (owner,) in fields if owner == node.encode()]

    async def adopt(
        self, client_id: str, dead: str, node: str, token: str, now_ms: int
    ) -> StoredWill | None:
        got = await self._run(self._adopt, self._key(client_id), [dead, node, token, now_ms])
        if not got:
            return None
        blob, delay, due, user, at = got
        return StoredWill(
            bytes(blob), int(delay or 0), node, int(due), _text(user), (at or b"").decode()
        )


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode()
