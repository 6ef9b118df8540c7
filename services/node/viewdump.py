"""The node's view on request, for the drift check (`weir streams verify`).

Theory of operation. A node with a state store (Redis) runs `ViewDumper`
once its listeners are open: about once a second it reads the drift
check's request key with one GET (services.statestore.live), and for a
nonce it has not answered it writes its view there, tagged with the nonce.

The view is taken in one synchronous step on the node's loop: copies of
the cluster view's sessions, subscriptions and retained messages, of the
routing trie's (client, filter) entries, and of the log positions the
view has applied. Nothing else runs in between, so the copy is the view
at exactly those positions (plus the node's own acknowledged events, which
it applies before its tail reads them back). The entries are frozen
objects, so turning them into records and writing them happens off the
loop and in the background.

The records (`session_record`, `subscription_record`, `retained_record`)
are also how the drift check describes the replay and the state store, so
every source is compared field by field in one vocabulary. A retained
message is described by digests of its payload and properties, never the
payload itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from services.cluster.view import ClusterView, RetainedEntry, SessionEntry, SubscriptionOptions
from services.node.ports import now_ms
from services.statestore.api import StateStore, StateStoreError
from services.statestore.live import LiveDump, LiveState, Positions, Record
from services.statestore.redis import RedisStateStore
from services.tasks import cancel_and_wait

if TYPE_CHECKING:
    from services.node.broker import Broker

log = logging.getLogger("weir.viewdump")

POLL_S: Final = 1.0  # how often a node looks for a request: one GET a second
DUMP_TTL_S: Final = 600.0  # a dump outlives the check that asked for it by this much at most
DIGEST_BYTES: Final = 16  # blake2b digest size: 128 bits tell payloads apart


# -- records: one vocabulary for every source ------------------------------------


def session_record(e: SessionEntry) -> Record:
    return {
        "node": e.node,
        "online": e.online,
        "expiry_s": e.expiry_s,
        "version": e.version,
        "epoch": e.epoch,
        "clean_start": e.clean_start,
        "protocol": e.protocol,
        "username": e.username,
        "offline_since_ms": e.offline_since_ms,
    }


def subscription_record(o: SubscriptionOptions) -> Record:
    return {
        "qos": o.qos,
        "no_local": o.no_local,
        "retain_as_published": o.retain_as_published,
        "retain_handling": o.retain_handling,
        "subscription_id": o.subscription_id,
        "version": o.version,
    }


def digest(data: bytes) -> str:
    return "blake2b:" + hashlib.blake2b(data, digest_size=DIGEST_BYTES).hexdigest()


def retained_record(e: RetainedEntry) -> Record:
    props = [
        e.payload_format_indicator,
        e.content_type,
        e.response_topic,
        e.correlation_data.hex() if e.correlation_data is not None else None,
        [list(p) for p in e.user_property],
    ]
    has_props = any(p for p in props if p is not None)
    return {
        "version": e.version,
        "qos": e.qos,
        "payload": digest(e.payload),
        "size": len(e.payload),
        "expires_at_ms": e.expires_at_ms,
        "sender": e.sender,
        "properties": digest(json.dumps(props).encode()) if has_props else None,
    }


@dataclass(frozen=True, slots=True)
class ViewRecords:
    sessions: dict[str, Record]
    subscriptions: dict[tuple[str, str], Record]
    retained: dict[str, Record]


def view_records(view: ClusterView) -> ViewRecords:
    """A view as records (the drift check's replay and state store, too)."""
    return records_of(view.sessions(), view.all_subscriptions(), view.retained_topics())


def records_of(
    sessions: dict[str, SessionEntry],
    subscriptions: dict[str, dict[str, SubscriptionOptions]],
    retained: dict[str, RetainedEntry],
) -> ViewRecords:
    return ViewRecords(
        sessions={c: session_record(e) for c, e in sessions.items()},
        subscriptions={
            (c, f): subscription_record(o)
            for c, subs in subscriptions.items()
            for f, o in subs.items()
        },
        retained={t: retained_record(e) for t, e in retained.items()},
    )


# -- the node's side ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Copy:
    """The view at one moment: copies of containers of frozen entries."""

    ts_ms: int
    positions: Positions
    sessions: dict[str, SessionEntry]
    subscriptions: dict[str, dict[str, SubscriptionOptions]]
    retained: dict[str, RetainedEntry]
    table: list[tuple[str, str]]

    def dump(self, node: str, nonce: str) -> LiveDump:
        records = records_of(self.sessions, self.subscriptions, self.retained)
        return LiveDump(
            node=node,
            nonce=nonce,
            ts_ms=self.ts_ms,
            positions=self.positions,
            sessions=records.sessions,
            subscriptions=records.subscriptions,
            retained=records.retained,
            table={entry: {} for entry in self.table},
        )


class ViewDumper:
    def __init__(
        self,
        broker: Broker,
        live: LiveState,
        poll_s: float = POLL_S,
        ttl_s: float = DUMP_TTL_S,
    ) -> None:
        self.broker = broker
        self.live = live
        self.poll_s = poll_s
        self.ttl_s = ttl_s
        self.answered: str | None = None

    def copy(self) -> _Copy:
        """The view, its routing trie and its positions; synchronous, on the loop."""
        logstate, trie = self.broker.logstate, self.broker.trie
        view = logstate.view
        return _Copy(
            ts_ms=now_ms(),
            positions=logstate.events.positions(),
            sessions=view.sessions(),
            subscriptions=view.all_subscriptions(),
            retained=view.retained_topics(),
            table=[(c, f) for c in trie.keys() for f in trie.filters(c)],  # noqa: SIM118
        )

    async def answer(self, nonce: str) -> None:
        taken = self.copy()
        dump = await asyncio.to_thread(taken.dump, self.broker.node_id, nonce)
        fields = await self.live.write(dump, self.ttl_s)
        log.info("wrote this node's view for the drift check (%d entries)", fields - 1)

    async def run(self) -> None:
        failing = False
        while True:
            try:
                nonce = await self.live.asked()
                if nonce is not None and nonce != self.answered:
                    await self.answer(nonce)
                    self.answered = nonce
                failing = False
            except StateStoreError as exc:
                if not failing:  # once per outage, not once a second
                    log.warning("drift check: cannot answer through the state store: %s", exc)
                failing = True
            await asyncio.sleep(self.poll_s)


def start(broker: Broker, state: StateStore | None) -> asyncio.Task[None] | None:
    """Run a ViewDumper for `broker` if the node has a Redis state store."""
    if not isinstance(state, RedisStateStore):
        return None
    dumper = ViewDumper(broker, LiveState(state.client, state.topic_prefix))
    return asyncio.get_running_loop().create_task(dumper.run(), name="weir-viewdump")


async def stop(task: asyncio.Task[None] | None) -> None:
    await cancel_and_wait(task)
