"""Node start from the state store: snapshot, then the log's tail (DESIGN 6).

Theory of operation. Without a state store (or when it cannot be read) a
node replays the whole log (`LogState.replay`). With one, it loads the
snapshot into its view through the same rules as replay (`load_snapshot`:
sessions as events, clearing floors, subscriptions in bulk, retained as
events), then replays the log from the offsets the snapshot reflects to the
end of every partition. The view is a newest-version-per-key fold, so the
order and the overlap (the store may be newer than its offsets) do not
matter: snapshot + tail equals a full replay, which a test checks.

When the log is empty and the store is not, the log was lost (the embedded
Kafka keeps it in memory): one node takes a lease on the re-seed, tells
the store its offsets are void (a new log generation), appends the
snapshot's live state to the log in bulk (`seed`), extending the lease as
it goes, and releases it. It then starts as from any snapshot, with the
offsets where the re-seed's records end as the snapshot's (`skip_seeded`:
each bulk append says where every partition took its records), so it
reads back only what other nodes appended after them, never the re-seed
itself (which cost as much again as appending it). The order closes the
crash window: a re-seed cut short leaves a store with no offsets of the
old log (a node replays the log from its start; a Spark checkpoint of the
old log is void) and a lease that lapses within RESEED_CLAIM_S, after which
any node takes it over (a run of the same node id at once). A node that
does not get the lease waits until the log has a record or the lease is
free, then loads the snapshot and replays the log from its start: the
snapshot holds all the re-seed would append, so a re-seed still under way,
or cut short, leaves nothing out of its view.

On the embedded default (`services.state.writer.WriteThroughLog`) the
nodes themselves keep the store current as they append, so the re-seed
finds everything that was acknowledged; the view's rule 4 forgetting is
mirrored into the store (`on_forget`), which keeps it bounded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Final

from services.broker.logstate import LogState, gc_paused
from services.event.api import EventLog, Placements
from services.event.schema import Event
from services.state.store import StateSnapshot, StateStore, StateStoreError
from services.state.view import ClusterView
from services.state.writer import WriteThroughLog

log = logging.getLogger("weir.bootstrap")

RESEED_WINDOW: Final = 20_000  # events per bulk append of a re-seed (about 0.2 s of CPU)
RESEED_CLAIM_S: Final = 10.0  # the lease, extended every RESEED_WINDOW appends; a crashed
# re-seeder delays the others by at most this (a window takes well under a second)
RESEED_POLL_S: Final = 0.5  # how often a node without the lease looks at the log and the lease


def load_snapshot(
    view: ClusterView, apply: Callable[[Event], object], snapshot: StateSnapshot
) -> int:
    """Fold the snapshot into `view`; events go through `apply` (the node's
    one path, which also feeds the routing table and the retained index)."""
    for event in snapshot.sessions:
        apply(event)
    for client_id, version in snapshot.floors.items():
        view.load_floor(client_id, version)
    view.load_subscriptions(snapshot.subscriptions)
    for retained in snapshot.retained:
        apply(retained)
    return len(snapshot.sessions) + len(snapshot.subscriptions) + len(snapshot.retained)


async def seed(
    events: EventLog, items: list[Event], between: Callable[[], Awaitable[object]] | None = None
) -> dict[tuple[str, int], int]:
    """Append `items` to a log that was empty, RESEED_WINDOW at a time in bulk
    (`between` awaited after each window but the last: the re-seed extends its
    lease there); returns where a replay may start to read only what
    others appended after them (`skip_seeded`)."""
    windows: list[Placements] = []
    for start in range(0, len(items), RESEED_WINDOW):
        if start and between is not None:
            await between()
        windows.append(await reseed_window(events, items[start : start + RESEED_WINDOW]))
    return skip_seeded(windows)


def skip_seeded(windows: list[Placements]) -> dict[tuple[str, int], int]:
    """Per partition, the offset after a seed's records where they are all
    that partition holds from offset 0 up to it (a replay from there misses
    nothing); a partition where something else landed among them, or before
    them, is left out (read from its beginning: slower, never wrong)."""
    spans: dict[tuple[str, int], tuple[int, int]] = {}  # next offset, records
    for window in windows:
        for tp, placed in window.items():
            end, count = spans.get(tp, (0, 0))
            spans[tp] = (max(end, placed.next), count + placed.records)
    return {tp: end for tp, (end, count) in spans.items() if end == count}


@dataclass(frozen=True, slots=True)
class Started:
    source: str  # "log" (a full replay), "state store" (snapshot + tail), "re-seeded log"
    loaded: int = 0  # state store entries
    replayed: int = 0  # log records


async def start(logstate: LogState, state: StateStore | None, node_id: str) -> Started:
    """Bring the view up to the end of the log."""
    events = logstate.events
    if isinstance(events, WriteThroughLog):  # the store forgets what the view forgets
        logstate.view.on_forget = events.writer.forget
    await events.start()
    if state is None:
        return Started("log", replayed=await logstate.replay())
    # One pause of the collector over reading the store and loading it: the
    # read's million rows would otherwise be traversed by the first
    # collection between the two (see gc_paused). A re-seed runs outside it.
    with gc_paused():
        began = time.monotonic()
        snapshot, log_empty = await _read(events, state)
        if snapshot is not None and not snapshot.empty and not log_empty:
            return await _load(logstate, snapshot, time.monotonic() - began)
    if snapshot is None or snapshot.empty:
        return Started("log", replayed=await logstate.replay())
    seeded = await _reseed_once(events, state, snapshot, node_id)
    # Either way, the view is the snapshot's (all of it: ended clients too,
    # so that past its bound it forgets them, and the store with it, else
    # each run would add its own), then the log from where the re-seed's
    # records end: only what other nodes appended after them. A node that
    # did not re-seed (another does, or did and was cut short) reads the
    # whole log over the snapshot, whatever part of the re-seed it holds yet.
    with gc_paused():
        loaded = await _load(logstate, replace(snapshot, offsets=seeded or {}), 0.0)
    return Started("re-seeded log", loaded.loaded, loaded.replayed)


async def _read(events: EventLog, state: StateStore) -> tuple[StateSnapshot | None, bool]:
    """The store's snapshot (None: none, or unreadable) and whether the log is empty."""
    # The log's emptiness is probed while the store is read (a consumer's
    # round trips, in a thread): it decides between snapshot + tail and re-seed.
    empty = asyncio.ensure_future(events.is_empty())
    try:
        return await state.load(), await empty
    except StateStoreError as exc:
        log.warning("%s; replaying the whole log instead", exc)
        return None, await empty  # raises EventLogError: the node cannot start
    finally:
        if not empty.done():  # only when the load was cancelled
            empty.cancel()


