"""TLS listeners with paho 3.1.1 and 5.0 clients: the server verified with the
test CA, client certificates none / optional / required, the CN as the user
name (the ACL sees it), TLS 1.1 refused, a failed handshake closing only its
own connection."""

from __future__ import annotations

import socket
import ssl
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import trustme

from services.mqtt import codec
from services.mqtt.packets import Connect
from tests.integration.conftest import NodeRunner, Paho
from tests.listeners.conftest import Pki, clients_on, listener, port, tls_table, wait_for

Start = Callable[..., NodeRunner]


def round_trip(
    clients: list[Paho], port_no: int, tls: ssl.SSLContext | None, v5: bool, tag: str
) -> None:
    sub = Paho(port_no, f"sub-{tag}", v5=v5, tls=tls)
    pub = Paho(port_no, f"pub-{tag}", v5=v5, tls=tls)
    clients += [sub, pub]
    assert sub.connack()[1] == 0 and pub.connack()[1] == 0
    sub.subscribe(f"t/{tag}", qos=1)
    pub.publish(f"t/{tag}", b"over tls", qos=1)
    assert sub.message().payload == b"over tls"


def no_connack(port_no: int, context: ssl.SSLContext) -> str:
    """Open a TLS connection and send a CONNECT: how it ended without a CONNACK."""
    with socket.create_connection(("127.0.0.1", port_no), timeout=5) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.sendall(codec.encode(Connect(client_id="x", protocol_level=4), 4))
                data = tls.recv(16)
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as exc:
            return f"refused: {exc!r}"
    assert data == b"", f"the server answered {data!r}"
    return "closed"


@pytest.mark.parametrize("v5", [False, True], ids=["3.1.1", "5.0"])
def test_paho_over_tls_verifies_the_server_and_round_trips(
    listener_node: Start, pki: Pki, clients: list[Paho], v5: bool
) -> None:
    node = listener_node(tls_table(pki, "secure"))
    round_trip(clients, port(node, "secure"), pki.client(), v5, "tls")
    seen = clients_on(node)
    assert seen["sub-tls"].listener == "secure" and seen["sub-tls"].cert_subject is None
    # the plain default listener is still there beside it
    round_trip(clients, node.mqtt_port, None, v5, "plain")
    assert clients_on(node)["sub-plain"].listener == "mqtt"


def test_a_client_that_does_not_trust_the_server_cannot_connect(
    listener_node: Start, pki: Pki
) -> None:
    node = listener_node(tls_table(pki, "secure"))
    other = trustme.CA()
    stranger = ssl.create_default_context()
    other.configure_trust(stranger)
    outcome = no_connack(port(node, "secure"), stranger)
    assert outcome.startswith("refused") and "CERTIFICATE_VERIFY_FAILED" in outcome, outcome
    wait_for(node, lambda: listener(node, "secure").refused["tls"] == 1, "the failure counted")


def test_optional_client_certificate_names_the_user_when_sent(
    listener_node: Start, pki: Pki, clients: list[Paho]
) -> None:
    node = listener_node(
        tls_table(pki, "opt", cafile=pki.cafile, verify="optional", cert_username="cn")
    )
    with_cert = Paho(
        port(node, "opt"), "with-cert", v5=True, tls=pki.client("alice"), username="mallory"
    )
    without = Paho(port(node, "opt"), "without-cert", tls=pki.client(), username="bob")
    clients += [with_cert, without]
    assert with_cert.connack()[1] == 0 and without.connack()[1] == 0
    no_cn = pki.client()
    pki.ca.issue_cert("client.example").configure_cert(no_cn)  # a subject without a CN
    nameless = Paho(port(node, "opt"), "no-cn", tls=no_cn, username="mallory")
    clients.append(nameless)
    assert nameless.connack()[1] == 0
    seen = clients_on(node)
    assert seen["with-cert"].username == "alice"  # the certificate's CN, not the CONNECT's
    assert seen["no-cn"].username is None and seen["no-cn"].cert_subject  # names no one
    assert "CN=alice" in (seen["with-cert"].cert_subject or "")
    assert seen["without-cert"].username == "bob" and seen["without-cert"].cert_subject is None


def test_dn_as_user_name(listener_node: Start, pki: Pki, clients: list[Paho]) -> None:
    node = listener_node(tls_table(pki, "dn", cafile=pki.cafile, cert_username="dn"))
    c = Paho(port(node, "dn"), "dn-client", tls=pki.client("carol"))
    clients.append(c)
    assert c.connack()[1] == 0
    user = clients_on(node)["dn-client"].username
    assert user is not None and user.startswith("CN=carol,")


