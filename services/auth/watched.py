"""A file whose changes a backend picks up: its modification time, looked at seldom."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Final

CHECK_S: Final = 1.0  # the file's mtime is looked at no more often than this


class Watched:
    def __init__(self, path: Path, check_s: float = CHECK_S) -> None:
        self.path = path
        self.check_s = check_s
        self._mtime = self._stat()
        self._checked = time.monotonic()

    def _stat(self) -> float | None:
        try:
            return self.path.stat().st_mtime
        except OSError:
            return None

    def changed(self, at_once: bool = False) -> bool:
        """Whether the modification time changed since the last True (at most
        one stat per `check_s`, unless `at_once`)."""
        now = time.monotonic()
        if not at_once and now - self._checked < self.check_s:
            return False
        self._checked = now
        mtime = self._stat()
        if mtime == self._mtime:
            return False
        self._mtime = mtime
        return True
