"""A plugin for subprocess tests: appends each firing of its `points` to the
file `path` as a JSON line {"point", "args"} (args as strings)."""

from __future__ import annotations

import json
from typing import Any

from services.hooks.api import Hooks


class Recorder:
    def __init__(self, config: dict[str, Any]) -> None:
        self.path = str(config["path"])
        self.points = list(config["points"])

    def register(self, hooks: Hooks) -> None:
        for point in self.points:
            hooks.add(point, lambda *args, point=point: self._write(point, args))

    def _write(self, point: str, args: tuple[Any, ...]) -> None:
        line = {"point": point, "args": [str(a) for a in args]}
        with open(self.path, "a", encoding="utf-8") as out:  # one short write: O_APPEND
            out.write(json.dumps(line) + "\n")
