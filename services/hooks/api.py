"""Hook points and their chain of responsibility (EMQX's hooks, docs/architecture.md).

Theory of operation. A callback registered on a hook point gets the point's
arguments and, for the points that carry a value (`FOLDS`), the value so
far. It returns one of:

- `CONTINUE` (or None): the next callback runs with the same value;
- `Continue(value)`: the next callback runs with `value`;
- `STOP`: no later callback runs; the value so far is the result;
- `Stop(value)`: no later callback runs; `value` is the result.

Callbacks run in priority order (higher first; equal priorities in the order
they were added). `Hooks.run` is for notifications (the result is ignored);
`Hooks.fold` returns the chain's value, e.g. `message.publish` may replace a
message or stop it (None: not published). Points are fixed: an unknown name
is a ValueError naming it. A callback that raises is logged and skipped, so
one plugin cannot break the broker. With nothing registered a point costs
one dictionary look-up; callers on a per-message path check `has` first.

Async callbacks. On a notification point (`run`) a callback may be a
coroutine function: its coroutine runs as a task of its own, bounded by
`timeout_s`, so a slow plugin never holds up the client that fired the
point or any other (its return value cannot stop the chain: the chain
has moved on). At most `MAX_PENDING` such tasks are in flight; past that
a call is dropped and counted. The fold points (`FOLDS`) decide a value
on the caller's path and must answer synchronously: a coroutine function
is refused by `add`, and a callback that returns an awaitable anyway is
counted as failed and skipped. A synchronous callback cannot be
interrupted; a chain of them that takes longer than `SLOW_S` is logged
(naming its callbacks) and counted: timed once per chain, not per callback,
since two clock reads per callback would cost more than a no-op callback,
on a clock that stands still while Python collects garbage
(`services.clock.busy`: a collection that falls inside a chain is not its time).
Failures are logged rate-limited (`services.logs.RateLimit` on the
handler) and counted in `stats()`.

Cost. `message.publish` and `message.delivered` run once per message (and
per copy), so their callers take the chain as one compiled two-argument
callable (`notifier`, `folder`: a closure with the callbacks written out one
after another, no loop (`_chain_maker`), rebuilt by `add` and `remove`), with
no point look-up and no `*args`. A callback that
answers None or `CONTINUE` (the common case) costs its call and one identity
test; only other answers are looked at further. Those chains are timed by
sample, one call in `SAMPLE` (the first one included): two clock reads cost a
third of five no-op callbacks. A callback slow on every call is still found
within `SAMPLE` calls; one slow only now and then may go uncounted there, and
the event-loop lag (metrics, alarms) shows it instead.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from services.clock import busy, watch_gc

log = logging.getLogger("weir.hooks")

HOOK_POINTS: Final = (
    "client.connect",
    "client.connack",
    "client.connected",
    "client.disconnected",
    "client.authenticate",
    "client.check_acl",
    "client.subscribe",
    "client.unsubscribe",
    "session.created",
    "session.subscribed",
    "session.unsubscribed",
    "session.resumed",
    "session.discarded",
    "session.takenover",
    "session.terminated",
    "message.publish",
    "message.delivered",
    "message.acked",
    "message.dropped",
)
"""The hook points of DESIGN 8, in EMQX's names."""

FOLDS: Final = frozenset({"client.authenticate", "client.check_acl", "message.publish"})
"""The points whose chain decides a value (`Hooks.fold`); the rest notify (`Hooks.run`)."""

TIMEOUT_S: Final = 5.0  # an async callback's budget (EMQX's webhook request timeout)
SLOW_S: Final = 0.1  # a sync callback this slow holds up its caller's loop: logged, counted
MAX_PENDING: Final = 10_000  # async callbacks in flight at most (about 1 KB each)
SAMPLE: Final = 16  # the compiled chains (`notifier`, `folder`) time one call in this many

@dataclass(frozen=True, slots=True)
class Continue:
    value: Any

@dataclass(frozen=True, slots=True)
class Stop:
    value: Any

CONTINUE: Final = Continue(None)
STOP: Final = Stop(None)

Callback = Callable[..., Any]

@dataclass(frozen=True, slots=True)
class _Entry:
    priority: int
    order: int
    callback: Callback

