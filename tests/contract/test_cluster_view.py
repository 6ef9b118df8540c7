"""ClusterView: a pure projection of the log, whatever the interleaving.

The Hypothesis test builds a workload of operations from two racing
writers (versions from one counter per key, in issue order), lays the
events out in partitions (hash of topic and key), lets the writers' races
reorder events inside a partition, interleaves the partitions in any way
and replays everything twice. The view must equal a brute-force model
that applies the operations in issue order.
"""

from __future__ import annotations

import asyncio
import random
import tracemalloc
import zlib
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.event.kafka import KafkaEventLog, KafkaSettings
from services.event.schema import (
    Event,
    RetainedCleared,
    RetainedSet,
    SessionClosed,
    SessionDiscarded,
    SessionExpired,
    SessionOpened,
    Subscribed,
    Unsubscribed,
)
from services.state.clientsubs import SubscriptionOptions
from services.state.entries import RetainedEntry, SessionEntry, ViewSnapshot
from services.state.view import ClusterView

CLIENTS = ("c0", "c1", "c2")
FILTERS = ("a/#", "a/+/b", "x")
TOPICS = ("r/1", "r/2")
PARTITIONS = 3

# An operation: (kind, key, arg, writer). Versions are given in issue order.
Op = tuple[str, str, int, str]
KINDS = ("open", "open_clean", "close", "close_end", "expire", "discard", "sub", "unsub")

ops_strategy = st.lists(
    st.one_of(
        st.tuples(
            st.sampled_from(KINDS),
            st.sampled_from(CLIENTS),
            st.integers(0, len(FILTERS) - 1),
            st.sampled_from("AB"),
        ),
        st.tuples(
            st.sampled_from(("retain", "unretain")),
            st.sampled_from(TOPICS),
            st.integers(0, 2),
            st.sampled_from("AB"),
        ),
    ),
    max_size=40,
)


def to_events(ops: Sequence[Op]) -> list[Event]:
    counters: dict[str, int] = {}
    events: list[Event] = []
    for ts, (kind, key, arg, writer) in enumerate(ops, start=1):
        v = counters[key] = counters.get(key, 0) + 1
        node = f"node-{writer}"
        common = {"version": v, "node": node, "ts_ms": ts}
        if kind in ("open", "open_clean"):
            events.append(
                SessionOpened(
                    client_id=key,
                    epoch=v,
                    clean_start=kind == "open_clean",
                    expiry_s=arg * 30,
                    protocol=5,
                    **common,
                )
            )
        elif kind in ("close", "close_end"):
            expiry = 0 if kind == "close_end" else 60 + arg
            events.append(SessionClosed(client_id=key, reason="normal", expiry_s=expiry, **common))
        elif kind == "expire":
            events.append(SessionExpired(client_id=key, **common))
        elif kind == "discard":
            events.append(SessionDiscarded(client_id=key, **common))
        elif kind == "sub":
            events.append(
                Subscribed(client_id=key, filter=FILTERS[arg], qos=arg, no_local=arg == 1, **common)
            )
        elif kind == "unsub":
            events.append(Unsubscribed(client_id=key, filter=FILTERS[arg], **common))
        elif kind == "retain":
            events.append(RetainedSet(topic=key, payload=b"p%d" % v, qos=arg, **common))
        else:
            events.append(RetainedCleared(topic=key, **common))
    return events


