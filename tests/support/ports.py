"""A free loopback TCP port, for a server a test starts on a port it must know."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now: the OS picks it, the probe socket closes.

    Another process could take it before the caller binds it; on a test
    machine that is rare enough."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port
