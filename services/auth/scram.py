"""SCRAM-SHA-256 (RFC 5802, RFC 7677), the server side: credentials and messages.

Theory of operation. A user's SCRAM credentials are the salt, the iteration
count, StoredKey and ServerKey (`ScramCredentials`), never the password;
`ScramCredentials.encode` writes them as RFC 5803 (PostgreSQL) does:
`SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`, base64 each.
One exchange, as MQTT 5 enhanced authentication carries it (4.12):

    client-first  n,,n=user,r=cnonce            (CONNECT / AUTH 0x19)
    server-first  r=cnonce+snonce,s=salt,i=4096 (AUTH 0x18)
    client-final  c=biws,r=cnonce+snonce,p=proof (AUTH 0x18)
    server-final  v=signature                   (CONNACK 0x00 / AUTH 0x00)

`client_first` parses the first message (`ScramError` when it is not one:
channel binding and authorization identities other than the user are not
offered); `server_first` answers it, and its `Conversation` is what the
server keeps until `client_final` checks the proof: H(proof XOR
HMAC(StoredKey, AuthMessage)) must equal StoredKey (`hmac.compare_digest`).
A user nobody knows gets a made-up salt (HMAC of a secret the cluster shares,
`services.auth.scramkey`, and the name, so asking twice, through any worker
or node or after a restart, gives the same one) and the iteration count
every user made here gets (DEFAULT_ITERATIONS), and fails only at the
proof, as RFC 5802 5.1 advises: the exchange does not say which users exist.
Server nonces come from `secrets`. The standard library does all of it.
Passwords are prepared with a SASLprep subset (RFC 4013: non-ASCII spaces
to a space, "mapped to nothing" characters dropped, NFKC); ASCII passwords
are unchanged.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import stringprep
import unicodedata
from dataclasses import dataclass
from typing import Final

METHOD: Final = "SCRAM-SHA-256"
DEFAULT_ITERATIONS: Final = 4096  # RFC 7677's minimum; the cost is the client's, once a login
SALT_BYTES: Final = 16
NONCE_BYTES: Final = 18  # 24 base64url characters (RFC 5802 leaves the length to us)


class ScramError(ValueError):
    """A message or a stored credential that is not valid SCRAM; one line."""


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ScramError(f"{what} is not base64") from None


def saslprep(password: str) -> bytes:
    mapped = "".join(
        " " if stringprep.in_table_c12(ch) else ch
        for ch in password
        if not stringprep.in_table_b1(ch)
    )
    return unicodedata.normalize("NFKC", mapped).encode("utf-8")


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.digest(key, message, "sha256")


@dataclass(frozen=True, slots=True)
class ScramCredentials:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def from_password(
        cls, password: str, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None
    ) -> ScramCredentials:
        salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
        salted = hashlib.pbkdf2_hmac("sha256", saslprep(password), salt, iterations)
        client_key = _hmac(salted, b"Client Key")
        stored = hashlib.sha256(client_key).digest()
        return cls(salt, iterations, stored, _hmac(salted, b"Server Key"))

    def encode(self) -> str:
        return (
            f"{METHOD}${self.iterations}:{b64(self.salt)}"
            f"${b64(self.stored_key)}:{b64(self.server_key)}"
        )

    @classmethod
    def decode(cls, text: str) -> ScramCredentials:
        """Raises ScramError unless `text` is what `encode` writes."""
        method, _, rest = text.partition("$")
        counted, _, keys = rest.partition("$")
        iterations, _, salt = counted.partition(":")
        stored, _, server = keys.partition(":")
        if method != METHOD or not iterations.isdigit() or not (salt and stored and server):
            raise ScramError(f"expected {METHOD}$iterations:salt$StoredKey:ServerKey")
        creds = cls(unb64(salt, "salt"), int(iterations), unb64(stored, "StoredKey"),
                    unb64(server, "ServerKey"))  # fmt: skip
        if creds.iterations < 1 or len(creds.stored_key) != 32 or len(creds.server_key) != 32:
            raise ScramError("iterations must be positive and the keys 32 bytes")
        return creds


@dataclass(frozen=True, slots=True)
class ClientFirst:
    gs2_header: str  # "n,," (no channel binding, no authorization identity)
    user: str  # the user name, saslname unescaped (=2C is ',', =3D is '=')
    nonce: str
    bare: str  # the message without its gs2 header (part of AuthMessage)


@dataclass(frozen=True, slots=True)
class Conversation:
    """What the server keeps between its first message and the client's last."""

    client: ClientFirst
    server_first: str
    nonce: str  # the client's and the server's together
    credentials: ScramCredentials | None  # None: an unknown user, refused at the proof


