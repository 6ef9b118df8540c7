"""A sync bridge's records of one loop turn share one future (`tally.Turn`),
resolved once Kafka acknowledged every one of them: on the embedded Kafka."""

from __future__ import annotations

import asyncio

from services.bridge.kafka import KafkaBridge
from services.bridge.templates import Fields
from services.config.bridges import KafkaOut, Mode
from services.mqtt.packets import Message
from tests.bridge.kafka import read_topic
from tests.bridge.test_kafka_out import kafka_topic

RECORDS = 40


def test_one_future_per_turn_resolved_after_kafka_took_them_all(kafka_bootstrap: str) -> None:
    topic = kafka_topic()
    table = KafkaOut(name="turns", filter="t/#", topic=topic, mode=Mode.SYNC, key="${clientid}",
                     value="${payload}", partitions=2)  # fmt: skip

    async def run() -> None:
        bridge = KafkaBridge(table, kafka_bootstrap, asyncio.get_running_loop())
        await bridge.start()
        try:
            first = [bridge.produce(Fields(Message("t/1", b"%d" % n, qos=1, sender=f"c{n % 3}"),
                                           None, 0)) for n in range(RECORDS)]  # fmt: skip
            assert first[0] is not None and all(f is first[0] for f in first)
            assert await asyncio.wait_for(first[0], 30) is True
            assert bridge.records == RECORDS and bridge.buffered_records == 0
            later = bridge.produce(Fields(Message("t/1", b"late", qos=1, sender="c"), None, 0))
            assert later is not None and later is not first[0]
            assert await asyncio.wait_for(later, 30) is True
        finally:
            await bridge.close()

    asyncio.run(run())
    values = sorted(r.value for r in read_topic(kafka_bootstrap, topic))
    assert values == sorted([b"%d" % n for n in range(RECORDS)] + [b"late"])
