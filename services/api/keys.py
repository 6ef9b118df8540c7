"""API keys: who may call the API, stored hashed, checked on every request.

Theory of operation. A key is a public name (`api_key`) and a secret the
caller sends with it: `Authorization: Basic <key>:<secret>` (as the issue
asks) or the standard Basic form, base64 of the same (as EMQX and curl's
`-u key:secret` send it). Only an argon2id hash of the secret is stored:
in Redis (hash `weir:apikey:<key>`, set `weir:apikeys`), shared by every
node of a cluster, or on `--backend memory` in `<data-dir>/apikeys.json`.
Each request reads its key's record, so a revoked (deleted) or disabled
key is refused at once on every node. A verified (key, stored hash,
secret) digest is remembered for `CACHE_TTL_S` (`services.auth.cache`), so
a dashboard polling every second costs one argon2 verify, not one a
second; a new secret (a new stored hash) never matches an old entry.

The first keys come from `--api-key-file FILE`: `key:secret` lines (EMQX's
bootstrap file; its third field, the role, may be `administrator`, the only
role here). Each is stored at start unless the stored one already has that
secret; so a key revoked through the API comes back at the next start while
its line stays in the file.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import redis.asyncio as aioredis
from aiohttp import web

from services.api.errors import BadRequest, Unauthorized, Unavailable
from services.auth.argon import CACHE_TTL_S, HASHER, verify
from services.auth.cache import CredentialCache, digest
from services.config import SettingsError
from services.metrics.registry import Metrics
from services.store.errors import StoreUnavailable
from services.store.redis import DEFAULT_TIMEOUT_S, bounded, is_cluster

KEY_PREFIX: Final = "weir:apikey:"
KEY_SET: Final = "weir:apikeys"
FILE_NAME: Final = "apikeys.json"
KEY_RE: Final = re.compile(r"[A-Za-z0-9_.-]{1,128}")
ROLES: Final = ("administrator",)  # EMQX's bootstrap file's third field; one role here


@dataclass(frozen=True, slots=True)
class ApiKey:
    api_key: str
    secret_hash: str  # argon2id PHC string
    name: str = ""
    desc: str = ""
    enable: bool = True
    created_at: float = 0.0  # unix seconds

    def public(self) -> dict[str, Any]:
        """What the API shows of a key: never the hash."""
        return {"api_key": self.api_key, "name": self.name or self.api_key, "desc": self.desc,
                "enable": self.enable, "created_at": _iso(self.created_at)}  # fmt: skip


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def check_key_name(key: str) -> str:
    if not KEY_RE.fullmatch(key):
        raise ValueError(f"API key {key!r}: use 1-128 of A-Z a-z 0-9 _ . -")
    return key


def read_key_file(path: str) -> list[tuple[str, str]]:
    """The (key, secret) pairs of a bootstrap file; SettingsError (one line) if unreadable."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SettingsError(f"--api-key-file {path}: {exc.strerror or exc}") from None
    pairs = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split(":")
        where = f"--api-key-file {path} line {number}"
        if len(fields) not in (2, 3) or not fields[1]:
            raise SettingsError(f"{where}: expected key:secret")
        if len(fields) == 3 and fields[2] not in ROLES:
            raise SettingsError(f"{where}: unknown role {fields[2]!r} (known: administrator)")
        try:
            check_key_name(fields[0])
        except ValueError as exc:
            raise SettingsError(f"{where}: {exc}") from None
        pairs.append((fields[0], fields[1]))
    return pairs


async def hash_secret(secret: str) -> str:
    """argon2id of `secret`, off the loop (about 80 ms of CPU)."""
    return await asyncio.to_thread(HASHER.hash, secret)


class KeyStore(Protocol):
    async def get(self, api_key: str) -> ApiKey | None: ...

    async def put(self, key: ApiKey) -> None:
        """Store `key`, replacing one of the same name."""
        ...

    async def delete(self, api_key: str) -> bool:
        """Remove `api_key`; False if there was none."""
        ...

    async def all(self) -> list[ApiKey]: ...

    async def close(self) -> None: ...


