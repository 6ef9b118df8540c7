"""The ACL authorizer: file (or built-in) rules, then Redis rules, then `no_match`.

Theory of operation. `Acl.decide` answers with the rule that decides a
client's publish or subscribe: the first match among the file's rules
(`services.auth.aclfile`; without a file the built-in ones, EMQX's
defaults), then the client's Redis rules (`services.auth.aclredis`, allow
only), then a synthetic `no_match` rule (deny unless configured "allow").

Per connection (`connected` .. `disconnected`) the Acl keeps the peer's
address, the user's Redis rules (read once, at connect: a PUBLISH never
waits for Redis) and a cache of decisions by (action, topic, QoS, retain),
bounded by `CACHE_ENTRIES`. A client the Acl was not told of (a will
published after its connection ended) is decided without a cache.

The file is read at start (unreadable or malformed: the node does not
start) and again on `reload` (SIGHUP) or when its modification time
changes (looked at no more than once a second, from `decide`). A reload
that finds a malformed file keeps the rules it had and logs why; an
unreadable or empty file denies everything until it is fixed (an ACL must
fail closed). Every reload empties every connection's cache.
`publish_checked` says whether any publish can be denied at all: the
built-in rules deny only subscriptions, so a node running them does not ask
per PUBLISH.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Final

from services.auth.aclfile import AclFileError, AclFileUnreadable, default_rules, read
from services.auth.aclredis import RedisAcl
from services.auth.aclrules import Address, Rule, first_match, may_deny, peer_address
from services.auth.api import Action, ClientInfo

log = logging.getLogger("weir.auth")

CACHE_ENTRIES: Final = 256  # decisions kept per connection; past it the cache starts over
RELOAD_CHECK_S: Final = 1.0  # the file's mtime is looked at no more often than this
NO_MATCH_VALUES: Final = ("allow", "deny")


class _Connection:
    __slots__ = ("address", "cache", "redis_rules")

    def __init__(self, address: Address | None, redis_rules: tuple[Rule, ...]) -> None:
        self.address = address
        self.redis_rules = redis_rules
        self.cache: dict[tuple[Action, str, int, bool], Rule] = {}


class Acl:
    def __init__(
        self,
        path: str | Path | None = None,
        no_match: str = "deny",
        redis: RedisAcl | None = None,
        reload_check_s: float = RELOAD_CHECK_S,
    ) -> None:
        self.path = None if path is None else Path(path)
        self.redis = redis
        self.reload_check_s = reload_check_s
        self.no_match = Rule(
            allow=no_match == "allow", source=f"no rule matched, no_match {no_match}"
        )
        self._connections: dict[ClientInfo, _Connection] = {}
        self._last_client: ClientInfo | None = None  # the last one decided for, and its
        self._last: _Connection | None = None  # state (hashing a ClientInfo costs more)
        self._mtime = self._stat()
        self._checked = time.monotonic()
        if self.path is None:  # the built-in rules leave Redis a say only if it is there
            self.rules = default_rules(final_allow=redis is None)
        else:
            self.rules = self._fail_closed(read(self.path))  # raises: the node does not start
        self.publish_checked = self._publish_checked()

    # -- deciding ------------------------------------------------------------------------

    def allowed(
        self, client: ClientInfo, action: Action, topic: str, qos: int, retain: bool
    ) -> bool:
        return self.decide(client, action, topic, qos, retain).allow

    def rule(self, client: ClientInfo, action: Action, topic: str, qos: int, retain: bool) -> str:
        return str(self.decide(client, action, topic, qos, retain))

    def decide(
        self, client: ClientInfo, action: Action, topic: str, qos: int, retain: bool
    ) -> Rule:
        """The rule that decides (the first match, or `no_match`)."""
        if time.monotonic() - self._checked >= self.reload_check_s:
            self._check_file()
        if client is self._last_client:  # a connection's packets come in runs
            conn = self._last
        else:
            conn = self._connections.get(client)
            self._last_client, self._last = client, conn
        if conn is None:
            return self._evaluate(client, peer_address(client.peer), (), action, topic, qos, retain)
        key = (action, topic, qos, retain)
        rule = conn.cache.get(key)
        if rule is None:
            rule = self._evaluate(
                client, conn.address, conn.redis_rules, action, topic, qos, retain
            )
            if len(conn.cache) >= CACHE_ENTRIES:
                conn.cache.clear()
            conn.cache[key] = rule
        return rule

    def _evaluate(
        self,
        client: ClientInfo,
        address: Address | None,
        redis_rules: tuple[Rule, ...],
        action: Action,
        topic: str,
        qos: int,
        retain: bool,
    ) -> Rule:
        rule = first_match(self.rules, client, address, action, topic, qos, retain)
        if rule is None and redis_rules:
            rule = first_match(redis_rules, client, address, action, topic, qos, retain)
        return self.no_match if rule is None else rule

    # -- connections -----------------------------------------------------------------------

    async def connected(self, client: ClientInfo) -> bool:
        """A client's CONNECT was accepted: read its Redis rules, start its cache."""
        if client in self._connections:
            return False
        rules: tuple[Rule, ...] = ()
        if self.redis is not None and client.username:
            rules = await self.redis.fetch(client.username)
        self._connections[client] = _Connection(peer_address(client.peer), rules)
        self._last_client = self._last = None
        return True

    def disconnected(self, client: ClientInfo) -> None:
        self._connections.pop(client, None)
        self._last_client = self._last = None

    # -- the file --------------------------------------------------------------------------

    def _stat(self) -> float | None:
        if self.path is None:
            return None
        try:
            return self.path.stat().st_mtime
        except OSError:
            return None

    def _check_file(self) -> None:
        self._checked = time.monotonic()
        mtime = self._stat()
        if mtime != self._mtime:
            self._mtime = mtime
            self.reload()

    def reload(self) -> bool:
        """Read the file again (SIGHUP, or it changed); False if it was kept as it was."""
        if self.path is None:
            return False
        try:
            rules = read(self.path)
        except AclFileUnreadable as exc:
            log.warning("%s; every publish and subscribe is denied until it can be read", exc)
            rules = ()
        except AclFileError as exc:
            log.warning("%s; keeping the %d rules read before", exc, len(self.rules))
            return False
        self.rules = self._fail_closed(rules)
        self.publish_checked = self._publish_checked()
        for conn in self._connections.values():
            conn.cache.clear()
        log.info("ACL file %s reloaded: %d rules", self.path, len(rules))
        return True

    def _fail_closed(self, rules: tuple[Rule, ...]) -> tuple[Rule, ...]:
        if rules:
            return rules
        log.warning("ACL file %s has no rules: every publish and subscribe is denied", self.path)
        return (Rule(allow=False, source=f"{self.path} denies everything (no rules)"),)

    def _publish_checked(self) -> bool:
        """Redis rules only allow, so they cannot change the answer."""
        return may_deny(self.rules, Action.PUBLISH, self.no_match.allow)
