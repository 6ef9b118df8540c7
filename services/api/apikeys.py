"""/api/v5/api_key: list, create and revoke API keys (EMQX's paths and fields).

A created key's secret is shown once, in the creation's answer; only its
argon2id hash is stored (`services.api.keys`). Revoking deletes the key:
every node refuses it from its next request.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from services.api.errors import Conflict, NotFound
from services.api.keys import ApiKey, KeyStore, hash_secret, new_key_request
from services.api.routes import Param, Route, body_of

SECRET_BYTES = 32  # a made secret: 256 random bits, URL-safe base64

KEY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "api_key": {"type": "string"},
        "name": {"type": "string"},
        "desc": {"type": "string"},
        "enable": {"type": "boolean"},
        "created_at": {"type": "string"},
    },
}
CREATED: dict[str, Any] = {
    "type": "object",
    "properties": {**KEY["properties"], "api_secret": {"type": "string"}},
}
NEW_KEY: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string"},
        "desc": {"type": "string"},
        "api_key": {"type": "string", "description": "default: the name"},
        "api_secret": {"type": "string", "description": "default: made at random"},
    },
}


def routes(store: KeyStore) -> Iterable[Route]:
    async def listing(request: web.Request) -> Any:
        return [k.public() for k in await store.all()]

    async def create(request: web.Request) -> Any:
        body = await body_of(request)
        name, desc, api_key = new_key_request(body)
        secret = body.get("api_secret") or secrets.token_urlsafe(SECRET_BYTES)
        if await store.get(api_key) is not None:
            raise Conflict(f"API key {api_key} exists; revoke it first")
        key = ApiKey(api_key, await hash_secret(str(secret)), name=name, desc=desc,
                     created_at=time.time())  # fmt: skip
        await store.put(key)
        return {**key.public(), "api_secret": secret}

    async def show(request: web.Request) -> Any:
        key = await store.get(request.match_info["name"])
        if key is None:
            raise NotFound(f"no such API key: {request.match_info['name']}")
        return key.public()

    async def revoke(request: web.Request) -> Any:
        if not await store.delete(request.match_info["name"]):
            raise NotFound(f"no such API key: {request.match_info['name']}")
        return None

    name = Param("name", "the API key", where="path", required=True)
    return (
        Route("GET", "/api_key", "List API keys", listing, "api_key", (),
              {"type": "array", "items": KEY}),
        Route("POST", "/api_key", "Create an API key (its secret is shown once)", create,
              "api_key", (), CREATED, body=NEW_KEY, status=200),
        Route("GET", "/api_key/{name}", "One API key", show, "api_key", (name,), KEY),
        Route("DELETE", "/api_key/{name}", "Revoke an API key", revoke, "api_key", (name,),
              None, status=204),
    )  # fmt: skip
