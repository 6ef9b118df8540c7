"""Reading a bridge's Kafka topic back, and Kafka's own key partitioner."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

READ_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


def read_topic(bootstrap: str, topic: str) -> list[Record]:
    """Every record of `topic`, partition by partition in offset order: read from
    the beginning to each partition's EOF (Tansu's ListOffsets is not trusted)."""
    import time

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "weir-test-bridge-reader",
        "enable.auto.commit": False, "enable.partition.eof": True, "fetch.wait.max.ms": 10,
    })  # fmt: skip
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        assert partitions, f"topic {topic} has no partitions"
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        left = set(partitions)
        records: list[Record] = []
        deadline = time.monotonic() + READ_TIMEOUT_S
        while left:
            assert time.monotonic() < deadline, f"no EOF from partitions {left} of {topic}"
            for m in consumer.consume(500, timeout=0.5):
                err = m.error()
                if err is not None:
                    assert err.code() == KafkaError._PARTITION_EOF, err
                    left.discard(m.partition())
                    continue
                records.append(Record(m.partition(), m.offset(), m.key(), m.value(),
                                      tuple(m.headers() or ())))  # fmt: skip
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def murmur2_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's Java client gives `key` (its murmur2, positive, mod n)."""
    m, h = 0x5BD1E995, (0x9747B28C ^ len(key)) & 0xFFFFFFFF
    whole = len(key) & ~3
    for i in range(0, whole, 4):
        k = int.from_bytes(key[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = key[whole:]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h = ((h ^ tail[0]) * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % partitions


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions)])[topic].result(timeout=10)


def produce(bootstrap: str, topic: str,
            records: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]]) -> None:
    """(key, value, headers) records, keyed as Java clients key them, all acknowledged."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random",
                         "enable.idempotence": True, "linger.ms": 1})  # fmt: skip
    for key, value, headers in records:
        producer.produce(topic, value, key, headers=headers or None)
    assert producer.flush(30) == 0, "records not acknowledged by Kafka"


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offset per partition (-1001: none)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})  # fmt: skip
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)],
                                   timeout=10)  # fmt: skip
        return {tp.partition: tp.offset for tp in found}
    finally:
        consumer.close()
