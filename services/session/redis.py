"""Session ownership in Redis: one Lua script per atomic step.

The client's keys, bounded calls and scripts come from `services.store.redis`
(shared with the queue store): every call is bounded by `timeout` seconds
and a failure to answer becomes `StoreUnavailable`.

Expiry: `release` PEXPIREs every key of the client; `claim` PERSISTs them.

Node indexes: a dead node's sessions and wills are found through a set per
node of the client ids it owns (`{n:<node>}:s`, `{n:<node>}:w`), kept by
the scripts that change ownership, in the same call: claim and will_put
add, adopt and will_adopt move, release and will_take remove (for the
store's own node: `node`). So a node's death costs work proportional to
its clients, not a SCAN of the keyspace. An index may list a client that
left it in a way its scripts cannot see (taken over by another node: its
key is not known to the taking script); such a stale entry is harmless,
since `orphans` checks every entry against the client's own hash, and
pruned there (unindex.lua) or by the node's next release of that client.

Redis Cluster: a node index is its own hash slot, so on one Redis the
scripts keep it in the same call, and on a cluster (`is_cluster`) the store
keeps it in calls of its own around the script, so that the index stays a
superset of the truth, which `orphans` already tolerates:
- an entry is added before the script that makes the client the node's
  (claim, will put, will adopt: a node dying between the two leaves a stale
  entry, never a missing one) and again after it;
- an entry is removed after the script that lets the client go (release,
  will take, adopt, prune), then the client's hash is read and the entry
  added back if the client is the node's after all.
Together the two orders close the race of a release and a claim of the
same client on the same node: whichever removal comes last is followed by a
read that sees the claim, or by the claim's second add. Cost on a cluster
only: two more round trips per claim, will put and will adopt, and three
per release and will take.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from services.session.api import Adopted, Claim, Fenced, SessionInfo, StoredWill
from services.store.redis import (
    DEFAULT_TIMEOUT_S,
    FENCED,
    KEY_SUFFIXES,
    LEFTOVER_GRACE_MS,
    Call,
    bounded,
    client_keys,
    connect,
    is_cluster,
    load_script,
    pipelined,
    run_script,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "KEY_SUFFIXES",
    "RedisSessionStore",
    "RedisWillStore",
    "bounded",
    "client_keys",
    "connect",
]

NEVER_EXPIRES = 0xFFFFFFFF  # MQTT 5 session expiry interval meaning "never"
TOPIC_VERSION_TTL_MS = 86_400_000  # versions are clocks, so the key may be forgotten


class _ScriptStore:
    """A store of Lua scripts on one client, each call bounded by `timeout`."""

    def __init__(
        self, client: aioredis.Redis, timeout: float = DEFAULT_TIMEOUT_S, replicas: int = 0
    ) -> None:
        self._client = client
        self._timeout = timeout
        self._replicas = replicas  # WAIT for this many after each script (--redis-wait)
        self._cluster = is_cluster(client)  # node indexes in calls of their own
        self._unindex = load_script(client, "services.session", "unindex.lua")

    @classmethod
    def from_url(cls, url: str, timeout: float = DEFAULT_TIMEOUT_S) -> Self:
        return cls(connect(url, timeout), timeout)

    async def _run(self, script: AsyncScript, keys: Sequence[bytes], args: list[Any]) -> Any:
        return await run_script(script, keys, args, self._timeout, self._replicas)

    async def close(self) -> None:
        await self._client.aclose()

    async def _prune(self, node: str, kind: str, stale: list[str]) -> None:
        """Remove a node's index entries that no longer hold, each checked again
        (the client may have come back to the node since it was read): in Lua
        on one Redis, by `_index_drop` on a cluster."""
        if not stale:
            return
        if self._cluster:
            for cid in stale:
                await self._index_drop(node, kind, cid)
            return
        index = node_index(node, kind)
        field, online = ("node", 1) if kind == "s" else ("n", 0)
        calls: list[Call] = [(self._unindex, [index, ("{c:" + cid + "}:" + kind).encode()],
                  [node, cid, field, online]) for cid in stale]  # fmt: skip
        answers = await pipelined(self._client, calls, self._timeout)
        for (script, keys, args), answer in zip(calls, answers, strict=True):
            if isinstance(answer, NoScriptError):  # each checks its entry: any order will do
                await bounded(script(keys=keys, args=args), self._timeout)

    async def _index_add(self, index: bytes, client_id: str) -> None:
        await bounded(self._client.sadd(index, client_id), self._timeout)

    async def _index_drop(self, node: str, kind: str, client_id: str) -> None:
        """Cluster only: remove `client_id` from `node`'s index of `kind`, then
        add it back if its hash (read after the removal) says it is the node's."""
        index = node_index(node, kind)
        await bounded(self._client.srem(index, client_id), self._timeout)
        field = "node" if kind == "s" else "n"
        key = ("{c:" + client_id + "}:" + kind).encode()
        owner, online = await bounded(self._client.hmget(key, [field, "online"]), self._timeout)
        if owner == node.encode() and (kind == "w" or online == b"1"):
            await self._index_add(index, client_id)


