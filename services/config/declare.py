"""How an option is declared, once: `opt()` and the value types it uses.

Theory of operation. The settings tree (`services.config.settings`) is a
set of frozen pydantic dataclasses. Each field is one option: its type
(with its bounds) is the validation, and `opt()` adds what the edges need:
the help text, the unit, the WEIR_* environment variable if it has one and
the command-line flag (derived from the field name unless given). The TOML
key is the field's dotted path in the tree (`listeners.mqtt_port`), so it
needs no declaration. `options()` walks the tree into one `Option` per
field; the loader (`services.config.loader`), the `weir up` flags
(`services.config.flags`) and `weir config example` all read that walk,
so adding an option is adding one field.

Pydantic dataclasses, not BaseModel/BaseSettings: they are stdlib
dataclasses, so `dataclasses.replace(settings, ...)` (the supervisor's
per-node overrides, many tests) keeps working and validates.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any

import click
from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field

from services.config.redisurl import cluster_nodes, is_cluster_url

MAX_PORT = 65_535
FROZEN = ConfigDict(extra="forbid")  # an unknown key is an error, never ignored


class SettingsError(click.UsageError):
    """A configuration value is missing, malformed or out of range: to the
    command line a usage error (one line, exit 2; `services.cli.run`), so
    the CLI needs no import of the settings to report one."""


def opt(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    env: str | None = None,
    flag: str | bool | None = None,
    const: Any = None,
    unit: str = "",
    factory: Any = None,
) -> Any:
    """One option's declaration. `flag`: None derives `--field-name`, a string
    names it, False gives none (file and env only); `const`: the flag takes no
    value and sets this one (bool options: True)."""
    extra = {"env": env, "flag": flag, "const": const, "unit": unit}
    if factory is not None:
        return Field(default_factory=factory, description=help, json_schema_extra=extra)
    return Field(default, description=help, json_schema_extra=extra)


@dataclass(frozen=True, slots=True)
class Option:
    path: str  # dotted, as in the TOML file: "listeners.mqtt_port"
    help: str
    default: Any
    env: str | None
    flag: str | None  # "--mqtt-port"; None: file and env only
    const: Any  # the flag takes no value: it sets this
    unit: str
    annotation: Any

    @property
    def name(self) -> str:
        return self.path.rpartition(".")[2]

    @property
    def is_bool(self) -> bool:
        return self.annotation is bool


def options(tree: type[Any], prefix: str = "") -> Iterator[Option]:
    """Every option of a settings dataclass, sections (nested dataclasses) walked."""
    hints = typing.get_type_hints(tree, include_extras=False)
    for name, info in tree.__pydantic_fields__.items():
        annotation = hints[name]
        if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
            yield from options(annotation, f"{prefix}{name}.")
            continue
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        flag = extra.get("flag")
        if flag is None:
            flag = "--" + name.replace("_", "-")
        default = info.get_default(call_default_factory=True)
        yield Option(
            path=prefix + name,
            help=info.description or "",
            default=default,
            env=str(extra["env"]) if extra.get("env") else None,
            flag=str(flag) if flag else None,
            const=True if annotation is bool else extra.get("const"),
            unit=str(extra.get("unit") or ""),
            annotation=annotation,
        )




# Value types. Pydantic's lax mode reads "1883", "true"/"on"/"0" from env and
# flags; these add what it does not know.


def _not_bool(raw: Any) -> Any:
    if isinstance(raw, bool):
        raise ValueError("expected a number, not true/false")
    return raw


def _bool(raw: Any) -> Any:
    return raw.strip().lower() if isinstance(raw, str) else raw


def _off(raw: Any) -> Any:
    if isinstance(raw, str) and raw.strip().lower() in ("", "off", "none"):
        return None
    return raw


Bool = Annotated[bool, BeforeValidator(_bool)]
Int = Annotated[int, BeforeValidator(_not_bool)]
Seconds = Annotated[float, BeforeValidator(_not_bool)]
Text = Annotated[str, Field(min_length=1)]
Port = Annotated[int, BeforeValidator(_not_bool), Field(ge=0, le=MAX_PORT)]
OptionalPort = Annotated[Port | None, BeforeValidator(_off)]  # "off": no such listener


class Rate(str):
    """A rate as the `limits` package writes it ("100/second", "10 per 5
    seconds"), checked when read; `item` is the parsed value. A str, so it
    goes on to the rate limiters as before."""

    __slots__ = ()

    @property
    def item(self) -> Any:
        import limits

        return limits.parse(self)


def _rate(text: str) -> Rate:
    import limits

    try:
        item = limits.parse(text)
    except ValueError:
        raise ValueError(f"expected a rate such as 100/second, got {text!r}") from None
    if item.amount < 1:
        raise ValueError(f"a rate of {item.amount} lets nothing through")
    return Rate(text)


RateText = Annotated[str, Field(min_length=1), AfterValidator(_rate)]


def _redis_url(text: str) -> str:
    if is_cluster_url(text):
        cluster_nodes(text)  # its ValueError says what is wrong
        return text
    if not text.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"expected a redis:// URL (or redis+cluster://...), got {text!r}")
    return text


def _kafka_bootstrap(text: str) -> str:
    for server in text.split(","):
        host, sep, port = server.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) <= MAX_PORT:
            raise ValueError(f"expected HOST:PORT[,HOST:PORT...], got {text!r}")
    return text


def _http_url(text: str) -> str:
    if not text.startswith(("http://", "https://")):
        raise ValueError("expected an http:// or https:// URL")
    return text


RedisUrl = Annotated[str, Field(min_length=1), AfterValidator(_redis_url)]
KafkaBootstrap = Annotated[str, Field(min_length=1), AfterValidator(_kafka_bootstrap)]
HttpUrl = Annotated[str, Field(min_length=1), AfterValidator(_http_url)]
