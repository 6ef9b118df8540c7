"""Plugin and log settings: the `[[plugin]]` tables and the log level.

Theory of operation. `weir up` loads each `[[plugin]]` table's plugin, in
file order, before the node accepts a client (`services.hooks.plugins`):

    [[plugin]]
    name = "topic_rewrite"          # an entry point of group weir.plugins,
    [plugin.config]                 #   or "package.module:attr"
    rules = [{ filter = "old/#", from = "^old/(.*)$", to = "new/$1" }]

`config` is the plugin's own section, handed to it as a plain mapping and
checked by the plugin (Weir cannot know its keys). A missing plugin, or
one whose factory or `register` raises, stops `weir up` with one line.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any

from pydantic import BeforeValidator, Field
from pydantic.dataclasses import dataclass

from services.config.declare import FROZEN, Text


class LogLevel(enum.StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True, slots=True, config=FROZEN)
class PluginConfig:
    """One `[[plugin]]` table."""

    name: Text
    config: dict[str, Any] = Field(default_factory=dict)


def distinct(raw: Any) -> Any:
    """No plugin loaded twice (a second load of one name is an error at run time)."""
    if isinstance(raw, list):
        names = [t.get("name") for t in raw if isinstance(t, dict)]
        doubled = sorted({str(n) for n in names if names.count(n) > 1})
        if doubled:
            raise ValueError(f"plugin {doubled[0]!r} is named by two [[plugin]] tables")
    return raw


PluginTables = Annotated[tuple[PluginConfig, ...], BeforeValidator(distinct)]
