"""Two nodes on one Redis and Kafka, watched as a cluster: QoS 0 copies a
backed-up cluster link drops are counted and told to message.dropped; the
cluster's figures (services.metrics.cluster), each node's written to Redis,
are summed over the live ones for the management API and $SYS/cluster/...
and $SYS/brokers, and a node that stops drops out of the sum by itself.

One pair of nodes for the module; the last test stops the second node."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
import redis

from services.cluster.links import DEFAULT_BUFFER_LIMIT
from services.metrics.cluster import Aggregate, ClusterFigures
from services.mqtt.packets import Publish, Suback, Subscribe, Subscription
from tests.integration.rawclient import Raw, opened
from tests.support.backend_node import BackendNode, backend_settings, start_node

pytestmark = [pytest.mark.redis, pytest.mark.kafka]

INTERVAL_S = 0.2  # --sys-interval: the figures' write and fold period (stale after 3)


def fold(runner: BackendNode) -> Aggregate:
    """A fresh fold on that node's loop, as the management API would ask."""
    figures: ClusterFigures = runner.node.cluster_figures
    assert runner.loop is not None
    return asyncio.run_coroutine_threadsafe(figures.collect(), runner.loop).result(5)


def until(check: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return got


def subscribed(raw: Raw, topic: str) -> None:
    """SUBSCRIBE and read up to its SUBACK. A $SYS timer's PUBLISH may come
    first: a server may send matching messages before the SUBACK (MQTT 3.1.1
    3.8.4); `Raw.subscribe` wants the SUBACK first (CI failed on that once)."""
    raw.send(Subscribe(1, (Subscription(topic, 0),)))
    until(lambda: isinstance(raw.recv(), Suback), f"the SUBACK of {topic}")


@pytest.fixture(scope="module")
def pair(
    _redis_service_url: str, kafka_bootstrap: str
) -> Iterator[tuple[BackendNode, BackendNode]]:
    with redis.Redis.from_url(_redis_service_url, socket_timeout=5) as client:
        client.flushdb()  # (redis_url's, per test; this pair lives for the module)
    prefix = f"t{uuid.uuid4().hex[:12]}."

    def settings(node_id: str) -> Any:
        base = backend_settings(_redis_service_url, kafka_bootstrap, prefix, node_id)
        return replace(base, sys_interval_s=INTERVAL_S)

    a = start_node(settings("fa-1"))
    b = start_node(settings("fa-2"))
    try:
        yield a, b
    finally:
        b.stop()
        a.stop()


def test_qos0_copies_a_backed_up_link_drops_are_counted_and_told(
    pair: tuple[BackendNode, BackendNode], raws: list[Raw]
) -> None:
    a, b = pair
    told: list[tuple[str, str, str | None]] = []

    def dropped(message: Any, reason: str, client_id: str | None) -> None:
        if message.topic.startswith("cl/"):  # not the node's own $SYS messages
            told.append((message.topic, reason, client_id))

    hooks = a.node.services.seams.hooks
    a.call(lambda: hooks.add("message.dropped", dropped))
    far = opened(raws, b, "far")
    far.subscribe(Subscription("cl/#", 0))
    links = a.node.services.cluster.links
    # the route reaches a through the log; then every QoS 0 frame is over a's limit
    until(lambda: a.call(lambda: bool(a.node.broker.routes.plan("cl/x")[2])), "far's route on a")
    a.call(lambda: setattr(links, "buffer_limit", 1))
    try:
        pub = opened(raws, a, "near")
        pub.send(Publish("cl/x", b"lost", qos=0))
        until(lambda: told, "message.dropped on a")
        assert told == [("cl/x", "cluster_link", "far")]
        assert a.node.broker.metrics.messages_dropped["cluster_link"] == 1
    finally:
        a.call(lambda: setattr(links, "buffer_limit", DEFAULT_BUFFER_LIMIT))
        a.call(lambda: hooks.remove("message.dropped", dropped))
    pub.send(Publish("cl/x", b"kept", qos=0))
    assert far.expect(Publish).payload == b"kept"


def test_two_nodes_figures_are_summed_and_a_stopped_one_drops_out(
    pair: tuple[BackendNode, BackendNode], raws: list[Raw]
) -> None:
    a, b = pair
    for i in range(2):
        opened(raws, a, f"on-a-{i}")
    pub = opened(raws, b, "on-b")
    pub.send(Publish("nobody/here", b"x", qos=0))
    # a subscriber on each node: each gets the cluster's figures from its own node
    watch_a = opened(raws, a, "watch-a")
    subscribed(watch_a, "$SYS/brokers")
    watch_b = opened(raws, b, "watch-b")
    subscribed(watch_b, "$SYS/cluster/clients/connected")
    got = until(lambda: (f := fold(a)).figures["connections"] == 5 and f, "5 connections")
    assert got.nodes == ("fa-1", "fa-2")
    assert got.per_node["fa-1"]["connections"] == 3
    assert got.per_node["fa-2"]["connections"] == 2
    assert got.figures["messages_received"]["0"] >= 1
    assert got.figures["retained"] == got.per_node["fa-2"]["retained"]  # the largest, not a sum
    assert fold(b).nodes == ("fa-1", "fa-2")
    until(lambda: watch_a.expect(Publish).payload == b"fa-1,fa-2", "$SYS/brokers")
    until(lambda: watch_b.expect(Publish).payload == b"5", "$SYS/cluster/clients/connected")
    b.stop()
    alone = until(lambda: (f := fold(a)).nodes == ("fa-1",) and f, "fa-2 out of the sum")
    assert alone.figures["connections"] == 3
    until(lambda: watch_a.expect(Publish).payload == b"fa-1", "$SYS/brokers without fa-2")
