"""One raw asyncio connection per MQTT client, and the counting behind it.

Theory of operation: a `BenchClient` is a bare `asyncio.Protocol`. Whatever
one `data_received` call brings is parsed in one go, and everything it calls
for (PUBACKs for received messages, the next messages a publisher's window now
allows) goes out as one write, so writes are batched per loop turn.

A subscribing client records into a `Tally`: per (publisher, sequence number)
one byte says whether that message was seen, so the run can count losses and
duplicates exactly; when the payload's timestamp is set, the latency too.
A publishing client runs a `Publisher`: QoS 0 writes slices of its
pre-encoded batch until the transport pauses it; QoS 1 keeps at most `window`
messages unacknowledged, and tops the window up once half of it is
acknowledged, so it writes (and the broker reads) in runs, not one by one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import cast

from bench import wire
from bench.errors import BrokerUnavailable, ProtocolViolation

WRITE_HIGH_WATER = 256 * 1024
"""Bytes a transport may buffer before it pauses a QoS 0 publisher: a few socket
buffers' worth, so the publisher keeps the kernel busy without queueing seconds
of messages in user space."""

QOS0_CHUNK = 512
"""Messages a QoS 0 publisher writes before letting the loop run other work."""


class Tally:
    """What one subscribing client received from the publishers it expects."""

    __slots__ = (
        "_base",
        "_per_publisher",
        "_seen",
        "duplicates",
        "first_ns",
        "last_ns",
        "latencies_ns",
        "received",
        "unexpected",
    )

    def __init__(self, publishers: tuple[int, ...], per_publisher: int, *, latency: bool) -> None:
        self._base = {number: i * per_publisher for i, number in enumerate(publishers)}
        self._per_publisher = per_publisher
        self._seen = bytearray(len(publishers) * per_publisher)
        self.received = 0
        self.duplicates = 0
        self.unexpected = 0
        self.first_ns = 0
        self.last_ns = 0
        self.latencies_ns: list[int] | None = [] if latency else None

    def record(self, payloads: list[tuple[int, int, int]], now_ns: int) -> None:
        if not payloads:
            return
        if not self.first_ns:
            self.first_ns = now_ns
        self.last_ns = now_ns
        seen, base, limit = self._seen, self._base, self._per_publisher
        duplicates = unexpected = 0
        for publisher, seq, _ in payloads:
            offset = base.get(publisher)
            if offset is None or seq >= limit:
                unexpected += 1
                continue
            index = offset + seq
            if seen[index]:
                duplicates += 1
            else:
                seen[index] = 1
        self.received += len(payloads) - unexpected
        self.duplicates += duplicates
        self.unexpected += unexpected
        if self.latencies_ns is not None:
            self.latencies_ns.extend(now_ns - sent for _, _, sent in payloads if sent)

    @property
    def unique(self) -> int:
        return self.received - self.duplicates

    def missing_below(self, marks: dict[int, int]) -> int:
        """Messages never seen among each expected publisher's first `marks[n]`
        sequence numbers (a publisher absent from `marks` counts as 0)."""
        seen, limit, missing = self._seen, self._per_publisher, 0
        for number, offset in self._base.items():
            upto = min(limit, marks.get(number, 0))
            missing += upto - seen.count(1, offset, offset + upto)
        return missing


class BenchClient(asyncio.Protocol):
    """See the module docstring."""

    def __init__(self, *, version: int = wire.MQTT_311, tally: Tally | None = None) -> None:
        loop = asyncio.get_running_loop()
        self.version = version
        self.tally = tally
        self.connack: asyncio.Future[int] = loop.create_future()
        self.suback: asyncio.Future[bytes] | None = None
        self.closed: asyncio.Future[None] = loop.create_future()
        self.on_acks: Callable[[int], bytes | memoryview | None] | None = None
        self.transport: asyncio.Transport | None = None
        self._parser = wire.FrameParser()
        self._resumed = asyncio.Event()
        self._resumed.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)

    def connection_lost(self, exc: Exception | None) -> None:
        self._resumed.set()
        for future in (self.connack, self.suback):
            if future is not None and not future.done():
                future.set_exception(BrokerUnavailable(f"connection closed: {exc}"))
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self._resumed.clear()

    def resume_writing(self) -> None:
        self._resumed.set()

    async def writable(self) -> None:
        await self._resumed.wait()

    def wake(self) -> None:
        """Let a publisher waiting in `writable` see that it was stopped."""
        self._resumed.set()

    def write(self, data: bytes | memoryview) -> None:
        if self.transport is None or self.transport.is_closing():
            raise BrokerUnavailable("write on a closed connection")
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        try:
            self._handle(self._parser.feed(data))
        except ProtocolViolation:
            assert self.transport is not None
            self.transport.abort()

    def _handle(self, frames: list[tuple[int, bytes]]) -> None:
        payloads: list[tuple[int, int, int]] = []
        replies: list[bytes] = []
        acks = 0
        unpack_from = wire.PAYLOAD.unpack_from
        v5 = self.version == wire.MQTT_5
        for first, body in frames:
            kind = first & 0xF0
            if kind == wire.PUBLISH:
                qos = (first >> 1) & 3
                at = 2 + (body[0] << 8 | body[1])
                if qos:
                    replies.append(wire.PUBACKS[body[at] << 8 | body[at + 1]])
                    at += 2
                if v5:
                    at = wire.publish_body_offsets(body, qos, self.version)[1]
                payloads.append(unpack_from(body, at))
            elif kind == wire.PUBACK:
                acks += 1
            elif kind == wire.CONNACK:
                self._resolve(self.connack, body[1] if len(body) > 1 else 255)
            elif kind == wire.SUBACK and self.suback is not None:
                self._resolve(self.suback, bytes(body[2:]))
            elif kind != wire.PINGRESP:
                raise ProtocolViolation(f"unexpected packet type {first >> 4}")
        if payloads and self.tally is not None:
            self.tally.record(payloads, time.monotonic_ns())
        more = self.on_acks(acks) if acks and self.on_acks is not None else None
        if self.transport is None or self.transport.is_closing():
            return
        if replies:
            if more:
                replies.append(bytes(more))
            self.transport.write(b"".join(replies))
        elif more:
            self.transport.write(more)

    @staticmethod
    def _resolve(future: asyncio.Future[int] | asyncio.Future[bytes], value: object) -> None:
        if not future.done():
            future.set_result(value)  # type: ignore[arg-type]

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(wire.DISCONNECT_PACKET)
            self.transport.close()


async def open_client(
    host: str,
    port: int,
    client_id: str,
    *,
    version: int = wire.MQTT_311,
    tally: Tally | None = None,
    local_addr: tuple[str, int] | None = None,
    wait_s: float = 10.0,
    clean: bool = True,
    session_expiry_s: int = 0,
    credentials: tuple[str | None, bytes | None] = (None, None),
) -> BenchClient:
    """Connect (with a user name and password, if given) and wait for a successful
    CONNACK, or raise `BrokerUnavailable`."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(wait_s):
            _, client = await loop.create_connection(
                lambda: BenchClient(version=version, tally=tally), host, port, local_addr=local_addr
            )
            try:
                client.write(
                    wire.connect(
                        client_id,
                        version=version,
                        clean=clean,
                        session_expiry_s=session_expiry_s,
                        username=credentials[0],
                        password=credentials[1],
                    )
                )
            except BrokerUnavailable:
                client.connack.cancel()
                raise
            code = await client.connack
    except (OSError, TimeoutError) as exc:
        raise BrokerUnavailable(f"cannot connect to {host}:{port}: {exc or 'timed out'}") from exc
    if code != 0:
        client.close()
        raise BrokerUnavailable(f"{host}:{port} refused {client_id!r}: CONNACK code {code}")
    return client


