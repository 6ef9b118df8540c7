"""Back-pressure between connections: a publisher held for a slow subscriber.

Theory of operation. When a subscriber's transport is over its high-water
mark, or the cluster link to a peer is backed up, the publishing connection
that is writing to it stops reading (`block_on`) and is listed as the
subscriber's waiter (`add_waiter`); when the subscriber drains it wakes its
waiters (`wake_waiters`) and each reads on (`unblock`). A hold lasts at most
PUBLISHER_STALL_S: past it the publisher goes on and the subscriber is
marked slow, so its QoS 0 messages are dropped (counted) until it drains,
rather than one slow reader holding every publisher.

Each `services.listener.connection.Connection` holds one `Hold` (its
`hold`), made with what it calls: the connection itself (the publisher a
subscriber wakes), the loop, and the connection's `pause` (stop reading)
and `go_on` (read on, if nothing else holds it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from services.broker.ports import PUBLISHER_STALL_S, ConnectionPort, PeerGate, Publisher


class Hold:
    __slots__ = ("_go_on", "_loop", "_owner", "_pause", "_stall", "_waiters", "blocked_on",
                 "slow")  # fmt: skip

    def __init__(
        self,
        owner: Publisher,
        loop: asyncio.AbstractEventLoop,
        pause: Callable[[Any], None],
        go_on: Callable[[Any], None],
    ) -> None:
        # `pause(owner)` stops reading the owner, `go_on(owner)` reads on: functions of
        # the owner's class, shared by all its holds (a bound method each would be 128
        # bytes more per connection)
        self._owner = owner
        self._loop = loop
        self._pause = pause
        self._go_on = go_on
        # a paused subscriber, or a backed-up cluster link, the owner waits for
        self.blocked_on: ConnectionPort | PeerGate | None = None
        self._stall: asyncio.TimerHandle | None = None  # the bound of that hold
        self._waiters: list[Publisher] | None = None  # publishers waiting for us to drain
        self.slow = False  # paused past the stall bound: drop instead of making anyone wait

    # -- the owner as a subscriber --------------------------------------------

    def add_waiter(self, publisher: Publisher) -> None:
        if self._waiters is None:
            self._waiters = [publisher]
        elif publisher not in self._waiters:  # a publisher held again is listed once
            self._waiters.append(publisher)

    def wake_waiters(self, subscriber: ConnectionPort) -> None:
        """Publishers held back for `subscriber` (the owner) may go on."""
        waiters, self._waiters = self._waiters, None
        for publisher in waiters or ():
            publisher.unblock(subscriber)

    # -- the owner as a publisher ---------------------------------------------

    def block_on(self, subscriber: ConnectionPort | PeerGate) -> None:
        """Stop reading the owner until `subscriber` drains, for at most PUBLISHER_STALL_S."""
        if self.blocked_on is not None:
            return
        self.blocked_on = subscriber
        subscriber.add_waiter(self._owner)
        self._pause(self._owner)
        self._stall = self._loop.call_later(PUBLISHER_STALL_S, self._stalled, subscriber)

    def _stalled(self, subscriber: ConnectionPort | PeerGate) -> None:
        if self.blocked_on is subscriber:
            held = getattr(subscriber, "hold", None)
            if isinstance(held, Hold) and held is not self:
                held.slow = True  # until it drains, its QoS 0 messages are dropped
            self.unblock(subscriber)

    def unblock(self, subscriber: ConnectionPort | PeerGate) -> None:
        if self.blocked_on is subscriber:
            self.blocked_on = None
            if self._stall is not None:  # a stale bound would cut a later hold short
                self._stall.cancel()
                self._stall = None
            self._go_on(self._owner)