def node_index(node: str, kind: str) -> bytes:
    """The set of client ids `node` owns: kind "s" sessions online there, "w" wills."""
    return ("{n:" + node + "}:" + kind).encode()


class RedisSessionStore(_ScriptStore):
    def __init__(
        self,
        client: aioredis.Redis,
        timeout: float = DEFAULT_TIMEOUT_S,
        node: str | None = None,
        replicas: int = 0,
    ) -> None:
        super().__init__(client, timeout, replicas)
        # Whose index `release` keeps: this node's; None given, the node that
        # last claimed through this store (tests that play several nodes).
        self._owner, self._fixed = node, node is not None
        self._claim = load_script(client, "services.session", "claim.lua")
        self._release = load_script(client, "services.session", "release.lua")
        self._version = load_script(client, "services.session", "version.lua")
        self._topic_version = load_script(client, "services.session", "topic_version.lua")
        self._adopt = load_script(client, "services.session", "adopt.lua")

    async def claim(self, client_id: str, node: str, clean_start: bool, expiry_s: int) -> Claim:
        keys: list[bytes] = list(client_keys(client_id))
        index = node_index(node, "s")
        if self._cluster:
            await self._index_add(index, client_id)
        else:
            keys.append(index)
        epoch, present, previous = await self._run(
            self._claim, keys, [node, int(clean_start), expiry_s, client_id]
        )
        if self._cluster:
            await self._index_add(index, client_id)
        if not self._fixed:
            self._owner = node
        return Claim(client_id, int(epoch), bool(present), previous.decode() if previous else None)

    async def release(self, client_id: str, epoch: int, expiry_s: int) -> None:
        keys = list(client_keys(client_id))
        args: list[Any] = [epoch, max(expiry_s, 0), NEVER_EXPIRES, LEFTOVER_GRACE_MS]
        owner = self._owner
        if owner is not None and not self._cluster:
            keys.append(node_index(owner, "s"))
            args += [owner, client_id]
        fenced = await self._run(self._release, keys, args) == FENCED
        if owner is not None and self._cluster:
            await self._index_drop(owner, "s", client_id)
        if fenced:
            raise Fenced(client_id)

    async def next_version(self, client_id: str, epoch: int) -> int:
        version = await self._run(self._version, client_keys(client_id)[:1], [epoch])
        if version == FENCED:
            raise Fenced(client_id)
        return int(version)

    async def next_topic_version(self, topic: str) -> int:
        key = ("{t:" + topic + "}:v").encode()
        return int(await self._run(self._topic_version, [key], [TOPIC_VERSION_TTL_MS]))

    async def get(self, client_id: str) -> SessionInfo | None:
        call = self._client.hmget(client_keys(client_id)[0], ["epoch", "node", "online", "expiry"])
        epoch, node, online, expiry = await bounded(call, self._timeout)
        if epoch is None:
            return None
        is_online = online == b"1"
        owner = node.decode() if isinstance(node, bytes) and is_online else None
        return SessionInfo(client_id, owner, int(epoch), int(expiry or 0), is_online)

    async def orphans(self, node: str) -> list[str]:
        fields = await _indexed(
            self._client, node_index(node, "s"), "s", ("node", "online"), self._timeout
        )
        mine = node.encode()
        owned = [cid for cid, (owner, online) in fields if owner == mine and online == b"1"]
        kept = set(owned)
        stale = [cid for cid, _ in fields if cid not in kept]
        await self._prune(node, "s", stale)
        return owned

    async def adopt(self, client_id: str, dead: str) -> Adopted | None:
        keys = [*client_keys(client_id)]
        if not self._cluster:
            keys.append(node_index(dead, "s"))
        args = [dead, NEVER_EXPIRES, client_id, LEFTOVER_GRACE_MS]
        got = await self._run(self._adopt, keys, args)
        if self._cluster:  # the dead node's: no claim there can come after
            await bounded(self._client.srem(node_index(dead, "s"), client_id), self._timeout)
        if not got:
            return None
        epoch, version, expiry = got
        return Adopted(client_id, int(epoch), int(version), int(expiry))

    def mark_durable(self, client_id: str) -> None:
        return None  # one tier: nothing to choose


