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
one dictionary look-up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
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
    def __init__(self) -> None:
        self._chains: dict[str, list[_Entry]] = {}
        self._added = 0

    @staticmethod
    def _check(point: str) -> None:
        if point not in HOOK_POINTS:
            raise ValueError(f"unknown hook point {point!r}")

    def add(self, point: str, callback: Callback, priority: int = 0) -> None:
        self._check(point)
        self._added += 1
        chain = [*self._chains.get(point, ()), _Entry(priority, self._added, callback)]
        chain.sort(key=lambda e: (-e.priority, e.order))
        self._chains[point] = chain

    def remove(self, point: str, callback: Callback) -> bool:
        """Unregister; False if `callback` was not on `point`."""
        self._check(point)
        chain = self._chains.get(point, [])
        kept = [e for e in chain if e.callback is not callback]
        if kept:
            self._chains[point] = kept
        else:
            self._chains.pop(point, None)
        return len(kept) != len(chain)

    def callbacks(self, point: str) -> list[Callback]:
        self._check(point)
        return [e.callback for e in self._chains.get(point, ())]

    def has(self, point: str) -> bool:
        return point in self._chains

    def run(self, point: str, *args: Any) -> None:
        """Notify every callback of `point` (until one stops the chain)."""
        chain = self._chains.get(point)
        if chain is None:
            return
        for entry in chain:
            if isinstance(self._call(point, entry, args), Stop):
                return

    def fold(self, point: str, value: Any, *args: Any) -> Any:
        """Pass `value` through the chain of `point`; the chain's final value."""
        chain = self._chains.get(point)
        if chain is None:
            return value
        for entry in chain:
            result = self._call(point, entry, (*args, value))
            if isinstance(result, Stop):
                return value if result is STOP else result.value
            if isinstance(result, Continue) and result is not CONTINUE:
                value = result.value
        return value

    @staticmethod
    def _call(point: str, entry: _Entry, args: tuple[Any, ...]) -> Any:
        try:
            return entry.callback(*args)
        except Exception:
            log.exception("hook %s: %r failed; skipped", point, entry.callback)
            return CONTINUE
