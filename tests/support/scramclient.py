"""A SCRAM-SHA-256 client (RFC 5802, RFC 7677) written from the RFCs for the tests,
independently of services/auth/scram.py, and helpers that drive MQTT 5
enhanced authentication over a `Raw` socket client."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import TYPE_CHECKING, Any

from services.mqtt.packets import Auth, Connack, Connect, Packet, Properties

if TYPE_CHECKING:
    from tests.integration.rawclient import Raw

METHOD = "SCRAM-SHA-256"


def _h(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


class ScramClient:
    def __init__(self, user: str, password: str, nonce: str | None = None) -> None:
        self.user = user
        self.password = password
        self.nonce = nonce or secrets.token_urlsafe(18)
        self.server_signature = b""

    def first(self) -> bytes:
        name = self.user.replace("=", "=3D").replace(",", "=2C")
        self.bare = f"n={name},r={self.nonce}"
        return f"n,,{self.bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode()
        fields = dict(item.split("=", 1) for item in text.split(","))
        assert fields["r"].startswith(self.nonce) and len(fields["r"]) > len(self.nonce)
        salted = hashlib.pbkdf2_hmac(
            "sha256",
            self.password.encode(),
            base64.b64decode(fields["s"]),
            int(fields["i"]),
        )
        client_key = _h(salted, b"Client Key")
        without_proof = f"c=biws,r={fields['r']}"
        auth_message = f"{self.bare},{text},{without_proof}".encode()
        signature = _h(hashlib.sha256(client_key).digest(), auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self.server_signature = _h(_h(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verified(self, server_final: bytes | None) -> bool:
        return server_final == b"v=" + base64.b64encode(self.server_signature)


def props(data: bytes | None, method: str = METHOD) -> Properties:
    return Properties(authentication_method=method, authentication_data=data)


def auth(code: int, data: bytes | None, method: str = METHOD) -> Auth:
    return Auth(code, props(data, method))


def scram_connect(raw: Raw, client_id: str, client: ScramClient, **kw: Any) -> Packet:
    """CONNECT with SCRAM over `raw` (tests.integration.rawclient.Raw), answer the
    server's challenge; the broker's last packet (CONNACK or a refusal)."""
    raw.send(Connect(client_id, protocol_level=5, properties=props(client.first()), **kw))
    challenge = raw.recv()
    if not isinstance(challenge, Auth):
        return challenge
    assert challenge.reason_code == 0x18, challenge
    raw.send(auth(0x18, client.final(challenge.properties.authentication_data or b"")))
    ack = raw.recv()
    assert isinstance(ack, Connack), ack
    return ack
