"""Shared subscriptions: one member of a `$share` group per message, cluster-wide.

Theory of operation. Every node holds every group's members (the routing
trie, from the log), so the node a message is published on picks the member
itself: each message to a group goes to exactly one member, chosen among the
group's live members anywhere (`dispatch`):

- live: connected here (CONNACK sent), or online on another node per the
  log's session directory while membership says that node is alive;
- an offline persistent member is a candidate only when no member is live
  (its queue keeps the message until it comes back); so is a persistent
  member the directory still shows online on a node membership says is
  dead (its queue outlives that node; the notice to the node is held, then
  dropped, by the link, as for any message to a node it does not know).

`shared_local` (or the strategy `local`) narrows the choice to the members
connected to this node when there is one. The strategy (EMQX's names) picks
among the candidates: `random`; `round_robin`, a counter per publisher and
group (EMQX keeps it in the publisher's process); `round_robin_per_group`, a
counter per group on this node; `sticky`, the member picked first for a
publisher and group, kept while it is a candidate; `hash_clientid` and
`hash_topic`, CRC-32 of the publisher's client id or of the topic over the
candidates sorted by client id, so every node agrees; `local`, random among
this node's members, else among all.

The chosen member gets its copy the way any subscriber does: a session here
through `deliver`; a clean session elsewhere forwarded over the cluster link
to that one client (`Remote.forward_to`), whose node applies the group's
subscription (`deliver_forwarded`); a persistent session elsewhere through
its Redis queue in this node's delivery batch (the publisher's PUBACK waits
for it), its node told to take it (`Remote.enqueue`). Every forwarded copy
and every QoS 1/2 copy carries `Message.share`, so the link and the queue
keep which group it was for.

Redispatch (as EMQX's): the unacknowledged QoS 1/2 copies of a member whose
session ends on its node (`hand_over_left`; `unacked` sorts them per group)
go to `redispatch(group, filter, messages)` (`hand_over` does both): each
to one other candidate, once, as a new delivery there (DUP 0); with no
candidate left it is dropped and counted. A forwarded copy whose member is
gone by the time it arrives is redispatched by the receiving node.
A store that cannot be read then is logged and counted
(`shared_redispatch_failed`): those copies are lost with the session. A
persistent member's copies go over when it expires (`expiry`, on the node
that logs the expiry: a dead node's survivor too). A clean member's copies
on a node that dies were in that node's memory and die with it, as its
subscription does (a persistent member there keeps them in its queue).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import zlib
from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter
from typing import TypeVar

from services.broker.delivery import Delivery
from services.broker.ports import Session, SubOptions, now_ms
from services.broker.remote import Remote
from services.broker.routes import Routes, for_subscriber
from services.metrics.registry import Metrics
from services.mqtt.packets import Message
from services.queue.api import Inflight, QueueStore
from services.session.api import Fenced, SessionError
from services.state.entries import SessionEntry

log = logging.getLogger("weir.shared")

PICK_STATE_LIMIT = 65_536  # round-robin counters and sticky picks kept; cleared when full
#   (a key per publisher and group: bounded so a churn of publishers cannot grow it)

K = TypeVar("K")
V = TypeVar("V")
GroupFilter = tuple[str, str]  # (group, filter) of `$share/group/filter`
# A candidate: client id, its options, its session here (None: elsewhere), its
# directory entry when elsewhere (None: here).
Candidate = tuple[str, SubOptions, Session | None, SessionEntry | None]


def _remember(table: dict[K, V], key: K, value: V) -> None:
    if len(table) >= PICK_STATE_LIMIT and key not in table:
        table.clear()
    table[key] = value


def unacked(items: Iterable[Inflight]) -> dict[GroupFilter, list[Message]]:
    """A leaving member's shared copies to redispatch, per group: QoS 1/2 ones
    not yet received (a QoS 2 copy it answered with PUBREC is its own)."""
    out: dict[GroupFilter, list[Message]] = {}
    for item in items:
        message = item.message
        if message.share is not None and message.qos > 0 and not item.released:
            out.setdefault(message.share, []).append(message)
    return out


class Shared:
    def __init__(
        self,
        *,
        node_id: str,
        routes: Routes,
        remote: Remote,
        delivery: Delivery,
        deliver: Callable[[Session, Message], None],
        strategy: str,
        prefer_local: bool,
    ) -> None:
        self.node_id = node_id
        self.routes = routes
        self.remote = remote
        self.delivery = delivery
        self.deliver = deliver
        self.strategy = strategy
        self.prefer_local = prefer_local or strategy == "local"
        self.redispatched = 0  # copies a leaving member handed to another member
        self.dropped = 0  # copies to redispatch that found no member
        self._counters: dict[object, int] = {}
        self._sticky: dict[object, str] = {}

    def dispatch(
        self,
        message: Message,
        group_filter: GroupFilter,
        members: Sequence[tuple[str, SubOptions]],
        exclude: str | None = None,
    ) -> bool:
        """Give `message` to one member of the group (not `exclude`); False if none."""
        pool = self._candidates(members, exclude)
        if not pool:
            return False
        client_id, options, session, entry = self._pick(message, group_filter, pool)
        if entry is None:
            assert session is not None
            self.deliver(session, self._copy(message, options, group_filter))
        elif entry.persistent:
            self.remote.enqueue(client_id, entry, self._copy(message, options, group_filter))
        else:  # its node applies the options (`deliver_forwarded`)
            tagged = dataclasses.replace(message, share=group_filter)
            self.remote.forward_to(entry.node, client_id, tagged)
        return True

    @staticmethod
    def _copy(message: Message, options: SubOptions, group_filter: GroupFilter) -> Message:
        """The member's form, tagged with its group when it can be queued unacknowledged."""
        copy = for_subscriber(message, options, False)
        return dataclasses.replace(copy, share=group_filter) if copy.qos else copy

    def _candidates(
        self, members: Sequence[tuple[str, SubOptions]], exclude: str | None
    ) -> list[Candidate]:
        """The live members (this node's alone under `prefer_local` when it has
        any), else the offline persistent ones."""
        sessions = self.routes.sessions
        here: list[Candidate] = []
        there: list[Candidate] = []
        offline: list[Candidate] = []
        view = self.remote.view if self.remote.cluster is not None else None
        for client_id, options in members:
            if client_id == exclude:
                continue
            session = sessions.get(client_id)
            if session is not None and session.conn is not None and session.ready:
                here.append((client_id, options, session, None))
                continue
            entry = view.session(client_id) if view is not None else None
            if entry is not None and entry.online and entry.node != self.node_id:
                if self.remote.is_live(entry.node):
                    there.append((client_id, options, None, entry))
                elif entry.persistent:  # its node died: its queue waits for it
                    offline.append((client_id, options, None, entry))
            elif session is not None and session.expiry_s > 0:
                offline.append((client_id, options, session, None))
        if here and (self.prefer_local or not there):
            return here
        return here + there if there else offline

    def _pick(
        self, message: Message, group_filter: GroupFilter, pool: list[Candidate]
    ) -> Candidate:
        strategy = self.strategy
        count = len(pool)
        if strategy in ("round_robin", "round_robin_per_group"):
            key: object = group_filter
            if strategy == "round_robin":
                key = (message.sender, *group_filter)
            last = self._counters.get(key)
            index = random.randrange(count) if last is None else (last + 1) % count
            _remember(self._counters, key, index)
            return pool[index]
        if strategy == "sticky":
            sticky_key = (message.sender, *group_filter)
            stuck = self._sticky.get(sticky_key)
            for candidate in pool:
                if candidate[0] == stuck:
                    return candidate
            chosen = random.choice(pool)
            _remember(self._sticky, sticky_key, chosen[0])
            return chosen
        if strategy in ("hash_clientid", "hash_topic"):
            text = message.sender if strategy == "hash_clientid" else message.topic
            ordered = sorted(pool, key=itemgetter(0))
            return ordered[zlib.crc32(text.encode()) % count]
        return pool[random.randrange(count)]  # random, local

    def deliver_forwarded(self, message: Message, client_ids: Sequence[str]) -> None:
        """A peer picked these local clients for `message.share`: each gets it
        with its subscription's options; one that is gone has it redispatched."""
        assert message.share is not None
        group, topic_filter = message.share
        share_filter = f"$share/{group}/{topic_filter}"
        sessions = self.routes.sessions
        for client_id in client_ids:
            session = sessions.get(client_id)
            options = session.subs.get(share_filter) if session is not None else None
            if session is None or options is None or session.conn is None:
                self.redispatch(group, topic_filter, [message], client_id)
                continue
            self.deliver(session, self._copy(message, options, message.share))

    def hand_over(self, items: Iterable[Inflight], exclude: str) -> int:
        """A leaving member's inflight and queued items (`QueueStore.pending`
        and `take`): its unacknowledged shared copies to other members of their
        groups (`unacked`, then `redispatch` per group). Returns how many went."""
        return sum(
            self.redispatch(group, topic_filter, messages, exclude)
            for (group, topic_filter), messages in unacked(items).items()
        )

    def redispatch(
        self,
        group: str,
        topic_filter: str,
        messages: Sequence[Message],
        exclude: str | None = None,
    ) -> int:
        """Each QoS 1/2 message, not expired, to one live member of the group
        (`$share/group/filter`) other than `exclude`, as a new delivery (DUP 0);
        an offline persistent member only when none is live. Returns how many
        went; the rest (no member) are dropped and counted. Call on the loop;
        the copies go with this turn's delivery batch (scheduled here)."""
        now = now_ms()
        live = [
            m for m in messages if m.qos > 0 and (m.expires_at_ms is None or m.expires_at_ms > now)
        ]
        if not live:
            return 0
        group_filter = (group, topic_filter)
        members = self.routes.trie.match_shared(live[0].topic).get(group_filter, [])
        sent = sum(self.dispatch(m, group_filter, members, exclude) for m in live)
        self.delivery.schedule()
        self.redispatched += sent
        self.dropped += len(live) - sent
        return sent


async def hand_over_left(
    shared: Shared, queue: QueueStore, client_id: str, epoch: int, metrics: Metrics
) -> None:
    """A member's session ends under `epoch`: its inflight and queued shared
    copies go to other members (`Shared.hand_over`). Fenced: a newer owner has
    them. A store that fails is logged and counted, never swallowed."""
    try:
        items = await queue.pending(client_id, epoch)
        items += await queue.take(client_id, epoch, 1 << 16)
    except Fenced:
        return
    except SessionError as exc:
        metrics.shared_redispatch_failed += 1
        log.warning("shared copies of %s not redispatched (lost): %s", client_id, exc)
        return
    shared.hand_over(items, client_id)
