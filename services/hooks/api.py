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
since two clock reads per callback would cost more than a no-op callback.
Failures are logged rate-limited (`services.logs.RateLimit` on the
handler) and counted in `stats()`.

Cost. `message.publish` and `message.delivered` run once per message, so a
chain is a tuple of plain callables walked in one loop: a callback that
answers None or `CONTINUE` (the common case) costs its call and one
identity test; only other answers are looked at further.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Final

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
        self._added = 0
        self.timeout_s = timeout_s
        self._pending: set[asyncio.Task[Any]] = set()
        self.failed = 0  # callbacks that raised (or answered a fold with an awaitable)
        self.timed_out = 0  # async callbacks past timeout_s, cancelled
        self.slow = 0  # sync callbacks past SLOW_S
        self.dropped = 0  # async callbacks not started: MAX_PENDING in flight
        self.watches_copies = False  # message.delivered or .dropped has a callback: the
        #   fan-out's one check per message (an attribute, kept by add and remove)

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
        entries = [*self._entries.get(point, ()), _Entry(priority, self._added, callback)]
        entries.sort(key=lambda e: (-e.priority, e.order))
        self._entries[point] = entries
        self._chains[point] = tuple(e.callback for e in entries)
        self._watched()

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
        self._watched()
        return len(kept) != len(entries)

    def _watched(self) -> None:
        self.watches_copies = "message.delivered" in self._chains or (
            "message.dropped" in self._chains)

    def callbacks(self, point: str) -> list[Callback]:
        self._check(point)
        return list(self._chains.get(point, ()))

    def has(self, point: str) -> bool:
        return point in self._chains

    def run(self, point: str, *args: Any) -> None:
        """Notify every callback of `point` (until one stops the chain)."""
        chain = self._chains.get(point)
        if chain is None:
            return
        began = perf_counter()
        two = len(args) == 2  # the per-message points: a plain call, which the
        a, b = args if two else (None, None)  # interpreter specialises (no *args)
        for callback in chain:
            try:
                result = callback(a, b) if two else callback(*args)
            except Exception:
                self._failed(point, callback)
                continue
            if result is None or result is CONTINUE:
                continue
            if type(result) is Stop:
                break
            if type(result) is not Continue and inspect.isawaitable(result):
                self._start(point, callback, result)
        if perf_counter() - began > SLOW_S:
            self._slow(point, chain, perf_counter() - began)

    def fold(self, point: str, value: Any, *args: Any) -> Any:
        """Pass `value` through the chain of `point`; the chain's final value."""
        chain = self._chains.get(point)
        if chain is None:
            return value
        began = perf_counter()
        one = len(args) == 1  # message.publish: (client, message), a plain call
        a = args[0] if one else None
        for callback in chain:
            try:
                result = callback(a, value) if one else callback(*args, value)
            except Exception:
                self._failed(point, callback)
                continue
            if result is None or result is CONTINUE:
                continue
            kind = type(result)
            if kind is Continue:
                value = result.value
            elif kind is Stop:
                if result is not STOP:
                    value = result.value
                break
            elif inspect.isawaitable(result):
                self._refuse(point, callback, result)
        if perf_counter() - began > SLOW_S:
            self._slow(point, chain, perf_counter() - began)
        return value

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
