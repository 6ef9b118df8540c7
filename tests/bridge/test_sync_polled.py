"""A sync bridge's delivery reports are taken on the event loop's thread: the
loop polls the producer while records wait (no poll thread taking the GIL
from the loop once per report), and every record's future still resolves
once Kafka has it: on the embedded Kafka."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any

from services.bridge.kafka import KafkaBridge
from services.bridge.templates import Fields
from services.config.bridges import KafkaOut, Mode
from services.mqtt.packets import Message
from tests.bridge.kafka import read_topic
from tests.bridge.test_kafka_out import kafka_topic

RECORDS = 200
TURNS = 4
WAIT_S = 30.0


class ThreadOfReports(deque[Any]):
    """The bridge's report queue, noting the thread of each report."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[int] = set()

    def append(self, report: Any) -> None:
        self.threads.add(threading.get_ident())
        super().append(report)


def test_sync_reports_are_taken_on_the_loop(kafka_bootstrap: str) -> None:
    topic = kafka_topic()
    table = KafkaOut(name="polled", filter="a/#", topic=topic, mode=Mode.SYNC,
                     value="${payload}", partitions=2)  # fmt: skip

    async def run() -> None:
        bridge = KafkaBridge(table, kafka_bootstrap, asyncio.get_running_loop())
        bridge._reports = reports = ThreadOfReports()
        await bridge.start()
        try:
            futures = []
            for turn in range(TURNS):  # records of several loop turns, each turn one future
                for n in range(RECORDS // TURNS):
                    message = Message("a/1", b"%d-%d" % (turn, n), qos=1, sender=f"c{n % 3}")
                    future = bridge.produce(Fields(message, None, 0))
                    assert future is not None
                    futures.append(future)
                await asyncio.sleep(0)
            assert await asyncio.wait_for(asyncio.gather(*futures), WAIT_S) == [True] * RECORDS
            s = bridge.stats()
            assert (s.records, s.failures, s.dropped, s.buffered_records) == (RECORDS, 0, 0, 0)
            assert reports.threads == {threading.get_ident()}  # the loop's, no other
        finally:
            await bridge.close()

    asyncio.run(run())
    assert len(read_topic(kafka_bootstrap, topic)) == RECORDS
