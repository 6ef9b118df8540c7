"""The state-store fold: Spark batches + the version-guarded Lua write equal a full replay.

Random workloads with racing writers (tests/contract/test_cluster_view's
operations) are laid out in partitions, cut into micro-batches, folded by
`streams.statestore.fold` on a real local SparkSession and written to a
real redis-server. The store, loaded back the way a starting node loads it,
must give exactly the view a full replay gives: every batch once, a batch
applied twice (a driver killed after writing), batches in another order,
and a snapshot of some batches plus a replay of the rest (node bootstrap).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from services.event.schema import (
    EVENT_TYPES,
    Event,
    RetainedSet,
    SessionClosed,
    SessionOpened,
    Subscribed,
    encode,
    wire_fields,
)
from services.node.bootstrap import load_snapshot
from services.state import redis as reader
from services.state.redis import RedisStateStore
from services.state.store import StateSnapshot
from services.state.view import ClusterView
from streams.events import as_raw_rows, event_schema, parse, raw_schema
from streams.statestore import StateWriter, collect, fold
from tests.contract.test_cluster_view import CLIENTS, FILTERS, KINDS, TOPICS, Op, to_events

PREFIX = "weir."
PARTITIONS = 3


def random_ops(rng: random.Random, n: int) -> list[Op]:
    ops: list[Op] = []
    for _ in range(n):
        if rng.random() < 0.2:
            kind = rng.choice(("retain", "unretain"))
            ops.append((kind, rng.choice(TOPICS), rng.randint(0, 2), rng.choice("AB")))
        else:
            kind = rng.choice((*KINDS, "sub", "sub", "sub"))
            ops.append(
                (kind, rng.choice(CLIENTS), rng.randint(0, len(FILTERS) - 1), rng.choice("AB"))
            )
    return ops


def log_of(events: Sequence[Event], rng: random.Random) -> list[tuple[str, int, int, Event]]:
    """Events in partitions by key, with adjacent swaps (racing writers)."""
    parts: dict[tuple[str, int], list[Event]] = {}
    for e in events:
        suffix, key, _ = encode(e)
        parts.setdefault((suffix, hash(key) % PARTITIONS), []).append(e)
    records = []
    for (suffix, p), es in parts.items():
        for i in range(len(es) - 1):
            if rng.random() < 0.15:
                es[i], es[i + 1] = es[i + 1], es[i]
        records.extend((suffix, p, offset, e) for offset, e in enumerate(es))
    rng.shuffle(records)  # partitions interleave in any way
    return records


def cut(records: list[Any], rng: random.Random, pieces: int) -> list[list[Any]]:
    """Micro-batches: each partition's records in offset order, split at random points."""
    records = sorted(records, key=lambda r: (r[0], r[1], r[2]))
    bounds = sorted(rng.sample(range(1, len(records)), pieces - 1))
    return [records[a:b] for a, b in zip([0, *bounds], [*bounds, len(records)], strict=True)]


def full_view(events: Sequence[Event]) -> ClusterView:
    view = ClusterView()
    for e in events:
        view.apply(e)
    return view


def load(url: str, prefix: str = PREFIX) -> StateSnapshot:
    async def go() -> StateSnapshot:
        client = reader.aioredis.Redis.from_url(url)
        try:
            snapshot = await RedisStateStore(client, prefix).load()
        finally:
            await client.aclose()
        assert snapshot is not None
        return snapshot

    return asyncio.run(go())


def view_of(snapshot: StateSnapshot, tail: Sequence[Event] = ()) -> ClusterView:
    view = ClusterView()
    load_snapshot(view, view.apply, snapshot)
    for e in tail:
        view.apply(e)
    return view


def write_batch(spark: Any, writer: StateWriter, batch: list[Any], batch_id: int) -> Landed:
    """Fold and write one batch: the rows sent to the script, and how many changed the store."""
    raw = spark.createDataFrame(as_raw_rows(batch, PREFIX), raw_schema())
    rows = collect(fold(parse(raw, PREFIX)))
    kinds, floors = rows["kind"], rows["floor"]
    sent = sum(k in ("session", "sub", "retained") for k in kinds)
    sent += sum(k == "session" and f is not None for k, f in zip(kinds, floors, strict=True))
    return Landed(sent, sum(writer.write(rows, batch_id)))


@dataclass
class Landed:
    sent: int
    changed: int

    def __add__(self, other: Landed) -> Landed:
        return Landed(self.sent + other.sent, self.changed + other.changed)


def expected_routes(events: Sequence[Event], view: ClusterView) -> dict[str, dict[str, int]]:
    """filter -> node -> live subscriptions, the node being the one of each
    client's newest session event (where the store counts its routes)."""
    node: dict[str, tuple[int, str]] = {}
    for e in events:
        if isinstance(e, SessionOpened | SessionClosed) or type(e).topic_suffix == "sessions":
            key = e.key
            if e.version > node.get(key, (0, ""))[0]:
                node[key] = (e.version, e.node)
    routes: dict[str, dict[str, int]] = {}
    for client, subs in view.all_subscriptions().items():
        for filter_ in subs:
            where = node.get(client, (0, ""))[1]
            routes.setdefault(filter_, {}).setdefault(where, 0)
            routes[filter_][where] += 1
    return routes