async def subscribe(
    client: BenchClient, topic_filter: str, qos: int, *, wait_s: float = 10.0
) -> None:
    client.suback = asyncio.get_running_loop().create_future()
    client.write(wire.subscribe(1, topic_filter, qos, version=client.version))
    try:
        async with asyncio.timeout(wait_s):
            granted = await client.suback
    except TimeoutError as exc:
        raise BrokerUnavailable(f"no SUBACK for {topic_filter!r}") from exc
    if not granted or granted[-1] >= 0x80:
        raise BrokerUnavailable(f"subscription to {topic_filter!r} refused: {granted.hex()}")


class Publisher:
    """Sends one pre-encoded batch as fast as the broker takes it; see the module docstring."""

    def __init__(self, client: BenchClient, batch: wire.PublishBatch, *, qos: int, window: int):
        self.client = client
        self.batch = batch
        self.qos = qos
        self.window = window
        self.sent = 0
        self.acked = 0
        self.first_ns = 0
        self.last_ns = 0
        self._stopped = False
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def run(self, deadline: float) -> None:
        """Publish until the batch is sent (QoS 1: acknowledged) or `deadline` (loop time)."""
        loop = asyncio.get_running_loop()
        self.first_ns = time.monotonic_ns()
        timer = loop.call_at(deadline, self.stop)
        try:
            if self.qos == 0:
                await self._run_qos0()
            else:
                self.client.on_acks = self._on_acks
                self.client.write(self._take(min(self.window, self.batch.count)))
                if self.batch.count:
                    await asyncio.wait(
                        [self._done, self.client.closed], return_when=asyncio.FIRST_COMPLETED
                    )
        finally:
            timer.cancel()
            self.client.on_acks = None

    async def _run_qos0(self) -> None:
        client = self.client
        while self.sent < self.batch.count and not self._stopped:
            await client.writable()
            if self._stopped or client.closed.done():
                return
            client.write(self._take(QOS0_CHUNK))
            await asyncio.sleep(0)

    def _take(self, count: int) -> memoryview:
        start = self.sent
        self.sent = min(self.batch.count, start + count)
        if self.sent > start:
            self.last_ns = time.monotonic_ns()
        return self.batch.slice(start, self.sent)

    def _on_acks(self, count: int) -> memoryview | None:
        self.acked += count
        if self.acked >= self.batch.count or self._stopped:
            if self.acked >= self.sent and not self._done.done():
                self._done.set_result(None)
            return None
        outstanding = self.sent - self.acked
        if outstanding > self.window // 2:
            return None
        return self._take(self.window - outstanding)

    def stop(self) -> None:
        self._stopped = True
        self.client.wake()
        if not self._done.done():
            self._done.set_result(None)


