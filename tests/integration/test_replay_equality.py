"""Restart equality: a node started fresh from the log holds what the live node holds.

A seeded random workload (clean and persistent connects, takeovers,
subscribes, unsubscribes, retained set/clear, disconnects) runs against a
live node on Redis + Kafka; a second node then replays the same log. Their
cluster views, routing tries and retained indexes must be equal, and the
live node's trie must be what its own view says.
"""

from __future__ import annotations

import random

import pytest

from tests.integration.conftest import Paho
from tests.support.backend_node import backend_settings, node_state, start_node
from tests.support.wait import wait_until

CLIENTS = ("c0", "c1", "c2", "c3")
FILTERS = ("a/#", "a/b", "+/b", "x/y", "$share/g/a/+")
TOPICS = ("a/b", "x/y", "r/1")
STEPS = 40


def connect(port: int, client_id: str, rng: random.Random) -> Paho:
    v5 = rng.random() < 0.5
    persistent = rng.random() < 0.5
    if v5:
        client = Paho(
            port,
            client_id,
            v5=True,
            clean=not persistent,
            session_expiry=300 if persistent else None,
        )
    else:
        client = Paho(port, client_id, clean=not persistent)
    assert int(getattr(rc := client.connack()[1], "value", rc)) == 0
    return client


def workload(port: int, rng: random.Random, online: dict[str, Paho], steps: int = STEPS) -> None:
    """Random connects (clean or persistent, 3.1.1 or 5.0, takeovers),
    subscribes, unsubscribes, retained sets and clears, and disconnects."""
    for _ in range(steps):
        client_id = rng.choice(CLIENTS)
        client = online.get(client_id)
        op = rng.random()
        if client is None or op < 0.15:
            if client is not None:  # takeover: the old connection must not come back
                client.client._reconnect_on_failure = False
            online[client_id] = connect(port, client_id, rng)
        elif op < 0.5:
            client.subscribe(rng.choice(FILTERS), qos=rng.randint(0, 2))
        elif op < 0.65:
            client.client.unsubscribe(rng.choice(FILTERS))
        elif op < 0.85:
            payload = b"" if rng.random() < 0.3 else f"v{rng.randint(0, 99)}".encode()
            client.publish(rng.choice(TOPICS), payload, qos=1, retain=True)
        else:
            client.close()
            del online[client_id]


@pytest.mark.parametrize("seed", [1, 2])
def test_fresh_node_equals_live_node(
    seed: int, redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    rng = random.Random(seed)
    live = start_node(backend_settings(redis_url, kafka_bootstrap, kafka_topic_prefix, "live"))
    fresh = None
    online: dict[str, Paho] = {}
    try:
        workload(live.mqtt_port, rng, online)
        for client in online.values():
            client.close()
        online.clear()

        def settled() -> bool:  # no session online: every close is applied
            view = live.call(lambda: live.node.broker.logstate.view)
            return not any(e.online for e in live.call(view.sessions).values())

        wait_until(settled, "every session closed in the live view")
        fresh = start_node(
            backend_settings(redis_url, kafka_bootstrap, kafka_topic_prefix, "fresh")
        )
        expected = node_state(live)
        wait_until(lambda: node_state(fresh) == node_state(live), "equal state", timeout=15.0)
        snapshot, trie, retained = expected
        assert trie == tuple(sorted((c, f) for c, f, _ in snapshot.subscriptions))
        assert retained == tuple(sorted((t, e.payload) for t, e in snapshot.retained))
        assert snapshot.subscriptions or snapshot.retained, "the workload left some state"
    finally:
        for client in online.values():
            client.close()
        if fresh is not None:
            fresh.stop()
        live.stop()
