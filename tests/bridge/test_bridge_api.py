"""A bridge's state and figures through `weir up`'s HTTP port: GET /api/v5/bridges
(declared in the OpenAPI document), `weir ctl bridges` and /metrics. One
`weir up --backend memory` with an out and an in bridge on the test's Kafka:
a message goes out to Kafka and comes back in over MQTT."""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.__main__ import main
from tests.bridge.kafka import create_topic
from tests.integration.conftest import Paho
from tests.support.api_node import ApiNode
from tests.support.wait import wait_until

pytestmark = [pytest.mark.kafka]

JOIN_S = 30.0  # the first group join on the embedded Kafka waits ~half the session timeout


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str) -> Iterator[ApiNode]:
    tmp = tmp_path_factory.mktemp("bridge-api")
    topic = f"api-{uuid.uuid4().hex[:10]}"
    create_topic(kafka_bootstrap, topic, 1)
    config = tmp / "weir.toml"
    config.write_text(
        f'[[bridge.kafka_out]]\nname = "up"\nfilter = "up/#"\ntopic = "{topic}"\n'
        f'value = "${{payload}}"\nbootstrap = "{kafka_bootstrap}"\npartitions = 0\n'
        f'[[bridge.kafka_in]]\nname = "down"\ntopics = ["{topic}"]\n'
        f'mqtt_topic = "down/${{key}}"\nbootstrap = "{kafka_bootstrap}"\n'
        f'group = "g-{uuid.uuid4().hex[:8]}"\n'
    )  # fmt: skip
    running = ApiNode(tmp, "--backend", "memory", "--config", str(config))
    try:
        yield running
    finally:
        running.stop()


def round_trip(node: ApiNode) -> None:
    sub, pub = Paho(node.mqtt_port, "api-sub"), Paho(node.mqtt_port, "api-pub")
    try:
        assert sub.connack()[1] == 0 and pub.connack()[1] == 0
        assert sub.subscribe("down/#", qos=1) == [1]
        pub.publish("up/x", b"there and back", qos=1)
        m = sub.message(timeout=JOIN_S)
        assert (m.topic, m.payload) == ("down/api-pub", b"there and back")
    finally:
        sub.close()
        pub.close()


def test_the_api_lists_both_bridges_with_their_figures(node: ApiNode) -> None:
    round_trip(node)

    def both_counted() -> bool:
        status, listed = node.call("GET", "/api/v5/bridges")
        assert status == 200, listed
        return all(b["metrics"]["records"] >= 1 for b in listed)

    wait_until(both_counted, "both bridges' records")
    _, (up, down) = node.call("GET", "/api/v5/bridges")
    assert (up["name"], up["type"], up["direction"], up["status"]) == (
        "up", "kafka_producer", "out", "running")
    assert (down["name"], down["type"], down["direction"], down["status"]) == (
        "down", "kafka_consumer", "in", "running")
    assert up["metrics"]["bytes"] == len(b"there and back") + len(b"api-pub")
    assert {"lag", "buffered_records", "failures"} <= set(down["metrics"])
    assert "lag" not in up["metrics"] and "latency_us_max" in up["metrics"]
    assert node.call("GET", "/api/v5/bridges/down")[1]["name"] == "down"
    status, missing = node.call("GET", "/api/v5/bridges/nope")
    assert status == 404 and "nope" in json.dumps(missing)
    status, doc = node.call("GET", "/api/v5/openapi.json")
    assert status == 200 and {"/api/v5/bridges", "/api/v5/bridges/{name}"} <= set(doc["paths"])

    with urllib.request.urlopen(node.url("/metrics"), timeout=10) as answer:
        text = answer.read().decode()
    assert 'weir_bridge_up{bridge="down",direction="in"} 1.0' in text
    assert 'weir_bridge_records_total{bridge="up",direction="out"}' in text


def test_weir_ctl_bridges(node: ApiNode, capsys: pytest.CaptureFixture[str]) -> None:
    where = ["ctl", "--data-dir", str(Path(node.tmp) / "data")]
    capsys.readouterr()
    assert main([*where, "--json", "bridges"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [b["name"] for b in listed] == ["up", "down"]
    assert main([*where, "bridges"]) == 0
    table = capsys.readouterr().out
    assert "bridge" in table and "down" in table and "running" in table, table
