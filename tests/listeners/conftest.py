"""Certificates made at test time (trustme) and nodes with several listeners.

`pki` is one test CA per module with a server certificate for 127.0.0.1 /
localhost; `Pki.client` makes a client context that verifies the server
with that CA and, given a CN, presents a client certificate the CA signed.
`listener_node` starts a node (tests.integration's NodeRunner) whose
listeners are the default ones plus what the test asks for.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import trustme

from services.config.listeners import tables
from tests.integration.conftest import NodeRunner, clients, node_settings

__all__ = ["clients"]  # the fixture, for these tests too

DEADLINE_S = 5.0


@dataclass
class Pki:
    ca: trustme.CA
    root: Path

    @property
    def cafile(self) -> str:
        return str(self.root / "ca.pem")

    @property
    def certfile(self) -> str:
        return str(self.root / "server.pem")

    @property
    def keyfile(self) -> str:
        return str(self.root / "server.key")

    def client(self, cn: str | None = None, ca: trustme.CA | None = None) -> ssl.SSLContext:
        """Verifies the server; presents a certificate with this CN (from `ca`) if given."""
        context = ssl.create_default_context(cafile=self.cafile)
        if cn is not None:
            (ca or self.ca).issue_cert("client.example", common_name=cn).configure_cert(context)
        return context


def make_pki(root: Path) -> Pki:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    pki = Pki(ca, root)
    ca.cert_pem.write_to_path(pki.cafile)
    server.cert_chain_pems[0].write_to_path(pki.certfile)
    server.private_key_pem.write_to_path(pki.keyfile)
    return pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_table(pki: Pki, name: str, kind: str = "tls", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "type": kind,
        "port": 0,
        "certfile": pki.certfile,
        "keyfile": pki.keyfile,
        **extra,
    }


@pytest.fixture
def listener_node() -> Iterator[Callable[..., NodeRunner]]:
    """start(*tables, seams=None, **settings): a node with these [[listener]] tables."""
    started: list[NodeRunner] = []

    def start(*raw: dict[str, Any], seams: Any = None, **fields: Any) -> NodeRunner:
        base = node_settings()
        settings = replace(
            base, listeners=replace(base.listeners, tables=tables(list(raw))), **fields
        )
        settings.listeners.all()  # checked as load() would
        runner = NodeRunner(settings, seams).start()
        started.append(runner)
        return runner

    yield start
    for runner in started:
        runner.stop()


def listener(node: NodeRunner, name: str) -> Any:
    return next(x for x in node.node.listeners if x.name == name)


def port(node: NodeRunner, name: str) -> int:
    bound: int = listener(node, name).port
    return bound


def wait_for(node: NodeRunner, condition: Callable[[], bool], what: str) -> None:
    """Poll `condition` on the node's loop until it holds (bounded)."""
    deadline = time.monotonic() + DEADLINE_S
    while not node.call(condition):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def clients_on(node: NodeRunner) -> dict[str, Any]:
    """client id -> ClientInfo of the node's connections."""
    seen: dict[str, Any] = node.call(
        lambda: {c.client.client_id: c.client for c in node.node.broker.connections if c.client}
    )
    return seen
