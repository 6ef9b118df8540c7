"""Kafka to MQTT through `[[bridge.kafka_in]]`, on real Redis and the embedded Kafka.

Records become MQTT messages by the table's templates; a persistent
subscriber offline when they arrive gets them on reconnect (the offsets are
committed only once the messages were stored for it); a record whose topic
renders no valid MQTT topic is skipped and counted; a paused Kafka (SIGSTOP)
holds the bridge up and it carries on after the resume. The figures show in
/metrics and /api/v5/bridges.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from services.bridge.api import BridgeStats
from services.config.bridges import Bridges, KafkaIn
from services.embedded.kafka import EmbeddedKafka
from services.metrics.collector import Exposition, NodeCollector
from services.metrics.registry import Metrics
from tests.bridge.kafka import committed, create_topic, murmur2_partition, produce
from tests.integration.conftest import Paho
from tests.support.backend_node import BackendNode, backend_settings, start_node
from tests.support.wait import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

PARTITIONS = 4
JOIN_S = 30.0  # the first group join on the embedded Kafka waits ~half the session timeout


def bridged_node(redis_url: str, bootstrap: str, prefix: str, *tables: KafkaIn) -> BackendNode:
    settings = backend_settings(redis_url, bootstrap, prefix)
    return start_node(replace(settings, bridge=Bridges(kafka_in=tables)))


def stats(node: BackendNode) -> list[BridgeStats]:
    result: list[BridgeStats] = node.call(node.node.bridge_stats)
    return result


def fresh(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:10]}"


def test_records_reach_an_offline_persistent_subscriber_by_the_templates(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    topic, group = fresh("cmds"), fresh("g")
    create_topic(kafka_bootstrap, topic, PARTITIONS)
    table = KafkaIn(name="cmds", topics=(topic,), mqtt_topic="devices/${key}/cmd",
                    payload="${header.verb}:${value}@${partition}", qos=1, group=group)  # fmt: skip
    node = bridged_node(redis_url, kafka_bootstrap, kafka_topic_prefix, table)
    sub = None
    try:
        sub = Paho(node.mqtt_port, "cmd-sub", clean=False)
        assert sub.connack()[1] == 0
        assert sub.subscribe("devices/+/cmd", qos=1) == [1]
        sub.close()  # offline, its session kept: what comes now is queued in Redis

        devices = [f"dev-{i}" for i in range(6)]
        per_device = 10
        records: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]] = [
            (d.encode(), b"%d" % n, [("verb", b"set")]) for n in range(per_device) for d in devices
        ]
        records.insert(7, (b"bad+key", b"x", []))  # renders "devices/bad+key/cmd": skipped
        produce(kafka_bootstrap, topic, records)
        total = per_device * len(devices)
        wait_until(lambda: stats(node)[0].records == total, "every record routed", JOIN_S)
        s = stats(node)[0]
        assert s.dropped == 1 and s.failures == 0 and s.direction == "in"
        assert s.bytes == sum(len(b"set:%d@0" % n) for n in range(per_device)) * len(devices)
        # Committed only after the routing: every record, the skipped one too.
        by_partition = dict.fromkeys(range(PARTITIONS), 0)
        for key, _, _ in records:
            by_partition[murmur2_partition(key or b"", PARTITIONS)] += 1
        expected = {p: n if n else -1001 for p, n in by_partition.items()}
        wait_until(lambda: committed(kafka_bootstrap, group, topic, PARTITIONS) == expected,
                   "the offsets committed")  # fmt: skip
        wait_until(lambda: stats(node)[0].lag == 0 and stats(node)[0].state == "running",
                   "no lag in the statistics")  # fmt: skip

        sub = Paho(node.mqtt_port, "cmd-sub", clean=False)
        flags, rc = sub.connack()
        assert rc == 0 and flags.session_present
        got: dict[str, list[bytes]] = {d: [] for d in devices}
        for _ in range(total):
            m = sub.message(timeout=10.0)
            assert m.qos == 1
            got[m.topic.split("/")[1]].append(m.payload)
        for d in devices:
            p = murmur2_partition(d.encode(), PARTITIONS)
            assert got[d] == [b"set:%d@%d" % (n, p) for n in range(per_device)]  # in order
        assert sub.no_message(0.3)  # nothing twice
    finally:
        if sub is not None:
            sub.close()
        node.stop()


def test_the_figures_show_in_metrics_and_the_api(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    """One node with an out and an in bridge: /metrics and /api/v5/bridges list both."""
    from services.api.bridges import bridge_json
    from services.config.bridges import KafkaOut

    topic = fresh("loop")
    create_topic(kafka_bootstrap, topic, 1)
    settings = backend_settings(redis_url, kafka_bootstrap, kafka_topic_prefix)
    tables = Bridges(
        kafka_out=(KafkaOut(name="up", filter="up/#", topic=topic, value="${payload}",
                            partitions=0),),
        kafka_in=(KafkaIn(name="down", topics=(topic,), mqtt_topic="down/${key}",
                          group=fresh("g")),),
    )  # fmt: skip
    node = start_node(replace(settings, bridge=tables))
    sub = pub = None
    try:
        sub = Paho(node.mqtt_port, "loop-sub")
        pub = Paho(node.mqtt_port, "loop-pub")
        assert sub.connack()[1] == 0 and pub.connack()[1] == 0
        assert sub.subscribe("down/#", qos=1) == [1]
        pub.publish("up/1", b"round trip", qos=1)  # sync: in Kafka now; then back into MQTT
        m = sub.message(timeout=JOIN_S)
        assert (m.topic, m.payload) == ("down/loop-pub", b"round trip")
        out = stats(node)[0]
        assert (out.name, out.direction, out.records) == ("up", "out", 1)
        wait_until(lambda: stats(node)[1].records == 1, "the in bridge's figure")

        metrics = Metrics()
        node.call(lambda: node.node._figures(metrics))
        text = Exposition(NodeCollector(metrics, "n1", "v")).render().decode()
        assert 'weir_bridge_records_total{bridge="up",direction="out"} 1.0' in text
        assert 'weir_bridge_records_total{bridge="down",direction="in"} 1.0' in text
        assert 'weir_bridge_up{bridge="down",direction="in"} 1.0' in text
        assert 'weir_bridge_lag{bridge="down",direction="in"}' in text
        assert 'weir_bridge_lag{bridge="up"' not in text  # a figure of the other direction

        listed = [bridge_json(s, "n1") for s in stats(node)]
        assert [(b["name"], b["type"], b["status"]) for b in listed] == [
            ("up", "kafka_producer", "running"), ("down", "kafka_consumer", "running")]
        assert listed[1]["metrics"]["records"] == 1 and "latency_us_max" not in listed[1]["metrics"]
    finally:
        for c in (sub, pub):
            if c is not None:
                c.close()
        node.stop()
    assert [s.state for s in node.node.bridge_stats()][1] == "stopped"


def test_kafka_paused_holds_the_bridge_up_and_it_carries_on(
    private_kafka: EmbeddedKafka, redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    """The bridge's own Kafka (`bootstrap` in the table) is paused; the event log's is not."""
    own = private_kafka.bootstrap
    topic = fresh("paused")
    create_topic(own, topic, 2)
    table = KafkaIn(name="p", topics=(topic,), mqtt_topic="p/${key}", bootstrap=own,
                    group=fresh("g"))  # fmt: skip
    node = bridged_node(redis_url, kafka_bootstrap, kafka_topic_prefix, table)
    sub = None
    try:
        sub = Paho(node.mqtt_port, "p-sub")
        assert sub.connack()[1] == 0
        assert sub.subscribe("p/#", qos=1) == [1]
        produce(own, topic, [(b"k%d" % i, b"before-%d" % i, []) for i in range(5)])
        assert sorted(sub.message(timeout=JOIN_S).payload for _ in range(5)) == [
            b"before-%d" % i for i in range(5)]
        private_kafka.pause()
        try:
            assert sub.no_message(1.0)
            assert stats(node)[0].records == 5
        finally:
            private_kafka.resume()
        produce(own, topic, [(b"k%d" % i, b"after-%d" % i, []) for i in range(5)])
        assert sorted(sub.message(timeout=JOIN_S).payload for _ in range(5)) == [
            b"after-%d" % i for i in range(5)]
        wait_until(lambda: stats(node)[0].records == 10, "the records after the resume")
    finally:
        if sub is not None:
            sub.close()
        node.stop()


def test_two_nodes_share_the_partitions_and_publish_each_record_once(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    """One consumer group across two nodes: each takes some partitions, and a
    subscriber on the first gets every record once (the second's through the
    cluster link)."""
    topic, group = fresh("shared"), fresh("g")
    create_topic(kafka_bootstrap, topic, PARTITIONS)
    table = KafkaIn(name="s", topics=(topic,), mqtt_topic="s/${partition}/${key}", group=group)
    nodes = []
    sub = None
    try:
        for node_id in ("in-a", "in-b"):
            settings = backend_settings(redis_url, kafka_bootstrap, kafka_topic_prefix, node_id)
            nodes.append(start_node(replace(settings, bridge=Bridges(kafka_in=(table,)))))
        a, b = nodes

        def partitions(node: BackendNode) -> int:
            ingress = node.node.ingress
            return int(node.call(lambda: len(ingress.bridges[0]._tracks)))

        wait_until(lambda: partitions(a) + partitions(b) == PARTITIONS and partitions(a) > 0
                   and partitions(b) > 0, "the partitions shared by the group", JOIN_S)  # fmt: skip
        sub = Paho(a.mqtt_port, "s-sub")
        assert sub.connack()[1] == 0
        assert sub.subscribe("s/#", qos=1) == [1]
        wait_until(lambda: b.call(lambda: bool(b.node.broker.routes.plan("s/0/k")[2])),
                   "the subscription's route on the second node")  # fmt: skip
        count = 200
        produce(kafka_bootstrap, topic, [(b"k%d" % n, b"%d" % n, []) for n in range(count)])
        got = sorted(int(sub.message(timeout=10.0).payload) for _ in range(count))
        assert got == list(range(count))
        assert sub.no_message(0.5)  # none twice
        records = [stats(node)[0].records for node in nodes]
        assert sum(records) == count and all(records), records  # both published some
    finally:
        if sub is not None:
            sub.close()
        for node in nodes:
            node.stop()
