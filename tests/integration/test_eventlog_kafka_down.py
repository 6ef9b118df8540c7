"""The event log stalls (Kafka paused): SUBACK never precedes its event.

While the Kafka-protocol broker is stopped (SIGSTOP) a SUBSCRIBE gets its
failure code within the append bound (3.x 0x80, 5.0 0x83) and nothing is
applied, while QoS 0/1 traffic between connected clean clients flows. Once
resumed, a granted SUBACK means the Subscribed event is already in the log.
"""

from __future__ import annotations

import time
from typing import Any

from services.embedded.kafka import EmbeddedKafka
from tests.integration.conftest import Paho
from tests.support.backend_node import backend_settings, start_node
from tests.support.eventlog import subscribed_in_log

APPEND_TIMEOUT_S = 1.5


def codes(suback: Any) -> list[int]:
    return [int(getattr(c, "value", c)) for c in suback]


def test_kafka_paused_fails_subacks_not_traffic(
    private_kafka: EmbeddedKafka, redis_url: str, kafka_topic_prefix: str
) -> None:
    bootstrap = private_kafka.bootstrap
    settings = backend_settings(
        redis_url, bootstrap, kafka_topic_prefix, append_timeout_s=APPEND_TIMEOUT_S
    )
    node = start_node(settings)
    clients: list[Paho] = []
    try:
        sub = Paho(node.mqtt_port, "k-sub")
        v5 = Paho(node.mqtt_port, "k-v5", v5=True)
        pub = Paho(node.mqtt_port, "k-pub")
        clients += [sub, v5, pub]
        for c in clients:
            assert c.connack()[1] == 0
        assert codes(sub.subscribe("k/#", qos=1)) == [1]

        private_kafka.pause()
        try:
            pub.publish("k/1", b"q1", qos=1)
            pub.publish("k/0", b"q0", qos=0)
            got = {sub.message().payload, sub.message().payload}
            assert got == {b"q1", b"q0"}

            began = time.monotonic()
            assert codes(sub.subscribe("paused/3", qos=1)) == [0x80]
            assert codes(v5.subscribe("paused/5", qos=1)) == [0x83]
            assert time.monotonic() - began < 2 * APPEND_TIMEOUT_S + 3.0
            assert node.call(lambda: node.node.broker.trie.filters("k-v5")) == []
        finally:
            private_kafka.resume()

        deadline = time.monotonic() + 30.0
        while True:  # the producer may need a retry or a rebuild after the stall
            answer = codes(v5.subscribe("resumed/5", qos=1))
            if answer == [1]:
                assert subscribed_in_log(bootstrap, kafka_topic_prefix, "k-v5", "resumed/5")
                break
            assert answer == [0x83]
            assert time.monotonic() < deadline, "the log did not come back"
        assert "resumed/5" in node.call(lambda: node.node.broker.trie.filters("k-v5"))
    finally:
        for c in clients:
            c.close()
        node.stop()
