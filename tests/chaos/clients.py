"""Chaos test clients: MQTT 3.1.1 / 5.0 publishers and subscribers that
implement QoS 1/2 themselves on `services.mqtt.codec` (`tests.chaos.harness`
connects them).

Theory of operation. The clients keep their session state in plain objects
that outlive every TCP connection, as a persistent session requires:

- `Publisher` numbers each message (payload = its id: `offset + stride *
  n` for its n-th message, so several publishers' ids never collide and
  `id % stride` names the publisher), keeps every message until PUBCOMP
  (QoS 2) or PUBACK (QoS 1), and after each reconnect resends, in order,
  PUBLISH with DUP=1 for the ones without PUBREC / PUBACK and PUBREL for the
  ones with PUBREC (MQTT 3.1.1 4.4). It paces itself to `rate` msg/s while
  connected and caps its unacknowledged messages at `max_inflight`;
  `finish` ends it early (nothing new; the outstanding ones complete).
- `Subscriber` delivers a QoS 1 PUBLISH to the application every time it
  arrives (recording its DUP flag), and a QoS 2 PUBLISH only if its packet
  id is not awaiting PUBREL (method A of MQTT 3.1.1 4.3.3); the set of ids
  awaiting PUBREL survives reconnects. It speaks 3.1.1 (`level=4`,
  clean_session=0) or 5.0 (`level=5`: Clean Start 1 on its first CONNECT, 0
  after, Session Expiry Interval `session_expiry` in every CONNECT), stays
  connected (reconnecting after each node death) and subscribes again only
  when a reconnect finds its session gone. `clean=True` makes it a clean
  session instead (it subscribes on every connection).
- `OfflineSubscriber` is a `Subscriber` that SUBSCRIBEs exactly once, on its
  first connection, then cycles: online for a random while, away (DISCONNECT
  or just closing the socket, chosen at random), offline for a random while
  and until `gate` is open (the kill schedule closes the gate to make kills
  land while it is offline), then back with a persistent session and no
  SUBSCRIBE: every message of the offline windows must come from the
  broker's stored queue. Once `settle` is set it comes back and stays.

`until_complete_or_drained` ends a run: every listener has everything, or
(a loss) all are connected and Redis has held nothing for them for a while,
so nothing more can come once the publishers are done.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from services.mqtt.packets import (
    Connect,
    Disconnect,
    Packet,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
)
from services.session.redis import client_keys
from tests.chaos.harness import (
    LEVEL,
    LEVEL_5,
    SESSION_EXPIRY_S,
    ChaosError,
    Link,
    Ports,
    connect_retry,
)


@dataclass
class Publisher:
    client_id: str
    topic: str
    total: int
    rate: float
    max_inflight: int = 1000
    qos: int = 2
    stride: int = 1  # payload of the n-th message: offset + stride * n
    offset: int = 0
    next_seq: int = 0
    next_pid: int = 1
    outstanding: dict[int, list[int | bool]] = field(default_factory=dict)  # pid -> [id, released]
    connects: int = 0
    resent_publish: int = 0
    resent_pubrel: int = 0
    sessions_lost: int = 0  # reconnects whose CONNACK said session_present=0
    completed: int = 0
    resent_seqs: set[int] = field(default_factory=set)  # ids resent with DUP=1 after a reconnect
    acked_at: dict[int, float] = field(default_factory=dict)  # id -> time of 1st PUBREC / PUBACK
    sent_at: dict[int, float] = field(default_factory=dict)  # id -> time of its first PUBLISH

    @property
    def done(self) -> bool:
        return self.next_seq >= self.total and not self.outstanding

    def ids(self) -> range:
        """The payloads of every message this publisher sent or will send."""
        return range(self.offset, self.offset + self.stride * self.total, self.stride)

    def finish(self) -> None:
        """Send nothing new: `run` returns once the outstanding messages complete."""
        self.total = self.next_seq

    def _pid(self) -> int:
        for _ in range(65535):
            pid = self.next_pid
            self.next_pid = pid % 65535 + 1
            if pid not in self.outstanding:
                return pid
        raise ChaosError("no free packet id")

    async def run(self, port: int | Ports, deadline: float) -> None:
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
                        link.send(Publish(self.topic, payload, self.qos, dup=True, packet_id=pid))
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
                        self.acked_at.setdefault(int(entry[0]), time.monotonic())
                    link.send(Pubrel(packet.packet_id))
                elif (
                    isinstance(packet, Pubcomp if self.qos == 2 else Puback)
                    and (entry := self.outstanding.pop(packet.packet_id, None)) is not None
                ):
                    self.acked_at.setdefault(int(entry[0]), time.monotonic())
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
                now = time.monotonic()
                for _ in range(min(due, self.total - self.next_seq)):
                    pid = self._pid()
                    seq = self.offset + self.stride * self.next_seq
                    self.next_seq += 1
                    self.outstanding[pid] = [seq, False]
                    self.sent_at[seq] = now
                    link.send(Publish(self.topic, str(seq).encode(), self.qos, packet_id=pid))
                    sent += 1
                await link.drain()

        tasks = [asyncio.create_task(reader()), asyncio.create_task(writer())]
        try:
            pending = set(tasks)
            # Until both end, or the writer ended with nothing outstanding (after
            # `finish`, the reader may have no packet left to wake it).
            while pending and not (self.done and tasks[1].done()):
                done, pending = await asyncio.wait(
                    pending,
                    timeout=max(0.0, deadline - time.monotonic()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not done:
                    return  # the deadline: `run` says so
                for task in done:
                    if task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class Subscriber:
    client_id: str
    topic: str
    qos: int
    level: int = LEVEL
    session_expiry: int = SESSION_EXPIRY_S  # 5.0 only; 3.1.1 clean_session=0 has no expiry
    clean: bool = False  # a clean session: SUBSCRIBE on every connection
    delivered: list[tuple[int, bool]] = field(default_factory=list)  # (seq, dup) per app delivery
    trace: list[tuple[int, int, bool, int]] = field(default_factory=list)  # seq, pid, dup, conn
    awaiting_rel: set[int] = field(default_factory=set)
    seen: set[int] = field(default_factory=set)
    connects: int = 0
    sessions_lost: int = 0
    dup_publishes_suppressed: int = 0  # QoS 2 DUP PUBLISHes of an id awaiting PUBREL
    subscribed: bool = False
    subscribes: int = 0  # SUBSCRIBE packets sent
    connected: bool = False  # between a CONNACK and the end of that connection
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    suback: asyncio.Event = field(default_factory=asyncio.Event)  # set by the first SUBACK

    @property
    def name(self) -> str:
        return f"{self.client_id} ({'5.0' if self.level == LEVEL_5 else '3.1.1'} QoS {self.qos})"

    def connect_packet(self) -> Connect:
        """Persistent: 3.1.1 clean_session=0 always; 5.0 Clean Start 1 on the very first
        CONNECT (a fresh session), 0 after, with a Session Expiry Interval every time.
        Clean: Clean Start 1 (no expiry) every time."""
        if self.clean:
            return Connect(self.client_id, protocol_level=self.level, keep_alive=0)
        if self.level == LEVEL_5:
            props = Properties(session_expiry_interval=self.session_expiry)
            return Connect(
                self.client_id,
                protocol_level=LEVEL_5,
                clean_start=self.connects == 0,
                keep_alive=0,
                properties=props,
            )
        return Connect(self.client_id, clean_start=False, keep_alive=0)

    async def _connect(self, port: int | Ports, deadline: float) -> Link:
        link, connack = await connect_retry(port, self.connect_packet(), deadline)
        self.connects += 1
        self.connected = True
        if self.connects > 1 and not connack.session_present:
            self.sessions_lost += 0 if self.clean else 1
            self.subscribed = False
        return link

    def _subscribe(self, link: Link) -> None:
        self.subscribes += 1
        link.send(Subscribe(self.subscribes, (Subscription(self.topic, self.qos),)))

    async def run(self, port: int | Ports, deadline: float) -> None:
        while not self.stop.is_set():
            link = await self._connect(port, deadline)
            try:
                if not self.subscribed:
                    self._subscribe(link)
                await self._session(link)
            except (OSError, ConnectionError):
                pass
            finally:
                link.close()
                self.connected = False
            if time.monotonic() > deadline and not self.stop.is_set():
                raise ChaosError(f"{self.client_id}: still running at the deadline")

    async def _session(self, link: Link, until: float | None = None) -> None:
        """Handle packets until `stop` or the monotonic time `until`; ConnectionError on EOF."""
        ender = asyncio.create_task(self._end(until))
        try:
            while True:
                recv = asyncio.create_task(link.recv())
                await asyncio.wait({recv, ender}, return_when=asyncio.FIRST_COMPLETED)
                if not recv.done():
                    recv.cancel()
                    await asyncio.gather(recv, return_exceptions=True)
                    return
                self._handle(link, recv.result())
        finally:
            ender.cancel()
            await asyncio.gather(ender, return_exceptions=True)

    async def _end(self, until: float | None) -> None:
        if until is None:
            await self.stop.wait()
            return
        with contextlib.suppress(TimeoutError):  # the online window is over
            await asyncio.wait_for(self.stop.wait(), max(0.0, until - time.monotonic()))

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
            self.suback.set()
        elif isinstance(packet, Disconnect):
            raise ConnectionError(f"DISCONNECT from the server: {packet.reason_code:#x}")

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

    def order_violations(self, stride: int = 1) -> list[tuple[int, int, int]]:
        """(connection, seq, highest seq of its publisher before it on that connection)
        for every delivery without DUP=1 of a sequence number below one of the same
        publisher (`seq % stride`) delivered earlier on the same connection (DUP=1
        redeliveries may legitimately come back in between)."""
        out = []
        top: dict[tuple[int, int], int] = {}
        for seq, _, dup, conn in self.trace:
            key = (conn, seq % stride)
            high = top.get(key, -1)
            if seq < high and not dup:
                out.append((conn, seq, high))
            top[key] = max(high, seq)
        return out


@dataclass
class OfflineSubscriber(Subscriber):
    """Subscribes once, then goes offline and comes back (persistent, no SUBSCRIBE) in
    cycles whose lengths come from `rng`; see the module docstring."""

    rng: random.Random = field(default_factory=random.Random)
    online_s: tuple[float, float] = (0.5, 1.5)  # each online window, uniform
    offline_s: tuple[float, float] = (1.0, 3.0)  # each offline window, uniform (and gated)
    gate: asyncio.Event = field(default_factory=asyncio.Event)  # open: may come back online
    settle: asyncio.Event = field(default_factory=asyncio.Event)  # set: come back, stay online
    offline: bool = False  # away by choice (not a node death), between leaving and CONNACK
    offline_windows: list[tuple[float, float]] = field(default_factory=list)  # monotonic
    left_with_disconnect: int = 0
    left_with_close: int = 0

    async def run(self, port: int | Ports, deadline: float) -> None:
        while not self.stop.is_set():
            window = None if self.settle.is_set() else self.rng.uniform(*self.online_s)
            with_disconnect = self.rng.random() < 0.5
            await self._online(port, deadline, window, with_disconnect)
            if self.stop.is_set():
                return
            left = time.monotonic()
            pause = self.rng.uniform(*self.offline_s)
            with contextlib.suppress(TimeoutError):  # the offline window itself, not a wait
                await asyncio.wait_for(self.settle.wait(), pause)
            await self._wait_gate(deadline)
            self.offline_windows.append((left, time.monotonic()))
            if time.monotonic() > deadline:
                raise ChaosError(f"{self.client_id}: still running at the deadline")

    async def _wait_gate(self, deadline: float) -> None:
        try:
            await asyncio.wait_for(self.gate.wait(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise ChaosError(f"{self.client_id}: gate still closed at the deadline") from None

    async def _online(
        self, port: int | Ports, deadline: float, window: float | None, with_disconnect: bool
    ) -> None:
        """Online until `window` seconds after the first CONNACK (None: until `stop`),
        reconnecting when the node dies meanwhile; then leave."""
        until: float | None = None
        while not self.stop.is_set():
            link = await self._connect(port, deadline)
            self.offline = False
            if until is None and window is not None:
                until = time.monotonic() + window
            try:
                if self.subscribes == 0:
                    self._subscribe(link)  # the only SUBSCRIBE this client ever sends
                await self._session(link, until)
            except (OSError, ConnectionError):
                link.close()
                self.connected = False
                if time.monotonic() > deadline:
                    raise ChaosError(f"{self.client_id}: still running at the deadline") from None
                continue  # the node died: reconnect, the window goes on
            self.offline = True
            await self._leave(link, with_disconnect)
            return

    async def _end(self, until: float | None) -> None:
        if until is not None and not self.suback.is_set():  # the first window starts at SUBACK
            began = time.monotonic()
            waits = [asyncio.create_task(e.wait()) for e in (self.suback, self.stop)]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in waits:
                    task.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
            until += time.monotonic() - began
        await super()._end(until)

    async def _leave(self, link: Link, with_disconnect: bool) -> None:
        try:
            if with_disconnect:
                link.send(Disconnect())
            await link.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            link.close()
            self.connected = False
        if with_disconnect:
            self.left_with_disconnect += 1
        else:
            self.left_with_close += 1


async def stored_count(redis: aioredis.Redis, client_ids: Sequence[str]) -> int:
    """Messages in these clients' Redis queues and inflight windows."""
    total = 0
    for client_id in client_ids:
        keys = client_keys(client_id)
        total += int(await redis.hlen(keys[1])) + int(await redis.hlen(keys[4]))
    return total


async def until_complete_or_drained(
    redis: aioredis.Redis,
    complete: Callable[[], bool],
    listeners: Sequence[Subscriber],
    stored_for: Sequence[str],
    deadline: float,
    drained_for: float,
) -> None:
    """Until `complete()`, or a session was lost, or (a loss) every listener is
    connected and Redis has held nothing for `stored_for` during `drained_for`
    seconds: the publishers are done, so nothing more can come. Fails at `deadline`."""
    drained_since: float | None = None
    while not complete():
        now = time.monotonic()
        if any(s.sessions_lost for s in listeners):
            return
        if now > deadline:
            raise AssertionError("timed out waiting for every subscriber complete or drained")
        if all(s.connected for s in listeners) and await stored_count(redis, stored_for) == 0:
            drained_since = now if drained_since is None else drained_since
            if now - drained_since >= drained_for:
                return
        else:
            drained_since = None
        await asyncio.sleep(0.1)  # a poll of the clients' and Redis's state
