"""$SYS/brokers/<node>/clients/<id>/connected|disconnected (EMQX's client
events, `--sys-client-events`): published on a real node when the option is
on, not at all when it is off (the default)."""

from __future__ import annotations

import json
from dataclasses import replace

from services.mqtt.packets import Disconnect, Properties, Publish, Subscription
from tests.integration.conftest import NodeRunner, node_settings
from tests.integration.rawclient import V5, Raw, opened

EVENTS = "$SYS/brokers/test-node/clients/"


def test_connect_and_disconnect_are_published_when_asked(raws: list[Raw]) -> None:
    runner = NodeRunner(replace(node_settings(), sys_client_events=True)).start()
    try:
        watcher = opened(raws, runner, "watcher")
        # (not clients/#: the node's retained clients/connected figures are there too)
        watcher.subscribe(Subscription(EVENTS + "+/connected", 0),
                          Subscription(EVENTS + "+/disconnected", 0))  # fmt: skip
        c = opened(raws, runner, "ev-1", V5, username="u", keep_alive=30,
                   properties=Properties(session_expiry_interval=100))  # fmt: skip
        got = watcher.expect(Publish)
        assert (got.topic, got.retain) == (EVENTS + "ev-1/connected", False)
        body = json.loads(got.payload)
        assert body["clientid"] == "ev-1" and body["username"] == "u"
        assert (body["proto_name"], body["proto_ver"], body["listener"]) == ("MQTT", 5, "mqtt")
        assert (body["keepalive"], body["expiry_interval"]) == (30, 100)
        assert body["ipaddress"] == "127.0.0.1" and body["peername"].startswith("127.0.0.1:")
        assert body["connected_at"] == body["ts"] > 0
        c.send(Disconnect())
        got = watcher.expect(Publish)
        assert got.topic == EVENTS + "ev-1/disconnected"
        body = json.loads(got.payload)
        assert body["clientid"] == "ev-1" and body["disconnected_at"] >= body["ts"] - 1
    finally:
        runner.stop()


def test_off_by_default(node: NodeRunner, raws: list[Raw]) -> None:
    watcher = opened(raws, node, "watcher")
    watcher.subscribe(Subscription(EVENTS + "+/connected", 0), Subscription("barrier", 0))
    c = opened(raws, node, "ev-2")
    assert watcher.before_barrier(c, "barrier") == []  # its CONNACK came before: no event