def _text(data: bytes | None, what: str) -> str:
    try:
        text = (data or b"").decode("utf-8")
    except UnicodeDecodeError:
        raise ScramError(f"{what} is not UTF-8") from None
    if not text:
        raise ScramError(f"{what} is empty")
    return text


def _unescape(saslname: str) -> str:
    if saslname.replace("=2C", "").replace("=3D", "").count("="):
        raise ScramError("user name has '=' not escaped as =2C or =3D")
    return saslname.replace("=2C", ",").replace("=3D", "=")


def client_first(data: bytes | None) -> ClientFirst:
    """Parse a client-first-message; ScramError when it is not one we take."""
    text = _text(data, "client-first-message")
    flag, _, rest = text.partition(",")
    authzid, _, bare = rest.partition(",")
    if flag.startswith("p="):
        raise ScramError("channel binding (SCRAM-SHA-256-PLUS) is not offered")
    if flag not in ("n", "y") or (authzid and not authzid.startswith("a=")):
        raise ScramError("client-first-message has no gs2 header (n,,)")
    attributes = bare.split(",")
    if len(attributes) < 2 or attributes[0][:2] != "n=" or attributes[1][:2] != "r=":
        raise ScramError("client-first-message must start n=user,r=nonce")
    user, nonce = _unescape(attributes[0][2:]), attributes[1][2:]
    if not user or not nonce or not nonce.isprintable():
        raise ScramError("client-first-message has an empty user name or nonce")
    if authzid and _unescape(authzid[2:]) != user:
        raise ScramError("an authorization identity other than the user is not offered")
    return ClientFirst(f"{flag},{authzid},", user, nonce, bare)


def server_first(
    client: ClientFirst,
    credentials: ScramCredentials | None,
    mock_secret: bytes,
    server_nonce: str | None = None,
) -> Conversation:
    """The server-first-message for `client` (`credentials` None: an unknown
    user, whose salt is made from `mock_secret`, the cluster's)."""
    nonce = client.nonce + (server_nonce or secrets.token_urlsafe(NONCE_BYTES))
    if credentials is None:
        salt = _hmac(mock_secret, client.user.encode("utf-8"))[:SALT_BYTES]
        iterations = DEFAULT_ITERATIONS
    else:
        salt, iterations = credentials.salt, credentials.iterations
    message = f"r={nonce},s={b64(salt)},i={iterations}"
    return Conversation(client, message, nonce, credentials)


def client_final(conversation: Conversation, data: bytes | None) -> bytes | None:
    """The server-final-message when the client-final-message proves the
    password; None when it does not (or the user is unknown); ScramError
    when it is no client-final-message for this conversation."""
    text = _text(data, "client-final-message")
    without_proof, sep, proof = text.rpartition(",p=")
    attributes = without_proof.split(",")
    if not sep or len(attributes) < 2 or attributes[0][:2] != "c=" or attributes[1][:2] != "r=":
        raise ScramError("client-final-message must be c=...,r=...,p=proof")
    client = conversation.client
    if unb64(attributes[0][2:], "channel binding") != client.gs2_header.encode("utf-8"):
        raise ScramError("channel binding data differs from the gs2 header")
    if attributes[1][2:] != conversation.nonce:
        raise ScramError("nonce differs from the server's")
    client_proof = unb64(proof, "proof")
    credentials = conversation.credentials
    if credentials is None or len(client_proof) != len(credentials.stored_key):
        return None
    auth_message = f"{client.bare},{conversation.server_first},{without_proof}".encode()
    signature = _hmac(credentials.stored_key, auth_message)
    client_key = bytes(a ^ b for a, b in zip(client_proof, signature, strict=True))
    if not hmac.compare_digest(hashlib.sha256(client_key).digest(), credentials.stored_key):
        return None
    return f"v={b64(_hmac(credentials.server_key, auth_message))}".encode()
