"""`tasks.each`: a step over many items, a bounded number at once; `tasks.Bounded`.

A dead node's takeover runs its per-session store calls and log appends
through it: one at a time, 5,000 sessions took 20 s before the first will."""

from __future__ import annotations

import asyncio

import pytest

from services.tasks import Bounded, each
from tests.support.wait import until

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


async def test_bounded_runs_at_most_its_width_in_the_order_they_came() -> None:
    bounded = Bounded(2)
    gate = asyncio.Event()
    started: list[int] = []

    async def work(n: int) -> int:
        started.append(n)
        await gate.wait()
        return n

    tasks = [asyncio.create_task(bounded.run(work(n))) for n in range(5)]
    await until(lambda: len(started) == 2, "the first two under way")
    gate.set()
    assert await asyncio.gather(*tasks) == [0, 1, 2, 3, 4]
    assert started == [0, 1, 2, 3, 4]


async def test_a_coroutine_cancelled_before_its_turn_is_closed_unrun() -> None:
    bounded = Bounded(1)
    gate = asyncio.Event()
    ran: list[str] = []

    async def work(name: str) -> None:
        ran.append(name)
        await gate.wait()

    first = asyncio.create_task(bounded.run(work("first")))
    waiting = work("waiting")
    second = asyncio.create_task(bounded.run(waiting))
    await until(lambda: ran == ["first"], "the first under way")
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert waiting.cr_frame is None  # closed: no "never awaited" warning
    gate.set()
    await first
    assert ran == ["first"]
    assert bounded.width == 1 and not bounded._slots.locked()
