"""Network namespaces and veth links for the partition tests (Linux, root).

Theory of operation. Every party lives in a namespace of its own, made by
the test: the nodes, Redis, the Kafka-protocol broker and the clients (the
test process opens its client sockets inside the clients' namespace, see
`socket_in`). Each party has one identity address, a /32 on the loopback of
its own namespace (10.201.0.x), which is what the others dial and what a
node listens on. Two parties that talk are joined by their own veth pair on
a /30 of 10.201.<n>.0, with a /32 route on each end to the other's
identity. Cutting a link (`ip link set ... down` on both ends) removes
exactly those two routes: a node cut from Redis still reaches Kafka, its
peer and its clients. Established TCP connections over a cut link stay
open and simply hear nothing (a partition, not a reset); new connections
fail at once with "network unreachable". Healing brings the ends up and
puts the routes back.

Nothing of this touches the root namespace: the veth ends are created
inside their namespaces, so names and addresses cannot clash with the host
or with another run (each run's namespaces carry its pid). `close` kills
the processes started in the namespaces and deletes them (their veths go
with them); it is safe to call after a half-built topology.
(`tc netem` is not used: this kernel has no netem qdisc.)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

CLONE_NEWNET = 0x40000000
IDENTITY_NET = "10.201.0"  # identity addresses: 10.201.0.<n>/32 on each namespace's lo
LINK_NET = "10.201"  # link n: 10.201.<n>.0/30, .1 on the first party, .2 on the second
STOP_TIMEOUT_S = 5.0


class NetnsUnavailable(RuntimeError):
    """Namespaces cannot be made here (not root, no iproute2, a container without CAP_NET_ADMIN)."""


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def inside(namespace: str) -> Iterator[None]:
    """Run the calling thread in `namespace` for the block (sockets made in it stay there)."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(target)
        os.close(home)


def socket_in(namespace: str) -> socket.socket:
    """A non-blocking TCP socket that belongs to `namespace` whatever thread uses it."""
    with inside(namespace):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    return sock


def reachable(namespace: str, host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether `host:port` accepts a TCP connection from inside `namespace`."""
    with inside(namespace):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect((host, port))
        return True
    except OSError:
        return False
    finally:
        sock.close()


@dataclass
class Link:
    """A veth pair between two parties' namespaces."""

    a: str
    b: str
    dev_a: str
    dev_b: str
    up: bool = True

    def set(self, up: bool, topology: Topology) -> None:
        state = "up" if up else "down"
        ip("-n", self.a, "link", "set", self.dev_a, state)
        ip("-n", self.b, "link", "set", self.dev_b, state)
        if up:  # the /32 routes went with the carrier
            topology.route(self)
        self.up = up


@dataclass
class Topology:
    """Parties (namespace + identity address) and the links between them."""

    run: str = field(default_factory=lambda: f"wp{os.getpid()}")
    parties: dict[str, str] = field(default_factory=dict)  # party -> identity address
    links: dict[frozenset[str], Link] = field(default_factory=dict)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _made: list[str] = field(default_factory=list)

    def ns(self, party: str) -> str:
        return f"{self.run}-{party}"

    def address(self, party: str) -> str:
        return self.parties[party]

    def add_party(self, party: str) -> str:
        name = self.ns(party)
        try:
            ip("netns", "add", name)
        except RuntimeError as exc:
            raise NetnsUnavailable(str(exc)) from None
        self._made.append(name)
        address = f"{IDENTITY_NET}.{len(self.parties) + 1}"
        ip("-n", name, "link", "set", "lo", "up")
        ip("-n", name, "addr", "add", f"{address}/32", "dev", "lo")
        self.parties[party] = address
        return address

    def connect(self, a: str, b: str) -> Link:
        n = len(self.links) + 1
        link = Link(self.ns(a), self.ns(b), f"to-{b}", f"to-{a}")
        ip("link", "add", link.dev_a, "netns", link.a, "type", "veth",
           "peer", "name", link.dev_b, "netns", link.b)  # fmt: skip
        ip("-n", link.a, "addr", "add", f"{LINK_NET}.{n}.1/30", "dev", link.dev_a)
        ip("-n", link.b, "addr", "add", f"{LINK_NET}.{n}.2/30", "dev", link.dev_b)
        self.links[frozenset((a, b))] = link
        link.set(True, self)
        return link

    def route(self, link: Link) -> None:
        n = list(self.links.values()).index(link) + 1
        a = next(p for p in self.parties if self.ns(p) == link.a)
        b = next(p for p in self.parties if self.ns(p) == link.b)
        ip("-n", link.a, "route", "replace", f"{self.address(b)}/32",
           "via", f"{LINK_NET}.{n}.2", "dev", link.dev_a)  # fmt: skip
        ip("-n", link.b, "route", "replace", f"{self.address(a)}/32",
           "via", f"{LINK_NET}.{n}.1", "dev", link.dev_b)  # fmt: skip

    def cut(self, a: str, b: str) -> None:
        self.links[frozenset((a, b))].set(False, self)

    def heal(self, a: str, b: str) -> None:
        self.links[frozenset((a, b))].set(True, self)

    def heal_all(self) -> None:
        for link in self.links.values():
            if not link.up:
                link.set(True, self)

    def spawn(
        self, party: str, argv: Sequence[str], log: IO[bytes], cwd: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """`argv` inside the party's namespace, in its own process group."""
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns(party), *argv],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes.append(proc)
        return proc

    def run_in(
        self, party: str, argv: Sequence[str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.ns(party), *argv],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip

    def close(self) -> None:
        for proc in reversed(self.processes):
            stop(proc)
        self.processes.clear()
        for name in reversed(self._made):
            with contextlib.suppress(RuntimeError):
                ip("netns", "del", name)
        self._made.clear()


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(STOP_TIMEOUT_S)
