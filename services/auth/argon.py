"""argon2id hashes: making them, and checking a password against one off the loop.

Theory of operation. Hashes are argon2-cffi's defaults (argon2id, 64 MiB,
3 passes) in the PHC string format, the same in the password file and in
Redis. A verify takes about 80 ms of CPU on purpose, so it runs in a pool
of `VERIFY_THREADS` threads, never on the event loop; the pool also bounds
the memory verifies hold (64 MiB each) whatever the CONNECT rate. Past
`MAX_PENDING` verifies waiting or running, a CONNECT is refused at once with
0x89 server busy (3.1.1: 3) instead of queueing behind them: a flood of
made-up passwords (each costing a verify) cannot delay everyone else's
CONNECTs without bound. A verified
(user, stored hash, password) digest is remembered for `CACHE_TTL_S`
(`services.auth.cache`: only allows, single flight), so a fleet's reconnect
storm costs one verify per distinct credential, and a changed password (a
new stored hash) never matches an old entry.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from services.auth.api import ALLOW, Decision
from services.auth.cache import CredentialCache, Verdict, digest

BAD_USER_OR_PASSWORD: Final = Decision(False, 0x86)
CACHE_TTL_S: Final = 300.0  # a verified (user, password) pair skips argon2 for this long
VERIFY_THREADS: Final = 2  # argon2 verifies at once: the cores here
MAX_PENDING = 256  # verifies queued or running (about 10 s of work); past it 0x89
SERVER_BUSY: Final = Decision(False, 0x89, "argon2: too many verifies pending")
_pending = 0
HASHER: Final = PasswordHasher()
_VERIFIERS: Final = ThreadPoolExecutor(VERIFY_THREADS, thread_name_prefix="weir-argon2")


def _verify_now(hashed: str, password: bytes) -> bool:
    try:
        return HASHER.verify(hashed, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


async def verify(hashed: str, password: bytes) -> Decision:
    """ALLOW if `password` matches the argon2 `hashed`, else 0x86; in the verify
    pool, or 0x89 at once when `MAX_PENDING` verifies are already waiting."""
    global _pending
    if _pending >= MAX_PENDING:
        return SERVER_BUSY
    _pending += 1
    try:
        loop = asyncio.get_running_loop()
        ok = await loop.run_in_executor(_VERIFIERS, _verify_now, hashed, password)
    finally:
        _pending -= 1
    return ALLOW if ok else BAD_USER_OR_PASSWORD


async def check_hash(
    cache: CredentialCache, user: str, hashed: str, password: bytes | None
) -> Verdict:
    """A known user's answer: 0x86 without a password, else the (cached) verify."""
    if password is None:
        return BAD_USER_OR_PASSWORD
    return await cache.answer(digest(user, hashed, password), lambda: verify(hashed, password))
