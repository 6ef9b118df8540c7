"""Durable delivery: QoS 1/2 (and offline QoS 0) through the QueueStore.

Theory of operation. Messages for the queue collect in this loop turn's
batch; one `enqueue_and_take` call stores them and moves what fits into the
online subscribers' inflight windows, and only then do the publishers get
their PUBACK / PUBREC (`channel.routed`), in the order they published. Each
session has at most one pump task: acknowledgements and new messages mark
it dirty and it loops (`ack_and_take`) until nothing is left.

Back-pressure: `backlog` counts what an online session has queued but not
yet taken. Past half the queue bound its publishers wait (the connection
stops reading them, bounded by PUBLISHER_STALL_S) rather than letting the
overflow policy drop messages that were already acknowledged; below a
quarter they go on.

Tiers: clean sessions' messages go to the memory queue, persistent ones' to
Redis (`services.broker.stores`). When Redis fails, the publishers of that
batch get `channel.routed(token, ok=False)`: an MQTT 5 publisher gets
PUBACK / PUBREC 0x80 (unspecified error), a 3.x publisher is disconnected
and resends after reconnecting. Whatever the memory half took is still
delivered. A token may carry a gate (the retained event of a retained
QoS 1/2 message): its answer waits for the gate too.

Incoming QoS 2 (`mark`): the copies a QoS 2 PUBLISH added to this batch are
listed under its publisher's packet id, and the store adds the id in the
same atomic step that enqueues them; a refused id (already there: a
resend) leaves them out and the publisher just gets its PUBREC; a stale
publisher epoch (its session was taken over on another node, whose kick has
not come yet) ends the publisher's connection as that kick would, with
DISCONNECT 0x8E (`routes.taken_over`); so does a stale epoch in the pump.

Outgoing QoS 2: the subscriber's PUBREC (`received`) is stored by the pump,
and only then does the PUBREL go out (`channel.resend_pubrel`), so a crash
between them resends the PUBLISH rather than a message already completed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, cast

from services.broker.ports import Answered, ConnectionPort, Session, Turn, now_ms
from services.broker.routes import taken_over
from services.broker.stores import DurablePartFailed
from services.hooks.api import Hooks
from services.metrics.registry import Metrics
from services.mqtt.actions import Action, Send
from services.mqtt.packets import Message, ReasonCode
from services.queue.api import IncomingMark, Inflight, QueueStore, TakeResult
from services.session.api import Fenced, SessionError

log = logging.getLogger("weir.delivery")

Token = tuple[
    "Answered",
    int,
    bool,
    "asyncio.Future[bool] | None",
    IncomingMark | None,
    tuple[int, int] | None,  # the batch indices of the message's copies
    "Callable[[bool], None] | None",  # told whether the message was stored as new
]
REFUSED_LOG_EVERY_S = 10.0  # at most one warning about full queues per this many seconds


def tell_hooks(hooks: Hooks, client_id: str, message: Message, actions: list[Action],
               now: int) -> None:  # fmt: skip
    """message.delivered if the channel sent `message`; else message.dropped
    with why (it expired before it went out, or is over the client's Maximum
    Packet Size)."""
    for action in actions:  # a plain loop: this runs once per copy
        if type(action) is Send:
            delivered = hooks.on_delivered
            if delivered is not None:
                delivered(client_id, message)
            return
    expired = message.expires_at_ms is not None and message.expires_at_ms <= now
    hooks.run("message.dropped", message, "expired" if expired else "too_large", client_id)


class Delivery:
    def __init__(
        self,
        *,
        queue: QueueStore,
        loop: asyncio.AbstractEventLoop,
        spawn: Callable[[Coroutine[Any, Any, Any]], object],
        queue_limit: int,
        turn: Turn,
        stored: Callable[[list[tuple[str, Message]]], None],
        metrics: Metrics | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        self.queue = queue
        self.hooks = hooks if hooks is not None else Hooks()  # message.delivered, .dropped
        self.metrics = metrics if metrics is not None else Metrics()
        self.loop = loop
        self.spawn = spawn
        self.turn = turn  # whose messages are being routed (a slow subscriber holds it)
        self.stored = stored  # told of each stored batch (`remote.Notices`)
        self.dropped = 0  # messages the queue's overflow policy dropped
        self.refused = 0  # QoS 1/2 copies a full queue refused (publisher not acknowledged)
        self._refused_logged = self._dropped_logged = -REFUSED_LOG_EVERY_S
        self._backlog_high = max(1, queue_limit // 2)
        self._backlog_low = queue_limit // 4
        self._batch: list[tuple[str, Message]] = []
        self._batch_tokens: list[Token] = []
        self._batch_takers: set[Session] = set()
        self._batch_late: set[Session] = set()  # not ready at add: kicked once stored
        self._batch_marks: dict[IncomingMark, list[int]] = {}  # -> indices in _batch
        self._batch_scheduled = False
        self._lane: asyncio.Future[None] | None = None  # done when the last batch is stored

    @property
    def idle(self) -> bool:
        return not (
            self._batch or self._batch_tokens or self._batch_marks or self._batch_scheduled
        )

    @property
    def batched(self) -> int:
        """How many copies this turn's batch holds (a `mark` starts here)."""
        return len(self._batch)

    def mark(self, mark: IncomingMark, since: int) -> None:
        """The copies added since `batched` was `since` are one incoming QoS 2
        message: store its id with them, atomically (maybe with none)."""
        self._batch_marks.setdefault(mark, []).extend(range(since, len(self._batch)))
        self.schedule()

    def add(self, session: Session, message: Message) -> None:
        """Queue `message` (in its delivered form) for `session`; the batch is
        stored once this loop turn's routing is done."""
        self._batch.append((session.client_id, message))
        self.schedule()
        conn = session.conn
        if conn is not None and session.ready:
            self._batch_takers.add(session)
            session.backlog += 1
            if session.backlog >= self._backlog_high:
                publisher = self.turn.publisher
                if publisher is not None and publisher is not conn:
                    publisher.block_on(conn)
        else:
            # It may become ready (CONNACK, resend, first take) before this batch
            # is stored; a take then misses it, so take again once stored.
            self._batch_late.add(session)

    def token(
        self,
        conn: Answered,
        token: int,
        no_subscribers: bool,
        gate: asyncio.Future[bool] | None = None,
        mark: IncomingMark | None = None,
        since: int | None = None,
        then: Callable[[bool], None] | None = None,
    ) -> None:
        """Answer `channel.routed(token)` once this turn's batch is stored
        (and `gate`, if given, resolved True; False fails the token).
        With `mark` (see `mark`), the answer follows what the store did with it.
        `since` is `batched` before the message was routed: if a full queue
        refused any of the copies added since, the answer is "quota exceeded".
        `then` is told first whether the message was stored as a new one."""
        span = None if since is None else (since, len(self._batch))
        self._batch_tokens.append((conn, token, no_subscribers, gate, mark, span, then))
        self.schedule()

    def _answer(self, tokens: list[Token], ok: bool, result: TakeResult | None = None) -> None:
        refused = result.refused if result is not None else frozenset()
        for conn, token, none_matched, gate, mark, span, then in tokens:
            no_subs = none_matched
            if refused and span is not None and any(i in refused for i in range(*span)):
                if then is not None:
                    then(False)
                conn.routed(token, False, no_subs, ReasonCode.QUOTA_EXCEEDED)
                continue
            fresh = ok
            if mark is not None and result is not None:
                if mark in result.fenced_marks:  # taken over: the new owner routes the resend
                    if then is not None:
                        then(False)
                    # Marks come with a client's QoS 2 PUBLISH only (an inside publisher has none).
                    taken_over(cast("ConnectionPort", conn))
                    continue
                if mark in result.duplicate_marks:  # routed before: PUBREC only
                    no_subs = fresh = False
            if then is not None:
                then(fresh)
            if gate is None:
                conn.routed(token, ok, no_subs)
            elif gate.done():
                _answer_gated(conn, token, no_subs, ok, gate)
            else:  # a callback, not a task per message: sync bridges gate every one
                gate.add_done_callback(partial(_answer_gated, conn, token, no_subs, ok))

    def schedule(self) -> None:
        if not self._batch_scheduled and (self._batch or self._batch_tokens or self._batch_marks):
            self._batch_scheduled = True
            self.loop.call_soon(self._start_batch)

    def _start_batch(self) -> None:
        self._batch_scheduled = False
        items, self._batch = self._batch, []
        tokens, self._batch_tokens = self._batch_tokens, []
        takers, self._batch_takers = self._batch_takers, set()
        late, self._batch_late = self._batch_late, set()
        marks, self._batch_marks = self._batch_marks, {}
        takers |= late
        if not items and not marks:
            self._answer(tokens, True)
            return
        self.spawn(self._store_batch(items, tokens, takers, marks))

    async def _store_batch(
        self,
        items: list[tuple[str, Message]],
        tokens: list[Token],
        takers: set[Session],
        marks: dict[IncomingMark, list[int]],
    ) -> None:
        """One batch at a time, in order (`_lane`): batches stored concurrently
        on different connections could land out of order and break a
        publisher's order [MQTT-4.6.0-6]. Takers are marked as pumping while
        the batch takes for them, so their pump cannot take concurrently and
        have its reply handled first."""
        previous, self._lane = self._lane, self.loop.create_future()
        lane = self._lane
        try:
            if previous is not None:
                await previous
            await self._store_in_turn(items, tokens, takers, marks)
        finally:
            lane.set_result(None)
            if self._lane is lane:
                self._lane = None

    async def _store_in_turn(
        self,
        items: list[tuple[str, Message]],
        tokens: list[Token],
        takers: set[Session],
        marks: dict[IncomingMark, list[int]],
    ) -> None:
        ready = [s for s in takers if s.conn is not None and s.ready and not s.pumping]
        windows = {s.client_id: (s.epoch, self._window(s)) for s in ready}
        ok = True
        result: TakeResult | None = None
        for session in ready:
            session.pumping = True
        try:
            together = [range(*span) for *_, span, _ in tokens if span is not None]
            told = self.hooks.has("message.dropped")  # then the store says which it dropped
            result = await self.queue.enqueue_and_take(items, windows, marks, together, told)
        except DurablePartFailed as exc:
            log.warning("durable enqueue of a batch failed: %s", exc)
            ok = False
            result = exc.result
        except SessionError as exc:
            log.warning("enqueue of %d messages failed: %s", len(items), exc)
            ok = False
        finally:
            for session in ready:
                session.pumping = False
        self._tell_expired()
        if result is not None:
            self.stored(items)
            if result.dropped:
                self._dropped(result.dropped, result.evicted)
            if result.refused:
                self._refused(items, result.refused)
            for session in ready:
                taken = result.taken.get(session.client_id)
                if taken:
                    self._send_taken(session, taken)
        self._answer(tokens, ok, result)
        for session in takers:
            if session not in ready or session.dirty:
                self.kick(session)

    def _dropped(self, count: int, evicted: tuple[tuple[str, Message], ...]) -> None:
        """Count what the overflow policy dropped (queued QoS 0 messages, or under
        drop_oldest the oldest), tell message.dropped of each; warn now and then."""
        self.dropped += count
        self.metrics.messages_dropped["queue_full"] += count
        for client_id, message in evicted:
            self.hooks.run("message.dropped", message, "queue_full", client_id)
        now = time.monotonic()
        if now - self._dropped_logged >= REFUSED_LOG_EVERY_S:
            self._dropped_logged = now
            log.warning(
                "queue full: %d queued messages dropped, oldest first (%d in all)",
                count, self.dropped,
            )  # fmt: skip

    def _tell_expired(self) -> None:
        """The queued messages past their Message Expiry that the store removed
        as sessions took their queues (counted there: `queue.expired`)."""
        lapsed = self.queue.take_expired()
        if lapsed and self.hooks.has("message.dropped"):
            for client_id, message in lapsed:
                self.hooks.run("message.dropped", message, "expired", client_id)

    def _refused(self, items: list[tuple[str, Message]], refused: frozenset[int]) -> None:
        """Count what full queues refused; warn now and then, naming the clients."""
        self.refused += len(refused)
        self.metrics.messages_refused += len(refused)
        self.metrics.full_queues.update(items[i][0] for i in refused)  # the alarm names them
        if self.hooks.has("message.dropped"):
            for i in sorted(refused):
                self.hooks.run("message.dropped", items[i][1], "queue_full", items[i][0])
        now = time.monotonic()
        if now - self._refused_logged >= REFUSED_LOG_EVERY_S:
            self._refused_logged = now
            clients = sorted({items[i][0] for i in refused})
            log.warning(
                "queue full: %d QoS 1/2 copies refused (their publishers were not "
                "acknowledged; %d in all) for %s",
                len(refused), self.refused, ", ".join(clients[:10]),
            )  # fmt: skip

    def _window(self, session: Session) -> int:
        conn = session.conn
        return conn.channel.client_receive_maximum if conn is not None else 0

    def _send_taken(self, session: Session, taken: list[Inflight]) -> None:
        conn = session.conn
        if conn is None:
            return
        now = now_ms()
        hooked = self.hooks.watches_copies
        for item in taken:
            pid = item.packet_id if item.message.qos > 0 else None
            actions = conn.channel.deliver(item.message, pid, item.dup, now)
            conn.carry_out(actions)
            if hooked:
                tell_hooks(self.hooks, session.client_id, item.message, actions, now)
        session.backlog = max(0, session.backlog - len(taken))
        if session.backlog <= self._backlog_low:
            conn.wake_waiters()

    def reset_backlog(self, session: Session) -> None:
        """The session opens on a new connection: nothing is queued for it yet."""
        session.backlog = 0

    # -- the per-session pump ------------------------------------------------------

    def acked(self, session: Session, packet_id: int) -> None:
        if session.acks is None:
            session.acks = [packet_id]
        else:
            session.acks.append(packet_id)
        self.kick(session)

    def received(self, session: Session, packet_id: int) -> None:
        self._op(session, "received", packet_id)

    def released(self, session: Session, packet_id: int) -> None:
        self._op(session, "released", packet_id)

    def _op(self, session: Session, op: str, packet_id: int) -> None:
        if session.ops is None:
            session.ops = [(op, packet_id)]
        else:
            session.ops.append((op, packet_id))
        self.kick(session)

    def kick(self, session: Session) -> None:
        if session.pumping:
            session.dirty = True
            return
        if session.conn is None or not session.ready:
            return
        session.pumping = True
        session.dirty = True
        self.spawn(self._pump(session))

    async def _pump(self, session: Session) -> None:
        client_id = session.client_id
        try:
            while session.dirty and session.conn is not None and session.ready:
                session.dirty = False
                epoch = session.epoch
                conn = session.conn
                ops, session.ops = session.ops or (), None
                received: list[int] = []  # a run of PUBRECs: stored in one call
                for op, pid in ops:
                    if op == "received":
                        received.append(pid)
                        continue
                    if received and not await self._store_received(session, conn, received):
                        return
                    received = []
                    await self.queue.incoming_release(client_id, epoch, pid)
                if received and not await self._store_received(session, conn, received):
                    return
                acks, session.acks = session.acks or (), None
                window = self._window(session)
                taken = await self.queue.ack_and_take(client_id, epoch, acks, window)
                self._tell_expired()
                if taken:
                    self._send_taken(session, taken)
        except Fenced:  # taken over elsewhere, before its kick came here
            if session.conn is not None:
                taken_over(session.conn)
        except SessionError:
            log.exception("delivery to %s failed", client_id)
        finally:
            session.pumping = False

    async def _store_received(
        self, session: Session, conn: ConnectionPort, pids: list[int]
    ) -> bool:
        """Store PUBRECs, then send their PUBRELs. If the store fails, close the
        connection (False): the client resumes and the PUBLISHes go again."""
        try:
            await self.queue.received_many(session.client_id, session.epoch, pids)
        except Fenced:
            raise
        except SessionError as exc:
            log.warning("%d PUBRECs of %s not stored: %s", len(pids), session.client_id, exc)
            conn.close()
            return False
        if session.conn is conn:
            for pid in pids:
                conn.carry_out(conn.channel.resend_pubrel(pid))
        return True


def _answer_gated(
    conn: Answered, token: int, no_subs: bool, ok: bool, gate: asyncio.Future[bool]
) -> None:
    """A gated PUBACK / PUBREC once its gate (Kafka, a retained message's append)
    answered: success only if the gate passed (a cancelled or failed gate: refused)."""
    passed = not gate.cancelled() and gate.exception() is None and gate.result()
    conn.routed(token, ok and passed, no_subs)
