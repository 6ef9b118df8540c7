"""Weir's settings: the one place that reads the environment and the config file.

Precedence, highest first: command-line values (handed in by the CLI as a
mapping), WEIR_* environment variables, the TOML config file (`--config` or
WEIR_CONFIG), then the defaults below. The result is a tree of frozen
dataclasses; services receive plain values from it, never the environment.

Every option has one dotted name (`listeners.mqtt_port`); the TOML file uses
the same names as tables and keys:

    node_id = "n1"
    [listeners]
    mqtt_port = 1883
    [limits]
    max_connections = 19000

Listeners beyond the default MQTT and WebSocket ones (TLS, WebSocket over
TLS, `[[listener]]` tables with their own address, TLS files, client
certificate rules, CIDR lists and limits) are read by
`services.listener_settings`; the authentication chain (`[[auth]]` tables and
the shortcuts --password-file, --jwt-secret, --auth-http, ...) by
`services.auth_settings`.

A bad value anywhere raises `SettingsError` with a one-line message naming
the option and where it came from; the CLI prints it and exits 2.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.auth_settings import ENV_VARS as AUTH_ENV_VARS
from services.auth_settings import AuthBackend, http_url
from services.auth_settings import chain as auth_chain
from services.auth_settings import tables as auth_tables
from services.listener_settings import CERT_USERNAME, VERIFY, Listeners
from services.listener_settings import port_overrides as listener_ports
from services.listener_settings import tables as listener_tables

ENV_VARS: frozenset[str] = frozenset(
    {
        "WEIR_NODE_ID",
        "WEIR_MQTT_HOST",
        "WEIR_MQTT_PORT",
        "WEIR_WS_PORT",
        "WEIR_DATA_DIR",
        "WEIR_REDIS_URL",
        "WEIR_KAFKA_BOOTSTRAP",
        "WEIR_KAFKA_TOPIC_PREFIX",
        "WEIR_ALLOW_ANONYMOUS",
        "WEIR_PASSWORD_FILE",
        "WEIR_ACL_FILE",
        "WEIR_ACL_NO_MATCH",
        "WEIR_ACL_REDIS",
        "WEIR_CONFIG",
    }
) | AUTH_ENV_VARS

# Limits.
MAX_CONNECTIONS = 19_000  # connections; the process may open 20,000 files (DESIGN 11)
MAX_PACKET_SIZE = 1 << 20  # bytes (1 MiB): bounds per-connection buffer memory
RECEIVE_MAXIMUM = 32  # unacknowledged incoming QoS 1/2 PUBLISHes per client (EMQX's default)
QUEUE_LIMIT = 1000  # messages per offline/overflow queue, as Mosquitto's max_queued_messages
MAX_KEEP_ALIVE_S = 65_535  # seconds; the largest keep alive MQTT can express (a 5.0
#   client asking for more is told this; 0, no keep alive, stays allowed as the spec says)
OUTBOUND_HIGH_WATER = 64 * 1024  # bytes in a transport's write buffer before we stop
#   reading from that client (uvloop's own default high-water mark)
OUTBOUND_LOW_WATER = 16 * 1024  # bytes: resume reading once the buffer drains to this
SUBSCRIBER_QUEUE_BYTES = 1 << 20  # bytes of QoS 0 PUBLISHes held for one slow
#   subscriber beyond its transport buffer; past it QoS 0 messages are dropped and counted
SHUTDOWN_GRACE_S = 5.0  # seconds to flush DISCONNECTs before closing sockets anyway
# Rate limits (services.auth.limits), written as the `limits` package parses them
# ("100/second", "10 per 5 seconds"); None: no limit. Flapping (services.auth.banned):
# off by default as in EMQX; on, EMQX's defaults: 15 connects in 1 min -> banned 5 min.
FLAPPING_MAX_CONNECTS = 15  # CONNECTs of one client id within the window
FLAPPING_WINDOW_S = 60.0
FLAPPING_BAN_S = 300.0
RATE_STORAGES = ("memory", "redis")  # where connection rates and flapping are counted
QUEUE_FULL_POLICIES = ("refuse", "drop_oldest")  # services.queue.api: at the queue bound,
#   refuse QoS 1/2 messages (their publishers are not acknowledged) or drop the oldest
DEFAULT_QUEUE_FULL = "refuse"
# Shared subscriptions (services.broker.shared), named as EMQX's
# broker.shared_subscription_strategy: which member of a `$share` group gets a message.
SHARED_STRATEGIES = (
    "random",
    "round_robin",  # per publisher, per group (EMQX's round_robin)
    "round_robin_per_group",  # per node, per group
    "sticky",  # one member per publisher until it leaves
    "hash_clientid",  # by the publisher's client id
    "hash_topic",  # by the message's topic
    "local",  # random among this node's members, any member when it has none
)
DEFAULT_SHARED_STRATEGY = "round_robin"  # EMQX's default

ACL_NO_MATCH = ("allow", "deny")  # what a publish / subscribe that no ACL rule matched gets

DEFAULT_KAFKA_TOPIC_PREFIX = "weir."
# "embedded": Redis and Kafka, started on free loopback ports unless --redis /
# --kafka name existing ones; "memory": one process, no Redis, no Kafka.
BACKENDS = ("embedded", "memory")
DEFAULT_BACKEND = "embedded"
DURABILITY_PROFILES = ("default", "durable")  # the embedded redis-server's AOF profile
DEFAULT_DURABILITY = "default"
EVENT_APPEND_TIMEOUT_S = 5.0  # seconds a CONNACK/SUBACK waits for the log's ack before failing
DEFAULT_DATA_DIR = "./weir-data"

MAX_PORT = 65_535


NOT_BUILT_ENV = {
    "WEIR_HTTP_PORT": "Weir has no HTTP API or dashboard yet, so nothing would listen there; "
    "unset it",
}
"""Settings a user may expect that nothing implements yet: naming one is an error,
never silently ignored (a config file naming one gets "unknown option")."""


class SettingsError(Exception):
    """A configuration value is missing, malformed or out of range."""


@dataclass(frozen=True, slots=True)
class Limits:
    max_connections: int = MAX_CONNECTIONS
    max_packet_size: int = MAX_PACKET_SIZE
    receive_maximum: int = RECEIVE_MAXIMUM
    queue_limit: int = QUEUE_LIMIT
    queue_full: str = DEFAULT_QUEUE_FULL
    max_keep_alive_s: int = MAX_KEEP_ALIVE_S
    outbound_high_water: int = OUTBOUND_HIGH_WATER
    outbound_low_water: int = OUTBOUND_LOW_WATER
    subscriber_queue_bytes: int = SUBSCRIBER_QUEUE_BYTES
    shutdown_grace_s: float = SHUTDOWN_GRACE_S
    max_conn_rate: str | None = None  # CONNECTs accepted per listener (0x9F / 3.x: 3)
    max_conn_rate_per_ip: str | None = None  # CONNECTs accepted per client address
    client_msg_rate: str | None = None  # PUBLISHes read per client; over: reading pauses
    client_byte_rate: str | None = None  # bytes read per client; over: reading pauses
    max_subscriptions: int = 0  # filters per client (0: no limit); over: SUBACK 0x97 / 0x80
    max_inflight: int = 0  # QoS 1/2 PUBLISHes out to a client unacknowledged (0: 3.x 32,
    #   5.0 its Receive Maximum); set: that many (5.0: at most its Receive Maximum)
    rate_storage: str = "memory"  # "redis": rates and flapping counted cluster-wide
    flapping: bool = False
    flapping_max_connects: int = FLAPPING_MAX_CONNECTS
    flapping_max_connects_ip: int = 0  # per client address (0: not counted by address)
    flapping_window_s: float = FLAPPING_WINDOW_S
    flapping_ban_s: float = FLAPPING_BAN_S


@dataclass(frozen=True, slots=True)
class Settings:
    node_id: str = field(default_factory=lambda: f"weir-{socket.gethostname()}")
    listeners: Listeners = field(default_factory=Listeners)
    limits: Limits = field(default_factory=Limits)
    data_dir: str = DEFAULT_DATA_DIR
    redis_url: str | None = None  # None: the embedded redis-server (backend "embedded")
    kafka_bootstrap: str | None = None  # None: the embedded Kafka (backend "embedded")
    backend: str = DEFAULT_BACKEND
    durability: str = DEFAULT_DURABILITY
    event_append_timeout_s: float = EVENT_APPEND_TIMEOUT_S
    kafka_topic_prefix: str = DEFAULT_KAFKA_TOPIC_PREFIX
    shared_subscription_strategy: str = DEFAULT_SHARED_STRATEGY
    shared_local: bool = False  # a member on this node first, when one is online here
    # Anonymous clients on a listener that is not loopback (on loopback they
    # are always let in while no authentication backend is configured).
    allow_anonymous: bool = False
    password_file: str | None = None  # users with argon2id hashes (services.auth.passwd)
    auth: tuple[AuthBackend, ...] = ()  # the authentication chain (services.auth_settings)
    acl_file: str | None = None  # ACL rules (services.auth.aclfile); None: the built-in ones
    acl_no_match: str = "deny"  # for what no rule matched (the built-in rules allow the rest)
    acl_redis: bool = False  # per-user rules in Redis too, weir:acl:<user> (auth.aclredis)
    server_reference: str | None = None  # where a drained node sends 5.0 clients (0x9C)
    # A node whose heartbeat is this old is dead; survivors take over its sessions and wills.
    cluster_ttl_s: float = 10.0


Convert = Callable[[Any], Any]


def _int(low: int, high: int | None = None) -> Convert:
    def convert(raw: Any) -> int:
        if isinstance(raw, bool):
            raise ValueError("expected an integer")
        value = int(raw)
        if value < low or (high is not None and value > high):
            bound = f"{low}..{high}" if high is not None else f">= {low}"
            raise ValueError(f"{value} is out of range ({bound})")
        return value

    return convert


def _float(low: float) -> Convert:
    def convert(raw: Any) -> float:
        value = float(raw)
        if value < low:
            raise ValueError(f"{value} is below {low}")
        return value

    return convert


def _text(raw: Any) -> str:
    if not isinstance(raw, str) or not raw:
        raise ValueError("expected a non-empty string")
    return raw


def _bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _optional_port(raw: Any) -> int | None:
    if raw is None or (isinstance(raw, str) and raw.lower() in ("", "off", "none")):
        return None
    port: int = _int(0, MAX_PORT)(raw)
    return port


def _choice(options: tuple[str, ...]) -> Convert:
    def convert(raw: Any) -> str:
        if raw not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return str(raw)

    return convert


def _rate(raw: Any) -> str:
    """A rate as the `limits` package writes it: "100/second", "10 per 5 seconds"."""
    import limits

    text = _text(raw)
    try:
        item = limits.parse(text)
    except ValueError:
        raise ValueError(f"expected a rate such as 100/second, got {text!r}") from None
    if item.amount < 1:
        raise ValueError(f"a rate of {item.amount} lets nothing through")
    return text


def _kafka_bootstrap(raw: Any) -> str:
    text = _text(raw)
    for server in text.split(","):
        host, sep, port = server.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) <= MAX_PORT:
            raise ValueError(f"expected HOST:PORT[,HOST:PORT...], got {text!r}")
    return text


def _redis_url(raw: Any) -> str:
    text = _text(raw)
    if not text.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"expected a redis:// URL, got {text!r}")
    return text


@dataclass(frozen=True, slots=True)
class Option:
    path: str  # dotted: "listeners.mqtt_port"
    convert: Convert
    env: str | None = None


OPTIONS: tuple[Option, ...] = (
    Option("node_id", _text, "WEIR_NODE_ID"),
    Option("data_dir", _text, "WEIR_DATA_DIR"),
    Option("redis_url", _redis_url, "WEIR_REDIS_URL"),
    Option("kafka_bootstrap", _kafka_bootstrap, "WEIR_KAFKA_BOOTSTRAP"),
    Option("kafka_topic_prefix", _text, "WEIR_KAFKA_TOPIC_PREFIX"),
    Option("backend", _choice(BACKENDS)),
    Option("durability", _choice(DURABILITY_PROFILES)),
    Option("event_append_timeout_s", _float(0.1)),
    Option("shared_subscription_strategy", _choice(SHARED_STRATEGIES)),
    Option("shared_local", _bool),
    Option("allow_anonymous", _bool, "WEIR_ALLOW_ANONYMOUS"),
    Option("password_file", _text, "WEIR_PASSWORD_FILE"),
    Option("auth", auth_tables),  # [[auth]] in the file
    Option("auth_redis", _bool, "WEIR_AUTH_REDIS"),
    Option("auth_http", http_url, "WEIR_AUTH_HTTP"),
    Option("jwt_secret", _text, "WEIR_JWT_SECRET"),
    Option("jwt_public_key", _text, "WEIR_JWT_PUBLIC_KEY"),
    Option("jwt_jwks", _text, "WEIR_JWT_JWKS"),
    Option("acl_file", _text, "WEIR_ACL_FILE"),
    Option("acl_no_match", _choice(ACL_NO_MATCH), "WEIR_ACL_NO_MATCH"),
    Option("acl_redis", _bool, "WEIR_ACL_REDIS"),
    Option("server_reference", _text),
    Option("cluster_ttl_s", _float(0.5)),
    Option("listeners.host", _text, "WEIR_MQTT_HOST"),
    Option("listeners.mqtt_port", _int(0, MAX_PORT), "WEIR_MQTT_PORT"),
    Option("listeners.ws_port", _optional_port, "WEIR_WS_PORT"),
    Option("listeners.tls_port", _optional_port),
    Option("listeners.wss_port", _optional_port),
    Option("listeners.certfile", _text),
    Option("listeners.keyfile", _text),
    Option("listeners.cafile", _text),
    Option("listeners.verify", _choice(VERIFY)),
    Option("listeners.cert_username", _choice(CERT_USERNAME)),
    Option("listeners.tables", listener_tables),  # [[listener]] in the file
    Option("listeners.ports", listener_ports),
    Option("limits.max_connections", _int(1)),
    Option("limits.max_packet_size", _int(64, 268_435_460)),
    Option("limits.receive_maximum", _int(1, 65_535)),
    Option("limits.queue_limit", _int(1)),
    Option("limits.queue_full", _choice(QUEUE_FULL_POLICIES)),
    Option("limits.max_keep_alive_s", _int(0, MAX_KEEP_ALIVE_S)),
    Option("limits.outbound_high_water", _int(1024)),
    Option("limits.outbound_low_water", _int(0)),
    Option("limits.subscriber_queue_bytes", _int(0)),
    Option("limits.shutdown_grace_s", _float(0.0)),
    Option("limits.max_conn_rate", _rate),
    Option("limits.max_conn_rate_per_ip", _rate),
    Option("limits.client_msg_rate", _rate),
    Option("limits.client_byte_rate", _rate),
    Option("limits.max_subscriptions", _int(0)),
    Option("limits.max_inflight", _int(0, 65_535)),
    Option("limits.rate_storage", _choice(RATE_STORAGES)),
    Option("limits.flapping", _bool),
    Option("limits.flapping_max_connects", _int(1)),
    Option("limits.flapping_max_connects_ip", _int(0)),
    Option("limits.flapping_window_s", _float(1.0)),
    Option("limits.flapping_ban_s", _float(1.0)),
)
_BY_PATH = {option.path: option for option in OPTIONS}


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in table.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def _read_file(path: str) -> dict[str, Any]:
    try:
        with Path(path).open("rb") as handle:
            table = tomllib.load(handle)
    except OSError as exc:
        raise SettingsError(f"config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {path}: {exc}") from None
    if "listener" in table:  # [[listener]] tables: a list, not a section
        table = {**table, "listeners": {**table.get("listeners", {}), "tables": table["listener"]}}
        del table["listener"]
    flat = _flatten(table)
    for key in flat:
        if key not in _BY_PATH:
            raise SettingsError(f"config file {path}: unknown option {key!r}")
    return flat


def _convert(option: Option, raw: Any, source: str) -> Any:
    try:
        return option.convert(raw)
    except (TypeError, ValueError) as exc:
        shown = "" if isinstance(raw, list) or "secret" in option.path else f" {raw!r}"
        raise SettingsError(f"{source}: bad value{shown} for {option.path}: {exc}") from None


def load(
    cli: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Settings from CLI values (dotted paths; None = not given), env, file, defaults."""
    cli = {k: v for k, v in (cli or {}).items() if v is not None}
    env = os.environ if env is None else env
    for name, why in NOT_BUILT_ENV.items():
        if name in env:
            raise SettingsError(f"{name}: {why}")
    values: dict[str, Any] = {}
    config_path = cli.pop("config", None) or env.get("WEIR_CONFIG") or None
    if config_path:
        for key, raw in _read_file(str(config_path)).items():
            values[key] = _convert(_BY_PATH[key], raw, f"config file {config_path}")
    for option in OPTIONS:
        if option.env is not None and option.env in env:
            values[option.path] = _convert(option, env[option.env], option.env)
    for key, raw in cli.items():
        known = _BY_PATH.get(key)
        if known is None:
            raise SettingsError(f"unknown option {key!r}")
        values[key] = _convert(known, raw, f"--{key.rpartition('.')[2].replace('_', '-')}")
    return _build(values)


