"""The state-store job end to end: exactly-once effect across a SIGKILL of its driver.

Real embedded Kafka, real redis-server, the job as `python -m streams run
state` (its own SparkSession): a random workload with racing writers is
produced, the job folds it in small micro-batches, its driver is killed
with SIGKILL in the middle, more events are produced, and the job restarts
from its checkpoint with --available-now. The state store must then equal
a full replay of the log, and record the log's end as its offsets: no
event lost, none applied twice with a different effect.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import redis
from confluent_kafka import Producer

from services.event.kafka import KafkaEventLog, KafkaSettings
from services.event.schema import Event, encode
from services.state.view import ClusterView
from tests.contract.test_cluster_view import to_events
from tests.streams.test_statestore import load, random_ops, view_of
from tests.support.wait import wait_until

JOB_S = 300.0  # a JVM start plus the fold on a shared 2-core machine


def produce(bootstrap: str, prefix: str, events: list[Event], rng: random.Random) -> None:
    """Keyed, Java partitioner; one key's events sometimes land swapped (a race)."""
    events = list(events)
    for i in range(len(events) - 1):
        if events[i].key == events[i + 1].key and rng.random() < 0.1:
            events[i], events[i + 1] = events[i + 1], events[i]
    producer = Producer(
        {"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "acks": "all"}
    )
    for event in events:
        suffix, key, value = encode(event)
        producer.produce(prefix + suffix, key=key.encode(), value=value)
        producer.poll(0)
    assert producer.flush(30) == 0


def replay(bootstrap: str, prefix: str) -> tuple[ClusterView, dict[tuple[str, int], int]]:
    async def go() -> tuple[ClusterView, dict[tuple[str, int], int]]:
        log = KafkaEventLog(KafkaSettings(bootstrap=bootstrap, topic_prefix=prefix))
        view = ClusterView()
        try:
            await log.replay(view.apply)
            return view, log.positions()
        finally:
            await log.close()

    return asyncio.run(go())


def make_topics(bootstrap: str, prefix: str) -> None:
    async def go() -> None:
        log = KafkaEventLog(KafkaSettings(bootstrap=bootstrap, topic_prefix=prefix))
        try:
            await log.ensure_topics()
        finally:
            await log.close()

    asyncio.run(go())


def job(bootstrap: str, url: str, prefix: str, data: Path, *extra: str) -> subprocess.Popen[bytes]:
    args = ["--kafka", bootstrap, "--redis", url, "--kafka-topic-prefix", prefix]
    log = (data / "job.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "streams", "run", "state", *args, "--data-dir", str(data), *extra],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its JVM too: the SIGKILL goes to the whole group
    )


def test_driver_killed_mid_stream_then_restarted_equals_full_replay(
    kafka_bootstrap: str, kafka_topic_prefix: str, redis_url: str, tmp_path: Path
) -> None:
    rng = random.Random(7)
    prefix = kafka_topic_prefix
    events = to_events(random_ops(rng, 4000))
    first, second = events[:3000], events[3000:]
    make_topics(kafka_bootstrap, prefix)
    produce(kafka_bootstrap, prefix, first, rng)
    store = redis.Redis.from_url(redis_url)
    meta = "{" + prefix + "state}:meta"

    running = job(
        kafka_bootstrap, redis_url, prefix, tmp_path,
        "--max-records-per-trigger", "150", "--trigger-s", "0.2",
    )  # fmt: skip
    try:
        wait_until(
            lambda: int(store.hget(meta, "batch") or -1) >= 3 or running.poll() is not None,
            "three micro-batches folded",
            timeout=JOB_S,
        )
        assert running.poll() is None, (tmp_path / "job.log").read_text()[-3000:]
    finally:
        os.killpg(running.pid, signal.SIGKILL)
        running.wait()
    killed_at = int(store.hget(meta, "batch") or -1)
    assert killed_at < 3000 // 150, "killed before the log was folded: mid-stream"

    produce(kafka_bootstrap, prefix, second, rng)
    again = job(kafka_bootstrap, redis_url, prefix, tmp_path, "--available-now")
    assert again.wait(timeout=JOB_S) == 0, (tmp_path / "job.log").read_text()[-3000:]
    assert int(store.hget(meta, "batch") or -1) > killed_at  # it resumed, not restarted

    full, positions = replay(kafka_bootstrap, prefix)
    snapshot = load(redis_url, prefix)
    assert view_of(snapshot).snapshot() == full.snapshot()
    assert snapshot.offsets == positions  # it reflects the whole log, no more, no less


def test_redis_down_the_job_says_so_retries_from_its_checkpoint_and_catches_up(
    kafka_bootstrap: str, kafka_topic_prefix: str, tmp_path: Path
) -> None:
    from services.embedded.redis_server import RedisServer

    rng = random.Random(11)
    prefix = kafka_topic_prefix
    events = to_events(random_ops(rng, 600))
    make_topics(kafka_bootstrap, prefix)
    produce(kafka_bootstrap, prefix, events, rng)
    server = RedisServer(tmp_path / "redis").start()
    url = server.url
    server.stop()  # down before the job starts; it comes back on the same port
    log = tmp_path / "job.log"
    folding = job(kafka_bootstrap, url, prefix, tmp_path, "--available-now")
    try:
        wait_until(
            lambda: (
                "retrying from its checkpoint" in log.read_text(errors="replace")
                or folding.poll() is not None
            ),
            "the job to say it retries",
            timeout=JOB_S,
        )
        assert folding.poll() is None, log.read_text()[-3000:]
        server.start()
        assert folding.wait(timeout=JOB_S) == 0, log.read_text()[-3000:]
        full, positions = replay(kafka_bootstrap, prefix)
        snapshot = load(url, prefix)
        assert view_of(snapshot).snapshot() == full.snapshot()
        assert snapshot.offsets == positions
    finally:
        if folding.poll() is None:
            os.killpg(folding.pid, signal.SIGKILL)
            folding.wait()
        server.stop()


def test_kafka_unreachable_the_job_says_so_and_stops_on_sigterm(
    redis_url: str, tmp_path: Path
) -> None:
    from services.ports import free_port

    closed = f"127.0.0.1:{free_port()}"  # nothing listens there
    log = tmp_path / "job.log"
    waiting = job(closed, redis_url, "weir.", tmp_path, "--trigger-s", "0.5")
    try:
        wait_until(
            lambda: (
                "retrying from its checkpoint" in log.read_text(errors="replace")
                or waiting.poll() is not None
            ),
            "the job to say it retries",
            timeout=JOB_S,
        )
        assert waiting.poll() is None, log.read_text()[-3000:]
        waiting.send_signal(signal.SIGTERM)
        waiting.wait(timeout=JOB_S)
    finally:
        if waiting.poll() is None:
            os.killpg(waiting.pid, signal.SIGKILL)
            waiting.wait()
