"""The node's heartbeat, from a thread of its own, and self-fencing on it
(docs/architecture.md 5).

Theory of operation. A thread stores a heartbeat every `every_s`
(`Membership.beat_blocking`, on a Redis connection of its own) and tells
the loop of each one. The loop does not carry the beats: when it did (a
task on it), a loop held up for seconds starved them. 19,000 clients
leaving at once did that (their session ends, and the garbage collections
they bring, each up to half a second at that size), and the node fenced
itself, disconnecting every client that stayed, with nothing wrong with
Redis. The thread needs the interpreter only for the call itself, which a
busy loop yields within the switch interval (5 ms).

Fencing. A beat sent at monotonic time t and stored keeps the record alive
until t + TTL or later, and survivors act only after it lapsed. So the
node fences itself (`on_fence(True)`: clients disconnected, CONNECTs
refused) once no beat sent in the last TTL/2 has been stored, and takes
clients again (`on_fence(False)`) when one is. A timer on the loop checks
at `stored + TTL/2` (stored: the send time of the newest stored beat, which
the thread writes); it checks the clock again when it runs, so a timer
that fires early or late decides on what is true then.

A gap. A beat stored more than TTL/2 after the one before means a time in
which survivors may have taken over: the whole process was frozen (SIGSTOP:
the thread stops too) or Redis did not answer. The thread counts such
gaps; the loop fences for each one it has not seen (every client
disconnected) before it takes clients again, even when it learns of the
gap only after the new beat went through. The thread writes the count
before the time, and the loop reads the time first, so the loop never sees
the new time without the gap that came with it. (Each value has a single
writer: no update is lost.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable

from services.cluster.api import Membership, MembershipUnavailable

log = logging.getLogger("weir.cluster.router")


class Heartbeat:
    def __init__(self, node_id: str, membership: Membership, every_s: float,
                 on_fence: Callable[[bool], None]) -> None:  # fmt: skip
        self.node_id = node_id
        self.membership = membership
        self.every_s = every_s
        self.bound_s = membership.ttl_s / 2  # no beat stored for this long: fenced
        self.on_fence = on_fence
        self.fenced = False
        self._stored = 0.0  # the send time of the newest stored beat (the thread writes it)
        self._gaps = 0  # beats stored over bound_s after the one before (the thread writes it)
        self._gaps_seen = 0  # ... of which the loop has fenced for
        self._loop: asyncio.AbstractEventLoop | None = None
        self._check_at: asyncio.TimerHandle | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, stored: float) -> None:
        """Beat from now on; `stored`: the send time of the beat that joined."""
        self._loop = asyncio.get_running_loop()
        self._stored = stored
        self._arm()
        self._thread = threading.Thread(target=self._beats, name="weir-heartbeat", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)  # at most one call in flight
            self._thread = None
        if self._check_at is not None:
            self._check_at.cancel()
            self._check_at = None

    # -- the thread ---------------------------------------------------------

    def _beats(self) -> None:
        last = self._stored
        while not self._stop.wait(max(0.0, last + self.every_s - time.monotonic())):
            last = time.monotonic()
            try:
                self.membership.beat_blocking()
            except MembershipUnavailable as exc:
                log.warning("membership: %s", exc)
                continue
            if last - self._stored > self.bound_s:
                self._gaps += 1  # before the time: see the module's docstring
            self._stored = last
            loop = self._loop
            assert loop is not None
            with contextlib.suppress(RuntimeError):  # the loop is closed: the node stopped
                loop.call_soon_threadsafe(self._check)

    # -- the loop -------------------------------------------------------------

    def _arm(self) -> None:
        """Check again when the newest stored beat is bound_s old."""
        assert self._loop is not None
        if self._check_at is not None:
            self._check_at.cancel()
        delay = self._stored + self.bound_s - time.monotonic()
        self._check_at = self._loop.call_later(max(0.0, delay), self._check)

    def _check(self) -> None:
        stored = self._stored  # read before the gaps: see the module's docstring
        gaps = self._gaps
        self._check_at = None
        if gaps != self._gaps_seen:
            self._gaps_seen = gaps
            self._fence(True, "a heartbeat was stored only after a gap of more than")
        if time.monotonic() - stored >= self.bound_s:
            self._fence(True, "no heartbeat stored for")
        else:
            self._fence(False, "")
            self._arm()

    def _fence(self, fenced: bool, why: str) -> None:
        if fenced == self.fenced:
            return
        if fenced:
            log.error(
                "%s %.1f s (half the cluster TTL): node %s fences itself (clients "
                "disconnected 0x9C, CONNECTs refused 0x88) until a beat is stored in time",
                why, self.bound_s, self.node_id,
            )  # fmt: skip
        else:
            log.warning("heartbeat stored again: node %s takes clients again", self.node_id)
        self.fenced = fenced
        self.on_fence(fenced)
