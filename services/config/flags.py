"""Command-line flags derived from the declarations (`services.config.declare`).

`settings_flags` adds one click option per declared option that has a
flag; the value goes to the loader as text under its dotted path, so a
bad one is checked, and reported, exactly as one from the file or the
environment. `given(params)` gives back the {dotted path: value} of the
flags that were given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import click

from services.config.declare import Option
from services.config.loader import OPTIONS

F = TypeVar("F", bound=Callable[..., Any])
_SEP = "__"  # listeners.mqtt_port <-> the parameter listeners__mqtt_port


def _help(option: Option) -> str:
    text = option.help
    if option.unit:
        text += f" [{option.unit}]"
    if option.default not in (None, (), False) and option.const is None:
        default = getattr(option.default, "value", option.default)
        text += f" (default {default})"
    if option.env:
        text += f" [env {option.env}]"
    return text


def some(*paths: str) -> tuple[Option, ...]:
    """The options of these dotted paths, for a command that reads only a few."""
    by_path = {o.path: o for o in OPTIONS}
    return tuple(by_path[path] for path in paths)


def settings_flags(
    options: Iterable[Option] = OPTIONS, aliases: Mapping[str, str] | None = None
) -> Callable[[F], F]:
    """Decorator: the flags of `options` (default: every option with a flag),
    with `aliases` (path -> another flag name) kept from older command lines."""

    def decorate(function: F) -> F:
        for option in reversed([o for o in options if o.flag]):
            name = option.path.replace(".", _SEP)
            assert option.flag is not None
            also = (aliases or {}).get(option.path)
            if also is not None:
                decorator = click.option(option.flag, also, name, help=_help(option))
            elif option.path == "listeners.ports":  # NAME=PORT, repeated; the supervisor's
                decorator = click.option(option.flag, name, multiple=True, hidden=True)
            elif option.const is not None:
                decorator = click.option(option.flag, name, flag_value=option.const,
                                         default=None, help=_help(option))  # fmt: skip
            else:
                decorator = click.option(option.flag, name, metavar=_metavar(option),
                                         help=_help(option))  # fmt: skip
            function = decorator(function)
        return function

    return decorate


def _metavar(option: Option) -> str:
    choices = getattr(option.annotation, "__members__", None)
    if choices:
        return "|".join(str(m.value) for m in choices.values())
    return option.unit.upper() if option.unit in ("s",) else "VALUE"


def given(params: Mapping[str, Any]) -> dict[str, Any]:
    """The settings flags that were given, by dotted path."""
    return {name.replace(_SEP, "."): value for name, value in params.items()
            if (_SEP in name or name in _TOP) and value not in (None, ())}  # fmt: skip


_TOP = frozenset(o.path for o in OPTIONS if "." not in o.path)