class Hooks:
    def __init__(self, timeout_s: float = TIMEOUT_S) -> None:
        self._entries: dict[str, list[_Entry]] = {}  # by priority, then order added
        self._chains: dict[str, tuple[Callback, ...]] = {}  # the same, as the loops walk them
        self._compiled: dict[str, Callable[[Any, Any], Any]] = {}  # notifier / folder per point
        self._added = 0
        self.timeout_s = timeout_s
        self._pending: set[asyncio.Task[Any]] = set()
        self.failed = 0  # callbacks that raised (or answered a fold with an awaitable)
        self.timed_out = 0  # async callbacks past timeout_s, cancelled
        self.slow = 0  # sync callbacks past SLOW_S
        self.dropped = 0  # async callbacks not started: MAX_PENDING in flight
        self.watches_copies = False  # message.delivered or .dropped has a callback: the
        #   fan-out's one check per message (an attribute, kept by add and remove)
        self.checks_acl = False  # client.check_acl has a callback (the same, per PUBLISH)
        # The two per-message chains as attributes (kept by add and remove): what
        # `folder("message.publish")` and `notifier("message.delivered")` answer,
        # without a call per message.
        self.on_publish: Callable[[Any, Any], Any] | None = None
        self.on_delivered: Callable[[Any, Any], Any] | None = None

    def stats(self) -> dict[str, int]:
        return {"failed": self.failed, "timed_out": self.timed_out, "slow": self.slow,
                "dropped": self.dropped, "pending": len(self._pending)}  # fmt: skip

    async def close(self) -> None:
        """The node stops: async callbacks still running are cancelled."""
        pending = list(self._pending)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    async def settle(self) -> None:
        """Wait for the async callbacks in flight (tests; a node stopping)."""
        while self._pending:
            await asyncio.wait(list(self._pending))

    @staticmethod
    def _check(point: str) -> None:
        if point not in HOOK_POINTS:
            raise ValueError(f"unknown hook point {point!r}")

    def add(self, point: str, callback: Callback, priority: int = 0) -> None:
        self._check(point)
        if point in FOLDS and inspect.iscoroutinefunction(callback):
            raise ValueError(f"hook {point} decides on the caller's path: {callback!r} must "
                             "not be a coroutine function")  # fmt: skip
        self._added += 1
        watch_gc()  # a collection inside a chain is not the chain's time (`_timed`)
        entries = [*self._entries.get(point, ()), _Entry(priority, self._added, callback)]
        entries.sort(key=lambda e: (-e.priority, e.order))
        self._entries[point] = entries
        self._chains[point] = tuple(e.callback for e in entries)
        self._changed(point)

    def remove(self, point: str, callback: Callback) -> bool:
        """Unregister; False if `callback` was not on `point`."""
        self._check(point)
        entries = self._entries.get(point, [])
        kept = [e for e in entries if e.callback is not callback]
        if kept:
            self._entries[point] = kept
            self._chains[point] = tuple(e.callback for e in kept)
        else:
            self._entries.pop(point, None)
            self._chains.pop(point, None)
        self._changed(point)
        return len(kept) != len(entries)

    def _changed(self, point: str) -> None:
        chain = self._chains.get(point)
        if chain is None:
            self._compiled.pop(point, None)
        else:
            self._compiled[point] = self._compile(point, chain)
        self.watches_copies = "message.delivered" in self._chains or (
            "message.dropped" in self._chains)
        self.checks_acl = "client.check_acl" in self._chains
        self.on_publish = self._compiled.get("message.publish")
        self.on_delivered = self._compiled.get("message.delivered")

    def callbacks(self, point: str) -> list[Callback]:
        self._check(point)
        return list(self._chains.get(point, ()))

    def has(self, point: str) -> bool:
        return point in self._chains

    def notifier(self, point: str) -> Callable[[Any, Any], None] | None:
        """`run` of a notification point whose callbacks take two arguments
        (message.delivered: client id, message), as one callable; None when
        nothing is registered. Taken again after `add` / `remove`."""
        return self._compiled.get(point) if point not in FOLDS else None

    def folder(self, point: str) -> Callable[[Any, Any], Any] | None:
        """`fold` of a fold point whose callbacks take one argument before the
        value (message.publish: client, message), as one callable
        `(argument, value) -> value`; None when nothing is registered."""
        return self._compiled.get(point) if point in FOLDS else None

    def _compile(self, point: str, chain: tuple[Callback, ...]) -> Callable[[Any, Any], Any]:
        """`point`'s chain as one closure `(a, value) -> value`: a fold's callbacks
        get (argument, value so far), a notification's its two arguments. The
        closure is `_chain_maker(len(chain))`'s, its callbacks unrolled."""
        notifies = point not in FOLDS

        def answer(callback: Callback, result: Any, value: Any) -> tuple[bool, Any]:
            return self._answer(point, callback, result, value, notifies)

        def failed(callback: Callback) -> None:
            self._failed(point, callback)

        def timed(began: float) -> None:
            self._timed(point, chain, began)

        make = _chain_maker(len(chain))
        walk: Callable[[Any, Any], Any] = make(
            *chain, CONTINUE, answer, failed, timed, busy, SAMPLE
        )
        return walk

    def run(self, point: str, *args: Any) -> None:
        """Notify every callback of `point` (until one stops the chain)."""
        chain = self._chains.get(point)
        if chain is not None:
            self._walk(point, chain, args, None, True)

    def fold(self, point: str, value: Any, *args: Any) -> Any:
        """Pass `value` through the chain of `point`; the chain's final value."""
        chain = self._chains.get(point)
        if chain is None:
            return value
        return self._walk(point, chain, args, value, False)

    def _walk(self, point: str, chain: tuple[Callback, ...], args: tuple[Any, ...], value: Any,
              notifies: bool) -> Any:  # fmt: skip
        """`run` and `fold` for any arguments, every call timed (the per-message
        points go through `_compile`'s closure instead)."""
        began = busy()
        for callback in chain:
            stop, value = self._step(point, callback, args, value, notifies)
            if stop:
                break
        self._timed(point, chain, began)
        return value

    def _step(self, point: str, callback: Callback, args: tuple[Any, ...], value: Any,
              notifies: bool) -> tuple[bool, Any]:  # fmt: skip
        """One callback of `_walk`: (stop the chain?, the value now)."""
        try:
            result = callback(*args) if notifies else callback(*args, value)
        except Exception:
            self._failed(point, callback)
            return False, value
        if result is None or result is CONTINUE:
            return False, value
        return self._answer(point, callback, result, value, notifies)

    def _answer(
        self, point: str, callback: Callback, result: Any, value: Any, notifies: bool
    ) -> tuple[bool, Any]:
        """A callback's answer other than None / CONTINUE: (stop the chain?, the
        value now). A notification's value never changes, and an awaitable it
        answers runs as a task of its own; a fold refuses an awaitable."""
        kind = type(result)
        if kind is Stop:
            return True, value if notifies or result is STOP else result.value
        if kind is Continue:
            return False, value if notifies else result.value
        if inspect.isawaitable(result):
            if notifies:
                self._start(point, callback, result)
            else:
                self._refuse(point, callback, result)
        return False, value

    def _timed(self, point: str, chain: tuple[Callback, ...], began: float) -> None:
        took = busy() - began
        if took > SLOW_S:
            self._slow(point, chain, took)

    def _failed(self, point: str, callback: Callback) -> None:
        self.failed += 1
        log.exception("hook %s: %r failed; skipped", point, callback)

    def _slow(self, point: str, chain: tuple[Callback, ...], took: float) -> None:
        self.slow += 1
        log.warning("hook %s: %s took %.3f s (over %.3f s)",
                    point, ", ".join(map(repr, chain)), took, SLOW_S)  # fmt: skip

    def _refuse(self, point: str, callback: Callback, result: Any) -> None:
        if inspect.iscoroutine(result):
            result.close()  # never awaited: no "was never awaited" warning
        self.failed += 1
        log.error("hook %s: %r answered with an awaitable; a fold point needs its answer "
                  "now; skipped", point, callback)  # fmt: skip

    def _start(self, point: str, callback: Callback, result: Any) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or len(self._pending) >= MAX_PENDING:
            if inspect.iscoroutine(result):
                result.close()
            self.dropped += 1
            log.warning("hook %s: %r not run: %s", point, callback,
                        "no event loop" if loop is None else f"{MAX_PENDING} in flight")
            return
        task = loop.create_task(self._bounded(point, callback, result))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _bounded(self, point: str, callback: Callback, result: Any) -> None:
        try:
            await asyncio.wait_for(_awaited(result), self.timeout_s)
        except TimeoutError:
            self.timed_out += 1
            log.warning("hook %s: %r timed out after %.1f s; cancelled",
                        point, callback, self.timeout_s)  # fmt: skip
        except Exception:
            self.failed += 1
            log.exception("hook %s: %r failed; skipped", point, callback)


