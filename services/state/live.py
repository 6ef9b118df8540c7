"""Live nodes' state on request, through Redis: what the drift check compares.

Theory of operation. Nodes have no HTTP API yet, but every node with a
state store shares its Redis, so the drift check (`weir streams verify`)
asks there. It writes a fresh nonce under the request key (`ask`, with a
TTL); each node reads that key with one GET about once a second (`asked`)
and, for a nonce it has not answered yet, writes its view under its own
dump key (`write`). All keys share the state store's hash tag:

    {<topic prefix>state}:verify           the request: a nonce (string, TTL)
    {<topic prefix>state}:live:<node id>   a node's answer (hash, TTL)

A dump is one hash whose fields are the entries, each a flat JSON object
of scalars (what they hold is services.state.records's business):

    meta                       {"nonce", "node", "ts_ms", "positions":
                                {"<topic>:<partition>": next offset}}
    s \\0 <client>              a session
    u \\0 <client> \\0 <filter>   a subscription and its options
    r \\0 <topic>               a retained message (digests, never the payload)
    t \\0 <client> \\0 <filter>   an entry of the node's routing table

NUL cannot occur in an MQTT client id, topic or filter, so it separates
them unambiguously (the state store's `subs` hash does the same).

A dump is written to a staging key (with the TTL, so a node that dies
mid-write leaves nothing behind for long) and renamed over the dump key
(RENAME is atomic and keeps the TTL): a reader sees a whole dump or the one
before, never half of each. `read` reads `meta`, the fields (HSCAN, in pages), then `meta` again,
and starts over if another dump landed meanwhile.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias, TypeVar, cast

import redis.asyncio as aioredis

from services.state.keys import live_keys
from services.state.store import StateStoreUnavailable
from services.store.errors import StoreUnavailable
from services.store.redis import bounded

CALL_TIMEOUT_S: Final = 5.0  # per Redis call; a dump's page is a few hundred KiB at most
WRITE_FIELDS: Final = 2000  # fields per HSET while writing a dump (~200 KiB a call)
SCAN_PAGE: Final = 5000  # fields per HSCAN call while reading one
READ_ATTEMPTS: Final = 5  # a dump replaced while being read is read again, this often
SEP: Final = "\0"
META: Final = "meta"
SESSION, SUBSCRIPTION, RETAINED, TABLE = "s", "u", "r", "t"

Scalar: TypeAlias = str | int | float | bool | None
Record: TypeAlias = dict[str, Scalar]  # one entry, as a flat JSON object
Positions: TypeAlias = dict[tuple[str, int], int]  # (topic, partition) -> next offset

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LiveDump:
    """A node's view at one moment: everything it had applied from the log
    up to `positions` (and its own acknowledged events, which it applies
    before its tail reads them back)."""

    node: str
    nonce: str
    ts_ms: int
    positions: Positions
    sessions: dict[str, Record] = field(default_factory=dict)  # client -> session
    subscriptions: dict[tuple[str, str], Record] = field(default_factory=dict)
    retained: dict[str, Record] = field(default_factory=dict)  # topic -> message digests
    table: dict[tuple[str, str], Record] = field(default_factory=dict)  # routing table


@dataclass(frozen=True, slots=True)
class DumpMeta:
    node: str
    nonce: str
    ts_ms: int
    positions: Positions


def encode_meta(node: str, nonce: str, ts_ms: int, positions: Positions) -> bytes:
    at = {f"{t}:{p}": n for (t, p), n in sorted(positions.items())}
    doc = {"nonce": nonce, "node": node, "ts_ms": ts_ms, "positions": at}
    return json.dumps(doc, sort_keys=True).encode()


def decode_meta(raw: bytes) -> DumpMeta:
    doc = json.loads(raw)
    positions: Positions = {}
    for name, offset in doc["positions"].items():
        topic, _, partition = name.rpartition(":")
        positions[(topic, int(partition))] = int(offset)
    return DumpMeta(str(doc["node"]), str(doc["nonce"]), int(doc["ts_ms"]), positions)


def encode(dump: LiveDump) -> dict[str, bytes]:
    """The dump's hash fields (CPU work: the node runs it off its loop)."""

    def value(record: Record) -> bytes:
        return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()

    fields = {META: encode_meta(dump.node, dump.nonce, dump.ts_ms, dump.positions)}
    for client, record in dump.sessions.items():
        fields[SESSION + SEP + client] = value(record)
    for (client, filter_), record in dump.subscriptions.items():
        fields[SUBSCRIPTION + SEP + client + SEP + filter_] = value(record)
    for topic, record in dump.retained.items():
        fields[RETAINED + SEP + topic] = value(record)
    for (client, filter_), record in dump.table.items():
        fields[TABLE + SEP + client + SEP + filter_] = value(record)
    return fields