def _build(values: Mapping[str, Any]) -> Settings:
    sections: dict[str, dict[str, Any]] = {"": {}, "listeners": {}, "limits": {}}
    for path, value in values.items():
        section, _, name = path.rpartition(".")
        sections[section][name] = value
    listeners = Listeners(**sections["listeners"])
    try:
        listeners.all()
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    limits = Limits(**sections["limits"])
    if limits.outbound_low_water > limits.outbound_high_water:
        raise SettingsError("limits.outbound_low_water is above limits.outbound_high_water")
    try:
        sections[""]["auth"] = auth_chain(sections[""])
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    return Settings(listeners=listeners, limits=limits, **sections[""])


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to any interface


def exposure_error(settings: Settings) -> str | None:
    """Why a node with these settings must not start, or None. A listener
    that other machines can reach needs an authentication backend, client
    certificates it requires, or an explicit allow_anonymous (the node's or
    its own), as Mosquitto 2 asks."""
    if settings.auth:
        return None
    for listener in settings.listeners.all():
        host = listener.host
        anonymous = listener.allow_anonymous
        if anonymous is None:
            anonymous = settings.allow_anonymous
        if is_loopback(host) or anonymous or listener.client_certs == "required":
            continue
        return (
            f"listener {listener.name}: listening on {host} (not loopback) would let any "
            "client in without authentication; configure authentication ([[auth]], "
            "--password-file, --jwt-secret, --auth-http, ...), "
            "require client certificates, or set allow_anonymous = true (--allow-anonymous, "
            "WEIR_ALLOW_ANONYMOUS=true) to accept that, or listen on 127.0.0.1"
        )
    return None
