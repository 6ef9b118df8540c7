"""Who gets in on a listener: `allow_anonymous = false` on a listener with no
authentication configured (only its certificate-named clients; the other
listeners as before), and a verified certificate that names the user as the
authentication itself beside a password chain (Mosquitto's
use_identity_as_username), with paho 3.1.1 and 5.0 clients over TLS."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from services.auth.passwd import set_user
from services.config.auth import AuthBackend
from services.config.listeners import tables
from services.node.app import seams_for
from tests.integration.conftest import NodeRunner, Paho, node_settings
from tests.listeners.conftest import Pki, clients_on, port, tls_table

V5 = pytest.mark.parametrize("v5", [False, True], ids=["3.1.1", "5.0"])
REFUSED = "Not authorized"  # paho names 3.1.1's return code 5 so too
BAD_USER = "Bad user name or password"  # 3.1.1: 4
OK = "Success"


def code(rc: Any) -> str:
    return str(rc.getName())


def start(listener_node: Any, *raw: dict[str, Any], **fields: Any) -> NodeRunner:
    """A node whose seams come from the same settings as its listeners."""
    base = node_settings()
    settings = replace(base, listeners=replace(base.listeners, tables=tables(list(raw))), **fields)
    node: NodeRunner = listener_node(*raw, seams=seams_for(settings), **fields)
    return node


@V5
def test_a_listener_refusing_anonymous_clients_without_any_backend(
    listener_node: Any, pki: Pki, clients: list[Paho], v5: bool
) -> None:
    closed = {"name": "closed", "type": "tcp", "port": 0, "allow_anonymous": False}
    certs = tls_table(
        pki, "certs", cafile=pki.cafile, verify="optional", cert_username="cn",
        allow_anonymous=False,
    )  # fmt: skip
    node = start(listener_node, closed, certs)
    anonymous = Paho(port(node, "closed"), "anon", v5=v5)
    named = Paho(port(node, "closed"), "named", v5=v5, username="alice", password="x")
    no_cert = Paho(port(node, "certs"), "no-cert", v5=v5, tls=pki.client())
    with_cert = Paho(port(node, "certs"), "with-cert", v5=v5, tls=pki.client("carol"))
    open_anon = Paho(node.mqtt_port, "open-anon", v5=v5)
    open_named = Paho(node.mqtt_port, "open-named", v5=v5, username="anyone", password="y")
    clients += [anonymous, named, no_cert, with_cert, open_anon, open_named]
    assert code(anonymous.connack()[1]) == REFUSED
    assert code(named.connack()[1]) == BAD_USER  # nothing can check a password there
    assert code(no_cert.connack()[1]) == REFUSED
    assert code(with_cert.connack()[1]) == OK
    # the default listener lets everyone in, as it did
    assert code(open_anon.connack()[1]) == OK and code(open_named.connack()[1]) == OK
    seen = clients_on(node)
    assert seen["with-cert"].username == "carol" and seen["with-cert"].cert_named
    assert set(seen) == {"with-cert", "open-anon", "open-named"}


@V5
def test_a_certificate_naming_the_user_is_its_authentication_beside_a_password_chain(
    listener_node: Any, pki: Pki, clients: list[Paho], tmp_path: Path, v5: bool
) -> None:
    passwd = tmp_path / "passwd"
    set_user(passwd, "bob", "bob-secret")
    certs = tls_table(pki, "certs", cafile=pki.cafile, verify="optional", cert_username="cn")
    chain = (AuthBackend("password_file", path=str(passwd)),)
    node = start(listener_node, certs, auth=chain, allow_anonymous=False)
    tls = port(node, "certs")
    carol = Paho(tls, "carol-device", v5=v5, tls=pki.client("carol"))  # no password at all
    bob = Paho(tls, "bob-device", v5=v5, tls=pki.client(), username="bob", password="bob-secret")
    liar = Paho(tls, "liar", v5=v5, tls=pki.client(), username="bob", password="wrong")
    stranger = Paho(tls, "stranger", v5=v5, tls=pki.client(), username="carol", password="x")
    anonymous = Paho(tls, "anonymous", v5=v5, tls=pki.client())
    clients += [carol, bob, liar, stranger, anonymous]
    assert code(carol.connack()[1]) == OK
    assert code(bob.connack()[1]) == OK  # no certificate: the chain decides, as before
    assert code(liar.connack()[1]) == BAD_USER
    assert code(stranger.connack()[1]) == BAD_USER  # carol's name without carol's certificate
    assert code(anonymous.connack()[1]) == REFUSED
    seen = clients_on(node)
    assert seen["carol-device"].username == "carol" and seen["carol-device"].cert_named
    assert seen["bob-device"].username == "bob" and not seen["bob-device"].cert_named
