"""Two tiers of session and queue state: memory for clean sessions, Redis for persistent ones.

Theory of operation. A clean session (3.1.1 clean_session=1, MQTT 5 session
expiry 0) lives and dies with its connection, so its claim, inflight window
and queue stay in this process's memory stores and keep working while Redis
is down. A persistent session (expiry > 0) is claimed in the durable store
(Redis), and every later call for that client goes there. `claim` decides
the tier from (clean_start, expiry_s) and remembers it per client id
(`durable`); `mark_durable` does the same for sessions found in the event
log at node start. Epochs are per tier; a client that switches tier is
claimed afresh in the new one (its durable state, if any, is discarded first, so the claim
can name the node that had it; if Redis is down, in the background, best
effort).

`enqueue_and_take` splits a batch by tier. The memory part is stored first
and always delivered; if the durable part fails, `DurablePartFailed`
carries the memory part's result so the node can still send it while
failing the publishers' acknowledgements.

Incoming QoS 2 marks go to their publisher's tier, each with the indices of
its copies in that tier's part, so a persistent publisher's id is stored in
the same Redis script as its persistent subscribers' copies. A memory-tier
mark is checked first (with the memory part): when it is refused, its
copies for durable subscribers are left out too; when the durable part then
fails, its id is forgotten again (the publisher is told the message failed).
The copies of one QoS 1/2 PUBLISH (`together`) are all or nothing within
each tier, and a memory-tier refusal leaves the durable copies out too; a
durable refusal cannot recall the copies the memory tier (clean sessions,
whose queues drop the oldest rather than refuse) already took, so those
subscribers may see the publisher's resend twice. A durable mark refused by
Redis cannot recall copies the memory part already took; the node's
read-only check before routing keeps that case to a race the channel
already excludes (one route per packet id at a time).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Mapping, Sequence

from services.mqtt.packets import Message
from services.queue.api import (
    EnqueueResult,
    IncomingMark,
    Inflight,
    QueueStore,
    TakeResult,
    shifted,
)
from services.session.api import (
    Adopted,
    Claim,
    SessionError,
    SessionInfo,
    SessionStore,
    StoreUnavailable,
)

log = logging.getLogger("weir.stores")


class DurablePartFailed(StoreUnavailable):
    """The durable half of a batch failed; `result` is what the memory half did."""

    def __init__(self, message: str, result: TakeResult) -> None:
        super().__init__(message)
        self.result = result


class Tiers:
    """Which clients live in the durable tier (shared by the two routers)."""

    def __init__(self) -> None:
        self.durable: set[str] = set()


class TieredSessionStore:
    def __init__(self, memory: SessionStore, durable: SessionStore, tiers: Tiers) -> None:
        self.memory = memory
        self.durable = durable
        self.tiers = tiers
        self._cleanup: set[asyncio.Task[None]] = set()

    def _of(self, client_id: str) -> SessionStore:
        return self.durable if client_id in self.tiers.durable else self.memory

    def mark_durable(self, client_id: str) -> None:
        self.tiers.durable.add(client_id)

    async def claim(self, client_id: str, node: str, clean_start: bool, expiry_s: int) -> Claim:
        if expiry_s > 0 or (not clean_start and await self._durable_exists(client_id)):
            claim = await self.durable.claim(client_id, node, clean_start, expiry_s)
            self.tiers.durable.add(client_id)
            return claim
        previous: str | None = None
        if client_id in self.tiers.durable:
            self.tiers.durable.discard(client_id)
            try:  # the durable claim says which node had it (a takeover to announce)
                previous = await self._discard_durable(client_id, node)
            except SessionError as exc:  # Redis down: discard later, best effort
                log.warning("durable session of %s not discarded yet: %s", client_id, exc)
                task = asyncio.get_running_loop().create_task(self._discard_later(client_id, node))
                self._cleanup.add(task)
                task.add_done_callback(self._cleanup.discard)
        claim = await self.memory.claim(client_id, node, clean_start, expiry_s)
        if previous is not None and claim.previous_node is None:
            claim = dataclasses.replace(claim, previous_node=previous)
        return claim

    async def _durable_exists(self, client_id: str) -> bool:
        """Whether Clean Start 0 with expiry 0 has a durable session to resume
        [MQTT-3.1.2-4]: one this node knows of, or one Redis holds (claimed on
        another node moments ago). Redis down and none known: none to resume."""
        if client_id in self.tiers.durable:
            return True
        try:
            return await self.durable.get(client_id) is not None
        except StoreUnavailable:
            return False

    async def _discard_durable(self, client_id: str, node: str) -> str | None:
        """End the client's durable session; the node that had it online, if any."""
        claim = await self.durable.claim(client_id, node, True, 0)
        await self.durable.release(client_id, claim.epoch, 0)
        return claim.previous_node

    async def _discard_later(self, client_id: str, node: str) -> None:
        try:
            await self._discard_durable(client_id, node)
        except SessionError as exc:
            log.warning("could not discard the durable session of %s: %s", client_id, exc)

    async def release(self, client_id: str, epoch: int, expiry_s: int) -> None:
        await self._of(client_id).release(client_id, epoch, expiry_s)

    async def next_version(self, client_id: str, epoch: int) -> int:
        return await self._of(client_id).next_version(client_id, epoch)

    async def next_topic_version(self, topic: str) -> int:
        try:
            return await self.durable.next_topic_version(topic)
        except StoreUnavailable:
            return await self.memory.next_topic_version(topic)  # a hybrid clock too

    async def get(self, client_id: str) -> SessionInfo | None:
        return await self._of(client_id).get(client_id)

    async def orphans(self, node: str) -> list[str]:
        """A dead node's persistent sessions (its clean ones died with its memory)."""
        return await self.durable.orphans(node)

    async def adopt(self, client_id: str, dead: str) -> Adopted | None:
        adopted = await self.durable.adopt(client_id, dead)
        if adopted is not None and adopted.expiry_s > 0:
            self.tiers.durable.add(client_id)
        return adopted

    async def close(self) -> None:
        for task in list(self._cleanup):
            task.cancel()
        await self.memory.close()
        await self.durable.close()


