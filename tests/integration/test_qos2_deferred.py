"""A QoS 2 message leaves the node only once its packet id is stored.

What leaves a node at once (a QoS 0 write to a clean subscriber, a forward to
another node) used to go before the publisher's packet id was stored with the
message's durable copies. A node dying in between gave those subscribers a
copy that the publisher's resend, through another node, gave them again (the
cluster chaos test saw it). Now such copies wait for the store and go only
if the message was stored as new. Shown here with a store that refuses the
message (a full queue: PUBREC 0x97): the clean subscriber never gets it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.integration.conftest import Paho
from tests.support.backend_node import BackendNode, backend_settings, start_node

pytestmark = [pytest.mark.redis, pytest.mark.kafka]


@pytest.fixture
def node(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str, tmp_path: Path
) -> Iterator[BackendNode]:
    settings = backend_settings(redis_url, kafka_bootstrap, kafka_topic_prefix, "q2")
    settings = replace(settings, limits=replace(settings.limits, queue_limit=1))
    runner = start_node(settings)
    try:
        yield runner
    finally:
        runner.stop()


def test_a_qos2_message_the_store_refused_reaches_no_clean_subscriber(
    node: BackendNode, clients: list[Paho]
) -> None:

    def client(client_id: str, **kw: object) -> Paho:
        c = Paho(node.mqtt_port, client_id, v5=True, **kw)  # type: ignore[arg-type]
        clients.append(c)
        assert c.connack()[1] == 0
        return c

    durable = client("q2-durable", clean=False, session_expiry=300)
    durable.subscribe("q2/#", 1)
    durable.close()  # offline: its queue (bound 1) fills with the next message
    sub = client("q2-sub")
    sub.subscribe("q2/#", 0)
    other = client("q2-other")
    other.publish("q2/fill", b"F", 1)
    assert sub.message().payload == b"F"
    pub = client("q2-pub", clean=False, session_expiry=300)
    pub.client.publish("q2/refused", b"M", 2)
    pub.published.get(timeout=10.0)  # its PUBREC (0x97: the durable copy did not fit)
    assert [m.payload for m in sub.before_barrier(other, "q2/barrier", 0)] == []