def stored_routes(url: str) -> dict[str, dict[str, int]]:
    async def go() -> dict[str, dict[str, int]]:
        client = reader.aioredis.Redis.from_url(url)
        try:
            return await RedisStateStore(client, PREFIX).routes()
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_spark_schema_is_the_catalogue(spark: Any) -> None:
    """Every wire field of every event type is in the Spark schema, and each
    event read through from_json comes back with the values it was written with."""
    names = set(event_schema().fieldNames())
    for cls in EVENT_TYPES:
        assert set(wire_fields(cls)) <= names, cls.type_name
    events: list[Event] = [
        SessionOpened(
            client_id="c",
            version=2**50,
            node="n",
            ts_ms=5,
            epoch=3,
            clean_start=False,
            expiry_s=4294967295,
            protocol=4,
            username="u",
            peer="1.2.3.4:5",
        ),
        Subscribed(
            client_id="c",
            version=7,
            node="n",
            ts_ms=6,
            filter="$share/g/a/+",
            qos=2,
            no_local=True,
            retain_as_published=True,
            retain_handling=2,
            subscription_id=99,
        ),
        RetainedSet(
            topic="t/ü",
            version=8,
            node="n",
            ts_ms=7,
            payload=b"\x00\xff",
            qos=1,
            expires_at_ms=123,
            user_property=(("k", "v"), ("k", "w")),
            correlation_data=b"id",
        ),
    ]
    raw = spark.createDataFrame(
        as_raw_rows([(type(e).topic_suffix, 0, i, e) for i, e in enumerate(events)], PREFIX),
        raw_schema(),
    )
    rows = parse(raw, PREFIX).orderBy("offset").collect()
    for row, event in zip(rows, events, strict=True):
        assert row["valid"] and row["version"] == event.version and row["ekey"] == event.key
        _, _, value = encode(event)
        import json

        doc = json.loads(value)
        parsed = row["e"].asDict(recursive=True)
        for name, written in doc.items():
            got = parsed[name]
            if name == "user_property":
                got = [list(p) for p in got]
            assert got == written, (event.type_name, name)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_store_equals_full_replay_once_twice_and_out_of_order(
    spark: Any, redis_url: str, seed: int
) -> None:
    rng = random.Random(seed)
    events = to_events(random_ops(rng, 160))
    records = log_of(events, rng)
    batches = cut(records, rng, 4)
    expected = full_view(events)
    client = redis.Redis.from_url(redis_url)
    writer = StateWriter(client, PREFIX)
    # The whole log in one batch: Spark's fold alone decides (every row lands).
    write_batch(spark, writer, records, 0)
    assert view_of(load(redis_url)).snapshot() == expected.snapshot()
    client.flushdb()
    for i, batch in enumerate(batches):
        write_batch(spark, writer, batch, i)
    assert view_of(load(redis_url)).snapshot() == expected.snapshot()
    assert stored_routes(redis_url) == expected_routes(events, expected)
    # A batch Spark re-runs (the driver died after writing it) changes nothing.
    rerun = write_batch(spark, writer, batches[1], 1)
    assert rerun.sent > 0 and rerun.changed == 0
    assert view_of(load(redis_url)).snapshot() == expected.snapshot()
    # Another store, batches in reverse order: the script's version guards
    # refuse older rows (not all land) and the state is the same.
    client.flushdb()
    backward = Landed(0, 0)
    for i, batch in reversed(list(enumerate(batches))):
        backward += write_batch(spark, writer, batch, i)
    assert backward.changed < backward.sent
    assert view_of(load(redis_url)).snapshot() == expected.snapshot()
    assert stored_routes(redis_url) == expected_routes(events, expected)


@pytest.mark.parametrize("seed", [4, 5])
def test_snapshot_plus_tail_equals_full_replay(spark: Any, redis_url: str, seed: int) -> None:
    """A node's start: the store after some batches, then the rest of the log."""
    rng = random.Random(seed)
    events = to_events(random_ops(rng, 160))
    batches = cut(log_of(events, rng), rng, 3)
    writer = StateWriter(redis.Redis.from_url(redis_url), PREFIX)
    write_batch(spark, writer, batches[0], 0)
    snapshot = load(redis_url)
    assert snapshot.offsets == {
        (PREFIX + s, p): max(o for s2, p2, o, _ in batches[0] if (s2, p2) == (s, p)) + 1
        for s, p, _, _ in batches[0]
    }
    tail = [e for batch in batches[1:] for _, _, _, e in batch]
    # The tail starts at the snapshot's offsets; an overlap is harmless too.
    overlap = [e for _, _, _, e in batches[0][-10:]]
    assert view_of(snapshot, overlap + tail).snapshot() == full_view(events).snapshot()


def test_invalid_records_are_counted_and_skipped(spark: Any, redis_url: str) -> None:
    writer = StateWriter(redis.Redis.from_url(redis_url), PREFIX)
    good = Subscribed(client_id="c", version=1, node="n", ts_ms=1, filter="a", qos=1)
    batch = [
        ("subscriptions", 0, 0, b"not json"),
        ("subscriptions", 0, 1, good),
        ("subscriptions", 0, 2, b'{"type":"subscribed","schema_version":99}'),
        ("retained", 1, 0, encode(good)[2]),  # an event in the wrong topic
    ]
    write_batch(spark, writer, batch, 0)
    assert writer.bad_total == 3
    snapshot = load(redis_url)
    assert [s.filter for s in snapshot.subscriptions] == ["a"]
    # Every record read moves the offsets, the skipped ones too.
    assert snapshot.offsets == {(PREFIX + "subscriptions", 0): 3, (PREFIX + "retained", 1): 1}
