"""Session ownership in Redis: one Lua script per atomic step.

Keys of one client share the hash tag `{c:<client id>}` so every script
touches a single slot (valid on Redis Cluster); `client_keys` lists them in
the order every script expects. Every call is bounded by `timeout` seconds
and any failure to get an answer (connection refused, reset, timeout, Redis
loading) becomes `StoreUnavailable`; redis-py reconnects on the next call,
so the store recovers by itself when Redis returns. Scripts are registered
once; redis-py re-loads them when Redis answers NOSCRIPT (after a restart).

Expiry: `release` PEXPIREs every key of the client; `claim` PERSISTs them.

No automatic resend: redis-py's retry is off, because resending a script
whose answer was lost (timeout, reset) could run it twice (an enqueue twice
is a duplicate delivery). Such a call raises StoreUnavailable and its outcome
is unknown; the caller decides. Dead pooled connections (after a Redis
restart) are still replaced transparently when they are checked out.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Sequence
from importlib import resources
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from services.session.api import Claim, Fenced, SessionInfo, StoreUnavailable

POOL_CONNECTIONS = 64  # concurrent calls per process; more only queue on one Redis thread
DEFAULT_TIMEOUT_S = 2.0  # per call; a healthy local Redis answers in well under 1 ms
NEVER_EXPIRES = 0xFFFFFFFF  # MQTT 5 session expiry interval meaning "never"
TOPIC_VERSION_TTL_MS = 86_400_000  # versions are clocks, so the key may be forgotten
FENCED = -1

T = TypeVar("T")

_POOL_OPTIONS: dict[str, Any] = {}
try:  # redis-py >= 7: "auto" maintenance notifications skip the pool's dead-connection check
    from redis.maint_notifications import MaintNotificationsConfig

    _POOL_OPTIONS["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
except ImportError:  # pragma: no cover - older redis-py has no such mode
    pass

# s session hash; q queue hash; o queue order; z QoS 0 seqs; f inflight hash;
# fo inflight order; x released ids; r incoming QoS 2 ids
KEY_SUFFIXES = ("s", "q", "o", "z", "f", "fo", "x", "r")


@functools.lru_cache(maxsize=8192)  # about 4 MB at most
def client_keys(client_id: str) -> tuple[bytes, ...]:
    tag = ("{c:" + client_id + "}:").encode()
    return tuple(tag + suffix.encode() for suffix in KEY_SUFFIXES)


def connect(url: str, timeout: float = DEFAULT_TIMEOUT_S) -> aioredis.Redis:
    """A client whose pool makes a call wait for a free connection (bounded by
    `timeout`) instead of failing: redis-py's default pool raises at once past
    its limit, which a burst of persistent sessions reaches."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=POOL_CONNECTIONS,
        timeout=timeout,
        socket_timeout=None,  # calls are bounded by `bounded`; socket timeouts cost 2 tasks a call
        socket_connect_timeout=timeout,
        health_check_interval=0,
        retry=Retry(NoBackoff(), 0),  # never resend a script whose answer was lost
        **_POOL_OPTIONS,
    )
    return aioredis.Redis(connection_pool=pool, decode_responses=False, **_POOL_OPTIONS)


def load_script(client: aioredis.Redis, package: str, name: str) -> AsyncScript:
    source = resources.files(package).joinpath("scripts", name).read_text()
    return client.register_script(source)


async def bounded(call: Awaitable[T], limit_s: float) -> T:
    """Await one Redis call; any failure to answer becomes StoreUnavailable."""
    try:
        async with asyncio.timeout(limit_s):  # no task per call, unlike wait_for
            return await call
    except (RedisError, OSError, TimeoutError) as exc:
        raise StoreUnavailable(f"redis did not answer: {type(exc).__name__}: {exc}") from exc


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

    async def close(self) -> None:
        await self._client.aclose()
