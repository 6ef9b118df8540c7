"""A real node over loopback sockets, driven by paho-mqtt (3.1.1 and 5.0)."""

from __future__ import annotations

import contextlib

import pytest

from tests.integration.conftest import NodeRunner, Paho
from tests.support.wait import wait_until

VERSIONS = [pytest.param(False, id="v311"), pytest.param(True, id="v5")]


def connect(clients: list[Paho], node: NodeRunner, cid: str, **kw: object) -> Paho:
    c = Paho(node.mqtt_port, cid, **kw)  # type: ignore[arg-type]
    clients.append(c)
    _flags, rc = c.connack()
    assert rc == 0
    return c


@pytest.mark.parametrize("v5", VERSIONS)
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_pubsub_each_qos(node: NodeRunner, clients: list[Paho], v5: bool, qos: int) -> None:
    sub = connect(clients, node, "sub", v5=v5)
    sub.subscribe("t/+", qos)
    pub = connect(clients, node, "pub", v5=v5)
    for i in range(5):
        pub.publish("t/x", b"m%d" % i, qos)
    got = [sub.message() for _ in range(5)]
    assert [m.payload for m in got] == [b"m%d" % i for i in range(5)]
    assert {m.qos for m in got} == {qos}
    assert all(m.topic == "t/x" for m in got)


@pytest.mark.parametrize("v5", VERSIONS)
def test_granted_qos_is_the_minimum(node: NodeRunner, clients: list[Paho], v5: bool) -> None:
    sub = connect(clients, node, "sub", v5=v5)
    sub.subscribe("q", 1)
    pub = connect(clients, node, "pub", v5=v5)
    pub.publish("q", b"x", 2)
    assert sub.message().qos == 1


@pytest.mark.parametrize("v5", VERSIONS)
def test_retained_on_subscribe_and_cleared(node: NodeRunner, clients: list[Paho], v5: bool) -> None:
    pub = connect(clients, node, "pub", v5=v5)
    pub.publish("r/1", b"kept", 1, retain=True)
    sub = connect(clients, node, "sub", v5=v5)
    sub.subscribe("r/#", 1)
    m = sub.message()
    assert (m.topic, m.payload, m.retain) == ("r/1", b"kept", True)
    pub.publish("r/1", b"", 1, retain=True)
    live = sub.message()
    assert live.payload == b""
    late = connect(clients, node, "late", v5=v5)
    late.subscribe("r/#", 1)
    assert late.before_barrier(pub, "r/barrier", 1) == []


@pytest.mark.parametrize("v5", VERSIONS)
def test_will_on_abrupt_close_not_on_disconnect(
    node: NodeRunner, clients: list[Paho], v5: bool
) -> None:
    watcher = connect(clients, node, "watcher", v5=v5)
    watcher.subscribe("wills/#", 1)
    polite = connect(clients, node, "polite", v5=v5, will=("wills/polite", b"gone", 1))
    polite.close()
    rude = Paho(node.mqtt_port, "rude", v5=v5, will=("wills/rude", b"gone", 1))
    assert rude.connack()[1] == 0
    rude.drop()
    m = watcher.message()
    assert (m.topic, m.payload) == ("wills/rude", b"gone")
    assert watcher.before_barrier(watcher, "wills/barrier", 1) == []


def test_persistent_session_gets_queued_qos1_after_reconnect(
    node: NodeRunner, clients: list[Paho]
) -> None:
    sub = connect(clients, node, "durable", clean=False)
    sub.subscribe("d/#", 1)
    sub.close()
    pub = connect(clients, node, "pub")
    for i in range(3):
        pub.publish("d/x", b"q%d" % i, 1)
    again = Paho(node.mqtt_port, "durable", clean=False)
    clients.append(again)
    flags, rc = again.connack()
    assert rc == 0 and flags.session_present
    assert [again.message().payload for _ in range(3)] == [b"q0", b"q1", b"q2"]


def test_v5_session_expiry_keeps_subscription(node: NodeRunner, clients: list[Paho]) -> None:
    sub = connect(clients, node, "exp", v5=True, clean=False, session_expiry=60)
    sub.subscribe("e", 1)
    sub.close()
    pub = connect(clients, node, "pub", v5=True)
    pub.publish("e", b"while-away", 1)
    again = Paho(node.mqtt_port, "exp", v5=True, clean=False, session_expiry=60)
    clients.append(again)
    flags, _rc = again.connack()
    assert flags.session_present
    assert again.message().payload == b"while-away"


