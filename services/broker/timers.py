"""One shared timer wheel for every connection's named timers.

Theory of operation: a channel asks for timers by name (keep alive is
restarted on every packet a client sends). A `TimerHandle` per connection
per restart would cost an allocation per packet and a heap entry per
connection; instead each owner keeps `{name: deadline}` and sits in at most
one wheel bucket, the one of its earliest deadline (a later restart leaves
it there). When a bucket's tick comes the owner is asked to fire what is
due; it answers with its next deadline and is put back in that bucket. The
wheel itself runs one `call_later` per tick while it has owners.
"""

from __future__ import annotations

import asyncio
import math
from typing import Protocol

TICK_S = 0.25  # seconds: timer resolution; keep alive needs about a second


class TimerOwner(Protocol):
    _wake: int | None  # the tick of the bucket holding this owner, None if none

    def fire_timers(self, now: float) -> float | None:
        """Fire the owner's due timers; return its next deadline, if any."""
        ...


class TimerWheel:
    __slots__ = ("_buckets", "_done", "_handle", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._buckets: dict[int, list[TimerOwner]] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._done = math.floor(loop.time() / TICK_S)  # every tick <= this has fired

    def schedule(self, owner: TimerOwner, deadline: float) -> None:
        tick = max(math.ceil(deadline / TICK_S), self._done + 1)
        if owner._wake is not None and owner._wake <= tick:
            return
        owner._wake = tick
        bucket = self._buckets.get(tick)
        if bucket is None:
            self._buckets[tick] = [owner]
        else:
            bucket.append(owner)
        if self._handle is None:
            self._handle = self._loop.call_later(TICK_S, self._tick)

    def cancel(self, owner: TimerOwner) -> None:
        """Take `owner` out of its bucket now, not at its tick (a closed
        connection: its bucket held the whole of it until its keep alive's
        deadline, 90 s of every closed connection at 60 s keep alive)."""
        tick, owner._wake = owner._wake, None
        if tick is None:
            return
        bucket = self._buckets.get(tick)
        if bucket is not None and owner in bucket:
            bucket.remove(owner)
            if not bucket:
                del self._buckets[tick]

    def _tick(self) -> None:
        self._handle = None
        now = self._loop.time()
        current = math.floor(now / TICK_S)
        first, self._done = self._done + 1, max(current, self._done)
        for tick in range(first, current + 1):
            for owner in self._buckets.pop(tick, ()):
                if owner._wake != tick:
                    continue
                owner._wake = None
                following = owner.fire_timers(now)
                if following is not None:
                    self.schedule(owner, max(following, now + TICK_S))
        if self._buckets and self._handle is None:
            self._handle = self._loop.call_later(TICK_S, self._tick)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._buckets.clear()

    def __len__(self) -> int:
        return sum(len(bucket) for bucket in self._buckets.values())
