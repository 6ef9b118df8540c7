"""An async bridge's records cost the event loop no report each: librdkafka
reports failed records only and the loop polls (no thread), and the figures
come from counting (`tally.Counted`): on the embedded Kafka."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections import deque
from typing import Any

import pytest

from services.bridge import kafka
from services.bridge.kafka import KafkaBridge
from services.bridge.templates import Fields
from services.config.bridges import KafkaOut, Mode
from services.mqtt.packets import Message, Properties
from tests.bridge.kafka import read_topic
from tests.bridge.test_kafka_out import kafka_topic
from tests.support.wait import until

RECORDS = 300
WAIT_S = 30.0


class CountedReports(deque[Any]):
    """The bridge's report queue, counting what is put in it."""

    appended = 0

    def append(self, report: Any) -> None:
        self.appended += 1
        super().append(report)


async def produce(bridge: KafkaBridge, count: int) -> None:
    for n in range(count):
        message = Message("a/1", b"%05d" % n, qos=1, sender=f"c{n % 3}")  # key: 2 bytes
        assert bridge.produce(Fields(message, None, 0)) is None  # async: nothing to wait for


async def settled(bridge: KafkaBridge, what: str) -> None:
    """Until nothing is buffered (the loop keeps polling meanwhile)."""
    await until(lambda: bridge.stats().buffered_records == 0, what, WAIT_S, 0.05)


def unreachable(name: str, timeout_s: float) -> tuple[KafkaOut, str]:
    """An async table whose Kafka is a port nothing listens on, and that address."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nowhere = f"127.0.0.1:{closed.getsockname()[1]}"
    table = KafkaOut(name=name, filter="a/#", topic="nowhere", mode=Mode.ASYNC,
                     value="${payload}", timeout_s=timeout_s, partitions=0)  # fmt: skip
    return table, nowhere


class EventAhead:
    """A producer whose count holds one event of its own besides the records
    (librdkafka's queue length counts its error events too)."""

    def __init__(self, producer: Any) -> None:
        self.producer = producer

    def __len__(self) -> int:
        return len(self.producer) + 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.producer, name)


def test_an_event_in_librdkafka_count_is_not_a_buffered_record() -> None:
    table, nowhere = unreachable("ahead", timeout_s=10)

    async def run() -> None:
        bridge = KafkaBridge(table, nowhere, asyncio.get_running_loop())
        await bridge.start()
        try:
            await produce(bridge, 20)  # held: none can fail for 10 s
            assert bridge._producer is not None
            bridge._producer = EventAhead(bridge._producer)  # type: ignore[assignment]
            s = bridge.stats()
            assert (s.buffered_records, s.buffered_bytes, s.records) == (20, 20 * (5 + 2), 0)
        finally:
            if isinstance(bridge._producer, EventAhead):
                bridge._producer = bridge._producer.producer
            await bridge.close()

    asyncio.run(run())


def test_acknowledged_records_are_counted_not_reported(kafka_bootstrap: str) -> None:
    topic = kafka_topic()
    table = KafkaOut(name="counted", filter="a/#", topic=topic, mode=Mode.ASYNC,
                     value="${payload}", partitions=2)  # fmt: skip

    async def run() -> None:
        bridge = KafkaBridge(table, kafka_bootstrap, asyncio.get_running_loop())
        bridge._reports = reports = CountedReports()
        await bridge.start()
        try:
            assert not [t for t in threading.enumerate() if t.name == "weir-bridge-counted"]
            await produce(bridge, RECORDS)
            await settled(bridge, "the records in Kafka")
            s = bridge.stats()
            assert (s.records, s.failures, s.dropped, s.buffered_bytes) == (RECORDS, 0, 0, 0)
            assert s.bytes == RECORDS * (5 + 2) and s.state == "running"
            assert reports.appended == 0  # not one report for an acknowledged record
        finally:
            await bridge.close()

    asyncio.run(run())
    assert len(read_topic(kafka_bootstrap, topic)) == RECORDS


