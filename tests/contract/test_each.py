"""`tasks.each`: a step over many items, a bounded number at once.

A dead node's takeover runs its per-session store calls and log appends
through it: one at a time, 5,000 sessions took 20 s before the first will."""

from __future__ import annotations

import asyncio

import pytest

from services.tasks import each

BARRIER_S = 5.0  # a bound on waiting for the other lane: it fails, never passes, by time


async def test_steps_overlap_up_to_the_width_and_the_count_is_of_trues() -> None:
    running = 0
    most = 0
    both = asyncio.Event()

    async def step(item: int) -> bool:
        nonlocal running, most
        running += 1
        most = max(most, running)
        if running >= 2:
            both.set()
        await asyncio.wait_for(both.wait(), BARRIER_S)  # one at a time never gets here
        running -= 1
        return item % 2 == 0

    assert await each(range(10), step, 2) == 5
    assert most == 2


async def test_the_first_error_stops_new_steps_and_is_raised() -> None:
    started: list[int] = []

    async def step(item: int) -> bool:
        started.append(item)
        if item == 3:
            raise ValueError("store down")
        return True

    with pytest.raises(ValueError, match="store down"):
        await each(range(100), step, 4)
    assert len(started) < 100
