"""Node-to-node links: one ordered, batched TCP stream per peer.

Theory of operation. Each node listens on one cluster port and dials one
outbound link to every peer it sends to; a link carries frames one way
(dialler -> listener), so a pair of nodes has one link per direction and
frames from A to B keep A's order.

Handshake. The dialler sends HELLO (magic, protocol version, its node id);
the listener answers with its own HELLO and then reads frames. A listener
that does not speak the dialler's version answers and closes; a dialler
that reaches another node id than it dialled (a port reused after a
restart) closes too. Both are `HandshakeRejected`, counted, and retried
with the same backoff as a refused connection: a rolling upgrade ends them.

The wire format (HELLO, frames) is `services.cluster.frames`.

Batching and back-pressure. Frames wait in the peer's buffer; the first
frame of a loop turn schedules one flush (`call_soon`): one `transport.write`.
While the link is down, connecting, or paused (`pause_writing`), frames stay
buffered. Past `buffer_limit` bytes QoS 0 FORWARDs are dropped and counted;
the rest are kept, and `hold` tells the broker to hold the publisher (bounded)
until `on_drained`: a slow peer holds back only the publishers that send to
it, never the others' links. Frames handed to a transport whose connection
then breaks are lost: forwarding to clean sessions is at most once across a
node failure (they die with it); persistent sessions' messages are in Redis.

Reconnect: after a failure the dialler waits backoff_min_s, doubling up to
backoff_max_s, reset by a successful handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from services.cluster.api import HandshakeRejected, LinkError
from services.cluster.frames import (
    FRAME,
    MAX_FRAME,
    PROTOCOL_VERSION,
    LinkHandler,
    dispatch,
    forward_frame,
    hello,
    kick_frame,
    notify_frame,
    parse_hello,
)
from services.mqtt.packets import Message
from services.store import serial
from services.tasks import cancel_and_wait

log = logging.getLogger("weir.cluster.links")

DEFAULT_BUFFER_LIMIT = 8 * 1024 * 1024  # bytes per peer before QoS 0 forwards are dropped
HANDSHAKE_TIMEOUT_S = 2.0
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 2.0


@dataclass(slots=True)
class PeerStats:
    frames: int = 0  # handed to a transport
    writes: int = 0  # transport.write calls (one per flush)
    dropped: int = 0  # QoS 0 forwards dropped past the buffer limit
    connects: int = 0
    rejected: int = 0  # handshakes refused (version or identity)


class _Inbound(asyncio.Protocol):
    """The listener's side: HELLO, then frames to the handler."""

    def __init__(self, links: Links) -> None:
        self._links = links
        self._buf = bytearray()
        self._peer: str | None = None
        self._transport: asyncio.Transport | None = None
        self.paused = False  # by the node: a local subscriber cannot keep up
        self.holder: object = None  # the node's hold on this link (services.broker.remote)

    def pause(self) -> None:
        """Stop handling this peer's frames (and reading them) until `resume`."""
        if not self.paused and self._transport is not None:
            self.paused = True
            self._transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self._transport is not None:
            self.paused = False
            self._frames()
            if not self.paused:
                self._transport.resume_reading()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self._links._inbound.add(self._transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._links._inbound.discard(self._transport)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        try:
            if self._peer is None and not self._greet():
                return
            self._frames()
        except (LinkError, struct.error, UnicodeDecodeError, serial.SerialError) as exc:
            log.warning("link from %s: %s; closing", self._peer, exc)
            assert self._transport is not None
            self._transport.close()

    def _greet(self) -> bool:
        parsed = parse_hello(self._buf)
        if parsed is None:
            return False
        version, peer, used = parsed
        del self._buf[:used]
        assert self._transport is not None
        self._transport.write(hello(self._links.node_id))
        if version != PROTOCOL_VERSION:
            self._transport.close()
            raise HandshakeRejected(f"{peer} speaks link version {version}")
        self._peer = peer
        return True

    def _frames(self) -> None:
        buf, pos, end = self._buf, 0, len(self._buf)
        handler, peer = self._links.handler, self._peer
        assert peer is not None
        links = self._links
        try:
            while end - pos >= 5 and not self.paused:
                length, kind = FRAME.unpack_from(buf, pos)
                if length > MAX_FRAME or length < 1:
                    raise LinkError(f"frame of {length} bytes")
                if end - pos - 4 < length:
                    break
                body = bytes(buf[pos + 5 : pos + 4 + length])
                pos += 4 + length
                links.receiving = self
                dispatch(handler, peer, kind, body)
        finally:
            links.receiving = None
            del buf[:pos]


class _Outbound(asyncio.Protocol):
    """The dialler's side: reads the HELLO answer, then only writes."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.answered: asyncio.Future[tuple[int, str]] = asyncio.get_running_loop().create_future()
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.paused = False
        self.peer: _Peer | None = None

    def data_received(self, data: bytes) -> None:
        if self.answered.done():
            return
        self.buf += data
        try:
            parsed = parse_hello(self.buf)
        except LinkError as exc:
            self.answered.set_exception(exc)
            return
        if parsed is not None:
            self.answered.set_result(parsed[:2])

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.answered.done():
            self.answered.set_exception(LinkError("closed during handshake"))
        if not self.lost.done():
            self.lost.set_result(None)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.peer is not None:
            self.peer.schedule_flush()


class _Peer:
    def __init__(self, links: Links, node_id: str, address: str | None) -> None:
        self.links = links
        self.node_id = node_id
        self.address = address  # None: held until membership names the address
        self.frames: list[bytes] = []
        self.buffered = 0
        self.stats = PeerStats()
        self.transport: asyncio.Transport | None = None
        self.protocol: _Outbound | None = None
        self.connected = asyncio.Event()
        self.holding = False  # a publisher waits for this buffer to go out
        self._flush_scheduled = False
        self._task = (
            asyncio.get_running_loop().create_task(self._run()) if address is not None else None
        )

    def put(self, frame: bytes, droppable: bool) -> bool:
        if droppable and self.buffered + len(frame) > self.links.buffer_limit:
            self.stats.dropped += 1
            return False
        self.frames.append(frame)
        self.buffered += len(frame)
        self.schedule_flush()
        return True

    def schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        transport, proto = self.transport, self.protocol
        if transport is None or proto is None or proto.paused or not self.frames:
            return
        if transport.is_closing():  # the link broke; they go out on the next one
            return
        transport.write(b"".join(self.frames))
        self.stats.frames += len(self.frames)
        self.stats.writes += 1
        self.frames.clear()
        self.buffered = 0
        self._drained()

    def _drained(self) -> None:
        if self.holding:
            self.holding = False
            self.links.on_drained(self.node_id)

    async def _run(self) -> None:
        backoff = self.links.backoff_min_s
        while True:
            try:
                await self._session()
                backoff = self.links.backoff_min_s
            except HandshakeRejected as exc:
                self.stats.rejected += 1
                log.warning("link to %s at %s: %s", self.node_id, self.address, exc)
            except (OSError, LinkError, TimeoutError) as exc:
                log.debug("link to %s at %s: %s", self.node_id, self.address, exc)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.links.backoff_max_s)

    async def _session(self) -> None:
        assert self.address is not None
        host, _, port = self.address.rpartition(":")
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.links.handshake_timeout_s):
            transport, proto = await loop.create_connection(_Outbound, host, int(port))
            try:
                transport.write(hello(self.links.node_id))
                version, peer = await proto.answered
            except BaseException:
                transport.close()
                raise
        if version != PROTOCOL_VERSION or peer != self.node_id:
            transport.close()
            raise HandshakeRejected(f"answered as {peer!r} with link version {version}")
        proto.peer = self
        self.transport, self.protocol = transport, proto
        self.stats.connects += 1
        self.connected.set()
        self.schedule_flush()
        try:
            await proto.lost
        finally:
            self.connected.clear()
            self.transport = self.protocol = None
            transport.close()

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        if self.transport is not None:
            self.transport.close()


class Links:
    """This node's cluster links: the listener and one dialled link per peer."""

    def __init__(
        self,
        node_id: str,
        handler: LinkHandler,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise_host: str | None = None,
        buffer_limit: int = DEFAULT_BUFFER_LIMIT,
        handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
        backoff_min_s: float = BACKOFF_MIN_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        on_unknown: Callable[[str], None] | None = None,
        on_drained: Callable[[str], None] | None = None,
    ) -> None:
        self.node_id = node_id
        self.handler = handler
        self.host = host
        self.port = port
        self.advertise_host = advertise_host or host  # what peers dial (host may be 0.0.0.0)
        self.buffer_limit = buffer_limit
        self.handshake_timeout_s = handshake_timeout_s
        self.backoff_min_s = backoff_min_s
        self.backoff_max_s = backoff_max_s
        self.unroutable = 0  # frames for a node we have no address for (and do not hold)
        # Called with a node id we have no address for; when set, frames for it are
        # held (same limits) until `set_peer` names it or `remove_peer` gives up.
        self.on_unknown = on_unknown
        self.on_drained: Callable[[str], None] = on_drained or (lambda node_id: None)  # `hold`
        self.receiving: _Inbound | None = None  # the link whose frame is being handled
        self._peers: dict[str, _Peer] = {}
        self._inbound: set[asyncio.Transport] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Inbound(self), self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def address(self) -> str:
        return f"{self.advertise_host}:{self.port}"

    # -- peers -------------------------------------------------------------

    async def set_peer(self, node_id: str, address: str) -> None:
        """Dial node_id at address (again, if its address changed)."""
        if node_id == self.node_id:
            return
        peer = self._peers.get(node_id)
        if peer is not None and peer.address == address:
            return
        fresh = _Peer(self, node_id, address)
        if peer is not None:
            fresh.frames, fresh.buffered = peer.frames, peer.buffered
            fresh.holding, peer.holding = peer.holding, False
            fresh.stats = peer.stats
            fresh.schedule_flush()
            await peer.close()
        self._peers[node_id] = fresh

    async def remove_peer(self, node_id: str) -> None:
        """The peer died: close its link and forget what was buffered for it."""
        peer = self._peers.pop(node_id, None)
        if peer is not None:
            await peer.close()
            peer._drained()  # nothing more will go there: its waiters go on

    def peers(self) -> dict[str, str]:
        """The peers with an address (not those only held for)."""
        return {k: p.address for k, p in self._peers.items() if p.address is not None}

    def held(self) -> list[str]:
        return sorted(k for k, p in self._peers.items() if p.address is None)

    def is_connected(self, node_id: str) -> bool:
        peer = self._peers.get(node_id)
        return peer is not None and peer.connected.is_set()

    async def wait_connected(self, node_id: str, timeout_s: float) -> bool:
        peer = self._peers.get(node_id)
        if peer is None:
            return False
        try:
            async with asyncio.timeout(timeout_s):
                await peer.connected.wait()
        except TimeoutError:
            return False
        return True

    def stats(self, node_id: str) -> PeerStats:
        peer = self._peers.get(node_id)
        return peer.stats if peer is not None else PeerStats()

    def backlog(self, node_id: str) -> int:
        """Bytes waiting for node_id; past buffer_limit the broker should
        hold publishers of QoS 1/2 messages that go there."""
        peer = self._peers.get(node_id)
        return peer.buffered if peer is not None else 0

    def hold(self, node_id: str) -> bool:
        """Past buffer_limit for node_id? Then on_drained(node_id) follows (sent or gone)."""
        peer = self._peers.get(node_id)
        if peer is None or peer.buffered <= self.buffer_limit:
            return False
        peer.holding = True
        return True

    # -- sending -------------------------------------------------------------

    def _put(self, node_id: str, frame: bytes, droppable: bool) -> bool:
        peer = self._peers.get(node_id)
        if peer is None:
            if self.on_unknown is None or node_id == self.node_id:
                self.unroutable += 1
                return False
            peer = self._peers[node_id] = _Peer(self, node_id, None)
            self.on_unknown(node_id)
        return peer.put(frame, droppable)

    def forward(self, node_id: str, message: Message, client_ids: Sequence[str]) -> bool:
        """Deliver message to these clean-session clients on node_id. False
        if it was dropped (QoS 0 past the buffer limit, or no such peer)."""
        return self._put(node_id, forward_frame(message, client_ids), message.qos == 0)

    def forward_encoded(self, node_id: str, frame: bytes, qos: int) -> bool:
        """`forward` with a frame from `forward_frame`, for fan-out to many peers."""
        return self._put(node_id, frame, qos == 0)

    def notify(self, node_id: str, client_ids: Sequence[str]) -> bool:
        """Tell node_id to deliver these clients' Redis queues."""
        return self._put(node_id, notify_frame(client_ids), False)

    def kick(self, node_id: str, client_id: str, epoch: int) -> bool:
        """Tell node_id to close client_id's connection: a newer claim (epoch) took it."""
        return self._put(node_id, kick_frame(client_id, epoch), False)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for peer in list(self._peers.values()):
            await peer.close()
        self._peers.clear()
        for transport in list(self._inbound):
            transport.close()
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._server.wait_closed()
