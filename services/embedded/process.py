"""Child processes that die with the process that started them (Linux).

PR_SET_PDEATHSIG makes the kernel signal a child when its parent dies, even
by SIGKILL, so no embedded redis-server, Kafka or Spark job outlives a
killed `weir up`. The signal fires when the *thread* that started the child
exits, so only children started on the main thread are tied this way
(`child_options`); a child started elsewhere (a test's node thread) is
stopped by its owner as before.
"""

from __future__ import annotations

import ctypes
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

PR_SET_PDEATHSIG = 1


def _die_with_parent(sig: int) -> Callable[[], None]:
    def tie() -> None:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)

    return tie


def child_options(sig: int = signal.SIGKILL) -> dict[str, Any]:
    """Popen keyword arguments that tie the child's life to this process
    (`sig` it gets when this process dies), where the platform allows."""
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return {}
    return {"preexec_fn": _die_with_parent(sig)}