async def _indexed(
    client: aioredis.Redis, index: bytes, kind: str, fields: tuple[str, ...], limit_s: float
) -> list[tuple[str, list[Any]]]:
    """(client id, the hash fields of `{c:<id>}:<kind>`) for every id in `index`,
    in one round trip for the index and one for the hashes."""
    members = await bounded(client.smembers(index), limit_s)
    ids = sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)
    if not ids:
        return []
    pipe = client.pipeline(transaction=False)
    for cid in ids:
        pipe.hmget(("{c:" + cid + "}:" + kind).encode(), list(fields))
    values = await bounded(pipe.execute(), limit_s)
    return list(zip(ids, values, strict=True))


class RedisWillStore(_ScriptStore):
    """Wills in Redis: one hash `{c:<id>}:w` per client, changed only by Lua,
    and an index per node of the wills it is to publish (`node_index`)."""

    def __init__(
        self,
        client: aioredis.Redis,
        timeout: float = DEFAULT_TIMEOUT_S,
        node: str | None = None,
        replicas: int = 0,
    ) -> None:
        super().__init__(client, timeout, replicas)
        self._owner, self._fixed = node, node is not None  # whose index `take` keeps
        self._put = load_script(client, "services.session", "will_put.lua")
        self._arm = load_script(client, "services.session", "will_arm.lua")
        self._take = load_script(client, "services.session", "will_take.lua")
        self._adopt = load_script(client, "services.session", "will_adopt.lua")

    @staticmethod
    def _key(client_id: str) -> list[bytes]:
        return [("{c:" + client_id + "}:w").encode()]

    async def put(
        self,
        client_id: str,
        node: str,
        token: str,
        message: bytes | None,
        delay_s: int,
        username: str | None = None,
        peer: str = "",
    ) -> StoredWill | None:
        named = username is not None
        args = [node, token, message or b"", delay_s, int(named), username or "", peer, client_id]
        keys, index = self._key(client_id), node_index(node, "w")
        if not self._fixed:
            self._owner = node
        if not self._cluster:
            old = await self._run(self._put, [*keys, index], args)
        elif message:
            await self._index_add(index, client_id)
            old = await self._run(self._put, keys, args)
            await self._index_add(index, client_id)
        else:
            old = await self._run(self._put, keys, args)
        if not old:
            return None
        blob, delay, owner, due, user, at = old
        return StoredWill(
            blob, int(delay or 0), (owner or b"").decode(), int(due or 0), _text(user),
            (at or b"").decode(),
        )  # fmt: skip

    async def arm(self, client_id: str, token: str, due_ms: int) -> bool:
        return bool(await self._run(self._arm, self._key(client_id), [token, due_ms]))

    async def take(self, client_id: str, token: str) -> bytes | None:
        keys = self._key(client_id)
        args: list[Any] = [token]
        owner = self._owner
        if owner is not None and not self._cluster:
            keys.append(node_index(owner, "w"))
            args += [owner, client_id]
        got = await self._run(self._take, keys, args)
        if owner is not None and self._cluster:
            await self._index_drop(owner, "w", client_id)
        return bytes(got) if got else None

    async def orphans(self, node: str) -> list[str]:
        fields = await _indexed(self._client, node_index(node, "w"), "w", ("n",), self._timeout)
        owned = [cid for cid, (owner,) in fields if owner == node.encode()]
        kept = set(owned)
        stale = [cid for cid, _ in fields if cid not in kept]
        await self._prune(node, "w", stale)
        return owned

    async def adopt(
        self, client_id: str, dead: str, node: str, token: str, now_ms: int
    ) -> StoredWill | None:
        keys, gone, mine = self._key(client_id), node_index(dead, "w"), node_index(node, "w")
        args = [dead, node, token, now_ms, client_id]
        if self._cluster:
            await self._index_add(mine, client_id)
            got = await self._run(self._adopt, keys, args)
            await bounded(self._client.srem(gone, client_id), self._timeout)
            if got:
                await self._index_add(mine, client_id)
            else:  # not the dead node's: not this one's either
                await self._index_drop(node, "w", client_id)
        else:
            got = await self._run(self._adopt, [*keys, gone, mine], args)
        if not got:
            return None
        blob, delay, due, user, at = got
        return StoredWill(
            bytes(blob), int(delay or 0), node, int(due), _text(user), (at or b"").decode()
        )


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode()
