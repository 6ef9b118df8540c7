"""A client's session as this node holds it, and one subscription's options."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.node.connection import Connection


@dataclass(frozen=True, slots=True)
class SubOptions:
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    subscription_id: int | None = None
    sub_ids: tuple[int, ...] = ()  # (subscription_id,) or (): ready for the PUBLISH

    @classmethod
    def of(
        cls, qos: int, no_local: bool, retain_as_published: bool, subscription_id: int | None
    ) -> SubOptions:
        ids = (subscription_id,) if subscription_id else ()
        return cls(qos, no_local, retain_as_published, subscription_id, ids)


class Session:
    """A client's session on this node; outlives connections when persistent."""

    __slots__ = (
        "acks",
        "backlog",
        "client_id",
        "conn",
        "dirty",
        "durable",
        "epoch",
        "expiry_handle",
        "expiry_s",
        "ops",
        "pumping",
        "ready",
        "subs",
    )

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.conn: Connection | None = None
        self.epoch = 0
        self.durable = False  # claimed in the durable (Redis) tier
        self.expiry_s = 0
        self.subs: dict[str, SubOptions] = {}
        self.expiry_handle: asyncio.TimerHandle | None = None
        self.ready = False  # CONNACK sent and inflight resent: deliveries may flow
        self.pumping = False
        self.dirty = False
        self.acks: list[int] = []
        self.backlog = 0  # queued for this online session, not yet taken (approximate)
        self.ops: list[tuple[str, int]] = []  # ("received" | "released", packet id)
