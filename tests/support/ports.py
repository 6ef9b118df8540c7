"""A free loopback TCP port, for a server a test starts on a port it must know:
the product's own pick (services.ports), below the kernel's ephemeral range
so that no client connection of the suite can take it before the server binds."""

from __future__ import annotations

from services.ports import free_port

__all__ = ["free_port"]
