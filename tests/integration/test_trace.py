"""Packet traces (services.metrics.trace) on a real node: a client's packets in
both directions, a topic filter's PUBLISHes, and the bounds that end a trace.

One node for the module, its data dir under a temporary directory; the
traces are started, stopped and read through `node.tracer` on the node's
loop (what the management API calls), the clients are raw sockets.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from services.metrics.trace import TraceError, TraceInfo, Tracer
from services.mqtt.packets import Properties, Puback, Publish, Subscription
from tests.integration.conftest import NodeRunner, node_settings
from tests.integration.rawclient import V5, Raw, opened


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeRunner]:
    data = tmp_path_factory.mktemp("trace-node")
    runner = NodeRunner(replace(node_settings(), data_dir=str(data))).start()
    try:
        yield runner
    finally:
        runner.stop()


def tracer(runner: NodeRunner) -> Tracer:
    t: Tracer = runner.node.tracer
    return t


def start(runner: NodeRunner, name: str, kind: str, value: str, **kw: Any) -> TraceInfo:
    info: TraceInfo = runner.call(lambda: tracer(runner).start(name, kind, value, **kw))
    return info


def records(runner: NodeRunner, name: str) -> list[dict[str, Any]]:
    path: Path = runner.call(lambda: tracer(runner).path(name))
    return [json.loads(line) for line in path.read_text().splitlines()]


def ended(runner: NodeRunner, name: str, timeout: float = 10.0) -> TraceInfo:
    """The trace's info once it has stopped (by itself); fails past `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        info: TraceInfo = runner.call(lambda: tracer(runner).get(name))
        if info.status == "stopped":
            return info
        assert time.monotonic() < deadline, f"trace {name} still running: {info}"
        time.sleep(0.05)


def test_a_client_trace_holds_its_packets_both_ways_and_stops_by_itself(
    traced: NodeRunner, raws: list[Raw]
) -> None:
    info = start(traced, "one-client", "clientid", "traced-1", duration_s=2.0)
    assert (info.status, info.ends_at - info.started_at) == ("running", 2.0)
    assert tracer(traced).on
    other = opened(raws, traced, "other-1", V5)  # its packets stay out of the file
    other.subscribe(Subscription("tr/#", 0))
    c = opened(raws, traced, "traced-1", V5, username="u", password=b"secret")
    c.subscribe(Subscription("tr/#", 1))
    c.send(Publish("tr/x", b"hello", qos=1, packet_id=7))
    got = [c.recv(), c.recv()]
    delivered = next(p for p in got if isinstance(p, Publish))
    c.send(Puback(delivered.packet_id or 0))
    assert other.expect(Publish).payload == b"hello"
    # stops by itself at its end time; its file stays and nothing is added after
    info = ended(traced, "one-client")
    assert info.stopped_by == "time" and not tracer(traced).on
    seen = records(traced, "one-client")
    assert {r["clientid"] for r in seen} == {"traced-1"}
    pairs = [(r["dir"], r["packet"]) for r in seen]
    for pair in [("in", "CONNECT"), ("out", "CONNACK"), ("in", "SUBSCRIBE"), ("out", "SUBACK"),
                 ("in", "PUBLISH"), ("out", "PUBACK"), ("out", "PUBLISH"), ("in", "PUBACK")]:
        assert pair in pairs, (pair, pairs)
    assert pairs.index(("in", "CONNECT")) < pairs.index(("out", "CONNACK"))
    connect = seen[pairs.index(("in", "CONNECT"))]["fields"]
    assert connect["client_id"] == "traced-1" and connect["username"] == "u"
    assert connect["password"] == "******" and "secret" not in json.dumps(seen)
    publish = seen[pairs.index(("in", "PUBLISH"))]
    assert publish["fields"]["topic"] == "tr/x" and publish["fields"]["payload"] == "hello"
    assert publish["fields"]["packet_id"] == 7 and publish["node"] == "test-node"
    assert publish["ts"].endswith("+00:00") and ":" in publish["peer"]
    size = info.bytes
    c.send(Publish("not/traced", b"after", qos=1, packet_id=8))
    c.expect(Puback)
    assert records(traced, "one-client") == seen and tracer(traced).get("one-client").bytes == size


