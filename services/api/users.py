"""/api/v5/authentication/{backend}/users and /api/v5/authorization/redis/rules/{user}:
the stores `weir passwd` writes, and the per-user ACL rules in Redis.

`{backend}` is `password_file` (the node's `--password-file` or
`[[auth]]` password_file table; the authenticator rereads it when it
changes) or `redis` (hashes `weir:user:<name>`, for `--auth-redis`). Users
are written by the same functions as `weir passwd` (argon2id, plus SCRAM
credentials when asked), in a thread: a hash costs about 80 ms of CPU.
ACL rules are the hash `weir:acl:<user>` (topic filter -> publish,
subscribe or all; `services.auth.aclredis`), read by a user's next
connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from aiohttp import web
from redis.exceptions import RedisError

from services.api.errors import BadRequest, Conflict, NotFound, Unavailable
from services.api.paging import Page
from services.api.routes import Param, Route, body_of, page_params, paged
from services.auth import passwd, redisusers
from services.auth.aclfile import ACTIONS
from services.auth.aclredis import KEY_PREFIX as ACL_PREFIX
from services.auth.passwd import PasswordFileError
from services.mqtt.errors import TopicFilterInvalid
from services.mqtt.topics import validate_topic_filter
from services.store.errors import StoreUnavailable
from services.store.redis import DEFAULT_TIMEOUT_S, bounded

BACKENDS = ("password_file", "redis")
USER: dict[str, Any] = {"type": "object", "properties": {"user_id": {"type": "string"}}}
NEW_USER: dict[str, Any] = {"type": "object", "required": ["user_id", "password"],
                            "properties": {"user_id": {"type": "string"},
                                           "password": {"type": "string"},
                                           "scram": {"type": "boolean"}}}  # fmt: skip
RULE: dict[str, Any] = {"type": "object", "properties": {
    "topic": {"type": "string"}, "action": {"type": "string", "enum": list(ACTIONS)}}}  # fmt: skip


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


class Users:
    def __init__(self, password_file: str | None, redis_url: str | None,
                 client: aioredis.Redis | None) -> None:  # fmt: skip
        self.password_file = Path(password_file) if password_file else None
        self.redis_url = redis_url
        self.client = client

    def _backend(self, request: web.Request) -> str:
        backend = request.match_info["backend"]
        if backend == "password_file" and self.password_file is None:
            raise NotFound("this node has no password file (--password-file)")
        if backend == "redis" and (self.client is None or self.redis_url is None):
            raise NotFound("this node has no Redis")
        return backend

    async def _names(self, backend: str) -> list[str]:
        if backend == "password_file":
            assert self.password_file is not None
            if not self.password_file.exists():
                return []
            try:
                hashes, scram = passwd.read_users(self.password_file)
            except PasswordFileError as exc:
                raise Unavailable(str(exc)) from None
            return sorted(set(hashes) | set(scram))
        assert self.client is not None
        try:
            keys = await bounded(self._scan(redisusers.KEY_PREFIX), DEFAULT_TIMEOUT_S)
        except StoreUnavailable as exc:
            raise Unavailable(f"cannot read users: {exc}") from None
        return sorted(k[len(redisusers.KEY_PREFIX):] for k in keys)

    async def _scan(self, prefix: str) -> list[str]:
        assert self.client is not None
        return [_text(k) async for k in self.client.scan_iter(prefix + "*", 1000)]

    async def list(self, request: web.Request) -> Any:
        names = await self._names(self._backend(request))
        like = request.query.get("like_user_id")
        rows = [n for n in names if like is None or like in n]
        return Page.of(request.query).answer(rows, lambda n: {"user_id": n})

    async def _write(self, backend: str, user: str, password: str | None, scram: bool) -> None:
        try:
            if backend == "password_file":
                assert self.password_file is not None
                await asyncio.to_thread(passwd.set_user, self.password_file, user, password, scram)
            else:
                assert self.redis_url is not None
                await asyncio.to_thread(redisusers.set_user, self.redis_url, user, password, scram)
        except PasswordFileError as exc:
            raise Unavailable(str(exc)) from None
        except (OSError, RedisError) as exc:
            raise Unavailable(f"cannot write the user: {exc}") from None

    async def add(self, request: web.Request) -> Any:
        backend = self._backend(request)
        body = await body_of(request)
        user, password = body.get("user_id"), body.get("password")
        if not isinstance(user, str) or not user or ":" in user or user.strip() != user:
            raise BadRequest("user_id must be a non-empty name without ':' or outer spaces")
        if not isinstance(password, str) or not password:
            raise BadRequest("password (a non-empty string) is required")
        if user in await self._names(backend):
            raise Conflict(f"user {user} exists; delete it first or PUT a new password")
        await self._write(backend, user, password, bool(body.get("scram", False)))
        return {"user_id": user}

    async def change(self, request: web.Request) -> Any:
        backend = self._backend(request)
        user = request.match_info["user_id"]
        body = await body_of(request)
        password = body.get("password")
        if not isinstance(password, str) or not password:
            raise BadRequest("password (a non-empty string) is required")
        if user not in await self._names(backend):
            raise NotFound(f"no such user: {user}")
        await self._write(backend, user, password, bool(body.get("scram", False)))
        return {"user_id": user}

    async def delete(self, request: web.Request) -> Any:
        backend = self._backend(request)
        user = request.match_info["user_id"]
        if user not in await self._names(backend):
            raise NotFound(f"no such user: {user}")
        await self._write(backend, user, None, False)
        return None

    def _acl_client(self) -> aioredis.Redis:
        if self.client is None:
            raise NotFound("this node has no Redis for ACL rules")
        return self.client

    async def rules(self, request: web.Request) -> Any:
        user = request.match_info["username"]
        try:
            raw = await bounded(self._acl_client().hgetall(ACL_PREFIX + user), DEFAULT_TIMEOUT_S)
        except StoreUnavailable as exc:
            raise Unavailable(f"cannot read the rules: {exc}") from None
        return sorted(({"topic": _text(t), "action": _text(a)} for t, a in raw.items()),
                      key=lambda r: r["topic"])  # fmt: skip

    async def set_rules(self, request: web.Request) -> Any:
        user = request.match_info["username"]
        try:
            given = await request.json()
        except ValueError:
            raise BadRequest("the body is not JSON") from None
        if not isinstance(given, list):
            raise BadRequest("the body must be a list of {topic, action}")
        fields: dict[str, str] = {}
        for rule in given:
            topic = rule.get("topic") if isinstance(rule, dict) else None
            action = rule.get("action") if isinstance(rule, dict) else None
            if not isinstance(topic, str) or not isinstance(action, str) or action not in ACTIONS:
                raise BadRequest(f"each rule needs a topic and an action ({', '.join(ACTIONS)})")
            try:
                validate_topic_filter(topic.removeprefix("eq "))
            except TopicFilterInvalid as exc:
                raise BadRequest(f"topic {topic!r}: {exc}") from None
            fields[topic] = str(action)
        client = self._acl_client()
        pipe = client.pipeline(transaction=True)
        pipe.delete(ACL_PREFIX + user)
        if fields:
            pipe.hset(ACL_PREFIX + user, mapping=fields)  # type: ignore[arg-type]
        try:
            await bounded(pipe.execute(), DEFAULT_TIMEOUT_S)
        except StoreUnavailable as exc:
            raise Unavailable(f"cannot store the rules: {exc}") from None
        return [{"topic": t, "action": a} for t, a in sorted(fields.items())]

    async def delete_rules(self, request: web.Request) -> Any:
        user = request.match_info["username"]
        try:
            gone = await bounded(self._acl_client().delete(ACL_PREFIX + user), DEFAULT_TIMEOUT_S)
        except StoreUnavailable as exc:
            raise Unavailable(f"cannot delete the rules: {exc}") from None
        if not gone:
            raise NotFound(f"no rules for {user}")
        return None


def routes(users: Users) -> Iterable[Route]:
    backend = Param("backend", "password_file or redis", where="path", required=True,
                    enum=BACKENDS)  # fmt: skip
    user = Param("user_id", "the user name", where="path", required=True)
    username = Param("username", "the user name", where="path", required=True)
    rules = {"type": "array", "items": RULE}
    return (
        Route("GET", "/authentication/{backend}/users", "Users of a store", users.list,
              "authentication", (backend, *page_params(Param("like_user_id", "part of a name"))),
              paged(USER)),
        Route("POST", "/authentication/{backend}/users", "Add a user (as weir passwd)",
              users.add, "authentication", (backend,), USER, body=NEW_USER),
        Route("PUT", "/authentication/{backend}/users/{user_id:.+}", "Change a user's password",
              users.change, "authentication", (backend, user), USER, body=NEW_USER),
        Route("DELETE", "/authentication/{backend}/users/{user_id:.+}", "Delete a user",
              users.delete, "authentication", (backend, user), None, status=204),
        Route("GET", "/authorization/redis/rules/{username:.+}", "A user's ACL rules in Redis",
              users.rules, "authorization", (username,), rules),
        Route("PUT", "/authorization/redis/rules/{username:.+}", "Replace a user's ACL rules",
              users.set_rules, "authorization", (username,), rules, body=rules),
        Route("DELETE", "/authorization/redis/rules/{username:.+}", "Delete a user's ACL rules",
              users.delete_rules, "authorization", (username,), None, status=204),
    )  # fmt: skip
