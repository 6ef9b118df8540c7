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
A field `scram_sha_256` holds the user's SCRAM-SHA-256 credentials in the
password file's form (`services.auth.scram`; `weir passwd --redis URL USER
--scram` writes both fields from one password): `scram_credentials` reads
it for MQTT 5 enhanced authentication, one HGET per exchange, with the same
timeout and 0x88 when Redis does not answer.
"""

from __future__ import annotations

from typing import Final

import redis.asyncio as aioredis

from services.auth.api import ClientInfo, Decision
from services.auth.argon import BAD_USER_OR_PASSWORD, CACHE_TTL_S, HASHER, check_hash
from services.auth.cache import CredentialCache, Verdict
from services.auth.scram import ScramCredentials, ScramError
from services.config.redisurl import connect_sync
from services.store.errors import StoreUnavailable
from services.store.redis import bounded

KEY_PREFIX: Final = "weir:user:"
FIELD: Final = "password_hash"
SCRAM_FIELD: Final = "scram_sha_256"
FETCH_TIMEOUT_S: Final = 1.0  # a CONNECT waits this long at most for its user's hash
UNAVAILABLE: Final = 0x88  # server unavailable


class RedisUsers:
    name = "redis users"

    def __init__(self, client: aioredis.Redis, prefix: str = KEY_PREFIX) -> None:
        self.client = client
        self.prefix = prefix
        self.cache = CredentialCache(CACHE_TTL_S)

    async def _field(self, key: str, field: str) -> str | Decision | None:
        """One field of a user's hash (None: not there), or the refusal 0x88."""
        try:
            raw = await bounded(self.client.hget(key, field), FETCH_TIMEOUT_S)
        except StoreUnavailable as exc:
            return Decision(False, UNAVAILABLE, f"{self.name}: {key} not read ({exc})")
        if raw is None:
            return None
        return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)

    async def check(self, client: ClientInfo, password: bytes | None) -> Verdict:
        user = client.username
        if user is None:
            return None
        key = self.prefix + user
        hashed = await self._field(key, FIELD)
        if hashed is None or isinstance(hashed, Decision):
            return hashed
        if not hashed.startswith("$argon2"):
            return Decision(False, BAD_USER_OR_PASSWORD.reason_code,
                            f"{self.name}: {key} {FIELD} is not an argon2 hash")  # fmt: skip
        return await check_hash(self.cache, user, hashed, password)

    async def scram_credentials(self, user: str) -> ScramCredentials | Decision | None:
        key = self.prefix + user
        text = await self._field(key, SCRAM_FIELD)
        if text is None or isinstance(text, Decision):
            return text
        try:
            return ScramCredentials.decode(text)
        except ScramError as exc:
            return Decision(False, BAD_USER_OR_PASSWORD.reason_code,
                            f"{self.name}: {key} {SCRAM_FIELD}: {exc}")  # fmt: skip


def set_user(
    url: str, user: str, password: str | None, scram: bool = False, prefix: str = KEY_PREFIX
) -> None:
    """Add or change `user` in the Redis at `url` (None: delete it; `scram`: with
    SCRAM-SHA-256 credentials, else without). Raises redis.RedisError when
    Redis cannot be reached."""
    with connect_sync(url, 5.0) as client:  # one Redis or a cluster
        if password is None:
            client.delete(prefix + user)
            return
        fields = {FIELD: HASHER.hash(password)}
        if scram:
            fields[SCRAM_FIELD] = ScramCredentials.from_password(password).encode()
        client.hset(prefix + user, mapping=fields)
        if not scram:
            client.hdel(prefix + user, SCRAM_FIELD)
