"""A node on real Redis and Kafka (through `open_backends`), in its own thread.

Used by the durable, event-log, replay and queue tests in tests/integration.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from services.config import Settings
from services.node.node import Node
from tests.integration.conftest import NodeRunner, node_settings


def backend_settings(
    redis_url: str,
    bootstrap: str,
    prefix: str,
    node_id: str = "n1",
    append_timeout_s: float = 5.0,
) -> Settings:
    return replace(
        node_settings(),
        node_id=node_id,
        backend="embedded",
        redis_url=redis_url,
        kafka_bootstrap=bootstrap,
        kafka_topic_prefix=prefix,
        event_append_timeout_s=append_timeout_s,
    )


class BackendNode(NodeRunner):
    """NodeRunner whose backends come from the composition root (Redis + Kafka).
    `state_store=False`: the node ignores the state store (a full replay)."""

    def __init__(self, settings: Settings, state_store: bool = True) -> None:
        super().__init__(settings)
        self.state_store = state_store

    async def _main(self) -> None:
        from services.node.app import open_backends

        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            async with open_backends(self.settings) as (backends, _what):
                services = backends if self.state_store else replace(backends, state=None)
                self.node = Node(self.settings, services)
                try:
                    await self.node.start()
                except BaseException as exc:
                    self._error = exc
                    self._ready.set()
                    await self.node.stop()
                    return
                self._ready.set()
                await self._stop.wait()
                await self.node.stop()
        except BaseException as exc:
            self._error = exc
            self._ready.set()


def start_node(settings: Settings, state_store: bool = True) -> BackendNode:
    runner = BackendNode(settings, state_store)
    runner.start()
    return runner


def node_state(runner: NodeRunner) -> tuple[Any, ...]:
    """What a node holds: its view snapshot, its trie and its retained index."""

    def read() -> tuple[Any, ...]:
        broker = runner.node.broker
        trie = broker.trie
        subs = sorted((key, f) for key in trie.keys() for f in trie.filters(key))  # noqa: SIM118
        retained = sorted((m.topic, m.payload) for m in broker.retained.match("#"))
        return broker.logstate.view.snapshot(), tuple(subs), tuple(retained)

    state: tuple[Any, ...] = runner.call(read)
    return state
