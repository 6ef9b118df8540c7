"""The node's key for local tools (`weir ctl`): made at start, revoked at a clean stop.

The file's side (where, mode 0600, read by `weir ctl`) is
`services.embedded.localkey`; this stores the key like any other API key
(hashed, in Redis or the data dir), so the API checks it as it checks every
key and `GET /api_key` lists it.
"""

from __future__ import annotations

import contextlib
import secrets
import time

from services.api.apikeys import SECRET_BYTES
from services.api.keys import ApiKey, KeyStore, hash_secret
from services.embedded import localkey
from services.store.errors import StoreUnavailable


async def make(store: KeyStore, data_dir: str, node_id: str) -> str | None:
    """Store a new local key and write its file; the key's name, or None when
    the data dir cannot be written (local tools then need --api-key)."""
    key, secret = localkey.key_name(node_id), secrets.token_urlsafe(SECRET_BYTES)
    await store.put(ApiKey(key, await hash_secret(secret), name=key, created_at=time.time(),
                           desc="for local tools (weir ctl): <data-dir>/api.key"))  # fmt: skip
    try:
        localkey.write(data_dir, key, secret)
    except OSError:
        await store.delete(key)
        return None
    return key


async def forget(store: KeyStore, data_dir: str, key: str) -> None:
    """Revoke the key and remove its file (a Redis gone by now keeps the key; the
    next start replaces its secret)."""
    localkey.remove(data_dir, key)
    with contextlib.suppress(StoreUnavailable, OSError):
        await store.delete(key)