def model(events: Sequence[Event]) -> ViewSnapshot:
    """Brute force: apply in issue order (the order of `events`), no versions."""
    sessions: dict[str, SessionEntry] = {}
    subs: dict[tuple[str, str], SubscriptionOptions] = {}
    retained: dict[str, RetainedEntry] = {}

    def end(client: str) -> None:
        for k in [k for k in subs if k[0] == client]:
            del subs[k]

    for e in events:
        if isinstance(e, Subscribed):
            subs[(e.client_id, e.filter)] = SubscriptionOptions(
                qos=e.qos, no_local=e.no_local, version=e.version
            )
        elif isinstance(e, Unsubscribed):
            subs.pop((e.client_id, e.filter), None)
        elif isinstance(e, SessionOpened):
            if e.clean_start:
                end(e.client_id)
            sessions[e.client_id] = SessionEntry(
                node=e.node,
                online=True,
                expiry_s=e.expiry_s,
                version=e.version,
                epoch=e.epoch,
                clean_start=e.clean_start,
                protocol=e.protocol,
            )
        elif isinstance(e, SessionClosed) and e.expiry_s > 0:
            sessions[e.client_id] = SessionEntry(
                node=e.node,
                online=False,
                expiry_s=e.expiry_s,
                version=e.version,
                offline_since_ms=e.ts_ms,
            )
        elif isinstance(e, SessionClosed | SessionExpired | SessionDiscarded):
            end(e.client_id)
            sessions.pop(e.client_id, None)
        elif isinstance(e, RetainedSet):
            retained[e.topic] = RetainedEntry(
                topic=e.topic, payload=e.payload, qos=e.qos, version=e.version
            )
        else:
            retained.pop(e.topic, None)
    return ViewSnapshot(
        sessions=tuple(sorted(sessions.items())),
        subscriptions=tuple(sorted((c, f, o) for (c, f), o in subs.items())),
        retained=tuple(sorted(retained.items())),
    )


def partition(e: Event) -> int:
    return zlib.crc32(f"{e.topic_suffix}/{e.key}".encode()) % PARTITIONS


class Mirror:
    """What a node's trie would hold, built only from the view's hooks."""

    def __init__(self) -> None:
        self.subs: dict[tuple[str, str], SubscriptionOptions] = {}

    def subscribe(self, client: str, filter_: str, options: SubscriptionOptions) -> None:
        self.subs[(client, filter_)] = options

    def unsubscribe(self, client: str, filter_: str) -> None:
        assert (client, filter_) in self.subs
        del self.subs[(client, filter_)]


def feed(view: ClusterView, events: Sequence[Event]) -> ViewSnapshot:
    for e in events:
        view.apply(e)
    return view.snapshot()


@settings(max_examples=300, deadline=None)
@given(ops=ops_strategy, data=st.data())
def test_replay_equality_any_interleaving_with_races_and_duplicates(
    ops: list[Op], data: st.DataObject
) -> None:
    events = to_events(ops)
    truth = model(events)
    logs: list[list[Event]] = [[] for _ in range(PARTITIONS)]
    writers = {id(e): op[3] for e, op in zip(events, ops, strict=True)}
    for e in events:
        logs[partition(e)].append(e)
    # Races: two writers' appends to one partition may land out of version order.
    for log in logs:
        for i in data.draw(st.lists(st.integers(0, max(0, len(log) - 2)), max_size=6)):
            if i + 1 < len(log) and writers[id(log[i])] != writers[id(log[i + 1])]:
                log[i], log[i + 1] = log[i + 1], log[i]

    def interleave() -> list[Event]:
        cursors = [0] * PARTITIONS
        out: list[Event] = []
        while any(c < len(log) for c, log in zip(cursors, logs, strict=True)):
            ready = [p for p in range(PARTITIONS) if cursors[p] < len(logs[p])]
            p = data.draw(st.sampled_from(ready))
            out.append(logs[p][cursors[p]])
            cursors[p] += 1
        return out

    mirror = Mirror()
    view = ClusterView(mirror.subscribe, mirror.unsubscribe)
    first = feed(view, interleave())
    assert first == truth
    again = feed(view, interleave())  # replay twice: every event a duplicate
    assert again == truth
    assert mirror.subs == {(c, f): o for c, f, o in truth.subscriptions}
    canonical = feed(ClusterView(), [e for log in logs for e in log])
    assert canonical == truth


@settings(max_examples=200, deadline=None)
@given(ops=ops_strategy, seed=st.integers(0, 2**32 - 1))
def test_view_is_a_function_of_the_event_set(ops: list[Op], seed: int) -> None:
    """Stronger than per-partition order: any permutation gives the same view."""
    events = to_events(ops)
    shuffled = list(events)
    random.Random(seed).shuffle(shuffled)
    assert feed(ClusterView(), shuffled) == model(events)


