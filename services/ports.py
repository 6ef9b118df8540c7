"""A free TCP port for a server Weir starts on a port it must know beforehand
(the embedded Redis and Kafka, the nodes of `weir up --nodes`), and for the
tests' servers.

A port the kernel hands out for a bind to port 0 comes from its ephemeral
range, the range every outgoing connection takes its local port from. Between
the probe closing and the server binding, any client connection on the
machine can take that port, and the server fails with "address already in
use" (CI saw it: a test's `weir up` restart, its port taken by one of the
suite's client connections). A port below the ephemeral range is never
given to a connection, so `free_port` picks one there, at random (two
servers started at once rarely pick the same one), and only if nothing is
bound to it now. Where that range leaves no room, or the kernel does not
say what it is (no Linux /proc), the kernel picks as before.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path
from typing import Final

RANGE_FILE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST: Final = 20_000  # above the well-known defaults (1883, 6379, 8083, 8883, 18083...)
MIN_ROOM: Final = 1_000  # fewer ports than this below the ephemeral range: the kernel picks
ATTEMPTS: Final = 64  # ports tried below the range before the kernel picks


def ephemeral_range(path: Path = RANGE_FILE) -> tuple[int, int] | None:
    """The kernel's range of ports for outgoing connections, or None if unknown."""
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


def free_port(host: str = "127.0.0.1", span: tuple[int, int] | None = None) -> int:
    """A port of `host` nothing is bound to now, below the ephemeral range
    (`span`: that range, read from the kernel when None) where there is room."""
    span = span if span is not None else ephemeral_range()
    if span is not None and span[0] - LOWEST >= MIN_ROOM:
        for port in random.sample(range(LOWEST, span[0]), ATTEMPTS):
            if _bindable(host, port):
                return port
    return _bound(host, 0)


def _bindable(host: str, port: int) -> bool:
    try:
        _bound(host, port)
    except OSError:
        return False
    return True


def _bound(host: str, port: int) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, port))
        bound: int = probe.getsockname()[1]
        return bound
