"""MQTT to Kafka through `[[bridge.kafka_out]]`, on real Redis and the embedded Kafka.

sync: a QoS 1 PUBACK means the record is in Kafka; async: acknowledged at
once, in Kafka soon after; keys partition as Java clients do; a paused
Kafka fails sync publishers (5.0 0x80, 3.x disconnected) and buffers async
records up to the byte bound, delivering them on resume.
"""

from __future__ import annotations

import json
import queue
import time
import uuid
from dataclasses import replace

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from services.bridge.api import BridgeStats
from services.config.bridges import Bridges, KafkaOut, Mode
from services.embedded.kafka import EmbeddedKafka
from tests.bridge.kafka import murmur2_partition, read_topic
from tests.integration.conftest import Paho
from tests.support.backend_node import BackendNode, backend_settings, start_node
from tests.support.wait import wait_until

PARTITIONS = 4


def bridged_node(redis_url: str, bootstrap: str, prefix: str, *tables: KafkaOut) -> BackendNode:
    settings = backend_settings(redis_url, bootstrap, prefix)
    return start_node(replace(settings, bridge=Bridges(kafka_out=tables)))


def stats(node: BackendNode) -> list[BridgeStats]:
    result: list[BridgeStats] = node.call(node.node.broker.seams.egress.stats)
    return result


def acks_of(client: Paho) -> queue.Queue[int]:
    """PUBACK reason codes as they come (0 for a 3.x PUBACK)."""
    acks: queue.Queue[int] = queue.Queue()
    client.client.on_publish = lambda c, u, mid, rc, p: acks.put(int(getattr(rc, "value", rc)))
    return acks


def kafka_topic() -> str:
    return f"bridge-{uuid.uuid4().hex[:10]}"


