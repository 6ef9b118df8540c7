"""Replay benchmark: how long a node takes to rebuild its view from the log.

Produces N Subscribed events over C clients (N/C filters each, versions
1..N/C per client) into an embedded Tansu broker (or --kafka HOST:PORT),
then times a replay to partition EOF into a fresh ClusterView: seconds to
done, events/s, and the memory the view holds (RSS growth, measured after
the consumer is closed). Target: 1,000,000 events in <= 30 s.

    python -m bench.replay [--events 1000000] [--clients 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from confluent_kafka import Producer

from services.cluster.view import ClusterView
from services.event.embedded_kafka import EmbeddedKafka
from services.event.kafka import KafkaEventLog, KafkaSettings
from services.event.schema import Subscribed, encode

PRODUCE_TIMEOUT_S = 300.0


@dataclass(frozen=True, slots=True)
class Result:
    events: int
    clients: int
    partitions: int
    produce_s: float
    replay_s: float
    events_per_s: float
    view_rss_mib: float
    subscriptions: int


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def produce(bootstrap: str, prefix: str, events: int, clients: int) -> float:
    per_client = max(1, events // clients)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 200_000,
        }
    )
    failures = 0

    def delivered(err: object, _msg: object) -> None:
        nonlocal failures
        if err is not None:
            failures += 1

    started = time.monotonic()
    n = 0
    for v in range(1, per_client + 1):
        for c in range(clients):
            if n == events:
                break
            event = Subscribed(
                client_id=f"client-{c:06d}",
                version=v,
                node="bench",
                ts_ms=v,
                filter=f"site/{c % 97}/device/{c}/ch/{v}",
                qos=1,
            )
            suffix, key, value = encode(event)
            while True:
                try:
                    producer.produce(
                        prefix + suffix, key=key.encode(), value=value, on_delivery=delivered
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
            n += 1
            if n % 10_000 == 0:
                producer.poll(0)
    left = producer.flush(PRODUCE_TIMEOUT_S)
    if left or failures:
        raise RuntimeError(f"produce: {left} undelivered, {failures} failed")
    return time.monotonic() - started


async def replay(bootstrap: str, prefix: str, partitions: int) -> tuple[float, ClusterView, int]:
    gc.collect()
    log = KafkaEventLog(KafkaSettings(bootstrap, topic_prefix=prefix, partitions=partitions))
    view = ClusterView()
    started = time.monotonic()
    count = await log.replay(view.apply)
    elapsed = time.monotonic() - started
    await log.close()
    return elapsed, view, count


def run(events: int, clients: int, partitions: int, kafka: str | None) -> Result:
    broker = None if kafka else EmbeddedKafka().start()
    bootstrap = kafka or (broker.bootstrap if broker else "")
    prefix = f"bench{uuid.uuid4().hex[:8]}."
    try:
        setup = KafkaEventLog(KafkaSettings(bootstrap, topic_prefix=prefix, partitions=partitions))
        asyncio.run(setup.ensure_topics())
        produce_s = produce(bootstrap, prefix, events, clients)
        gc.collect()
        before = rss_mib()
        replay_s, view, count = asyncio.run(replay(bootstrap, prefix, partitions))
        gc.collect()
        grown = rss_mib() - before
        if count != events:
            raise RuntimeError(f"replayed {count} events, produced {events}")
        subs = sum(len(s) for s in view.all_subscriptions().values())
        return Result(
            events, clients, partitions, produce_s, replay_s, count / replay_s, grown, subs
        )
    finally:
        if broker is not None:
            broker.stop()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__)
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--clients", type=int, default=100_000)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--kafka", help="HOST:PORT of a broker (default: start embedded Tansu)")
    args = p.parse_args(argv)
    result = run(args.events, args.clients, args.partitions, args.kafka)
    print(json.dumps(asdict(result)))
    print(
        f"replayed {result.events:,} events ({result.clients:,} clients) in "
        f"{result.replay_s:.1f} s: {result.events_per_s:,.0f} events/s, "
        f"view about {result.view_rss_mib:.0f} MiB; produce took {result.produce_s:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
