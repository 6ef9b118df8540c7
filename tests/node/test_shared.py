"""Shared groups on one node over a fake transport: what a peer's forward and a
leaving member hand to `services.broker.shared` (cross-node runs are in
tests/integration/test_cluster_shared.py)."""

from __future__ import annotations

import zlib
from dataclasses import replace

import pytest

from services.broker import shared
from services.event.schema import SessionOpened, Subscribed
from services.listener.connection import Connection
from services.mqtt import codec
from services.mqtt.packets import Message, Publish, Suback, Subscribe, Subscription, Unsubscribe
from services.queue.api import Inflight
from tests.node.test_connection import (
    FakeTransport,
    Harness,
    make_harness,
    publish_payloads,
    settings,
    wait_for,
)


async def join(
    h: Harness, name: str, qos: int, topic_filter: str = "$share/g/t"
) -> tuple[Connection, FakeTransport]:
    conn, t = await h.connected(name, level=5)
    conn.data_received(codec.encode(Subscribe(1, (Subscription(topic_filter, qos),)), 5))
    await wait_for(lambda: any(isinstance(p, Suback) for p in t.packets(5)), "suback")
    t.data.clear()
    return conn, t


def publishes(t: FakeTransport) -> list[Publish]:
    return [p for p in t.packets(5) if isinstance(p, Publish)]


async def test_forwarded_copy_gets_the_groups_options() -> None:
    harness = await make_harness(settings())
    """A peer picked m for the group: m gets it at its subscription's QoS (before:
    a forwarded message skipped every $share subscription, and m got nothing)."""
    _, t = await join(harness, "m", 0)
    harness.broker.deliver_forwarded(Message("t", b"x", qos=1, share=("g", "t")), ["m"])
    await wait_for(lambda: bool(publishes(t)), "the forwarded copy")
    assert [(p.payload, p.qos) for p in publishes(t)] == [(b"x", 0)]


async def test_forwarded_copy_for_a_gone_member_goes_to_another() -> None:
    harness = await make_harness(settings())
    _, t = await join(harness, "m", 1)
    harness.broker.deliver_forwarded(Message("t", b"y", qos=1, share=("g", "t")), ["gone"])
    await wait_for(lambda: bool(publishes(t)), "the redispatched copy")
    assert [(p.payload, p.qos, p.dup) for p in publishes(t)] == [(b"y", 1, False)]
    assert harness.broker.dispatch.shared.redispatched == 1


async def test_member_that_unsubscribed_then_leaves_hands_over_its_copies() -> None:
    """Copies queued for a member before its UNSUBSCRIBE stay its own while it is
    connected (MQTT-3.10.4-3 allows it); unacknowledged when it leaves, they go to
    another member: the copies say which group they were for."""
    harness = await make_harness(settings())
    a, a_t = await join(harness, "a", 1)
    pub, _ = await harness.connected("pub", level=5)
    for i in range(2):
        pub.data_received(codec.encode(Publish("t", b"%d" % i, qos=1, packet_id=i + 1), 5))
    await wait_for(lambda: len(publish_payloads(a_t, 5)) == 2, "a got both")
    a.data_received(codec.encode(Unsubscribe(2, ("$share/g/t",)), 5))
    _, b_t = await join(harness, "b", 1)
    a_t.close()  # a never acknowledged
    await wait_for(lambda: len(publish_payloads(b_t, 5)) == 2, "a's copies went to b")
    assert [(p.payload, p.dup) for p in publishes(b_t)] == [(b"0", False), (b"1", False)]


def test_unacked_takes_the_unreceived_shared_qos1_and_qos2_copies() -> None:
    g = ("g", "t/#")
    items = [
        Inflight(1, Message("t/a", b"1", 1, share=g), dup=True),
        Inflight(2, Message("t/a", b"2", 2, share=g), dup=False),
        Inflight(3, Message("t/a", b"3", 2, share=g), dup=False, released=True),  # PUBRECed
        Inflight(0, Message("t/a", b"4", 0, share=g), dup=False),
        Inflight(4, Message("t/a", b"5", 1), dup=False),  # a plain subscription's copy
        Inflight(5, Message("t/b", b"6", 1, share=("h", "t/b")), dup=False),
    ]
    assert shared.unacked(items) == {
        g: [items[0].message, items[1].message],
        ("h", "t/b"): [items[5].message],
    }


async def test_per_publisher_pick_state_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared, "PICK_STATE_LIMIT", 4)
    h = await make_harness(settings())
    _, t = await join(h, "m", 0)
    for i in range(10):
        h.broker.publish_message(Message("t", b"%d" % i, sender=f"p{i}"))
    await wait_for(lambda: len(publishes(t)) == 10, "ten deliveries")
    assert len(h.broker.dispatch.shared._counters) <= 4


