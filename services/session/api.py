"""Session ownership: who owns a client's session, under which epoch; and wills.

The epoch is a fencing token. `claim` increments it atomically; every later
write for that client (here and in `services.queue`) names the epoch it
believes it holds and fails with `Fenced` when a newer owner exists.

A node that dies leaves its sessions "online" under its name: a survivor
finds them (`orphans`) and `adopt`s each, which ends the connection the dead
node had (epoch + 1, so a late write of the dead node fails) exactly once.

Wills (`WillStore`) live beside the session, one per client, tagged with the
token of the connection that set it: whoever removes it with `take` (the
owner when the connection ends or the will delay passes) or gets it back
from `put` (a new connection of the client) or `adopt` (a survivor of the
owner's node) is the one node that publishes it, so a will goes out once
cluster-wide whatever races or dies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from services.store.errors import Fenced, SessionError, StoreUnavailable

__all__ = [
    "Adopted",
    "Claim",
    "Fenced",
    "SessionError",
    "SessionInfo",
    "SessionStore",
    "StoreUnavailable",
    "StoredWill",
    "WillStore",
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


@dataclass(frozen=True, slots=True)
class Adopted:
    """A dead node's session, now offline under `epoch`; `version` is the next
    event version (for its SessionClosed)."""

    client_id: str
    epoch: int
    version: int
    expiry_s: int


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

    async def orphans(self, node: str) -> list[str]:
        """The clients whose session `node` holds online (for node death: the
        work is proportional to that node's clients, not to all)."""
        ...

    async def adopt(self, client_id: str, dead: str) -> Adopted | None:
        """End the connection the dead node `dead` had: if the session is still
        online there, take it offline under epoch + 1 and keep it for its expiry
        (0: discard it now). None if it is not (resumed or ended meanwhile)."""
        ...

    def mark_durable(self, client_id: str) -> None:
        """A persistent session found in the event log: a store made of tiers
        keeps this client's later calls in its durable tier; others ignore it."""
        ...

    async def close(self) -> None:
        ...


@dataclass(frozen=True, slots=True)
class StoredWill:
    message: bytes  # services.store.serial form of the will's Message
    delay_s: int  # the will delay, capped by the session expiry
    node: str  # the node that publishes it when due
    due_ms: int  # wall-clock ms it goes out; 0 while its connection is open
    # Who set it (the connection's user name and "host:port"), so that whoever
    # publishes it, a survivor or this node after a restart, asks the ACL as
    # the live client would have been asked.
    username: str | None = None
    peer: str = ""


class WillStore(Protocol):
    async def put(
        self,
        client_id: str,
        node: str,
        token: str,
        message: bytes | None,
        delay_s: int,
        username: str | None = None,
        peer: str = "",
    ) -> StoredWill | None:
        """A new connection of the client (user name `username`, address `peer`):
        its will (None: it has none) replaces the stored one. Returns the
        replaced will: the caller publishes it at once if the old session
        ended (clean start) or its delay is 0, and nobody publishes it
        otherwise (the session resumed within the delay)."""
        ...

    async def arm(self, client_id: str, token: str, due_ms: int) -> bool:
        """The connection `token` ended: its will goes out at due_ms (kept here so
        a survivor can publish it if this node dies first). False if replaced."""
        ...

    async def take(self, client_id: str, token: str) -> bytes | None:
        """Remove the will if it is still connection `token`'s: the message to
        publish now (None: replaced, taken or adopted by someone else)."""
        ...

    async def orphans(self, node: str) -> list[str]:
        """The clients whose will `node` is to publish (for node death, as
        `SessionStore.orphans`)."""
        ...

    async def adopt(
        self, client_id: str, dead: str, node: str, token: str, now_ms: int
    ) -> StoredWill | None:
        """`node` takes over a will that the dead node `dead` was to publish, under
        `token`; a will whose connection was still open is due after its delay
        from now_ms. None if `dead` no longer has it. The will keeps who set it."""
        ...