def _one_tier(
    durable: set[str],
    items: Sequence[tuple[str, Message]],
    takers: Mapping[str, tuple[int, int]],
    marks: Mapping[IncomingMark, Sequence[int]] | None,
) -> bool | None:
    """True: the batch touches only durable clients; False: only memory ones;
    None: both (most batches are one or the other: persistent sessions publish
    to persistent subscribers, clean ones to clean ones)."""
    tiers = {client_id in durable for client_id, _ in items}
    tiers.update(client_id in durable for client_id in takers)
    tiers.update(mark.client_id in durable for mark in marks or ())
    return tiers.pop() if len(tiers) == 1 else (None if tiers else False)


def _merge(a: TakeResult, b: TakeResult, refused: set[int]) -> TakeResult:
    """The two tiers' results; `refused` in indices of the whole batch."""
    return TakeResult(
        accepted=a.accepted + b.accepted,
        dropped=a.dropped + b.dropped,
        taken={**a.taken, **b.taken},
        fenced=a.fenced | b.fenced,
        duplicate_marks=a.duplicate_marks | b.duplicate_marks,
        fenced_marks=a.fenced_marks | b.fenced_marks,
        refused=frozenset(refused),
        evicted=a.evicted + b.evicted,
    )


Part = list[tuple[str, Message]]


