"""Users kept in Redis (EMQX's Redis authentication source), argon2id as in the file.

Theory of operation. A user is one hash, `weir:user:<user name>`, whose
field `password_hash` holds the same argon2id PHC string as a password file
line (`weir passwd --redis URL USER` writes it; plain text is never
stored). `RedisUsers.check` is a backend of the authentication chain:
- no user name, or no such hash: "ignore" (not this backend's user);
- a hash without an argon2 `password_hash`: refused 0x86;
- Redis not answering within `FETCH_TIMEOUT_S`: refused 0x88 server
  unavailable (3.1.1: 3); the client may retry, and a user is never let
  in, nor told its password is wrong, on a guess (the refusal's decision
  says why, for the chain's log line);
- otherwise the password is verified as the file's are (`services.auth.argon`:
  worker threads, a digest cache). The stored hash is
  part of the cache key and is read on every CONNECT (one HGET), so a
  changed or deleted user applies from the next CONNECT.
"""

from __future__ import annotations

from typing import Final

import redis
import redis.asyncio as aioredis

from services.auth.api import ClientInfo, Decision
from services.auth.argon import BAD_USER_OR_PASSWORD, CACHE_TTL_S, HASHER, check_hash
from services.auth.cache import CredentialCache, Verdict
from services.store.errors import StoreUnavailable
from services.store.redis import bounded

KEY_PREFIX: Final = "weir:user:"
FIELD: Final = "password_hash"
FETCH_TIMEOUT_S: Final = 1.0  # a CONNECT waits this long at most for its user's hash
UNAVAILABLE: Final = 0x88  # server unavailable


class RedisUsers:
    name = "redis users"

    def __init__(self, client: aioredis.Redis, prefix: str = KEY_PREFIX) -> None:
        self.client = client
        self.prefix = prefix
        self.cache = CredentialCache(CACHE_TTL_S)

    async def check(self, client: ClientInfo, password: bytes | None) -> Verdict:
        user = client.username
        if user is None:
            return None
        key = self.prefix + user
        try:
            raw = await bounded(self.client.hget(key, FIELD), FETCH_TIMEOUT_S)
        except StoreUnavailable as exc:
            return Decision(False, UNAVAILABLE, f"{self.name}: {key} not read ({exc})")
        if raw is None:
            return None
        hashed = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        if not hashed.startswith("$argon2"):
            return Decision(False, BAD_USER_OR_PASSWORD.reason_code,
                            f"{self.name}: {key} {FIELD} is not an argon2 hash")  # fmt: skip
        return await check_hash(self.cache, user, hashed, password)


def set_user(url: str, user: str, password: str | None, prefix: str = KEY_PREFIX) -> None:
    """Add or change `user` in the Redis at `url` (None: delete it). Raises
    redis.RedisError when Redis cannot be reached."""
    with redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5) as client:
        if password is None:
            client.delete(prefix + user)
        else:
            client.hset(prefix + user, FIELD, HASHER.hash(password))