def as_row(e: Subscribed | Unsubscribed) -> tuple[object, ...]:
    """A state store row (services.state.store.StoredSubscription's fields)."""
    if isinstance(e, Unsubscribed):
        return (e.client_id, e.filter, e.version, False, 0, False, False, 0, None, e.ts_ms, e.node)
    return (
        e.client_id, e.filter, e.version, True, e.qos, e.no_local, e.retain_as_published,
        e.retain_handling, e.subscription_id, e.ts_ms, e.node,
    )  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    ops=ops_strategy, seed=st.integers(0, 2**32 - 1), bulk=st.booleans(), by_version=st.booleans()
)
def test_bulk_load_equals_apply_and_its_hooks_mirror_the_view(
    ops: list[Op], seed: int, bulk: bool, by_version: bool
) -> None:
    """load_subscriptions (a snapshot's rows, duplicates and tombstones
    included, one client's rows together, in any order or by version: a
    tombstone after its live row) gives the view `apply` gives, and its
    hooks, in bulk or one by one, leave the trie's mirror equal to it."""
    events = to_events(ops)
    rows = [as_row(e) for e in events if isinstance(e, Subscribed | Unsubscribed)]
    rng = random.Random(seed)
    rows += rng.sample(rows, len(rows) // 3)
    rng.shuffle(rows)
    rows.sort(key=lambda r: (str(r[0]), r[2] if by_version else 0))
    mirror = Mirror()
    batches: list[int] = []

    def many(client: str, items: list[tuple[str, SubscriptionOptions]]) -> None:
        batches.append(len(items))
        for f, o in items:
            mirror.subscribe(client, f, o)

    view = ClusterView(mirror.subscribe, mirror.unsubscribe, many if bulk else None)
    for e in events:
        if not isinstance(e, Subscribed | Unsubscribed):
            view.apply(e)
    view.load_subscriptions(rows)
    truth = model(events)
    assert view.snapshot() == truth
    assert mirror.subs == {(c, f): o for c, f, o in truth.subscriptions}
    assert bulk or not batches
    assert sum(batches) <= len(rows) and all(batches)


def sub(v: int, f: str = "a/#", c: str = "c") -> Subscribed:
    return Subscribed(client_id=c, version=v, node="n", ts_ms=v, filter=f, qos=1)


def unsub(v: int, f: str = "a/#", c: str = "c") -> Unsubscribed:
    return Unsubscribed(client_id=c, version=v, node="n", ts_ms=v, filter=f)


def test_unsubscribe_seen_before_an_older_subscribe_wins() -> None:
    view = ClusterView()
    assert view.apply(unsub(4))
    assert not view.apply(sub(3))
    assert view.subscriptions("c") == {}


def test_subscribe_seen_before_an_older_unsubscribe_wins() -> None:
    view = ClusterView()
    assert view.apply(sub(4))
    assert not view.apply(unsub(3))
    assert view.subscriptions("c")["a/#"].version == 4


def test_duplicate_is_ignored() -> None:
    view = ClusterView()
    assert view.apply(sub(1))
    assert not view.apply(sub(1))
    assert (view.applied, view.ignored) == (1, 1)


def test_session_end_clears_older_subscriptions_even_seen_late() -> None:
    view = ClusterView()
    closed = SessionClosed(client_id="c", version=5, node="n", ts_ms=5, reason="normal")
    assert view.apply(sub(6, "new"))
    assert view.apply(closed)
    assert not view.apply(sub(3, "old"))  # subscribed before the session ended
    assert set(view.subscriptions("c")) == {"new"}
    assert view.session("c") is None


def test_persistent_close_keeps_subscriptions_and_goes_offline() -> None:
    view = ClusterView()
    opened = SessionOpened(
        client_id="c",
        version=1,
        node="n1",
        ts_ms=1000,
        epoch=1,
        clean_start=False,
        expiry_s=60,
        protocol=4,
    )
    closed = SessionClosed(
        client_id="c", version=3, node="n1", ts_ms=2000, reason="keepalive", expiry_s=60
    )
    for e in (opened, sub(2), closed):
        assert view.apply(e)
    entry = view.session("c")
    assert entry is not None and not entry.online and entry.persistent
    assert entry.expires_at_ms == 62_000
    assert set(view.subscriptions("c")) == {"a/#"}
    expired = SessionExpired(client_id="c", version=4, node="n2", ts_ms=62_000)
    assert view.apply(expired)
    assert view.subscriptions("c") == {} and view.session("c") is None


def test_takeover_moves_the_session_and_keeps_subscriptions() -> None:
    view = ClusterView()
    a = SessionOpened(
        client_id="c",
        version=1,
        node="A",
        ts_ms=1,
        epoch=1,
        clean_start=False,
        expiry_s=300,
        protocol=5,
    )
    # A took v3 for its close just before B's claim; B's open (v4) landed first.
    late = SessionClosed(
        client_id="c", version=3, node="A", ts_ms=4, reason="takenover", expiry_s=300
    )
    b = SessionOpened(
        client_id="c",
        version=4,
        node="B",
        ts_ms=3,
        epoch=2,
        clean_start=False,
        expiry_s=300,
        protocol=5,
    )
    for e in (a, sub(2), b):
        assert view.apply(e)
    assert not view.apply(late)
    entry = view.session("c")
    assert entry is not None and entry.node == "B" and entry.online and entry.epoch == 2
    assert set(view.subscriptions("c")) == {"a/#"}


def test_retained_set_and_clear_by_version() -> None:
    view = ClusterView()
    s1 = RetainedSet(topic="t", version=1, node="n", ts_ms=1, payload=b"1", qos=1)
    s3 = RetainedSet(topic="t", version=3, node="n", ts_ms=3, payload=b"3", qos=0)
    c2 = RetainedCleared(topic="t", version=2, node="n", ts_ms=2)
    assert view.apply(s3)
    assert not view.apply(c2)
    assert not view.apply(s1)
    entry = view.retained("t")
    assert entry is not None and entry.payload == b"3"


@pytest.mark.kafka
async def test_replay_through_kafka_equals_the_live_view(
    kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    rng = random.Random(7)
    ops: list[Op] = []
    for _ in range(400):
        if rng.random() < 0.8:
            ops.append((rng.choice(KINDS), rng.choice(CLIENTS), rng.randrange(3), rng.choice("AB")))
        else:
            ops.append(
                (
                    rng.choice(("retain", "unretain")),
                    rng.choice(TOPICS),
                    rng.randrange(3),
                    rng.choice("AB"),
                )
            )
    events = to_events(ops)
    settings_ = KafkaSettings(kafka_bootstrap, topic_prefix=kafka_topic_prefix, partitions=3)
    writers = {"A": KafkaEventLog(settings_), "B": KafkaEventLog(settings_)}
    live_log, fresh_log = KafkaEventLog(settings_), KafkaEventLog(settings_)
    live = ClusterView()
    received = 0
    everything = asyncio.Event()

    def on_live(e: Event) -> None:
        nonlocal received
        live.apply(e)
        received += 1
        if received == len(events):
            everything.set()

    try:
        await asyncio.gather(*(w.start() for w in writers.values()))
        tail = asyncio.create_task(live_log.tail(on_live))

        # The two writers race: each appends its own events in issue order.
        async def write(name: str) -> None:
            for e, op in zip(events, ops, strict=True):
                if op[3] == name:
                    await writers[name].append(e)

        await asyncio.wait_for(asyncio.gather(write("A"), write("B")), 60)
        await asyncio.wait_for(everything.wait(), 30)
        fresh = ClusterView()
        n = await asyncio.wait_for(fresh_log.replay(fresh.apply), 30)
        assert n == len(events)
        assert fresh.snapshot() == live.snapshot() == model(events)
        await live_log.close()
        await asyncio.wait_for(tail, 10)
    finally:
        for log in (*writers.values(), live_log, fresh_log):
            await log.close()


def clean_visit(client: str, v: int) -> list[Event]:
    """A clean client's whole life: connect, subscribe, disconnect."""
    common = {"client_id": client, "node": "n"}
    clean = {"epoch": 1, "clean_start": True, "expiry_s": 0, "protocol": 4}
    return [
        SessionOpened(**common, **clean, version=v, ts_ms=v),
        Subscribed(**common, version=v + 1, ts_ms=v + 1, filter=f"d/{client}", qos=1),
        SessionClosed(**common, version=v + 2, ts_ms=v + 2, reason="normal"),
    ]


def test_ended_clients_are_forgotten_past_the_bound_and_only_they() -> None:
    """Rule 4: a fleet of ever-new client ids leaves at most `keep_ended` ended
    clients' versions behind; the longest-ended go first; a client that is
    back, offline-persistent, or holding a live subscription is never forgotten."""
    view = ClusterView()
    view.keep_ended = 3
    persistent = SessionOpened(client_id="p", version=1, node="n", ts_ms=1, epoch=1,
                               clean_start=False, expiry_s=60, protocol=5)  # fmt: skip
    view.apply(persistent)
    view.apply(SessionClosed(client_id="p", version=2, node="n", ts_ms=2, reason="normal",
                             expiry_s=60))  # fmt: skip
    for i in range(10):
        for e in clean_visit(f"c{i}", 10):
            assert view.apply(e)
    assert view.forgotten == 7
    assert sorted(view.known_clients()) == ["c7", "c8", "c9", "p"]
    assert [view.floor(c) for c in ("c6", "c7", "c8", "c9", "p")] == [0, 12, 12, 12, 0]
    # the kept ones still refuse their own late events
    assert not view.apply(clean_visit("c9", 10)[1])
    # a client that comes back is not ended any more: not forgotten however many end after it
    view.apply(SessionOpened(client_id="c7", version=20, node="n", ts_ms=20, epoch=1,
                             clean_start=True, expiry_s=0, protocol=4))  # fmt: skip
    for i in range(10, 20):
        for e in clean_visit(f"c{i}", 10):
            view.apply(e)
    assert view.session("c7") is not None and view.session("p") is not None
    assert view.version("c7") == 20 and view.ended == 3


def test_nothing_is_forgotten_until_the_bound_is_set() -> None:
    """During replay (`keep_ended` None) the view is the pure fold of rules 1-3;
    setting the bound afterwards forgets the excess at once."""
    view = ClusterView()
    for i in range(50):
        for e in clean_visit(f"c{i}", 10):
            view.apply(e)
    assert len(view.known_clients()) == 50 and view.forgotten == 0
    view.keep_ended = 5
    assert view.forget_ended() == 45
    assert sorted(view.known_clients()) == [f"c{i}" for i in range(45, 50)]


def test_cleared_retained_topics_are_forgotten_past_the_bound() -> None:
    """Rule 4 for topics: a cleared topic keeps only its version, at most
    `keep_ended` of them; a topic set again is never forgotten."""
    view = ClusterView()
    view.keep_ended = 2

    def retain(topic: str, v: int) -> RetainedSet:
        return RetainedSet(topic=topic, version=v, node="n", ts_ms=v, payload=b"p", qos=0)

    def clear(topic: str, v: int) -> RetainedCleared:
        return RetainedCleared(topic=topic, version=v, node="n", ts_ms=v)

    assert view.apply(retain("kept", 1))
    for i in range(6):
        assert view.apply(retain(f"t/{i}", 1)) and view.apply(clear(f"t/{i}", 2))
    assert sorted(view._retained_versions) == ["kept", "t/4", "t/5"]
    assert view.forgotten == 4
    assert view.apply(clear("kept", 2))  # a third cleared topic: t/4 goes
    assert view.apply(retain("kept", 3))  # set again: no longer a cleared one
    for i in range(6, 9):
        assert view.apply(retain(f"t/{i}", 1)) and view.apply(clear(f"t/{i}", 2))
    assert sorted(view._retained_versions) == ["kept", "t/7", "t/8"]
    assert not view.apply(retain("t/8", 1))  # a kept tombstone still refuses the late set
    assert view.retained("kept") is not None and view.forgotten == 7


def test_an_ended_client_leaves_no_object_of_its_own() -> None:
    """Rule 4's kept versions take no allocation per ended client (a string, a
    ClientSubs, an OrderedDict node each before): made while departing
    connections free their memory, such objects kept that memory's pages."""
    view = ClusterView()
    events = [e for i in range(3000) for e in clean_visit(f"client-{i}", 10)]
    tracemalloc.start()
    try:
        before = len(tracemalloc.take_snapshot().traces)
        for e in events:
            view.apply(e)
        after = len(tracemalloc.take_snapshot().traces)
    finally:
        tracemalloc.stop()
    assert view.ended == 3000 and view.version("client-7") == 12
    assert after - before < 300, f"{after - before} blocks for 3,000 ended clients"
