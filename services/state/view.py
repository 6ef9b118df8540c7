"""The cluster view: what the event log says, folded into memory.

This is the reference fold of the log. Two other implementations of rules
1-3 exist, for speed, and tests hold each to this one: the state-store job
(streams/statestore.py: Spark's newest-per-key within a batch, then
streams/scripts/state_apply.lua's version guards across batches) in
tests/streams/test_statestore.py (a whole log in one batch: Spark's part
alone; batches twice and in reverse order: the script's part; a snapshot
plus the rest of the log: a node's start) and tests/streams/test_state_job.py
(the running job, killed and restarted). The embedded default's nodes
write the same store with the same script, one group of appends at a time
(services/state/writer.py, its rule-2 predicate `ends_session` taken from
here), held to this fold by tests/contract/test_state_writer.py. A rule
changed here is changed there too, or those tests fail.

Theory of operation. The view is a pure projection of the log: the same
set of events gives the same view, whatever order the partitions were
interleaved in and however often an event is seen again. Three rules make
that so.

1. Latest version wins, per key. Session state is kept per client id,
   subscription state per (client id, filter), retained state per topic;
   each remembers the version of the event that set it, and an event
   applies only if its version is higher. Removals (Unsubscribed,
   RetainedCleared, a session's end) leave a tombstone version behind, so
   an older event seen later cannot bring the state back.
2. A session's end clears its subscriptions by version. SessionExpired,
   SessionDiscarded, SessionOpened with clean_start, and SessionClosed with
   expiry_s == 0 (a session that ends with its connection) raise the
   client's floor to their version: every subscription event of that
   client with a lower version is dropped, now or when it arrives later.
   Subscription and session events share one per-client version counter,
   so "lower version" means "happened before the session ended". The
   floor moves even when the session event itself is stale for the
   directory, because the clearing really happened at that version.
3. Version races. Two writers may log one key's events out of version
   order (writer A takes v3, writer B takes v4, B's append lands first).
   Rule 1 settles it: v3 is ignored, as if it had come first. So an
   Unsubscribed(v4) seen before Subscribed(v3) of the same filter leaves
   no subscription, and a Subscribed(v4) seen before Unsubscribed(v3)
   leaves the subscription.

4. Ended clients are forgotten, oldest first, past a bound. A client whose
   session ended (no directory entry, no live subscription) leaves only its
   versions behind, there to refuse its own late events; a fleet whose
   clients connect with ever new ids would grow by them for good. With
   `keep_ended` set, the view keeps the versions of that many ended
   clients and forgets the longest-ended beyond them. The node sets it once
   its replay is done (`services.broker.logstate`), when the events it reads
   are the ones being appended now: a client's late event (two writers in a
   race, or one topic read ahead of the other) comes within moments of its
   end, long before that many other clients ended after it. During replay
   nothing is forgotten, so replay stays the pure fold of rules 1-3.
   Cleared retained topics are forgotten the same way, past the same
   bound: a topic that holds no retained message keeps only its version.
   Each forgotten client or topic goes to `on_forget` when set, so a store
   that mirrors the view (the embedded default's) forgets it too. An ended
   client whose only state is its versions is kept without an object of its
   own (`services.state.ended`); an event about it, even a refused one,
   counts as its newest end (it is forgotten after those that ended before).

The directory entry of a client is what its newest session event says:
online on `node` after SessionOpened; offline with its expiry after a
SessionClosed with expiry_s > 0; absent after the session ended.

The node mirrors subscription changes into its routing trie through the
`on_subscribe(client_id, filter, options)` and
`on_unsubscribe(client_id, filter)` callbacks; options replacing options
call on_subscribe again. A state store snapshot's rows
(`load_subscriptions`, the same rules in bulk) reach it one client at a
time through `on_subscribe_many(client_id, [(filter, options), ...])`
when that is given.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from services.event.schema import (
    Event,
    RetainedCleared,
    RetainedSet,
    SessionClosed,
    SessionDiscarded,
    SessionExpired,
    SessionOpened,
    Subscribed,
    Unsubscribed,
)
from services.state.clientsubs import ClientSubs, SubscriptionOptions
from services.state.ended import Ended
from services.state.entries import RetainedEntry, SessionEntry, ViewSnapshot

SubscribeHook = Callable[[str, str, SubscriptionOptions], None]
UnsubscribeHook = Callable[[str, str], None]
# One client's new subscriptions at once: (client_id, [(filter, options), ...]).
SubscribeManyHook = Callable[[str, list[tuple[str, SubscriptionOptions]]], None]
# Rule 4 forgot an ended client ("client", id, its session version) or a
# cleared retained topic ("topic", topic, its version): a store that mirrors
# the view (services.state.writer) forgets it too.
ForgetHook = Callable[[str, str, int], None]
OPTIONS_MEMO = 65_536  # distinct (options, version) sets shared while a snapshot loads


def ends_session(event: Event) -> bool:
    """Rule 2's session ends: the events that clear a client's subscriptions
    below their version."""
    return (
        isinstance(event, SessionExpired | SessionDiscarded)
        or (isinstance(event, SessionOpened) and event.clean_start)
        or (isinstance(event, SessionClosed) and event.expiry_s == 0)
    )


def _ignore_subscribe(client_id: str, filter_: str, options: SubscriptionOptions) -> None:
    pass


def _ignore_unsubscribe(client_id: str, filter_: str) -> None:
    pass


class ClusterView:
    def __init__(
        self,
        on_subscribe: SubscribeHook = _ignore_subscribe,
        on_unsubscribe: UnsubscribeHook = _ignore_unsubscribe,
        on_subscribe_many: SubscribeManyHook | None = None,
    ) -> None:
        self.on_subscribe = on_subscribe
        self.on_unsubscribe = on_unsubscribe
        self.on_subscribe_many = on_subscribe_many
        self.on_forget: ForgetHook | None = None  # see rule 4
        self._sessions: dict[str, SessionEntry] = {}
        self._session_versions: dict[str, int] = {}
        self._subs: dict[str, ClientSubs] = {}
        self._retained: dict[str, RetainedEntry] = {}
        self._retained_versions: dict[str, int] = {}
        self._ended = Ended()  # rule 4; a retired one has no entry in the dicts
        self._cleared: OrderedDict[str, None] = OrderedDict()  # topics, longest-cleared first
        self.keep_ended: int | None = None  # see rule 4; None: forget nothing
        self.applied = 0
        self.ignored = 0
        self.forgotten = 0  # ended clients and cleared topics forgotten (rule 4)

    # -- reading ----------------------------------------------------------

    def session(self, client_id: str) -> SessionEntry | None:
        return self._sessions.get(client_id)

    def sessions(self) -> dict[str, SessionEntry]:
        return dict(self._sessions)

    def subscriptions(self, client_id: str) -> dict[str, SubscriptionOptions]:
        subs = self._subs.get(client_id)
        return dict(subs.live) if subs is not None and subs.live else {}

    def all_subscriptions(self) -> dict[str, dict[str, SubscriptionOptions]]:
        return {c: dict(s.live or {}) for c, s in self._subs.items() if s.live}

    def version(self, client_id: str) -> int:
        """The version of the client's newest session event held (0: none)."""
        held = self._ended.get(client_id)
        return held[0] if held is not None else self._session_versions.get(client_id, 0)

    def floor(self, client_id: str) -> int:
        """The client's subscription floor (rule 2; 0: none)."""
        held = self._ended.get(client_id)
        subs = self._subs.get(client_id)
        return held[1] if held is not None else subs.floor if subs is not None else 0

    def known_clients(self) -> list[str]:
        """The clients whose versions the view holds (online, offline or ended)."""
        return [*self._session_versions, *(c for c, _, _ in self._ended.retired_clients())]

    @property
    def ended(self) -> int:
        """Ended clients whose versions are kept (rule 4)."""
        return len(self._ended)

    def retained(self, topic: str) -> RetainedEntry | None:
        return self._retained.get(topic)

    def retained_topics(self) -> dict[str, RetainedEntry]:
        return dict(self._retained)

    def snapshot(self) -> ViewSnapshot:
        return ViewSnapshot(
            sessions=tuple(sorted(self._sessions.items())),
            subscriptions=tuple(
                sorted((c, f, o) for c, s in self._subs.items() for f, o in (s.live or {}).items())
            ),
            retained=tuple(sorted(self._retained.items())),
        )

    # -- applying -----------------------------------------------------------

    def apply(self, event: Event) -> bool:
        """Fold one event in. True if it changed the view; False if it was
        stale (its version not above the one held) or a duplicate."""
        client_id: str | None = getattr(event, "client_id", None)  # retained: a topic
        gone = client_id is not None and self._ended.retired  # retired: none in the dicts
        if gone and client_id is not None and client_id not in self._session_versions:
            self._back(client_id)
        changed = self._apply(event)
        if client_id is not None and client_id in self._ended:
            self._retire(client_id)
        if changed:
            self.applied += 1
        else:
            self.ignored += 1
        return changed

    def _apply(self, event: Event) -> bool:
        if isinstance(event, Subscribed):
            return self._subscribed(event)
        if isinstance(event, Unsubscribed):
            return self._unsubscribed(event)
        if isinstance(event, RetainedSet | RetainedCleared):
            return self._retained_event(event)
        return self._session_event(event)

    def _subscribed(self, e: Subscribed) -> bool:
        return self._subscribe(
            e.client_id,
            e.filter,
            e.version,
            e.qos,
            e.no_local,
            e.retain_as_published,
            e.retain_handling,
            e.subscription_id,
        )

    def _subscribe(
        self,
        client_id: str,
        filter_: str,
        version: int,
        qos: int,
        no_local: bool,
        retain_as_published: bool,
        retain_handling: int,
        subscription_id: int | None,
    ) -> bool:
        subs = self._subs.get(client_id)
        if subs is None:
            subs = self._subs[client_id] = ClientSubs()
        if not subs.takes(filter_, version):
            return False
        opts = SubscriptionOptions(
            qos, no_local, retain_as_published, retain_handling, subscription_id, version
        )
        subs.add(filter_, opts)
        self.on_subscribe(client_id, filter_, opts)
        return True

    def _unsubscribed(self, e: Unsubscribed) -> bool:
        return self._unsubscribe(e.client_id, e.filter, e.version)

    def _unsubscribe(self, client_id: str, filter_: str, version: int) -> bool:
        subs = self._subs.get(client_id)
        if subs is None:
            subs = self._subs[client_id] = ClientSubs()
        if version <= subs.floor or version <= subs.held(filter_):
            return False
        was_live = subs.live is not None and subs.live.pop(filter_, None) is not None
        if subs.gone is None:
            subs.gone = {}
        subs.gone[filter_] = version
        if was_live:
            self.on_unsubscribe(client_id, filter_)
        return True

    # -- loading a snapshot (the state store) ---------------------------------

    def load_floor(self, client_id: str, version: int) -> bool:
        """A session end at `version` (its event may be older than the
        client's newest session event, so `apply` cannot carry it)."""
        if self._ended.retired:
            self._back(client_id)
        changed = self._clear_below(client_id, version)
        if client_id not in self._sessions:
            if client_id not in self._ended:
                self._ended.end(client_id)  # ended, as far as the snapshot says
            self._retire(client_id)
        self.applied += changed
        return changed

    def load_subscriptions(self, rows: Iterable[Sequence[Any]]) -> int:
        """The bulk form of applying Subscribed / Unsubscribed events, for a
        snapshot's rows: (client, filter, version, live, qos, no_local,
        retain_as_published, retain_handling, subscription_id, ts_ms, node).
        Same rules as `apply`; returns how many changed the view. A client's
        consecutive rows reach `on_subscribe_many` in one call (when set,
        else `on_subscribe` each), and equal options of equal versions share
        one object: a fleet's clients subscribe alike, a million rows hold a
        few thousand distinct ones."""
        changed = 0
        memo: dict[tuple[Any, ...], SubscriptionOptions] = {}
        client: str | None = None
        subs = ClientSubs()
        batch: list[tuple[str, SubscriptionOptions]] = []
        for client_id, filter_, version, live, qos, nl, rap, rh, sid, _ts, _node in rows:
            if self._ended.retired and client_id != client:
                self._back(client_id)  # its versions back in the dicts (an ended client's row)
            if client_id != client or not live:
                if batch:  # hooks in row order: the batch before an unsubscribe
                    self._subscribed_many(client, batch)
                    batch = []
                if not live:
                    changed += self._unsubscribe(client_id, filter_, version)
                    continue
                client = client_id
                subs = self._subs.get(client_id) or self._subs.setdefault(client_id, ClientSubs())
            # subs.takes() is True for a filter new to the client: asked only otherwise
            held = subs.has(filter_) or subs.gone or version <= subs.floor
            if held and not subs.takes(filter_, version):
                continue
            key = (qos, nl, rap, rh, sid, version)
            opts = memo.get(key)
            if opts is None:
                opts = SubscriptionOptions(*key)
                if len(memo) < OPTIONS_MEMO:
                    memo[key] = opts
            subs.add(filter_, opts)
            batch.append((filter_, opts))
            changed += 1
        if batch:
            self._subscribed_many(client, batch)
        self.applied += changed
        return changed

    def _subscribed_many(
        self, client_id: str | None, batch: list[tuple[str, SubscriptionOptions]]
    ) -> None:
        assert client_id is not None
        if self.on_subscribe_many is not None:
            self.on_subscribe_many(client_id, batch)
            return
        for filter_, opts in batch:
            self.on_subscribe(client_id, filter_, opts)

    def _clear_below(self, client_id: str, version: int) -> bool:
        subs = self._subs.get(client_id)
        if subs is None:
            subs = self._subs[client_id] = ClientSubs()
        if version <= subs.floor:
            return False
        subs.floor = version
        live = subs.live
        if live:
            for f in [f for f, o in live.items() if o.version < version]:
                del live[f]
                self.on_unsubscribe(client_id, f)
        if not live:
            subs.live = None
        if subs.gone:
            subs.gone = {f: v for f, v in subs.gone.items() if v > version} or None
        return True

    def _session_event(
        self, e: SessionOpened | SessionClosed | SessionExpired | SessionDiscarded
    ) -> bool:
        cleared = self._clear_below(e.client_id, e.version) if ends_session(e) else False
        if e.version <= self._session_versions.get(e.client_id, 0):
            return cleared
        self._session_versions[e.client_id] = e.version
        if isinstance(e, SessionOpened):
            self._ended.discard(e.client_id)
            self._sessions[e.client_id] = SessionEntry(
                node=e.node,
                online=True,
                expiry_s=e.expiry_s,
                version=e.version,
                epoch=e.epoch,
                clean_start=e.clean_start,
                protocol=e.protocol,
                username=e.username,
            )
        elif isinstance(e, SessionClosed) and e.expiry_s > 0:
            self._ended.discard(e.client_id)
            self._sessions[e.client_id] = SessionEntry(
                node=e.node,
                online=False,
                expiry_s=e.expiry_s,
                version=e.version,
                offline_since_ms=e.ts_ms,
            )
        else:
            self._sessions.pop(e.client_id, None)
            self._ended.end(e.client_id)
            if self.keep_ended is not None and self.ended > self.keep_ended:
                self.forget_ended()
        return True

    def _back(self, client_id: str) -> None:
        """A retired client back in the dicts, before an event or row about it."""
        held = self._ended.back(client_id)
        if held is not None:
            version, floor = held
            if version:
                self._session_versions[client_id] = version
            if floor:
                self._subs[client_id] = ClientSubs(floor)

    def _retire(self, client_id: str) -> None:
        """An ended client whose only state is its versions: out of the dicts."""
        subs = self._subs.get(client_id)
        if client_id in self._sessions or (subs is not None and (subs.live or subs.gone)):
            return
        self._subs.pop(client_id, None)
        version = self._session_versions.pop(client_id, 0)
        self._ended.retire(client_id, version, subs.floor if subs is not None else 0)

    def forget_ended(self) -> int:
        """Forget the longest-ended clients past `keep_ended` (rule 4): their
        versions go, unless the client is back or holds a live subscription;
        and the longest-cleared retained topics past it, unless set again."""
        keep = self.keep_ended
        ended = self._ended
        forgotten = 0
        while keep is not None and len(ended) > keep:
            client_id, retired = ended.pop_oldest()
            if retired is not None:
                version = retired
            else:
                if client_id in self._sessions:
                    continue
                subs = self._subs.get(client_id)
                if subs is not None and subs.live:
                    continue
                self._subs.pop(client_id, None)
                version = self._session_versions.pop(client_id, 0)
            forgotten += 1
            if self.on_forget is not None:
                self.on_forget("client", client_id, version)
        cleared = self._cleared
        while keep is not None and len(cleared) > keep:
            topic, _ = cleared.popitem(last=False)
            if topic not in self._retained:
                version = self._retained_versions.pop(topic, 0)
                forgotten += 1
                if self.on_forget is not None:
                    self.on_forget("topic", topic, version)
        self.forgotten += forgotten
        return forgotten

    def _retained_event(self, e: RetainedSet | RetainedCleared) -> bool:
        if e.version <= self._retained_versions.get(e.topic, 0):
            return False
        self._retained_versions[e.topic] = e.version
        if isinstance(e, RetainedCleared):
            self._retained.pop(e.topic, None)
            self._cleared[e.topic] = None
            self._cleared.move_to_end(e.topic)
            if self.keep_ended is not None and len(self._cleared) > self.keep_ended:
                self.forget_ended()
            return True
        self._cleared.pop(e.topic, None)
        self._retained[e.topic] = RetainedEntry(
            topic=e.topic,
            payload=e.payload,
            qos=e.qos,
            version=e.version,
            expires_at_ms=e.expires_at_ms,
            payload_format_indicator=e.payload_format_indicator,
            content_type=e.content_type,
            response_topic=e.response_topic,
            correlation_data=e.correlation_data,
            user_property=e.user_property,
            sender=e.sender,
        )
        return True
