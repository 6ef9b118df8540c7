"""A clock that stands still while Python collects garbage (`busy`).

A full collection runs wherever an allocation crosses the collector's
threshold, and with millions of objects it takes a few hundred milliseconds
(0.3-0.5 s each when 19,000 clients leave a node at once). Timed with
`time.perf_counter`, whatever code it fell into looks that slow: a no-op
hook callback was once logged as taking 0.298 s. `busy()` is
`perf_counter()` less the time every collection took since `watch_gc()`
first ran (a `gc.callbacks` entry: a Python call at each collection's start
and end, so it is installed only where a slow check needs it), and a time
measured with it is the code's own.
"""

from __future__ import annotations

import gc
from time import perf_counter
from typing import Any


class _Collections:
    """The `gc.callbacks` entry: the time collections took, in total."""

    __slots__ = ("began", "total")

    def __init__(self) -> None:
        self.began = 0.0
        self.total = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.began = perf_counter()
        else:
            self.total += perf_counter() - self.began


_COLLECTIONS = _Collections()


def watch_gc() -> None:
    """Count collections' time from now on (once per process)."""
    if _COLLECTIONS not in gc.callbacks:
        gc.callbacks.append(_COLLECTIONS)


def busy() -> float:
    """Seconds, as `perf_counter`, less the collections' time so far."""
    return perf_counter() - _COLLECTIONS.total
