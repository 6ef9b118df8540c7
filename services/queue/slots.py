"""A batch of `enqueue_and_take` split by Redis Cluster hash slot.

A script may touch keys of one hash slot only, and a batch's clients (each
its own `{c:<id>}` tag) sit in many. `BySlot` cuts a batch into one
sub-batch per slot and runs them at once (in two phases, below), then
merges their results into the one `TakeResult` the caller expects, with
item indices mapped back to the batch's. A client's items all go to its
own slot's call, so its queue keeps the batch's order.

What a split batch no longer has (one call on a single Redis has it):
- Atomicity across slots. An incoming QoS 2 mark is stored in its
  publisher's slot; the sub-batches of other slots run first, the marked
  slots' after them, so a mark is stored only once every copy of its
  message in another slot is.
  A failure in between (Redis unreachable, a full queue under `refuse`)
  leaves copies stored in the earlier slots while the publisher gets no
  PUBREC (or 0x97): its resend stores them again. On a cluster a Redis
  failure mid-batch is at-least-once, not exactly-once.
- The mark's duplicate check inside the same step. Before any sub-batch
  runs, each publisher's stored ids are read (`incoming_ids`, one call per
  publisher): a resend of a message whose id is stored is left out
  everywhere, as one call would. A duplicate that appears between that read
  and the marked slot's call (the same packet id from the same publisher,
  twice at once) is caught there and left out of that slot only.
- "One publish's copies, all or none" (`together`) across slots: a copy
  refused in the first phase refuses the group's copies in the second, not
  the other way round, nor between slots of one phase.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence

from redis.crc import key_slot

from services.mqtt.packets import Message
from services.queue.api import IncomingMark, Inflight, TakeResult
from services.store.errors import Fenced
from services.store.redis import client_keys

OneSlot = Callable[..., Awaitable[TakeResult]]
Ids = Callable[[str, int], Awaitable[set[int]]]  # a publisher's stored incoming QoS 2 ids


def slot_of(client_id: str) -> int:
    return key_slot(client_keys(client_id)[0])


class BySlot:
    def __init__(
        self,
        items: Sequence[tuple[str, Message]],
        takers: Mapping[str, tuple[int, int]],
        marks: Mapping[IncomingMark, Sequence[int]],
        together: Sequence[Sequence[int]],
    ) -> None:
        self.items, self.takers, self.marks = items, takers, marks
        self.together = [list(g) for g in together if g]
        self._slot: dict[str, int] = {}
        for client_id in [*(c for c, _ in items), *takers, *(m.client_id for m in marks)]:
            if client_id not in self._slot:
                self._slot[client_id] = slot_of(client_id)
        self.slots = len(set(self._slot.values()))

    async def run(self, one_slot: OneSlot, ids: Ids, evicted: bool) -> TakeResult:
        duplicate, fenced_marks, out = await self._known(ids)
        marks = {m: ix for m, ix in self.marks.items() if m not in duplicate | fenced_marks}
        marked = {self._slot[m.client_id] for m in marks}
        slots = sorted(set(self._slot.values()))
        merged = _Merged(duplicate, fenced_marks)
        # The unmarked slots at once, then the marked ones: a mark is stored
        # only after every other slot stored (or refused) its copies.
        for phase in ([s for s in slots if s not in marked], [s for s in slots if s in marked]):
            calls = []
            for slot in phase:
                for group in self.together:  # a copy refused before refuses the rest
                    if merged.refused.intersection(group):
                        merged.refused.update(i for i in group if i not in out)
                mine_marks = {m: ix for m, ix in marks.items() if self._slot[m.client_id] == slot}
                for mark in list(mine_marks):  # a copy refused in an earlier phase
                    if merged.refused.intersection(mine_marks[mark]):
                        merged.refused.update(i for i in mine_marks.pop(mark) if i not in out)
                gone = out | merged.refused
                mine = [i for i, (c, _) in enumerate(self.items)
                        if self._slot[c] == slot and i not in gone]  # fmt: skip
                takers = {c: t for c, t in self.takers.items() if self._slot[c] == slot}
                if mine or takers or mine_marks:
                    calls.append((mine, self._call(one_slot, mine, takers, mine_marks, evicted)))
            results = await asyncio.gather(*(call for _, call in calls), return_exceptions=True)
            for result in results:  # every call has ended: none is left running
                if isinstance(result, BaseException):
                    raise result
            for (mine, _), result in zip(calls, results, strict=True):
                assert isinstance(result, TakeResult)
                merged.add(result, mine)
        return merged.result()

    async def _known(self, ids: Ids) -> tuple[set[IncomingMark], set[IncomingMark], set[int]]:
        """The marks whose id is stored already (a resend), those whose publisher
        is fenced, and the items of both: one `incoming_ids` call per publisher."""
        duplicate: set[IncomingMark] = set()
        fenced: set[IncomingMark] = set()
        out: set[int] = set()
        publishers = sorted({(m.client_id, m.epoch) for m in self.marks})
        found = await asyncio.gather(*(ids(c, e) for c, e in publishers), return_exceptions=True)
        stored: dict[tuple[str, int], set[int] | None] = {}
        for publisher, got in zip(publishers, found, strict=True):
            if isinstance(got, Fenced):
                stored[publisher] = None
            elif isinstance(got, BaseException):
                raise got
            else:
                stored[publisher] = got
        for mark, indices in self.marks.items():
            known = stored[(mark.client_id, mark.epoch)]
            if known is None or mark.packet_id in known:
                (fenced if known is None else duplicate).add(mark)
                out.update(indices)
        return duplicate, fenced, out

    def _call(
        self, one_slot: OneSlot, mine: list[int], takers: Mapping[str, tuple[int, int]],
        marks: Mapping[IncomingMark, Sequence[int]], evicted: bool,
    ) -> Awaitable[TakeResult]:  # fmt: skip
        local = {orig: n for n, orig in enumerate(mine)}
        return one_slot(
            [self.items[i] for i in mine],
            takers,
            {m: [local[i] for i in ix if i in local] for m, ix in marks.items()},
            [kept for g in self.together if (kept := [local[i] for i in g if i in local])],
            evicted,
        )


class _Merged:
    """The sub-batches' results as one, item indices mapped back."""

    def __init__(self, duplicate: set[IncomingMark], fenced_marks: set[IncomingMark]) -> None:
        self.accepted = self.dropped = 0
        self.taken: dict[str, list[Inflight]] = {}
        self.fenced: set[str] = set()
        self.duplicate, self.fenced_marks = duplicate, fenced_marks
        self.refused: set[int] = set()
        self.evicted: list[tuple[str, Message]] = []

    def add(self, result: TakeResult, mine: list[int]) -> None:
        self.accepted += result.accepted
        self.dropped += result.dropped
        self.taken.update(result.taken)
        self.fenced.update(result.fenced)
        self.duplicate.update(result.duplicate_marks)
        self.fenced_marks.update(result.fenced_marks)
        self.refused.update(mine[n] for n in result.refused)
        self.evicted.extend(result.evicted)

    def result(self) -> TakeResult:
        return TakeResult(
            self.accepted, self.dropped, self.taken, frozenset(self.fenced),
            frozenset(self.duplicate), frozenset(self.fenced_marks), frozenset(self.refused),
            tuple(self.evicted),
        )  # fmt: skip
