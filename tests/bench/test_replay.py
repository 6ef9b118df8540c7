"""bench.replay: the --node workload's shape, and a small --node run end to end."""

from __future__ import annotations

import shutil
from collections import Counter

import pytest

from bench.replay import fleet_events, run_node
from services.embedded.kafka import EmbeddedKafkaError, broker_binary
from services.event.schema import SessionClosed, SessionOpened, Subscribed
from services.mqtt.topics import validate_topic_filter


def test_fleet_events_open_subscribe_close_with_rising_versions() -> None:
    events = list(fleet_events(25, 4))  # 7, 6, 6, 6 filters
    assert Counter(type(e) for e in events) == {SessionOpened: 4, Subscribed: 25, SessionClosed: 4}
    last: dict[str, int] = {}
    filters: dict[str, set[str]] = {}
    for e in events:
        assert e.version > last.get(e.client_id, 0)
        last[e.client_id] = e.version
        if isinstance(e, Subscribed):
            validate_topic_filter(e.filter)
            filters.setdefault(e.client_id, set()).add(e.filter)
        elif isinstance(e, SessionClosed):
            assert e.expiry_s > 0  # the session stays, offline
    assert sorted(len(f) for f in filters.values()) == [6, 6, 6, 7]  # no filter repeats
    assert "fleet/client-000000/cmd/#" in filters["client-000000"]


def test_node_mode_replays_the_log_and_routes_to_a_replayed_client() -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    try:
        broker_binary()
    except EmbeddedKafkaError as exc:
        pytest.skip(f"no embedded Kafka: {exc}")
    result = run_node(events=2_000, clients=200, partitions=2)
    assert result.events == 2_000 + 2 * 200
    assert result.node_replayed == result.events
    assert result.check_queued == 1
    assert 0 < result.node_replay_s <= result.ready_s
    assert result.node_rss_mib > 0
