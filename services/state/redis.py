"""The state store in Redis, read side (the Spark job writes it: streams/statestore.py).

Theory of operation. The store is a handful of hashes under one hash tag,
`{<topic prefix>state}:` (services.state.keys: the layout the writer
imports too). `load` reads the offsets first, then the
rest with HSCAN in large pages (sessions, retained and floors at once;
the subscriptions' next page asked for while one is parsed).
Subscriptions are one field per client (a JSON object of compact values,
filter -> "version|live|qos|...", '/' unescaped), so a million
subscriptions of 100,000 clients are 100,000 fields in a few round trips,
and one client's arrive together: the view and the routing trie load
them client by client, one call each (`ClusterView.load_subscriptions`).
Sessions and retained messages are stored as the log's own event JSON and
decoded by the event catalogue; an entry that does not decode is counted
and skipped, never a failed start.

Re-seeding (DESIGN 6): a node that finds the log empty and the store not
takes a short lease on the re-seed with SET NX PX (one node of several;
it extends the lease as it goes), first drops the old offsets and starts a
new log generation (`new_generation`: the Spark job's checkpoint is void),
then writes the store's events to the log and releases the lease. A re-seed
cut short by a crash thus leaves no offsets of the old log behind, and its
lease lapses within its TTL (services.node.bootstrap).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any, Final, cast

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from services.event.schema import (
    RETAINED,
    SESSIONS,
    Event,
    EventSchemaError,
    decode,
)
from services.state.keys import reseed_key, state_keys
from services.state.store import StateSnapshot, StateStoreUnavailable, StoredSubscription

log = logging.getLogger("weir.statestore")

SCAN_PAGE: Final = 20_000  # hash fields per HSCAN call: ~1 MiB replies, few round trips
SEP: Final = "\0"
TAIL_CACHE: Final = 65_536  # distinct parsed subscription tails kept while loading
_json_object = json.JSONDecoder().decode  # str in: json.loads' bytes sniffing skipped
_new_row = tuple.__new__


def parse_subscriptions(
    client: bytes, blob: bytes, tails: dict[str, tuple[Any, ...]] | None = None
) -> list[StoredSubscription]:
    """One client's subscriptions: a JSON object, filter -> the compact value
    "version|live|qos|no_local|rap|rh|sid|ts_ms|node" (sid empty for none).
    `tails` caches the parsed part after the version: a client's
    subscriptions mostly share it, and a node loads a million at start."""
    client_id = client.decode()
    cache = {} if tails is None else tails
    out: list[StoredSubscription] = []
    append = out.append
    for filter_, value in _json_object(blob.decode()).items():
        v, _, rest = value.partition("|")
        tail = cache.get(rest)
        if tail is None:
            live, qos, nl, rap, rh, sid, ts, node = rest.split("|", 7)
            tail = (
                live == "1",
                int(qos),
                nl == "1",
                rap == "1",
                int(rh),
                int(sid) if sid else None,
                int(ts),
                node,
            )
            if len(cache) < TAIL_CACHE:
                cache[rest] = tail
        # StoredSubscription(...) without its Python-level __new__: a million rows
        append(_new_row(StoredSubscription, (client_id, filter_, int(v), *tail)))
    return out


def decode_all(suffix: str, entries: dict[bytes, bytes]) -> tuple[list[Event], int]:
    """The events stored as the log's JSON, and how many did not decode
    (each logged and skipped: a bad entry never stops a node's start)."""
    events: list[Event] = []
    bad = 0
    for raw in entries.values():
        try:
            events.append(decode(suffix, raw))
        except EventSchemaError as exc:
            bad += 1
            log.warning("state store: skipped a %s entry: %s", suffix, exc)
    return events, bad


class RedisStateStore:
    def __init__(self, client: aioredis.Redis, topic_prefix: str) -> None:
        self.client = client
        self.keys = state_keys(topic_prefix)
        self.reseed_key = reseed_key(topic_prefix)
        self.topic_prefix = topic_prefix

    async def _scan(self, key: str) -> dict[bytes, bytes]:
        out: dict[bytes, bytes] = {}
        async for page in self._pages(key):
            out.update(page)
        return out

    async def _pages(self, key: str) -> AsyncIterator[dict[bytes, bytes]]:
        """HSCAN's pages; the next one is asked for before this one is handed
        over, so Redis prepares it while the caller parses this one."""
        pending = asyncio.ensure_future(self.client.hscan(key, 0, count=SCAN_PAGE))
        try:
            while True:
                cursor, page = await pending
                if cursor != 0:
                    pending = asyncio.ensure_future(self.client.hscan(key, cursor, count=SCAN_PAGE))
                yield cast(dict[bytes, bytes], page)
                if cursor == 0:
                    return
        finally:
            pending.cancel()  # the caller stopped early (a no-op once done)

    async def load(self) -> StateSnapshot | None:
        try:
            return await self._load()
        except (RedisError, OSError) as exc:
            raise StateStoreUnavailable(f"state store unreadable: {exc}") from exc

    async def _load(self) -> StateSnapshot | None:
        keys = self.keys
        # The offsets first: the state read after them is at least as new.
        offsets = await self._offsets()
        generation = cast(bytes | None, await self.client.hget(keys["meta"], "generation"))
        raw_sessions, raw_retained, raw_floors = await asyncio.gather(
            *(self._scan(keys[name]) for name in ("sessions", "retained", "floors"))
        )  # each on its own connection: Redis reads one while the client takes another in
        # In a thread: 100,000 sessions take seconds to decode, and a node that
        # reads the store while it serves (the log cut) must keep its loop
        # turning meanwhile: its heartbeat, missed for 5 s, fences it.
        sessions, bad_sessions = await asyncio.to_thread(decode_all, SESSIONS, raw_sessions)
        retained, bad = await asyncio.to_thread(decode_all, RETAINED, raw_retained)
        bad += bad_sessions
        floors = {f.decode(): int(v) for f, v in raw_floors.items()}
        subscriptions: list[StoredSubscription] = []
        tails: dict[str, tuple[Any, ...]] = {}
        seen: set[bytes] = set()  # HSCAN may return a field twice (a rehash meanwhile)
        async for page in self._pages(keys["subs"]):
            for client, blob in page.items():
                if client in seen:
                    continue
                seen.add(client)
                try:
                    subscriptions.extend(parse_subscriptions(client, blob, tails))
                except (ValueError, UnicodeDecodeError, AttributeError) as exc:
                    bad += 1
                    log.warning(
                        "state store: skipped the subscriptions of %r: %s", client[:200], exc
                    )
        if not (offsets or sessions or subscriptions or retained or floors):
            return None
        return StateSnapshot(
            offsets=offsets,
            generation=generation.decode() if generation is not None else "",
            sessions=sessions,  # type: ignore[arg-type]  # decoded from the sessions topic
            floors=floors,
            subscriptions=subscriptions,
            retained=retained,  # type: ignore[arg-type]  # decoded from the retained topic
            bad=bad,
        )

    async def offsets(self) -> dict[tuple[str, int], int]:
        """The offsets the store reflects, alone (one HGETALL: cheap to poll)."""
        try:
            return await self._offsets()
        except (RedisError, OSError) as exc:
            raise StateStoreUnavailable(f"state store unreadable: {exc}") from exc

    async def _offsets(self) -> dict[tuple[str, int], int]:
        raw = cast(dict[bytes, bytes], await self.client.hgetall(self.keys["offsets"]))
        offsets: dict[tuple[str, int], int] = {}
        for f, v in raw.items():
            topic, _, partition = f.decode().rpartition(":")
            offsets[(topic, int(partition))] = int(v)
        return offsets

    async def routes(self) -> dict[str, dict[str, int]]:
        """filter -> node -> live subscriptions (the drift check compares it)."""
        out: dict[str, dict[str, int]] = {}
        for f, v in (await self._scan(self.keys["routes"])).items():
            filter_, _, node = f.decode().partition(SEP)
            out.setdefault(filter_, {})[node] = int(v)
        return out

    async def claim_reseed(self, owner: str, ttl_s: float) -> bool:
        """SET NX PX; a lease `owner` itself holds (its own re-seed going on,
        or a run of this node id killed mid-re-seed) is extended at once."""
        lock = self.reseed_key
        ttl_ms = int(ttl_s * 1000)
        try:
            if await self.client.set(lock, owner, nx=True, px=ttl_ms):
                return True
            held = cast(bytes | None, await self.client.get(lock))
            if held is not None and held.decode() == owner:
                await self.client.set(lock, owner, px=ttl_ms)
                return True
            return False
        except (RedisError, OSError) as exc:
            raise StateStoreUnavailable(f"state store unreachable: {exc}") from exc

    async def new_generation(self, owner: str) -> str:
        generation = uuid.uuid4().hex
        try:
            pipe: Any = self.client.pipeline(transaction=True)
            pipe.delete(self.keys["offsets"])
            pipe.hset(self.keys["meta"], "generation", generation)
            await pipe.execute()
        except (RedisError, OSError) as exc:
            raise StateStoreUnavailable(f"state store unreachable: {exc}") from exc
        log.info("log re-seed by %s: state store generation %s", owner, generation)
        return generation

    async def release_reseed(self, owner: str) -> None:
        try:
            held = cast(bytes | None, await self.client.get(self.reseed_key))
            # Get, then delete: a lease that lapsed between the two and was
            # taken by another node goes too, and a third node may re-seed
            # as well: the same events again, which the version rule ignores.
            if held is not None and held.decode() == owner:
                await self.client.delete(self.reseed_key)
        except (RedisError, OSError) as exc:  # the lease lapses by itself
            log.warning("could not release the re-seed lease: %s", exc)

    async def close(self) -> None:
        pass
