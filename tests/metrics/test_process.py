"""The process figures: the open-files count never makes a reader wait on the loop."""

from __future__ import annotations

import asyncio
import os

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
        assert files.read() == first  # stale: the last count, a recount started
        assert files._counting
        while files._counting:  # the worker thread's count lands
            await asyncio.sleep(0)
        assert files.read() == first + 2
    finally:
        os.close(r)
        os.close(w)
