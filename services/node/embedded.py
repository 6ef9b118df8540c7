"""What `weir up` adds on the embedded default (its own redis-server and Kafka).

- `event_log`: on an embedded Kafka (in memory), the node's event log
  writes every event into the Redis state store before acknowledging it
  (`services.state.writer`), and, when this process started that Kafka,
  can cut it (`renew`: restart it empty, and rewrite our redis-server's
  AOF; `services.node.logcut`).
- `kept_note`: the line that tells the user what is kept, and where.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from services.config import Settings
from services.embedded.kafka import EmbeddedKafka
from services.embedded.redis_server import RedisServer
from services.event.api import EventLog
from services.event.kafka import KafkaEventLog, KafkaSettings
from services.state.writer import Renew, StoreWriter, WriteThroughLog


def event_log(
    settings: Settings, bootstrap: str, redis: Any, started: list[Any], embedded_log: bool
) -> EventLog:
    """The node's event log: Kafka, written through to the state store when
    the Kafka is embedded (`started` here, or by the supervisor: `embedded_log`)."""
    kafka_settings = KafkaSettings(
        bootstrap=bootstrap,
        topic_prefix=settings.kafka_topic_prefix,
        append_timeout_s=settings.event_append_timeout_s,
    )
    events = KafkaEventLog(kafka_settings)
    ours = next((s for s in started if isinstance(s, EmbeddedKafka)), None)
    if not embedded_log and ours is None:
        return events
    writer = StoreWriter(redis, kafka_settings.topic_prefix)
    ours_redis = any(isinstance(s, RedisServer) for s in started)
    renew = None if ours is None else _renewer(ours, kafka_settings, redis if ours_redis else None)
    return WriteThroughLog(events, writer, renew)


def _renewer(kafka: EmbeddedKafka, kafka_settings: KafkaSettings, redis: Any) -> Renew:
    """The log cut's `renew`: our embedded Kafka restarted on its port,
    empty, and a new event log on it; and our redis-server's AOF rewritten
    (`redis`, when this process started it)."""

    async def renew() -> EventLog:
        await asyncio.to_thread(kafka.stop)
        kafka.launch()  # on the loop's (main) thread: it dies with this process
        await asyncio.to_thread(kafka.wait_ready)
        fresh = KafkaEventLog(kafka_settings)
        await fresh.start()
        await fresh.warm()  # appends held by the cut resume without waiting for its id
        if redis is not None:
            # The AOF's incremental part holds every write since its last
            # rewrite, forgotten clients too: the next start replays them all
            # (5.8 s after a long soak). A rewrite makes it an RDB image of
            # what is kept (0.5 s to load 100,000 sessions); Redis does it in
            # a child process.
            with contextlib.suppress(RedisError):  # one under way already: it does
                await redis.bgrewriteaof()
        return fresh

    return renew


def kept_note(settings: Settings) -> str:
    where = Path(settings.data_dir).resolve()
    return (
        f"weir: the embedded default keeps its state in {where}: persistent sessions, "
        "subscriptions, queued messages, retained messages, wills, bans and users survive "
        f"a stop or a kill of weir up (stop it and remove {where} to start empty)"
    )