def decode(fields: dict[bytes, bytes]) -> LiveDump:
    """A dump from its hash fields; raises ValueError when one does not read."""
    try:
        meta = decode_meta(fields[META.encode()])
        dump = LiveDump(meta.node, meta.nonce, meta.ts_ms, meta.positions)
        for raw_name, raw in fields.items():
            kind, _, rest = raw_name.decode().partition(SEP)
            if kind == META:
                continue
            record = cast(Record, json.loads(raw))
            if kind == SESSION:
                dump.sessions[rest] = record
            elif kind == RETAINED:
                dump.retained[rest] = record
            elif kind in (SUBSCRIPTION, TABLE):
                client, _, filter_ = rest.partition(SEP)
                target = dump.subscriptions if kind == SUBSCRIPTION else dump.table
                target[(client, filter_)] = record
            else:
                raise ValueError(f"unknown field kind {kind!r}")
    except (KeyError, TypeError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"unreadable dump: {type(exc).__name__}: {exc}") from None
    return dump


class LiveState:
    """The request key and the nodes' dumps in the state store's Redis."""

    def __init__(self, client: aioredis.Redis, topic_prefix: str) -> None:
        self.client = client
        self.request_key, self._dump_prefix = live_keys(topic_prefix)

    def dump_key(self, node_id: str) -> str:
        return self._dump_prefix + node_id

    async def _call(self, call: Awaitable[T]) -> T:
        try:
            return await bounded(call, CALL_TIMEOUT_S)
        except StoreUnavailable as exc:
            raise StateStoreUnavailable(f"state store: {exc}") from exc

    # -- the drift check's side ----------------------------------------------

    async def ask(self, nonce: str, ttl_s: float) -> None:
        """Ask every node for its view, tagged `nonce`."""
        await self._call(self.client.set(self.request_key, nonce, px=max(1, int(ttl_s * 1000))))

    async def meta(self, node_id: str) -> DumpMeta | None:
        """The newest dump's nonce and positions, without its entries."""
        raw = await self._call(self.client.hget(self.dump_key(node_id), META))
        if raw is None:
            return None
        try:
            return decode_meta(cast(bytes, raw))
        except (KeyError, TypeError, ValueError) as exc:
            raise StateStoreUnavailable(f"unreadable dump meta of {node_id}: {exc}") from None

    async def read(self, node_id: str) -> LiveDump | None:
        """The node's newest dump, whole; None if it has none."""
        key = self.dump_key(node_id)
        for _ in range(READ_ATTEMPTS):
            before = await self._call(self.client.hget(key, META))
            if before is None:
                return None
            fields: dict[bytes, bytes] = {}
            cursor = 0
            while True:
                cursor, page = await self._call(self.client.hscan(key, cursor, count=SCAN_PAGE))
                fields.update(cast(dict[bytes, bytes], page))
                if cursor == 0:
                    break
            after = await self._call(self.client.hget(key, META))
            if after == before and fields.get(META.encode()) == before:
                try:
                    return await asyncio.to_thread(decode, fields)
                except ValueError as exc:
                    raise StateStoreUnavailable(f"dump of {node_id}: {exc}") from None
        raise StateStoreUnavailable(f"the dump of {node_id} kept changing while read")

    # -- the node's side --------------------------------------------------------

    async def asked(self) -> str | None:
        """The nonce of the current request, if any (one GET)."""
        raw = await self._call(self.client.get(self.request_key))
        return None if raw is None else cast(bytes, raw).decode()

    async def write(self, dump: LiveDump, ttl_s: float) -> int:
        """Replace the node's dump with `dump`, whole; returns its fields."""
        fields = await asyncio.to_thread(encode, dump)
        key = self.dump_key(dump.node)
        staging = f"{key}:{dump.nonce}"
        ttl_ms = max(1, int(ttl_s * 1000))
        items = list(fields.items())
        await self._call(self.client.delete(staging))
        for start in range(0, len(items), WRITE_FIELDS):
            chunk: dict[str, Any] = dict(items[start : start + WRITE_FIELDS])
            pipe: Any = self.client.pipeline(transaction=False)
            pipe.hset(staging, mapping=chunk)
            pipe.pexpire(staging, ttl_ms)
            await self._call(pipe.execute())
        # RENAME is atomic and keeps the staging key's TTL, so the dump never
        # lives without one; no MULTI (a cluster client's pipelines refuse RENAME)
        await self._call(self.client.rename(staging, key))
        await self._call(self.client.pexpire(key, ttl_ms))
        return len(items)
