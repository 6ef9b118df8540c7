"""Chaos harness: a node as a killable subprocess, and MQTT 3.1.1 test clients
that implement QoS 1/2 themselves on `services.mqtt.codec`.

Theory of operation. The clients keep their session state in plain objects
that outlive every TCP connection, as a persistent session requires:

- `QoS2Publisher` numbers each message (payload = its sequence number),
  keeps every message until PUBCOMP, and after each reconnect resends, in
  order, PUBLISH with DUP=1 for the ones without PUBREC and PUBREL for the
  ones with it (MQTT 3.1.1 4.4). It paces itself to `rate` msg/s while
  connected and caps its unacknowledged messages at `max_inflight`.
- `Subscriber` delivers a QoS 1 PUBLISH to the application every time it
  arrives (recording its DUP flag), and a QoS 2 PUBLISH only if its packet
  id is not awaiting PUBREL (method A of MQTT 3.1.1 4.3.3); the set of ids
  awaiting PUBREL survives reconnects.

A connection ends when the node dies (EOF or reset); each client then
reconnects in a bounded retry loop. No client ever sleeps to wait for an
outcome: it waits on the socket or retries within a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from services.mqtt.codec import decode, encode
from services.mqtt.packets import (
    Connack,
    Connect,
    Packet,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
)

LEVEL = 4  # MQTT 3.1.1
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

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class Link:
    """One TCP connection speaking MQTT 3.1.1 through the codec."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.buf = bytearray()

    @classmethod
    async def open(cls, port: int, connect: Connect) -> tuple[Link, Connack]:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port), CONNECT_TIMEOUT_S
        )
        link = cls(reader, writer)
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
        self.writer.write(encode(packet, LEVEL))

    async def drain(self) -> None:
        await self.writer.drain()

    async def recv(self) -> Packet:
        """The next packet; ConnectionError on EOF."""
        while True:
            got = decode(memoryview(self.buf), LEVEL)
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


async def connect_retry(port: int, connect: Connect, deadline: float) -> tuple[Link, Connack]:
    """Reconnect until the node answers or `deadline` (monotonic) passes."""
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            return await Link.open(port, connect)
        except (OSError, ConnectionError, TimeoutError) as exc:
            last = exc
            await asyncio.sleep(RETRY_PAUSE_S)
    raise ChaosError(f"{connect.client_id}: no reconnect before the deadline ({last!r})")