def test_a_topic_trace_catches_only_matching_publishes(
    traced: NodeRunner, raws: list[Raw]
) -> None:
    start(traced, "topic-a", "topic", "a/+", duration_s=60.0)
    sub = opened(raws, traced, "t-sub")
    sub.subscribe(Subscription("#", 0))
    pub = opened(raws, traced, "t-pub")
    for topic in ("a/1", "b/1", "a/2/x", "a/3"):
        pub.send(Publish(topic, topic.encode(), qos=1, packet_id=1))
        pub.expect(Puback)
        assert sub.expect(Publish).topic == topic
    info = traced.call(lambda: tracer(traced).stop("topic-a"))
    assert (info.status, info.stopped_by) == ("stopped", "user")
    seen = records(traced, "topic-a")
    assert {r["packet"] for r in seen} == {"PUBLISH"}
    assert [(r["dir"], r["clientid"], r["fields"]["topic"]) for r in seen] == [
        ("in", "t-pub", "a/1"), ("out", "t-sub", "a/1"),
        ("in", "t-pub", "a/3"), ("out", "t-sub", "a/3"),
    ]  # fmt: skip


def test_a_topic_trace_names_an_alias_only_publish_by_its_topic(
    traced: NodeRunner, raws: list[Raw]
) -> None:
    """A 5.0 PUBLISH that carries only a topic alias (both ways) is matched and
    recorded as the topic the alias stands for on its connection."""
    start(traced, "alias-a", "topic", "al/+", duration_s=60.0)
    sub = opened(raws, traced, "al-sub", V5, properties=Properties(topic_alias_maximum=4))
    sub.subscribe(Subscription("al/#", 0))
    pub = opened(raws, traced, "al-pub", V5)
    for n, topic in enumerate(("al/1", "", "al/1")):  # set alias 1, then use it twice
        pub.send(Publish(topic, b"m%d" % n, qos=1, packet_id=n + 1,
                         properties=Properties(topic_alias=1)))  # fmt: skip
        pub.expect(Puback)
        sub.expect(Publish)
    traced.call(lambda: tracer(traced).stop("alias-a"))
    seen = records(traced, "alias-a")
    got = [(r["dir"], r["fields"].get("topic", ""), r.get("alias_topic")) for r in seen]
    assert sorted(got) == sorted([
        ("in", "al/1", None), ("in", "", "al/1"), ("in", "al/1", None),
        ("out", "al/1", None), ("out", "", "al/1"), ("out", "", "al/1"),
    ]), got  # the node sets its own alias on the first copy out, then sends it alone


def test_a_trace_past_its_size_bound_stops_and_delete_removes_it(
    traced: NodeRunner, raws: list[Raw]
) -> None:
    start(traced, "small", "clientid", "chatty", duration_s=60.0, max_bytes=2000,
          payload_bytes=16)  # fmt: skip
    c = opened(raws, traced, "chatty")
    for i in range(20):
        c.send(Publish("big", b"x" * 500, qos=1, packet_id=i + 1))
        c.expect(Puback)
    info = traced.call(lambda: tracer(traced).get("small"))
    assert (info.status, info.stopped_by) == ("stopped", "size")
    assert 0 < info.bytes <= 2000
    seen = records(traced, "small")
    published = [r for r in seen if r["packet"] == "PUBLISH"]
    assert published and all(r["fields"]["payload"] == "x" * 16 for r in published)
    assert all(r["fields"]["payload_size"] == 500 for r in published)
    path = Path(info.path)
    assert path.exists()
    traced.call(lambda: tracer(traced).delete("small"))
    assert not path.exists()
    assert "small" not in [t.name for t in traced.call(lambda: tracer(traced).list())]


async def test_bad_requests_are_one_line_errors(tmp_path: Path) -> None:
    t = Tracer(tmp_path, "n")
    t.start("ok", "topic", "x/#", duration_s=5)
    bad: list[tuple[tuple[Any, ...], dict[str, Any], str]] = [
        (("../x", "clientid", "c"), {}, "trace name"),
        (("ok", "clientid", "c"), {}, "exists"),
        (("k", "user", "c"), {}, "clientid or topic"),
        (("k", "topic", "a/#/b"), {}, "topic filter"),
        (("k", "clientid", ""), {}, "empty"),
        (("k", "clientid", "c"), {"duration_s": 0}, "duration"),
        (("k", "clientid", "c"), {"max_bytes": 0}, "max_bytes"),
    ]
    for args, kw, words in bad:
        with pytest.raises(TraceError, match=words) as caught:
            t.start(*args, **kw)
        assert "\n" not in str(caught.value)
    with pytest.raises(TraceError, match="no trace 'nope'"):
        t.stop("nope")
    assert [i.name for i in t.list()] == ["ok"] and t.on
    t.close()
    assert not t.on and t.get("ok").stopped_by == "node"
