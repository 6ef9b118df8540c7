"""Cross-node routing: what the broker calls, and what it is called back with.

Theory of operation. The broker matches a publish against the global
subscription tree (from the log, `services.state.view`); for every
matching client that is not local it asks the router:

- clean session online on node X: `forward(message, {X: [client ids]})`.
  The message goes as published (the publisher's QoS and retain flag); the
  receiving node applies each target's own subscription options, as it
  does for its local publishers. QoS 0 may be dropped under back-pressure
  (counted by the link); QoS 1/2 is not.
- persistent session online on node X: the broker enqueues in Redis as for
  any persistent session, then `notify(X, client id)`; notifies are merged
  per node per loop turn, so X is told once per turn per client.
- takeover: the broker that claimed a session whose previous owner was X
  calls `kick(X, client id, epoch)`; X closes that connection (DISCONNECT
  0x8E on v5) unless its own epoch is already newer.

On the receiving side the router calls the `LocalNode` hooks. Membership
drives the links: each poll's joins dial (or re-dial) the peer, deaths close
the link and drop what was buffered for it. A message for a node that
membership does not know (yet, or any more) is counted as unroutable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from services.cluster.api import (
    InboundLink,
    Member,
    Membership,
    MembershipChange,
    MembershipUnavailable,
)
from services.cluster.beats import Heartbeat
from services.cluster.frames import LinkHandler, forward_frame_serialized
from services.cluster.links import DEFAULT_BUFFER_LIMIT, Links, PeerStats
from services.mqtt.packets import Message
from services.store import serial
from services.tasks import cancel_and_wait

log = logging.getLogger("weir.cluster.router")

BEATS_PER_FENCE = 3  # heartbeats sent in each half TTL: two late ones do not fence the node
POLL_INTERVAL_S = 0.5  # membership polls: one SCAN of a few keys, cheap; joins seen this fast


class LocalNode(Protocol):
    """The broker's side of the router (called on the loop)."""

    def deliver_forwarded(self, message: Message, client_ids: Sequence[str]) -> None:
        """Deliver to these local clean sessions, each with its own options."""
        ...

    def deliver_queued(self, client_ids: Sequence[str]) -> None:
        """These local persistent sessions have new messages in their queues."""
        ...

    def kicked(self, client_id: str, epoch: int, node: str) -> None:
        """Node `node` claimed client_id under `epoch`: close its connection here
        if ours is older, and tell `node` about what is queued for it later."""
        ...

    def node_joined(self, node_id: str) -> None:
        """Membership shows `node_id` live (new, or back)."""
        ...

    def peer_drained(self, node_id: str) -> None:
        """What was buffered for `node_id` after a `hold` went out (or it is gone):
        publishers held for it may go on."""
        ...

    def node_died(self, node_id: str) -> None:
        """Membership shows `node_id` dead (its heartbeat lapsed): take over
        what it held (DESIGN 5). Its link is already gone."""
        ...

    def fenced(self, fenced: bool) -> None:
        """True: this node could not renew its heartbeat for half the cluster
        TTL, so the others may soon take over what it holds: it must stop
        acknowledging anything (its clients are disconnected, 5.0 with 0x9C use
        another server, and CONNECTs refused 0x88). False: a heartbeat went through again."""
        ...


class _Ignore:
    def deliver_forwarded(self, message: Message, client_ids: Sequence[str]) -> None:
        pass

    def deliver_queued(self, client_ids: Sequence[str]) -> None:
        pass

    def kicked(self, client_id: str, epoch: int, node: str) -> None:
        pass

    def node_joined(self, node_id: str) -> None:
        pass

    def peer_drained(self, node_id: str) -> None:
        pass

    def node_died(self, node_id: str) -> None:
        pass

    def fenced(self, fenced: bool) -> None:
        pass


