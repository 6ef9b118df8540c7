"""One contract for every EventLog: memory and Kafka (embedded Tansu)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.embedded.kafka import EmbeddedKafka
from services.event.api import (
    EventLog,
    EventLogBackpressure,
    EventLogCorrupt,
    EventLogUnavailable,
)
from services.event.kafka import REPLAY_POLL_S, KafkaEventLog, KafkaSettings
from services.event.memory import MemoryEventLog, MemoryLog
from services.event.schema import (
    EVENT_TYPES,
    Event,
    EventSchemaError,
    RetainedCleared,
    RetainedSet,
    SessionClosed,
    SessionDiscarded,
    SessionExpired,
    SessionOpened,
    Subscribed,
    Unsubscribed,
    decode,
    encode,
    wire_fields,
)

DEADLINE_S = 20.0


@dataclass
class Backend:
    """Makes logs over one shared store; can stall the store."""

    make: Callable[..., Any]
    stall: Callable[[], None]
    unstall: Callable[[], None]
    logs: list[Any] = field(default_factory=list)

    def log(self, **kw: Any) -> Any:
        log = self.make(**kw)
        self.logs.append(log)
        return log


@pytest.fixture(params=["memory", "kafka"])
async def backend(
    request: pytest.FixtureRequest, kafka_topic_prefix: str
) -> AsyncIterator[Backend]:
    if request.param == "memory":
        store = MemoryLog(partitions=4)

        def make_memory(**kw: Any) -> MemoryEventLog:
            return MemoryEventLog(store, seed=len(b.logs), **kw)

        def stall() -> None:
            store.available = False

        def unstall() -> None:
            store.available = True

        b = Backend(make_memory, stall, unstall)
    else:
        bootstrap = request.getfixturevalue("kafka_bootstrap")
        broker: EmbeddedKafka | None = None
        if "outage" in request.node.name:
            broker = request.getfixturevalue("private_kafka")
            bootstrap = broker.bootstrap

        def make_kafka(**kw: Any) -> KafkaEventLog:
            return KafkaEventLog(
                KafkaSettings(bootstrap, topic_prefix=kafka_topic_prefix, partitions=4, **kw)
            )

        def pause() -> None:
            assert broker is not None
            broker.pause()

        def resume() -> None:
            assert broker is not None
            broker.resume()

        b = Backend(make_kafka, pause, resume)
    try:
        yield b
    finally:
        b.unstall() if request.param == "memory" or "outage" in request.node.name else None
        for log in b.logs:
            await log.close()


def workload(clients: int = 6, per_client: int = 8) -> list[Event]:
    events: list[Event] = []
    for v in range(1, per_client + 1):
        for c in range(clients):
            cid = f"client-{c}"
            if v == 1:
                events.append(
                    SessionOpened(
                        client_id=cid,
                        version=v,
                        node="n1",
                        ts_ms=v,
                        epoch=1,
                        clean_start=False,
                        expiry_s=60,
                        protocol=5,
                    )
                )
            elif v % 3 == 0:
                events.append(
                    Unsubscribed(client_id=cid, version=v, node="n1", ts_ms=v, filter=f"f/{v - 1}")
                )
            else:
                events.append(
                    Subscribed(client_id=cid, version=v, node="n1", ts_ms=v, filter=f"f/{v}", qos=1)
                )
        events.append(
            RetainedSet(
                topic=f"r/{v % 3}", version=v, node="n1", ts_ms=v, payload=b"\x00p%d" % v, qos=1
            )
        )
    events.append(RetainedCleared(topic="r/0", version=per_client + 1, node="n1", ts_ms=99))
    events.append(
        SessionClosed(
            client_id="client-0",
            version=per_client + 1,
            node="n1",
            ts_ms=99,
            reason="normal",
            expiry_s=60,
        )
    )
    return events


def by_key(events: list[Event]) -> dict[tuple[str, str], list[Event]]:
    out: dict[tuple[str, str], list[Event]] = {}
    for e in events:
        out.setdefault((e.topic_suffix, e.key), []).append(e)
    return out


async def replay_all(log: EventLog) -> list[Event]:
    got: list[Event] = []
    n = await asyncio.wait_for(log.replay(got.append), DEADLINE_S)
    assert n == len(got)
    return got


async def test_append_then_replay_gives_every_event_in_per_key_order(backend: Backend) -> None:
    writer = backend.log()
    events = workload()
    for e in events:
        await writer.append(e)
    got = await replay_all(backend.log())
    assert sorted(map(repr, got)) == sorted(map(repr, events))
    assert by_key(got) == by_key(events)


async def test_concurrent_appends_keep_per_key_order(backend: Backend) -> None:
    writer = backend.log()
    events = workload(clients=20, per_client=5)
    per_key = by_key(events)

    # One task per key, appending that key's events in order; keys race.
    async def write(seq: list[Event]) -> None:
        for e in seq:
            await writer.append(e)

    await asyncio.wait_for(asyncio.gather(*(write(s) for s in per_key.values())), DEADLINE_S)
    got = await replay_all(backend.log())
    assert by_key(got) == per_key


async def test_replay_of_empty_log_ends(backend: Backend) -> None:
    assert await replay_all(backend.log()) == []


async def test_replay_from_positions_reads_only_newer(backend: Backend) -> None:
    writer = backend.log()
    first, second = workload(3, 4), workload(2, 3)
    for e in first:
        await writer.append(e)
    reader = backend.log()
    assert len(await replay_all(reader)) == len(first)
    marks = reader.positions()
    assert sum(marks.values()) == len(first)
    for e in second:
        await writer.append(e)
    got: list[Event] = []
    again = backend.log()
    n = await asyncio.wait_for(again.replay(got.append, start=marks), DEADLINE_S)
    assert n == len(second)
    assert by_key(got) == by_key(second)
    # Positions count from the given offsets, also where nothing new was read
    # (the drift check compares a node started from the state store by them).
    assert again.positions().keys() >= marks.keys()
    assert sum(again.positions().values()) == len(first) + len(second)


async def test_tail_delivers_new_events(backend: Backend) -> None:
    writer = backend.log()
    await writer.append(workload(1, 1)[0])
    reader = backend.log()
    assert len(await replay_all(reader)) == 1
    seen: list[Event] = []
    arrived = asyncio.Event()
    fresh = Subscribed(client_id="late", version=1, node="n2", ts_ms=1, filter="x/#", qos=2)

    def handler(e: Event) -> None:
        seen.append(e)
        arrived.set()

    tail = asyncio.create_task(reader.tail(handler))
    await writer.append(fresh)
    await asyncio.wait_for(arrived.wait(), DEADLINE_S)
    assert seen == [fresh]
    await reader.close()
    await asyncio.wait_for(tail, DEADLINE_S)


async def test_async_handler_is_awaited(backend: Backend) -> None:
    writer = backend.log()
    for e in workload(2, 2):
        await writer.append(e)
    got: list[Event] = []

    async def handler(e: Event) -> None:
        await asyncio.sleep(0)
        got.append(e)

    n = await asyncio.wait_for(backend.log().replay(handler), DEADLINE_S)
    assert n == len(got) == len(workload(2, 2))


async def test_append_all_lands_every_event_and_says_where(backend: Backend) -> None:
    """A bulk append (a re-seed's) past the producer's queue bound: every
    event lands, in per-key order, and the placements say where: a replay
    from their ends reads only what came after."""
    writer = backend.log(max_pending=50)
    events = workload(clients=40, per_client=6)  # 278 events: the queue fills and drains
    placed = await asyncio.wait_for(writer.append_all(events), DEADLINE_S)
    assert sum(p.records for p in placed.values()) == len(events)
    assert all(p.next - p.first == p.records and p.first == 0 for p in placed.values())
    got = await replay_all(backend.log())
    assert by_key(got) == by_key(events)
    later = Subscribed(client_id="later", version=1, node="n1", ts_ms=1, filter="a", qos=0)
    await writer.append(later)
    after: list[Event] = []
    ends = {tp: p.next for tp, p in placed.items()}
    await asyncio.wait_for(backend.log().replay(after.append, start=ends), DEADLINE_S)
    assert after == [later]


async def test_outage_append_all_fails_within_bound(backend: Backend) -> None:
    bound = 1.0
    writer = backend.log()
    await writer.append(workload(1, 1)[0])  # warm
    writer.append_timeout_s = bound
    backend.stall()
    started = time.monotonic()
    with pytest.raises(EventLogUnavailable, match=r"not acknowledged|no acknowledgement"):
        await asyncio.wait_for(writer.append_all(workload(3, 2)), DEADLINE_S)
    assert time.monotonic() - started < bound + 2.0
    backend.unstall()


async def test_outage_append_fails_within_bound_and_loop_stays_free(backend: Backend) -> None:
    bound = 1.0
    writer = backend.log()
    await writer.append(workload(1, 1)[0])  # warm: a producer's first append takes longer
    writer.append_timeout_s = bound
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    backend.stall()
    started = time.monotonic()
    with pytest.raises(EventLogUnavailable):
        await writer.append(workload(1, 2)[1])
    elapsed = time.monotonic() - started
    task.cancel()
    assert bound * 0.9 <= elapsed < bound + 1.0
    assert ticks > 20  # the loop kept running while append waited
    backend.unstall()
    after = Subscribed(client_id="after", version=1, node="n1", ts_ms=1, filter="a", qos=0)
    await asyncio.wait_for(writer.append(after), DEADLINE_S)
    got = await replay_all(backend.log())
    assert after in got


async def test_outage_full_queue_is_backpressure(backend: Backend) -> None:
    writer = backend.log(max_pending=5)
    await writer.append(workload(1, 1)[0])
    writer.append_timeout_s = 2.0
    backend.stall()
    appends = [
        asyncio.create_task(
            writer.append(
                Subscribed(client_id=f"c{i}", version=1, node="n", ts_ms=1, filter="a", qos=0)
            )
        )
        for i in range(12)
    ]
    results = await asyncio.wait_for(asyncio.gather(*appends, return_exceptions=True), DEADLINE_S)
    kinds = {type(r) for r in results}
    assert EventLogBackpressure in kinds
    assert all(isinstance(r, EventLogUnavailable) for r in results)
    backend.unstall()


async def test_memory_corrupt_record_is_named() -> None:
    store = MemoryLog(partitions=1)
    store.records[("weir.sessions", 0)].append(b'{"type":"from_the_future","schema_version":9}')
    with pytest.raises(EventLogCorrupt, match=r"weir.sessions\[0\]@0: .*unknown event type"):
        await MemoryEventLog(store).replay(lambda e: None)


async def test_kafka_corrupt_record_raises_event_log_corrupt(
    kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    from confluent_kafka import Producer

    log = KafkaEventLog(
        KafkaSettings(kafka_bootstrap, topic_prefix=kafka_topic_prefix, partitions=2)
    )
    try:
        await log.ensure_topics()
        producer = Producer({"bootstrap.servers": kafka_bootstrap})
        producer.produce(
            kafka_topic_prefix + "sessions",
            key=b"c",
            value=b'{"type":"session_opened","schema_version":2}',
        )
        assert producer.flush(10) == 0
        with pytest.raises(EventLogCorrupt, match=r"sessions\[\d\]@0: .*schema_version 2"):
            await asyncio.wait_for(log.replay(lambda e: None), DEADLINE_S)
    finally:
        await log.close()


# -- the catalogue's wire form ----------------------------------------------


_text = st.text(max_size=20)
_common = {"version": st.integers(1, 2**53), "node": _text, "ts_ms": st.integers(0, 2**53)}
_client = {"client_id": _text, **_common}
_opt_int = st.none() | st.integers(0, 2**31)
EVENTS = st.one_of(
    st.builds(
        SessionOpened,
        **_client,
        epoch=st.integers(1, 2**40),
        clean_start=st.booleans(),
        expiry_s=st.integers(0, 2**32 - 1),
        protocol=st.sampled_from([3, 4, 5]),
        username=st.none() | _text,
        peer=_text,
    ),
    st.builds(
        SessionClosed,
        **_client,
        reason=st.sampled_from(["normal", "keepalive", "takenover", "kicked", "error"]),
        expiry_s=st.integers(0, 2**32),
    ),
    st.builds(SessionExpired, **_client),
    st.builds(SessionDiscarded, **_client),
    st.builds(
        Subscribed,
        **_client,
        filter=_text,
        qos=st.integers(0, 2),
        no_local=st.booleans(),
        retain_as_published=st.booleans(),
        retain_handling=st.integers(0, 2),
        subscription_id=_opt_int,
    ),
    st.builds(Unsubscribed, **_client, filter=_text),
    st.builds(
        RetainedSet,
        topic=_text,
        **_common,
        payload=st.binary(max_size=64),
        qos=st.integers(0, 2),
        expires_at_ms=_opt_int,
        payload_format_indicator=_opt_int,
        content_type=st.none() | _text,
        response_topic=st.none() | _text,
        correlation_data=st.none() | st.binary(max_size=16),
        user_property=st.lists(st.tuples(_text, _text), max_size=3).map(tuple),
        sender=_text,
    ),
    st.builds(RetainedCleared, topic=_text, **_common),
)


@given(EVENTS)
def test_every_event_round_trips_through_its_topic(event: Event) -> None:
    suffix, key, value = encode(event)
    assert suffix == type(event).topic_suffix
    assert key == (
        event.topic if isinstance(event, RetainedSet | RetainedCleared) else event.client_id
    )  # type: ignore[union-attr]
    assert decode("weir." + suffix, value) == event
    assert tuple(json.loads(value)) == wire_fields(type(event))


def test_catalogue_topics_and_keys() -> None:
    topics = {t.type_name: t.topic_suffix for t in EVENT_TYPES}
    assert topics == {
        "session_opened": "sessions",
        "session_closed": "sessions",
        "session_expired": "sessions",
        "session_discarded": "sessions",
        "subscribed": "subscriptions",
        "unsubscribed": "subscriptions",
        "retained_set": "retained",
        "retained_cleared": "retained",
    }


@pytest.mark.parametrize(
    ("topic", "value", "message"),
    [
        ("weir.sessions", b"not json", "not JSON"),
        ("weir.sessions", b'{"type":"session_expired"\xff}', "not JSON"),  # not UTF-8
        ("weir.sessions", b'{"type":"session_expired"} trailing', "not JSON"),
        ("weir.sessions", b"[1]", "not a JSON object"),
        (
            "weir.sessions",
            b'{"type":"session_teleported","schema_version":1}',
            "unknown event type",
        ),
        ("weir.subscriptions", b'{"type":"unsubscribed","schema_version":2}', "schema_version 2"),
        ("weir.subscriptions", b'{"type":"unsubscribed"}', "schema_version None"),
        (
            "weir.retained",
            encode(Unsubscribed(client_id="c", version=1, node="n", ts_ms=1, filter="f"))[2],
            "belongs in",
        ),
        (
            "weir.subscriptions",
            b'{"type":"unsubscribed","schema_version":1,"client_id":"c","version":1}',
            "fields",
        ),
        (
            "weir.subscriptions",
            b'{"type":"unsubscribed","schema_version":1,"client_id":"c","version":1,"node":"n",'
            b'"ts_ms":1,"filtre":"f"}',
            "fields",
        ),
        (
            "weir.subscriptions",
            b'{"type":"unsubscribed","schema_version":1,"client_id":"c","version":"1","node":"n",'
            b'"ts_ms":1,"filter":"f"}',
            "integer version",
        ),
        (
            "weir.sessions",
            b'{"type":"session_closed","schema_version":1,"client_id":"c","version":1,"node":"n",'
            b'"ts_ms":1,"reason":"bored","expiry_s":0}',
            "close reason",
        ),
    ],
)
def test_decode_rejects_what_it_does_not_know(topic: str, value: bytes, message: str) -> None:
    with pytest.raises(EventSchemaError, match=message):
        decode(topic, value)


async def test_kafka_producer_is_rebuilt_after_the_broker_forgets_it(
    private_kafka: EmbeddedKafka,
) -> None:
    """A restarted embedded broker has lost the idempotent producer's id (and
    every topic): appends time out, then the producer is rebuilt and works."""
    log = KafkaEventLog(KafkaSettings(private_kafka.bootstrap, partitions=2))
    try:
        await log.append(workload(1, 1)[0])
        log.append_timeout_s = 1.0
        private_kafka.stop()
        private_kafka.start()  # same port, empty memory storage
        outcomes: list[str] = []
        fresh = Subscribed(client_id="c", version=2, node="n", ts_ms=2, filter="f", qos=0)
        for _ in range(10):
            try:
                await log.append(fresh)
                outcomes.append("ok")
                break
            except EventLogUnavailable:
                outcomes.append("unavailable")
        assert outcomes[-1] == "ok"
        # REBUILD_AFTER_TIMEOUTS failures, then the new producer's first appends
        # may still time out while it gets an id (0.5-1 s, longer on a busy machine).
        assert outcomes[:3] == ["unavailable"] * 3
        assert len(outcomes) <= 8
        reader = KafkaEventLog(KafkaSettings(private_kafka.bootstrap))
        try:
            assert fresh in await replay_all(reader)
        finally:
            await reader.close()
    finally:
        await log.close()


async def test_kafka_outage_replay_gives_up_within_its_stall_bound(
    private_kafka: EmbeddedKafka,
) -> None:
    stall_s = 1.0
    log = KafkaEventLog(
        KafkaSettings(private_kafka.bootstrap, partitions=2, replay_stall_s=stall_s)
    )
    try:
        await log.append(workload(1, 1)[0])
        private_kafka.pause()
        started = time.monotonic()
        with pytest.raises(EventLogUnavailable):
            await asyncio.wait_for(log.replay(lambda e: None), DEADLINE_S)
        assert time.monotonic() - started < stall_s + 3.0
    finally:
        private_kafka.resume()
        await log.close()


async def test_kafka_replay_from_past_the_end_does_not_hang(
    private_kafka: EmbeddedKafka, kafka_topic_prefix: str
) -> None:
    """Tansu stalls silently on a fetch past a partition's end: the stall
    bound turns that into EventLogUnavailable. The embedded Tansu, always
    (the shared broker may be an Apache Kafka, which resets such an offset
    to the earliest instead, and the replay reads everything)."""
    settings_ = KafkaSettings(
        private_kafka.bootstrap, topic_prefix=kafka_topic_prefix, partitions=1,
        replay_stall_s=1.0,
    )  # fmt: skip
    writer, reader = KafkaEventLog(settings_), KafkaEventLog(settings_)
    try:
        await writer.append(workload(1, 1)[0])
        start = {(t, 0): 1000 for t in writer.topics}
        started = time.monotonic()
        with pytest.raises(EventLogUnavailable, match="not at their end"):
            await asyncio.wait_for(reader.replay(lambda e: None, start=start), DEADLINE_S)
        assert time.monotonic() - started < 5.0  # the 1 s stall bound ended it, not the deadline
    finally:
        await writer.close()
        await reader.close()


async def test_kafka_replay_ends_soon_after_the_ends_and_the_tail_goes_on(
    kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    """A replay returns once every partition reported its end: it used to wait
    out a consume() timeout (REPLAY_POLL_S) and the broker's fetch hold, about
    0.3 s added to every node start. The tail then reads on from where it ended."""
    settings_ = KafkaSettings(kafka_bootstrap, topic_prefix=kafka_topic_prefix, partitions=2)
    writer = KafkaEventLog(settings_)
    readers = [KafkaEventLog(settings_) for _ in range(3)]
    try:
        events = workload(2, 2)
        for e in events:
            await writer.append(e)
        took = []
        for reader in readers:  # the best of three: a busy machine only adds
            started = time.monotonic()
            n = await asyncio.wait_for(reader.replay(lambda e: None), DEADLINE_S)
            assert n == len(events)
            took.append(time.monotonic() - started)
        assert min(took) < REPLAY_POLL_S, took
        seen: list[Event] = []
        arrived = asyncio.Event()

        def handler(e: Event) -> None:
            seen.append(e)
            arrived.set()

        tail = asyncio.create_task(readers[0].tail(handler))
        fresh = Subscribed(client_id="late", version=1, node="n2", ts_ms=1, filter="x/#", qos=1)
        await writer.append(fresh)
        await asyncio.wait_for(arrived.wait(), DEADLINE_S)
        assert seen == [fresh]
        await readers[0].close()
        await asyncio.wait_for(tail, DEADLINE_S)
    finally:
        await writer.close()
        for reader in readers:
            await reader.close()
