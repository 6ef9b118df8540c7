"""Log lines: structured, about a client, and not repeated without end.

Theory of operation. `setup(level)` gives the root logger one handler on
stdout: JSON lines (one object per line: ts, level, logger, msg and any
client fields) when stdout is not a terminal, so a collector can parse
them, and readable `time level logger: msg [client=... user=...]` lines
when it is. `set_level` changes the level at run time (SIGHUP).

A line about a client carries its fields through logging's `extra`:
`client_fields(client_id, user, peer, node)` builds them, and
`ClientLog` (a LoggerAdapter) adds them to every line it makes. The
names are fixed (`CLIENT_FIELDS`) so the formatters know what to print.

`RateLimit` is a filter: the same message template from the same place is
let through once per `window_s`; what it held back is counted and the
next line let through says how many were suppressed. A flood of one
failure (a plugin raising per message, a client retrying a refused
CONNECT) costs one line per window, not one per event. A line logged with
`extra={"unlimited": True}` (the API's audit trail) is never held back.
A line on a path every client takes (connected, disconnected) asks its
`Gate` first: the same rule, decided before the record is made, since
making it (the caller's frame, the fields) costs 14-30 us, and 19,000
clients leaving at once paid that in one turn of the loop.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import MutableMapping
from typing import Any, Final, TextIO

CLIENT_FIELDS: Final = ("client_id", "user", "peer", "node")
# An audit line of the management API (services.api.routes): who wrote what, and how it ended.
AUDIT_FIELDS: Final = ("api_key", "method", "path", "status", "remote")
RATE_WINDOW_S: Final = 10.0  # one line per template per 10 s: enough to see it, not a flood
_RATE_KEYS_MAX: Final = 10_000  # templates remembered; past it the table starts again

_node_id = ""  # this process's node, added to client lines that do not name one


def client_fields(client_id: str | None, user: str | None = None, peer: str | None = None,
                  node: str | None = None) -> dict[str, Any]:  # fmt: skip
    """`extra` for a line about a client."""
    return {"client_id": client_id, "user": user, "peer": peer, "node": node or _node_id}


class ClientLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A logger whose lines all carry one client's fields."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {
        k: getattr(record, k)
        for k in (*CLIENT_FIELDS, *AUDIT_FIELDS)
        if getattr(record, k, None) is not None
    }


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class Readable(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = _fields(record)
        if not fields:
            return text
        return text + " [" + " ".join(f"{k}={v}" for k, v in fields.items()) + "]"


class Gate:
    """One hot line's `RateLimit`, asked before the line is made: `due()` once
    per `window_s` (and counts the others), `held()` the note of how many
    were held back since, for the line's end."""

    __slots__ = ("_held", "_until", "window_s")

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._until = 0.0
        self._held = 0

    def due(self) -> bool:
        now = time.monotonic()
        if now < self._until:
            self._held += 1
            return False
        self._until = now + self.window_s
        return True

    def held(self) -> str:
        held, self._held = self._held, 0
        return f" ({held} like it suppressed)" if held else ""


class RateLimit(logging.Filter):
    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        super().__init__()
        self.window_s = window_s
        self._last: dict[tuple[str, int, object], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "unlimited", False):  # an audit line: every one of them counts
            return True
        key = (record.pathname, record.lineno, record.msg)
        now = time.monotonic()
        seen = self._last.get(key)
        if seen is not None and now - seen[0] < self.window_s:
            self._last[key] = (seen[0], seen[1] + 1)
            return False
        if len(self._last) >= _RATE_KEYS_MAX:
            self._last.clear()
        self._last[key] = (now, 0)
        if seen is not None and seen[1]:
            record.msg = f"{record.msg} ({seen[1]} like it suppressed)"
        return True


def setup(level: str, node_id: str = "", stream: TextIO | None = None,
          json_lines: bool | None = None) -> logging.Handler:  # fmt: skip
    """One handler on the root logger (replacing any `setup` added before)."""
    global _node_id
    _node_id = node_id
    out = stream if stream is not None else sys.stdout
    if json_lines is None:
        json_lines = not out.isatty()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonLines() if json_lines else Readable())
    handler.addFilter(RateLimit())
    handler.set_name("weir")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "weir"]:
        root.removeHandler(old)
    root.addHandler(handler)
    set_level(level)
    return handler


def set_level(level: str) -> None:
    logging.getLogger().setLevel(level.upper())

