"""Plugins: Python packages that register hook callbacks, found through an
entry-point group and loaded, listed and unloaded at run time.

A plugin's entry point (group `weir.plugins`) names an object with
`register(hooks)` and, optionally, `unregister(hooks)`; without the latter,
unloading removes every callback the plugin added. A plugin that fails to
load is reported with one line and skipped by `discover`.

`weir up` loads the plugins its config file names instead (`load_named`,
the `[[plugin]]` tables of `services.config.plugins`), in order: a name is
an entry point of the group or `package.module:attr`. The object it names
is either a plugin (it has `register`) or a factory (a class or function)
called with the table's `config` mapping that returns one. There a plugin
that is missing or raises is a `PluginError`, one line, and the node does
not start: a broker running without the plugin its operator asked for
(an authorizer, a rewrite) is worse than one that does not run.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any

from services.hooks.api import HOOK_POINTS, Callback, Hooks

log = logging.getLogger("weir.plugins")

ENTRY_POINT_GROUP = "weir.plugins"


class PluginError(Exception):
    """A configured plugin is missing or failed to load (one line)."""


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

    def load_named(self, tables: Iterable[tuple[str, Mapping[str, Any]]]) -> list[str]:
        """Load each (name, config) in order; PluginError on the first that fails."""
        for name, config in tables:
            target = resolve(name)
            try:
                plugin = target if _is_plugin(target) else target(dict(config))
                self.load(name, plugin)
            except Exception as exc:
                raise PluginError(f"plugin {name}: {type(exc).__name__}: {exc}") from None
        return self.names()


def _is_plugin(target: Any) -> bool:
    return hasattr(target, "register") and not isinstance(target, type)


def resolve(name: str, group: str = ENTRY_POINT_GROUP) -> Any:
    """The object `name` (an entry point of `group`, or "module:attr") names."""
    try:
        if ":" in name:
            module, _, attr = name.partition(":")
            target: Any = import_module(module)
            for part in attr.split("."):
                target = getattr(target, part)
            return target
        found = [ep for ep in entry_points(group=group) if ep.name == name]
        if not found:
            raise PluginError(f"plugin {name}: no entry point {name!r} in group {group} "
                              "(is its package installed?) and not a module:attr")  # fmt: skip
        return found[0].load()
    except PluginError:
        raise
    except Exception as exc:  # ImportError, AttributeError, or the module raised
        raise PluginError(f"plugin {name}: cannot import: {type(exc).__name__}: {exc}") from None