def test_failed_records_are_reported_and_counted() -> None:
    table, nowhere = unreachable("nowhere", timeout_s=0.5)

    async def run() -> None:
        bridge = KafkaBridge(table, nowhere, asyncio.get_running_loop())
        await bridge.start()
        try:
            await produce(bridge, 20)
            assert bridge.stats().buffered_records == 20
            assert bridge.stats().buffered_bytes == 20 * (5 + 2)
            await settled(bridge, "the records failed")
            s = bridge.stats()
            assert (s.records, s.bytes, s.failures, s.buffered_records) == (0, 0, 20, 0)
            assert s.state == "kafka_down"
        finally:
            await bridge.close()

    asyncio.run(run())


def test_the_buffer_bound_counts_again_before_it_drops(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An async record is checked against what the bridge produced since
    librdkafka's last count, and that count is taken again before a record is
    dropped: records Kafka took meanwhile make room. (The periodic poll, which
    also counts, is held off here, so only the count before a drop can.)"""
    monkeypatch.setattr(kafka, "POLL_INTERVAL_S", 3600.0)
    topic, size = kafka_topic(), 8 * 1024
    table = KafkaOut(name="room", filter="a/#", topic=topic, mode=Mode.ASYNC,
                     value="${payload}", buffer_bytes=64 * 1024, partitions=1)  # fmt: skip

    async def run() -> None:
        bridge = KafkaBridge(table, kafka_bootstrap, asyncio.get_running_loop())
        await bridge.start()
        try:
            for n in range(3):  # 7 records of 8 KiB + key fit in 64 KiB, the 8th does not
                for _ in range(8):
                    bridge.produce(Fields(Message("a/1", bytes(size), 1, sender="c"), None, 0))
                s = bridge.stats()
                assert (s.dropped, s.buffered_records) == (n + 1, 7)
                await settled(bridge, "the records in Kafka")
        finally:
            await bridge.close()

    asyncio.run(run())
    assert len(read_topic(kafka_bootstrap, topic)) == 21


@pytest.mark.parametrize("passed_on", [True, False])
def test_user_properties_are_headers_without_header_templates(
    kafka_bootstrap: str, passed_on: bool
) -> None:
    """A table with no `headers` still passes a message's user properties on
    as headers (unless `user_properties = false`); a message without any
    makes a record without headers."""
    topic = kafka_topic()
    table = KafkaOut(name="props", filter="a/#", topic=topic, mode=Mode.ASYNC,
                     value="${payload}", partitions=1, user_properties=passed_on)  # fmt: skip
    with_props = Properties(user_property=(("site", "lyon"), ("dev", "d-1")))

    async def run() -> None:
        bridge = KafkaBridge(table, kafka_bootstrap, asyncio.get_running_loop())
        await bridge.start()
        try:
            bridge.produce(Fields(Message("a/1", b"p", 1, properties=with_props, sender="c"),
                                  None, 0))  # fmt: skip
            bridge.produce(Fields(Message("a/1", b"none", 1, sender="c"), None, 0))
            await settled(bridge, "the records in Kafka")
        finally:
            await bridge.close()

    asyncio.run(run())
    records = read_topic(kafka_bootstrap, topic)
    expected = (("site", b"lyon"), ("dev", b"d-1")) if passed_on else ()
    assert [(r.value, r.headers) for r in records] == [(b"p", expected), (b"none", ())]


def test_ctl_shows_no_mean_latency_for_an_async_bridge() -> None:
    from services.admin.ctl.manage import _bridge_row

    def row(total: int) -> dict[str, Any]:
        figures = {"records": 4, "latency_us_total": total}
        return _bridge_row({"name": "b", "direction": "out", "metrics": figures})

    assert "latency" not in row(0)  # async: not measured (was "0.00 ms")
    assert row(8000)["latency"] == "2.00 ms"
