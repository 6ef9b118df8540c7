"""Per-client message state: offline queue, inflight window, QoS 2 ids.

Every method that changes a client's state takes the epoch from its session
claim and raises `services.session.api.Fenced` when it is stale. Messages
are `services.mqtt.packets.Message` in their delivered form (QoS and retain
already adjusted per subscription).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from services.mqtt.packets import Message

DEFAULT_QUEUE_LIMIT = 1000  # messages per client, as Mosquitto's max_queued_messages


@dataclass(frozen=True, slots=True)
class Inflight:
    packet_id: int
    message: Message
    dup: bool  # sent before: resend with DUP=1
    released: bool = False  # outgoing QoS 2 after PUBREC: resend PUBREL, not PUBLISH


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    accepted: int
    dropped: int  # dropped by the overflow policy (QoS 0 first, then oldest)


class QueueStore(Protocol):
    async def enqueue(self, items: Sequence[tuple[str, Message]]) -> EnqueueResult:
        """Append each message to its client's queue, durably, in order.
        One round trip for the batch. Returns only once stored."""
        ...

    async def take(self, client_id: str, epoch: int, window: int) -> list[Inflight]:
        """Move messages from the queue into the inflight window until it
        holds `window` entries, assigning packet ids; returns the new ones.
        QoS 0 messages are returned and removed (never held inflight)."""
        ...

    async def pending(self, client_id: str, epoch: int) -> list[Inflight]:
        """Everything inflight, oldest first, for resend after a resume."""
        ...

    async def ack(self, client_id: str, epoch: int, packet_id: int) -> bool:
        """PUBACK / PUBCOMP: drop from inflight. False if unknown."""
        ...

    async def received(self, client_id: str, epoch: int, packet_id: int) -> bool:
        """PUBREC of an outgoing QoS 2 message: keep it as released."""
        ...

    async def incoming_add(self, client_id: str, epoch: int, packet_id: int) -> bool:
        """Incoming QoS 2 PUBLISH: remember the id until PUBREL. False if
        it was already there (a duplicate that must not be routed again)."""
        ...

    async def incoming_release(self, client_id: str, epoch: int, packet_id: int) -> None:
        ...

    async def incoming_ids(self, client_id: str, epoch: int) -> set[int]:
        ...

    async def drops(self, client_id: str) -> int:
        """Messages dropped for this client by the overflow policy, ever."""
        ...

    async def discard(self, client_id: str) -> None:
        """Forget every message and id of this client (session ended)."""
        ...
