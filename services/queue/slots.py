"""A batch of `enqueue_and_take` split by Redis Cluster hash slot.

A script may touch keys of one hash slot only, and a batch's clients (each
its own `{c:<id>}` tag) sit in many. `BySlot` cuts a batch into one
sub-batch per slot and runs them one after the other, then merges their
results into the one `TakeResult` the caller expects, with item indices
mapped back to the batch's.

What a split batch no longer has (one call on a single Redis has it):
- Atomicity across slots. An incoming QoS 2 mark is stored in its
  publisher's slot; the sub-batches of other slots run first, the marked
  slot's last, so a mark is stored only once every copy of its message is.
  A failure in between (Redis unreachable, a full queue under `refuse`)
  leaves copies stored in the earlier slots while the publisher gets no
  PUBREC (or 0x97): its resend stores them again. On a cluster a Redis
  failure mid-batch is at-least-once, not exactly-once.
- The mark's duplicate check inside the same step. Before any sub-batch
  runs, each mark is read (`incoming_has`): a resend of a message whose id
  is stored is left out everywhere, as one call would. A duplicate that
  appears between that read and the marked slot's call (the same packet id
  from the same publisher, twice at once) is caught there and left out of
  that slot only.
- "One publish's copies, all or none" (`together`) across slots: a copy
  refused in one slot refuses the group's copies in the slots after it,
  not those before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from redis.crc import key_slot

from services.mqtt.packets import Message
from services.queue.api import IncomingMark, Inflight, TakeResult
from services.store.errors import Fenced
from services.store.redis import client_keys

OneSlot = Callable[..., Awaitable[TakeResult]]
Has = Callable[[str, int, int], Awaitable[bool]]


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

    async def run(self, one_slot: OneSlot, has: Has, evicted: bool) -> TakeResult:
        duplicate: set[IncomingMark] = set()
        fenced_marks: set[IncomingMark] = set()
        out: set[int] = set()  # items left out: their mark was refused
        for mark, indices in self.marks.items():
            try:
                known = await has(mark.client_id, mark.epoch, mark.packet_id)
            except Fenced:
                fenced_marks.add(mark)
                out.update(indices)
                continue
            if known:
                duplicate.add(mark)
                out.update(indices)
        marks = {m: ix for m, ix in self.marks.items() if m not in duplicate | fenced_marks}
        marked = {self._slot[m.client_id] for m in marks}
        order = sorted(set(self._slot.values()), key=lambda s: (s in marked, s))
        accepted = dropped = 0
        taken: dict[str, list[Inflight]] = {}
        fenced: set[str] = set()
        refused: set[int] = set()
        dropped_msgs: list[tuple[str, Message]] = []
        for slot in order:
            for group in self.together:  # a copy refused before refuses the rest
                if refused.intersection(group):
                    refused.update(i for i in group if i not in out)
            slot_marks = {m: ix for m, ix in marks.items() if self._slot[m.client_id] == slot}
            for mark in list(slot_marks):  # a copy refused in an earlier slot
                if refused.intersection(slot_marks[mark]):
                    refused.update(i for i in slot_marks.pop(mark) if i not in out)
            mine = [i for i, (c, _) in enumerate(self.items)
                    if self._slot[c] == slot and i not in out and i not in refused]  # fmt: skip
            local = {orig: n for n, orig in enumerate(mine)}
            takers = {c: t for c, t in self.takers.items() if self._slot[c] == slot}
            if not mine and not takers and not slot_marks:
                continue
            result = await one_slot(
                [self.items[i] for i in mine],
                takers,
                {m: [local[i] for i in ix if i in local] for m, ix in slot_marks.items()},
                [kept for g in self.together if (kept := [local[i] for i in g if i in local])],
                evicted,
            )
            accepted += result.accepted
            dropped += result.dropped
            taken.update(result.taken)
            fenced.update(result.fenced)
            duplicate.update(result.duplicate_marks)
            fenced_marks.update(result.fenced_marks)
            refused.update(mine[n] for n in result.refused)
            dropped_msgs.extend(result.evicted)
        return TakeResult(
            accepted, dropped, taken, frozenset(fenced), frozenset(duplicate),
            frozenset(fenced_marks), frozenset(refused), tuple(dropped_msgs),
        )  # fmt: skip
