"""The process's own figures: CPU, memory, open files (psutil), and how late
the event loop runs (a periodic timer).

`read_process()` costs a few system calls; it runs when /metrics is scraped
and when the alarms check, never on the message path. All but one: the
open-files count lists /proc/self/fd, 12-40 ms with 17,000 connections
open (measured under load), which would be most of a scrape. So that count
is kept by `OpenFiles`: a read takes the last count and, once it is older
than `FDS_STALE_S`, starts a new one in a worker thread (at most one at a
time); the figure is then at most a few seconds old, and no read waits.

`LagMonitor` asks the loop to run it every `LAG_PROBE_S` and notes how late
it ran: a loop busy with one long callback (a large replay, a blocking
call) runs every timer late by as much. The figure it keeps is the worst
delay of the last `LAG_WINDOW_S`, so a stall between two scrapes still
shows. A stall that is still going on cannot be measured from inside the
loop it stalls; it shows when it ends.
"""

from __future__ import annotations

import asyncio
import collections
import resource
import time
from dataclasses import dataclass
from typing import Final

import psutil

from services.metrics.registry import Metrics

FDS_STALE_S: Final = 2.0  # an open-files count older than this is counted again (off the loop)
LAG_PROBE_S: Final = 0.5  # a stall shorter than this can go unnoticed; the cost is 2 timers/s
LAG_WINDOW_S: Final = 10.0  # the gauge is the worst lateness over this (one $SYS interval)


@dataclass(frozen=True, slots=True)
class ProcessFigures:
    cpu_seconds: float  # user + system, since the process started
    rss_bytes: int
    vms_bytes: int
    open_fds: int
    max_fds: int  # the soft limit on open files
    start_time: float  # seconds since the epoch
    memory_total_bytes: int  # the machine's, for the memory alarm's share


_PROCESS = psutil.Process()


class OpenFiles:
    """The process's open-files count, counted off the event loop (module docstring)."""

    def __init__(self, stale_s: float = FDS_STALE_S) -> None:
        self.stale_s = stale_s
        self._count: int | None = None
        self._at = 0.0
        self._counting = False

    def read(self) -> int:
        if self._count is None:  # the first read: nothing to show yet, so count now
            return self._counted(psutil.Process().num_fds())
        count = self._count  # read first: the recount's thread may land before the return
        if time.monotonic() - self._at > self.stale_s and not self._counting:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a CLI reading once): count here
                return self._counted(psutil.Process().num_fds())
            self._counting = True
            loop.run_in_executor(None, self._count_now)
        return count

    def _count_now(self) -> None:
        try:
            self._counted(psutil.Process().num_fds())
        finally:
            self._counting = False

    def _counted(self, count: int) -> int:
        self._count, self._at = count, time.monotonic()
        return count


OPEN_FILES = OpenFiles()


def read_process() -> ProcessFigures:
    with _PROCESS.oneshot():
        cpu = _PROCESS.cpu_times()
        memory = _PROCESS.memory_info()
        started = _PROCESS.create_time()
    fds = OPEN_FILES.read()
    return ProcessFigures(
        cpu_seconds=cpu.user + cpu.system,
        rss_bytes=memory.rss,
        vms_bytes=memory.vms,
        open_fds=fds,
        max_fds=resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        start_time=started,
        memory_total_bytes=psutil.virtual_memory().total,
    )


class LagMonitor:
    """Measures the event loop's lateness into `metrics.eventloop_lag_seconds`."""

    def __init__(self, metrics: Metrics, probe_s: float = LAG_PROBE_S) -> None:
        self.metrics = metrics
        self.probe_s = probe_s
        self._recent: collections.deque[float] = collections.deque(
            maxlen=max(1, round(LAG_WINDOW_S / probe_s))
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due = 0.0
        self._handle: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._due = loop.time() + self.probe_s
        self._handle = loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        now = self._loop.time()
        self._recent.append(max(0.0, now - self._due))
        self.metrics.eventloop_lag_seconds = max(self._recent)
        self._due = now + self.probe_s
        self._handle = self._loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
