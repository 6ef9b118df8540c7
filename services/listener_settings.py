"""Listener settings: which sockets a node opens, read by `services.settings`.

Theory of operation. A node has one listener per (type, address): `tcp`
(plain MQTT), `tls` (MQTT over TLS 1.2+), `ws` (MQTT over WebSocket) and
`wss` (WebSocket over TLS). They come from two places, merged here into one
tuple of `ListenerConfig` (`combine`):

- the `[listeners]` shortcuts, always on the node's `host`: `mqtt_port`
  (listener "mqtt", tcp, always there), `ws_port` ("ws", unless "off"),
  `tls_port` ("tls") and `wss_port` ("wss") with the shared `certfile`,
  `keyfile`, `cafile`, `verify` and `cert_username`;
- `[[listener]]` tables in the config file, each with its own name, type,
  host (default: the node's), port, TLS files, client-certificate rules,
  `max_connections`, `allow` / `deny` CIDR lists and `allow_anonymous`:

      [[listener]]
      name = "devices"
      type = "tls"              # tcp | tls | ws | wss
      host = "0.0.0.0"
      port = 8883
      certfile = "server.pem"
      keyfile = "server.key"
      cafile = "ca.pem"         # client certificates are checked against it
      verify = "required"       # none | optional | required
      cert_username = "cn"      # cn | dn | none: the certificate names the user
      allow = ["10.0.0.0/8"]    # peers outside every allow entry are refused
      deny = ["10.9.0.0/16"]    # deny wins over allow
      max_connections = 5000

`verify` left out means "optional" when a cafile is given (a certificate is
asked for and checked if sent) and "none" without one. `ports` (the hidden
`--listener-port NAME=PORT`, from `weir up --nodes`) moves a listener to
another port. Every check that needs no socket is made here (names, ports,
TLS files, which are loaded once to see that they can be, CIDRs), so a bad
listener is a `ValueError` with one line that the settings module turns
into its SettingsError.
"""

from __future__ import annotations

import argparse
import ipaddress
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

# Loopback, as Mosquitto 2 does without a configured listener: a broker
# reachable from other machines must be asked for (`settings.exposure_error`).
DEFAULT_HOST = "127.0.0.1"
DEFAULT_MQTT_PORT = 1883  # IANA port for MQTT
DEFAULT_WS_PORT = 8083  # EMQX's WebSocket port
TYPES = ("tcp", "tls", "ws", "wss")
VERIFY = ("none", "optional", "required")
CERT_USERNAME = ("none", "cn", "dn")  # which part of a client certificate is the user name
TLS_VERSIONS = ("1.2", "1.3")  # the lowest TLS version a listener accepts (never below 1.2)
WILDCARD_HOSTS = ("", "0.0.0.0", "::")
MAX_PORT = 65_535

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
TLS_MINIMUM = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}
VERIFY_MODE = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL,
               "required": ssl.CERT_REQUIRED}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    name: str
    type: str  # one of TYPES
    host: str  # "": the node's host (listeners.host)
    port: int  # 0: a free port
    certfile: str | None = None
    keyfile: str | None = None
    cafile: str | None = None
    verify: str | None = None  # None: "optional" with a cafile, else "none"
    cert_username: str = "none"
    tls_min: str = "1.2"
    max_connections: int | None = None  # None: only the node's limit
    allow: tuple[Network, ...] = ()  # empty: every peer (that deny does not name)
    deny: tuple[Network, ...] = ()
    allow_anonymous: bool | None = None  # None: the node's allow_anonymous

    @property
    def tls(self) -> bool:
        return self.type in ("tls", "wss")

    @property
    def websocket(self) -> bool:
        return self.type in ("ws", "wss")

    @property
    def client_certs(self) -> str:
        """none | optional | required, the default resolved."""
        if self.verify is not None:
            return self.verify
        return "optional" if self.cafile else "none"

    def describe(self) -> str:
        """One line for the start: what this listener is and whom it lets in."""
        parts = [f"listener {self.name}: {self.type} on {self.host}:{self.port}"]
        if self.tls:
            certs = {"none": "no client certificates", "optional": "client certificate optional",
                     "required": "client certificate required"}[self.client_certs]  # fmt: skip
            parts.append(f"TLS {self.tls_min}+, {certs}")
            if self.cert_username != "none":
                parts.append(f"certificate {self.cert_username.upper()} as user name")
        if self.allow:
            parts.append("allow " + " ".join(map(str, self.allow)))
        if self.deny:
            parts.append("deny " + " ".join(map(str, self.deny)))
        if self.max_connections is not None:
            parts.append(f"at most {self.max_connections} connections")
        if self.allow_anonymous is not None:
            parts.append("anonymous " + ("allowed" if self.allow_anonymous else "refused"))
        return "; ".join(parts)


