"""The cluster service: who is alive, and how to reach them.

Nodes are peers (DESIGN 5). Each node keeps a heartbeat record with a TTL
holding its cluster-link address; a node whose record lapses is dead. No
node votes, so there is nothing to split: two nodes that disagree for a
moment about a third only disagree about where to forward, and fencing by
epoch (`services.session`) keeps the state right.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

DEFAULT_TTL_S = 10.0  # dead after 10 s without a heartbeat: a node busy with a connect
# storm may lag its loop by seconds, and calling it dead would cut its links for nothing
HEARTBEAT_FRACTION = 3  # beat every ttl / 3, so one late beat is not a death


class ClusterError(Exception):
    """Base of the cluster service's errors."""

    retriable = False


class MembershipUnavailable(ClusterError):
    """The membership store did not answer in time; retry later."""

    retriable = True


class LinkError(ClusterError):
    """A node-to-node link broke or refused us."""

    retriable = True


class HandshakeRejected(LinkError):
    """The peer speaks another link protocol version, or is not the node we dialled."""

    retriable = False


class InboundLink(Protocol):
    """A peer's link into this node: the node may make its frames wait."""

    holder: object  # what the node keeps per link (services.broker.remote.LinkHold)

    def pause(self) -> None:
        """Handle no more of its frames (and stop reading them) until `resume`."""
        ...

    def resume(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Member:
    node_id: str
    address: str  # "host:port" of the node's cluster-link listener


@dataclass(frozen=True, slots=True)
class MembershipChange:
    joined: tuple[Member, ...]  # new, or back with another address
    died: tuple[str, ...]  # node ids whose heartbeat lapsed or who left

    def __bool__(self) -> bool:
        return bool(self.joined or self.died)


class Membership(Protocol):
    ttl_s: float  # a record not refreshed for this long lapses

    async def join(self, member: Member) -> None:
        """Write this node's heartbeat record (TTL ttl_s). Call `beat` at
        least every ttl_s / HEARTBEAT_FRACTION to stay alive."""
        ...

    async def beat(self) -> None:
        """Refresh the record written by `join` (re-creating it if it lapsed)."""
        ...

    def beat_blocking(self) -> None:
        """`beat` from a thread of its own (the node's heartbeat thread,
        `services.cluster.beats`): blocking, on a connection of its own;
        MembershipUnavailable if it could not be stored."""
        ...

    async def leave(self) -> None:
        """Remove the record now: peers see the death on their next poll."""
        ...

    async def live_nodes(self) -> dict[str, Member]:
        """Every node whose record has not lapsed, this one included."""
        ...

    async def poll(self) -> MembershipChange:
        """What changed since the previous poll (the first reports every live
        node as joined). This node is never reported."""
        ...

    async def close(self) -> None: ...
