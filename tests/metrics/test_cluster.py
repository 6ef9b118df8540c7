"""The cluster fold (services.metrics.cluster) without a node: sums, the
figures that take the largest node's, the $SYS topics, and stale entries."""

from __future__ import annotations

import json

from services.metrics.cluster import Aggregate, ClusterFigures, MemoryFigures, fold, sys_figures
from services.metrics.registry import Metrics


def test_fold_sums_labels_and_takes_the_largest_where_a_sum_means_nothing() -> None:
    a = {"connections": 2, "messages_received": {"0": 5, "1": 1}, "retained": 7,
         "eventloop_lag_seconds": 0.5}  # fmt: skip
    b = {"connections": 3, "messages_received": {"0": 1, "1": 0}, "retained": 7,
         "eventloop_lag_seconds": 0.1}  # fmt: skip
    assert fold({"a": a, "b": b}) == {
        "connections": 5, "messages_received": {"0": 6, "1": 1}, "retained": 7,
        "eventloop_lag_seconds": 0.5,
    }  # fmt: skip


def test_sys_figures_name_the_nodes_and_the_summed_tree() -> None:
    m = Metrics()
    m.connections, m.messages_sent[1] = 4, 9
    agg = Aggregate(0, ("a", "b"), {"connections": 4, "messages_sent": {"0": 1, "1": 9}})
    topics = sys_figures(agg)
    assert topics["$SYS/brokers"] == "a,b" and topics["$SYS/cluster/nodes/live"] == "2"
    assert topics["$SYS/cluster/clients/connected"] == "4"
    assert topics["$SYS/cluster/messages/sent"] == "10"


async def test_a_node_that_stopped_writing_drops_out_and_is_forgotten() -> None:
    store = MemoryFigures()
    now = [100_000]
    m = Metrics()
    m.connections = 2
    figures = ClusterFigures("me", m, store, None, interval_s=1.0, wall_ms=lambda: now[0])
    await store.put("old", json.dumps({"at": 96_000, "figures": {"connections": 9}}).encode())
    await store.put("new", json.dumps({"at": 99_000, "figures": {"connections": 1}}).encode())
    await store.put("junk", b"not json")
    got = await figures.collect()
    assert got.nodes == ("me", "new") and got.figures["connections"] == 3
    assert sorted(await store.entries()) == ["me", "new"]
