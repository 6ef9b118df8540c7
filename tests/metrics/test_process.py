"""The process figures: the open-files count never makes a reader wait on the loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Callable
from typing import Any

from services.metrics.process import OpenFiles, read_process


def test_a_read_outside_a_loop_counts_at_once() -> None:
    files = OpenFiles(stale_s=0.0)
    before = files.read()
    r, w = os.pipe()  # two more open files
    try:
        assert files.read() == before + 2
    finally:
        os.close(r)
        os.close(w)
    assert read_process().open_fds > 0


async def test_on_the_loop_a_stale_count_is_shown_while_a_thread_counts_again() -> None:
    files = OpenFiles(stale_s=0.0)
    first = files.read()  # nothing counted yet: counted now
    r, w = os.pipe()
    try:
        # stale: the last count, a recount started (its thread may even have
        # counted by now: CI saw the new count returned before the fix)
        assert files.read() == first
        while files._counting:  # the worker thread's count lands
            await asyncio.sleep(0)
        assert files.read() == first + 2
    finally:
        os.close(r)
        os.close(w)


class AtOnce(concurrent.futures.ThreadPoolExecutor):
    """A pool (the loop takes nothing else) whose jobs run inside `submit`: as
    a worker thread that finishes before the submitting code's next line."""

    def submit(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        done.set_result(fn(*args, **kwargs))
        return done


async def test_a_recount_that_lands_before_the_read_returns_is_not_what_it_returns() -> None:
    """The race CI hit, made certain: the recount runs to its end before
    `read` returns."""
    asyncio.get_running_loop().set_default_executor(AtOnce())
    files = OpenFiles(stale_s=0.0)
    first = files.read()
    r, w = os.pipe()
    try:
        assert files.read() == first  # the last count; the recount landed meanwhile
        assert files.read() == first + 2
    finally:
        os.close(r)
        os.close(w)