class TieredQueueStore:
    def __init__(self, memory: QueueStore, durable: QueueStore, tiers: Tiers) -> None:
        self.memory = memory
        self.durable = durable
        self.tiers = tiers

    def _of(self, client_id: str) -> QueueStore:
        return self.durable if client_id in self.tiers.durable else self.memory

    @property
    def expired(self) -> int:
        return self.memory.expired + self.durable.expired

    def take_expired(self) -> list[tuple[str, Message]]:
        return self.memory.take_expired() + self.durable.take_expired()

    def _split(
        self, items: Sequence[tuple[str, Message]]
    ) -> tuple[list[tuple[str, Message]], list[tuple[str, Message]]]:
        durable = self.tiers.durable
        mem: list[tuple[str, Message]] = []
        dur: list[tuple[str, Message]] = []
        for item in items:
            (dur if item[0] in durable else mem).append(item)
        return mem, dur

    async def enqueue(self, items: Sequence[tuple[str, Message]]) -> EnqueueResult:
        mem, dur = self._split(items)
        a = await self.memory.enqueue(mem) if mem else EnqueueResult(0, 0)
        b = await self.durable.enqueue(dur) if dur else EnqueueResult(0, 0)
        return EnqueueResult(
            a.accepted + b.accepted, a.dropped + b.dropped, a.refused + b.refused
        )

    async def enqueue_and_take(
        self,
        items: Sequence[tuple[str, Message]],
        takers: Mapping[str, tuple[int, int]],
        marks: Mapping[IncomingMark, Sequence[int]] | None = None,
        together: Sequence[Sequence[int]] = (),
        evicted: bool = False,
    ) -> TakeResult:
        durable = self.tiers.durable
        whole = _one_tier(durable, items, takers, marks) if durable else False
        if whole is False:
            return await self.memory.enqueue_and_take(items, takers, marks, together, evicted)
        if whole is True:  # what the split below comes to when nothing is in memory
            try:
                return await self.durable.enqueue_and_take(items, takers, marks, together, evicted)
            except SessionError as exc:
                raise DurablePartFailed(str(exc), TakeResult(0, 0, {}, frozenset())) from exc
        mem: Part = []
        dur: Part = []
        where: list[tuple[bool, int]] = []  # per item: (durable, index in its part)
        for item in items:
            part = dur if item[0] in durable else mem
            where.append((part is dur, len(part)))
            part.append(item)
        mem_marks: dict[IncomingMark, list[int]] = {}
        dur_marks: dict[IncomingMark, list[int]] = {}
        for mark, indices in (marks or {}).items():
            in_dur = mark.client_id in durable
            mine = [where[i][1] for i in indices if where[i][0] == in_dur]
            (dur_marks if in_dur else mem_marks)[mark] = mine
        mem_groups = [[where[i][1] for i in g if not where[i][0]] for g in together]
        dur_groups = [[where[i][1] for i in g if where[i][0]] for g in together]
        mem_takers = {c: t for c, t in takers.items() if c not in durable}
        dur_takers = {c: t for c, t in takers.items() if c in durable}
        empty = TakeResult(0, 0, {}, frozenset())
        a = (
            await self.memory.enqueue_and_take(mem, mem_takers, mem_marks, mem_groups, evicted)
            if mem or mem_takers or mem_marks
            else empty
        )
        mem_orig = [i for i, (d, _) in enumerate(where) if not d]  # part index -> item index
        dur_orig = [i for i, (d, _) in enumerate(where) if d]
        refused_items = {mem_orig[i] for i in a.refused}
        full_marks = {m for m, ix in mem_marks.items() if a.refused.intersection(ix)}
        refused = a.duplicate_marks | a.fenced_marks | full_marks
        full_groups = [
            g for g, mine in zip(together, mem_groups, strict=True) if a.refused.intersection(mine)
        ]
        if (refused and marks is not None) or full_groups:
            gone = {where[i][1] for m in refused for i in (marks or {})[m] if where[i][0]}
            gone.update(where[i][1] for g in full_groups for i in g if where[i][0])
            refused_items.update(i for m in full_marks for i in (marks or {})[m])
            refused_items.update(i for g in full_groups for i in g)
            dur = [item for i, item in enumerate(dur) if i not in gone]
            dur_orig = [o for i, o in enumerate(dur_orig) if i not in gone]
            dur_marks = {m: shifted(ix, gone) for m, ix in dur_marks.items()}
            dur_groups = [shifted(g, gone) for g in dur_groups]
        if not (dur or dur_takers or dur_marks):
            return _merge(a, empty, refused_items)
        try:
            b = await self.durable.enqueue_and_take(
                dur, dur_takers, dur_marks, dur_groups, evicted
            )
        except SessionError as exc:
            for mark in mem_marks.keys() - refused:
                with contextlib.suppress(SessionError):
                    await self.memory.incoming_release(mark.client_id, mark.epoch, mark.packet_id)
            raise DurablePartFailed(str(exc), a) from exc
        durable_refused = {dur_orig[i] for i in b.refused}
        if durable_refused and marks is not None:
            for mark in mem_marks.keys() - refused:  # its publisher resends: route it afresh
                if durable_refused.intersection(marks[mark]):
                    with contextlib.suppress(SessionError):
                        await self.memory.incoming_release(
                            mark.client_id, mark.epoch, mark.packet_id
                        )
        return _merge(a, b, refused_items | durable_refused)

    async def take(self, client_id: str, epoch: int, window: int) -> list[Inflight]:
        return await self._of(client_id).take(client_id, epoch, window)

    async def pending(self, client_id: str, epoch: int) -> list[Inflight]:
        return await self._of(client_id).pending(client_id, epoch)

    async def ack(self, client_id: str, epoch: int, packet_id: int) -> bool:
        return await self._of(client_id).ack(client_id, epoch, packet_id)

    async def ack_many(self, client_id: str, epoch: int, packet_ids: Sequence[int]) -> int:
        return await self._of(client_id).ack_many(client_id, epoch, packet_ids)

    async def ack_and_take(
        self, client_id: str, epoch: int, packet_ids: Sequence[int], window: int
    ) -> list[Inflight]:
        return await self._of(client_id).ack_and_take(client_id, epoch, packet_ids, window)

    async def received(self, client_id: str, epoch: int, packet_id: int) -> bool:
        return await self._of(client_id).received(client_id, epoch, packet_id)

    async def received_many(self, client_id: str, epoch: int, packet_ids: Sequence[int]) -> int:
        return await self._of(client_id).received_many(client_id, epoch, packet_ids)

    async def incoming_add(self, client_id: str, epoch: int, packet_id: int) -> bool:
        return await self._of(client_id).incoming_add(client_id, epoch, packet_id)

    async def incoming_has(self, client_id: str, epoch: int, packet_id: int) -> bool:
        return await self._of(client_id).incoming_has(client_id, epoch, packet_id)

    async def incoming_release(self, client_id: str, epoch: int, packet_id: int) -> None:
        await self._of(client_id).incoming_release(client_id, epoch, packet_id)

    async def incoming_ids(self, client_id: str, epoch: int) -> set[int]:
        return await self._of(client_id).incoming_ids(client_id, epoch)

    async def drops(self, client_id: str) -> int:
        return await self._of(client_id).drops(client_id)

    async def leftovers(self, client_id: str) -> list[Message]:
        """From either tier: an expired session's tier is no longer known."""
        return [*await self.durable.leftovers(client_id), *await self.memory.leftovers(client_id)]

    async def discard(self, client_id: str, epoch: int | None = None) -> None:
        await self._of(client_id).discard(client_id, epoch)

    async def close(self) -> None:
        await self.memory.close()
        await self.durable.close()
