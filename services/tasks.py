"""Ending a background task without swallowing our own cancellation; running
a step over many items, a bounded number at once (`each`); coroutines that
come in bursts run a bounded number at once (`Bounded`).

Theory of operation. A part that stops cancels the task it started and waits
for it to end. That task ends with CancelledError, which is not ours to pass
on; but the one waiting may itself be cancelled meanwhile, and a plain
`suppress(CancelledError)` would swallow that too: the waiter runs on,
cancelled in name only (`Task.cancelling()` stays up), and a loop of its own
never ends. Under Python 3.11 it is worse: each `asyncio.timeout` entered
afterwards counts that stale request as its own, so its expiry reads as a
cancel from outside, and a loop that catches TimeoutError spins on
forever. `cancel_and_wait` re-raises when the waiter was cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


async def cancel_and_wait(task: asyncio.Future[Any] | None) -> None:
    """Cancel `task` and wait for it to end; its own CancelledError stays
    here unless the caller was cancelled meanwhile. Its other errors pass."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise


async def each(items: Iterable[T], step: Callable[[T], Awaitable[bool]], width: int) -> int:
    """Run `step` on every item, at most `width` at once; how many returned
    True. The first error stops the rest from starting and is raised once the
    steps under way have ended (each step must be safe to run again)."""
    pending = iter(items)
    done = 0
    failed: list[BaseException] = []

    async def lane() -> None:
        nonlocal done
        for item in pending:
            if failed:
                return
            try:
                ok = await step(item)  # not `done += await ...`: that reads done first
            except Exception as exc:  # the first is raised below
                failed.append(exc)
                return
            done += ok

    await asyncio.gather(*(lane() for _ in range(max(1, width))))
    if failed:
        raise failed[0]
    return done


class Bounded:
    """Runs coroutines, at most `width` at once; the rest wait their turn in
    the order they came. For work that comes in bursts, such as the session
    ends of 19,000 clients that leave together: as tasks all at once, each
    took a step in every turn of the loop, so one turn took seconds, and
    everything else waited behind it (timers, the answer to the node's
    heartbeat, which then lapsed and fenced the node)."""

    def __init__(self, width: int) -> None:
        self.width = width
        self._slots = asyncio.Semaphore(width)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            await self._slots.acquire()
        except BaseException:  # cancelled while waiting: `coro` never ran
            coro.close()
            raise
        try:
            return await coro
        finally:
            self._slots.release()
