"""A live node process for the robustness suite, and the raw clients it talks to.

One node per module (starting one costs about a second); each test opens its
own connections with unique client ids, so the tests of a module do not meet.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _pytest.fixtures import FixtureRequest

from tests.integration.conftest import raws  # noqa: F401  (the fixture, re-used)
from tests.support.live_node import LiveNode

MAX_PACKET_SIZE = 65536  # bytes: small enough that a test can exceed it cheaply


@pytest.fixture(scope="module")
def live(request: FixtureRequest) -> Iterator[LiveNode]:
    """The module's node; a module's own MAX_PACKET_SIZE replaces the one above."""
    max_size = getattr(request.module, "MAX_PACKET_SIZE", MAX_PACKET_SIZE)
    node = LiveNode("--max-packet-size", str(max_size))
    try:
        yield node
    finally:
        assert node.alive(), "the node died:\n" + "".join(node.log)
        assert node.stop() == 0, "".join(node.log)
