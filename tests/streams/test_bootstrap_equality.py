"""Bootstrap equality (DESIGN 6): snapshot + tail gives exactly what a full replay gives.

The replay-equality workload (tests/integration/test_replay_equality) runs
on a live node; the state-store job folds the log so far (`python -m
streams run state --available-now`); the workload goes on, so the log has
a tail the store does not reflect. Then one node starts from the store and
the tail, another by replaying the whole log: their views, routing tries
and retained indexes must be equal, and equal to the live node's.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.integration.conftest import Paho
from tests.integration.test_replay_equality import workload
from tests.streams.test_state_job import JOB_S, job
from tests.support.backend_node import BackendNode, backend_settings, node_state, start_node
from tests.support.wait import wait_until


def settle(live: BackendNode, online: dict[str, Paho]) -> None:
    for client in online.values():
        client.close()
    online.clear()

    def settled() -> bool:  # no session online: every close is applied
        view = live.call(lambda: live.node.broker.logstate.view)
        return not any(e.online for e in live.call(view.sessions).values())

    wait_until(settled, "every session closed in the live view")


@pytest.mark.parametrize("seed", [1, 2])
def test_node_from_snapshot_and_tail_equals_node_from_full_replay(
    seed: int, redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str, tmp_path: Path
) -> None:
    rng = random.Random(seed)
    prefix = kafka_topic_prefix
    live = start_node(backend_settings(redis_url, kafka_bootstrap, prefix, "live"))
    nodes = [live]
    online: dict[str, Paho] = {}
    try:
        workload(live.mqtt_port, rng, online)
        settle(live, online)
        folded = job(kafka_bootstrap, redis_url, prefix, tmp_path, "--available-now")
        assert folded.wait(timeout=JOB_S) == 0, (tmp_path / "job.log").read_text()[-3000:]
        workload(live.mqtt_port, rng, online)  # the tail: events the store does not reflect
        settle(live, online)

        from_store = start_node(backend_settings(redis_url, kafka_bootstrap, prefix, "snap"))
        nodes.append(from_store)
        from_log = start_node(
            backend_settings(redis_url, kafka_bootstrap, prefix, "full"), state_store=False
        )
        nodes.append(from_log)
        assert from_store.node.started_from == "state store"
        assert from_log.node.started_from == "log"
        expected = node_state(live)
        assert node_state(from_store) == node_state(from_log) == expected
        snapshot, _trie, _retained = expected
        assert snapshot.subscriptions or snapshot.retained, "the workload left some state"
    finally:
        for client in online.values():
            client.close()
        for node in reversed(nodes):
            node.stop()
