"""The node's view on request, for the drift check (`weir streams verify`).

Theory of operation. A node with a state store (Redis) runs `ViewDumper`
once its listeners are open: about once a second it reads the drift
check's request key with one GET (services.state.live), and for a
nonce it has not answered it writes its view there, tagged with the nonce.

The view is taken in one synchronous step on the node's loop: copies of
the cluster view's sessions, subscriptions and retained messages, of the
routing trie's (client, filter) entries, and of the log positions the
view has applied. Nothing else runs in between, so the copy is the view
at exactly those positions (plus the node's own acknowledged events, which
it applies before its tail reads them back). The entries are frozen
objects, so turning them into records (`services.state.records`) and
writing them happens off the loop and in the background.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from services.broker.ports import now_ms
from services.state.clientsubs import SubscriptionOptions
from services.state.entries import RetainedEntry, SessionEntry
from services.state.live import LiveDump, LiveState, Positions
from services.state.records import records_of
from services.state.redis import RedisStateStore
from services.state.store import StateStore, StateStoreError
from services.tasks import cancel_and_wait

if TYPE_CHECKING:
    from services.broker.broker import Broker

log = logging.getLogger("weir.viewdump")

POLL_S: Final = 1.0  # how often a node looks for a request: one GET a second
DUMP_TTL_S: Final = 600.0  # a dump outlives the check that asked for it by this much at most


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