@pytest.mark.parametrize("strategy", ["hash_clientid", "hash_topic"])
async def test_hash_strategies_pick_by_sorted_client_id(strategy: str) -> None:
    """Members sorted by client id, so every node (whatever order it learnt them
    in) maps one publisher or topic to the same member."""
    h = await make_harness(replace(settings(), shared_subscription_strategy=strategy))
    transports = {name: (await join(h, name, 0))[1] for name in ("z", "a", "m")}
    message = Message("t", b"x", sender="pub-7")
    h.broker.publish_message(message)
    key = message.sender if strategy == "hash_clientid" else message.topic
    expected = sorted(transports)[zlib.crc32(key.encode()) % 3]
    await wait_for(lambda: bool(publishes(transports[expected])), f"{expected} got it")
    assert [n for n, t in transports.items() if publishes(t)] == [expected]


class DeadPeers:
    """A cluster router to which every other node is dead."""

    def __init__(self) -> None:
        self.notified: list[tuple[str, str]] = []

    def is_live(self, node_id: str) -> bool:
        return False

    def notify(self, node_id: str, client_id: str) -> None:
        self.notified.append((node_id, client_id))

    def forward(self, message: Message, targets: object) -> int:
        raise AssertionError("nothing is forwarded to a dead node")


async def test_persistent_member_of_a_dead_node_keeps_getting_its_copies() -> None:
    """The directory still says p is online on "gone", which membership says is
    dead (its end is not logged yet): p's queue outlives that node, so the copy
    goes there instead of nowhere."""
    h = await make_harness(settings(), cluster=DeadPeers())
    epoch = (await h.broker.store.claim("p", "gone", False, 300)).epoch
    opened = SessionOpened(
        client_id="p", version=1, node="gone", ts_ms=0, epoch=epoch, clean_start=False,
        expiry_s=300, protocol=5,
    )  # fmt: skip
    h.broker.logstate.apply(opened)
    h.broker.logstate.apply(
        Subscribed(client_id="p", version=2, node="gone", ts_ms=0, filter="$share/g/t", qos=1)
    )
    assert h.broker.publish_message(Message("t", b"kept", 1, sender="pub")) == 1
    taken: list[Inflight] = []

    async def stored() -> bool:
        taken.extend(await h.broker.queue.take("p", epoch, 10))
        return bool(taken)

    await wait_for(stored, "the copy in p's queue")
    assert [(i.message.payload, i.message.share) for i in taken] == [(b"kept", ("g", "t"))]


async def test_a_store_failure_at_a_members_leaving_is_logged_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: the store's error was swallowed, neither logged nor counted."""
    from services.broker.shared import hand_over_left
    from services.metrics.registry import Metrics
    from services.session.api import StoreUnavailable

    class Down:
        async def pending(self, client_id: str, epoch: int) -> list[Inflight]:
            raise StoreUnavailable("redis did not answer: test")

    harness = await make_harness(settings())
    metrics = Metrics()
    shared_part = harness.broker.dispatch.shared
    await hand_over_left(shared_part, Down(), "m", 1, metrics)  # type: ignore[arg-type]
    assert metrics.shared_redispatch_failed == 1
    assert "shared copies of m not redispatched" in caplog.text


async def test_an_expiring_persistent_member_hands_its_queued_copies_over() -> None:
    """A persistent member offline until its session expires: the copies queued
    for it go to another member (before: only a clean member leaving its own
    node handed its copies over; an expiring one's were dropped with its state)."""
    from services.mqtt.packets import Connack, Connect, Disconnect, Properties

    harness = await make_harness(settings())
    p, p_t = harness.open()
    props = Properties(session_expiry_interval=1)
    p.data_received(codec.encode(Connect("p", protocol_level=5, properties=props), 5))
    await wait_for(lambda: any(isinstance(x, Connack) for x in p_t.packets(5)), "connack")
    p.data_received(codec.encode(Subscribe(1, (Subscription("$share/g/t", 1),)), 5))
    await wait_for(lambda: any(isinstance(x, Suback) for x in p_t.packets(5)), "suback")
    p.data_received(codec.encode(Disconnect(), 5))
    await wait_for(lambda: "p" not in harness.broker.cm._ending, "p offline")
    pub, _ = await harness.connected("pub", level=5)
    pub.data_received(codec.encode(Publish("t", b"kept", qos=1, packet_id=1), 5))
    await wait_for(lambda: harness.broker.delivery.idle, "queued for p")
    _, b_t = await join(harness, "b", 1)
    await wait_for(lambda: bool(publishes(b_t)), "p's copy, handed to b at its expiry")
    assert [(x.payload, x.dup) for x in publishes(b_t)] == [(b"kept", False)]
