"""A machine-independent cost: the lines of Python a call runs.

Wall-clock ratios in unit tests fail on a loaded machine and pass on a fast
one whatever the code does; the number of lines a call executes is the same
on every run, so "cost does not grow with X" becomes an exact comparison.
(The timings themselves: bench/matchcost.py.)"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any


def lines_run(call: Callable[[], object]) -> int:
    """How many lines of Python `call()` runs, its callees' included (C code: none)."""
    count = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return tracer

    # A collection during the call would run other objects' finalizers, and
    # count their lines: collect first, none during.
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(previous)
        if was_enabled:
            gc.enable()
    return count
