"""The backends a `weir up` process starts itself when none is configured:
an embedded redis-server (its data under `<data-dir>/redis`) and the
embedded Kafka-protocol broker, on free loopback ports. One node's `weir
up` (`services.node.app`) and the supervisor of `--nodes` / `--workers`
(`services.machine.supervisor`) both start them here; the caller stops them,
in reverse order, after whatever uses them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.config import Settings


class BackendError(Exception):
    """A backend could not be started or reached; the message is one line."""


def start_backends(settings: Settings, started: list[Any]) -> tuple[str, str]:
    """The Redis URL and Kafka bootstrap to use: the configured ones, or an
    embedded redis-server and Kafka started here and appended to `started`."""
    from services.embedded.kafka import EmbeddedKafka, EmbeddedKafkaError
    from services.embedded.redis_server import RedisServer, RedisServerError

    redis_url = settings.redis_url
    if redis_url is None:
        data = Path(settings.data_dir).resolve() / "redis"  # it runs in that directory
        try:
            server = RedisServer(data, profile=settings.durability).start()
        except (RedisServerError, OSError) as exc:
            raise BackendError(f"cannot start redis-server: {exc}") from None
        started.append(server)
        redis_url = server.url
    bootstrap = settings.kafka_bootstrap
    if bootstrap is None:
        try:
            kafka = EmbeddedKafka().start()
        except (EmbeddedKafkaError, OSError) as exc:
            raise BackendError(f"cannot start the embedded Kafka: {exc}") from None
        started.append(kafka)
        bootstrap = kafka.bootstrap
    return redis_url, bootstrap
