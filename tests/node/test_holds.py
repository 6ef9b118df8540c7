"""A publisher held for a slow subscriber, and a cluster link held the same way:
each hold ends when the subscriber drains or after PUBLISHER_STALL_S, and the
bound of a hold that already ended cannot cut a later hold short.

The loop's clock is the test's (`ClockLoop`): a timer fires when the test moves
time past it, never because the machine was slow. Before the fix, each hold
left its timer behind; once a drain ended a hold early, its timer ended the
next one early, and every such pair added one more: under a steady fan-in
across two nodes the held link ran almost free and the subscriber's queue
(drop_oldest) lost acknowledged messages.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from services.broker.ports import PUBLISHER_STALL_S
from services.broker.remote import LinkHold
from tests.node.test_connection import make_harness, settings


class ClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when the test says."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0

    def time(self) -> float:
        return self.now


def run(test: Callable[[ClockLoop], Awaitable[None]]) -> None:
    loop = ClockLoop()
    try:
        loop.run_until_complete(test(loop))
    finally:
        loop.close()


async def advance(loop: ClockLoop, seconds: float) -> None:
    """Move the clock and let every timer now due run."""
    loop.now += seconds
    for _ in range(3):
        await asyncio.sleep(0)


class FakeLink:
    def __init__(self) -> None:
        self.paused = False
        self.holder: object = None

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False


class Subscriber:
    """A ConnectionPort as a held publisher sees it: waiters, woken on drain."""

    def __init__(self) -> None:
        self.waiters: list[Any] = []

    def add_waiter(self, publisher: Any) -> None:
        self.waiters.append(publisher)

    def wake_waiters(self) -> None:
        waiters, self.waiters = self.waiters, []
        for publisher in waiters:
            publisher.unblock(self)


def test_a_link_hold_outlives_the_bound_of_the_hold_before_it() -> None:
    async def scenario(loop: ClockLoop) -> None:
        link, sub = FakeLink(), Subscriber()
        hold = LinkHold(link)  # type: ignore[arg-type]
        hold.block_on(sub)  # type: ignore[arg-type]
        assert link.paused
        await advance(loop, 0.1)
        sub.wake_waiters()  # drained early: the first hold ends
        assert not link.paused
        await advance(loop, 0.2)
        hold.block_on(sub)  # type: ignore[arg-type]  # behind again, at 0.3 s
        await advance(loop, PUBLISHER_STALL_S - 0.25)  # past the first hold's bound
        assert link.paused, "the first hold's timer ended the second hold"
        await advance(loop, 0.3)  # past the second hold's own bound
        assert not link.paused and hold.holds == 2

    run(scenario)


def test_a_held_publisher_outlives_the_bound_of_its_hold_before() -> None:
    async def scenario(loop: ClockLoop) -> None:
        harness = await make_harness(settings())
        pub, pub_t = await harness.connected("held-pub", level=4)
        sub = Subscriber()
        pub.block_on(sub)  # type: ignore[arg-type]
        assert not pub_t.reading
        await advance(loop, 0.1)
        sub.wake_waiters()
        assert pub_t.reading
        await advance(loop, 0.2)
        pub.block_on(sub)  # type: ignore[arg-type]
        await advance(loop, PUBLISHER_STALL_S - 0.25)
        assert not pub_t.reading, "the first hold's timer ended the second hold"
        await advance(loop, 0.3)
        assert pub_t.reading

    run(scenario)