def _choice(table: Mapping[str, Any], key: str, options: tuple[str, ...], default: Any) -> Any:
    value = table.get(key, default)
    if value is not default and value not in options:
        raise ValueError(f"{key} must be one of {', '.join(options)}, not {value!r}")
    return value


def _text(table: Mapping[str, Any], key: str) -> str | None:
    value = table.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{key} must be a non-empty string")
    return value


def _int(table: Mapping[str, Any], key: str, low: int, high: int) -> int | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{key} must be an integer in {low}..{high}, not {value!r}")
    return value


def networks(raw: Any, key: str) -> tuple[Network, ...]:
    """CIDR strings ("10.0.0.0/8", "::1", "127.0.0.1") as networks."""
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise ValueError(f"{key} must be a list of CIDR strings")
    out: list[Network] = []
    for item in raw:
        try:
            out.append(ipaddress.ip_network(str(item), strict=False))
        except ValueError:
            raise ValueError(f"{key}: {item!r} is not an IP address or CIDR") from None
    return tuple(out)


TABLE_KEYS = frozenset(
    {"name", "type", "host", "port", "certfile", "keyfile", "cafile", "verify", "cert_username",
     "tls_min", "max_connections", "allow", "deny", "allow_anonymous"}
)  # fmt: skip


def table(raw: Any, index: int) -> ListenerConfig:
    """One `[[listener]]` table (the index counts from 1, for the message)."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"listener {index} must be a table")
    where = f"listener {raw.get('name', index)!r}" if "name" in raw else f"listener {index}"
    try:
        unknown = sorted(set(raw) - TABLE_KEYS)
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r}")
        name = _text(raw, "name")
        if name is None:
            raise ValueError("needs a name")
        kind = _choice(raw, "type", TYPES, None)
        if kind is None:
            raise ValueError(f"needs a type ({', '.join(TYPES)})")
        port = _int(raw, "port", 0, MAX_PORT)
        if port is None:
            raise ValueError("needs a port")
        anonymous = raw.get("allow_anonymous")
        if anonymous is not None and not isinstance(anonymous, bool):
            raise ValueError("allow_anonymous must be true or false")
        return ListenerConfig(
            name=name,
            type=kind,
            host=_text(raw, "host") or "",
            port=port,
            certfile=_text(raw, "certfile"),
            keyfile=_text(raw, "keyfile"),
            cafile=_text(raw, "cafile"),
            verify=_choice(raw, "verify", VERIFY, None),
            cert_username=_choice(raw, "cert_username", CERT_USERNAME, "none"),
            tls_min=_choice(raw, "tls_min", TLS_VERSIONS, "1.2"),
            max_connections=_int(raw, "max_connections", 1, 1 << 31),
            allow=networks(raw.get("allow", []), "allow"),
            deny=networks(raw.get("deny", []), "deny"),
            allow_anonymous=anonymous,
        )
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def tables(raw: Any) -> tuple[ListenerConfig, ...]:
    """The config file's `[[listener]]` array."""
    if not isinstance(raw, list):
        raise ValueError("expected [[listener]] tables")
    return tuple(table(item, i) for i, item in enumerate(raw, start=1))


def port_overrides(raw: Any) -> tuple[tuple[str, int], ...]:
    """`NAME=PORT` items (a list, or one string with commas)."""
    items = raw.split(",") if isinstance(raw, str) else list(raw)
    out = []
    for item in items:
        name, sep, port = str(item).partition("=")
        if not sep or not name or not port.isdigit() or int(port) > MAX_PORT:
            raise ValueError(f"expected NAME=PORT, got {item!r}")
        out.append((name, int(port)))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Listeners:
    """The [listeners] section of the settings (`services.settings`)."""

    host: str = DEFAULT_HOST
    mqtt_port: int = DEFAULT_MQTT_PORT
    ws_port: int | None = DEFAULT_WS_PORT  # None: no WebSocket listener
    tls_port: int | None = None
    wss_port: int | None = None
    certfile: str | None = None  # the tls and wss listeners' files and client certificates
    keyfile: str | None = None
    cafile: str | None = None
    verify: str | None = None  # client certificates: none | optional | required
    cert_username: str = "none"  # cn | dn: the client certificate names the user
    tables: tuple[ListenerConfig, ...] = ()  # the config file's [[listener]] tables
    ports: tuple[tuple[str, int], ...] = ()  # listener name -> port (weir up --nodes)

    def all(self) -> tuple[ListenerConfig, ...]:
        """Every listener, checked (ValueError)."""
        return combine(self)


