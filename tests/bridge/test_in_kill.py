"""A Kafka -> MQTT bridge under SIGKILLs: every record reaches a persistent
subscriber at least once.

The node runs as a subprocess (`weir up`) on the test's Redis and Kafka
with one kafka_in bridge. A producer thread writes RECORDS sequence numbers
to a 4-partition topic at a steady rate; a 3.1.1 subscriber with a
persistent session takes them at QoS 1. Each time it has received another
share, the node is SIGKILLed (records fetched, published or queued and not
yet committed), started again on the same Redis and Kafka (its consumer
joins the group anew; the dead one's partitions come back after the
session timeout) and the subscriber reconnects. In the end every sequence
number reached the subscriber; the duplicates (records consumed again
after a kill) are counted and printed.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from confluent_kafka import Producer

from tests.bridge.kafka import create_topic
from tests.bridge.process import WeirUp
from tests.support.wait import wait_until

KILLS = 3
RECORDS = 3000
RATE = 200  # records/s: the stream runs ~15 s, so every kill lands mid-stream
PARTITIONS = 4

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.serial, pytest.mark.timeout(180)]


def test_sigkills_lose_no_record(
    tmp_path: Path, redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    topic = f"in-kill-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, PARTITIONS)
    config = tmp_path / "weir.toml"
    config.write_text(
        f'[[bridge.kafka_in]]\nname = "in"\ntopics = ["{topic}"]\n'
        f'mqtt_topic = "in/${{partition}}"\nqos = 1\ngroup = "g-{topic}"\n'
        "session_timeout_s = 3.0\n"  # a dead node's partitions move on within 3 s
    )  # fmt: skip
    received: list[int] = []  # paho's thread appends (atomic)
    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="in-sub", clean_session=False)
    resent: list[int] = []  # messages MQTT sent again (DUP: not PUBACKed before a kill)
    sub.on_message = lambda c, u, m: (received.append(int(m.payload)),
                                      m.dup and resent.append(int(m.payload)))  # fmt: skip
    assignments: list[int] = []  # partition assignments each killed run logged
    subscribed = threading.Event()
    sub.on_subscribe = lambda c, u, mid, rcs, p: subscribed.set()
    stop = threading.Event()

    def write() -> None:
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 1,
                             "partitioner": "murmur2_random"})  # fmt: skip
        start = time.monotonic()
        for first in range(0, RECORDS, RATE // 10):  # a batch every 0.1 s
            if stop.is_set():
                return
            batch = range(first, min(RECORDS, first + RATE // 10))
            for n in batch:
                producer.produce(topic, b"%d" % n, b"k%d" % n)
            assert producer.flush(30) == 0, "records not acknowledged by Kafka"
            stop.wait(max(0.0, start + (first + len(batch)) / RATE - time.monotonic()))

    producer = threading.Thread(target=write, daemon=True)
    node = WeirUp(config, redis_url, kafka_bootstrap, kafka_topic_prefix)
    try:
        for run in range(KILLS + 1):
            sub.connect("127.0.0.1", node.port)
            sub.loop_start()
            if run == 0:
                sub.subscribe("in/#", qos=1)
                assert subscribed.wait(10.0)
                producer.start()
            if run == KILLS:
                break
            share = (run + 1) * RECORDS // (KILLS + 2)
            wait_until(lambda s=share: len(set(received)) >= s,  # type: ignore[misc]
                       f"records before kill {run + 1}", 60.0)  # fmt: skip
            node.kill()
            assignments.append(sum("partitions assigned" in line for line in node.lines))
            sub.loop_stop()
            node = WeirUp(config, redis_url, kafka_bootstrap, kafka_topic_prefix)
        producer.join(timeout=60)
        wait_until(lambda: len(set(received)) >= RECORDS, "every record at the subscriber", 60)
    finally:
        stop.set()
        sub.loop_stop()
        node.stop()
    counts = Counter(received)
    missing = sorted(set(range(RECORDS)) - set(counts))
    assert not missing, f"{len(missing)} records never reached the subscriber: {missing[:20]}"
    duplicates = sum(n - 1 for n in counts.values())
    print(f"{KILLS} kills (assignments per killed run: {assignments}), {RECORDS} records, "
          f"received {len(received)}, duplicates {duplicates} ({len(resent)} resent by MQTT "
          "with DUP, the rest consumed again from Kafka)")  # fmt: skip
