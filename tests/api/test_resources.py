"""Nodes, metrics, alarms, subscriptions, topics, retained messages,
publish and bans against a real `weir up --backend memory` (one node for
the module; each test uses client ids and topics of its own)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from services.mqtt.packets import Publish, Subscription
from tests.integration.rawclient import V5, V311, Raw
from tests.support.api_node import ApiNode
from tests.support.wait import wait_until


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiNode]:
    running = ApiNode(tmp_path_factory.mktemp("api"), "--backend", "memory",
                      "--node-id", "n1")  # fmt: skip
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def raws() -> Iterator[list[Raw]]:
    opened: list[Raw] = []
    yield opened
    for r in opened:
        r.close()


def connect(node: ApiNode, raws: list[Raw], cid: str, level: int = V311, **kw: object) -> Raw:
    r = Raw(node.mqtt_port, level)
    raws.append(r)
    r.connect(cid, **kw)
    return r


def ok(node: ApiNode, method: str, path: str, body: object = None) -> object:
    status, answer = node.call(method, path, body)
    assert 200 <= status < 300, (status, answer)
    return answer


def test_nodes_and_stats_and_metrics(node: ApiNode, raws: list[Raw]) -> None:
    connect(node, raws, "nd-1")
    [me] = ok(node, "GET", "/api/v5/nodes")  # type: ignore[misc]
    assert me["node"] == "n1" and me["node_status"] == "running" and me["uptime"] > 0
    assert me["live_connections"] >= 1 and me["memory_used"] > 0 and me["peers"] == []
    assert ok(node, "GET", "/api/v5/nodes/n1")["node"] == "n1"  # type: ignore[index]
    assert node.call("GET", "/api/v5/nodes/n9")[0] == 404
    assert node.call("GET", "/api/v5/supervisor/nodes")[0] == 404  # not under --nodes
    [stats] = ok(node, "GET", "/api/v5/stats")  # type: ignore[misc]
    assert stats["live_connections.count"] >= 1 and stats["node"] == "n1"
    before = ok(node, "GET", "/api/v5/metrics")[0]  # type: ignore[index]
    ok(node, "POST", "/api/v5/publish", {"topic": "m/x", "payload": "p", "qos": 1})
    after = ok(node, "GET", "/api/v5/metrics")[0]  # type: ignore[index]
    assert after["messages.dropped.no_subscribers"] == before["messages.dropped.no_subscribers"] + 1
    assert after["connections.accepted"] >= 1 and "api.unauthorized.missing" in after
    summed = ok(node, "GET", "/api/v5/metrics?aggregate=true")
    assert summed["nodes"] == ["n1"] and summed["connections.accepted"] >= 1  # type: ignore[index]


def test_alarms(node: ApiNode) -> None:
    answer = ok(node, "GET", "/api/v5/alarms?activated=true")
    assert answer["meta"]["count"] == len(answer["data"])  # type: ignore[index]
    assert node.call("GET", "/api/v5/alarms?activated=maybe")[0] == 400
    assert node.call("DELETE", "/api/v5/alarms")[0] == 204
    assert ok(node, "GET", "/api/v5/alarms?activated=false")["data"] == []  # type: ignore[index]


def test_subscriptions_and_topics(node: ApiNode, raws: list[Raw]) -> None:
    a = connect(node, raws, "sub-a", V5)
    a.subscribe(Subscription("st/+", 1), Subscription("$share/g1/st/s", 0))
    b = connect(node, raws, "sub-b")
    b.subscribe(Subscription("st/+", 0))

    def rows(query: str) -> list[tuple[str, str, int]]:
        data = ok(node, "GET", f"/api/v5/subscriptions?{query}")["data"]  # type: ignore[index]
        return [(r["clientid"], r["topic"], r["qos"]) for r in data if r["topic"].find("st/") >= 0]

    assert rows("clientid=sub-a") == [("sub-a", "$share/g1/st/s", 0), ("sub-a", "st/+", 1)]
    assert rows("topic=st/%2B") == [("sub-a", "st/+", 1), ("sub-b", "st/+", 0)]
    assert rows("qos=0&topic=st/%2B") == [("sub-b", "st/+", 0)]
    assert rows("share_group=g1") == [("sub-a", "$share/g1/st/s", 0)]
    assert rows("node=n2") == []
    topics = ok(node, "GET", "/api/v5/topics?topic=st/%2B")["data"]  # type: ignore[index]
    assert topics == [{"topic": "st/+", "node": "n1"}]
    assert ok(node, "GET", "/api/v5/topics/" + quote("st/+", safe="")) == topics
    assert node.call("GET", "/api/v5/topics/no%2Fone")[0] == 404


def test_publish_reaches_subscribers_with_its_properties(node: ApiNode, raws: list[Raw]) -> None:
    s = connect(node, raws, "pub-sub", V5)
    s.subscribe(Subscription("pb/#", 1))
    answer = ok(node, "POST", "/api/v5/publish", {
        "topic": "pb/1", "payload": base64.b64encode(b"\x00\x01").decode(),
        "payload_encoding": "base64", "qos": 1,
        "properties": {"user_properties": {"k": "v"}, "content_type": "bin",
                       "message_expiry_interval": 60}})  # fmt: skip
    assert answer["matched"] == 1  # type: ignore[index]
    got = s.expect(Publish)
    assert (got.topic, got.payload, got.qos) == ("pb/1", b"\x00\x01", 1)
    assert got.properties.user_property == (("k", "v"),)
    assert got.properties.content_type == "bin"
    batch = ok(node, "POST", "/api/v5/publish/bulk",
               [{"topic": "pb/2", "payload": "a"}, {"topic": "pb/3", "payload": "b"}])
    assert [m["matched"] for m in batch] == [1, 1]  # type: ignore[union-attr]
    assert {s.expect(Publish).topic, s.expect(Publish).topic} == {"pb/2", "pb/3"}
    for bad, says in [({"topic": "pb/+"}, "wildcard"), ({"topic": "pb", "qos": 3}, "qos"),
                      ({"topic": "$SYS/x"}, "$"), ({"payload": "x"}, "topic"),
                      ({"topic": "pb", "properties": {"nope": 1}}, "nope")]:  # fmt: skip
        status, body = node.call("POST", "/api/v5/publish", bad)
        assert status == 400 and says in body["message"], (bad, body)
    status, _ = node.call("POST", "/api/v5/publish/bulk", [{"topic": "pb/4"}, {"topic": "#"}])
    assert status == 400 and s.nothing()  # all valid, or none sent


def test_retained_list_read_delete(node: ApiNode, raws: list[Raw]) -> None:
    ok(node, "POST", "/api/v5/publish", {"topic": "rt/a/b", "payload": "kept", "retain": True})
    path = "/api/v5/mqtt/retainer/message/" + quote("rt/a/b", safe="")
    wait_until(lambda: node.call("GET", path)[0] == 200, "the retained message is held")
    listed = ok(node, "GET", "/api/v5/mqtt/retainer/messages?topic=rt/")
    assert [m["topic"] for m in listed["data"]] == ["rt/a/b"]  # type: ignore[index]
    assert "payload" not in listed["data"][0]  # type: ignore[index]
    one = ok(node, "GET", path)
    assert base64.b64decode(one["payload"]) == b"kept"  # type: ignore[index]
    assert node.call("DELETE", path)[0] == 204
    assert node.call("GET", path)[0] == 404
    r = connect(node, raws, "rt-late")
    r.subscribe(Subscription("rt/#", 0))
    assert r.nothing()  # no retained message comes to a new subscriber
    assert node.call("DELETE", path)[0] == 404


def test_bans_add_list_delete_and_kick(node: ApiNode, raws: list[Raw]) -> None:
    victim = connect(node, raws, "ban-me", V5)
    until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    added = ok(node, "POST", "/api/v5/banned",
               {"as": "clientid", "who": "ban-me", "until": until, "reason": "test"})
    assert added["until"] == until and added["by"] == "api"  # type: ignore[index]
    victim.closed()  # the ban disconnects it
    refused = Raw(node.mqtt_port, V5)
    raws.append(refused)
    assert refused.connect("ban-me").reason_code == 0x8A
    ok(node, "POST", "/api/v5/banned", {"as": "peerhost", "who": "10.1.0.0/16", "duration": 60})
    listed = ok(node, "GET", "/api/v5/banned")["data"]  # type: ignore[index]
    assert {(b["as"], b["who"]) for b in listed} >= {("clientid", "ban-me"),
                                                     ("peerhost", "10.1.0.0/16")}  # fmt: skip
    assert node.call("DELETE", "/api/v5/banned/clientid/ban-me")[0] == 204
    assert node.call("DELETE", "/api/v5/banned/peerhost/" + quote("10.1.0.0/16", safe=""))[0] \
        == 204
    assert node.call("DELETE", "/api/v5/banned/clientid/ban-me")[0] == 404
    connect(node, raws, "ban-me", V5)  # let in again
    for bad in [{"as": "ip", "who": "x"}, {"as": "clientid"}, {"as": "peerhost", "who": "x"},
                {"as": "clientid", "who": "x", "until": "tomorrow"},
                {"as": "clientid", "who": "x", "until": "2001-01-01T00:00:00Z"}]:  # fmt: skip
        assert node.call("POST", "/api/v5/banned", bad)[0] == 400, bad


def test_trace_start_log_download_stop_delete(node: ApiNode, raws: list[Raw]) -> None:
    started = ok(node, "POST", "/api/v5/trace",
                 {"name": "t-api", "type": "clientid", "clientid": "tr-1", "duration": 60})
    assert started["status"] == "running" and started["clientid"] == "tr-1"  # type: ignore[index]
    r = connect(node, raws, "tr-1")
    r.subscribe(Subscription("tr/x", 1))
    r.send(Publish("tr/x", b"traced", qos=1, packet_id=7))
    r.expect(Publish)  # its own message comes back: both directions now traced
    listed = ok(node, "GET", "/api/v5/trace")
    assert [t["name"] for t in listed] == ["t-api"]  # type: ignore[union-attr]
    stopped = ok(node, "PUT", "/api/v5/trace/t-api/stop")
    assert stopped["status"] == "stopped" and stopped["stopped_by"] == "user"  # type: ignore[index]
    status, text = node.call("GET", "/api/v5/trace/t-api/download")
    assert status == 200
    packets = [json.loads(line) for line in text.splitlines()]
    seen = {(p["dir"], p["packet"]) for p in packets}
    assert {("in", "CONNECT"), ("out", "CONNACK"), ("in", "SUBSCRIBE"), ("in", "PUBLISH"),
            ("out", "PUBLISH")} <= seen, seen  # fmt: skip
    part = ok(node, "GET", "/api/v5/trace/t-api/log?position=0&bytes=10")
    assert part["meta"] == {"position": 10, "bytes": 10}  # type: ignore[index]
    assert part["items"] == text[:10]  # type: ignore[index]
    assert node.call("DELETE", "/api/v5/trace/t-api")[0] == 204
    assert node.call("GET", "/api/v5/trace/t-api/log")[0] == 404
    assert ok(node, "GET", "/api/v5/trace") == []


@pytest.mark.parametrize("bad, says", [
    ({"type": "clientid", "clientid": "x"}, "needs"),
    ({"name": "b1", "type": "ip", "clientid": "x"}, "needs"),
    ({"name": "b2", "type": "topic"}, '"topic"'),
    ({"name": "b3", "type": "topic", "topic": "a/#/b"}, "topic filter"),
    ({"name": "b4", "type": "clientid", "clientid": "x", "duration": -1}, "duration"),
    ({"name": "b5", "type": "clientid", "clientid": "x", "max_bytes": "big"}, "max_bytes"),
    ({"name": "../x", "type": "clientid", "clientid": "x"}, "trace name"),
])  # fmt: skip
def test_trace_refuses_bad_requests(node: ApiNode, bad: dict[str, object], says: str) -> None:
    status, body = node.call("POST", "/api/v5/trace", bad)
    assert status == 400 and says in body["message"], body
    ok(node, "POST", "/api/v5/trace", {"name": "dup", "type": "topic", "topic": "d/#"})
    assert node.call("POST", "/api/v5/trace", {"name": "dup", "type": "topic",
                                                 "topic": "d/#"})[0] == 409  # fmt: skip
    assert node.call("DELETE", "/api/v5/trace/dup")[0] == 204
