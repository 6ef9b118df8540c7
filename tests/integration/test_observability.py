"""A real node watched from outside: /metrics over HTTP, the $SYS tree, alarms.

The node runs with its HTTP port on a free loopback port and a short $SYS
interval; clients are paho over real sockets; every figure is read the way
a user reads it (a scrape, a subscription), never from the node's memory.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.mqtt.packets import Properties, Puback, Publish, ReasonCode, Subscription
from tests.integration.conftest import NodeRunner, Paho, node_settings
from tests.integration.rawclient import V5, Raw, opened

SYS = "$SYS/brokers/test-node/"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(runner: NodeRunner) -> Samples:
    port = runner.node.http_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def until(condition: object, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.fixture
def watched() -> Iterator[NodeRunner]:
    settings = replace(node_settings(max_connections=4), http_port=0, sys_interval_s=0.1)
    runner = NodeRunner(settings).start()
    try:
        yield runner
    finally:
        runner.stop()


def test_a_scrape_shows_what_clients_did(watched: NodeRunner, clients: list[Paho]) -> None:
    before = scrape(watched)
    sub = Paho(watched.mqtt_port, "sub")
    pub = Paho(watched.mqtt_port, "pub", v5=True)
    clients += [sub, pub]
    sub.connack(), pub.connack()
    sub.subscribe("t/#", qos=1)
    pub.publish("t/a", b"hello", qos=1)
    pub.publish("t/b", b"hi", qos=0)
    assert {sub.message().payload, sub.message().payload} == {b"hello", b"hi"}
    pub.publish("nobody/listens", b"x", qos=1)
    # A subscriber whose Maximum Packet Size the messages pass: dropped, by QoS 0
    # (written once per subscriber) and QoS 1 (through its channel) alike.
    small = Raw(watched.mqtt_port, V5)
    small.connect("small", properties=Properties(maximum_packet_size=40))
    small.subscribe(Subscription("big/#", 1))
    pub.publish("big/0", b"x" * 100, qos=0)
    pub.publish("big/1", b"x" * 100, qos=1)
    until(lambda: scrape(watched)[("weir_messages_dropped_total", (("reason", "too_large"),))]
          - before[("weir_messages_dropped_total", (("reason", "too_large"),))] == 2,
          "both big messages counted as too large")  # fmt: skip
    small.close()
    until(lambda: scrape(watched)[("weir_connections", ())] == 2, "the close counted")
    after = scrape(watched)

    def moved(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before[key]

    assert after[("weir_connections_max", ())] == 3
    assert moved("weir_connections_accepted_total") == 3
    assert moved("weir_sessions_created_total") == 3
    assert after[("weir_sessions", ())] == 2
    assert after[("weir_subscriptions", ())] == 1
    assert moved("weir_messages_received_total", qos="1") == 3
    assert moved("weir_messages_received_total", qos="0") == 2
    assert moved("weir_messages_received_bytes_total", qos="1") == len(b"hello") + 1 + 100
    assert moved("weir_messages_sent_total", qos="1") == 1
    assert moved("weir_messages_sent_total", qos="0") == 1
    assert moved("weir_messages_sent_bytes_total", qos="1") == len(b"hello")
    assert moved("weir_messages_dropped_total", reason="no_subscribers") == 1
    assert moved("weir_bytes_received_total") > 0 and moved("weir_bytes_sent_total") > 0
    info = ("weir_node_info", (("node", "test-node"), ("version", watched.node.version)))
    assert after[info] == 1
    assert after[("process_resident_memory_bytes", ())] > 0
    pub.close()
    until(lambda: scrape(watched)[("weir_connections", ())] == 1, "the close counted")
    assert scrape(watched)[("weir_connections_closed_total", ())] >= 1


def sys_messages(r: Raw, wanted: set[str]) -> dict[str, Publish]:
    """The $SYS PUBLISHes `r` gets until it has every topic of `wanted`."""
    got: dict[str, Publish] = {}
    while not wanted <= got.keys():
        packet = r.expect(Publish)
        got[packet.topic.removeprefix(SYS)] = packet
    return got


def test_sys_topics_are_retained_and_clients_cannot_write_them(
    watched: NodeRunner, raws: list[Raw]
) -> None:
    pub = opened(raws, watched, "pub", V5)
    pub.send(Publish("a", b"1", qos=1, packet_id=1))
    assert pub.expect(Puback).reason_code == ReasonCode.NO_MATCHING_SUBSCRIBERS
    # A subscriber that comes later gets the tree at once, as retained messages.
    late = opened(raws, watched, "late")
    late.subscribe(Subscription(SYS + "#", 0))
    got = sys_messages(late, {"version", "uptime", "clients/connected", "messages/received",
                              "load/messages/received/1min", "subscriptions/count"})  # fmt: skip
    assert got["version"].payload == watched.node.version.encode()
    assert all(p.retain for p in got.values())
    # Clients may not publish there: 5.0 gets 0x87, 3.1.1 an ack and the message dropped.
    pub.send(Publish(SYS + "version", b"forged", qos=1, packet_id=2))
    assert pub.expect(Puback).reason_code == ReasonCode.NOT_AUTHORIZED
    old = opened(raws, watched, "old")
    old.send(Publish(SYS + "version", b"forged", qos=1, packet_id=3, retain=True))
    assert old.expect(Puback).reason_code == 0
    again = opened(raws, watched, "again")
    again.subscribe(Subscription(SYS + "version", 0))
    version = again.expect(Publish)
    assert (version.payload, version.retain) == (watched.node.version.encode(), True)


def alarm(sub: Raw, name: str) -> tuple[str, dict[str, Any]]:
    """The next alarm message about `name` (a loaded machine may raise others,
    eventloop_lag for one, on the node's own checks): its topic and body."""
    while True:
        packet = sub.expect(Publish)
        assert not packet.retain, packet
        body = json.loads(packet.payload)
        if body["name"] == name:
            return packet.topic.removeprefix(SYS), body


def test_an_alarm_is_raised_and_cleared(watched: NodeRunner, raws: list[Raw]) -> None:
    watch = watched.node.metrics_service.watch
    sub = opened(raws, watched, "sub")
    sub.subscribe(Subscription(SYS + "alarms/#", 0))
    others = [opened(raws, watched, f"c{i}") for i in range(3)]  # 4 of 4: past 90%
    watched.call(watch.check)
    topic, raised = alarm(sub, "high_connections")
    assert topic == "alarms/activate" and raised["deactivated_at"] is None
    assert raised["details"] == {"connections": 4, "max_connections": 4}
    for other in others:
        other.close()
    until(lambda: scrape(watched)[("weir_connections", ())] == 1, "the closes counted")
    watched.call(watch.check)  # 1 of 4: under 80%
    topic, cleared = alarm(sub, "high_connections")
    assert topic == "alarms/deactivate" and cleared["deactivated_at"] >= raised["activated_at"]
    figures = scrape(watched)
    active = watched.call(lambda: set(watched.node.metrics_service.alarms.active))
    assert "high_connections" not in active
    assert figures[("weir_alarms_active", ())] == len(active)
    assert figures[("weir_alarms_activated_total", ())] >= 1


def test_a_queued_message_that_expires_is_counted_dropped(
    watched: NodeRunner, raws: list[Raw]
) -> None:
    key = ("weir_messages_dropped_total", (("reason", "expired"),))
    before = scrape(watched)[key]
    persistent: dict[str, Any] = {
        "clean_start": False, "properties": Properties(session_expiry_interval=60),
    }  # fmt: skip
    sub = opened(raws, watched, "exp-sub", V5, **persistent)
    sub.subscribe(Subscription("exp/t", 1))
    sub.close()
    until(lambda: scrape(watched)[("weir_connections", ())] == 0, "the subscriber offline")
    pub = opened(raws, watched, "exp-pub", V5)
    expiry = Properties(message_expiry_interval=1)
    pub.send(Publish("exp/t", b"stale", qos=1, packet_id=1, properties=expiry))
    assert pub.expect(Puback).reason_code == 0  # queued for the offline session
    sent = time.monotonic()
    while time.monotonic() < sent + 1.1:  # the message's expiry itself must pass
        time.sleep(0.05)
    back = opened(raws, watched, "exp-sub", V5, **persistent)
    assert back.before_barrier(pub, "exp/t", 1) == []  # never delivered
    until(lambda: scrape(watched)[key] - before == 1, "the expired message counted")
