"""The node's listeners at run time: bind, screen the peer, TLS, count.

Theory of operation. Each `ListenerConfig` (`services.config.listeners`)
becomes one `Listener` with one asyncio server (`services.node.node`
gives it its protocol). A plain listener without CIDR rules accepts
straight into its protocol: a `Connection` (tcp), or a `WebSocketProtocol`
that makes one after the HTTP upgrade (ws), so the default listeners cost
nothing more than before. Any other listener accepts into a `Gate` first:

1. the peer's address is screened against the listener's `deny` and
   `allow` CIDRs (deny wins; a non-empty allow list must name the peer); a
   refused peer is aborted before a byte is read from it, counted
   (`listeners.refused_address`) and logged once per address per minute;
2. on a TLS listener (tls, wss) the handshake runs with `loop.start_tls`
   (TLS 1.2 or 1.3 at least, the listener's client-certificate rule),
   bounded by TLS_HANDSHAKE_TIMEOUT_S; a failed one closes only that
   connection, counted (`listeners.tls_failed`) and logged like a refusal;
3. the transport is handed to the listener's protocol (`set_protocol`),
   with any bytes that came in between.

A `Connection` tells its listener when it opens and ends (`opened` /
`closed`): past the listener's `max_connections` its CONNECT is refused
with "quota exceeded" (3.x: "server unavailable"), as the node's own limit
does, and counted (`listeners.refused_full`). On a TLS listener the
connection reads the client certificate's subject (`identity`): its DN
travels on `ClientInfo.cert_subject`, and with `cert_username = cn | dn`
that field replaces the CONNECT's user name before the authenticator is
asked (`Connection.client_info`; a certificate without that field gives no
user name); a client without a certificate keeps the user name it sent.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from services.auth.api import ClientInfo
from services.config.listeners import ListenerConfig, ssl_context
from services.logs import client_fields

if TYPE_CHECKING:
    from services.metrics.registry import Metrics

log = logging.getLogger("weir.listeners")

LISTEN_BACKLOG = 4096  # pending accepts; a reconnect storm of thousands must not be refused
TLS_HANDSHAKE_TIMEOUT_S = 10.0  # seconds a client has to finish its TLS handshake
LOG_EVERY_S = 60.0  # a refused address is logged at most once a minute per reason
LOGGED_ADDRESSES = 10_000  # addresses remembered for that; past it the table starts over
DN_NAMES = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU",
            "countryName": "C", "stateOrProvinceName": "ST", "localityName": "L",
            "emailAddress": "emailAddress", "domainComponent": "DC"}  # fmt: skip


DN_SPECIAL = frozenset(',+"\\<>;=')  # escaped with a backslash in a DN's value (RFC 4514)


def _dn_value(value: str) -> str:
    out = [f"\\{c}" if c in DN_SPECIAL else c for c in value]
    if out and out[0] in ("#", " "):
        out[0] = "\\" + out[0]
    if out and out[-1] == " ":
        out[-1] = "\\ "
    return "".join(out)


def identity(peercert: Any, field: str) -> tuple[str | None, str | None]:
    """(DN, user name) of a verified client certificate: the DN as RFC 4514
    writes it (most specific first, special characters escaped), the user
    name by `field`: cn (the CN as it is), dn, or none."""
    if not peercert:
        return None, None
    rdns = [(name, value) for rdn in peercert.get("subject", ()) for name, value in rdn]
    dn = ",".join(
        f"{DN_NAMES.get(name, name)}={_dn_value(value)}" for name, value in reversed(rdns)
    )
    if field == "cn":
        return dn, next((value for name, value in rdns if name == "commonName"), None)
    return dn, dn if field == "dn" else None


class Listener:
    """One listener: its server, its gate and its counts."""

    def __init__(
        self,
        config: ListenerConfig,
        protocol: Callable[[Listener], asyncio.Protocol],
        metrics: Metrics,
    ) -> None:
        self.config = config
        self.name = config.name
        self.protocol = protocol  # the listener's own protocol (Connection, WebSocket)
        self.metrics = metrics
        self.ssl = ssl_context(config) if config.tls else None
        self.names_users = config.cert_username != "none"  # client certificates name users
        self.connections = 0
        self.limit = config.max_connections
        self.refused = {"address": 0, "full": 0, "tls": 0}  # counts, for tests and $SYS
        self.port: int | None = None
        self.server: asyncio.Server | None = None
        self._logged: dict[tuple[str, str], float] = {}
        self._handshakes: set[asyncio.Task[None]] = set()

    def factory(self) -> Callable[[], asyncio.Protocol]:
        if self.ssl is None and not self.config.allow and not self.config.deny:
            return lambda: self.protocol(self)
        return lambda: Gate(self)

    async def bind(self, loop: asyncio.AbstractEventLoop, reuse_port: bool) -> None:
        config = self.config
        try:
            self.server = await loop.create_server(
                self.factory(),
                config.host,
                config.port,
                backlog=LISTEN_BACKLOG,
                reuse_address=True,
                reuse_port=reuse_port or None,
            )
        except OSError as exc:
            where = f"listener {self.name} on {config.host}:{config.port}"
            raise OSError(exc.errno, f"{where}: {exc.strerror or exc}") from None
        self.port = self.server.sockets[0].getsockname()[1]

    def identity(self, transport: asyncio.BaseTransport) -> tuple[str | None, str | None]:
        """(DN, user name) of the client certificate on this TLS connection."""
        return identity(transport.get_extra_info("peercert"), self.config.cert_username)

    def client_info(
        self, cert: tuple[str | None, str | None], client_id: str, username: str | None,
        peer: str, protocol_level: int,
    ) -> ClientInfo:  # fmt: skip
        """Who a client of this listener is: where client certificates name the
        user, a certificate's name (`identity`) replaces the CONNECT's (a
        certificate without that field names no one); without one it stays."""
        subject, cert_user = cert
        named = subject is not None and self.names_users
        if named:
            username = cert_user
        named_user = named and username is not None
        return ClientInfo(client_id, username, peer, protocol_level, self.name, subject, named_user)

    def describe(self) -> str:
        return replace(self.config, port=self.port or self.config.port).describe()

    # -- screening -----------------------------------------------------------

    def admits(self, transport: asyncio.BaseTransport) -> bool:
        """Is the peer's address allowed here (deny wins over allow)?"""
        config = self.config
        peer = transport.get_extra_info("peername")
        try:
            address = ipaddress.ip_address(str(peer[0]).partition("%")[0])
        except (TypeError, IndexError, ValueError):
            return not config.allow  # no IP address: only where nothing must be matched
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        denied = any(address in net for net in config.deny)
        if denied or (config.allow and not any(address in net for net in config.allow)):
            self._refuse("address", str(address), "address not allowed on this listener")
            return False
        return True

    def opened(self) -> bool:
        """A connection of this listener began: False when it is one too many."""
        self.connections += 1
        if self.limit is not None and self.connections > self.limit:
            self.refused["full"] += 1
            self.metrics.connections_refused["listener_full"] += 1
            return False
        return True

    def closed(self) -> None:
        self.connections -= 1

    def _refuse(self, reason: str, address: str, why: str) -> None:
        self.refused[reason] += 1
        self.metrics.connections_refused[reason] += 1  # "address" or "tls"
        now = time.monotonic()
        key = (reason, address)
        if now - self._logged.get(key, -LOG_EVERY_S) < LOG_EVERY_S:
            return
        if len(self._logged) >= LOGGED_ADDRESSES:
            self._logged.clear()
        self._logged[key] = now
        log.warning(
            "listener %s refused %s: %s (once a minute per address)", self.name, address, why,
            extra=client_fields(None, peer=str(address)),
        )

    # -- TLS -----------------------------------------------------------------

    def handshake(self, gate: Gate, transport: asyncio.Transport) -> None:
        """Start TLS on this connection. The loop reads from it as soon as
        `connection_made` returns, so the gate may hold the ClientHello by the
        time `start_tls` runs (in the task's first step, next turn); that step
        puts the TLS protocol in place and schedules its `connection_made` and
        `resume_reading`. The callback scheduled here, behind the task's step,
        schedules `Gate.feed_raw` behind those: the held bytes reach the TLS
        protocol first, before anything more is read."""
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._handshake(gate, transport))
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)
        loop.call_soon(loop.call_soon, gate.feed_raw, transport)

    async def _handshake(self, gate: Gate, transport: asyncio.Transport) -> None:
        loop = asyncio.get_running_loop()
        assert self.ssl is not None
        try:
            tls = await loop.start_tls(
                transport,
                gate,
                self.ssl,
                server_side=True,
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S,
            )
        except Exception as exc:  # whatever it was (SSLError, reset, timeout): this one ends
            peer = transport.get_extra_info("peername")
            address = str(peer[0]) if peer else "?"
            self._refuse("tls", address, f"TLS handshake failed: {exc}")
            transport.abort()
            return
        if tls is None or gate.lost:
            return
        gate.hand_over(tls)

    def close(self) -> None:
        """Stop accepting; abort the handshakes still running."""
        if self.server is not None:
            self.server.close()
        for task in list(self._handshakes):
            task.cancel()


