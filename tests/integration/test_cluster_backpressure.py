"""Link back-pressure: a peer that stops reading holds QoS 1/2 publishers, loses nothing.

Two nodes in this process on one Redis and Kafka. Node B stops reading its
inbound cluster link (as a stalled peer would); a QoS 1 publisher on A sends
large messages to a subscriber on B. Once A's link to B is past its buffer
limit, A holds that publisher (each hold bounded, as for a slow local
subscriber, and again for its next message while the link stays backed up);
when B reads again the buffer drains, the publisher goes on, and every
message arrives in order.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Paho
from tests.integration.test_cluster_nodes import drain, until_delivered
from tests.support.backend_node import BackendNode, backend_settings, start_node
from tests.support.wait import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.kafka]

MESSAGES = 40
PAYLOAD = 900 * 1024  # 40 x 900 KiB (under the 1 MiB packet limit): far past the link's
# 8 MiB buffer plus both sockets' kernel buffers


@pytest.fixture
def two(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str, tmp_path: Path
) -> Iterator[tuple[BackendNode, BackendNode]]:
    a = start_node(backend_settings(redis_url, kafka_bootstrap, kafka_topic_prefix, "bp-a"))
    try:
        b = start_node(backend_settings(redis_url, kafka_bootstrap, kafka_topic_prefix, "bp-b"))
    except BaseException:
        a.stop()
        raise
    try:
        yield a, b
    finally:
        b.stop()
        a.stop()


def inbound_reading(node: BackendNode, on: bool) -> int:
    def flip() -> int:
        transports: Any = node.node.services.cluster.links._inbound
        for t in transports:
            t.resume_reading() if on else t.pause_reading()
        return len(transports)

    count: int = node.call(flip)
    return count


def test_a_stalled_peer_holds_qos1_publishers_and_loses_nothing(
    two: tuple[BackendNode, BackendNode], clients: list[Paho]
) -> None:
    a, b = two
    sub = Paho(b.mqtt_port, "bp-sub", v5=True)
    clients.append(sub)
    sub.connack()
    sub.subscribe("bp/#", 1)
    pub = Paho(a.mqtt_port, "bp-pub", v5=True)
    clients.append(pub)
    pub.connack()
    until_delivered(pub, sub, "bp/probe", 1)  # A routes to B over the link
    drain(sub)
    assert inbound_reading(b, on=False) >= 1
    infos = [pub.client.publish("bp/big", b"%03d" % i + b"x" * PAYLOAD, 1) for i in range(MESSAGES)]

    def held(times: int) -> bool:
        gate = a.call(lambda: a.node.broker.remote.gates.get("bp-b"))
        return gate is not None and gate.holds >= times

    wait_until(lambda: held(1), "A holding the publisher for B's backed-up link", timeout=30.0)
    assert a.call(lambda: a.node.services.cluster.backlog("bp-b")) > 0
    # each hold is bounded, but a link still backed up holds the publisher again
    wait_until(lambda: held(3), "A holding the publisher again after the bound", timeout=30.0)
    acked = sum(info.is_published() for info in infos)
    assert acked < MESSAGES, "the publisher ran free past a link that is still backed up"
    inbound_reading(b, on=True)
    for info in infos:
        info.wait_for_publish(timeout=30.0)
        assert info.is_published()
    got = [sub.message(timeout=30.0).payload[:3] for _ in range(MESSAGES)]
    assert got == [b"%03d" % i for i in range(MESSAGES)]  # all, in order
    assert a.call(lambda: a.node.services.cluster.backlog("bp-b")) == 0


def test_a_slow_subscriber_holds_the_link_it_is_fed_by(
    two: tuple[BackendNode, BackendNode], clients: list[Paho]
) -> None:
    """A subscriber on B stops reading; B stops handling A's link for it (bounded)
    instead of letting its queue overflow: every acknowledged message arrives."""
    a, b = two
    count, size = 1500, 10 * 1024  # 15 MiB: past the subscriber's socket buffers,
    # and past its queue bound (1000) if nothing held the link
    sub = Paho(b.mqtt_port, "slow-sub")  # 3.1.1: a small inflight window, then the queue
    clients.append(sub)
    sub.connack()
    sub.subscribe("slow/#", 1)
    pub = Paho(a.mqtt_port, "slow-pub", v5=True)
    clients.append(pub)
    pub.connack()
    until_delivered(pub, sub, "slow/probe", 1)
    drain(sub)
    sub.client.loop_stop()  # the subscriber stops reading its socket

    def link_held() -> bool:
        def holds() -> int:
            links = b.node.services.cluster.links
            return sum(getattr(t.get_protocol().holder, "holds", 0) for t in links._inbound)

        return int(b.call(holds)) > 0

    infos = [pub.client.publish("slow/n", b"%05d" % i + b"y" * size, 1) for i in range(count)]
    wait_until(link_held, "B holding A's link for its slow subscriber", timeout=30.0)
    sub.client.loop_start()
    for info in infos:
        info.wait_for_publish(timeout=30.0)
    got = [sub.message(timeout=30.0).payload[:5] for _ in range(count)]
    assert got == [b"%05d" % i for i in range(count)]
