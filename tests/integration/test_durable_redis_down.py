"""Redis down: persistent CONNECTs are refused, clean sessions go on, and it recovers."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from services.config import Settings
from services.embedded.redis_server import RedisServer
from tests.integration.conftest import Paho
from tests.support.backend_node import backend_settings, start_node
from tests.support.wait import wait_until

# paho reports a 3.x CONNACK return code 3 ("server unavailable") as ReasonCode 0x88
V3_SERVER_UNAVAILABLE = 0x88
V5_SERVER_UNAVAILABLE = 0x88


def long_ttl(settings: Settings) -> Settings:
    """A cluster TTL these tests outlast: a node fences itself half a TTL after
    its last stored heartbeat (tests/integration/test_self_fencing.py), and
    here Redis is down for a few seconds on purpose."""
    return replace(settings, cluster_ttl_s=120.0)


def connect_code(port: int, client_id: str, v5: bool) -> int:
    client = (
        Paho(port, client_id, v5=True, clean=False, session_expiry=60)
        if v5
        else Paho(port, client_id, clean=False)
    )
    client.client._reconnect_on_failure = False
    try:
        return int(getattr(rc := client.connack(timeout=10.0)[1], "value", rc))
    finally:
        client.close()


def test_redis_down_refuses_persistent_keeps_clean(
    tmp_path: Path, kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    redis = RedisServer(tmp_path / "redis").start()
    node = None
    clients: list[Paho] = []
    try:
        settings = backend_settings(redis.url, kafka_bootstrap, kafka_topic_prefix)
        node = start_node(long_ttl(settings))
        assert connect_code(node.mqtt_port, "p-before", v5=False) == 0
        sub = Paho(node.mqtt_port, "c-sub")
        pub = Paho(node.mqtt_port, "c-pub", v5=True)
        clients += [sub, pub]
        assert sub.connack()[1] == 0 and pub.connack()[1] == 0
        assert sub.subscribe("r/#", qos=1)[0] == 1

        redis.stop()
        assert connect_code(node.mqtt_port, "p3", v5=False) == V3_SERVER_UNAVAILABLE
        assert connect_code(node.mqtt_port, "p5", v5=True) == V5_SERVER_UNAVAILABLE
        pub.publish("r/1", b"one", qos=1)
        pub.publish("r/0", b"zero", qos=0)
        assert {sub.message().payload, sub.message().payload} == {b"one", b"zero"}
        late = Paho(node.mqtt_port, "c-late")  # a clean CONNECT + SUBSCRIBE needs no Redis
        clients.append(late)
        assert late.connack()[1] == 0
        assert late.subscribe("r/#", qos=0)[0] == 0

        redis = RedisServer(tmp_path / "redis", port=redis.port).start()
        wait_until(
            lambda: connect_code(node.mqtt_port, "p3", v5=False) == 0,
            "persistent sessions to recover",
            timeout=15.0,
        )
        assert connect_code(node.mqtt_port, "p5", v5=True) == 0
    finally:
        for c in clients:
            c.close()
        if node is not None:
            node.stop()
        redis.stop()


def test_redis_down_fails_publishes_to_persistent_subscribers(
    tmp_path: Path, kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    import queue

    redis = RedisServer(tmp_path / "redis").start()
    node = None
    clients: list[Paho] = []
    try:
        settings = backend_settings(redis.url, kafka_bootstrap, kafka_topic_prefix)
        node = start_node(long_ttl(settings))
        sub = Paho(node.mqtt_port, "d-sub", clean=False)
        v5 = Paho(node.mqtt_port, "d-pub5", v5=True)
        v3 = Paho(node.mqtt_port, "d-pub3")
        clients += [sub, v5, v3]
        assert all(int(getattr(rc := c.connack()[1], "value", rc)) == 0 for c in clients)
        assert sub.subscribe("d/#", qos=1)[0] == 1
        acks: queue.Queue[int] = queue.Queue()
        v5.client.on_publish = lambda c, u, mid, rc, p: acks.put(int(rc.value))
        v3.client._reconnect_on_failure = False

        redis.stop()
        v5.client.publish("d/1", b"lost", qos=1)
        assert acks.get(timeout=10.0) == 0x80  # PUBACK "unspecified error"
        v3.client.publish("d/1", b"lost", qos=1)
        assert v3.disconnects.get(timeout=10.0) is not None  # 3.x: disconnected, resends

        redis = RedisServer(tmp_path / "redis", port=redis.port).start()
        deadline = time.monotonic() + 15.0
        while True:
            v5.client.publish("d/2", b"kept", qos=1)
            if acks.get(timeout=10.0) == 0:
                break
            assert time.monotonic() < deadline, "publishes did not recover"
        assert sub.message(timeout=10.0).payload == b"kept"
    finally:
        for c in clients:
            c.close()
        if node is not None:
            node.stop()
        redis.stop()
