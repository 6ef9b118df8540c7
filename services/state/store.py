"""The state store as a node reads it: a snapshot of the log's state and its offsets.

The Spark job in `streams/statestore.py` writes the store (newest version
per key, DESIGN 7); a starting node loads it, replays the log from the
offsets it reflects (DESIGN 6), and re-seeds an empty log from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from services.event.schema import Event, RetainedEvent, SessionEvent


class StateStoreError(Exception):
    retriable = True


class StateStoreUnavailable(StateStoreError):
    """The store did not answer; a node starts from the log alone."""


class StoredSubscription(NamedTuple):
    """A subscription as the store keeps it: live, or a tombstone (live False)
    that keeps an older event seen later from bringing it back."""

    client_id: str
    filter: str
    version: int
    live: bool
    qos: int
    no_local: bool
    retain_as_published: bool
    retain_handling: int
    subscription_id: int | None
    ts_ms: int
    node: str


@dataclass(frozen=True, slots=True)
class StateSnapshot:
    """What the store held when read. `offsets` were read first, so the
    state is at least as new as them (newer is harmless: replay ignores
    what it already holds by version)."""

    offsets: dict[tuple[str, int], int]
    generation: str
    sessions: list[SessionEvent] = field(default_factory=list)  # newest per client
    floors: dict[str, int] = field(default_factory=dict)  # client -> clearing version
    subscriptions: list[StoredSubscription] = field(default_factory=list)
    retained: list[RetainedEvent] = field(default_factory=list)  # newest per topic
    bad: int = 0  # entries that could not be read (logged and skipped)

    @property
    def empty(self) -> bool:
        return not (self.sessions or self.subscriptions or self.retained)

    def events(self) -> list[Event]:
        """The snapshot as events that rebuild it when applied to an empty
        view: what a re-seeded log holds."""
        from services.event.schema import Subscribed, Unsubscribed

        out: list[Event] = [*self.sessions]
        for s in self.subscriptions:
            if s.live:
                out.append(
                    Subscribed(
                        client_id=s.client_id,
                        version=s.version,
                        node=s.node,
                        ts_ms=s.ts_ms,
                        filter=s.filter,
                        qos=s.qos,
                        no_local=s.no_local,
                        retain_as_published=s.retain_as_published,
                        retain_handling=s.retain_handling,
                        subscription_id=s.subscription_id,
                    )
                )
            else:
                out.append(
                    Unsubscribed(
                        client_id=s.client_id,
                        version=s.version,
                        node=s.node,
                        ts_ms=s.ts_ms,
                        filter=s.filter,
                    )
                )
        out.extend(self.retained)
        return out

    def live_events(self) -> list[Event]:
        """The events that rebuild the snapshot's visible state and nothing
        else: no tombstones (unsubscribed, retained cleared) and no session
        that left the directory (expired, discarded, closed with expiry 0).
        A new log generation needs no more: no event of the old log can
        come late into it. `gone_events()` are the others."""
        return self._split()[0]

    def gone_events(self) -> list[Event]:
        """The tombstones and ended sessions `live_events` leaves out: what a
        node's view needs to know the ended clients the store keeps (and to
        forget them past its bound, rule 4, the store with it)."""
        return self._split()[1]

    def _split(self) -> tuple[list[Event], list[Event]]:
        from services.event.schema import (
            RetainedCleared,
            SessionClosed,
            SessionDiscarded,
            SessionExpired,
            Unsubscribed,
        )

        live: list[Event] = []
        gone: list[Event] = []
        for e in self.events():
            ended = isinstance(
                e, Unsubscribed | RetainedCleared | SessionExpired | SessionDiscarded
            ) or (isinstance(e, SessionClosed) and e.expiry_s == 0)
            (gone if ended else live).append(e)
        return live, gone


class StateStore(Protocol):
    async def load(self) -> StateSnapshot | None:
        """The store's content, or None when it was never written."""
        ...

    async def claim_reseed(self, owner: str, ttl_s: float) -> bool:
        """Take (or, when `owner` holds it, extend) a lease of `ttl_s` on the
        log's re-seed (one node of many); False if another owner holds it."""
        ...

    async def new_generation(self, owner: str) -> str:
        """Before a re-seed appends anything: forget the offsets (they belong
        to the old log) and start a new log generation (returned), so that a
        re-seed cut short leaves no offsets or checkpoint of the old log."""
        ...

    async def release_reseed(self, owner: str) -> None:
        """After a re-seed: give up the lease, if `owner` still holds it."""
        ...

    async def close(self) -> None: ...
