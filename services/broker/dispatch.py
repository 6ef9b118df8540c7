"""Dispatch: a PUBLISH to every session its topic reaches.

Theory of operation. A topic's plan comes from the routing table (`routes`).
Per publish, one member of each shared group is picked cluster-wide
(`shared`), then:

- QoS 0 to an online client: the PUBLISH is encoded once per distinct
  (protocol family, retain flag, subscription ids) and the same bytes are
  written to every such subscriber (dropped and counted if it cannot keep
  up); clients that allow topic aliases go through their channel instead;
- QoS 1/2 (and QoS 0 for an offline persistent session): through the
  queue, batched per loop turn (`delivery`); the publisher's PUBACK /
  PUBREC waits for that batch (`Delivery.token`);
- subscribers on other nodes: `remote`.

A publisher's PUBLISHes wait behind its QoS 2 still being stored, so one
client's messages keep their order [MQTT-4.6.0-6]. A will goes through the
authorizer as its client's PUBLISH would (`publish_will`). A retained
message is an event in the log (`set_retained`); the PUBACK / PUBREC of a retained QoS 1/2
message also waits for the log (5.0: 0x80 if it fails; 3.x: disconnected), and
that of a message a sync data bridge takes waits for Kafka the same way
(`seams.egress`; a QoS 2 message is bridged before its packet id is stored).
The connection whose packets are in hand is `publisher` (set by the
connection), so a subscriber that cannot keep up can hold it back.
A message from inside the node (a Kafka -> MQTT bridge) takes the same path
after authorization (`services.broker.inside`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from services.bridge.api import all_true
from services.broker.delivery import Delivery, tell_hooks
from services.broker.logstate import LogState
from services.broker.ports import ConnectionPort, Session, SubOptions, Turn, now_ms
from services.broker.remote import Remote
from services.broker.routes import PlanEntry, Routes, adjusted, encode_qos0, taken_over
from services.broker.seams import Seams
from services.broker.shared import Shared
from services.event.api import EventLogError
from services.event.schema import Event, RetainedCleared, RetainedSet
from services.mqtt.actions import Route
from services.mqtt.packets import Message, ReasonCode
from services.mqtt.topics import matches, parse_shared
from services.queue.api import IncomingMark, QueueStore
from services.session.api import Fenced, SessionError, SessionStore

Fold = Callable[[Any, Any], Any]  # a compiled hook chain (`Hooks.folder`)

log = logging.getLogger("weir.dispatch")


class Dispatch:
    def __init__(
        self,
        *,
        node_id: str,
        routes: Routes,
        delivery: Delivery,
        remote: Remote,
        store: SessionStore,
        queue: QueueStore,
        logstate: LogState,
        loop: asyncio.AbstractEventLoop,
        spawn: Callable[[Coroutine[Any, Any, Any]], object],
        shared_strategy: str,
        shared_local: bool,
        seams: Seams,
        turn: Turn,
    ) -> None:
        self.node_id = node_id
        self.tally = seams.metrics.tally  # the per-message counts (registry.SENT...)
        self.routes = routes
        self.delivery = delivery
        self.remote = remote
        self.store = store
        self.queue = queue
        self.logstate = logstate
        self.loop = loop
        self.spawn = spawn
        self.seams = seams
        self.turn = turn
        self.shared = Shared(
            node_id=node_id,
            routes=routes,
            remote=remote,
            delivery=delivery,
            deliver=self.deliver,
            strategy=shared_strategy,
            prefer_local=shared_local,
        )
        self._held_routes: dict[ConnectionPort, list[Route]] = {}  # behind a QoS 2 being stored
        self._deferred: list[Callable[[], object]] | None = None  # see _route_qos2

    async def set_retained(self, message: Message) -> bool:
        """Seam: a retained message was set (or cleared by an empty payload).
        True once the log holds it and it is applied; False if it could not."""
        topic = message.topic
        event: Event
        try:
            version = await self.store.next_topic_version(topic)
        except SessionError as exc:
            log.warning("retained %s not logged: %s", topic, exc)
            return False
        if message.payload:
            props = message.properties
            event = RetainedSet(
                topic=topic,
                version=version,
                node=self.node_id,
                ts_ms=now_ms(),
                payload=message.payload,
                qos=message.qos,
                expires_at_ms=message.expires_at_ms,
                payload_format_indicator=props.payload_format_indicator,
                content_type=props.content_type,
                response_topic=props.response_topic,
                correlation_data=props.correlation_data,
                user_property=props.user_property,
                sender=message.sender,
            )
        else:
            event = RetainedCleared(
                topic=topic, version=version, node=self.node_id, ts_ms=now_ms()
            )
        try:
            await self.logstate.append_and_apply(event)
        except EventLogError as exc:
            log.warning("retained %s not logged: %s", topic, exc)
            return False
        return True

    def publish(self, conn: ConnectionPort, route: Route) -> None:
        if self._held_routes:
            held = self._held_routes.get(conn)
            if held is not None:  # a QoS 2 ahead is still being stored: keep the order
                held.append(route)
                return  # routed when it comes back here
        message = route.message  # counted by the channel (registry.Metrics.received)
        seams = self.seams
        checks = seams.checks_publish
        hook = seams.hooks.on_publish  # else nothing can change it
        if checks:  # else nothing can refuse it
            admitted = self._admitted(conn, route, hook)
            if admitted is None:
                return
            route = admitted
        elif hook is not None:
            changed = hook(conn.client, message)
            if changed is not message:
                admitted = self._changed(conn, route, changed)
                if admitted is None:
                    return
                route = admitted
        message = route.message
        if route.qos2_packet_id is not None and conn.session is not None:
            self._held_routes[conn] = []
            self.spawn(self._publish_qos2(conn, conn.session, route))
            return
        token = route.token
        since = self.delivery.batched if token is not None else 0  # QoS 0: no token to gate
        kafka: asyncio.Future[bool] | None = None
        if self.seams.egress is None:
            bridged: asyncio.Future[bool] | bool = False
        else:
            bridged = self._bridge(conn, message)
            kafka = bridged if isinstance(bridged, asyncio.Future) else None
        if message.retain and token is not None:
            delivered = self.publish_message(message, store_retained=False)
            if not delivered:
                self.seams.metrics.messages_dropped["no_subscribers"] += 1
            gate = self.loop.create_future()
            self.spawn(self.retain_gate(message, gate))
            gate = gate if kafka is None else all_true((gate, kafka))
            none = delivered == 0 and bridged is False
            self.delivery.token(conn, token, none, gate, since=since)
            return
        delivered = self.publish_message(message)
        if not delivered:
            self.seams.metrics.messages_dropped["no_subscribers"] += 1
        if token is not None:
            none = delivered == 0 and bridged is False
            self.delivery.token(conn, token, none, kafka, since=since)

    def _bridge(self, conn: ConnectionPort, message: Message) -> asyncio.Future[bool] | bool:
        """Hand a client's PUBLISH to the data bridges (this node received it, so
        it is bridged here and nowhere else); a sync bridge's answer gates the
        PUBACK / PUBREC as a retained message's log append does, and a bridged
        message is never "no matching subscribers" (5.0 0x10)."""
        assert self.seams.egress is not None
        client = conn.client
        return self.seams.egress.publish(message, client.username if client else None)

    def _admitted(self, conn: ConnectionPort, route: Route, hook: Fold | None) -> Route | None:
        """Authorization (Seams.checks_publish), then the message.publish hook
        (`hook`: its compiled chain). A denied message: 5.0 PUBACK / PUBREC
        0x87; 3.x acknowledged and dropped."""
        message = route.message
        if not self.seams.may_publish(conn, message.topic, message.qos, message.retain):
            self.seams.metrics.messages_dropped["acl"] += 1
            if route.token is not None:
                conn.routed(route.token, False, False, ReasonCode.NOT_AUTHORIZED)
            return None
        if hook is not None:
            changed = hook(conn.client, message)
            if changed is not message:
                return self._changed(conn, route, changed)
        return route

    @staticmethod
    def _changed(conn: ConnectionPort, route: Route, changed: Message | None) -> Route | None:
        """The message.publish hook replaced the message, or stopped it (None:
        not published, a QoS 1/2 one still acknowledged)."""
        if changed is None:
            if route.token is not None:
                conn.routed(route.token, True, True)
            return None
        return Route(changed, route.token, route.qos2_packet_id)

    async def retain_gate(self, message: Message, gate: asyncio.Future[bool]) -> None:
        ok = False
        try:
            ok = await self.set_retained(message)
        finally:
            if not gate.done():
                gate.set_result(ok)

    async def _publish_qos2(self, conn: ConnectionPort, session: Session, route: Route) -> None:
        """Route a QoS 2 PUBLISH once its packet id is stored; the publisher's later
        PUBLISHes wait behind it so one client's messages keep their order
        [MQTT-4.6.0-6] (concurrent store calls may complete in any order)."""
        try:
            await self._route_qos2(conn, session, route)
        finally:
            held = self._held_routes.pop(conn, None)
            if held and not conn.closed:
                for later in held:
                    self.publish(conn, later)

    async def _route_qos2(self, conn: ConnectionPort, session: Session, route: Route) -> None:
        """A read-only check first (a known resend reaches nobody, not even the
        memory-tier subscribers); the id is then stored in the same atomic step
        as the message's durable copies (`Delivery.mark`), so a crash between
        cannot make a resend look like a duplicate of a message never stored.
        What would leave at once (QoS 0 writes, forwards to other nodes) waits
        until the id is stored: a node dying before that cannot have given a
        copy to a subscriber that the publisher's resend reaches again (at most
        once for those, exactly once for QoS 2 subscribers)."""
        mark = IncomingMark(session.client_id, session.epoch, route.qos2_packet_id or 0)
        try:
            known = await self.queue.incoming_has(mark.client_id, mark.epoch, mark.packet_id)
        except Fenced:  # taken over elsewhere, before its kick came here: 0x8E
            taken_over(conn)
            return
        except SessionError as exc:  # the store is down: no PUBREC (5.0: 0x80)
            log.warning("QoS 2 publish of %s not stored: %s", session.client_id, exc)
            if route.token is not None:
                conn.routed(route.token, False, False)
            return
        if known:
            if route.token is not None:
                self.delivery.token(conn, route.token, False)
            return
        message = route.message
        taken = False  # by a data bridge: then never "no matching subscribers"
        if self.seams.egress is not None:
            # Kafka first: its refusal must leave the packet id unstored, so the
            # publisher's resend is bridged again rather than taken for a duplicate.
            bridged = self._bridge(conn, message)
            if isinstance(bridged, asyncio.Future) and not await bridged:
                if route.token is not None:
                    conn.routed(route.token, False, False)
                return
            taken = bridged is not False
        gate: asyncio.Future[bool] | None = None
        if message.retain and route.token is not None:
            gate = self.loop.create_future()
            self.spawn(self.retain_gate(message, gate))
        since = self.delivery.batched
        deferred: list[Callable[[], object]] = []
        self._deferred = deferred
        self.remote.deferring(deferred)
        try:
            delivered = self.publish_message(message, store_retained=gate is None)
        finally:
            self._deferred = None
            self.remote.deferring(None)
        if not delivered:
            self.seams.metrics.messages_dropped["no_subscribers"] += 1
        self.delivery.mark(mark, since)
        if route.token is None:
            for send in deferred:
                send()
            return
        if not deferred:
            self.delivery.token(conn, route.token, delivered == 0 and not taken, gate, mark, since)
            return
        stored = self.loop.create_future()

        def then(fresh: bool) -> None:
            if fresh:  # the id is stored: a resend reaches nobody again
                for send in deferred:
                    send()
                self.delivery.schedule()
            if not stored.done():
                stored.set_result(None)

        none = delivered == 0 and not taken
        self.delivery.token(conn, route.token, none, gate, mark, since, then)
        await stored  # the publisher's next messages go after these copies

    def publish_message(self, message: Message, store_retained: bool = True) -> int:
        """Route one message to every matching subscription; returns how many."""
        if message.retain and store_retained:
            self.spawn(self.set_retained(message))
        plan = self.routes.plans.get(message.topic) or self.routes.plan(message.topic)
        plain, shared, remote = plan
        count = self.deliver_plain(message, plain) if plain else 0
        for group_filter, members in shared:
            if self.shared.dispatch(message, group_filter, members):
                count += 1
        if remote:
            count += self.remote.deliver(message, remote)
        self.turn.work += count  # a copy queued has scheduled its batch (`Delivery.add`)
        if count == 0 and self.seams.hooks.has("message.dropped"):
            self.seams.hooks.run("message.dropped", message, "no_subscribers", None)
        return count

    def publish_will(self, message: Message, username: str | None, peer: str) -> None:
        """A will goes out only if its client (the connection that set it: user
        name, peer) may publish it now (there is nobody to tell if not: the
        refusal is logged and counted)."""
        if self.seams.checks_publish:
            self.spawn(self._publish_will(message, username, peer))
        else:
            self._will_out(message, username)

    async def _publish_will(self, message: Message, username: str | None, peer: str) -> None:
        if await self.seams.may_publish_will(message, username, peer):
            self._will_out(message, username)

    def _will_out(self, message: Message, username: str | None = None) -> None:
        """Wills are published once cluster-wide (`wills`): bridged here too, with
        nobody to wait for Kafka's answer, under the user name that set it."""
        if self.seams.egress is not None:
            self.seams.egress.publish(message, username)
        self.publish_message(message)

    def deliver_plain(self, message: Message, plan: list[PlanEntry]) -> int:
        sender = message.sender
        encoded: dict[tuple[bool, bool, tuple[int, ...]], bytes] = {}
        qos_in = message.qos
        retain_in = message.retain
        fast = message.expires_at_ms is None
        count = written = too_large = 0
        hooks = self.seams.hooks
        told = hooks.watches_copies
        delivered = hooks.on_delivered
        as_sent = not message.properties.subscription_identifier  # a copy may be `message`
        for session, opts in plan:
            if type(opts) is SubOptions:
                if opts.no_local and session.client_id == sender:
                    continue
                qos = opts.qos if opts.qos < qos_in else qos_in
                retain = retain_in and opts.retain_as_published
                sub_ids = opts.sub_ids
            else:
                assert isinstance(opts, list)
                live = [o for o in opts if not (o.no_local and session.client_id == sender)]
                if not live:
                    continue
                qos = min(qos_in, max(o.qos for o in live))
                retain = retain_in and any(o.retain_as_published for o in live)
                sub_ids = tuple(o.subscription_id for o in live if o.subscription_id)
            count += 1
            conn = session.conn
            if (
                qos == 0
                and fast
                and conn is not None
                and session.ready
                and not conn.channel.outbound_aliases  # those go through the channel
            ):
                v5 = conn.channel.protocol_level >= 5
                key = (v5, retain, sub_ids if v5 else ())
                data = encoded.get(key)
                if data is None:
                    data = encode_qos0(message, retain, v5, sub_ids)
                    encoded[key] = data
                limit = conn.max_outgoing_packet
                if limit is not None and len(data) > limit:
                    too_large += 1
                    if told:
                        hooks.run("message.dropped", message, "too_large", session.client_id)
                    continue
                if told:  # the hooks hear of each copy (deferred ones when they go)
                    if qos == qos_in and retain == retain_in and as_sent and not sub_ids:
                        out = message
                    else:
                        out = adjusted(message, qos, retain, sub_ids)
                    if self._deferred is None:  # inline: once per copy
                        if conn.write_qos0(data):
                            written += 1
                            if delivered is not None:
                                delivered(session.client_id, out)
                        else:
                            hooks.run("message.dropped", out, "qos0_slow_subscriber",
                                      session.client_id)  # fmt: skip
                    else:
                        self._deferred.append(functools.partial(
                            self._write_told, session.client_id, conn, data, out))
                        written += 1  # sent once the QoS 2 publisher's id is stored
                elif self._deferred is None:
                    written += conn.write_qos0(data)
                else:
                    self._deferred.append(functools.partial(_write_qos0, conn, data))
                    written += 1  # sent once the QoS 2 publisher's id is stored
            else:
                self.deliver(session, adjusted(message, qos, retain, sub_ids))
        if written:  # per message, not per subscriber
            tally = self.tally
            tally[0] += written  # SENT + 0
            tally[3] += written * len(message.payload)  # SENT_BYTES + 0
        if too_large:
            self.seams.metrics.messages_dropped["too_large"] += too_large
        return count

    def _write_told(self, client_id: str, conn: ConnectionPort, data: bytes, out: Message) -> bool:
        """A QoS 0 copy written, message.delivered or (a subscriber too far behind)
        message.dropped (False); nothing if its connection closed meanwhile."""
        if conn.closed:
            return False
        if conn.write_qos0(data):
            self.seams.hooks.run("message.delivered", client_id, out)
            return True
        self.seams.hooks.run("message.dropped", out, "qos0_slow_subscriber", client_id)
        return False

    def deliver(self, session: Session, message: Message) -> None:
        """The general path: through the channel (QoS 0) or the queue (QoS 1/2, offline)."""
        conn = session.conn
        if message.qos == 0 and conn is not None and session.ready:
            if self._deferred is not None:
                self._deferred.append(functools.partial(self.deliver, session, message))
                return
            now = now_ms()
            actions = conn.channel.deliver(message, None, False, now)
            conn.carry_out(actions)
            if self.seams.hooks.watches_copies:
                tell_hooks(self.seams.hooks, session.client_id, message, actions, now)
            return
        if message.qos == 0 and session.expiry_s == 0:
            return  # a clean session that is not connected yet: nothing to keep it for
        self.delivery.add(session, message)

    def deliver_forwarded(self, message: Message, client_ids: Sequence[str]) -> None:
        """A peer's publish for local clean sessions: each gets it per its own
        subscriptions, or per its shared one when a peer picked it for a group."""
        if message.share is not None:
            self.shared.deliver_forwarded(message, client_ids)
            self.delivery.schedule()
            return
        topic = message.topic
        plan: list[PlanEntry] = []
        for client_id in client_ids:
            session = self.routes.sessions.get(client_id)
            if session is None:
                continue
            opts = [
                o
                for f, o in session.subs.items()
                if parse_shared(f) is None and matches(f, topic)
            ]
            if opts:
                plan.append((session, opts[0] if len(opts) == 1 else opts))
        if plan:
            self.turn.work += self.deliver_plain(message, plan)
            self.delivery.schedule()


def _write_qos0(conn: ConnectionPort, data: bytes) -> None:
    if not conn.closed:
        conn.write_qos0(data)