async def _awaited(result: Any) -> Any:
    return await result


@functools.cache
def _chain_maker(n: int) -> Callable[..., Callable[[Any, Any], Any]]:
    """A maker of an n-callback chain's closure, its callbacks written out one
    after another: a loop over the tuple cost about as much again as five
    no-op callbacks themselves (measured: 450 ns a chain of five looped, 235
    ns unrolled), on a path taken per message and per copy. Each step is
    `_step`'s rule: a callback that raises is logged and skipped; an answer
    other than None / CONTINUE goes to `answer`, which may stop the chain.
    One call in SAMPLE (the first one included) runs timed: it counts the
    calls down, and at zero times a call of itself."""
    steps = "".join(
        f"""
        try:
            r = c{i}(a, value)
        except Exception:
            failed(c{i})
        else:
            if r is not None and r is not CONTINUE:
                stop, value = answer(c{i}, r, value)
                if stop:
                    return value"""
        for i in range(n)
    )
    callbacks = "".join(f"c{i}, " for i in range(n))
    source = f"""
def make({callbacks}CONTINUE, answer, failed, timed, clock, SAMPLE):
    calls = 1
    def walk(a, value):
        nonlocal calls
        calls -= 1
        if not calls:
            calls = SAMPLE
            began = clock()
            value = walk(a, value)
            timed(began)
            return value{steps}
        return value
    return walk
"""
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<hook chain of {n}>", "exec"), namespace)
    maker: Callable[..., Callable[[Any, Any], Any]] = namespace["make"]
    return maker