def test_clean_session_forgets_subscriptions(node: NodeRunner, clients: list[Paho]) -> None:
    sub = connect(clients, node, "cl")
    sub.subscribe("c", 1)
    sub.close()
    again = connect(clients, node, "cl")
    pub = connect(clients, node, "pub")
    pub.publish("c", b"x", 1)
    assert again.no_message()


def test_takeover_v5_old_client_gets_0x8e(node: NodeRunner, clients: list[Paho]) -> None:
    first = connect(clients, node, "same", v5=True)
    second = connect(clients, node, "same", v5=True)
    rc = first.disconnects.get(timeout=5.0)
    assert rc == 0x8E
    second.subscribe("still", 0)
    second.publish("still", b"here", 0)
    assert second.message().payload == b"here"


def test_shared_subscription_one_member_per_message(node: NodeRunner, clients: list[Paho]) -> None:
    a = connect(clients, node, "a", v5=True)
    b = connect(clients, node, "b", v5=True)
    a.subscribe("$share/g/jobs/#", 1)
    b.subscribe("$share/g/jobs/#", 1)
    pub = connect(clients, node, "pub", v5=True)
    for i in range(10):
        pub.publish("jobs/1", b"%d" % i, 1)
    per_member = collect([a, b], 10)
    assert sorted(per_member[0] + per_member[1]) == sorted(b"%d" % i for i in range(10))
    assert len(per_member[0]) == len(per_member[1]) == 5  # round robin


def collect(members: list[Paho], n: int, timeout: float = 5.0) -> list[list[bytes]]:
    import queue
    import time

    got: list[list[bytes]] = [[] for _ in members]
    deadline = time.monotonic() + timeout
    while sum(map(len, got)) < n and time.monotonic() < deadline:
        for i, c in enumerate(members):
            with contextlib.suppress(queue.Empty):
                got[i].append(c.messages.get(timeout=0.02).payload)
    return got


def test_shared_member_gone_others_get_it(node: NodeRunner, clients: list[Paho]) -> None:
    a = connect(clients, node, "a", v5=True)
    b = connect(clients, node, "b", v5=True)
    a.subscribe("$share/g/s", 0)
    b.subscribe("$share/g/s", 0)
    b.close()
    pub = connect(clients, node, "pub", v5=True)
    for i in range(4):
        pub.publish("s", b"%d" % i, 0)
    assert sorted(a.message().payload for _ in range(4)) == [b"0", b"1", b"2", b"3"]


def test_overlapping_subscriptions_one_delivery_with_max_qos_and_ids(
    node: NodeRunner, clients: list[Paho]
) -> None:
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    sub = connect(clients, node, "ov", v5=True)
    for i, (topic, qos) in enumerate([("o/#", 0), ("o/+", 1)], start=1):
        props = Properties(PacketTypes.SUBSCRIBE)
        props.SubscriptionIdentifier = i
        sub.client.subscribe(topic, qos, properties=props)
        sub.subacks.get(timeout=5.0)
    pub = connect(clients, node, "pub", v5=True)
    pub.publish("o/x", b"once", 1)
    m = sub.message()
    assert m.qos == 1
    assert sorted(m.properties.SubscriptionIdentifier) == [1, 2]
    assert sub.before_barrier(pub, "o/barrier", 1) == []


def test_no_local(node: NodeRunner, clients: list[Paho]) -> None:
    c = connect(clients, node, "nl", v5=True)
    c.subscribe("nl", 0, noLocal=True)
    other = connect(clients, node, "other", v5=True)
    other.subscribe("nl", 0)
    c.publish("nl", b"mine", 0)
    assert other.message().payload == b"mine"
    assert c.before_barrier(other, "nl", 0) == []


def test_sys_topics_not_matched_by_wildcards(node: NodeRunner, clients: list[Paho]) -> None:
    sub = connect(clients, node, "sys")
    sub.subscribe("#", 0)
    node.call(
        lambda: node.node.broker.publish_message(_message("$SYS/broker/uptime", b"1"))
    )
    pub = connect(clients, node, "pub")
    pub.publish("plain", b"p", 0)
    assert sub.message().topic == "plain"
    assert sub.before_barrier(pub, "plain", 0) == []


