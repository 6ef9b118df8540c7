"""A persistent session's full queue refuses new QoS 1/2 messages; it never drops
one that a publisher was told was stored.

Under the default policy (`limits.queue_full = "refuse"`) an MQTT 5 publisher
gets PUBACK 0x97 (quota exceeded) for a message that did not fit, and a 3.1.1
publisher, whose PUBACK cannot fail, is disconnected so that it resends later.
Every acknowledged message reaches the subscriber when it comes back.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from services.mqtt.packets import Properties, Puback, Publish, Subscription
from tests.integration.rawclient import V5, V311, Raw, opened
from tests.support.backend_node import BackendNode, backend_settings, start_node

pytestmark = [pytest.mark.redis, pytest.mark.kafka]

LIMIT = 5


@pytest.fixture
def small_queue_node(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str
) -> Iterator[BackendNode]:
    base = backend_settings(redis_url, kafka_bootstrap, kafka_topic_prefix)
    runner = start_node(replace(base, limits=replace(base.limits, queue_limit=LIMIT)))
    try:
        yield runner
    finally:
        runner.stop()


def test_full_queue_refuses_and_loses_nothing_acknowledged(
    small_queue_node: BackendNode, raws: list[Raw]
) -> None:
    node = small_queue_node
    persistent = {"clean_start": False, "properties": Properties(session_expiry_interval=3600)}
    sub = opened(raws, node, "qf-sub", V5, **persistent)
    assert sub.subscribe(Subscription("qf/t", 1)).reason_codes == (1,)
    sub.close()

    pub = opened(raws, node, "qf-pub5", V5)
    codes = []
    for i in range(1, LIMIT + 4):
        pub.send(Publish("qf/t", b"%d" % i, qos=1, packet_id=i))
        codes.append(pub.expect(Puback).reason_code)
    assert codes == [0] * LIMIT + [0x97] * 3

    old = opened(raws, node, "qf-pub3", V311)
    old.send(Publish("qf/t", b"v3", qos=1, packet_id=1))
    assert old.closed() == [], "a 3.x publisher gets no PUBACK for a refused message"

    back = opened(raws, node, "qf-sub", V5, **persistent)
    got = []
    for _ in range(LIMIT):
        p = back.expect(Publish)
        got.append(p.payload)
        back.send(Puback(p.packet_id))
    assert got == [b"%d" % i for i in range(1, LIMIT + 1)]
    pub.send(Publish("qf/t", b"barrier", qos=1, packet_id=50))
    assert pub.expect(Puback).reason_code == 0  # room again
    assert back.expect(Publish).payload == b"barrier"


def test_drop_oldest_policy_is_available(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str, raws: list[Raw]
) -> None:
    base = backend_settings(redis_url, kafka_bootstrap, kafka_topic_prefix)
    limits = replace(base.limits, queue_limit=2, queue_full="drop_oldest")
    node = start_node(replace(base, limits=limits))
    try:
        persistent = {"clean_start": False, "properties": Properties(session_expiry_interval=60)}
        sub = opened(raws, node, "qd-sub", V5, **persistent)
        sub.subscribe(Subscription("qd/t", 1))
        sub.close()
        pub = opened(raws, node, "qd-pub", V5)
        for i in range(1, 5):
            pub.send(Publish("qd/t", b"%d" % i, qos=1, packet_id=i))
            assert pub.expect(Puback).reason_code == 0
        back = opened(raws, node, "qd-sub", V5, **persistent)
        assert [back.expect(Publish).payload for _ in range(2)] == [b"3", b"4"]
    finally:
        node.stop()

