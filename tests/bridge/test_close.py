"""A bridge's close gives back its producer at once: librdkafka's threads
and their sockets are gone when `close` returns, with the loop still
running. Before: the producer's periodic poll was a timer that held the
producer, so it lived on (threads, connections) until that timer fired."""

from __future__ import annotations

import asyncio
import os

import pytest

from services.bridge.kafka import KafkaBridge
from services.bridge.templates import Fields
from services.config.bridges import KafkaOut, Mode
from services.mqtt.packets import Message
from tests.bridge.test_kafka_out import kafka_topic

pytestmark = pytest.mark.kafka


def librdkafka_threads() -> int:
    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                count += f.read().startswith("rdk:")
        except OSError:  # ended meanwhile
            continue
    return count


@pytest.mark.parametrize("mode", [Mode.ASYNC, Mode.SYNC])
def test_close_ends_the_producer_while_the_loop_runs(kafka_bootstrap: str, mode: Mode) -> None:
    table = KafkaOut(name="closing", filter="a/#", topic=kafka_topic(), mode=mode,
                     value="${payload}", partitions=1)  # fmt: skip

    async def run() -> tuple[int, int, int]:
        before = librdkafka_threads()
        bridge = KafkaBridge(table, kafka_bootstrap, asyncio.get_running_loop())
        await bridge.start()
        sent = bridge.produce(Fields(Message("a/1", b"x", 1, sender="c"), None, 0))
        if sent is not None:
            assert await sent
        running = librdkafka_threads()
        await bridge.close()
        return before, running, librdkafka_threads()

    before, running, after = asyncio.run(run())
    assert running > before  # the producer's own threads
    assert after == before
