"""Reading the settings: defaults, the config file, WEIR_* variables, flags.

Precedence, highest first: command-line values (handed in by the CLI as a
mapping of dotted paths; None = not given), WEIR_* environment variables,
the TOML config file (`--config` or WEIR_CONFIG), then the declared
defaults. Every source is flattened to dotted paths (`listeners.mqtt_port`)
and remembered per path, so `weir config show` can say where each value
came from and an error can name it: a bad value anywhere is one
SettingsError line naming the option and its source, which the CLI prints
before exiting 2.

`dump()` turns settings back into the file's shape (TOML/JSON plain
values); the supervisor hands its nodes their settings that way (a JSON
file read back by `load`), and `weir config show` prints it.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from services.config.declare import Option, SettingsError, options
from services.config.settings import Settings

OPTIONS: tuple[Option, ...] = tuple(options(Settings))
_BY_PATH = {option.path: option for option in OPTIONS}
ENV_VARS: frozenset[str] = frozenset(o.env for o in OPTIONS if o.env) | {"WEIR_CONFIG"}
DEFAULT = "default"
_ADAPTER: TypeAdapter[Settings] = TypeAdapter(Settings)


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in table.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def read_file(path: str) -> dict[str, Any]:
    """A config file's options by dotted path: TOML, or the JSON `dump` writes."""
    try:
        data = Path(path).read_bytes()
        table = json.loads(data) if path.endswith(".json") else tomllib.loads(data.decode())
    except OSError as exc:
        raise SettingsError(f"config file {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise SettingsError(f"config file {path}: {exc}") from None
    if "listener" in table:  # [[listener]] tables: a list, not a section
        table = {**table, "listeners": {**table.get("listeners", {}), "tables": table["listener"]}}
        del table["listener"]
    flat = _flatten(table)
    for key in flat:
        if key not in _BY_PATH:
            raise SettingsError(f"config file {path}: unknown option {key!r}")
    return flat


@dataclasses.dataclass(frozen=True, slots=True)
class Loaded:
    settings: Settings
    sources: dict[str, str]  # dotted path -> "config file X", "WEIR_...", "--flag"; absent: default


def load(cli: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Settings from CLI values (dotted paths; None = not given), env, file, defaults."""
    return load_sources(cli, env).settings


def load_sources(
    cli: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> Loaded:
    cli = {k: v for k, v in (cli or {}).items() if v is not None}
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    config_path = cli.pop("config", None) or env.get("WEIR_CONFIG") or None
    if config_path:
        for key, raw in read_file(str(config_path)).items():
            values[key], sources[key] = raw, f"config file {config_path}"
    for option in OPTIONS:
        if option.env is not None and option.env in env:
            values[option.path], sources[option.path] = env[option.env], option.env
    for key, raw in cli.items():
        known = _BY_PATH.get(key)
        if known is None:
            raise SettingsError(f"unknown option {key!r}")
        values[key], sources[key] = raw, known.flag or f"--{known.name.replace('_', '-')}"
    return Loaded(build(values, sources), sources)


def build(values: Mapping[str, Any], sources: Mapping[str, str] | None = None) -> Settings:
    """Settings from dotted-path values; a bad one: SettingsError naming it and its source."""
    tree: dict[str, Any] = {}
    for path, value in values.items():
        *sections, name = path.split(".")
        node = tree
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = value
    try:
        return _ADAPTER.validate_python(tree)
    except ValidationError as exc:
        raise SettingsError(_one_line(exc, values, sources or {})) from None


def _one_line(exc: ValidationError, values: Mapping[str, Any], sources: Mapping[str, str]) -> str:
    error = exc.errors(include_url=False)[0]
    loc = [str(part) for part in error["loc"]]
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "enum":
        message = f"must be one of {error.get('ctx', {}).get('expected', '')}"
    # The longest declared option the location is in: listeners.tables for
    # ("listeners", "tables", "0", "port"); a rule across fields has a section.
    path = next((".".join(loc[:n]) for n in range(len(loc), 0, -1)
                 if ".".join(loc[:n]) in _BY_PATH), ".".join(loc))  # fmt: skip
    source = sources.get(path)
    inner = loc[len(path.split(".")):] if path in _BY_PATH else []
    if path in _TABLES:
        kind = _TABLES[path]
        if not inner and error["type"] == "value_error":  # listeners._required
            return f"{source}: {message}" if source else message
        if not inner:
            return f"{source or 'default'}: expected {kind} tables"
        if error["type"] in ("unexpected_keyword_argument", "missing_argument"):
            key = inner[1] if len(inner) > 1 else "?"
            what = "unknown key" if error["type"].startswith("unexpected") else "needs a"
            message = f"{what} {key!r}" if what == "unknown key" else f"{what} {key}"
            inner = inner[:1]
        return _in_table(kind.strip("[]") if kind == "[[listener]]" else kind,
                         values.get(path), inner, message, source)  # fmt: skip
    if path not in _BY_PATH:  # a rule across fields: its message names them, and
        origins = set(sources.values())  # where they came from, when that is one place
        return f"{origins.pop()}: {message}" if len(origins) == 1 else message
    raw = values.get(path)
    secret = "secret" in path or isinstance(raw, list | dict)
    shown = "" if secret or path not in values else f" {raw!r}"
    return f"{source or 'default'}: bad value{shown} for {path}: {message}"


_TABLES = {"listeners.tables": "[[listener]]", "auth": "[[auth]]",
           "bridge.kafka_out": "bridge", "bridge.kafka_in": "bridge",
           "rule": "rule"}  # fmt: skip


def _in_table(kind: str, raw: Any, inner: list[str], message: str, source: str | None) -> str:
    """listener 'devices': port: ... / [[auth]] 2 (jwt): ... (values not echoed)."""
    index = int(inner[0]) if inner[0].isdigit() else 0
    table = raw[index] if isinstance(raw, list) and index < len(raw) else {}
    name = table.get("name") if isinstance(table, dict) else None
    named = kind in ("listener", "bridge", "rule") and name
    where = f"{kind} {name!r}" if named else f"{kind} {index + 1}"
    key = f" {inner[1]}:" if len(inner) > 1 else ""
    if kind == "[[auth]]" and isinstance(table, dict) and "backend" in table and key:
        where += f" ({table['backend']})"
    line = f"{where}:{key} {message}"
    return f"{source}: {line}" if source else line


def plain(value: Any) -> Any:
    """A settings value as TOML/JSON has it: enums as strings, tables as dicts."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, ipaddress.IPv4Network | ipaddress.IPv6Network):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        defaults = {f.name: f.default for f in dataclasses.fields(value)}
        kept = ("name", "type", "port", "backend")  # a table's required keys, always written
        return {k: plain(v) for k, v in ((f, getattr(value, f)) for f in defaults)
                if (v is not None and v != defaults[k]) or k in kept}  # fmt: skip
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    return value


def dump(settings: Settings) -> dict[str, Any]:
    """Every option's effective value by dotted path (None: unset)."""
    out: dict[str, Any] = {}
    for option in OPTIONS:
        value: Any = settings
        for part in option.path.split("."):
            value = getattr(value, part)
        out[option.path] = plain(value)
    return out


def write_snapshot(settings: Settings, path: Path) -> None:
    """The settings as a JSON file `load` reads back ({"config": path}); 0600,
    it may hold a JWT secret. The shortcuts come back as they are already in
    the auth chain (`chain` does not add a backend twice)."""
    flat = dump(settings)  # None too (JSON null): ws_port None is "no listener", not the default
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        section, _, name = key.rpartition(".")
        (tree.setdefault(section, {}) if section else tree)[name] = value
    if "tables" in tree.get("listeners", {}):
        tree["listener"] = tree["listeners"].pop("tables")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(json.dumps(tree, indent=1))
