"""Per-client message state in Redis: one Lua script per atomic step.

The keys are the client's hash-tagged set from `services.store.redis.
client_keys`, so fencing (the session hash's epoch), clean start and expiry
act on them in the same scripts as the session. Messages travel in the
compact form of `services.store.serial`.

Batching: `enqueue` and `enqueue_and_take` send every client of a batch in
ONE script call (8 keys per client, 2 per incoming QoS 2 mark) on a single
Redis (and its replicas). On Redis Cluster a script may touch one hash slot
only, so a batch whose clients sit in several slots is split
(`services.queue.slots`): one call per slot, run at once.
`ack_and_take` pipelines two scripts in one round trip (on a cluster: two
calls, since a cluster pipeline does not re-register scripts). Marks are all or
nothing in the script: when one is refused (a duplicate id, a stale
publisher epoch) nothing is written and the call is repeated without the
refused marks and their messages, at most once per mark.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from services.mqtt.packets import Message
from services.queue.api import (
    DEFAULT_QUEUE_LIMIT,
    EXPIRED_KEPT,
    REFUSE,
    EnqueueResult,
    IncomingMark,
    Inflight,
    TakeResult,
    shifted,
)
from services.queue.slots import BySlot
from services.store.errors import Fenced
from services.store.redis import (
    DEFAULT_TIMEOUT_S,
    FENCED,
    bounded,
    client_keys,
    connect,
    is_cluster,
    load_script,
    pipelined,
    run_script,
)
from services.store.serial import dumps, loads

_S, _Q, _O, _Z, _F, _FO, _X, _R = range(8)


FULL = -2  # enqueue_take.lua: a queue is full, nothing changed


def beyond_fit(items: Sequence[tuple[str, Message]], indices: Sequence[int], fit: int) -> list[int]:
    """Of one client's items (`indices`, in order), its QoS 1/2 ones past the first `fit`."""
    qos12 = [i for i in indices if items[i][1].qos > 0]
    return qos12[fit:]


def _inflight(flat: list[Any], start: int) -> tuple[list[Inflight], int]:
    """Parse `k, (pid, message) * k` from a script's flat reply."""
    count = int(flat[start])
    out = [
        Inflight(int(flat[i]), loads(flat[i + 1]), dup=False)
        for i in range(start + 1, start + 1 + 2 * count, 2)
    ]
    return out, start + 1 + 2 * count


def _evicted(
    flat: list[Any], start: int, items: Sequence[tuple[str, Message]], groups: list[list[int]]
) -> tuple[tuple[str, Message], ...]:
    """The (group number, message) pairs enqueue_take.lua returns after the
    groups: each group's client is that of its first item (a group whose
    queue dropped a message had items)."""
    return tuple(
        (items[groups[int(flat[i]) - 1][0]][0], loads(flat[i + 1]))
        for i in range(start, len(flat), 2)
    )


