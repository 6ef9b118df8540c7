"""The example plugins: topic_rewrite's rules, the webhook's queue, retries and drops."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from services.auth.api import ClientInfo
from services.hooks.api import Hooks
from services.hooks.examples.topic_rewrite import TopicRewrite
from services.hooks.examples.webhook import Webhook
from services.mqtt.packets import Message
from tests.hooks.webhook_server import Endpoint
from tests.support.wait import until

CLIENT = ClientInfo("c1", "alice", "127.0.0.1:5000", 5)


def rewrite(plugin: TopicRewrite, topic: str) -> str:
    hooks = Hooks()
    plugin.register(hooks)
    out = hooks.fold("message.publish", Message(topic, b"x"), CLIENT)
    return str(out.topic)


def test_topic_rewrite_applies_the_first_matching_rule() -> None:
    plugin = TopicRewrite({"rules": [
        {"filter": "x/#", "from": "^x/y/(.+)$", "to": "z/y/$1"},
        {"filter": "x/#", "from": "^x/(.+)$", "to": "all/$1"},
        {"filter": "bad/+", "from": "^bad/(.+)$", "to": "bad/#"},
    ]})  # fmt: skip
    assert rewrite(plugin, "x/y/1") == "z/y/1"
    assert rewrite(plugin, "x/q") == "all/q"
    assert rewrite(plugin, "other/q") == "other/q"
    assert rewrite(plugin, "bad/q") == "bad/q"  # a wildcard result: kept as it was
    assert plugin.rewritten == 2


@pytest.mark.parametrize(("config", "message"), [
    ({"rule": []}, "unknown key 'rule'"),
    ({"rules": [{"filter": "a"}]}, "rule 1: needs exactly filter, from and to"),
    ({"rules": [{"filter": "a", "from": "(", "to": "b"}]}, "rule 1: from is not a regular"),
    ({"rules": [{"filter": "a", "from": "a", "to": "$1"}]}, r"rule 1: to names \$1"),
])  # fmt: skip
def test_topic_rewrite_rejects_a_bad_config(config: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TopicRewrite(config)


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    e = Endpoint(fail_first=2)
    yield e
    e.close()


async def test_webhook_posts_events_and_retries(endpoint: Endpoint) -> None:
    plugin = Webhook({"url": endpoint.url, "retries": 3})
    hooks = Hooks()
    plugin.register(hooks)
    hooks.run("client.connected", "c1", CLIENT)
    out = hooks.fold("message.publish", Message("t/1", b"\xff", qos=1), CLIENT)
    assert out.topic == "t/1"  # the webhook only looks
    first = await asyncio.to_thread(endpoint.next)  # after two 500s, retried
    second = await asyncio.to_thread(endpoint.next)
    assert {k: first[k] for k in ("event", "clientid", "username", "peer")} == {
        "event": "client.connected", "clientid": "c1", "username": "alice",
        "peer": "127.0.0.1:5000",
    }  # fmt: skip
    assert {k: second[k] for k in ("event", "clientid", "topic", "qos", "payload")} == {
        "event": "message.publish", "clientid": "c1", "topic": "t/1", "qos": 1, "payload": "/w==",
    }  # fmt: skip
    assert second["payload_encoding"] == "base64"
    assert endpoint.requests == 4
    await until(lambda: plugin.stats()["sent"] == 2)  # the answer reached it after the body
    assert plugin.stats() == {"sent": 2, "dropped": 0, "failed": 0, "queued": 0}
    plugin.unregister(hooks)
    assert not hooks.has("client.connected")


async def test_webhook_drops_past_its_queue_and_after_its_retries(endpoint: Endpoint) -> None:
    plugin = Webhook({"url": endpoint.url, "retries": 0, "queue": 1})
    hooks = Hooks()
    plugin.register(hooks)
    for _ in range(3):  # the worker has not run yet: one fits, two are dropped
        hooks.run("client.disconnected", "c1", CLIENT)
    assert plugin.stats()["dropped"] == 2
    await until(lambda: plugin.stats()["failed"] == 1)  # its one attempt got a 500
    assert plugin.stats() == {"sent": 0, "dropped": 2, "failed": 1, "queued": 0}
    plugin.unregister(hooks)


@pytest.mark.parametrize(("config", "message"), [
    ({}, "url: needs an http"),
    ({"url": "http://x", "events": ["client.teleported"]}, "not a hook point"),
    ({"url": "http://x", "retry": 1}, "unknown key 'retry'"),
])  # fmt: skip
def test_webhook_rejects_a_bad_config(config: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Webhook(config)