class RedisKeyStore:
    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client
        # A key's hash and the set of names sit in two hash slots on Redis
        # Cluster, where one MULTI cannot hold both: there the two writes go
        # in one pipeline without MULTI (a failure between them leaves a name
        # without a hash, which `all` skips, or a hash without a name, which
        # `get` still finds).
        self._atomic = not is_cluster(client)

    async def get(self, api_key: str) -> ApiKey | None:
        raw = await bounded(self._client.hgetall(KEY_PREFIX + api_key), DEFAULT_TIMEOUT_S)
        return _from_hash(api_key, raw) if raw else None

    async def put(self, key: ApiKey) -> None:
        fields = {k: json.dumps(v) for k, v in asdict(key).items()}
        pipe = self._client.pipeline(transaction=self._atomic)
        pipe.hset(KEY_PREFIX + key.api_key, mapping=fields)  # type: ignore[arg-type]
        pipe.sadd(KEY_SET, key.api_key)
        await bounded(pipe.execute(), DEFAULT_TIMEOUT_S)

    async def delete(self, api_key: str) -> bool:
        pipe = self._client.pipeline(transaction=self._atomic)
        pipe.delete(KEY_PREFIX + api_key)
        pipe.srem(KEY_SET, api_key)
        removed, _ = await bounded(pipe.execute(), DEFAULT_TIMEOUT_S)
        return bool(removed)

    async def all(self) -> list[ApiKey]:
        raw = await bounded(self._client.smembers(KEY_SET), DEFAULT_TIMEOUT_S)
        names = sorted(_text(n) for n in raw)
        found = [await self.get(name) for name in names]
        return [k for k in found if k is not None]

    async def close(self) -> None:
        await self._client.aclose()


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _from_hash(api_key: str, raw: dict[Any, Any]) -> ApiKey:
    fields = {_text(k): json.loads(v) for k, v in raw.items()}
    fields["api_key"] = api_key
    known = ApiKey.__dataclass_fields__
    return ApiKey(**{k: v for k, v in fields.items() if k in known})


class FileKeyStore:
    """`--backend memory`: one node, so one writer; the file is read once and
    rewritten whole (atomically, by rename) on every change."""

    def __init__(self, data_dir: str) -> None:
        self.path = Path(data_dir) / FILE_NAME
        self._keys: dict[str, ApiKey] | None = None

    def _load(self) -> dict[str, ApiKey]:
        if self._keys is None:
            try:
                rows = json.loads(self.path.read_text())
            except FileNotFoundError:
                rows = []
            self._keys = {row["api_key"]: ApiKey(**row) for row in rows}
        return self._keys

    def _save(self) -> None:
        rows = [asdict(k) for k in self._load().values()]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # hashes: owner only
        with os.fdopen(fd, "w") as f:
            json.dump(rows, f, indent=1)
        tmp.replace(self.path)

    async def get(self, api_key: str) -> ApiKey | None:
        return self._load().get(api_key)

    async def put(self, key: ApiKey) -> None:
        self._load()[key.api_key] = key
        self._save()

    async def delete(self, api_key: str) -> bool:
        gone = self._load().pop(api_key, None) is not None
        if gone:
            self._save()
        return gone

    async def all(self) -> list[ApiKey]:
        return sorted(self._load().values(), key=lambda k: k.api_key)

    async def close(self) -> None:
        pass


def credentials(header: str | None) -> tuple[str, str] | None:
    """(key, secret) of an `Authorization: Basic ...` header, or None."""
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic" or not token:
        return None
    token = token.strip()
    if ":" not in token:  # base64 has no colon: the standard form
        try:
            token = base64.b64decode(token, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
    key, sep, secret = token.partition(":")
    return (key, secret) if sep and key and secret else None


class KeyCheck:
    """The API's guard: the caller's key, or Unauthorized (counted by reason)."""

    def __init__(self, store: KeyStore, metrics: Metrics) -> None:
        self.store = store
        self.metrics = metrics
        self._cache = CredentialCache(CACHE_TTL_S)

    def _refuse(self, reason: str, message: str) -> Unauthorized:
        self.metrics.api_unauthorized[reason] += 1
        return Unauthorized(message)

    async def __call__(self, request: web.Request) -> str:
        given = credentials(request.headers.get("Authorization"))
        if given is None:
            raise self._refuse("missing", "an API key is needed: Authorization: Basic key:secret")
        key, secret = given
        try:
            record = await self.store.get(key)
        except StoreUnavailable as exc:
            raise Unavailable(f"cannot read API keys: {exc}") from None
        if record is None or not record.enable:
            raise self._refuse("unknown", f"no such API key: {key}")

        async def ask() -> Any:
            return await verify(record.secret_hash, secret.encode())

        verdict = await self._cache.answer(digest(key, record.secret_hash, secret), ask)
        if verdict is not None and verdict.reason_code == 0x89:
            raise Unavailable("too many key checks pending; try again")
        if verdict is None or not verdict.ok:
            raise self._refuse("wrong_secret", f"wrong secret for API key {key}")
        return key


async def bootstrap(store: KeyStore, pairs: list[tuple[str, str]]) -> int:
    """Store the key file's keys whose stored secret differs; returns how many were written."""
    written = 0
    for key, secret in pairs:
        stored = await store.get(key)
        if stored is not None and (await verify(stored.secret_hash, secret.encode())).ok:
            continue
        await store.put(ApiKey(key, await hash_secret(secret), name=key,
                               desc="from --api-key-file", created_at=time.time()))  # fmt: skip
        written += 1
    return written


def new_key_request(body: dict[str, Any]) -> tuple[str, str, str]:
    """(name, desc, api_key) of a POST /api_key body; BadRequest if malformed."""
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest("name (a string) is required")
    desc = body.get("desc", "")
    if not isinstance(desc, str):
        raise BadRequest("desc must be a string")
    api_key = body.get("api_key", name)
    try:
        return name, desc, check_key_name(str(api_key))
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
