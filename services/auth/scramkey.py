"""The secret behind the made-up salts of unknown SCRAM users, one per cluster.

Theory of operation. RFC 5802 5.1: a server should answer an unknown user
with a salt that looks real and stays the same, so that the first step does
not tell who exists. `services.auth.scram` makes it an HMAC of a secret and
the user name. If each process had its own secret (as before), a client
could ask twice through two workers, two nodes or across a restart: an
unknown user's salt would change, a real one's would not. So the secret is
shared by everything that answers for the same users:

- `RedisSecret`: with a Redis (the nodes of a cluster share it), the key
  `weir:scram:mock-key`, made once by whichever process asks first
  (SET NX, then GET: every process reads the same bytes), kept forever;
- `FileSecret`: with the memory backend (one node), a file in its data
  directory, made once (mode 0600, linked into place whole) and read by
  every worker.

Each reads it once and keeps it. While it cannot be read (Redis down) the
first step is refused 0x88 server unavailable, for known and unknown users
alike, rather than answered with a salt that would give the user away.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Final, Protocol

import redis.asyncio as aioredis

from services.store.errors import StoreUnavailable
from services.store.redis import DEFAULT_TIMEOUT_S, bounded

SECRET_BYTES: Final = 32
REDIS_KEY: Final = "weir:scram:mock-key"
FILE_NAME: Final = "scram-mock-key"


class MockSecret(Protocol):
    async def secret(self) -> bytes | None:
        """The cluster's secret; None if it cannot be read now. Never raises."""
        ...


class ProcessSecret:
    """A secret of this process only (tests; a lone process with no data dir)."""

    def __init__(self) -> None:
        self._secret = secrets.token_bytes(SECRET_BYTES)

    async def secret(self) -> bytes | None:
        return self._secret


class RedisSecret:
    def __init__(self, client: aioredis.Redis, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self._client = client
        self._timeout = timeout
        self._secret: bytes | None = None

    async def secret(self) -> bytes | None:
        if self._secret is None:
            try:
                made = secrets.token_bytes(SECRET_BYTES)
                await bounded(self._client.set(REDIS_KEY, made, nx=True), self._timeout)
                raw = await bounded(self._client.get(REDIS_KEY), self._timeout)
            except StoreUnavailable:
                return None
            if isinstance(raw, bytes) and len(raw) == SECRET_BYTES:
                self._secret = raw
        return self._secret


class FileSecret:
    def __init__(self, directory: str | Path) -> None:
        self._path = Path(directory) / FILE_NAME
        self._secret: bytes | None = None

    async def secret(self) -> bytes | None:
        if self._secret is None:
            try:
                self._secret = self._read_or_make()
            except OSError:
                return None
        return self._secret

    def _read_or_make(self) -> bytes | None:
        """Written whole under another name, then linked into place (link never
        replaces a file): a worker racing this one reads a whole secret, the first."""
        if not self._path.exists():
            self._path.parent.mkdir(parents=True, exist_ok=True)
            made = self._path.with_name(f"{FILE_NAME}.{os.getpid()}.{secrets.token_hex(4)}")
            fd = os.open(made, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, secrets.token_bytes(SECRET_BYTES))
            finally:
                os.close(fd)
            try:
                os.link(made, self._path)
            except FileExistsError:
                pass
            finally:
                made.unlink()
        raw = self._path.read_bytes()
        return raw if len(raw) == SECRET_BYTES else None
