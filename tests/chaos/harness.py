"""Chaos harness: a node as a killable subprocess, and one MQTT connection
speaking through `services.mqtt.codec` (the test clients are in
`tests.chaos.clients`).

Theory of operation. `NodeProcess` runs `weir up` in its own process group
on a fixed port, so SIGKILL takes the whole node at once and a restart comes
back where clients look for it; `wait_ready` waits for the port to accept.
A connection ends when the node dies (EOF or reset); each client then
reconnects through `connect_retry`, a bounded retry loop: to the one port it
was given, or, given `Ports` (a cluster's nodes), to its home node first and
after every drop to each node in a fresh random order until one answers.
No client ever sleeps to wait for an outcome: it waits on the socket or
retries within a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from services.mqtt.codec import decode, encode
from services.mqtt.packets import (
    Connack,
    Connect,
    Packet,
)

LEVEL = 4  # MQTT 3.1.1, what the clients speak unless told otherwise
LEVEL_5 = 5  # MQTT 5.0
SESSION_EXPIRY_S = 3600  # the 5.0 clients' Session Expiry Interval
CONNECT_TIMEOUT_S = 5.0
RETRY_PAUSE_S = 0.05  # between reconnect attempts while the node restarts
READ_SIZE = 65536
REPO = Path(__file__).resolve().parents[2]


class ChaosError(RuntimeError):
    """A client could not reconnect in time or the node did not come up."""


class NodeProcess:
    """`python -m services up ...` as a subprocess on a fixed port, killable with SIGKILL."""

    def __init__(self, args: Sequence[str], port: int, log_path: Path) -> None:
        self.args = list(args)
        self.port = port
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            log.write(f"--- start {self.starts + 1} ---\n".encode())
            self.process = subprocess.Popen(
                [sys.executable, "-m", "services", "up", *self.args],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.starts += 1

    async def wait_ready(self, timeout: float) -> float:
        """Seconds until the port accepts a connection (ChaosError if the node exits first)."""
        began = time.monotonic()
        deadline = began + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise ChaosError(f"node exited during start; log tail:\n{self.log_tail()}")
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", self.port), 1.0
                )
            except (OSError, TimeoutError):
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return time.monotonic() - began
        raise ChaosError(f"node not ready in {timeout}s; log tail:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL the node's whole process group and reap it."""
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()

    def warnings(self, limit: int = 40) -> str:
        """What the node logged besides its start markers and "ready" lines: with no logging
        configured, Python prints its warnings and errors bare (no level prefix)."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        starts = sum(1 for line in text if line.startswith("--- start"))
        other = [
            line
            for line in text
            if line.startswith("--- start")
            or not (line.startswith("weir: node") and " ready" in line)
        ]
        if len(other) == starts:
            return f"(none in {starts} starts)"
        return "\n" + "\n".join(other[-limit:])

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class Dialer(Protocol):
    """A node reached otherwise than on a loopback port (tests/partition: inside a
    network namespace); hashable, so `Ports` can list it."""

    async def dial(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]: ...


class Link:
    """One TCP connection speaking MQTT at the level of its CONNECT through the codec."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, level: int = LEVEL
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.level = level
        self.buf = bytearray()

    @classmethod
    async def open(cls, port: int | Dialer, connect: Connect) -> tuple[Link, Connack]:
        """Connect to a loopback port (or through a `Dialer`); ConnectionError unless accepted."""
        opening = (
            asyncio.open_connection("127.0.0.1", port) if isinstance(port, int) else port.dial()
        )
        reader, writer = await asyncio.wait_for(opening, CONNECT_TIMEOUT_S)
        link = cls(reader, writer, connect.protocol_level)
        try:
            link.send(connect)
            packet = await asyncio.wait_for(link.recv(), CONNECT_TIMEOUT_S)
        except BaseException:
            link.close()
            raise
        if not isinstance(packet, Connack) or packet.reason_code != 0:
            link.close()
            raise ConnectionError(f"CONNECT refused: {packet!r}")
        return link, packet

    def send(self, packet: Packet) -> None:
        if self.writer.is_closing():  # the peer is gone: stop writing at once
            raise ConnectionError("connection closed")
        self.writer.write(encode(packet, self.level))

    async def drain(self) -> None:
        await self.writer.drain()

    async def recv(self) -> Packet:
        """The next packet; ConnectionError on EOF."""
        while True:
            got = decode(memoryview(self.buf), self.level)
            if got is not None:
                packet, used = got
                del self.buf[:used]
                return packet
            data = await self.reader.read(READ_SIZE)
            if not data:
                raise ConnectionError("EOF")
            self.buf += data

    def close(self) -> None:
        self.writer.close()


class Ports:
    """The MQTT ports of a cluster's nodes as one client sees them: its home
    node on the first connection, every node in a fresh random order after."""

    def __init__(self, ports: Sequence[int | Dialer], rng: random.Random, home: int = 0) -> None:
        self.ports = list(ports)
        self.rng = rng
        self.home = self.ports[home]
        self.used: dict[int | Dialer, int] = {}  # port -> connections made to it

    def order(self) -> list[int | Dialer]:
        ports = [p for p in self.ports if p != self.home or self.used]
        self.rng.shuffle(ports)
        return ports if self.used else [self.home, *ports]

    def connected(self, port: int | Dialer) -> None:
        self.used[port] = self.used.get(port, 0) + 1


async def connect_retry(
    port: int | Dialer | Ports, connect: Connect, deadline: float
) -> tuple[Link, Connack]:
    """Reconnect until a node answers or `deadline` (monotonic) passes."""
    last: BaseException | None = None
    while time.monotonic() < deadline:
        candidates: list[int | Dialer] = port.order() if isinstance(port, Ports) else [port]
        for candidate in candidates:
            try:
                opened = await Link.open(candidate, connect)
            except (OSError, ConnectionError, TimeoutError) as exc:
                last = exc
                continue
            if isinstance(port, Ports):
                port.connected(candidate)
            return opened
        await asyncio.sleep(RETRY_PAUSE_S)
    raise ChaosError(f"{connect.client_id}: no reconnect before the deadline ({last!r})")
