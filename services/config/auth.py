"""Authentication settings: the chain of backends (`services.auth.chain`).

Theory of operation. The chain is a tuple of `AuthBackend`, in the order
the node asks them. It comes from two places, merged by `Settings` (`chain`):

- `[[auth]]` tables in the config file, in file order:

      [[auth]]
      backend = "jwt"               # password_file | redis | jwt | http
      jwks = "/etc/weir/jwks.json"  # or secret = "...", or public_key = "key.pem"
      username_claim = "sub"        # optional: must equal the CONNECT's user name
      clientid_claim = "cid"        # optional: must equal its client id
      [[auth]]
      backend = "password_file"
      path = "/etc/weir/passwd"
      [[auth]]
      backend = "redis"             # users in the node's Redis, weir:user:<name>
      [[auth]]
      backend = "http"
      url = "http://127.0.0.1:8991/auth"
      timeout_s = 5.0
      cache_s = 60.0                # allow answers remembered (0: never)
      on_error = "deny"             # deny (0x88) | ignore: when it cannot answer

- the shortcuts for the common cases (options of `Settings`, so flags,
  WEIR_* or the file's top level): `password_file`, `auth_redis`, one of
  `jwt_secret` / `jwt_public_key` / `jwt_jwks`, `auth_http`. Each appends
  its backend after the tables, in that order (cheap local checks before
  the network), unless a table already names the same backend with the
  same values (so building the chain twice gives the same chain).

A bad table (unknown backend or key, a missing or doubled key source, a bad
value) is a ValueError with one line; values are not echoed (secrets). Key
files and the password file are read when the node builds the chain
(`services.node.authn`), so a missing one also stops `weir up` with one line.
"""

from __future__ import annotations

import enum
from dataclasses import fields
from typing import Annotated, Final

from pydantic import Field, model_validator
from pydantic.dataclasses import dataclass

from services.config.declare import FROZEN, HttpUrl, Seconds, Text

HTTP_TIMEOUT_S: Final = 5.0  # seconds a CONNECT waits for the webhook (EMQX's request timeout)
HTTP_CACHE_S: Final = 60.0  # seconds a webhook's allow is remembered (a password changed at
#   the webhook is still let in for this long; a new one is never answered from the cache)


class AuthKind(enum.StrEnum):
    PASSWORD_FILE = "password_file"
    REDIS = "redis"
    JWT = "jwt"
    HTTP = "http"


class OnError(enum.StrEnum):  # a webhook that cannot answer: refuse 0x88, or ask the next
    DENY = "deny"
    IGNORE = "ignore"


BACKENDS: Final = tuple(AuthKind)

_KEYS: Final[dict[str, tuple[str, ...]]] = {  # what each backend's table may hold
    "password_file": ("path",),
    "redis": (),
    "jwt": ("secret", "public_key", "jwks", "username_claim", "clientid_claim"),
    "http": ("url", "timeout_s", "cache_s", "on_error"),
}
_NEEDS: Final[dict[str, tuple[str, ...]]] = {  # exactly one of these is required
    "password_file": ("path",),
    "jwt": ("secret", "public_key", "jwks"),
    "http": ("url",),
}
_NAMES: Final = {"password_file": "the password file", "redis": "the users in Redis",
                 "jwt": "JWT", "http": "the webhook"}  # fmt: skip


@dataclass(frozen=True, slots=True, config=FROZEN)
class AuthBackend:
    """One backend of the authentication chain: an [[auth]] table, or a shortcut."""

    backend: AuthKind
    path: Text | None = None  # password_file: the file
    url: HttpUrl | None = None  # http: the webhook
    timeout_s: Annotated[Seconds, Field(ge=0.001)] = HTTP_TIMEOUT_S
    cache_s: Annotated[Seconds, Field(ge=0.0)] = HTTP_CACHE_S
    on_error: OnError = OnError.DENY
    secret: Text | None = None  # jwt: HMAC secret (HS256/384/512)
    public_key: Text | None = None  # jwt: PEM file of an RSA / EC / Ed25519 public key
    jwks: Text | None = None  # jwt: JWKS file
    username_claim: Text | None = None  # jwt: this claim must equal the user name
    clientid_claim: Text | None = None  # jwt: this claim must equal the client id

    @model_validator(mode="after")
    def _keys_of_its_backend(self) -> AuthBackend:
        given = [f.name for f in fields(self) if f.name != "backend"
                 and getattr(self, f.name) != f.default]  # fmt: skip
        unknown = [key for key in given if key not in _KEYS[self.backend]]
        if unknown:
            raise ValueError(f"({self.backend}): unknown key {unknown[0]!r}")
        needs = _NEEDS.get(self.backend, ())
        if needs and sum(key in given for key in needs) != 1:
            raise ValueError(f"({self.backend}): give one of {', '.join(needs)}")
        return self

    def describe(self) -> str:
        where = self.path or self.url or self.public_key or self.jwks
        where = where or ("(HMAC secret)" if self.secret else "")
        return f"{_NAMES[self.backend]} {where}".strip()


def chain(
    tables: tuple[AuthBackend, ...],
    password_file: str | None,
    auth_redis: bool,
    jwt: dict[str, str],
    auth_http: str | None,
) -> tuple[AuthBackend, ...]:
    """The tables, then the shortcuts that no table already names."""
    if len(jwt) > 1:
        raise ValueError("give one of jwt_secret, jwt_public_key, jwt_jwks (--jwt-...)")
    shortcuts = []
    if password_file:
        shortcuts.append(AuthBackend(AuthKind.PASSWORD_FILE, path=password_file))
    if auth_redis:
        shortcuts.append(AuthBackend(AuthKind.REDIS))
    if jwt:
        (key, value), = jwt.items()
        shortcuts.append(AuthBackend(AuthKind.JWT, **{key: value}))  # type: ignore[arg-type]
    if auth_http:
        shortcuts.append(AuthBackend(AuthKind.HTTP, url=auth_http))
    return tables + tuple(b for b in shortcuts if b not in tables)
