"""What a client under test offers the interop scenarios (tests/interop).

Each client library gets an adapter with the same small async surface:
connect with a `ConnectSpec`, then subscribe, publish, publish a burst, take
received messages, drop the socket (no DISCONNECT) or end cleanly. The
scenarios (scenarios.py) are written once against it, so every client does
the same thing; what a client cannot do raises `Unsupported`, which the
matrix turns into a skip that names the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class Unsupported(Exception):
    """The client cannot do this (protocol version, transport, property)."""


class ClientFailed(Exception):
    """The client reported a failure (a refused CONNECT, a failed publish)."""


@dataclass(frozen=True)
class Broker:
    """Where the broker under test listens (Weir, or Mosquitto for comparison)."""

    name: str
    host: str
    port: int
    tls_port: int
    ws_port: int
    cafile: str

    def url(self, transport: str) -> str:
        port = {"tcp": self.port, "tls": self.tls_port, "ws": self.ws_port}[transport]
        scheme = {"tcp": "mqtt", "tls": "mqtts", "ws": "ws"}[transport]
        return f"{scheme}://{self.host}:{port}" + ("/mqtt" if transport == "ws" else "")


@dataclass(frozen=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 1


@dataclass(frozen=True)
class ConnectSpec:
    client_id: str
    version: int | None = None  # 4: MQTT 3.1.1, 5: MQTT 5.0, None: the newest it has
    transport: str = "tcp"  # tcp, tls, ws
    clean: bool = True
    session_expiry: int = 0  # 5.0 only
    will: Will | None = None


@dataclass(frozen=True)
class Props:
    """The MQTT 5 PUBLISH properties the matrix sends and reads back."""

    user_properties: tuple[tuple[str, str], ...] = ()
    message_expiry: int | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    content_type: str | None = None
    topic_alias: int | None = None


@dataclass(frozen=True)
class Msg:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    props: Props = field(default_factory=Props)


REFUSED = "refused 0x97"
"""How an adapter reports a PUBLISH the broker refused with Quota exceeded (0x97)."""


@dataclass(frozen=True)
class Burst:
    results: tuple[str | None, ...]  # per message: None acknowledged, else the failure

    @property
    def acked(self) -> int:
        return sum(r is None for r in self.results)

    @property
    def failures(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            if r is not None:
                out[r] = out.get(r, 0) + 1
        return out


class Conn(Protocol):
    session_present: bool | None  # CONNACK's flag; None: the library does not tell

    async def subscribe(self, topic_filter: str, qos: int) -> None: ...

    async def publish(
        self, topic: str, payload: bytes, qos: int, retain: bool = False, props: Props | None = None
    ) -> None:
        """Returns once the message is sent (QoS 0) or acknowledged; ClientFailed if not."""

    async def burst(self, topic: str, count: int, qos: int) -> Burst:
        """Publish payloads b"0".."count-1" without waiting between them."""

    async def messages(self, count: int, timeout: float) -> list[Msg]:
        """The next `count` messages received, or fewer once `timeout` has passed."""

    async def disconnects(self) -> int:
        """How often the broker ended this connection (DISCONNECT or close)."""

    async def drop(self) -> None:
        """Close the socket without DISCONNECT (the will is published)."""

    async def end(self) -> None: ...


class Client(Protocol):
    name: str
    version: str  # the library's pinned version, for the report

    async def connect(self, broker: Broker, spec: ConnectSpec) -> Conn: ...

    async def close(self) -> None:
        """Everything this client started is gone."""
