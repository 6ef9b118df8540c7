"""Talking to the generator's own child processes over a multiprocessing pipe, from a loop."""

from __future__ import annotations

import asyncio
from multiprocessing.connection import Connection
from typing import Any

from bench.errors import BenchError


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def receive(conn: Connection, wait_s: float, who: str) -> Any:
    """The next message on `conn`, read once the loop sees its descriptor readable.

    Raises `BenchError` if nothing comes within `wait_s` or the other end is gone.
    """
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    loop.add_reader(conn.fileno(), _wake, ready)
    try:
        async with asyncio.timeout(wait_s):
            await ready
    except TimeoutError as exc:
        raise BenchError(f"{who} did not answer within {wait_s:g} s") from exc
    finally:
        loop.remove_reader(conn.fileno())
    try:
        return conn.recv()
    except EOFError as exc:
        raise BenchError(f"{who} died") from exc
