"""A SUBSCRIBE routes on its node as soon as the node has read it.

As in Mosquitto and EMQX, a message published on the same node after the
SUBSCRIBE was read reaches the subscriber even before its SUBACK (request /
response and no-local tests depend on it). The SUBACK still waits for the
event log; if the log refuses the event, the route is removed again and the
SUBACK carries the failure. An UNSUBSCRIBE stops routing at once, and a
refused one routes again.
"""

from __future__ import annotations

import pytest

from services.embedded.kafka import EmbeddedKafka
from services.mqtt.codec import encode
from services.mqtt.packets import Publish, Suback, Subscribe, Subscription, Unsuback, Unsubscribe
from tests.integration.conftest import NodeRunner
from tests.integration.rawclient import LEVELS, V5, Raw, opened
from tests.support.backend_node import backend_settings, start_node

APPEND_TIMEOUT_S = 1.5


@pytest.mark.parametrize("level", LEVELS)
def test_publish_in_the_same_read_as_subscribe_is_delivered(
    raws: list[Raw], node: NodeRunner, level: int
) -> None:
    client = opened(raws, node, "same-read", level)
    client.send_bytes(
        encode(Subscribe(1, (Subscription("req/reply", 1),)), level)
        + encode(Publish("req/reply", b"answer", qos=1, packet_id=2), level)
    )
    got = [client.recv(), client.recv(), client.recv()]
    published = [p for p in got if isinstance(p, Publish)]
    assert [p.payload for p in published] == [b"answer"]
    assert any(isinstance(p, Suback) and p.reason_codes == (1,) for p in got)


@pytest.mark.redis
@pytest.mark.kafka
def test_routes_before_the_log_and_unroutes_on_its_failure(
    private_kafka: EmbeddedKafka, redis_url: str, kafka_topic_prefix: str, raws: list[Raw]
) -> None:
    settings = backend_settings(
        redis_url, private_kafka.bootstrap, kafka_topic_prefix, append_timeout_s=APPEND_TIMEOUT_S
    )
    node = start_node(settings)
    try:
        sub = opened(raws, node, "early-sub", V5)
        pub = opened(raws, node, "early-pub", V5)
        assert sub.subscribe(Subscription("barrier", 0)).reason_codes == (0,)
        assert sub.subscribe(Subscription("kept/#", 0), packet_id=2).reason_codes == (0,)

        private_kafka.pause()
        try:
            # SUBSCRIBE while the log stalls: routed at once, SUBACK fails later.
            sub.send(Subscribe(3, (Subscription("late/t", 0),)))
            pub.send(Publish("barrier", b"b1"))  # once it is here, so is the SUBSCRIBE
            assert sub.expect(Publish).payload == b"b1"
            pub.send(Publish("late/t", b"before-suback"))
            assert sub.expect(Publish).payload == b"before-suback"
            suback = sub.expect(Suback, timeout=3 * APPEND_TIMEOUT_S + 5)
            assert suback.packet_id == 3 and suback.reason_codes == (0x83,)
            pub.send(Publish("late/t", b"after-failure"))
            pub.send(Publish("barrier", b"b2"))
            assert sub.expect(Publish).payload == b"b2", "the failed route was removed"

            # UNSUBSCRIBE while the log stalls: stops at once, comes back on failure.
            sub.send(Unsubscribe(4, ("kept/#",)))
            pub.send(Publish("barrier", b"b3"))
            assert sub.expect(Publish).payload == b"b3"
            pub.send(Publish("kept/x", b"while-unsubscribing"))
            pub.send(Publish("barrier", b"b4"))
            assert sub.expect(Publish).payload == b"b4", "unsubscribe stopped routing at once"
            unsuback = sub.expect(Unsuback, timeout=3 * APPEND_TIMEOUT_S + 5)
            assert unsuback.packet_id == 4 and unsuback.reason_codes == (0x80,)
            pub.send(Publish("kept/x", b"routed-again"))
            assert sub.expect(Publish).payload == b"routed-again"
        finally:
            private_kafka.resume()
    finally:
        node.stop()
