"""Memory that clients leave behind, handed back to the system once they are gone.

Theory of operation. A connection's buffers and its larger objects come from
the C allocator (glibc's malloc); when thousands of clients leave, what they
held is free inside the process but stays counted in its RSS, because
glibc gives memory back only from the top of its heap. `malloc_trim(0)`
returns every whole free page wherever it lies. Measured on `weir up`
(the embedded default), three waves of 19,000 clients that connect and
leave: RSS 87 MiB before; after the waves 235, 245, 256 MiB without the
trim, 223, 237, 253 MiB with it (the trims returned 28, 28 and 0.6 MiB).
The rest is Python's own allocator (pymalloc), whose 1 MiB arenas go back
only once empty: after one wave, 126 arenas held 39 MB of live blocks and
69 MB of entirely free 16 KiB pools, each arena kept by a few objects made
while the clients were there. With PYTHONMALLOC=malloc every object comes
from glibc, and the trim returns each free 4 KiB page: 92 MiB before, 112,
127, 126 MiB after the waves (once a departed client's versions no longer
took an object of their own: services.state.ended), at a price in CPU per
message (README, "Memory after departures").

So `MemoryReturn` checks every CHECK_S whether at least AFTER_CLOSED
connections ended since its last trim and none in the last CHECK_S (the
wave is over: a trim in the middle of one would find little to return),
then trims in a worker thread (ctypes releases the GIL; the loop goes on,
only its calls into malloc wait for the allocator's lock meanwhile). It
costs nothing while clients stay, and one trim per wave of departures.
Where the C library is not glibc there is no `malloc_trim`: the check
never starts, with one log line.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable
from typing import Final

import psutil

from services.metrics.registry import Metrics

log = logging.getLogger("weir.memory")

CHECK_S: Final = 5.0  # how often the departures are looked at
AFTER_CLOSED: Final = 1_000  # connections ended since the last trim that are worth one

Trim = Callable[[], object]


def glibc_trim() -> Trim | None:
    """glibc's `malloc_trim(0)`, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


class MemoryReturn:
    """Trims the C heap after a wave of departures (see the module docstring)."""

    def __init__(
        self,
        metrics: Metrics,
        trim: Trim | None,
        check_s: float = CHECK_S,
        after_closed: int = AFTER_CLOSED,
    ) -> None:
        self.metrics = metrics
        self.trim = trim
        self.check_s = check_s
        self.after_closed = after_closed
        self.checks = 0  # checks done (each CHECK_S)
        self.trims = 0  # trims done
        self.returned_bytes = 0  # RSS they gave back, in all
        self._trimmed_at = metrics.connections_closed  # the closed count at the last trim
        self._seen = metrics.connections_closed  # the closed count at the last check
        self._handle: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.trim is None:
            log.info("memory: no malloc_trim in this C library; memory freed by departed "
                     "clients stays in the process for its own reuse")  # fmt: skip
            return
        self._handle = loop.call_later(self.check_s, self._check, loop)

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        self._handle = loop.call_later(self.check_s, self._check, loop)
        self.checks += 1
        if self.due() and self._task is None:
            self._trimmed_at = self.metrics.connections_closed
            self._task = loop.create_task(self.run())

    def due(self) -> bool:
        """Whether a wave of departures is over: enough connections ended since
        the last trim, none since the last check (which this one becomes)."""
        closed = self.metrics.connections_closed
        settled, self._seen = closed == self._seen, closed
        return settled and closed - self._trimmed_at >= self.after_closed

    async def run(self) -> None:
        """Trim now, in a worker thread; logs what came back."""
        assert self.trim is not None
        process = psutil.Process()
        try:
            before = process.memory_info().rss
            await asyncio.to_thread(self.trim)
            after = process.memory_info().rss
        finally:
            self._task = None
        self.trims += 1
        self.returned_bytes += max(0, before - after)
        log.info("memory: %.1f MiB returned to the system after clients left (RSS %.1f MiB)",
                 max(0, before - after) / 2**20, after / 2**20)  # fmt: skip

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._task is not None:  # its thread finishes the trim; nobody waits for it
            self._task.cancel()
