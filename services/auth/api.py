"""Authentication and authorization: what the node asks, and the allow-all default.

Theory of operation. When a node has an authenticator, the channel asks for
it with an `Authenticate` action after a valid CONNECT and before the session
is opened; the node calls `Authenticator.authenticate` and feeds the answer
back (`channel.authenticated`), which opens the session or refuses the
CONNECT with the decision's reason code (5.0) or its 3.1.1 return code.
Authorization (`Authorizer.allowed`) is asked per PUBLISH topic and per
SUBSCRIBE filter. `AllowAll` is what a node runs until a backend is
configured; otherwise the authenticator is a chain of backends
(`services.auth.chain`: password file, Redis users, JWT, HTTP webhook), and
its decision says which backend gave it (`by`, for the log line of a refusal).
An authorizer with state per connection (`ConnectionAuthorizer`: the ACL
rules of `services.auth.acl`) is also told when a client connects and
leaves, says which rule decided (for the log line of a refusal) and whether
a publish can be refused at all (else the node does not ask per PUBLISH).
MQTT 5 enhanced authentication (4.12: an Authentication Method in CONNECT,
then AUTH packets; re-authentication with AUTH 0x19) is an
`EnhancedAuthenticator` (`services.auth.scramauth`: SCRAM-SHA-256): the
node hands it each Authentication Data the client sends with the `context`
its previous `AuthAnswer` gave, until an answer carries a decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol, runtime_checkable


class Action(Enum):
    PUBLISH = "publish"
    SUBSCRIBE = "subscribe"


@dataclass(frozen=True, slots=True)
class ClientInfo:
    client_id: str
    username: str | None
    peer: str  # "host:port"
    protocol_level: int
    listener: str = ""  # the name of the listener it came in on (services.config.listeners)
    cert_subject: str | None = None  # its TLS client certificate's DN, when it sent one
    cert_named: bool = False  # `username` is the one its verified certificate gives


@dataclass(frozen=True, slots=True)
class Decision:
    """`ok`, or the MQTT 5 reason code to refuse with (0x86 bad user name or
    password, 0x87 not authorized, 0x8A banned, ...)."""

    ok: bool
    reason_code: int = 0
    by: str = ""  # who decided, in words ("password file /etc/weir/passwd", "jwt", ...)


ALLOW = Decision(True)


@dataclass(frozen=True, slots=True)
class AuthAnswer:
    """One step of an enhanced authentication: `decision` None means go on (the
    server sends `data` in AUTH 0x18, and the client's next Authentication Data
    comes back with `context`); else it ends, `data` then being the server's
    last word (for the CONNACK, or AUTH 0x00 on re-authentication)."""

    decision: Decision | None
    data: bytes | None = None
    context: object = None
    username: str | None = None  # the identity an allowing decision proved


class EnhancedAuthenticator(Protocol):
    methods: frozenset[str]  # the Authentication Methods it takes ("SCRAM-SHA-256")

    def claimed_user(self, method: str, data: bytes | None) -> str | None:
        """The user name a first Authentication Data claims (None if it names
        none), for the bans and rates checked before the exchange starts."""
        ...

    async def step(
        self, client: ClientInfo, method: str, data: bytes | None, context: object
    ) -> AuthAnswer:
        """The answer to the client's Authentication Data (`context` None: its
        first). The identity proved must be `client.username` when that is set
        (the CONNECT's User Name, or the one a re-authenticating client has);
        else 0x86. Never raises (a store that cannot answer: 0x88)."""
        ...


class Authenticator(Protocol):
    async def authenticate(self, client: ClientInfo, password: bytes | None) -> Decision:
        """May this client connect? Never raises: a backend that cannot answer
        says so with a refusal (0x88 server unavailable)."""
        ...


@runtime_checkable
class ClosingAuthenticator(Authenticator, Protocol):
    async def aclose(self) -> None:
        """The node stops: let go of what the backends hold (HTTP connections)."""
        ...


class Authorizer(Protocol):
    def allowed(self, client: ClientInfo, action: Action, topic: str, qos: int, retain: bool) -> (
        bool
    ):
        """May this client publish to / subscribe to `topic`?"""
        ...


@runtime_checkable
class ConnectionAuthorizer(Authorizer, Protocol):
    publish_checked: bool  # False: no publish can be refused now (the node need not ask)

    async def connected(self, client: ClientInfo) -> bool:
        """`client`'s CONNECT was accepted: fetch what deciding for it needs;
        False if it was known already. Never raises (a source that cannot
        answer gives no rules)."""
        ...

    def disconnected(self, client: ClientInfo) -> None:
        """`client`'s connection ended: forget what was kept for it."""
        ...

    def rule(self, client: ClientInfo, action: Action, topic: str, qos: int, retain: bool) -> str:
        """The rule that decides this check, in words (for the log line)."""
        ...

    def reload(self) -> bool:
        """Read the rules' source again (SIGHUP); False if the old rules were kept."""
        ...


class AllowAll:
    """Every client may connect, publish and subscribe (the default)."""

    async def authenticate(self, client: ClientInfo, password: bytes | None) -> Decision:
        return ALLOW

    def allowed(self, client: ClientInfo, action: Action, topic: str, qos: int, retain: bool) -> (
        bool
    ):
        return True
