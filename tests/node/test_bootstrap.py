"""Node start from a state store snapshot plus the log's tail (services.node.bootstrap).

The Kafka and Spark versions are in tests/streams/test_bootstrap_equality.py;
here the event log is the memory one, whose replay needs no wait: the tail's
replay starts before the snapshot loads, and must still apply nothing before it.
"""

from __future__ import annotations

import asyncio

from services.broker.logstate import LogState
from services.broker.ports import Expiries, Session
from services.broker.routes import Routes
from services.event.memory import MemoryEventLog, MemoryLog
from services.event.schema import Event, SessionClosed, SessionOpened, Subscribed, Unsubscribed
from services.node import bootstrap
from services.retain.store import MemoryRetainStore
from services.session.memory import MemorySessionStore
from services.state.store import StateSnapshot, StoredSubscription


class FixedStore:
    """A state store that holds one snapshot."""

    def __init__(self, snapshot: StateSnapshot) -> None:
        self.snapshot = snapshot

    async def load(self) -> StateSnapshot | None:
        return self.snapshot

    async def claim_reseed(self, owner: str, ttl_s: float) -> bool:
        raise AssertionError("the log is not empty: no re-seed")

    async def reseeded(self, owner: str) -> str:
        raise AssertionError("the log is not empty: no re-seed")

    async def close(self) -> None:
        pass


def stored(client: str, filter_: str, version: int, live: bool = True) -> StoredSubscription:
    return StoredSubscription(client, filter_, version, live, 1, False, False, 0, None, 1, "n0")


async def test_snapshot_loads_before_the_tail_and_both_reach_the_routing_table() -> None:
    log = MemoryLog()
    writer = MemoryEventLog(log)
    opened = SessionOpened(
        client_id="c1", version=1, node="n0", ts_ms=1, epoch=1, clean_start=False,
        expiry_s=3600, protocol=5,
    )  # fmt: skip
    folded: list[Event] = [
        opened,
        Subscribed(client_id="c1", version=2, node="n0", ts_ms=1, filter="a/+", qos=1),
        Subscribed(client_id="c1", version=3, node="n0", ts_ms=1, filter="b", qos=1),
        SessionClosed(
            client_id="c1", version=4, node="n0", ts_ms=1, reason="normal", expiry_s=3600
        ),
    ]
    for e in folded:
        await writer.append(e)
    offsets = {tp: len(records) for tp, records in log.records.items()}
    tail: list[Event] = [
        Unsubscribed(client_id="c1", version=5, node="n0", ts_ms=2, filter="b"),
        Subscribed(client_id="c1", version=6, node="n0", ts_ms=2, filter="c/#", qos=0),
    ]
    for e in tail:
        await writer.append(e)
    snapshot = StateSnapshot(
        offsets=offsets,
        generation="",
        sessions=[folded[-1]],  # type: ignore[list-item]
        subscriptions=[stored("c1", "a/+", 2), stored("c1", "b", 3)],
    )
    routes = Routes(node_id="n1", mark_durable=lambda c: None)
    events = MemoryEventLog(log)
    logstate = LogState(
        table=routes,
        expiries=Expiries(asyncio.get_running_loop()),
        events=events,
        retained=MemoryRetainStore(),
        store=MemorySessionStore(),
        spawn=lambda c: c.close(),
    )
    applied: list[Event] = []
    apply = logstate.apply

    def spy(event: Event) -> bool:
        applied.append(event)
        return apply(event)

    logstate.apply = spy  # type: ignore[method-assign]
    started = await bootstrap.start(logstate, FixedStore(snapshot), "n1")
    assert (started.source, started.loaded, started.replayed) == ("state store", 3, 2)
    assert applied == [folded[-1], *tail]  # the snapshot's session, then the tail in order
    assert set(logstate.view.subscriptions("c1")) == {"a/+", "c/#"}
    assert sorted(routes.trie.filters("c1")) == ["a/+", "c/#"]
    session = routes.sessions["c1"]
    assert isinstance(session, Session) and set(session.subs) == {"a/+", "c/#"}
