"""Self-fencing (docs/architecture.md 5): a node whose heartbeat cannot be
stored for half the cluster TTL disconnects its clients (5.0: DISCONNECT
0x9C use another server: DISCONNECT has no 0x88) and refuses CONNECTs
(0x88), so nothing is acknowledged there once survivors may take over what
it holds; it takes clients again once a heartbeat is stored.
Redis is frozen with SIGSTOP (a partition: connections stay open, nothing
answers), not stopped."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from pathlib import Path

from services.embedded.redis_server import RedisServer
from services.mqtt.packets import Disconnect, Puback, Publish, Subscription
from tests.integration.rawclient import Closed, Raw
from tests.support.backend_node import backend_settings, start_node
from tests.support.wait import wait_until

TTL_S = 2.0
V5 = 5
SERVER_UNAVAILABLE = 0x88
USE_ANOTHER_SERVER = 0x9C


def connack_code(port: int, client_id: str) -> int:
    raw = Raw(port, V5)
    try:
        return raw.connect(client_id).reason_code
    except (Closed, TimeoutError, OSError):
        return -1
    finally:
        raw.close()


def test_a_node_that_cannot_store_its_heartbeat_fences_itself(
    tmp_path: Path, kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    redis = RedisServer(tmp_path / "redis").start()
    assert redis.process is not None
    pid = redis.process.pid
    node = None
    try:
        settings = backend_settings(redis.url, kafka_bootstrap, kafka_topic_prefix, "fencer")
        node = start_node(replace(settings, cluster_ttl_s=TTL_S))
        sub, pub = Raw(node.mqtt_port, V5), Raw(node.mqtt_port, V5)
        assert sub.connect("sub").reason_code == 0 and pub.connect("pub").reason_code == 0
        sub.subscribe(Subscription("t", 1))
        pub.send(Publish("t", b"before", qos=1, packet_id=1))  # clean to clean: no Redis
        assert pub.expect(Puback).packet_id == 1

        os.kill(pid, signal.SIGSTOP)
        frozen = time.monotonic()
        # Before: nothing happened, and these clients went on being acknowledged
        # while survivors would take over the node's sessions and wills.
        got = pub.closed(timeout=10.0)
        fenced_after = time.monotonic() - frozen
        assert got and got[-1] == Disconnect(USE_ANOTHER_SERVER), got
        assert not any(isinstance(p, Puback) for p in got)
        assert fenced_after < TTL_S  # before any survivor could act on its death
        assert Disconnect(USE_ANOTHER_SERVER) in sub.closed(timeout=5.0)
        assert connack_code(node.mqtt_port, "late") == SERVER_UNAVAILABLE

        os.kill(pid, signal.SIGCONT)
        wait_until(lambda: connack_code(node.mqtt_port, "back") == 0, "the node to unfence")
        again = Raw(node.mqtt_port, V5)
        assert again.connect("again").reason_code == 0
        again.send(Publish("t", b"after", qos=1, packet_id=2))
        assert again.expect(Puback).packet_id == 2
        again.close()
    finally:
        os.kill(pid, signal.SIGCONT)
        if node is not None:
            node.stop()
        redis.stop()