def _shortcuts(listeners: Listeners) -> list[ListenerConfig]:
    out = [ListenerConfig("mqtt", "tcp", "", listeners.mqtt_port)]
    if listeners.ws_port is not None:
        out.append(ListenerConfig("ws", "ws", "", listeners.ws_port))
    for name, port in (("tls", listeners.tls_port), ("wss", listeners.wss_port)):
        if port is not None:
            out.append(
                ListenerConfig(
                    name, name, "", port,
                    certfile=listeners.certfile, keyfile=listeners.keyfile,
                    cafile=listeners.cafile, verify=listeners.verify,
                    cert_username=listeners.cert_username,
                )
            )  # fmt: skip
    return out


def combine(listeners: Listeners) -> tuple[ListenerConfig, ...]:
    """Every listener of a node, checked; ValueError (one line) if one is wrong."""
    moved = dict(listeners.ports)
    out: list[ListenerConfig] = []
    for config in (*_shortcuts(listeners), *listeners.tables):
        host = config.host or listeners.host
        out.append(replace(config, host=host, port=moved.pop(config.name, config.port)))
    if moved:
        raise ValueError(f"--listener-port names no listener: {', '.join(moved)}")
    for i, config in enumerate(out):
        _check(config)
        for other in out[:i]:
            if other.name == config.name:
                raise ValueError(f"two listeners are named {config.name!r}")
            if config.port and other.port == config.port and _overlap(config.host, other.host):
                raise ValueError(
                    f"listeners {other.name!r} and {config.name!r} both use port {config.port} "
                    f"on {config.host}"
                )
    return tuple(out)


def ssl_context(config: ListenerConfig) -> ssl.SSLContext:
    """The server context of a TLS listener; OSError / ssl.SSLError for bad files."""
    assert config.certfile is not None and config.keyfile is not None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_MINIMUM[config.tls_min]
    context.load_cert_chain(config.certfile, config.keyfile)
    if config.client_certs != "none":
        context.load_verify_locations(cafile=config.cafile)
        context.verify_mode = VERIFY_MODE[config.client_certs]
    return context


def _overlap(a: str, b: str) -> bool:
    return a == b or a in WILDCARD_HOSTS or b in WILDCARD_HOSTS


def _check(config: ListenerConfig) -> None:
    where = f"listener {config.name!r}"
    if not config.tls:
        tls_keys = [k for k in ("certfile", "keyfile", "cafile", "verify")
                    if getattr(config, k) is not None]  # fmt: skip
        if config.cert_username != "none":
            tls_keys.append("cert_username")
        if tls_keys:
            raise ValueError(f"{where}: {tls_keys[0]} needs type tls or wss, not {config.type}")
        return
    if config.certfile is None or config.keyfile is None:
        raise ValueError(f"{where}: TLS needs a certfile and a keyfile (--certfile, --keyfile)")
    for key in ("certfile", "keyfile", "cafile"):
        path = getattr(config, key)
        if path is not None and not Path(path).is_file():
            raise ValueError(f"{where}: {key} {path} is not a readable file")
    if config.client_certs != "none" and config.cafile is None:
        raise ValueError(f"{where}: verify = {config.verify} needs a cafile to check them with")
    if config.cert_username != "none" and config.client_certs == "none":
        raise ValueError(f"{where}: cert_username = {config.cert_username} needs client "
                         "certificates (a cafile, verify optional or required)")  # fmt: skip
    try:
        ssl_context(config)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise ValueError(
            f"{where}: cannot use certfile {config.certfile} with keyfile {config.keyfile}"
            + (f" and cafile {config.cafile}" if config.cafile else "")
            + f": {exc}"
        ) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`weir up`'s listener shortcuts (the [listeners] options)."""
    add = parser.add_argument
    add("--tls-port", dest="listeners.tls_port", help="MQTT over TLS port (8883 is usual)")
    add("--wss-port", dest="listeners.wss_port", help="MQTT over secure WebSocket port")
    add("--certfile", dest="listeners.certfile", help="the TLS listeners' certificate (PEM)")
    add("--keyfile", dest="listeners.keyfile", help="the TLS listeners' private key (PEM)")
    add("--cafile", dest="listeners.cafile",
        help="CA certificates that client certificates are checked against (then a client "
        "certificate is asked for; see --require-client-cert)")  # fmt: skip
    add("--require-client-cert", dest="listeners.verify", action="store_const",
        const="required",
        help="TLS clients must present a certificate the --cafile signed")  # fmt: skip
    add("--cert-username", dest="listeners.cert_username",
        help="cn or dn: a client certificate's CN (or its whole DN) is the user name")  # fmt: skip
    add("--listener-port", dest="listeners.ports", action="append",
        help=argparse.SUPPRESS)  # NAME=PORT, from the supervisor of --nodes  # fmt: skip
