"""A node whose authenticator is a given chain, and paho 3.1.1 / 5.0 CONNECTs against it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import pytest

from services.auth.chain import Backend, Chain
from services.broker.seams import Seams
from services.metrics.registry import Metrics
from tests.integration.conftest import NodeRunner, Paho, node_settings

ALLOWED = "Success"
BAD = "Bad user name or password"  # 5.0 0x86; paho names 3.1.1's 4 the same
NOT_AUTHORIZED = "Not authorized"  # 0x87 / 5
UNAVAILABLE = "Server unavailable"  # 0x88 / 3


class ChainNode(NodeRunner):
    def __init__(self, backends: Sequence[Backend], allow_anonymous: bool = False) -> None:
        self.chain = Chain(backends, allow_anonymous)
        seams = Seams(authenticator=self.chain, metrics=Metrics())
        super().__init__(node_settings(), seams)

    def denied(self) -> int:
        assert self.seams is not None
        metrics = self.seams.metrics
        count: int = self.call(lambda: metrics.authentication_failure)
        return count

    def connect(
        self, v5: bool, user: str | None, password: str | bytes | None, client_id: str = "c1"
    ) -> str:
        """The CONNACK's reason, by name."""
        c = Paho(self.mqtt_port, client_id, v5=v5, username=user, password=password)  # type: ignore[arg-type]
        try:
            return str(c.connack()[1].getName())
        finally:
            c.close()


@contextlib.contextmanager
def chain_node(backends: Sequence[Backend], allow_anonymous: bool = False) -> Iterator[ChainNode]:
    node = ChainNode(backends, allow_anonymous)
    node.start()
    try:
        yield node
    finally:
        node.stop()


def refusal_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "weir.auth" and r.getMessage().startswith("connect refused")]  # fmt: skip
