"""One partition scenario: a workload around a cut link, and what it showed.

Theory of operation. Each scenario runs the same cast on the shared cluster
(tests.partition.cluster), under ids and topics of its own:

- two persistent publishers on `p/<tag>`: QoS 2 (even payloads) and QoS 1
  (odd), each resending what was not acknowledged after every reconnect
  (tests.chaos.clients.Publisher, which records when each id was acked);
- two persistent subscribers to `p/<tag>`: 5.0 at QoS 2 and 3.1.1 at QoS 1;
- a will client (3.1.1, keep alive 2 s, will on `will/<tag>`) on the node
  the fault touches, and a watcher subscribed to `will/<tag>` on the other
  (persistent too: a fault can drop it, and a will published meanwhile must
  wait for it rather than be missed).

Every client reconnects after a drop to any node that answers (`Ports`).
The fault is made once the subscriptions are granted and the publishers
have had a second, held for `hold_s`, then healed; the publishers stop
after another second. The scenario then waits until both subscribers have
every id (publishers resend until acknowledged, so "every id" includes
every acknowledged one) or its deadline, and reports: acknowledged ids a
subscriber never got (must be 0), QoS 2 ids delivered twice to the QoS 2
subscriber (must be 0), QoS 1 duplicates (allowed), wills published, the
seconds from the heal until both subscribers had every id acknowledged
before the heal, and what the clients saw (drops, refused CONNECTs).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from services.mqtt.packets import Connect, Pingreq, Publish, Will
from tests.chaos.clients import Publisher, Subscriber
from tests.chaos.harness import LEVEL, LEVEL_5, ChaosError, Link, Ports
from tests.partition.cluster import Cluster, Node

RATE = 150.0  # msg/s per publisher while connected
WARM_S = 1.0  # publishing before the cut
AFTER_S = 1.0  # publishing after the heal
WILL_KEEP_ALIVE_S = 2
SETTLE_TIMEOUT_S = 30.0  # after the heal, for every id to arrive
PROBE = -1  # the payload of the routing probe (scenario ids are >= 0)


@dataclass
class WillClient:
    """Stays connected (PINGREQ every second) until `stop`; counts its drops."""

    client_id: str
    topic: str
    drops: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, node: Node) -> None:
        """Reads all along, so a drop is seen when it comes (the Redis cut times
        it): reading only after each second's PINGREQ added up to a second."""
        will = Will(self.topic, b"1", qos=1)
        connect = Connect(self.client_id, keep_alive=WILL_KEEP_ALIVE_S, will=will)
        link, _ = await Link.open(node, connect)
        loop = asyncio.get_running_loop()
        stopped = asyncio.ensure_future(self.stop.wait())
        reading = asyncio.ensure_future(link.recv())
        try:
            next_ping = loop.time()
            while not self.stop.is_set():
                if loop.time() >= next_ping:
                    link.send(Pingreq())
                    next_ping = loop.time() + 1.0
                await asyncio.wait({stopped, reading}, timeout=next_ping - loop.time(),
                                   return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
                if reading.done():
                    reading.result()  # a PINGRESP; EOF raises
                    reading = asyncio.ensure_future(link.recv())
        except (OSError, ConnectionError):
            self.drops += 1  # the node dropped it (or the test did): its will is due
        finally:
            for task in (stopped, reading):
                task.cancel()
            await asyncio.gather(stopped, reading, return_exceptions=True)
            link.close()


@dataclass
class Outcome:
    fault: str
    clients_saw: str
    acked_lost: int
    qos2_duplicates: int
    qos1_duplicates: int
    wills: int
    wills_expected: int
    converge_s: float | None
    missing: dict[str, list[int]]

    def row(self) -> str:
        converge = "never" if self.converge_s is None else f"{self.converge_s:.1f} s"
        return (
            f"| {self.fault} | {self.clients_saw} | {self.acked_lost} | "
            f"QoS 2: {self.qos2_duplicates}, QoS 1: {self.qos1_duplicates} | "
            f"{self.wills} (expected {self.wills_expected}) | {converge} |"
        )


@dataclass
class Scenario:
    cluster: Cluster
    tag: str
    publisher_home: str  # node name
    subscriber_home: str
    will_home: str
    total: int = 0
    pubs: list[Publisher] = field(default_factory=list)
    subs: list[Subscriber] = field(default_factory=list)
    watcher: Subscriber | None = None
    will: WillClient | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    healed_at: float = 0.0

    def ports(self, home: str) -> Ports:
        nodes = list(self.cluster.nodes.values())
        index = [n.name for n in nodes].index(home)
        return Ports(nodes, random.Random(self.tag), home=index)  # type: ignore[arg-type]

    async def start(self, hold_s: float) -> None:
        per_publisher = int(RATE * (WARM_S + hold_s + AFTER_S))
        self.total = 2 * per_publisher
        topic = f"p/{self.tag}"
        self.pubs = [
            Publisher(f"{self.tag}-pub2", topic, per_publisher, RATE, qos=2, stride=2, offset=0),
            Publisher(f"{self.tag}-pub1", topic, per_publisher, RATE, qos=1, stride=2, offset=1),
        ]
        self.subs = [
            Subscriber(f"{self.tag}-sub2", topic, 2, level=LEVEL_5),
            Subscriber(f"{self.tag}-sub1", topic, 1, level=LEVEL),
        ]
        self.watcher = Subscriber(f"{self.tag}-watch", f"will/{self.tag}", 1)
        self.will = WillClient(f"{self.tag}-will", f"will/{self.tag}")
        deadline = time.monotonic() + 120.0
        other = next(n for n in self.cluster.nodes if n != self.will_home)
        for sub in [*self.subs, self.watcher]:
            home = other if sub is self.watcher else self.subscriber_home
            self.tasks.append(asyncio.create_task(sub.run(self.ports(home), deadline)))
        for sub in [*self.subs, self.watcher]:
            await asyncio.wait_for(sub.suback.wait(), 10.0)
        await self._routed()
        self.tasks.append(asyncio.create_task(self.will.run(self.cluster.nodes[self.will_home])))
        for pub in self.pubs:
            running = pub.run(self.ports(self.publisher_home), deadline)
            self.tasks.append(asyncio.create_task(running))
        await asyncio.sleep(WARM_S)  # publishing before the cut: pacing, not synchronisation

    async def _routed(self) -> None:
        """Until the publishers' node routes to the subscribers: a SUBACK on one node
        means the log has the subscription, another node follows the log a moment
        later. A probe (payload -1, QoS 0, left out of every figure) is published
        there until both subscribers have it."""
        node = self.cluster.nodes[self.publisher_home]
        link, _ = await Link.open(node, Connect(f"{self.tag}-probe"))
        try:
            deadline = time.monotonic() + 10.0
            while not all(PROBE in s.seen for s in self.subs):
                if time.monotonic() > deadline:
                    raise ChaosError(f"{node.name} never routed {self.tag}'s subscriptions")
                link.send(Publish(self.subs[0].topic, str(PROBE).encode()))
                await asyncio.sleep(0.05)  # the probe's pace: a poll of the subscribers
        finally:
            link.close()

    async def fault(
        self, hold_s: float, cut: Callable[[], None], heal: Callable[[], None],
        during: Callable[[], Awaitable[None]] | None = None,
    ) -> None:  # fmt: skip
        cut()
        began = time.monotonic()
        try:
            if during is not None:
                await during()
            await asyncio.sleep(max(0.0, hold_s - (time.monotonic() - began)))  # the fault's length
        finally:
            heal()
            self.healed_at = time.monotonic()

    def complete(self) -> bool:
        return all(not s.missing(self.total) for s in self.subs) and all(p.done for p in self.pubs)

    async def settle(self) -> float | None:
        """Until every subscriber has every id. Returns the seconds from the heal
        until both had every id acknowledged before it (the publishers go on a
        while after the heal, so "every id" comes later), or None if not in time."""
        deadline = self.healed_at + SETTLE_TIMEOUT_S
        before = {seq for p in self.pubs for seq, at in p.acked_at.items() if at <= self.healed_at}
        converged: float | None = None
        while not self.complete():
            for task in self.tasks:
                if task.done() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            if converged is None and all(before <= s.seen for s in self.subs):
                converged = time.monotonic() - self.healed_at
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.05)  # a poll of the clients' state
        return converged if converged is not None else time.monotonic() - self.healed_at

    def wills_due(self) -> int:
        """1 if the will client lost its connection other than by DISCONNECT, else 0."""
        return 1 if self.will is not None and self.will.drops else 0

    async def wills_settled(self, expected: int) -> int:
        """Wills seen by the watcher, once the expected number came (or 1 s passed
        beyond a cluster TTL, for an expected 0 or a late extra one)."""
        assert self.watcher is not None
        deadline = time.monotonic() + 2 * self.cluster.ttl_s + 1.0
        while time.monotonic() < deadline and self._wills() < expected:
            await asyncio.sleep(0.05)  # a poll of the watcher's deliveries
        return self._wills()

    def _wills(self) -> int:
        """Wills published: the watcher's first deliveries (a QoS 1 resend after
        its reconnect has DUP set and is the same will), or 1 if it only had resends."""
        assert self.watcher is not None
        delivered = self.watcher.delivered
        return sum(1 for _, dup in delivered if not dup) or min(len(delivered), 1)

    async def stop(self) -> None:
        for sub in self.subs:
            sub.stop.set()
        if self.watcher is not None:
            self.watcher.stop.set()
        if self.will is not None:
            self.will.stop.set()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def outcome(
        self, fault: str, saw: str, wills: int, expected: int, converge: float | None
    ) -> Outcome:
        acked = {seq for p in self.pubs for seq in p.acked_at}
        missing = {s.client_id: sorted(acked - s.seen) for s in self.subs}
        qos2 = self.subs[0]
        qos2_dups = sum(1 for seq, _ in qos2.duplicates() if seq >= 0 and seq % 2 == 0)
        qos1_dups = sum(1 for s in self.subs for seq, _ in s.duplicates() if seq >= 0) - qos2_dups
        return Outcome(
            fault, saw, sum(len(m) for m in missing.values()), qos2_dups, qos1_dups,
            wills, expected, converge, missing,
        )  # fmt: skip


def drops(scenario: Scenario) -> str:
    """How often the clients reconnected, whether a session was ever lost, and
    whether the will client kept its connection."""
    reconnects = sum(max(0, c.connects - 1) for c in [*scenario.pubs, *scenario.subs])
    lost = sum(c.sessions_lost for c in [*scenario.pubs, *scenario.subs])
    will = "will client dropped" if scenario.wills_due() else "will client stayed connected"
    return f"{reconnects} reconnects, {lost} sessions lost, {will}"


__all__ = ["ChaosError", "Outcome", "Scenario", "WillClient", "drops"]
