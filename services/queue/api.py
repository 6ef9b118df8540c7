"""Per-client message state: offline queue, inflight window, QoS 2 ids.

The queue bound and what happens at it (`QueueFull`): QoS 0 messages are
dropped first (oldest first, counted in `drops`). Then, under `REFUSE` (what
persistent sessions use), a QoS 1/2 message that would still not fit is
refused: none of its copies in the batch is stored, and the caller must not
acknowledge it to its publisher, so nothing acknowledged is ever dropped.
Under `DROP_OLDEST` (EMQX's policy) the oldest queued messages make room,
counted in `drops`.

Every method that changes a client's state takes the epoch from its session
claim and raises `services.store.errors.Fenced` when it is stale. Messages
are `services.mqtt.packets.Message` in their delivered form (QoS and retain
already adjusted per subscription).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Final, Protocol

from services.mqtt.packets import Message
from services.mqtt.values import value

DEFAULT_QUEUE_LIMIT = 1000  # messages per client, as Mosquitto's max_queued_messages
REFUSE = "refuse"  # at the bound, QoS 1/2 messages are refused (not acknowledged)
DROP_OLDEST = "drop_oldest"  # at the bound, the oldest queued messages are dropped
QUEUE_FULL_POLICIES = (REFUSE, DROP_OLDEST)
MAX_PACKET_ID = 65535  # packet ids run 1..65535, then wrap (MQTT 2.2.1)


def shifted(indices: Sequence[int], gone: set[int]) -> list[int]:
    """Indices into a batch's items after the items at `gone` were taken out."""
    ordered = sorted(gone)
    return [i - bisect.bisect_left(ordered, i) for i in indices if i not in gone]


@value
class Inflight:
    packet_id: int
    message: Message
    dup: bool  # sent before: resend with DUP=1
    released: bool = False  # outgoing QoS 2 after PUBREC: resend PUBREL, not PUBLISH


@value
class EnqueueResult:
    accepted: int
    dropped: int  # dropped by the overflow policy (QoS 0 first, then oldest)
    refused: int = 0  # QoS 1/2 copies not stored: a full queue under REFUSE


@value
class IncomingMark:
    """An incoming QoS 2 packet id of `client_id` (publisher) to remember until
    PUBREL in the same atomic step that enqueues its message."""

    client_id: str
    epoch: int  # the publisher's session epoch
    packet_id: int


@value
class TakeResult:
    """What `enqueue_and_take` did: the enqueue counts, plus per taking client
    the messages moved into its inflight window (as `take` returns them)."""

    accepted: int
    dropped: int
    taken: dict[str, list[Inflight]]
    fenced: frozenset[str]  # takers whose epoch was stale: enqueued, nothing taken
    duplicate_marks: frozenset[IncomingMark] = frozenset()  # id known: its items left out
    fenced_marks: frozenset[IncomingMark] = frozenset()  # publisher epoch stale: left out
    refused: frozenset[int] = frozenset()  # indices in `items` a full queue refused (REFUSE)
    # (client id, message) the bound dropped, oldest first per client: only when asked
    evicted: tuple[tuple[str, Message], ...] = ()


EXPIRED_KEPT: Final = 10_000  # expired messages a store keeps for `take_expired`, newest


