"""Remembered answers of the slow authentication backends.

Theory of operation. argon2id takes about 80 ms of CPU a verify on purpose,
and a webhook a network round trip; a fleet reconnecting after an outage
must not pay that per device and attempt. `CredentialCache.answer(key, ask)`:
- `key` is a SHA-256 digest of everything the answer depends on (user name,
  the stored hash or the client id, the password, ...; `digest`), so the
  credentials themselves are never kept, and a changed password (a new
  stored hash, or new credentials) never matches an old entry;
- an allow answer is remembered for `ttl_s`; refusals and "ignore" never
  are (a wrong password costs its verify every time, which slows guessing);
- concurrent attempts with the same key share one `ask` (single flight): a
  burst of identical CONNECTs costs one verify, and a client that goes away
  mid-verify does not cancel it for the others.
Past `entries` remembered answers the cache starts over (bounded memory:
about 100 bytes an entry).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import Final

from services.auth.api import ALLOW, Decision

CACHE_ENTRIES: Final = 100_000  # about 10 MiB at most

Verdict = Decision | None  # a backend's answer: allow, deny (reason code) or None: ignore


def digest(*parts: str | bytes) -> bytes:
    """SHA-256 over length-prefixed parts (no two part lists give the same input)."""
    h = hashlib.sha256()
    for part in parts:
        raw = part.encode() if isinstance(part, str) else part
        h.update(len(raw).to_bytes(4, "big"))
        h.update(raw)
    return h.digest()


class CredentialCache:
    def __init__(self, ttl_s: float, entries: int = CACHE_ENTRIES) -> None:
        self.ttl_s = ttl_s
        self.entries = entries
        self._until: dict[bytes, float] = {}
        self._pending: dict[bytes, asyncio.Future[Verdict]] = {}

    async def answer(self, key: bytes, ask: Callable[[], Awaitable[Verdict]]) -> Verdict:
        if self._until.get(key, 0.0) > time.monotonic():
            return ALLOW
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = asyncio.ensure_future(self._ask(key, ask))
        return await asyncio.shield(pending)

    async def _ask(self, key: bytes, ask: Callable[[], Awaitable[Verdict]]) -> Verdict:
        try:
            verdict = await ask()
        finally:
            del self._pending[key]
        if verdict is not None and verdict.ok and self.ttl_s > 0:
            if len(self._until) >= self.entries:
                self._until.clear()
            self._until[key] = time.monotonic() + self.ttl_s
        return verdict

    def clear(self) -> None:
        self._until.clear()

    def __len__(self) -> int:
        return len(self._until)