@dataclass
class QoS2Publisher:
    client_id: str
    topic: str
    total: int
    rate: float
    max_inflight: int = 1000
    next_seq: int = 0
    next_pid: int = 1
    outstanding: dict[int, list[int | bool]] = field(default_factory=dict)  # pid -> [seq, released]
    connects: int = 0
    resent_publish: int = 0
    resent_pubrel: int = 0
    sessions_lost: int = 0  # reconnects whose CONNACK said session_present=0
    completed: int = 0
    resent_seqs: set[int] = field(default_factory=set)  # sent again with DUP=1 after a reconnect

    @property
    def done(self) -> bool:
        return self.next_seq >= self.total and not self.outstanding

    def _pid(self) -> int:
        for _ in range(65535):
            pid = self.next_pid
            self.next_pid = pid % 65535 + 1
            if pid not in self.outstanding:
                return pid
        raise ChaosError("no free packet id")

    async def run(self, port: int, deadline: float) -> None:
        while not self.done:
            link, connack = await connect_retry(
                port, Connect(self.client_id, clean_start=False, keep_alive=0), deadline
            )
            self.connects += 1
            if self.connects > 1 and not connack.session_present:
                self.sessions_lost += 1
            try:
                for pid, (seq, released) in list(self.outstanding.items()):
                    if released:
                        link.send(Pubrel(pid))
                        self.resent_pubrel += 1
                    else:
                        self.resent_seqs.add(int(seq))
                        payload = str(seq).encode()
                        link.send(Publish(self.topic, payload, 2, dup=True, packet_id=pid))
                        self.resent_publish += 1
                await self._session(link, deadline)
            except (OSError, ConnectionError):
                pass
            finally:
                link.close()
            if time.monotonic() > deadline:
                raise ChaosError(f"publisher not done by the deadline: {self.next_seq} sent")

    async def _session(self, link: Link, deadline: float) -> None:
        room = asyncio.Event()
        room.set()

        async def reader() -> None:
            while not self.done:
                packet = await link.recv()
                if isinstance(packet, Pubrec):
                    entry = self.outstanding.get(packet.packet_id)
                    if entry is not None:
                        entry[1] = True
                    link.send(Pubrel(packet.packet_id))
                elif (
                    isinstance(packet, Pubcomp)
                    and self.outstanding.pop(packet.packet_id, None) is not None
                ):
                    self.completed += 1
                    room.set()

        async def writer() -> None:
            began = time.monotonic()
            sent = 0
            while self.next_seq < self.total:
                if len(self.outstanding) >= self.max_inflight:
                    room.clear()
                    await room.wait()
                    continue
                due = min(int((time.monotonic() - began) * self.rate) - sent, 100)
                if due <= 0:
                    await asyncio.sleep(0.005)  # pacing, not synchronisation
                    continue
                for _ in range(min(due, self.total - self.next_seq)):
                    pid = self._pid()
                    seq = self.next_seq
                    self.next_seq += 1
                    self.outstanding[pid] = [seq, False]
                    link.send(Publish(self.topic, str(seq).encode(), 2, packet_id=pid))
                    sent += 1
                await link.drain()

        tasks = [asyncio.create_task(reader()), asyncio.create_task(writer())]
        try:
            done, _ = await asyncio.wait(
                tasks,
                timeout=max(0.0, deadline - time.monotonic()),
                return_when=asyncio.FIRST_EXCEPTION,
            )
            for task in done:
                if task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            if not tasks[0].done():  # writer finished; the reader runs until all complete
                await asyncio.wait_for(tasks[0], max(0.0, deadline - time.monotonic()))
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class Subscriber:
    client_id: str
    topic: str
    qos: int
    delivered: list[tuple[int, bool]] = field(default_factory=list)  # (seq, dup) per app delivery
    trace: list[tuple[int, int, bool, int]] = field(default_factory=list)  # seq, pid, dup, conn
    awaiting_rel: set[int] = field(default_factory=set)
    seen: set[int] = field(default_factory=set)
    connects: int = 0
    sessions_lost: int = 0
    dup_publishes_suppressed: int = 0  # QoS 2 DUP PUBLISHes of an id awaiting PUBREL
    subscribed: bool = False
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, port: int, deadline: float) -> None:
        while not self.stop.is_set():
            link, connack = await connect_retry(
                port, Connect(self.client_id, clean_start=False, keep_alive=0), deadline
            )
            self.connects += 1
            try:
                if self.connects > 1 and not connack.session_present:
                    self.sessions_lost += 1
                    self.subscribed = False
                if not self.subscribed:
                    link.send(Subscribe(1, (Subscription(self.topic, self.qos),)))
                await self._session(link)
            except (OSError, ConnectionError):
                pass
            finally:
                link.close()
            if time.monotonic() > deadline and not self.stop.is_set():
                raise ChaosError(f"{self.client_id}: still running at the deadline")

    async def _session(self, link: Link) -> None:
        stop = asyncio.create_task(self.stop.wait())
        try:
            while True:
                recv = asyncio.create_task(link.recv())
                await asyncio.wait({recv, stop}, return_when=asyncio.FIRST_COMPLETED)
                if not recv.done():
                    recv.cancel()
                    await asyncio.gather(recv, return_exceptions=True)
                    return
                self._handle(link, recv.result())
        finally:
            stop.cancel()

    def _handle(self, link: Link, packet: Packet) -> None:
        if isinstance(packet, Publish):
            seq = int(packet.payload)
            pid = packet.packet_id
            if packet.qos == 1 and pid is not None:
                self._deliver(seq, pid, packet.dup)
                link.send(Puback(pid))
            elif packet.qos == 2 and pid is not None:
                if pid in self.awaiting_rel:
                    self.dup_publishes_suppressed += 1
                else:
                    self.awaiting_rel.add(pid)
                    self._deliver(seq, pid, packet.dup)
                link.send(Pubrec(pid))
            else:
                self._deliver(seq, 0, packet.dup)
        elif isinstance(packet, Pubrel):
            self.awaiting_rel.discard(packet.packet_id)
            link.send(Pubcomp(packet.packet_id))
        elif isinstance(packet, Suback):
            if packet.reason_codes != (self.qos,):
                raise ChaosError(f"{self.client_id}: SUBACK {packet.reason_codes}")
            self.subscribed = True

    def _deliver(self, seq: int, pid: int, dup: bool) -> None:
        self.trace.append((seq, pid, dup, self.connects))
        self.delivered.append((seq, dup))
        self.seen.add(seq)

    def missing(self, total: int) -> list[int]:
        return [s for s in range(total) if s not in self.seen]

    def duplicates(self) -> list[tuple[int, bool]]:
        """Every delivery of a sequence number seen before, with its DUP flag."""
        first: set[int] = set()
        out = []
        for seq, dup in self.delivered:
            if seq in first:
                out.append((seq, dup))
            first.add(seq)
        return out
