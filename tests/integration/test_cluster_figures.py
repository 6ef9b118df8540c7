"""The cluster's figures (services.metrics.cluster): two nodes on one Redis
and Kafka, each writing its figures to Redis; the sum over the live ones is
what `ClusterFigures` gives the management API and what $SYS/cluster/... and
$SYS/brokers show, and a node that stops drops out of it by itself."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from services.metrics.cluster import Aggregate, ClusterFigures
from services.mqtt.packets import Publish, Subscription
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


def test_two_nodes_figures_are_summed_and_a_stopped_one_drops_out(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str, raws: list[Raw]
) -> None:
    def settings(node_id: str) -> Any:
        base = backend_settings(redis_url, kafka_bootstrap, kafka_topic_prefix, node_id)
        return replace(base, sys_interval_s=INTERVAL_S)

    a = start_node(settings("fa-1"))
    b = start_node(settings("fa-2"))
    try:
        for i in range(2):
            opened(raws, a, f"on-a-{i}")
        pub = opened(raws, b, "on-b")
        pub.send(Publish("nobody/here", b"x", qos=0))
        # a subscriber on each node: each gets the cluster's figures from its own node
        watch_a = opened(raws, a, "watch-a")
        watch_a.subscribe(Subscription("$SYS/brokers", 0))
        watch_b = opened(raws, b, "watch-b")
        watch_b.subscribe(Subscription("$SYS/cluster/clients/connected", 0))
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
    finally:
        b.stop()
        a.stop()
