"""JWT authentication: HMAC, RSA and EC public keys, a JWKS file; exp required and
checked, username / client id claims; tokens that are not JWTs fall through.
Unit cases on the backend, then paho 3.1.1 and 5.0 over real sockets."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from services.auth.api import ClientInfo
from services.auth.jwtauth import Jwt, JwtError
from services.auth.passwd import PasswordFile
from tests.auth.chainnode import ALLOWED, BAD, chain_node, refusal_lines
from tests.auth.test_password_file import add

SECRET = "s3cret-hmac-key-" + "k" * 48  # 64 bytes: long enough for HS512


def token(key: Any = SECRET, alg: str = "HS256", ttl: float = 60.0, **claims: Any) -> str:
    body = {"exp": int(time.time() + ttl), **claims}
    if body["exp"] is None:
        del body["exp"]
    headers = {"kid": claims.pop("kid")} if "kid" in claims else None
    body.pop("kid", None)
    return jwt.encode(body, key, algorithm=alg, headers=headers)


def check(backend: Jwt, password: str | bytes | None, user: str | None = "u1",
          client_id: str = "c1") -> tuple[bool, int, str] | None:  # fmt: skip
    raw = password.encode() if isinstance(password, str) else password
    d = asyncio.run(backend.check(ClientInfo(client_id, user, "127.0.0.1:9", 5), raw))
    return None if d is None else (d.ok, d.reason_code, d.by)


def test_hmac_good_bad_expired_missing_exp() -> None:
    backend = Jwt(secret=SECRET)
    assert check(backend, token()) == (True, 0, "")
    assert check(backend, token(key="another-" + "k" * 56))[:2] == (False, 0x86)
    expired = check(backend, token(ttl=-5))
    assert expired == (False, 0x86, "jwt: expired")
    no_exp = check(backend, token(exp=None))
    assert no_exp is not None and no_exp[:2] == (False, 0x86) and "exp" in no_exp[2]
    for alg in ("HS384", "HS512"):
        assert check(backend, token(alg=alg))[:2] == (True, 0)


def test_what_is_not_a_jwt_is_ignored() -> None:
    backend = Jwt(secret=SECRET)
    for password in (None, "plain password", "a.b.c", b"\xff.\xfe.\xfd"):
        assert check(backend, password) is None, password


def test_claims_must_equal_the_username_and_client_id() -> None:
    backend = Jwt(secret=SECRET, username_claim="sub", clientid_claim="cid")
    good = token(sub="u1", cid="c1")
    assert check(backend, good)[:2] == (True, 0)
    assert check(backend, good, user="u2") == (False, 0x86, "jwt: claim 'sub' is not the username")
    assert check(backend, good, client_id="c2")[2] == "jwt: claim 'cid' is not the clientid"
    assert check(backend, good, user=None)[:2] == (False, 0x86)
    assert check(backend, token(cid="c1"))[:2] == (False, 0x86), "a missing claim"


def _pem(key: Any, tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    path.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    return str(path)


def test_rsa_and_ec_public_keys_and_no_algorithm_confusion(tmp_path: Path) -> None:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    by_rsa = Jwt(public_key=_pem(rsa_key, tmp_path, "rsa.pem"))
    by_ec = Jwt(public_key=_pem(ec_key, tmp_path, "ec.pem"))
    assert check(by_rsa, token(rsa_key, "RS256"))[:2] == (True, 0)
    assert check(by_rsa, token(rsa_key, "PS384"))[:2] == (True, 0)
    assert check(by_ec, token(ec_key, "ES256"))[:2] == (True, 0)
    assert check(by_ec, token(rsa_key, "RS256"))[:2] == (False, 0x86)
    assert check(by_rsa, token(rsa_key, "RS256", ttl=-1)) == (False, 0x86, "jwt: expired")
    # An HMAC token keyed with the public key's PEM text (PyJWT refuses to make
    # one, so it is made by hand) and an unsigned "none" token must not pass.
    pem = (tmp_path / "rsa.pem").read_bytes()

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps({"exp": int(time.time()) + 60}).encode())
    sig = b64(hmac.new(pem, f"{head}.{body}".encode(), hashlib.sha256).digest())
    forged = f"{head}.{body}.{sig}"
    assert check(by_rsa, forged)[:2] == (False, 0x86)
    none_alg = f"{b64(json.dumps({'alg': 'none'}).encode())}.{body}."
    assert check(by_rsa, none_alg)[:2] == (False, 0x86)


def test_jwks_picks_by_kid_and_is_reread_when_it_changes(tmp_path: Path) -> None:
    k1 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    k2 = ec.generate_private_key(ec.SECP384R1())

    def jwk(key: Any, kid: str) -> dict[str, Any]:
        algo = jwt.algorithms.RSAAlgorithm if isinstance(key, rsa.RSAPrivateKey) else (
            jwt.algorithms.ECAlgorithm)  # fmt: skip
        data: dict[str, Any] = json.loads(algo.to_jwk(key.public_key()))
        return {**data, "kid": kid}

    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [jwk(k1, "one")]}))
    backend = Jwt(jwks=str(path))
    assert backend.jwks is not None
    backend.jwks.check_s = 0.0
    assert check(backend, token(k1, "RS256", kid="one"))[:2] == (True, 0)
    assert check(backend, token(k1, "RS256"))[:2] == (True, 0), "no kid: every key is tried"
    unknown = check(backend, token(k2, "ES384", kid="two"))
    assert unknown == (False, 0x86, "jwt: no key with kid 'two'")
    path.write_text(json.dumps({"keys": [jwk(k1, "one"), jwk(k2, "two")]}))
    os.utime(path, (1, 1))
    assert check(backend, token(k2, "ES384", kid="two"))[:2] == (True, 0), "rotation"
    path.write_text("not json")
    os.utime(path, (2, 2))
    assert check(backend, token(k2, "ES384", kid="two"))[:2] == (True, 0), "bad file: kept"


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({}, "give a secret"),
        ({"public_key": "/nonexistent.pem"}, "/nonexistent.pem"),
        ({"jwks": "/nonexistent.json"}, "/nonexistent.json"),
    ],
)
def test_unusable_keys_are_one_line_errors(kwargs: dict[str, str], words: str) -> None:
    with pytest.raises(JwtError, match=words) as info:
        Jwt(**kwargs)
    assert "\n" not in str(info.value)


def test_a_non_key_pem_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.pem"
    path.write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    with pytest.raises(JwtError, match="not a PEM public key"):
        Jwt(public_key=str(path))


@pytest.mark.parametrize("v5", [False, True])
def test_jwt_then_password_file_over_sockets(
    v5: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A good token connects, an expired or forged one gets 0x86 (logged with
    why); a plain password is not a JWT and falls through to the password file."""
    path = tmp_path / "passwd"
    add(path, "alice", "right")
    caplog.set_level(logging.WARNING, logger="weir.auth")
    backend = Jwt(secret=SECRET, username_claim="sub")
    with chain_node([backend, PasswordFile(path)]) as node:
        assert node.connect(v5, "dev1", token(sub="dev1")) == ALLOWED
        assert node.connect(v5, "dev1", token(sub="dev1", ttl=-10)) == BAD
        assert node.connect(v5, "dev1", token(key="x" * 32, sub="dev1")) == BAD
        assert node.connect(v5, "dev2", token(sub="dev1")) == BAD
        assert node.connect(v5, "alice", "right") == ALLOWED
        assert node.denied() == 3
    lines = refusal_lines(caplog)
    assert [line.rpartition("by ")[2] for line in lines] == [
        "jwt: expired",
        "jwt: Signature verification failed",
        "jwt: claim 'sub' is not the username",
    ]