async def _load(logstate: LogState, snapshot: StateSnapshot, read_s: float) -> Started:
    """Snapshot, then the log's tail from the offsets it reflects. The tail's
    replay starts first and gets as far as asking Kafka for the partitions (a
    thread's round trips; the records are then fetched in the background)
    while the snapshot loads; what it delivers before the load is done (a
    log that needs no wait) is held and applied after it."""
    started = time.monotonic()
    early: list[Event] = []
    loading = True

    def apply(event: Event) -> object:
        if loading:
            early.append(event)
            return None
        return logstate.apply(event)

    replay = asyncio.ensure_future(logstate.events.replay(apply, snapshot.offsets))
    await asyncio.sleep(0)  # the replay runs to its first wait: the assignment, in a thread
    try:
        loaded = load_snapshot(logstate.view, logstate.apply, snapshot)
    except BaseException:
        replay.cancel()
        raise
    loaded_s = time.monotonic() - started
    loading = False
    for event in early:
        logstate.apply(event)
    tail = await replay
    log.info(
        "read %d state store entries in %.2f s, loaded them in %.2f s, then replayed %d "
        "events of the log's tail in %.2f s",
        loaded,
        read_s,
        loaded_s,
        tail,
        time.monotonic() - started - loaded_s,
    )
    return Started("state store", loaded, tail)


async def _reseed_once(
    events: EventLog, state: StateStore, snapshot: StateSnapshot, node_id: str
) -> dict[tuple[str, int], int] | None:
    """Re-seed the empty log, or wait for another node's re-seed to show;
    the offsets after the re-seed's records if this node re-seeded it."""
    while not await state.claim_reseed(node_id, RESEED_CLAIM_S):
        if not await events.is_empty():  # another node's re-seed is under way, or done
            return None
        await asyncio.sleep(RESEED_POLL_S)  # until its first record, or its lease lapses
    started = time.monotonic()
    await state.new_generation(node_id)  # first: see the module's docstring
    # Tombstones and ended sessions stay out: a new log has no late events
    # for them to refuse, and a store that keeps 100,000 ended clients would
    # make every restart re-seed them (the view learns them from the snapshot).
    items = await asyncio.to_thread(snapshot.live_events)
    # The events come from the store: the embedded default's write-through
    # would write each back into it unchanged (its version is not newer), a
    # third of a re-seed's time. So they go to the log under it.
    target = events.log if isinstance(events, WriteThroughLog) else events

    async def extend() -> None:
        if not await state.claim_reseed(node_id, RESEED_CLAIM_S):
            log.warning("the re-seed lease passed to another node; appending the rest anyway")

    offsets = await seed(target, items, extend)
    if isinstance(events, WriteThroughLog):
        events.appended += len(items)  # the events in the current log (the log cut's count)
    await state.release_reseed(node_id)
    # On the embedded default an empty log is every start's (its Kafka
    # keeps the log in memory); elsewhere it is news.
    say = log.info if isinstance(events, WriteThroughLog) else log.warning
    say(
        "the event log was empty (an embedded Kafka restart?): re-seeded it with %d "
        "events from the state store in %.1f s",
        len(items),
        time.monotonic() - started,
    )
    return offsets


async def reseed_window(events: EventLog, items: list[Event]) -> Placements:
    """Append one window of a re-seed (its own function: a test injects a crash after it)."""
    return await events.append_all(items)
