"""The chaos clients themselves, against a pure-memory node: without kills they
see every message exactly once; a restart of a memory node (which forgets every
session) is noticed as a lost session, never silently absorbed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.session.redis_server import free_port
from tests.chaos.harness import NodeProcess, QoS2Publisher, Subscriber

TOTAL = 2000
TOPIC = "harness/seq"


@pytest.fixture
def memory_node(tmp_path: Path) -> Iterator[NodeProcess]:
    port = free_port()
    args = ["--backend", "memory", "--host", "127.0.0.1", "--mqtt-port", str(port)]
    args += ["--ws-port", "off", "--node-id", "h1", "--data-dir", str(tmp_path / "node")]
    node = NodeProcess(args, port, tmp_path / "node.log")
    node.start()
    try:
        yield node
    finally:
        node.stop()


async def _until(condition: object, timeout: float) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_clients_count_exactly_once_without_kills(memory_node: NodeProcess) -> None:
    await memory_node.wait_ready(30)
    deadline = time.monotonic() + 30
    subs = [Subscriber("h-q1", TOPIC, 1), Subscriber("h-q2", TOPIC, 2)]
    tasks = [asyncio.create_task(s.run(memory_node.port, deadline)) for s in subs]
    await _until(lambda: all(s.subscribed for s in subs), 10)
    pub = QoS2Publisher("h-pub", TOPIC, TOTAL, rate=4000.0)
    await pub.run(memory_node.port, deadline)
    await _until(lambda: not any(s.missing(TOTAL) for s in subs), 10)
    for s in subs:
        s.stop.set()
    await asyncio.gather(*tasks)
    assert pub.done and pub.completed == TOTAL and pub.connects == 1
    for s in subs:
        assert len(s.delivered) == TOTAL and s.duplicates() == []
        assert s.connects == 1 and s.sessions_lost == 0
    assert subs[1].awaiting_rel == set()  # every PUBREL came


async def test_a_restart_that_forgets_sessions_is_counted(memory_node: NodeProcess) -> None:
    await memory_node.wait_ready(30)
    deadline = time.monotonic() + 30
    sub = Subscriber("h-forget", TOPIC, 1)
    task = asyncio.create_task(sub.run(memory_node.port, deadline))
    await _until(lambda: sub.subscribed, 10)
    memory_node.kill()
    memory_node.start()
    await memory_node.wait_ready(30)
    await _until(lambda: sub.connects == 2 and sub.subscribed, 10)
    sub.stop.set()
    await task
    assert sub.sessions_lost == 1  # the memory node answered session_present=0
