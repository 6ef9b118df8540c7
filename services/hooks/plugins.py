"""Plugins: Python packages that register hook callbacks, found through an
entry-point group and loaded, listed and unloaded at run time.

A plugin's entry point (group `weir.plugins`) names an object with
`register(hooks)` and, optionally, `unregister(hooks)`; without the latter,
unloading removes every callback the plugin added. A plugin that fails to
load is reported with one line and skipped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from services.hooks.api import HOOK_POINTS, Callback, Hooks

log = logging.getLogger("weir.plugins")

ENTRY_POINT_GROUP = "weir.plugins"


@dataclass
class _Loaded:
    plugin: Any
    added: list[tuple[str, Callback]] = field(default_factory=list)


class Plugins:
    def __init__(self, hooks: Hooks) -> None:
        self.hooks = hooks
        self._loaded: dict[str, _Loaded] = {}

    def names(self) -> list[str]:
        return sorted(self._loaded)

    def load(self, name: str, plugin: Any) -> None:
        """Register `plugin` (an object with `register(hooks)`) under `name`."""
        if name in self._loaded:
            raise ValueError(f"plugin {name!r} is loaded already")
        before = {p: list(self.hooks.callbacks(p)) for p in HOOK_POINTS}
        plugin.register(self.hooks)
        added = [
            (p, cb) for p in HOOK_POINTS for cb in self.hooks.callbacks(p) if cb not in before[p]
        ]
        self._loaded[name] = _Loaded(plugin, added)

    def unload(self, name: str) -> None:
        loaded = self._loaded.pop(name, None)
        if loaded is None:
            raise ValueError(f"no plugin {name!r} is loaded")
        unregister = getattr(loaded.plugin, "unregister", None)
        if unregister is not None:
            unregister(self.hooks)
        for point, callback in loaded.added:
            self.hooks.remove(point, callback)

    def discover(self, group: str = ENTRY_POINT_GROUP) -> list[str]:
        """Load every plugin installed under the entry-point group; their names."""
        found = []
        for ep in entry_points(group=group):
            try:
                self.load(ep.name, ep.load())
            except Exception as exc:
                log.warning("plugin %s not loaded: %s: %s", ep.name, type(exc).__name__, exc)
                continue
            found.append(ep.name)
        return found
