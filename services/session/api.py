"""Session ownership: who owns a client's session, under which epoch.

The epoch is a fencing token. `claim` increments it atomically; every later
write for that client (here and in `services.queue`) names the epoch it
believes it holds and fails with `Fenced` when a newer owner exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from services.store.errors import Fenced, SessionError, StoreUnavailable

__all__ = [
    "Claim",
    "Fenced",
    "SessionError",
    "SessionInfo",
    "SessionStore",
    "StoreUnavailable",
]


@dataclass(frozen=True, slots=True)
class Claim:
    client_id: str
    epoch: int
    session_present: bool  # an earlier, unexpired, non-clean session was resumed
    previous_node: str | None  # the node that owned it before (takeover), if any


@dataclass(frozen=True, slots=True)
class SessionInfo:
    client_id: str
    node: str | None  # None while offline
    epoch: int
    expiry_s: int
    online: bool


class SessionStore(Protocol):
    async def claim(
        self, client_id: str, node: str, clean_start: bool, expiry_s: int
    ) -> Claim:
        """Own the session: epoch + 1. With clean_start, the old session's
        queue, inflight and QoS 2 state are discarded in the same step."""
        ...

    async def release(self, client_id: str, epoch: int, expiry_s: int) -> None:
        """The connection ended: mark offline, keep state for expiry_s
        (0 discards it now). Raises Fenced if epoch is not current."""
        ...

    async def next_version(self, client_id: str, epoch: int) -> int:
        """The next per-client event version, after checking the epoch.
        Epochs and versions only grow, even across a discarded and recreated
        session (they are hybrid logical clocks: max(last + 1, now in us))."""
        ...

    async def next_topic_version(self, topic: str) -> int:
        """The next event version of a retained topic (no epoch: any node may
        set or clear a retained message)."""
        ...

    async def get(self, client_id: str) -> SessionInfo | None:
        ...

    def mark_durable(self, client_id: str) -> None:
        """A persistent session found in the event log: a store made of tiers
        keeps this client's later calls in its durable tier; others ignore it."""
        ...

    async def close(self) -> None:
        ...
