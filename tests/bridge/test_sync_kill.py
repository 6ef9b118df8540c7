"""Sync bridges under SIGKILLs: every PUBACKed message is in Kafka.

The node runs as a subprocess (`weir up`) on the test's Redis and Kafka
with two sync bridges on one filter. A 3.1.1 publisher (persistent session)
sends QoS 1 messages whose payloads are sequence numbers, up to 32 in
flight; each time enough more are acknowledged the node is SIGKILLed with
PUBLISHes still in flight, started again on the same Redis and Kafka, and
the publisher reconnects to it (paho resends what was not acknowledged, so
Kafka may get a message twice). After KILLS kills, every sequence number
the publisher got a PUBACK for must be in both bridges' topics: 0 missing;
the duplicates are counted and printed.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from tests.bridge.kafka import read_topic
from tests.bridge.process import WeirUp
from tests.support.wait import wait_until

KILLS = 5
ACKED_PER_RUN = 300  # PUBACKs between two kills
INFLIGHT = 32
MAX_SEQ = 60_000  # under paho's 65535 message ids, so none is reused

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.serial, pytest.mark.timeout(180)]


def test_sigkills_lose_no_acknowledged_message(
    tmp_path: Path, redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    topics = [f"bridge-kill-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    config = tmp_path / "weir.toml"
    config.write_text("".join(
        f'[[bridge.kafka_out]]\nname = "k{i}"\nfilter = "seq/#"\ntopic = "{topic}"\n'
        'value = "${payload}"\nmode = "sync"\n' for i, topic in enumerate(topics)))  # fmt: skip
    acked_mids: list[int] = []  # paho's thread appends (atomic)
    sent: dict[int, int] = {}  # mid -> sequence number (mids stay below 65536: no reuse)
    stop = threading.Event()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="seq-pub",
                         clean_session=False)  # fmt: skip
    client.max_inflight_messages_set(INFLIGHT)
    client.max_queued_messages_set(INFLIGHT)  # publish() refuses instead of queueing far ahead
    client.on_publish = lambda c, u, mid, rc, p: acked_mids.append(mid)

    def publish() -> None:
        seq = 0
        while not stop.is_set() and seq < MAX_SEQ:
            info = client.publish("seq/1", b"%d" % seq, qos=1)
            if info.rc == mqtt.MQTT_ERR_QUEUE_SIZE:
                stop.wait(0.001)  # 32 in flight: let PUBACKs come
                continue
            # Sent, or queued while the node is down: paho sends it once connected.
            assert info.rc in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN), info.rc
            sent[info.mid] = seq
            seq += 1

    publisher = threading.Thread(target=publish, daemon=True)
    node = WeirUp(config, redis_url, kafka_bootstrap, kafka_topic_prefix)
    try:
        for run in range(1, KILLS + 1):
            client.connect("127.0.0.1", node.port)
            client.loop_start()
            if run == 1:
                publisher.start()
            wait_until(lambda r=run: len(acked_mids) >= r * ACKED_PER_RUN,  # type: ignore[misc]
                       f"PUBACKs before kill {run}", 60.0)  # fmt: skip
            node.kill()
            client.loop_stop()  # no reconnects to the dead node's port
            node = WeirUp(config, redis_url, kafka_bootstrap, kafka_topic_prefix)
        stop.set()
        publisher.join(timeout=10)
    finally:
        stop.set()
        client.loop_stop()
        node.stop()
    acknowledged = {sent[mid] for mid in acked_mids}
    assert len(acknowledged) >= KILLS * ACKED_PER_RUN
    for topic in topics:
        counts = Counter(int(r.value) for r in read_topic(kafka_bootstrap, topic))
        missing = sorted(acknowledged - set(counts))
        assert not missing, f"{len(missing)} acknowledged messages not in {topic}: {missing[:20]}"
        duplicates = sum(n - 1 for n in counts.values())
        print(f"{topic}: {KILLS} kills, acked {len(acknowledged)}, sent {len(sent)}, "
              f"in Kafka {len(counts)}, duplicates {duplicates}")  # fmt: skip
