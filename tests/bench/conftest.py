"""A Mosquitto per test module, on a free loopback port, as the broker the generator measures."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from bench.mosquitto import MOSQUITTO, spawn_mosquitto


@pytest.fixture(scope="module")
def mosquitto() -> Iterator[tuple[int, int]]:
    """(port, pid) of a running Mosquitto."""
    if shutil.which(MOSQUITTO) is None:
        pytest.skip(f"{MOSQUITTO} is not installed")
    with spawn_mosquitto() as running:
        yield running
