"""The embedded default's log cut: a new, empty log generation, seeded from the store.

Theory of operation. The embedded Kafka (Tansu, memory storage) keeps every
record it is given and can delete none (no retention, compaction or
DeleteRecords: DESIGN 10), so a long run would grow it without bound, about
1.2 KiB per event. On the embedded default the state store already holds
everything the log says (`services.state.writer.WriteThroughLog` writes each
event into it before the append returns), so the log's history is not
needed: only its recent events, for the node's own tail.

So when the current log has had `cut_events` appends (and at least twice as
many as the last cut wrote into it, so a cut's cost stays a fraction of
what it saves), the single node of `weir up` cuts it:

1. appends are held (`WriteThroughLog.held`): new ones wait, the ones in
   flight finish (they are then in the store too);
2. the node's tail stops, the log's clients close;
3. the embedded Kafka is stopped and started again on its port, empty
   (`renew`, from the composition root), and the write-through log gets
   the new log;
4. the store starts a new log generation (its offsets belonged to the old
   log: a Spark job's checkpoint knows it is void), then the store's live
   state (`StateSnapshot.live_events`: sessions that did not end, live
   subscriptions, retained messages) is appended to the new log (in that
   order, as a re-seed at start: a crash between them leaves no offsets of
   the old log behind; the next start re-seeds from the store again);
5. appends go on, and the tail starts over on the new log after the
   seeded events (`bootstrap.skip_seeded`: they are all stale to the
   node's view, which would decode and ignore them).

Between cuts, every CHECK_S, the same task records the positions the node
has read as the store's offsets (`WriteThroughLog.record_offsets`), which is
what `weir streams verify` compares the store at.

A cut holds CONNACKs and SUBACKs (not message delivery) for a Kafka restart
and the live state's re-seed: about a second for a few thousand sessions.

Only a node on its own embedded Kafka cuts, and not with `--spark`; both
other modes say so at start (one line) and keep an ever-growing log until
`weir up` starts again (a start re-seeds it with the live state only):
- `--nodes` / `--workers`: several processes append to the supervisor's
  Kafka and tail it. A cut would have to hold every node's appends, stop
  every tail, restart the Kafka, seed it and move every producer and tail
  to the new log at once, across processes, with a node that dies midway
  holding up the others; an event one node appended after the snapshot
  and before the restart would be in the store (write-through) but in no
  other node's view. Not built.
- `--spark`: the job's checkpoint holds offsets of the old log. The new
  generation voids it (`streams.statestore.prepare_checkpoint`) once the
  job's query fails on a log behind its checkpoint, but that path under a
  running job is not tested, so the cut stays off there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Final

from services.event.api import EventLogUnavailable
from services.node import bootstrap
from services.state.store import StateStore, StateStoreError
from services.state.writer import WriteThroughLog
from services.tasks import cancel_and_wait

if TYPE_CHECKING:
    from services.broker.logstate import LogState

log = logging.getLogger("weir.logcut")

NOT_CUT_WITH_SPARK: Final = (
    "weir: with --spark the embedded log is not cut (the Spark job reads it): it grows by "
    "about 1.2 KiB of the embedded Kafka's memory per event until weir up starts again"
)
CUT_EVENTS: Final = 100_000  # appends between cuts: ~120 MiB of Tansu memory at most
CHECK_S: Final = 5.0  # how often the count is looked at (one comparison)


class LogCutter:
    def __init__(
        self,
        logstate: LogState,
        state: StateStore,
        node_id: str,
        cut_events: int = CUT_EVENTS,
        check_s: float = CHECK_S,
    ) -> None:
        events = logstate.events
        assert isinstance(events, WriteThroughLog) and events.renew is not None
        self.logstate = logstate
        self.events = events
        self.state = state
        self.node_id = node_id
        self.cut_events = cut_events
        self.check_s = check_s
        self.seeded = 0  # events the last cut wrote into the new log
        self.cuts = 0

    def due(self) -> bool:
        return self.events.appended >= max(self.cut_events, 2 * self.seeded)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.check_s)
            try:  # the drift check (weir streams verify) compares the store at them
                await self.events.record_offsets()
            except EventLogUnavailable as exc:
                log.warning("could not record the state store's offsets: %s", exc)
            if self.due():
                try:
                    await self.cut()
                except Exception:  # the node goes on; the next check tries again
                    log.exception("the log cut failed")

    async def cut(self) -> int:
        """Cut the log now; returns the events the new generation starts with."""
        began = time.monotonic()
        events, renew = self.events, self.events.renew
        assert renew is not None
        async with events.held():
            await self.logstate.stop_tail()
            dropped = events.appended
            try:
                snapshot = await self.state.load()
                await events.log.close()
                events.log = await renew()
                events.appended = 0
                await self.state.new_generation(self.node_id)
                seeded = 0
                if snapshot is not None:  # in a thread, as the load: the loop keeps turning
                    live = await asyncio.to_thread(snapshot.live_events)
                    skip = await bootstrap.seed(events.log, live)
                    seeded = len(live)
                    # The tail goes on from after the seed: all of it is old
                    # news to the view (a replay from `skip` reads nothing else:
                    # appends are held), which it would decode and ignore.
                    await events.log.replay(self.logstate.apply, skip)
            except StateStoreError as exc:
                log.warning("log cut: %s", exc)
                raise
            finally:
                self.logstate.start_tail()
        self.seeded = seeded
        self.cuts += 1
        log.info(
            "cut the embedded log: %d events dropped, a new generation seeded with the "
            "store's %d live entries in %.2f s",
            dropped,
            seeded,
            time.monotonic() - began,
        )
        return seeded


def start(logstate: LogState, state: StateStore | None, node_id: str) -> asyncio.Task[None] | None:
    """Run a LogCutter when the node's log can be cut (see the module's docstring)."""
    events = logstate.events
    if state is None or not isinstance(events, WriteThroughLog) or events.renew is None:
        return None
    cutter = LogCutter(logstate, state, node_id)
    # The start's re-seed counts as the last cut's: a live state bigger than
    # cut_events is not cut again before the log has twice as much.
    cutter.seeded = events.appended
    return asyncio.get_running_loop().create_task(cutter.run(), name="weir-logcut")


async def stop(task: asyncio.Task[None] | None) -> None:
    await cancel_and_wait(task)