class QueueStore(Protocol):
    def take_expired(self) -> list[tuple[str, Message]]:
        """The (client id, message) of each queued message a take removed as past
        its expiry since the last call (at most EXPIRED_KEPT, the newest), once:
        the node's message.dropped hook, reason "expired"."""
        ...

    @property
    def expired(self) -> int:
        """Messages past their Message Expiry this store removed instead of
        delivering them (this process's calls), ever: the node folds it into
        its figures when they are read."""
        ...

    async def enqueue(self, items: Sequence[tuple[str, Message]]) -> EnqueueResult:
        """Append each message to its client's queue, durably, in order.
        One round trip for the batch. Returns only once stored."""
        ...

    async def take(self, client_id: str, epoch: int, window: int) -> list[Inflight]:
        """Move messages from the queue into the inflight window until it
        holds `window` entries, assigning packet ids; returns the new ones.
        QoS 0 messages are returned and removed (never held inflight), with
        packet_id 0. Messages past `expires_at_ms` are removed, not returned."""
        ...

    async def enqueue_and_take(
        self,
        items: Sequence[tuple[str, Message]],
        takers: Mapping[str, tuple[int, int]],
        marks: Mapping[IncomingMark, Sequence[int]] | None = None,
        together: Sequence[Sequence[int]] = (),
        evicted: bool = False,
    ) -> TakeResult:
        """`enqueue(items)`, then `take(client, epoch, window)` for every
        `takers[client] = (epoch, window)` (the online local subscribers),
        in one round trip. A stale taker epoch does not fail the batch: the
        client is listed in `fenced` and gets nothing taken.

        `marks[mark]` lists the indices in `items` of the copies of one
        incoming QoS 2 message (maybe none). Each mark's packet id is added
        to its publisher's incoming ids in the same atomic step that
        enqueues those items, so a crash keeps both or neither. A mark whose
        id is already there (`duplicate_marks`) or whose publisher epoch is
        stale (`fenced_marks`) is not added and its items are left out
        (neither accepted nor dropped). A store made of tiers is atomic per
        tier: a mark with the items in its publisher's tier
        (`services.broker.stores`).

        Under REFUSE, a client's new QoS 1/2 messages fit while its queued
        QoS 1/2 messages plus them stay within the bound, counting a taker's
        free window slots as room (`limit - queued QoS 1/2 + window room`);
        the later ones are refused: not stored, their indices in `refused`.
        A refused copy of a marked message (incoming QoS 2) refuses every
        copy of that mark and the mark is not added, so the publisher's
        resend is routed afresh and no QoS 2 subscriber gets it twice.
        Likewise each group of indices in `together` (the copies of one QoS
        1/2 PUBLISH) is stored all or nothing: a copy refused for one full
        queue refuses every copy of the group (all in `refused`), so the
        publisher, answered "quota exceeded", resends to nobody twice.

        With `evicted`, the result also lists each message the bound dropped
        (queued QoS 0 ones first, then under DROP_OLDEST the oldest) with its
        client, so the message.dropped hook can be told which; without it
        only their count (`dropped`) comes back, at no cost."""
        ...

    async def pending(self, client_id: str, epoch: int) -> list[Inflight]:
        """Everything inflight, oldest first, for resend after a resume."""
        ...

    async def ack(self, client_id: str, epoch: int, packet_id: int) -> bool:
        """PUBACK / PUBCOMP: drop from inflight. False if unknown."""
        ...

    async def ack_many(self, client_id: str, epoch: int, packet_ids: Sequence[int]) -> int:
        """`ack` for several ids in one round trip; returns how many were known."""
        ...

    async def ack_and_take(
        self, client_id: str, epoch: int, packet_ids: Sequence[int], window: int
    ) -> list[Inflight]:
        """`ack_many`, then `take`, in one round trip."""
        ...

    async def received(self, client_id: str, epoch: int, packet_id: int) -> bool:
        """PUBREC of an outgoing QoS 2 message: keep it as released."""
        ...

    async def received_many(self, client_id: str, epoch: int, packet_ids: Sequence[int]) -> int:
        """`received` for several ids in one round trip; returns how many were known."""
        ...

    async def incoming_add(self, client_id: str, epoch: int, packet_id: int) -> bool:
        """Incoming QoS 2 PUBLISH: remember the id until PUBREL. False if
        it was already there (a duplicate that must not be routed again)."""
        ...

    async def incoming_has(self, client_id: str, epoch: int, packet_id: int) -> bool:
        """Read only: is this incoming QoS 2 id awaiting PUBREL (a resend)?"""
        ...

    async def incoming_release(self, client_id: str, epoch: int, packet_id: int) -> None:
        ...

    async def incoming_ids(self, client_id: str, epoch: int) -> set[int]:
        ...

    async def drops(self, client_id: str) -> int:
        """Messages dropped for this client by the overflow policy, ever."""
        ...

    async def leftovers(self, client_id: str) -> list[Message]:
        """The shared QoS 1/2 copies (`Message.share`) an expired session left
        unacknowledged, inflight (not yet PUBREC'd) then queued, removed as they
        are returned: once, to one caller. A session's message state outlives
        it by LEFTOVER_GRACE (services.store), so the node that logs its expiry
        can hand them to other members; empty after that, or if the client
        has a session again."""
        ...

    async def discard(self, client_id: str, epoch: int | None = None) -> None:
        """Forget every message and id of this client (session ended). With
        `epoch`, only if it is still current: a node cleaning up after its own
        session must pass it, or it may wipe a newer owner's state (no-op then)."""
        ...

    async def close(self) -> None:
        ...
