"""A node opens its listeners only once the event log's producer is warm
(`EventLog.warm`): the first CONNACK after a start does not wait ~0.5 s for
the idempotent producer's id (bench/firstconnack.py measures it)."""

from __future__ import annotations

from typing import Any

import pytest

from services.event.kafka import KafkaEventLog, KafkaSettings
from services.node import node as node_module
from services.node.app import open_backends
from services.node.node import Node
from tests.support.backend_node import backend_settings


async def test_the_listeners_open_after_the_producer_has_its_id(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = backend_settings(redis_url, kafka_bootstrap, kafka_topic_prefix, "warm")
    seen: list[bool] = []
    open_listeners = node_module.open_listeners

    def recording(*args: Any) -> Any:
        seen.append(events.warmed)  # the producer's state as the listeners open
        return open_listeners(*args)

    monkeypatch.setattr(node_module, "open_listeners", recording)
    async with open_backends(settings) as (services, _):
        events = services.events
        assert isinstance(events, KafkaEventLog)
        node = Node(settings, services)
        try:
            await node.start()
        finally:
            await node.stop()
    assert seen == [True]


async def test_warm_reports_a_producer_id_only_once_it_has_one(
    kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    settings = KafkaSettings(bootstrap=kafka_bootstrap, topic_prefix=kafka_topic_prefix)
    events = KafkaEventLog(settings)
    try:
        assert not events.warmed  # no producer yet
        await events.start()
        await events.warm()
        assert events.warmed
    finally:
        await events.close()
    assert not events.warmed  # closed: no producer
