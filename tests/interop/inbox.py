"""Received messages, kept in order until a scenario takes them."""

from __future__ import annotations

import asyncio

from tests.interop.api import Msg


class Inbox:
    def __init__(self) -> None:
        self._items: list[Msg] = []
        self._changed = asyncio.Event()

    def put(self, message: Msg) -> None:
        self._items.append(message)
        self._changed.set()

    async def take(self, count: int, timeout: float) -> list[Msg]:
        """The first `count` messages, or those there are once `timeout` has passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self._items) < count:
            self._changed.clear()
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                break
        taken, self._items = self._items[:count], self._items[count:]
        return taken
