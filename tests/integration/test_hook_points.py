"""Each hook point fires from a real node, with the arguments docs/plugins.md
lists: deliveries, drops with their reason, every end of a session, refused
CONNACKs. (Which points fire at all: test_node_seams; a cross-node takeover:
test_plugins_up.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from services.auth.api import ClientInfo
from services.broker.seams import Seams
from services.hooks.api import HOOK_POINTS, Hooks
from services.mqtt.packets import Message, Properties, Puback, Publish, Pubrec, Subscription
from tests.integration.conftest import NodeRunner, node_settings
from tests.integration.rawclient import V5, V311, Raw, opened
from tests.integration.test_node_seams import PasswordCheck, SeamsNode
from tests.support.wait import wait_until

LOGIN: dict[str, Any] = {"username": "u", "password": b"secret"}
PERSISTENT: dict[str, Any] = {
    "clean_start": False, "properties": Properties(session_expiry_interval=60),
}  # fmt: skip


class Recorded:
    def __init__(self, hooks: Hooks) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        for point in HOOK_POINTS:
            hooks.add(point, lambda *args, point=point: self.calls.append((point, args)))

    def of(self, point: str) -> list[tuple[Any, ...]]:
        """The calls of `point`, but the node's own $SYS messages (no subscriber
        here: message.dropped every interval, as EMQX drops them)."""
        return [args for p, args in list(self.calls) if p == point and not _sys(args)]


def _sys(args: tuple[Any, ...]) -> bool:
    return any(isinstance(a, Message) and a.topic.startswith("$SYS/") for a in args)


@pytest.fixture
def recorded() -> Iterator[tuple[NodeRunner, Recorded]]:
    hooks = Hooks()
    seen = Recorded(hooks)
    runner = SeamsNode(Seams(PasswordCheck(), hooks=hooks)).start()
    try:
        yield runner, seen
    finally:
        runner.stop()


@pytest.mark.parametrize(("level", "code"), [(V5, 0x86), (V311, 4)])
def test_client_connack_fires_on_a_refusal(
    recorded: tuple[NodeRunner, Recorded], raws: list[Raw], level: int, code: int
) -> None:
    node, seen = recorded
    bad = Raw(node.mqtt_port, level)
    raws.append(bad)
    assert bad.connect("intruder", username="u", password=b"guess").reason_code == code
    wait_until(lambda: seen.of("client.connack") != [], "the refusal's client.connack")
    assert seen.of("client.connack") == [("intruder", code)]  # the code sent (3.x: 4)
    assert seen.of("client.connected") == []
    opened(raws, node, "welcome", level, **LOGIN)
    assert seen.of("client.connack")[-1] == ("welcome", 0)


def test_client_connack_fires_on_a_protocol_refusal(
    recorded: tuple[NodeRunner, Recorded], raws: list[Raw]
) -> None:
    node, seen = recorded
    nameless = Raw(node.mqtt_port, V311)  # 3.1.1: no client id needs Clean Session 1
    raws.append(nameless)
    assert nameless.connect("", clean_start=False, **LOGIN).reason_code == 2
    wait_until(lambda: seen.of("client.connack") != [], "the refusal's client.connack")
    assert seen.of("client.connack") == [(None, 2)]  # refused before it had a client id


def test_message_delivered_and_dropped(
    recorded: tuple[NodeRunner, Recorded], raws: list[Raw]
) -> None:
    node, seen = recorded
    sub = opened(raws, node, "d-sub", V5, **LOGIN, **PERSISTENT)
    sub.subscribe(Subscription("d/#", 1))
    small = opened(raws, node, "d-small", V5, **LOGIN,
                   properties=Properties(maximum_packet_size=64))  # fmt: skip
    small.subscribe(Subscription("d/#", 0))
    pub = opened(raws, node, "d-pub", V5, **LOGIN)
    pub.send(Publish("d/1", b"one", qos=1, packet_id=1))  # queued path for d-sub
    pub.expect(Puback)
    got = sub.expect(Publish)
    sub.send(Puback(got.packet_id))
    assert small.expect(Publish).payload == b"one"  # fast QoS 0 path
    pub.send(Publish("d/0", b"x" * 100, qos=0))  # too large for d-small
    pub.send(Publish("nobody/here", b"z", qos=1, packet_id=2))
    pub.expect(Puback)
    assert sub.expect(Publish).payload == b"x" * 100
    delivered = seen.of("message.delivered")
    to_sub = [(c, m.topic, m.payload, m.qos) for c, m in delivered if c == "d-sub"]
    assert to_sub == [("d-sub", "d/1", b"one", 1), ("d-sub", "d/0", b"x" * 100, 0)]
    to_small = [(m.topic, m.qos) for c, m in delivered if c == "d-small"]
    assert to_small == [("d/1", 0)]  # the subscription's QoS: the copy as delivered
    dropped = [(m.topic, why, c) for m, why, c in seen.of("message.dropped")]
    assert dropped == [("d/0", "too_large", "d-small"), ("nobody/here", "no_subscribers", None)]
    acked = seen.of("message.acked")
    assert acked == [("d-sub", got.packet_id)]
    published = seen.of("message.publish")
    assert all(isinstance(c, ClientInfo) and isinstance(m, Message) for c, m in published)


def test_session_terminated_on_each_end(
    recorded: tuple[NodeRunner, Recorded], raws: list[Raw]
) -> None:
    node, seen = recorded
    clean = opened(raws, node, "t-clean", V5, **LOGIN)
    clean.close()  # no expiry: the session ends with the connection
    wait_until(lambda: ("t-clean", "normal") in seen.of("session.terminated"), "normal end")
    kept = opened(raws, node, "t-kept", V5, **LOGIN, **PERSISTENT)
    opened(raws, node, "t-kept", V5, **LOGIN)  # Clean Start 1 over it: discarded
    kept.closed()
    assert ("t-kept", "discarded") in seen.of("session.terminated")
    assert ("t-kept",) in seen.of("session.discarded")
    assert ("t-kept",) in seen.of("session.takenover")
    ended = [c for c, _ in seen.of("session.terminated")]
    assert ended.count("t-kept") == 1 and ended.count("t-clean") == 1


def test_a_stuck_and_a_raising_plugin_do_not_hold_clients_up(raws: list[Raw]) -> None:
    hooks = Hooks(timeout_s=60.0)  # far longer than the test: the stuck callback stays stuck
    started: list[str] = []

    async def stuck(client_id: str, client: Any) -> None:
        started.append(client_id)
        await asyncio.Event().wait()  # never set

    def broken(client: Any, message: Message) -> Any:
        raise RuntimeError("plugin bug")

    hooks.add("client.connected", stuck)
    hooks.add("message.publish", broken)
    runner = SeamsNode(Seams(PasswordCheck(), hooks=hooks)).start()
    try:
        sub = opened(raws, runner, "x-sub", V5, **LOGIN)
        sub.subscribe(Subscription("x/#", 1))
        pub = opened(raws, runner, "x-pub", V5, **LOGIN)
        for i in range(1, 4):
            pub.send(Publish("x/1", b"%d" % i, qos=1, packet_id=i))
            assert pub.expect(Puback).reason_code == 0
            assert sub.expect(Publish).payload == b"%d" % i  # published as it was
        assert started == ["x-sub", "x-pub"]
        stats = hooks.stats()
        assert (stats["failed"], stats["pending"]) == (3, 2)
    finally:
        runner.stop()
    assert hooks.stats()["pending"] == 0  # the node's stop cancelled them


def test_a_queued_copy_the_channel_does_not_send_is_dropped(
    recorded: tuple[NodeRunner, Recorded], raws: list[Raw]
) -> None:
    node, seen = recorded
    small = opened(raws, node, "q-small", V5, **LOGIN,
                   properties=Properties(maximum_packet_size=64))  # fmt: skip
    small.subscribe(Subscription("q/#", 1))
    pub = opened(raws, node, "q-pub", V5, **LOGIN)
    pub.send(Publish("q/big", b"x" * 100, qos=1, packet_id=1))  # over its 64 bytes
    pub.expect(Puback)
    pub.send(Publish("q/small", b"y", qos=1, packet_id=2))
    pub.expect(Puback)
    got = small.expect(Publish)
    assert got.topic == "q/small"  # the big one never went out
    dropped = [(m.topic, why, c) for m, why, c in seen.of("message.dropped")]
    assert dropped == [("q/big", "too_large", "q-small")]
    assert [(c, m.topic) for c, m in seen.of("message.delivered")] == [("q-small", "q/small")]


def test_a_qos2_publishs_qos0_copies_are_told_as_they_go(
    recorded: tuple[NodeRunner, Recorded], raws: list[Raw]
) -> None:
    node, seen = recorded
    sub = opened(raws, node, "w-sub", V5, **LOGIN)
    sub.subscribe(Subscription("w/#", 0))
    pub = opened(raws, node, "w-pub", V5, **LOGIN)
    pub.send(Publish("w/2", b"two", qos=2, packet_id=1))  # its copies wait for the id's store
    pub.expect(Pubrec)
    assert sub.expect(Publish).payload == b"two"
    assert [(c, m.topic, m.qos) for c, m in seen.of("message.delivered")] == [("w-sub", "w/2", 0)]


def test_drop_oldest_evictions_are_told_to_message_dropped(raws: list[Raw]) -> None:
    hooks = Hooks()
    seen = Recorded(hooks)
    settings = node_settings(queue_limit=2, queue_full="drop_oldest")
    node = NodeRunner(settings, seams=Seams(hooks=hooks)).start()
    try:
        sub = opened(raws, node, "qd-sub", V5, **PERSISTENT)
        sub.subscribe(Subscription("qd/t", 1))
        sub.close()
        wait_until(lambda: seen.of("client.disconnected") != [], "the subscriber gone")
        pub = opened(raws, node, "qd-pub", V5)
        for i in range(1, 5):
            pub.send(Publish("qd/t", b"%d" % i, qos=1, packet_id=i))
            assert pub.expect(Puback).reason_code == 0
        dropped = [(m.payload, why, c) for m, why, c in seen.of("message.dropped")]
        assert dropped == [(b"1", "queue_full", "qd-sub"), (b"2", "queue_full", "qd-sub")]
        assert node.node.broker.metrics.messages_dropped["queue_full"] == 2
        back = opened(raws, node, "qd-sub", V5, **PERSISTENT)
        assert [back.expect(Publish).payload for _ in range(2)] == [b"3", b"4"]
    finally:
        node.stop()


def test_a_queued_message_that_expired_is_told_to_message_dropped(
    recorded: tuple[NodeRunner, Recorded], raws: list[Raw]
) -> None:
    node, seen = recorded
    sub = opened(raws, node, "e-sub", V5, **LOGIN, **PERSISTENT)
    sub.subscribe(Subscription("e/#", 1))
    sub.close()
    wait_until(lambda: seen.of("client.disconnected") != [], "the subscriber gone")
    pub = opened(raws, node, "e-pub", V5, **LOGIN)
    expires = time.time() + 1.0  # Message Expiry Interval 1 s, from about now
    pub.send(Publish("e/1", b"late", qos=1, packet_id=1,
                     properties=Properties(message_expiry_interval=1)))  # fmt: skip
    pub.expect(Puback)
    pub.send(Publish("e/2", b"kept", qos=1, packet_id=2))
    pub.expect(Puback)
    wait_until(lambda: time.time() > expires + 0.1, "e/1's expiry passed while queued")
    back = opened(raws, node, "e-sub", V5, **LOGIN, **PERSISTENT)
    assert back.expect(Publish).payload == b"kept"  # the take that removed e/1 is done
    dropped = [(m.topic, why, c) for m, why, c in seen.of("message.dropped")]
    assert dropped == [("e/1", "expired", "e-sub")]
    assert [m.topic for c, m in seen.of("message.delivered") if c == "e-sub"] == ["e/2"]
