"""ACL rules kept in Redis, per user (EMQX's Redis authorization source).

Theory of operation. A user's rules are one hash, `weir:acl:<user name>`:
each field a topic filter (`eq <filter>` for an exact one; `%u` / `%c`
allowed, as in the file) and its value the action it allows: `publish`,
`subscribe` or `all`. As in EMQX, Redis rules only allow; they are
consulted after the file's rules and before `no_match`. The hash is read
once per connection, when its CONNECT is accepted (`services.auth.acl`), so
a PUBLISH never waits for Redis; a changed hash applies from the user's
next connection. A field that cannot be understood is skipped with one log
line; Redis not answering in `FETCH_TIMEOUT_S` means no Redis rules for
that connection (logged), so `no_match` decides.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final

import redis.asyncio as aioredis

from services.auth.aclfile import ACTIONS
from services.auth.aclrules import Rule, Topic
from services.mqtt.errors import TopicFilterInvalid
from services.mqtt.topics import validate_topic_filter
from services.store.errors import StoreUnavailable
from services.store.redis import bounded

log = logging.getLogger("weir.auth")

KEY_PREFIX: Final = "weir:acl:"
FETCH_TIMEOUT_S: Final = 1.0  # a CONNECT waits this long at most for its user's rules


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw


def parse_hash(fields: Mapping[bytes | str, bytes | str], key: str) -> tuple[Rule, ...]:
    """A user's hash as allow rules; fields that make no sense are logged and skipped."""
    rules: list[Rule] = []
    for raw_topic, raw_action in sorted(fields.items(), key=lambda kv: _text(kv[0])):
        topic, action = _text(raw_topic), _text(raw_action).strip().lower()
        if action not in ACTIONS:
            log.warning("ACL in redis %s: field %r: action %r is not publish, subscribe or all;"
                        " skipped", key, topic, action)  # fmt: skip
            continue
        if topic.startswith("eq ") and len(topic) > 3:
            pattern = Topic(topic[3:], exact=True)
        else:
            try:
                validate_topic_filter(topic)
            except TopicFilterInvalid:
                log.warning("ACL in redis %s: %r is not a valid topic filter; skipped", key, topic)
                continue
            pattern = Topic(topic, placeholders="%u" in topic or "%c" in topic)
        rules.append(
            Rule(allow=True, covers=ACTIONS[action], topics=(pattern,), source=f"redis {key}")
        )
    return tuple(rules)


class RedisAcl:
    def __init__(self, client: aioredis.Redis, prefix: str = KEY_PREFIX) -> None:
        self.client = client
        self.prefix = prefix

    async def fetch(self, username: str) -> tuple[Rule, ...]:
        key = self.prefix + username
        try:
            fields = await bounded(self.client.hgetall(key), FETCH_TIMEOUT_S)
        except StoreUnavailable as exc:
            log.warning("ACL in redis %s not read (%s): no Redis rules for this connection",
                        key, exc)  # fmt: skip
            return ()
        return parse_hash(fields, key)
