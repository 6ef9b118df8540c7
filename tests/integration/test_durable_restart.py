"""A persistent session survives a node restart on the same Redis and Kafka.

Its subscriptions come back from the event log, its queued QoS 1 messages
from Redis, and both reach the client once it reconnects to the new node
process.
"""

from __future__ import annotations

from tests.integration.conftest import Paho
from tests.support.backend_node import backend_settings, start_node
from tests.support.wait import wait_until


def test_persistent_session_survives_node_restart(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    settings = backend_settings(redis_url, kafka_bootstrap, kafka_topic_prefix)
    first = start_node(settings)
    try:
        sub = Paho(first.mqtt_port, "durable-sub", clean=False)
        assert sub.connack()[1] == 0
        assert sub.subscribe("t/#", qos=1)[0] == 1
        sub.close()
        pub = Paho(first.mqtt_port, "pub1")
        assert pub.connack()[1] == 0
        for i in range(5):
            pub.publish("t/a", f"m{i}".encode(), qos=1)  # PUBACK: stored in Redis
        pub.close()
    finally:
        first.stop()

    second = start_node(settings)
    try:

        def restored() -> bool:
            broker = second.node.broker
            session = broker.sessions.get("durable-sub")
            return (
                "t/#" in broker.trie.filters("durable-sub")
                and session is not None
                and session.conn is None
                and session.durable
            )

        assert second.call(restored), "subscription and offline session come from the log"
        pub = Paho(second.mqtt_port, "pub2")
        assert pub.connack()[1] == 0
        for i in range(5, 8):
            pub.publish("t/b", f"m{i}".encode(), qos=1)
        pub.close()
        sub = Paho(second.mqtt_port, "durable-sub", clean=False)
        flags, rc = sub.connack()
        assert rc == 0 and flags.session_present
        got = [sub.message(timeout=10.0).payload.decode() for _ in range(8)]
        assert got == [f"m{i}" for i in range(8)]
        assert sub.before_barrier(sub, "t/barrier", 1) == []
        wait_until(
            lambda: (
                second.call(lambda: second.node.broker.logstate.view.session("durable-sub")).online
            ),
            "the reconnect in the view",
        )
        sub.close()
    finally:
        second.stop()


def test_recovered_offline_session_still_expires(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    settings = backend_settings(redis_url, kafka_bootstrap, kafka_topic_prefix)
    first = start_node(settings)
    try:
        client = Paho(first.mqtt_port, "short", v5=True, clean=False, session_expiry=4)
        assert client.connack()[1] == 0
        assert client.subscribe("s/#", qos=1)[0] == 1
        client.close()
    finally:
        first.stop()
    second = start_node(settings)
    try:
        assert second.call(lambda: "short" in second.node.broker.sessions)
        wait_until(
            lambda: second.call(lambda: "short" not in second.node.broker.sessions),
            "the recovered session to expire",
            timeout=10.0,
        )
        assert second.call(lambda: second.node.broker.trie.filters("short")) == []
    finally:
        second.stop()
