"""The backends a `weir up` process starts itself when none is configured:
an embedded redis-server (its data under `<data-dir>/redis`) and the
embedded Kafka-protocol broker, on free loopback ports. One node's `weir
up` (`services.node.app`) and the supervisor of `--nodes` / `--workers`
(`services.machine.supervisor`) both start them here; the caller stops them,
in reverse order, after whatever uses them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.config import Settings


class BackendError(Exception):
    """A backend could not be started or reached; the message is one line."""


def start_backends(settings: Settings, started: list[Any]) -> tuple[str, str]:
    """The Redis URL and Kafka bootstrap to use: the configured ones, or an
    embedded redis-server and Kafka started here and appended to `started`."""
    return launch_backends(settings, started)()


def launch_backends(settings: Settings, started: list[Any]) -> Callable[[], tuple[str, str]]:
    """Start the embedded ones' processes (appended to `started`) without
    waiting for them; the call returned waits until they answer and gives
    the Redis URL and Kafka bootstrap. Both start at once, and the caller
    may do its own work meanwhile: a redis-server loading a large AOF (a
    second per 100,000 sessions) and Tansu take about as long as weir up's
    imports."""
    from services.embedded.kafka import EmbeddedKafka, EmbeddedKafkaError
    from services.embedded.redis_server import RedisServer, RedisServerError

    server = kafka = None
    if settings.redis_url is None:
        data = Path(settings.data_dir).resolve() / "redis"  # it runs in that directory
        server = RedisServer(data, profile=settings.durability)
        try:
            server.launch()
        except (RedisServerError, OSError) as exc:
            raise BackendError(f"cannot start redis-server: {exc}") from None
        started.append(server)
    if settings.kafka_bootstrap is None:
        kafka = EmbeddedKafka()
        try:
            kafka.launch()
        except (EmbeddedKafkaError, OSError) as exc:
            raise BackendError(f"cannot start the embedded Kafka: {exc}") from None
        started.append(kafka)

    def ready() -> tuple[str, str]:
        if server is not None:
            try:
                server.wait_ready()
            except (RedisServerError, OSError) as exc:
                raise BackendError(f"cannot start redis-server: {exc}") from None
        if kafka is not None:
            try:
                kafka.wait_ready()
            except (EmbeddedKafkaError, OSError) as exc:
                raise BackendError(f"cannot start the embedded Kafka: {exc}") from None
        redis_url = settings.redis_url or (server.url if server is not None else "")
        bootstrap = settings.kafka_bootstrap or (kafka.bootstrap if kafka is not None else "")
        return redis_url, bootstrap

    return ready
