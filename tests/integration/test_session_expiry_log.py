"""A session's expiry reaches the event log exactly once, and a node that
replays an expiry already in the log does not try to log it again."""

from __future__ import annotations

import logging

import pytest

from services.event.schema import SessionExpired
from tests.integration.conftest import Paho
from tests.support.backend_node import backend_settings, start_node
from tests.support.eventlog import log_events
from tests.support.wait import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.kafka]


def _expiries(bootstrap: str, prefix: str, client_id: str) -> int:
    return sum(
        1
        for e in log_events(bootstrap, prefix)
        if isinstance(e, SessionExpired) and e.client_id == client_id
    )


def test_expiry_logged_once_and_not_again_at_the_next_start(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = backend_settings(redis_url, kafka_bootstrap, kafka_topic_prefix)
    first = start_node(settings)
    try:
        client = Paho(first.mqtt_port, "expiring", v5=True, clean=False, session_expiry=1)
        assert client.connack()[1] == 0
        assert client.subscribe("exp/#", qos=1)[0] == 1
        client.close()
        wait_until(
            lambda: _expiries(kafka_bootstrap, kafka_topic_prefix, "expiring") >= 1,
            "the expiry in the log",
            timeout=30.0,  # each look reads the whole log with a new consumer
        )
    finally:
        first.stop()

    caplog.set_level(logging.WARNING)
    second = start_node(settings)
    try:
        broker = second.node.broker

        def settled() -> bool:
            return bool(
                second.call(
                    lambda: "expiring" not in broker.sessions
                    and not broker._tasks
                    and "exp/#" not in broker.trie.filters("expiring")
                )
            )

        wait_until(settled, "the replayed node to settle")
    finally:
        second.stop()
    assert [r.getMessage() for r in caplog.records if "expiry" in r.getMessage()] == []
    assert _expiries(kafka_bootstrap, kafka_topic_prefix, "expiring") == 1
