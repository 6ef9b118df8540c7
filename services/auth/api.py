"""Authentication and authorization: what the node asks, and the allow-all default.

Theory of operation. When a node has an authenticator, the channel asks for
it with an `Authenticate` action after a valid CONNECT and before the session
is opened; the node calls `Authenticator.authenticate` and feeds the answer
back (`channel.authenticated`), which opens the session or refuses the
CONNECT with the decision's reason code (5.0) or its 3.1.1 return code.
Authorization (`Authorizer.allowed`) is asked per PUBLISH topic and per
SUBSCRIBE filter. `AllowAll` is what a node runs until a backend is
configured; the password file (`services.auth.passwd`) is the first backend.
Redis users, HTTP, JWT, SCRAM, ACL rules and their chain are still to come.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol


class Action(Enum):
    PUBLISH = "publish"
    SUBSCRIBE = "subscribe"


@dataclass(frozen=True, slots=True)
class ClientInfo:
    client_id: str
    username: str | None
    peer: str  # "host:port"
    protocol_level: int


@dataclass(frozen=True, slots=True)
class Decision:
    """`ok`, or the MQTT 5 reason code to refuse with (0x86 bad user name or
    password, 0x87 not authorized, 0x8A banned, ...)."""

    ok: bool
    reason_code: int = 0


ALLOW = Decision(True)


class Authenticator(Protocol):
    async def authenticate(self, client: ClientInfo, password: bytes | None) -> Decision:
        """May this client connect? Never raises: a backend that cannot answer
        says so with a refusal (0x88 server unavailable)."""
        ...


class Authorizer(Protocol):
    def allowed(self, client: ClientInfo, action: Action, topic: str, qos: int, retain: bool) -> (
        bool
    ):
        """May this client publish to / subscribe to `topic`?"""
        ...


class AllowAll:
    """Every client may connect, publish and subscribe (the default)."""

    async def authenticate(self, client: ClientInfo, password: bytes | None) -> Decision:
        return ALLOW

    def allowed(self, client: ClientInfo, action: Action, topic: str, qos: int, retain: bool) -> (
        bool
    ):
        return True
