"""Resuming a persistent session, on the Redis path, whatever the new CONNECT says.

MQTT 5 3.1.2.4: Clean Start 0 with an existing session resumes it; the
Session Expiry Interval of the new CONNECT (absent: 0) only decides what
happens after this connection ends (3.1.2.11.2). A DISCONNECT may raise a
non-zero expiry (3.14.2.2.2). A queued message's expiry keeps counting down,
so the Message Expiry Interval delivered is what is left of it (3.3.2.3.3).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.integration.conftest import Paho
from tests.support.backend_node import BackendNode, backend_settings, start_node

pytestmark = [pytest.mark.redis, pytest.mark.kafka]


@pytest.fixture
def durable_node(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str
) -> Iterator[BackendNode]:
    runner = start_node(backend_settings(redis_url, kafka_bootstrap, kafka_topic_prefix))
    try:
        yield runner
    finally:
        runner.stop()


def _publish_each_qos(port: int, topic: str) -> None:
    pub = Paho(port, "resume-pub", v5=True)
    assert pub.connack()[1] == 0
    for qos in (0, 1, 2):
        pub.publish(topic, f"q{qos}".encode(), qos=qos)
    pub.close()


def _resumed_payloads(port: int, client_id: str) -> list[str]:
    """Reconnect with Clean Start 0 and no Session Expiry Interval; the payloads
    that arrive before a barrier message published after the CONNACK."""
    sub = Paho(port, client_id, v5=True, clean=False, session_expiry=None)
    flags, rc = sub.connack()
    assert rc == 0
    assert flags.session_present, "Clean Start 0 must resume the existing session"
    barrier = Paho(port, "resume-barrier", v5=True)
    assert barrier.connack()[1] == 0
    barrier.publish("resume/t", b"barrier", qos=2)  # paho hands QoS 2 over at PUBREL
    barrier.close()
    got = []
    while (payload := sub.message(timeout=10.0).payload.decode()) != "barrier":
        got.append(payload)
    sub.close()
    return got


def test_clean_start_0_without_expiry_resumes_the_queue(durable_node: BackendNode) -> None:
    port = durable_node.mqtt_port
    sub = Paho(port, "resume-sub", v5=True, clean=False, session_expiry=99999)
    assert sub.connack()[1] == 0
    assert sub.subscribe("resume/t", qos=2)[0] == 2
    sub.close()
    _publish_each_qos(port, "resume/t")
    got = _resumed_payloads(port, "resume-sub")
    assert [p for p in got if p != "q0"] == ["q1", "q2"]  # QoS 0 may or may not be kept


def test_disconnect_raising_expiry_then_resume_without_expiry(
    durable_node: BackendNode,
) -> None:
    port = durable_node.mqtt_port
    sub = Paho(port, "resume-raise", v5=True, clean=False, session_expiry=60)
    assert sub.connack()[1] == 0
    assert sub.subscribe("resume/t", qos=1)[0] == 1
    props = Properties(PacketTypes.DISCONNECT)
    props.SessionExpiryInterval = 99999
    sub.client.disconnect(properties=props)
    sub.client.loop_stop()
    _publish_each_qos(port, "resume/t")
    got = _resumed_payloads(port, "resume-raise")
    assert [p for p in got if p != "q0"] == ["q1", "q2"]


def test_session_without_expiry_ends_with_its_resumed_connection(
    durable_node: BackendNode,
) -> None:
    """The expiry of the resuming CONNECT (0) applies once that connection ends."""
    port = durable_node.mqtt_port
    sub = Paho(port, "resume-end", v5=True, clean=False, session_expiry=99999)
    assert sub.connack()[1] == 0
    assert sub.subscribe("resume/t", qos=1)[0] == 1
    sub.close()
    again = Paho(port, "resume-end", v5=True, clean=False, session_expiry=None)
    assert again.connack()[0].session_present
    again.close()
    last = Paho(port, "resume-end", v5=True, clean=False, session_expiry=99999)
    assert not last.connack()[0].session_present
    last.close()


def test_queued_message_expiry_counts_down(durable_node: BackendNode) -> None:
    port = durable_node.mqtt_port
    sub = Paho(port, "resume-exp", v5=True, clean=False, session_expiry=99999)
    assert sub.connack()[1] == 0
    assert sub.subscribe("resume/x", qos=1)[0] == 1
    sub.close()
    pub = Paho(port, "resume-exp-pub", v5=True)
    assert pub.connack()[1] == 0
    props = Properties(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = 100
    info = pub.client.publish("resume/x", b"ages", 1, properties=props)
    info.wait_for_publish(timeout=5.0)
    queued_at = time.monotonic()
    pub.close()
    # The scenario: the message waits in the queue for more than a second.
    time.sleep(max(0.0, 1.2 - (time.monotonic() - queued_at)))
    again = Paho(port, "resume-exp", v5=True, clean=False, session_expiry=None)
    assert again.connack()[0].session_present
    message = again.message(timeout=10.0)
    assert message.payload == b"ages"
    assert message.properties.MessageExpiryInterval < 100
    again.close()
