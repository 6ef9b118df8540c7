"""Listener settings: which sockets a node opens, part of `services.config`.

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
asked for and checked if sent) and "none" without one. `ports` (NAME=PORT
items; `weir up --nodes` writes them into each node's settings file) moves
a listener to another port. Every check that needs no socket is made here (names, ports,
TLS files, which are loaded once to see that they can be, CIDRs), so a bad
listener is a `ValueError` with one line (a model validator of `Listeners`)
that the loader turns into its SettingsError.
"""

from __future__ import annotations

import enum
import ipaddress
import ssl
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, TypeAdapter, model_validator
from pydantic.dataclasses import dataclass

from services.config.declare import FROZEN, Int, OptionalPort, Port, Text, opt

# Loopback, as Mosquitto 2 does without a configured listener: a broker
# reachable from other machines must be asked for (`exposure_error`).
DEFAULT_HOST = "127.0.0.1"
DEFAULT_MQTT_PORT = 1883  # IANA port for MQTT
DEFAULT_WS_PORT = 8083  # EMQX's WebSocket port
WILDCARD_HOSTS = ("", "0.0.0.0", "::")


class ListenerType(enum.StrEnum):
    TCP = "tcp"
    TLS = "tls"
    WS = "ws"
    WSS = "wss"


class Verify(enum.StrEnum):
    NONE = "none"
    OPTIONAL = "optional"
    REQUIRED = "required"


class CertUsername(enum.StrEnum):  # which part of a client certificate is the user name
    NONE = "none"
    CN = "cn"
    DN = "dn"


class TlsVersion(enum.StrEnum):  # the lowest TLS version a listener accepts (never below 1.2)
    V1_2 = "1.2"
    V1_3 = "1.3"


TYPES = tuple(ListenerType)
VERIFY = tuple(Verify)
CERT_USERNAME = tuple(CertUsername)
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
TLS_MINIMUM = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}
VERIFY_MODE = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL,
               "required": ssl.CERT_REQUIRED}  # fmt: skip


def _networks(raw: Any) -> Any:
    """CIDR strings ("10.0.0.0/8", "::1", "127.0.0.1"), one or a list; host bits allowed."""
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple):
        return raw
    out = []
    for item in items:
        try:
            out.append(ipaddress.ip_network(str(item), strict=False))
        except ValueError:
            raise ValueError(f"{item!r} is not an IP address or CIDR") from None
    return tuple(out)


Networks = Annotated[tuple[Network, ...], BeforeValidator(_networks)]


def _required(raw: Any) -> Any:
    """A [[listener]] table names its name, type and port (the dataclass has
    defaults for host and port, which the shortcuts build on)."""
    if isinstance(raw, list):
        for number, table in enumerate(raw, start=1):
            if isinstance(table, dict):
                where = f"listener {table['name']!r}" if "name" in table else f"listener {number}"
                for key in ("name", "type", "port"):
                    if key not in table:
                        raise ValueError(f"{where}: needs a {key}")
    return raw


@dataclass(frozen=True, slots=True, config=FROZEN)
class ListenerConfig:
    name: str
    type: ListenerType
    host: str = ""  # "": the node's host (listeners.host)
    port: Port = 0  # 0: a free port
    certfile: Text | None = None
    keyfile: Text | None = None
    cafile: Text | None = None
    verify: Verify | None = None  # None: "optional" with a cafile, else "none"
    cert_username: CertUsername = CertUsername.NONE
    tls_min: TlsVersion = TlsVersion.V1_2
    max_connections: Annotated[Int, Field(ge=1, le=1 << 31)] | None = None  # None: the node's
    allow: Networks = ()  # empty: every peer (that deny does not name)
    deny: Networks = ()
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



def _port_overrides(raw: Any) -> Any:
    """`NAME=PORT` items (a list, or one string with commas)."""
    if not isinstance(raw, str | list | tuple):
        return raw
    items = raw.split(",") if isinstance(raw, str) else list(raw)
    out = []
    for item in items:
        if isinstance(item, list | tuple):
            out.append(tuple(item))
            continue
        name, sep, port = str(item).partition("=")
        if not sep or not name or not port.isdigit() or int(port) > MAX_PORT:
            raise ValueError(f"expected NAME=PORT, got {item!r}")
        out.append((name, int(port)))
    return tuple(out)


MAX_PORT = 65_535
_TABLES: TypeAdapter[tuple[ListenerConfig, ...]] = TypeAdapter(tuple[ListenerConfig, ...])


def tables(raw: Any) -> tuple[ListenerConfig, ...]:
    """The config file's `[[listener]]` array as configs (pydantic.ValidationError,
    a ValueError, if one is wrong)."""
    return _TABLES.validate_python(raw)


@dataclass(frozen=True, slots=True, config=FROZEN)
class Listeners:
    """The [listeners] section: the shortcuts on the node's host, and the tables."""

    host: Text = opt(
        DEFAULT_HOST,
        "address to listen on (default 127.0.0.1, loopback only, as Mosquitto 2 without a "
        "listener; another address needs authentication or --allow-anonymous)",
        env="WEIR_MQTT_HOST", flag="--host",
    )  # fmt: skip
    mqtt_port: Port = opt(DEFAULT_MQTT_PORT, "MQTT TCP port (0: a free one)", env="WEIR_MQTT_PORT")
    ws_port: OptionalPort = opt(
        DEFAULT_WS_PORT, "MQTT over WebSocket port (off: none)", env="WEIR_WS_PORT"
    )
    tls_port: OptionalPort = opt(None, "MQTT over TLS port (8883 is usual)")
    wss_port: OptionalPort = opt(None, "MQTT over secure WebSocket port")
    certfile: Text | None = opt(None, "the TLS listeners' certificate (PEM)")
    keyfile: Text | None = opt(None, "the TLS listeners' private key (PEM)")
    cafile: Text | None = opt(
        None,
        "CA certificates that client certificates are checked against (then a client "
        "certificate is asked for; see --require-client-cert)",
    )
    verify: Verify | None = opt(
        None,
        "client certificates of the tls/wss listeners: none, optional (default with a cafile) "
        "or required (--require-client-cert: TLS clients must present one the cafile signed)",
        flag="--require-client-cert", const=Verify.REQUIRED,
    )  # fmt: skip
    cert_username: CertUsername = opt(
        CertUsername.NONE, "cn or dn: a client certificate's CN (or its whole DN) is the user name"
    )
    tables: Annotated[tuple[ListenerConfig, ...], BeforeValidator(_required)] = opt(
        (), "the config file's [[listener]] tables (see above)", flag=False
    )
    ports: Annotated[tuple[tuple[str, Port], ...], BeforeValidator(_port_overrides)] = opt(
        (), "listener NAME=PORT: moves a listener (weir up --nodes gives each node its own)",
        flag="--listener-port",
    )  # fmt: skip

    @model_validator(mode="after")
    def _combines(self) -> Listeners:
        combine(self)
        return self

    def all(self) -> tuple[ListenerConfig, ...]:
        """Every listener, checked (ValueError)."""
        return combine(self)


def _shortcuts(listeners: Listeners) -> list[ListenerConfig]:
    out = [ListenerConfig("mqtt", ListenerType.TCP, "", listeners.mqtt_port)]
    if listeners.ws_port is not None:
        out.append(ListenerConfig("ws", ListenerType.WS, "", listeners.ws_port))
    for name, port in (("tls", listeners.tls_port), ("wss", listeners.wss_port)):
        if port is not None:
            out.append(
                ListenerConfig(
                    name, ListenerType(name), "", port,
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


