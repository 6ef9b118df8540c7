"""Fixtures of the chaos tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.embedded.redis_server import RedisServer


@pytest.fixture
def durable_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own that fsyncs every write (appendfsync always):
    what it acknowledged survives a node's SIGKILL."""
    server = RedisServer(tmp_path / "redis", profile="durable")
    server.start()
    try:
        yield server
    finally:
        server.stop()
