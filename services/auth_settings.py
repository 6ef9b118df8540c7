"""Authentication settings: the chain of backends, read by `services.settings`.

Theory of operation. The authentication chain (`services.auth.chain`) is a
tuple of `AuthBackend`, in the order the node asks them. It comes from two
places, merged here (`chain`):

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

- the shortcuts for the common cases, from the command line, WEIR_* or the
  file's top level: `password_file`, `auth_redis`, one of `jwt_secret` /
  `jwt_public_key` / `jwt_jwks`, `auth_http`. Each appends its backend
  after the tables, in that order (cheap local checks before the network),
  unless a table already names the same backend with the same values.

A bad table (unknown backend or key, a missing or doubled key source, a bad
value) is a `ValueError` with one line, which the settings module turns
into its SettingsError; values are not echoed (secrets). Key files and the
password file are read when the node builds the chain (`services.node.authn`),
so a missing one also stops `weir up` with one line.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

BACKENDS: Final = ("password_file", "redis", "jwt", "http")
ON_ERROR: Final = ("deny", "ignore")  # a webhook that cannot answer: refuse 0x88, or ask the next
HTTP_TIMEOUT_S: Final = 5.0  # seconds a CONNECT waits for the webhook (EMQX's request timeout)
HTTP_CACHE_S: Final = 60.0  # seconds a webhook's allow is remembered (a password changed at
#   the webhook is still let in for this long; a new one is never answered from the cache)
ENV_VARS: Final = frozenset(
    {"WEIR_AUTH_REDIS", "WEIR_AUTH_HTTP", "WEIR_JWT_SECRET", "WEIR_JWT_PUBLIC_KEY", "WEIR_JWT_JWKS"}
)


@dataclass(frozen=True, slots=True)
class AuthBackend:
    """One backend of the authentication chain: an [[auth]] table, or a shortcut."""

    backend: str  # one of BACKENDS
    path: str | None = None  # password_file: the file
    url: str | None = None  # http: the webhook
    timeout_s: float = HTTP_TIMEOUT_S
    cache_s: float = HTTP_CACHE_S
    on_error: str = "deny"
    secret: str | None = None  # jwt: HMAC secret (HS256/384/512)
    public_key: str | None = None  # jwt: PEM file of an RSA / EC / Ed25519 public key
    jwks: str | None = None  # jwt: JWKS file
    username_claim: str | None = None  # jwt: this claim must equal the user name
    clientid_claim: str | None = None  # jwt: this claim must equal the client id

    def describe(self) -> str:
        where = self.path or self.url or self.public_key or self.jwks
        where = where or ("(HMAC secret)" if self.secret else "")
        return f"{_NAMES[self.backend]} {where}".strip()


_NAMES: Final = {"password_file": "the password file", "redis": "the users in Redis",
                 "jwt": "JWT", "http": "the webhook"}  # fmt: skip


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


def text(raw: Any) -> str:
    if not isinstance(raw, str) or not raw:
        raise ValueError("expected a non-empty string")
    return raw


def http_url(raw: Any) -> str:
    if not text(raw).startswith(("http://", "https://")):
        raise ValueError("expected an http:// or https:// URL")
    return str(raw)


def _seconds(low: float) -> Callable[[Any], float]:
    def convert(raw: Any) -> float:
        if isinstance(raw, bool) or float(raw) < low:
            raise ValueError(f"expected a number of seconds >= {low:g}")
        return float(raw)

    return convert


def _on_error(raw: Any) -> str:
    if raw not in ON_ERROR:
        raise ValueError(f"expected one of {', '.join(ON_ERROR)}")
    return str(raw)


_CONVERT: Final[dict[str, Callable[[Any], Any]]] = {
    "url": http_url,
    "timeout_s": _seconds(0.001),
    "cache_s": _seconds(0.0),
    "on_error": _on_error,
}


def tables(raw: Any) -> tuple[AuthBackend, ...]:
    """The config file's [[auth]] tables, checked."""
    if not isinstance(raw, list):
        raise ValueError("expected [[auth]] tables")
    return tuple(_table(number, table) for number, table in enumerate(raw, start=1))


def _table(number: int, table: Any) -> AuthBackend:
    kind = table.get("backend") if isinstance(table, Mapping) else None
    if kind not in _KEYS:
        raise ValueError(f"[[auth]] {number}: backend must be one of {', '.join(BACKENDS)}")
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key == "backend":
            continue
        if key not in _KEYS[kind]:
            raise ValueError(f"[[auth]] {number} ({kind}): unknown key {key!r}")
        convert: Callable[[Any], Any] = _CONVERT.get(str(key), text)
        try:
            values[key] = convert(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"[[auth]] {number} ({kind}) {key}: {exc}") from None
    needs = _NEEDS.get(kind, ())
    if needs and sum(key in values for key in needs) != 1:
        raise ValueError(f"[[auth]] {number} ({kind}): give one of {', '.join(needs)}")
    return AuthBackend(kind, **values)


def chain(top: dict[str, Any]) -> tuple[AuthBackend, ...]:
    """The chain from the top-level settings `top`: its `auth` tables, then
    the shortcuts (popped from `top`: they are not fields of Settings)."""
    jwt = [(k, top.pop(f"jwt_{k}")) for k in ("secret", "public_key", "jwks") if f"jwt_{k}" in top]
    if len(jwt) > 1:
        raise ValueError("give one of jwt_secret, jwt_public_key, jwt_jwks (--jwt-...)")
    shortcuts = []
    if top.get("password_file"):
        shortcuts.append(AuthBackend("password_file", path=top["password_file"]))
    if top.pop("auth_redis", False):
        shortcuts.append(AuthBackend("redis"))
    if jwt:
        shortcuts.append(AuthBackend("jwt", **dict(jwt)))
    if "auth_http" in top:
        shortcuts.append(AuthBackend("http", url=top.pop("auth_http")))
    configured: tuple[AuthBackend, ...] = top.get("auth", ())
    return configured + tuple(b for b in shortcuts if b not in configured)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`weir up`'s authentication shortcuts (appended to the [[auth]] chain in this order)."""
    add = parser.add_argument
    add("--password-file", dest="password_file",
        help="authenticate clients against this file of argon2id hashes (weir passwd)")  # fmt: skip
    add("--auth-redis", dest="auth_redis", action="store_const", const=True,
        help="authenticate users kept in Redis (hash weir:user:<name>, field password_hash; "
        "weir passwd --redis URL USER)")  # fmt: skip
    add("--jwt-secret", dest="jwt_secret",
        help="authenticate JWTs (in the password field) signed with this HMAC secret "
        "(HS256/384/512; WEIR_JWT_SECRET keeps it off the command line)")  # fmt: skip
    add("--jwt-public-key", dest="jwt_public_key",
        help="authenticate JWTs signed with this PEM public key (RS*/PS*/ES*/EdDSA)")  # fmt: skip
    add("--jwt-jwks", dest="jwt_jwks", help="authenticate JWTs signed with a key of this "
        "JWKS file (picked by kid; reread when it changes)")  # fmt: skip
    add("--auth-http", dest="auth_http", metavar="URL",
        help="ask this webhook (POST JSON clientid, username, password, peer; answer "
        '{"result": "allow"|"deny"|"ignore"}); [[auth]] sets its timeout, cache')  # fmt: skip