class RedisQueueStore:
    def __init__(
        self,
        client: aioredis.Redis,
        limit: int = DEFAULT_QUEUE_LIMIT,
        timeout: float = DEFAULT_TIMEOUT_S,
        full: str = REFUSE,
        replicas: int = 0,
    ) -> None:
        self._client = client
        self._limit = limit
        self._refuse = 1 if full == REFUSE else 0  # ARGV 2 of enqueue_take.lua
        self._timeout = timeout
        self._replicas = replicas  # WAIT for this many after each script (--redis-wait)
        self._cluster = is_cluster(client)  # batches split per hash slot
        self._lapsed: deque[tuple[str, Message]] = deque(maxlen=EXPIRED_KEPT)
        self.expired = 0  # messages past their expiry the scripts removed, undelivered

        def script(name: str) -> AsyncScript:
            return load_script(client, "services.queue", name)

        self._enqueue_take = script("enqueue_take.lua")
        self._ack = script("ack.lua")
        self._received = script("received.lua")
        self._pending = script("pending.lua")
        self._incoming_add = script("incoming_add.lua")
        self._incoming_has = script("incoming_has.lua")
        self._incoming_release = script("incoming_release.lua")
        self._incoming_ids = script("incoming_ids.lua")
        self._discard = script("discard.lua")
        self._leftovers = script("leftovers.lua")

    @classmethod
    def from_url(
        cls,
        url: str,
        limit: int = DEFAULT_QUEUE_LIMIT,
        timeout: float = DEFAULT_TIMEOUT_S,
        full: str = REFUSE,
    ) -> RedisQueueStore:
        return cls(connect(url, timeout), limit, timeout, full)

    async def _run(self, script: AsyncScript, keys: Sequence[bytes], args: list[Any]) -> Any:
        return await run_script(script, keys, args, self._timeout, self._replicas)

    async def _fenced_run(
        self, script: AsyncScript, client_id: str, slots: Sequence[int], args: list[Any]
    ) -> Any:
        keys = client_keys(client_id)
        result = await self._run(script, [keys[i] for i in slots], args)
        if result == FENCED:
            raise Fenced(client_id)
        return result

    def _batch(
        self,
        items: Sequence[tuple[str, Message]],
        takers: Mapping[str, tuple[int, int]],
        marks: Sequence[IncomingMark] = (),
        evicted: bool = False,
    ) -> tuple[list[bytes], list[Any], list[str], list[list[int]]]:
        """KEYS and ARGV of enqueue_take.lua: 2 keys (s, r) per mark, 8 per taker,
        4 (s, q, o, z) per other client; a message fanned out to many clients
        is serialized once. Also the takers in ARGV order, and per group (ARGV
        order) the indices in `items` of its messages."""
        groups: dict[str, list[bytes]] = {}
        indices: dict[str, list[int]] = {}
        blobs_by_id: dict[int, bytes] = {}
        for i, (client_id, message) in enumerate(items):
            blob = blobs_by_id.get(id(message))
            if blob is None:
                blob = blobs_by_id[id(message)] = dumps(message)
            groups.setdefault(client_id, []).append(blob)
            indices.setdefault(client_id, []).append(i)
        for client_id in takers:
            groups.setdefault(client_id, [])
        keys: list[bytes] = []
        args: list[Any] = [self._limit, self._refuse, self._returns(evicted), len(marks)]
        for mark in marks:
            publisher = client_keys(mark.client_id)
            keys.extend((publisher[_S], publisher[_R]))
            args.extend((mark.epoch, mark.packet_id))
        order: list[str] = []
        for client_id, blobs in groups.items():
            taker = takers.get(client_id)
            if taker is None:
                keys.extend(client_keys(client_id)[:4])
                args.extend(("-", 0, len(blobs)))
            else:
                keys.extend(client_keys(client_id))
                args.extend((taker[0], taker[1], len(blobs)))
                order.append(client_id)
            args.extend(blobs)
        return keys, args, order, [indices.get(c, []) for c in groups]

    async def enqueue(self, items: Sequence[tuple[str, Message]]) -> EnqueueResult:
        if not items:
            return EnqueueResult(0, 0)
        result = await self.enqueue_and_take(items, {})
        return EnqueueResult(result.accepted, result.dropped, len(result.refused))

    async def enqueue_and_take(
        self,
        items: Sequence[tuple[str, Message]],
        takers: Mapping[str, tuple[int, int]],
        marks: Mapping[IncomingMark, Sequence[int]] | None = None,
        together: Sequence[Sequence[int]] = (),
        evicted: bool = False,
    ) -> TakeResult:
        if self._cluster:
            split = BySlot(items, takers, marks or {}, together)
            if split.slots > 1:
                return await split.run(self._one_slot, self.incoming_ids, evicted)
        return await self._one_slot(items, takers, marks, together, evicted)

    async def _one_slot(
        self,
        items: Sequence[tuple[str, Message]],
        takers: Mapping[str, tuple[int, int]],
        marks: Mapping[IncomingMark, Sequence[int]] | None = None,
        together: Sequence[Sequence[int]] = (),
        evicted: bool = False,
    ) -> TakeResult:
        """`enqueue_and_take` in one script call (a single Redis, or a cluster
        batch within one slot)."""
        left = dict(marks or {})
        groups = [list(g) for g in together if g]
        duplicate: set[IncomingMark] = set()
        fenced: set[IncomingMark] = set()
        refused: set[int] = set()
        alive = list(range(len(items)))  # the original index of each item still in
        while True:  # each repeat has at least one mark or one item fewer
            if not items and not takers and not left:
                return TakeResult(
                    0, 0, {}, frozenset(), frozenset(duplicate), frozenset(fenced),
                    frozenset(refused),
                )  # fmt: skip
            keys, args, order, group_items = self._batch(items, takers, list(left), evicted)
            flat = await self._run(self._enqueue_take, keys, args)
            status = int(flat[0])
            if status >= 0:
                result, end = self._parse_take(flat, order)
                return TakeResult(
                    result.accepted,
                    result.dropped,
                    result.taken,
                    result.fenced,
                    frozenset(duplicate),
                    frozenset(fenced),
                    frozenset(refused),
                    _evicted(flat, end, items, group_items) if evicted else (),
                )
            left_out: set[int] = set()
            if status == FULL:
                for indices, fit in zip(group_items, flat[1:], strict=True):
                    if int(fit) >= 0:
                        left_out.update(beyond_fit(items, indices, int(fit)))
                for group in groups:  # one publish's copies: all or none
                    if left_out.intersection(group):
                        left_out.update(group)
                for mark in [m for m, ix in left.items() if left_out.intersection(ix)]:
                    left_out.update(left.pop(mark))  # a refused copy refuses its mark
                refused.update(alive[i] for i in left_out)
            else:
                for mark, st in zip(list(left), flat[1:], strict=True):
                    if int(st) == 1:
                        continue
                    (duplicate if int(st) == 0 else fenced).add(mark)
                    left_out.update(left.pop(mark))
            alive = [orig for i, orig in enumerate(alive) if i not in left_out]
            items = [item for i, item in enumerate(items) if i not in left_out]
            left = {m: shifted(ix, left_out) for m, ix in left.items()}
            groups = [kept for g in groups if (kept := shifted(g, left_out))]

    @staticmethod
    def _returns(evicted: bool) -> int:
        """ARGV 3 of enqueue_take.lua: which removed messages it returns (those
        past their expiry always: rare, and `take_expired` hands them on)."""
        return (1 if evicted else 0) | 2

    def take_expired(self) -> list[tuple[str, Message]]:
        lapsed = list(self._lapsed)
        self._lapsed.clear()
        return lapsed

    def _parse_take(self, flat: list[Any], order: list[str]) -> tuple[TakeResult, int]:
        """The result, and where in `flat` the dropped messages start (if asked).
        The expired messages (always returned: `_returns`) are kept for `take_expired`."""
        taken: dict[str, list[Inflight]] = {}
        fenced: set[str] = set()
        pos = 3
        for client_id in order:
            if int(flat[pos]) == FENCED:
                fenced.add(client_id)
                pos += 1
            else:
                taken[client_id], pos = _inflight(flat, pos)
        gone = int(flat[2])
        self.expired += gone
        for i in range(pos, pos + 2 * gone, 2):
            self._lapsed.append((order[int(flat[i]) - 1], loads(flat[i + 1])))
        pos += 2 * gone
        return TakeResult(int(flat[0]), int(flat[1]), taken, frozenset(fenced)), pos

    async def take(self, client_id: str, epoch: int, window: int) -> list[Inflight]:
        result = await self.enqueue_and_take((), {client_id: (epoch, window)})
        if client_id in result.fenced:
            raise Fenced(client_id)
        return result.taken[client_id]

    async def pending(self, client_id: str, epoch: int) -> list[Inflight]:
        flat = await self._fenced_run(self._pending, client_id, (_S, _F, _FO, _X), [epoch])
        return [
            Inflight(int(flat[i]), loads(flat[i + 2]), dup=True, released=bool(flat[i + 1]))
            for i in range(0, len(flat), 3)
        ]

    async def ack(self, client_id: str, epoch: int, packet_id: int) -> bool:
        return await self.ack_many(client_id, epoch, (packet_id,)) == 1

    async def ack_many(self, client_id: str, epoch: int, packet_ids: Sequence[int]) -> int:
        args = [epoch, *packet_ids]
        return int(await self._fenced_run(self._ack, client_id, (_S, _F, _FO, _X), args))

    async def ack_and_take(
        self, client_id: str, epoch: int, packet_ids: Sequence[int], window: int
    ) -> list[Inflight]:
        if self._cluster:
            await self.ack_many(client_id, epoch, packet_ids)
            return await self.take(client_id, epoch, window)
        keys = client_keys(client_id)
        args = [self._limit, self._refuse, self._returns(False), 0, epoch, window, 0]
        acked, flat = await pipelined(self._client, (
            (self._ack, [keys[i] for i in (_S, _F, _FO, _X)], [epoch, *packet_ids]),
            (self._enqueue_take, keys, args),
        ), self._timeout)  # fmt: skip
        if isinstance(acked, NoScriptError) or isinstance(flat, NoScriptError):
            # Redis lost its scripts: whatever ran, ack, then take again (a take
            # that ran before the ack may have taken messages: they are taken)
            taken = [] if isinstance(flat, NoScriptError) else self._taken_by(flat, client_id)
            if isinstance(acked, NoScriptError):
                await self.ack_many(client_id, epoch, packet_ids)
            return taken + await self.take(client_id, epoch, window)
        if acked == FENCED:
            raise Fenced(client_id)
        return self._taken_by(flat, client_id)

    def _taken_by(self, flat: list[Any], client_id: str) -> list[Inflight]:
        """One taker's answer of enqueue_take.lua."""
        result, _ = self._parse_take(flat, [client_id])
        if client_id in result.fenced:
            raise Fenced(client_id)
        return result.taken[client_id]

    async def received(self, client_id: str, epoch: int, packet_id: int) -> bool:
        return await self.received_many(client_id, epoch, (packet_id,)) == 1

    async def received_many(self, client_id: str, epoch: int, packet_ids: Sequence[int]) -> int:
        args = [epoch, *packet_ids]
        return int(await self._fenced_run(self._received, client_id, (_S, _F, _X), args))

    async def incoming_add(self, client_id: str, epoch: int, packet_id: int) -> bool:
        args = [epoch, packet_id]
        return bool(await self._fenced_run(self._incoming_add, client_id, (_S, _R), args))

    async def incoming_has(self, client_id: str, epoch: int, packet_id: int) -> bool:
        args = [epoch, packet_id]
        return bool(await self._fenced_run(self._incoming_has, client_id, (_S, _R), args))

    async def incoming_release(self, client_id: str, epoch: int, packet_id: int) -> None:
        await self._fenced_run(self._incoming_release, client_id, (_S, _R), [epoch, packet_id])

    async def incoming_ids(self, client_id: str, epoch: int) -> set[int]:
        ids = await self._fenced_run(self._incoming_ids, client_id, (_S, _R), [epoch])
        return {int(i) for i in ids}

    async def drops(self, client_id: str) -> int:
        value = await bounded(self._client.hget(client_keys(client_id)[_S], "drops"), self._timeout)
        return int(value or 0)

    async def discard(self, client_id: str, epoch: int | None = None) -> None:
        await self._run(self._discard, client_keys(client_id), ["-" if epoch is None else epoch])

    async def leftovers(self, client_id: str) -> list[Message]:
        blobs = await self._run(self._leftovers, client_keys(client_id), [])
        return [loads(blob) for blob in blobs]

    async def close(self) -> None:
        await self._client.aclose()