def test_sync_puback_means_the_record_is_in_kafka(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    topic = kafka_topic()
    table = KafkaOut(name="telemetry", filter="tele/#", topic=topic, partitions=PARTITIONS,
                     headers=(("via", "weir"), ("t", "${topic}")))  # fmt: skip
    node = bridged_node(redis_url, kafka_bootstrap, kafka_topic_prefix, table)
    pub = None
    try:
        pub = Paho(node.mqtt_port, "dev-1", v5=True, username="alice", password="x")
        assert pub.connack()[1] == 0
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = ("site", "lyon")
        for i in range(5):
            info = pub.client.publish("tele/temp", b"%d" % i, qos=1, properties=props)
            info.wait_for_publish(timeout=10.0)
            # PUBACK came: the record is already in Kafka, nothing to wait for.
            assert len(read_topic(kafka_bootstrap, topic)) == i + 1
        info = pub.client.publish("tele/q2", b"5", qos=2)
        info.wait_for_publish(timeout=10.0)  # PUBCOMP
        assert len(read_topic(kafka_bootstrap, topic)) == 6
        pub.publish("other/temp", b"not bridged", qos=1)
        pub.publish("tele/qos0", b"q0", qos=0)
        wait_until(lambda: stats(node)[0].records == 7, "the QoS 0 record")

        records = read_topic(kafka_bootstrap, topic)
        assert [r.key for r in records] == [b"dev-1"] * 7
        assert len({r.partition for r in records}) == 1  # one device, one partition, in order
        first = json.loads(records[0].value)
        assert first["payload"] == "0" and first["clientid"] == "dev-1"
        assert first["username"] == "alice" and first["topic"] == "tele/temp"
        assert first["qos"] == 1 and first["user_properties"] == [["site", "lyon"]]
        payloads = [json.loads(r.value)["payload"] for r in records]
        assert payloads == ["0", "1", "2", "3", "4", "5", "q0"]
        assert dict(records[0].headers) == {"via": b"weir", "t": b"tele/temp", "site": b"lyon"}
        s = stats(node)[0]
        assert s.records == 7 and s.failures == s.dropped == s.buffered_records == 0
        assert s.bytes == sum(len(r.value) + len(r.key or b"") for r in records)
        assert 0 < s.latency_us_max <= s.latency_us_total
    finally:
        if pub is not None:
            pub.close()
        node.stop()


def test_records_partition_by_key_as_java_clients_do(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    topic = kafka_topic()
    table = KafkaOut(name="p", filter="p/+", topic=topic, partitions=PARTITIONS,
                     value="${payload}", mode=Mode.ASYNC)  # fmt: skip
    node = bridged_node(redis_url, kafka_bootstrap, kafka_topic_prefix, table)
    clients: list[Paho] = []
    try:
        ids = [f"device-{i}" for i in range(12)]
        for cid in ids:
            clients.append(c := Paho(node.mqtt_port, cid))
            assert c.connack()[1] == 0
        per_client = 20
        for n in range(per_client):
            for c, cid in zip(clients, ids, strict=True):
                c.client.publish(f"p/{cid}", b"%d" % n, qos=1)
        total = per_client * len(ids)
        wait_until(lambda: stats(node)[0].records == total, "every record in Kafka", 30.0)
        records = read_topic(kafka_bootstrap, topic)
        assert len(records) == total
        for cid in ids:
            mine = [r for r in records if r.key == cid.encode()]
            assert {r.partition for r in mine} == {murmur2_partition(cid.encode(), PARTITIONS)}
            assert [r.value for r in mine] == [b"%d" % n for n in range(per_client)]  # in order
        assert len({r.partition for r in records}) > 1  # the keys did spread
    finally:
        for c in clients:
            c.close()
        node.stop()


def test_async_acknowledges_at_once_and_delivers(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    topic = kafka_topic()
    table = KafkaOut(name="a", filter="a/#", topic=topic, mode=Mode.ASYNC,
                     key="", value="${clientid}:${payload}")  # fmt: skip
    node = bridged_node(redis_url, kafka_bootstrap, kafka_topic_prefix, table)
    pub = None
    try:
        pub = Paho(node.mqtt_port, "a-pub", v5=True)
        assert pub.connack()[1] == 0
        acks = acks_of(pub)
        for i in range(50):
            pub.client.publish("a/x", b"%d" % i, qos=1)
        assert [acks.get(timeout=10.0) for _ in range(50)] == [0] * 50
        wait_until(lambda: stats(node)[0].records == 50, "the async records in Kafka")
        records = read_topic(kafka_bootstrap, topic)
        assert sorted(r.value for r in records) == sorted(b"a-pub:%d" % i for i in range(50))
        assert {r.key for r in records} == {None}  # key = "": no key
        assert stats(node)[0].buffered_bytes == 0
    finally:
        if pub is not None:
            pub.close()
        node.stop()


def test_kafka_paused_fails_sync_and_buffers_async(
    private_kafka: EmbeddedKafka, redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    """The bridges' own Kafka (`bootstrap` in the table) is paused; the event log's is not."""
    sync_topic, async_topic = kafka_topic(), kafka_topic()
    own = private_kafka.bootstrap
    tables = (
        KafkaOut(name="s", filter="s/#", topic=sync_topic, bootstrap=own, timeout_s=1.5),
        KafkaOut(name="a", filter="a/#", topic=async_topic, bootstrap=own, mode=Mode.ASYNC,
                 value="${payload}", buffer_bytes=64 * 1024),
    )
    node = bridged_node(redis_url, kafka_bootstrap, kafka_topic_prefix, *tables)
    clients: list[Paho] = []
    try:
        v5 = Paho(node.mqtt_port, "s-v5", v5=True)
        v3 = Paho(node.mqtt_port, "s-v3")
        sub = Paho(node.mqtt_port, "s-sub")
        clients += [v5, v3, sub]
        for c in clients:
            assert c.connack()[1] == 0
        assert sub.subscribe("s/#", qos=1)[0] == 1
        acks = acks_of(v5)
        v5.publish("s/1", b"before", qos=1)
        assert acks.get(timeout=5.0) == 0

        private_kafka.pause()
        try:
            began = time.monotonic()
            v5.client.publish("s/1", b"lost", qos=1)
            assert acks.get(timeout=10.0) == 0x80  # PUBACK "unspecified error"
            assert time.monotonic() - began < 1.5 + 3.0
            v3.client._reconnect_on_failure = False
            v3.client.publish("s/1", b"lost too", qos=1)
            assert v3.disconnects.get(timeout=10.0) is not None  # 3.x: disconnected, resends
            assert sub.message().payload == b"before"  # MQTT subscribers are not held up

            payload = bytes(8 * 1024)  # 8 fit in the 64 KiB buffer (with the key), then drops
            for _ in range(10):
                v5.client.publish("a/big", payload, qos=1)
            assert [acks.get(timeout=5.0) for _ in range(10)] == [0] * 10  # async: at once
            s, a = stats(node)
            assert a.buffered_records == 7 and a.dropped == 3 and a.records == 0
            assert s.failures >= 1  # the sync records that timed out
            assert s.state == "kafka_down"  # its records timed out, none went through since
        finally:
            private_kafka.resume()

        wait_until(lambda: stats(node)[1].records == 7, "the buffered records after resume", 30)
        assert [r.value for r in read_topic(own, async_topic)] == [payload] * 7
        assert stats(node)[1].failures == 0
        deadline = time.monotonic() + 30.0
        while True:  # the producer may need a retry or a rebuild after the stall
            v5.client.publish("s/2", b"after", qos=1)
            if acks.get(timeout=10.0) == 0:
                break
            assert time.monotonic() < deadline, "sync publishes did not recover"
        assert b'"payload":"after"' in read_topic(own, sync_topic)[-1].value
        assert stats(node)[0].state == "running"  # a record went through since
    finally:
        for c in clients:
            c.close()
        node.stop()


def test_a_will_is_bridged_by_the_node_that_publishes_it(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    topic = kafka_topic()
    table = KafkaOut(name="w", filter="will/#", topic=topic, partitions=PARTITIONS)
    node = bridged_node(redis_url, kafka_bootstrap, kafka_topic_prefix, table)
    try:
        gone = Paho(node.mqtt_port, "w-dev", will=("will/w-dev", b"offline", 1))
        assert gone.connack()[1] == 0
        gone.drop()  # no DISCONNECT: the will goes out
        wait_until(lambda: stats(node)[0].records == 1, "the will's record")
        (record,) = read_topic(kafka_bootstrap, topic)
        assert record.key == b"w-dev"
        envelope = json.loads(record.value)
        assert envelope["payload"] == "offline" and envelope["topic"] == "will/w-dev"
    finally:
        node.stop()


def test_a_memory_node_bridges_to_the_kafka_its_table_names(kafka_bootstrap: str) -> None:
    from tests.integration.conftest import node_settings

    topic = kafka_topic()
    table = KafkaOut(name="m", filter="m/#", topic=topic, bootstrap=kafka_bootstrap,
                     value="${payload}")  # fmt: skip
    settings = replace(node_settings(), backend="memory", bridge=Bridges(kafka_out=(table,)))
    node = start_node(settings)
    pub = None
    try:
        pub = Paho(node.mqtt_port, "m-pub")
        assert pub.connack()[1] == 0
        pub.publish("m/1", b"from memory", qos=1)  # sync: PUBACK after Kafka's ack
        assert [r.value for r in read_topic(kafka_bootstrap, topic)] == [b"from memory"]
    finally:
        if pub is not None:
            pub.close()
        node.stop()