class Gate(asyncio.Protocol):
    """A connection on a listener with CIDR rules or TLS, until the
    listener's own protocol takes it over."""

    __slots__ = ("_held", "_raw", "listener", "lost")

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self._raw: list[bytes] | None = []  # TLS bytes read before start_tls took over
        self._held: list[bytes] = []  # plain bytes after the handshake, before the hand-over
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        listener = self.listener
        if not listener.admits(transport):
            transport.abort()  # type: ignore[attr-defined]
        elif listener.ssl is None:
            self.hand_over(transport)  # type: ignore[arg-type]
        else:
            listener.handshake(self, transport)  # type: ignore[arg-type]

    def hand_over(self, transport: asyncio.Transport) -> None:
        protocol = self.listener.protocol(self.listener)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        held, self._held = self._held, []
        for data in held:
            protocol.data_received(data)

    def feed_raw(self, transport: asyncio.Transport) -> None:
        """Give the TLS protocol the bytes read before it was there (see
        `Listener.handshake`)."""
        raw, self._raw = self._raw, None
        if not raw or transport.is_closing():
            return
        data = b"".join(raw)
        tls: Any = transport.get_protocol()  # asyncio's or uvloop's SSLProtocol
        if not hasattr(tls, "get_buffer"):  # both are buffered protocols (uvloop's by duck)
            tls.data_received(data)
            return
        while data:
            buffer = memoryview(tls.get_buffer(len(data)))
            n = min(len(buffer), len(data))
            buffer[:n] = data[:n]
            tls.buffer_updated(n)
            data = data[n:]

    def data_received(self, data: bytes) -> None:
        (self._held if self._raw is None else self._raw).append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