def test_websocket_connect_and_pubsub(node: NodeRunner, clients: list[Paho]) -> None:
    ws = Paho(node.ws_port, "ws", transport="websockets")
    clients.append(ws)
    assert ws.connack()[1] == 0
    ws.subscribe("w", 1)
    tcp = connect(clients, node, "tcp")
    tcp.publish("w", b"over-ws", 1)
    assert ws.message().payload == b"over-ws"
    ws.publish("w", b"from-ws", 1)
    assert ws.message().payload == b"from-ws"


def _message(topic: str, payload: bytes) -> object:
    from services.mqtt.packets import Message

    return Message(topic, payload)


def test_retain_handling_and_retain_as_published(node: NodeRunner, clients: list[Paho]) -> None:
    pub = connect(clients, node, "pub", v5=True)
    pub.publish("rh/1", b"old", 1, retain=True)
    never = connect(clients, node, "never", v5=True)
    never.subscribe("rh/#", 1, retainHandling=2)
    assert never.before_barrier(pub, "rh/barrier", 1) == []
    rap = connect(clients, node, "rap", v5=True)
    rap.subscribe("rh/#", 1, retainAsPublished=True, retainHandling=2)
    plain = connect(clients, node, "plain", v5=True)
    plain.subscribe("rh/#", 1, retainHandling=2)
    pub.publish("rh/1", b"new", 1, retain=True)
    assert rap.message().retain is True
    assert plain.message().retain is False
    assert never.message().payload == b"new"


def test_v5_session_expires(node: NodeRunner, clients: list[Paho]) -> None:
    sub = connect(clients, node, "short", v5=True, clean=False, session_expiry=1)
    sub.subscribe("gone", 1)
    sub.close()

    def session_gone() -> bool:
        return "short" not in node.node.broker.sessions

    wait_until(lambda: node.call(session_gone), "the session to expire", timeout=5.0)
    assert node.call(session_gone)
    again = Paho(node.mqtt_port, "short", v5=True, clean=False, session_expiry=1)
    clients.append(again)
    flags, _ = again.connack()
    assert not flags.session_present


def test_will_delay_publishes_after_the_delay(node: NodeRunner, clients: list[Paho]) -> None:
    """The broker's own will timer, not the wall clock, says when the will is due:
    a wall-clock bound raced the delay against a barrier round trip under load."""
    delay = 2  # room to see the timer before it fires, even on a loaded machine
    watcher = connect(clients, node, "watcher", v5=True)
    watcher.subscribe("wd", 0)
    w = Paho(
        node.mqtt_port, "delayed", v5=True, session_expiry=30, will=("wd", b"late", 0),
        will_delay=delay,
    )
    clients.append(w)
    assert w.connack()[1] == 0
    loop, timers = node.loop, node.node.broker.wills._timers
    before_drop = loop.time()
    w.drop()
    wait_until(lambda: "delayed" in timers, "the will's timer")
    due, seen = timers["delayed"].when(), loop.time()
    # armed when the broker saw the drop: after it happened, before we looked
    assert before_drop + delay - 0.002 <= due <= seen + delay + 0.002
    assert watcher.message().payload == b"late"
    assert loop.time() >= due - 0.002 and "delayed" not in timers  # the timer sent it
    assert watcher.before_barrier(watcher, "wd", 0) == []  # and only it: once


def test_takeover_of_persistent_v311_session_keeps_subscriptions(
    node: NodeRunner, clients: list[Paho]
) -> None:
    first = connect(clients, node, "keep", clean=False)
    first.subscribe("k", 1)
    first.client.reconnect_delay_set(120, 120)  # do not fight the new owner
    second = Paho(node.mqtt_port, "keep", clean=False)
    clients.append(second)
    flags, rc = second.connack()
    assert rc == 0 and flags.session_present
    first.disconnects.get(timeout=5.0)
    pub = connect(clients, node, "pub")
    pub.publish("k", b"to-new-owner", 1)
    assert second.message().payload == b"to-new-owner"
    assert first.no_message()
