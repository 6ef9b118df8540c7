"""JWT authentication: the CONNECT's password field carries a signed token (PyJWT).

Theory of operation. `Jwt.check` is a backend of the authentication chain:
- a password that is not a JWT (no three dot-separated parts with a JSON
  header; or no password) is not this backend's: "ignore", so a password
  file or webhook later in the chain can take it;
- a JWT is decided here: it is let in only if its signature verifies with a
  configured key, it carries `exp` and has not expired (no leeway; `nbf`
  and `iat` are checked when present), and each configured claim equals the
  CONNECT's value (`username_claim` the user name, `clientid_claim` the
  client id); anything else is refused with 0x86 bad user name or password
  (3.1.1: 4), the decision naming why (expired, bad signature, claim).
Keys: an HMAC secret (HS256/384/512), a public key PEM file (RSA: RS*/PS*,
EC: the ES* of its curve, Ed25519: EdDSA), or a JWKS file (a key is picked
by the token's `kid`; without one each key is tried). The algorithms a key
accepts come from the key, never from the token, so a token cannot choose
"none" or HMAC with a public key. Key files are read at start (a bad one
stops `weir up` with one line) and the JWKS file again when it changes
(key rotation); a JWKS that became bad keeps the keys read before.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from services.auth.api import ALLOW, ClientInfo, Decision
from services.auth.cache import Verdict
from services.auth.watched import Watched

log = logging.getLogger("weir.auth")

HMAC: Final = ("HS256", "HS384", "HS512")
RSA: Final = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
EC_CURVES: Final = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}
REFUSED: Final = 0x86

Key = tuple[Any, tuple[str, ...]]  # a verification key and the algorithms it accepts


class JwtError(Exception):
    """A key, key file or JWKS cannot be used; the message is one line."""


def _pem_key(path: Path) -> Key:
    try:
        key = load_pem_public_key(path.read_bytes())
    except OSError as exc:
        raise JwtError(f"jwt public key {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise JwtError(f"jwt public key {path}: not a PEM public key ({exc})") from None
    if isinstance(key, rsa.RSAPublicKey):
        return key, RSA
    if isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name in EC_CURVES:
        return key, (EC_CURVES[key.curve.name],)
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key, ("EdDSA",)
    raise JwtError(f"jwt public key {path}: {type(key).__name__} is not RSA, EC P-256/384/521"
                   " or Ed25519")  # fmt: skip


def _jwks(path: Path) -> dict[str | None, list[Key]]:
    """The keys of a JWKS file by key id (None: keys without one)."""
    try:
        keys = jwt.PyJWKSet.from_dict(json.loads(path.read_text(encoding="utf-8"))).keys
    except OSError as exc:
        raise JwtError(f"jwt jwks {path}: {exc.strerror or exc}") from None
    except (ValueError, jwt.PyJWKError, jwt.PyJWKSetError, AttributeError, TypeError) as exc:
        raise JwtError(f"jwt jwks {path}: not a usable JWKS ({exc})") from None
    by_kid: dict[str | None, list[Key]] = {}
    for key in keys:
        given = key._jwk_data.get("alg")  # an "alg" in the JWK pins it; else by the key's type
        family = {"RSA": RSA, "oct": HMAC}.get(key.key_type or "", (key.algorithm_name,))
        by_kid.setdefault(key.key_id, []).append((key.key, (given,) if given else family))
    return by_kid


class Jwt:
    name = "jwt"

    def __init__(
        self,
        *,
        secret: str | None = None,
        public_key: str | None = None,
        jwks: str | None = None,
        username_claim: str | None = None,
        clientid_claim: str | None = None,
    ) -> None:
        self.claims = {c: what for c, what in ((username_claim, "username"),
                       (clientid_claim, "clientid")) if c is not None}  # fmt: skip
        self.jwks: Watched | None = None
        self.keys: dict[str | None, list[Key]] = {}
        if secret is not None:
            self.keys[None] = [(secret.encode(), HMAC)]
        if public_key is not None:
            self.keys[None] = [_pem_key(Path(public_key))]
        if jwks is not None:
            self.jwks = Watched(Path(jwks))
            self.keys = _jwks(self.jwks.path)
        if not self.keys:
            raise JwtError("jwt: give a secret, a public key file or a JWKS file")

    def _maybe_reload(self) -> None:
        if self.jwks is None or not self.jwks.changed():
            return
        try:
            self.keys = _jwks(self.jwks.path)
        except JwtError as exc:
            log.warning("%s; keeping the keys read before", exc)
            return
        log.info("jwt jwks %s reloaded: %d keys", self.jwks.path,
                 sum(map(len, self.keys.values())))  # fmt: skip

    async def check(self, client: ClientInfo, password: bytes | None) -> Verdict:
        if password is None or password.count(b".") != 2:
            return None
        try:
            token = password.decode("ascii")
            header = jwt.get_unverified_header(token)
        except (UnicodeDecodeError, jwt.DecodeError):
            return None
        self._maybe_reload()
        kid = header.get("kid")
        keys = self.keys.get(kid, []) if kid is not None else _every(self.keys.values())
        if not keys:
            return self._refuse(f"no key with kid {kid!r}")
        why = ""
        for key, algorithms in keys:
            try:
                claims = jwt.decode(token, key, algorithms=list(algorithms),
                                    options={"require": ["exp"]})  # fmt: skip
            except jwt.ExpiredSignatureError:
                return self._refuse("expired")
            except jwt.InvalidTokenError as exc:
                why = str(exc) or type(exc).__name__
                continue
            return self._claims_match(claims, client)
        return self._refuse(why)

    def _claims_match(self, claims: dict[str, Any], client: ClientInfo) -> Decision:
        values = {"username": client.username, "clientid": client.client_id}
        for claim, what in self.claims.items():
            if values[what] is None or claims.get(claim) != values[what]:
                return self._refuse(f"claim {claim!r} is not the {what}")
        return ALLOW

    def _refuse(self, why: str) -> Decision:
        return Decision(False, REFUSED, f"{self.name}: {why}")


def _every(groups: Iterable[list[Key]]) -> list[Key]:
    return [key for group in groups for key in group]
