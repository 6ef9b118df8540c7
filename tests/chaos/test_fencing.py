"""Takeover fencing: after B takes a session over, A's writes all bounce.

Two nodes are two independent store pairs (own Redis connections) on one
real redis-server. A claims the client, does some work, then B claims it
(epoch + 1) and does its own work. Every write A then tries with its stale
epoch must raise `Fenced`, and afterwards Redis must hold exactly B's state.
The event-append path is covered by `next_version`: a node takes the event's
version from it (which checks the epoch) before it appends to Kafka, so a
fenced node cannot write an event either.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.mqtt.packets import (
    Connect,
    Message,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Subscription,
)
from services.ports import free_port
from services.queue.redis import RedisQueueStore
from services.session.api import Fenced
from services.session.redis import RedisSessionStore
from tests.chaos.harness import Link, NodeProcess

pytestmark = pytest.mark.redis


@dataclass
class Node:
    name: str
    sessions: RedisSessionStore
    queue: RedisQueueStore


@pytest.fixture
async def nodes(redis_url: str) -> AsyncIterator[tuple[Node, Node]]:
    a = Node("A", RedisSessionStore.from_url(redis_url), RedisQueueStore.from_url(redis_url))
    b = Node("B", RedisSessionStore.from_url(redis_url), RedisQueueStore.from_url(redis_url))
    try:
        yield a, b
    finally:
        for n in (a, b):
            await n.queue.close()
            await n.sessions.close()


def msg(n: int, qos: int = 1) -> Message:
    return Message("t/fence", str(n).encode(), qos=qos)


async def test_old_owner_writes_are_all_fenced(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    cid = "fence-client"

    # A owns the session and has a message inflight, one queued, an incoming QoS 2 id.
    ca = await a.sessions.claim(cid, a.name, clean_start=False, expiry_s=3600)
    await a.queue.enqueue([(cid, msg(1)), (cid, msg(2, qos=2)), (cid, msg(3))])
    taken = await a.queue.take(cid, ca.epoch, 1)
    assert [i.packet_id for i in taken] == [1]
    assert await a.queue.incoming_add(cid, ca.epoch, 77)
    version_a = await a.sessions.next_version(cid, ca.epoch)

    # The same client id connects to B: takeover.
    cb = await b.sessions.claim(cid, b.name, clean_start=False, expiry_s=3600)
    assert cb.epoch > ca.epoch
    assert cb.session_present and cb.previous_node == "A"
    # B resumes: resends inflight 1 (DUP), takes the rest, PUBRECs message 2, gets PUBREL 77.
    pending = await b.queue.pending(cid, cb.epoch)
    assert [i.packet_id for i in pending] == [1]
    taken_b = await b.queue.take(cid, cb.epoch, 10)
    assert [(i.packet_id, i.message.payload) for i in taken_b] == [(2, b"2"), (3, b"3")]
    assert await b.queue.received(cid, cb.epoch, 2)
    await b.queue.incoming_release(cid, cb.epoch, 77)
    assert await b.queue.incoming_add(cid, cb.epoch, 88)
    version_b = await b.sessions.next_version(cid, cb.epoch)
    assert version_b > version_a

    # The old owner A keeps writing with its stale epoch: every write is rejected.
    stale = ca.epoch
    writes: dict[str, Callable[[], Awaitable[object]]] = {
        "take": lambda: a.queue.take(cid, stale, 10),
        "pending": lambda: a.queue.pending(cid, stale),
        "ack": lambda: a.queue.ack(cid, stale, 1),
        "ack_many": lambda: a.queue.ack_many(cid, stale, [1, 2, 3]),
        "ack_and_take": lambda: a.queue.ack_and_take(cid, stale, [1], 10),
        "received": lambda: a.queue.received(cid, stale, 3),
        "incoming_add": lambda: a.queue.incoming_add(cid, stale, 99),
        "incoming_release": lambda: a.queue.incoming_release(cid, stale, 88),
        "incoming_ids": lambda: a.queue.incoming_ids(cid, stale),
        "next_version (event append)": lambda: a.sessions.next_version(cid, stale),
        "release": lambda: a.sessions.release(cid, stale, 0),
    }
    accepted = []
    for name, write in writes.items():
        try:
            await write()
        except Fenced:
            continue
        accepted.append(name)
    assert accepted == [], f"stale owner's writes were accepted: {accepted}"

    # enqueue_and_take with A as a stale taker: A is fenced and takes nothing.
    result = await a.queue.enqueue_and_take([(cid, msg(4))], {cid: (stale, 10)})
    assert result.fenced == {cid} and result.taken == {}
    # discard with the stale epoch is a no-op, not a wipe of B's state.
    await a.queue.discard(cid, stale)

    # Redis holds what B wrote, and B's own writes still work.
    info = await b.sessions.get(cid)
    assert info is not None and info.node == "B" and info.epoch == cb.epoch and info.online
    inflight = await b.queue.pending(cid, cb.epoch)
    assert [(i.packet_id, i.released) for i in inflight] == [(1, False), (2, True), (3, False)]
    assert await b.queue.incoming_ids(cid, cb.epoch) == {88}
    assert await b.sessions.next_version(cid, cb.epoch) > version_b
    assert await b.queue.ack_many(cid, cb.epoch, [1, 2, 3]) == 3
    # message 4 (enqueued by the stale node, which enqueue does not fence: any node may
    # route to a session) is B's to deliver, exactly once.
    assert [i.message.payload for i in await b.queue.take(cid, cb.epoch, 10)] == [b"4"]


async def test_takeover_back_fences_the_middle_owner(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    cid = "fence-pingpong"
    epochs = []
    owners = [a, b, a, b, a]
    for owner in owners:
        epochs.append((await owner.sessions.claim(cid, owner.name, False, 3600)).epoch)
    assert epochs == sorted(set(epochs))
    for owner, epoch in zip(owners[:-1], epochs[:-1], strict=True):
        with pytest.raises(Fenced):
            await owner.queue.take(cid, epoch, 1)
        with pytest.raises(Fenced):
            await owner.sessions.next_version(cid, epoch)
    info = await a.sessions.get(cid)
    assert info is not None and info.node == "A" and info.epoch == epochs[-1]


@pytest.fixture
def two_nodes(
    tmp_path: Path, redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str
) -> Iterator[tuple[NodeProcess, NodeProcess]]:
    started = []
    try:
        for name in ("A", "B"):
            port = free_port()
            args = ["--redis", redis_url, "--kafka", kafka_bootstrap]
            args += ["--kafka-topic-prefix", kafka_topic_prefix, "--host", "127.0.0.1"]
            args += ["--mqtt-port", str(port), "--ws-port", "off", "--node-id", name]
            args += ["--data-dir", str(tmp_path / name)]
            node = NodeProcess(args, port, tmp_path / f"{name}.log")
            node.start()
            started.append(node)
        yield started[0], started[1]
    finally:
        for node in started:
            node.stop()


@pytest.mark.kafka
@pytest.mark.timeout(90)
async def test_node_level_takeover_fences_the_old_node(
    two_nodes: tuple[NodeProcess, NodeProcess], redis_url: str
) -> None:
    """Two node processes on one Redis + Kafka (no cluster links between them, so
    node A is never told about the takeover and only the epoch can stop it)."""
    a, b = two_nodes
    await a.wait_ready(30)
    await b.wait_ready(30)
    cid = "fence-node"
    old, _ = await Link.open(a.port, Connect(cid, clean_start=False, keep_alive=0))
    old.send(Subscribe(1, (Subscription("fence/x", 1),)))
    assert isinstance(await asyncio.wait_for(old.recv(), 10), Suback)
    sessions = RedisSessionStore.from_url(redis_url)
    queue = RedisQueueStore.from_url(redis_url)
    try:
        before = await sessions.get(cid)
        assert before is not None and before.node == "A"
        new, connack = await Link.open(b.port, Connect(cid, clean_start=False, keep_alive=0))
        assert connack.session_present
        after = await sessions.get(cid)
        assert after is not None and after.node == "B" and after.epoch > before.epoch
        # A still holds the old connection and routes a QoS 1 message to it.
        pub, _ = await Link.open(a.port, Connect("fence-pub", keep_alive=0))
        pub.send(Publish("fence/x", b"m1", 1, packet_id=1))
        assert isinstance(await asyncio.wait_for(pub.recv(), 10), Puback)
        # A's take with its stale epoch is fenced: it closes the old connection,
        # which never sees the message.
        got_on_old = []
        with pytest.raises(ConnectionError):
            async with asyncio.timeout(10):
                while True:
                    got_on_old.append(await old.recv())
        assert not any(isinstance(p, Publish) for p in got_on_old)
        # Redis still says B owns the session under its epoch, and the message is B's.
        final = await sessions.get(cid)
        assert final is not None and (final.node, final.epoch) == ("B", after.epoch)
        # B may take it for its connection at any moment (A notifies B once A's view
        # has B's connect), so take first: whoever took it, it is then in B's window.
        await queue.take(cid, after.epoch, 10)
        queued = [i.message.payload for i in await queue.pending(cid, after.epoch)]
        assert queued == [b"m1"]
        for link in (new, pub):
            link.close()
    finally:
        await queue.close()
        await sessions.close()
