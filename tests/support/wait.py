"""Waiting for a condition with a deadline: polling, never a bare sleep.

`wait_until` blocks the calling thread (tests that drive a node running in
its own thread); `until` is awaited in the test's event loop and also takes
a predicate that is itself a coroutine function. Both fail with an
AssertionError naming what was awaited.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable


def wait_until(
    check: Callable[[], bool],
    what: str = "the condition",
    timeout: float = 10.0,
    interval: float = 0.02,
) -> None:
    """Block until `check()` is true, checking every `interval` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


async def until(
    check: Callable[[], bool | Awaitable[bool]],
    what: str = "the condition",
    timeout: float = 5.0,
    interval: float = 0.01,
) -> None:
    """Await until `check()` (or, for a coroutine function, `await check()`) is true.

    `interval=0` checks on every turn of the event loop, so that a state that
    lasts only a few turns is still seen."""
    deadline = time.monotonic() + timeout
    while True:
        done = check()
        if inspect.isawaitable(done):
            done = await done
        if done:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(interval)