@pytest.mark.parametrize("v5", [False, True], ids=["3.1.1", "5.0"])
def test_required_client_certificate(
    listener_node: Start, pki: Pki, clients: list[Paho], v5: bool
) -> None:
    node = listener_node(tls_table(pki, "req", cafile=pki.cafile, verify="required"))
    req = port(node, "req")
    bystander = Paho(req, "bystander", v5=v5, tls=pki.client("dave"))
    clients.append(bystander)
    assert bystander.connack()[1] == 0
    assert no_connack(req, pki.client()).startswith(("refused", "closed"))  # no certificate
    wait_for(node, lambda: listener(node, "req").refused["tls"] == 1, "one failed handshake")
    assert no_connack(req, pki.client("eve", ca=trustme.CA())).startswith(("refused", "closed"))
    wait_for(node, lambda: listener(node, "req").refused["tls"] == 2, "a foreign CA refused")
    # only those connections were closed: the bystander still round-trips
    bystander.subscribe("t/still", qos=1)
    bystander.publish("t/still", b"here", qos=1)
    assert bystander.message().payload == b"here"


def test_the_certificate_cn_is_the_user_the_acl_sees(
    listener_node: Start, pki: Pki, clients: list[Paho], tmp_path: Path
) -> None:
    from services.config import load
    from services.node.app import seams_for

    acl = tmp_path / "acl.toml"
    acl.write_text(
        '[[rule]]\npermission = "allow"\naction = "publish"\ntopics = ["users/%u/#"]\n\n'
        '[[rule]]\npermission = "allow"\naction = "subscribe"\ntopics = ["users/#"]\n'
    )
    seams = seams_for(load({"acl_file": str(acl), "acl_no_match": "deny"}, env={}))
    node = listener_node(
        tls_table(pki, "certs", cafile=pki.cafile, verify="required", cert_username="cn"),
        seams=seams,
    )
    certs = port(node, "certs")
    sub = Paho(certs, "watcher", v5=True, tls=pki.client("alice"))
    alice = Paho(certs, "alice-device", v5=True, tls=pki.client("alice"), username="bob")
    clients += [sub, alice]
    assert sub.connack()[1] == 0 and alice.connack()[1] == 0
    assert sub.subscribe("users/#", qos=1)[0] == 1
    alice.publish("users/alice/temp", b"21", qos=1)
    assert sub.message().payload == b"21"  # %u is alice: allowed
    alice.publish("users/bob/temp", b"spoofed", qos=1)  # the CONNECT's user name: refused
    assert sub.before_barrier(alice, "users/alice/barrier", qos=1) == []


def test_a_tls_1_1_client_is_refused(listener_node: Start, pki: Pki) -> None:
    node = listener_node(tls_table(pki, "modern"))
    context = pki.client()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = ssl.TLSVersion.TLSv1
        context.maximum_version = ssl.TLSVersion.TLSv1_1
    context.set_ciphers("DEFAULT:@SECLEVEL=0")  # let this OpenSSL offer TLS 1.1 at all
    outcome = no_connack(port(node, "modern"), context)
    assert outcome.startswith("refused"), outcome
    # the server saw the ClientHello and refused it (not a client that never sent one)
    wait_for(node, lambda: listener(node, "modern").refused["tls"] == 1, "the refusal counted")


def test_tls_1_3_minimum(listener_node: Start, pki: Pki, clients: list[Paho]) -> None:
    node = listener_node(tls_table(pki, "tls13", tls_min="1.3"))
    old = pki.client()
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    assert no_connack(port(node, "tls13"), old).startswith("refused")
    round_trip(clients, port(node, "tls13"), pki.client(), True, "tls13")


def test_a_stalled_handshake_is_closed_and_counted(
    listener_node: Start, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.listener import listeners

    monkeypatch.setattr(listeners, "TLS_HANDSHAKE_TIMEOUT_S", 0.3)
    node = listener_node(tls_table(pki, "slow"))
    with socket.create_connection(("127.0.0.1", port(node, "slow")), timeout=5) as raw:
        assert raw.recv(16) == b""  # no ClientHello sent: the node closes after its timeout
    wait_for(node, lambda: listener(node, "slow").refused["tls"] == 1, "the timeout counted")


def test_a_node_stops_with_a_handshake_pending(listener_node: Start, pki: Pki) -> None:
    node = listener_node(tls_table(pki, "pending"))
    with socket.create_connection(("127.0.0.1", port(node, "pending")), timeout=5) as raw:
        wait_for(node, lambda: len(listener(node, "pending")._handshakes) == 1, "the handshake")
        node.stop()  # within NodeRunner's bound, though the handshake never ends
        assert raw.recv(16) == b""


def test_the_dn_is_written_as_rfc_4514_says() -> None:
    from services.listener.listeners import identity

    cert = {
        "subject": (
            (("countryName", "DE"),),
            (("organizationName", "Acme, Inc."),),
            (("commonName", "#dev +1 "),),
        )
    }
    dn, cn = identity(cert, "cn")
    assert dn == "CN=\\#dev \\+1\\ ,O=Acme\\, Inc.,C=DE" and cn == "#dev +1 "
    assert identity(cert, "dn") == (dn, dn)
    assert identity(cert, "none") == (dn, None)
    assert identity({}, "cn") == (None, None)  # no certificate sent (verify optional)
    assert identity({"subject": ((("organizationName", "O"),),)}, "cn") == ("O=O", None)
