"""Ending a background task without swallowing our own cancellation.

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
from typing import Any


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

