"""The authentication chain: ordered backends, each answering allow, deny or ignore.

Theory of operation (EMQX's authentication chain). `Chain.authenticate`
asks its backends in their configured order; each answers with a
`Decision` (allow, or deny with its reason code) or None ("ignore": not
mine to decide, e.g. a user name it does not know, a password that is not
a JWT). The first allow or deny decides, and the rest are not asked. When
every backend ignored the CONNECT, the anonymous rules decide:
- no user name: allowed with `allow_anonymous` (the client's listener's own
  setting where it has one, else the node's), else 0x87 not authorized
  (3.1.1: 5), as Mosquitto 2 does once any authentication is configured;
- a user name no backend knows: 0x86 bad user name or password (3.1.1: 4);
  with no backend at all (`services.node.authn`: no authentication is
  configured, but a listener refuses anonymous clients) a user name counts
  for nothing, and the client is anonymous where that is allowed.
A client whose verified TLS certificate named its user (`cert_named`, a
listener with `cert_username`) is authenticated by that certificate, as
Mosquitto's `use_identity_as_username`: no backend is asked.
Every decision names who gave it (`Decision.by`: the backend's name, with
its reason when it gave one, or "anonymous rules"), which the node puts in
the one log line of a refusal. Backends never raise: one that cannot
answer refuses (0x88) or ignores, as its own rules say. With no backend and
no listener refusing anonymous clients the node runs `AllowAll` instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Final, Protocol, runtime_checkable

from services.auth.api import ALLOW, ClientInfo, Decision
from services.auth.cache import Verdict

ANONYMOUS: Final = "anonymous rules"
NOT_AUTHORIZED: Final = Decision(False, 0x87, ANONYMOUS)
UNKNOWN_USER: Final = Decision(False, 0x86, f"{ANONYMOUS}: no backend knows the user")
CERTIFICATE: Final = Decision(True, 0, "client certificate")


class Backend(Protocol):
    name: str  # for the log line and `weir up`'s start message

    async def check(self, client: ClientInfo, password: bytes | None) -> Verdict:
        """Allow, deny (a reason code) or None to ignore. Never raises."""
        ...


@runtime_checkable
class ClosingBackend(Backend, Protocol):
    async def aclose(self) -> None: ...


class Chain:
    def __init__(
        self,
        backends: Sequence[Backend],
        allow_anonymous: bool = False,
        listeners: Mapping[str, bool] | None = None,  # listener name -> its allow_anonymous
    ) -> None:
        self.backends = tuple(backends)
        self.allow_anonymous = allow_anonymous
        self.listeners = dict(listeners or {})
        self._anonymous = replace(ALLOW, by=ANONYMOUS)

    async def authenticate(self, client: ClientInfo, password: bytes | None) -> Decision:
        if client.cert_named:
            return CERTIFICATE
        for backend in self.backends:
            verdict = await backend.check(client, password)
            if verdict is not None:
                return verdict if verdict.by else replace(verdict, by=backend.name)
        anonymous = self.listeners.get(client.listener, self.allow_anonymous)
        if client.username is not None and (self.backends or not anonymous):
            return UNKNOWN_USER
        return self._anonymous if anonymous else NOT_AUTHORIZED

    async def aclose(self) -> None:
        for backend in self.backends:
            if isinstance(backend, ClosingBackend):
                await backend.aclose()
