"""What a kafka_in bridge may commit, driven on the event loop without Kafka:
the offset after the longest routed prefix of each partition, never past a
record still in flight or being retried; a revoked partition's late answers
commit nothing. (The consumer's thread, which commits, is not started: the
test reads what it would commit.)"""

from __future__ import annotations

import asyncio

from services.bridge.ingress import KafkaIngress
from services.bridge.templates import Record
from services.config.bridges import KafkaIn
from services.mqtt.packets import Message
from tests.support.wait import until

TABLE = KafkaIn(name="t", topics=("k",), mqtt_topic="d/${key}")


class Broker:
    """Stands in for the broker's `publish_inside`: the test answers each message."""

    def __init__(self) -> None:
        self.waiting: list[tuple[Message, asyncio.Future[bool]]] = []

    def publish(self, message: Message) -> asyncio.Future[bool]:
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.waiting.append((message, future))
        return future

    async def answer(self, topic: str, ok: bool) -> None:
        """Answer the message on `topic`; its done-callbacks run in the next loop turn."""
        for i, (message, future) in enumerate(self.waiting):
            if message.topic == topic:
                del self.waiting[i]
                future.set_result(ok)
                await asyncio.sleep(0)  # one turn of the loop: the callbacks ran
                return
        raise AssertionError(f"no message on {topic} waits")


def records(partition: int, *keys: bytes) -> list[Record]:
    return [Record("k", partition, offset, key, b"v", 0) for offset, key in enumerate(keys)]


def hand(bridge: KafkaIngress, batch: list[Record], epoch: int) -> None:
    """What the consumer's thread does with a fetched batch."""
    bridge._handed += len(batch)
    bridge._take(batch, epoch)


def to_commit(bridge: KafkaIngress) -> dict[tuple[str, int], int]:
    return dict(bridge._to_commit)


async def test_commits_follow_the_routed_prefix_and_wait_out_retries() -> None:
    broker = Broker()
    bridge = KafkaIngress(TABLE, "127.0.0.1:9", broker.publish, asyncio.get_running_loop())
    bridge._retrack([("k", 0), ("k", 1)], 1)
    hand(bridge, records(0, b"a", b"b", b"c+", b"d"), 1)  # c+ renders no topic: skipped
    hand(bridge, records(1, b"x"), 1)
    assert [m.topic for m, _ in broker.waiting] == ["d/a", "d/b", "d/d", "d/x"]
    assert bridge.stats().dropped == 1 and bridge.stats().buffered_records == 4

    await broker.answer("d/b", True)  # routed out of order: nothing committable before d/a
    assert to_commit(bridge) == {}
    await broker.answer("d/a", False)  # failed: retried, and holds the partition
    await broker.answer("d/d", True)
    await broker.answer("d/x", True)
    assert to_commit(bridge) == {("k", 1): 1}
    assert bridge.stats().failures == 1
    await until(lambda: [m.topic for m, _ in broker.waiting] == ["d/a"], "the retry", 5.0)
    await broker.answer("d/a", True)
    assert to_commit(bridge) == {("k", 0): 4, ("k", 1): 1}  # past the skipped record too
    s = bridge.stats()
    assert (s.records, s.buffered_records, s.buffered_bytes) == (4, 0, 0)


async def test_a_revoked_partition_commits_nothing_more() -> None:
    broker = Broker()
    bridge = KafkaIngress(TABLE, "127.0.0.1:9", broker.publish, asyncio.get_running_loop())
    bridge._retrack([("k", 0)], 1)
    hand(bridge, records(0, b"a", b"b"), 1)
    await broker.answer("d/a", True)
    assert to_commit(bridge) == {("k", 0): 1}
    bridge._to_commit.clear()  # the thread took it
    bridge._untrack({("k", 0)})  # revoked: the thread committed what it had
    bridge._retrack([("k", 0)], 2)  # and assigned again: consumed again from offset 1
    await broker.answer("d/b", True)  # the old assignment's answer
    hand(bridge, records(0, b"late"), 1)  # a batch fetched before the revoke
    assert to_commit(bridge) == {} and broker.waiting == []
    assert bridge.stats().buffered_records == 0