class ClusterRouter(LinkHandler):
    def __init__(
        self,
        node_id: str,
        membership: Membership,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise_host: str | None = None,
        buffer_limit: int = DEFAULT_BUFFER_LIMIT,
        poll_interval_s: float | None = None,
    ) -> None:
        self.node_id = node_id
        self.membership = membership
        self.local: LocalNode = _Ignore()
        self.links = Links(
            node_id,
            self,
            host=host,
            port=port,
            advertise_host=advertise_host,
            buffer_limit=buffer_limit,
            on_unknown=self._unknown,
            on_drained=self._drained,
        )
        self.beat_every_s = membership.ttl_s / 2 / BEATS_PER_FENCE
        self.poll_interval_s = poll_interval_s or min(POLL_INTERVAL_S, self.beat_every_s)
        self._held_since: dict[str, float] = {}  # node id -> when we first held frames for it
        self._wake = asyncio.Event()
        self._notify: dict[str, dict[str, None]] = {}
        self._notify_scheduled = False
        self._watch: asyncio.Task[None] | None = None
        self.heartbeat = Heartbeat(node_id, membership, self.beat_every_s, self._fenced)
        self._changed = asyncio.Event()  # set and replaced on every membership change

    @property
    def address(self) -> str:
        return self.links.address

    async def start(self, local: LocalNode) -> None:
        """Listen, join the membership, dial the live peers, then keep watching."""
        self.local = local
        await self.links.start()
        sent = time.monotonic()
        await self.membership.join(Member(self.node_id, self.links.address))
        self.heartbeat.start(sent)  # beats from a thread (a slow poll cannot hold them back)
        await self._apply(await self.membership.poll())
        self._watch = asyncio.get_running_loop().create_task(self._run_watch())

    @property
    def fenced(self) -> bool:
        """No heartbeat stored for half the cluster TTL (`beats.Heartbeat`)."""
        return self.heartbeat.fenced

    def _fenced(self, fenced: bool) -> None:
        self.local.fenced(fenced)

    async def _run_watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_interval_s):
                    await self._wake.wait()
            self._wake.clear()
            try:
                change = await self.membership.poll()
            except MembershipUnavailable as exc:
                log.warning("membership: %s", exc)
                continue
            if change:
                await self._apply(change)
            await self._expire_held(loop.time())

    def _drained(self, node_id: str) -> None:
        self.local.peer_drained(node_id)

    def _unknown(self, node_id: str) -> None:
        """Frames for a node membership has not shown us yet (the log can be
        ahead of our last poll): they are held, and we poll at once."""
        self._held_since.setdefault(node_id, asyncio.get_running_loop().time())
        self._wake.set()

    async def _expire_held(self, now: float) -> None:
        known = self.links.peers()
        for node_id, since in list(self._held_since.items()):
            if node_id in known:
                del self._held_since[node_id]
            elif now - since > self.membership.ttl_s:
                log.warning("dropping frames held for %s: no such live node", node_id)
                del self._held_since[node_id]
                await self.links.remove_peer(node_id)

    async def _apply(self, change: MembershipChange) -> None:
        for member in change.joined:
            log.info("node %s joined at %s", member.node_id, member.address)
            await self.links.set_peer(member.node_id, member.address)
            self.local.node_joined(member.node_id)
        for node_id in change.died:
            log.info("node %s died", node_id)
            await self.links.remove_peer(node_id)
            self.local.node_died(node_id)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def peers(self) -> list[str]:
        return sorted(self.links.peers())

    def is_live(self, node_id: str) -> bool:
        """Membership (as of its last poll) says node_id is alive."""
        return node_id in self.links.peers()

    async def wait_peers(self, node_ids: Iterable[str], timeout_s: float) -> bool:
        """Until a link to each of node_ids is up (tests, start-up)."""
        try:
            async with asyncio.timeout(timeout_s):
                for node_id in node_ids:
                    while node_id not in self.links.peers():
                        await self._changed.wait()
                    await self.links.wait_connected(node_id, timeout_s)
        except TimeoutError:
            return False
        return True

    # -- sending -------------------------------------------------------------

    def forward(self, message: Message, targets: Mapping[str, Sequence[str]]) -> int:
        """Forward to clean sessions on other nodes; the count of nodes that
        took it (the rest dropped it: QoS 0 back-pressure or unknown node)."""
        return len(targets) - len(self.forward_missed(message, targets))

    def forward_missed(self, message: Message, targets: Mapping[str, Sequence[str]]) -> list[str]:
        """`forward`; the nodes that dropped it (its copies for their clients are lost)."""
        blob = serial.dumps(message)
        missed = []
        for node_id, client_ids in targets.items():
            frame = forward_frame_serialized(blob, client_ids)
            if not self.links.forward_encoded(node_id, frame, message.qos):
                missed.append(node_id)
        return missed

    def notify(self, node_id: str, client_id: str) -> None:
        pending = self._notify.get(node_id)
        if pending is None:
            pending = self._notify[node_id] = {}
        pending[client_id] = None
        if not self._notify_scheduled:
            self._notify_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_notify)

    def _flush_notify(self) -> None:
        self._notify_scheduled = False
        pending, self._notify = self._notify, {}
        for node_id, client_ids in pending.items():
            self.links.notify(node_id, list(client_ids))

    def kick(self, node_id: str, client_id: str, epoch: int) -> bool:
        return self.links.kick(node_id, client_id, epoch)

    def backlog(self, node_id: str) -> int:
        return self.links.backlog(node_id)

    def receiving(self) -> InboundLink | None:
        """The peer link whose frame is being handled (LocalNode calls come from it)."""
        return self.links.receiving

    def hold(self, node_id: str) -> bool:
        """node_id's link is backed up: hold the publisher until `peer_drained`."""
        return self.links.hold(node_id)

    def stats(self, node_id: str) -> PeerStats:
        return self.links.stats(node_id)

    # -- receiving (LinkHandler) -------------------------------------------------

    def on_forward(self, peer: str, message: Message, client_ids: Sequence[str]) -> None:
        self.local.deliver_forwarded(message, client_ids)

    def on_notify(self, peer: str, client_ids: Sequence[str]) -> None:
        self.local.deliver_queued(client_ids)

    def on_kick(self, peer: str, client_id: str, epoch: int) -> None:
        self.local.kicked(client_id, epoch, peer)

    async def stop(self) -> None:
        """Leave (peers see it on their next poll), then close the links."""
        await cancel_and_wait(self._watch)
        self._watch = None
        await self.heartbeat.stop()
        if self._notify:
            self._flush_notify()
        with contextlib.suppress(MembershipUnavailable):
            await self.membership.leave()
        await self.links.close()