PACE_TICK_S = 0.001
"""The paced publisher wakes at most this often (libuv timers count whole
milliseconds; sleeping less would spin) and sends every message then due."""


class PacedPublisher:
    """Publishes `count` messages at `rate` per second, each stamped when it is written."""

    def __init__(
        self,
        client: BenchClient,
        topic: str,
        number: int,
        count: int,
        *,
        rate: float,
        qos: int,
        payload_size: int,
    ) -> None:
        self.client = client
        self.topic = topic
        self.number = number
        self.count = count
        self.rate = rate
        self.qos = qos
        self.padding = bytes(max(0, payload_size - wire.PAYLOAD.size))
        self.sent = 0
        self.acked = 0
        self.first_ns = 0
        self.last_ns = 0
        self._all_acked: asyncio.Future[None] | None = None

    async def run(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        self.client.on_acks = self._on_acks
        start = time.monotonic()
        stop = start + (deadline - loop.time())
        self.first_ns = time.monotonic_ns()
        while (
            self.sent < self.count
            and (now := time.monotonic()) < stop
            and not self.client.closed.done()
        ):
            due = min(self.count, int((now - start) * self.rate) + 1)
            packets = [self._encode(seq) for seq in range(self.sent, due)]
            if packets:
                self.client.write(b"".join(packets))
                self.sent = due
                self.last_ns = time.monotonic_ns()
            await asyncio.sleep(max(PACE_TICK_S, start + self.sent / self.rate - time.monotonic()))
        if self.qos and self.acked < self.sent:
            self._all_acked = loop.create_future()
            await asyncio.wait(
                [self._all_acked, self.client.closed], timeout=max(0.0, deadline - loop.time())
            )

    def _encode(self, seq: int) -> bytes:
        payload = wire.PAYLOAD.pack(self.number, seq, time.monotonic_ns()) + self.padding
        return wire.publish(
            self.topic,
            payload,
            qos=self.qos,
            packet_id=wire.packet_id_for(seq),
            version=self.client.version,
        )

    def _on_acks(self, count: int) -> None:
        self.acked += count
        done = self._all_acked
        if done is not None and self.acked >= self.sent and not done.done():
            done.set_result(None)
