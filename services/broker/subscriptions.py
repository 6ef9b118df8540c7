"""Subscriptions: SUBSCRIBE and UNSUBSCRIBE, and retained messages on subscribe.

Theory of operation. A SUBSCRIBE routes on this node as soon as it is read
(`Routes.route`), as in Mosquitto and EMQX: a message published right after
it reaches the subscriber, even before its SUBACK. The Subscribed events are
then versioned (per client, from the session store) and appended to the log;
the SUBACK waits for the log's acknowledgement, then the retained messages
go out per retain handling. If the log (or the session store) cannot take
the events in its bounded time, the routes are put back as they were and
the SUBACK carries the failure: 0x80 per filter (3.x), 0x83 "implementation
specific error" (5.0). A filter the authorizer refuses gets 0x87 (5.0) /
0x80 (3.x), a new filter past the client's `max_subscriptions` 0x97 Quota
Exceeded (5.0) / 0x80 (3.x), and the others go on; a retained message goes out only if the
client may subscribe to its very topic, and a resumed session's
subscriptions are checked again (`recheck`), a refused one dropped. An
UNSUBSCRIBE stops routing at once the same way; a refused one routes again,
and 5.0 gets UNSUBACK 0x80 while a 3.x connection, whose UNSUBACK cannot
fail, is closed (it resends).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from services.broker.delivery import Delivery
from services.broker.dispatch import Dispatch
from services.broker.logstate import LogState
from services.broker.ports import ConnectionPort, Session, SubOptions, now_ms
from services.broker.routes import Routes, for_subscriber
from services.broker.seams import Seams
from services.event.api import EventLogError
from services.event.schema import Event, Subscribed, Unsubscribed
from services.mqtt.actions import SubscribeRequest, UnsubscribeRequest
from services.mqtt.channel_config import ChannelConfig
from services.mqtt.errors import TopicFilterInvalid
from services.mqtt.packets import ReasonCode
from services.mqtt.topics import parse_shared, validate_topic_filter
from services.retain.api import RetainStore
from services.session.api import SessionError, SessionStore

log = logging.getLogger("weir.subscriptions")

V3_SUBACK_FAILURE = 0x80
V5_UNSUBACK_FAILURE = 0x80  # unspecified error


class Subscriptions:
    def __init__(
        self,
        *,
        node_id: str,
        channel_config: ChannelConfig,
        routes: Routes,
        dispatch: Dispatch,
        delivery: Delivery,
        logstate: LogState,
        store: SessionStore,
        retained: RetainStore,
        spawn: Callable[[Coroutine[Any, Any, Any]], object],
        seams: Seams,
    ) -> None:
        self.node_id = node_id
        self.channel_config = channel_config
        self.routes = routes
        self.dispatch = dispatch
        self.delivery = delivery
        self.logstate = logstate
        self.store = store
        self.retained = retained
        self.spawn = spawn
        self.seams = seams

    def subscribe(self, conn: ConnectionPort, request: SubscribeRequest) -> None:
        """Seam: apply a SUBSCRIBE, answer SUBACK, send retained messages.
        Routing starts here, as the packet is read; the SUBACK waits for the log."""
        session = conn.session
        if session is None or conn.closed:
            return
        if self.seams.hooks.has("client.subscribe"):
            filters = [sub.topic_filter for sub in request.subscriptions]
            self.seams.hooks.run("client.subscribe", session.client_id, filters)
        v5 = conn.channel.protocol_level >= 5
        codes: list[int] = []
        retained: list[tuple[str, SubOptions]] = []
        events: list[Subscribed] = []
        undo: list[tuple[str, SubOptions | None]] = []  # (filter, what it routed before)
        max_qos = self.channel_config.max_qos
        max_subs = self.channel_config.max_subscriptions
        for sub in request.subscriptions:
            try:
                validate_topic_filter(sub.topic_filter)
            except TopicFilterInvalid:
                codes.append(ReasonCode.TOPIC_FILTER_INVALID if v5 else V3_SUBACK_FAILURE)
                continue
            if not self.seams.may_subscribe(conn, sub.topic_filter, sub.qos):
                codes.append(ReasonCode.NOT_AUTHORIZED if v5 else V3_SUBACK_FAILURE)
                continue
            is_new = sub.topic_filter not in session.subs
            if is_new and 0 < max_subs <= len(session.subs):
                self._over_quota(conn, sub.topic_filter, max_subs)
                codes.append(ReasonCode.QUOTA_EXCEEDED if v5 else V3_SUBACK_FAILURE)
                continue
            granted = min(sub.qos, max_qos)
            options = SubOptions.of(
                granted, sub.no_local, sub.retain_as_published, request.subscription_id
            )
            events.append(
                Subscribed(
                    client_id=session.client_id,
                    version=0,
                    node=self.node_id,
                    ts_ms=0,
                    filter=sub.topic_filter,
                    qos=granted,
                    no_local=sub.no_local,
                    retain_as_published=sub.retain_as_published,
                    retain_handling=sub.retain_handling,
                    subscription_id=request.subscription_id,
                )
            )
            codes.append(granted)
            undo.append((sub.topic_filter, self.routes.route(session, sub.topic_filter, options)))
            if parse_shared(sub.topic_filter) is None and (
                sub.retain_handling == 0 or (sub.retain_handling == 1 and is_new)
            ):
                retained.append((sub.topic_filter, options))
        packet_id = request.packet_id
        self.spawn(self._subscribed(conn, session, packet_id, codes, events, retained, undo))

    def _over_quota(self, conn: ConnectionPort, topic_filter: str, max_subs: int) -> None:
        self.seams.metrics.subscriptions_quota_exceeded += 1
        client = conn.client
        log.warning(
            "subscribe %s refused: client %s, user %s, peer %s, by max_subscriptions %d",
            topic_filter, conn.channel.client_id, client.username if client else None,
            conn.peer, max_subs,
        )  # fmt: skip

    async def _subscribed(
        self,
        conn: ConnectionPort,
        session: Session,
        packet_id: int,
        codes: list[int],
        events: list[Subscribed],
        retained: list[tuple[str, SubOptions]],
        undo: list[tuple[str, SubOptions | None]],
    ) -> None:
        logged = not events or await self._log_client_events(session, events)
        if not logged:
            v5 = conn.channel.protocol_level >= 5
            failure = ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR if v5 else V3_SUBACK_FAILURE
            codes = [c if c >= 0x80 else failure for c in codes]
            retained = []
            self.routes.undo(session, undo)
        if conn.closed:
            return
        conn.carry_out(conn.channel.subscribed(packet_id, codes))
        for event in events if logged else ():
            self.seams.hooks.run("session.subscribed", session.client_id, event.filter)
        now = now_ms()
        seams = self.seams
        for topic_filter, options in retained:
            for message in self.retained.match(topic_filter, now):
                if seams.authorizes and not seams.may_receive_retained(conn, message):
                    continue
                self.dispatch.deliver(session, for_subscriber(message, options, True))
        self.delivery.schedule()
        conn.resume_processing()

    def recheck(self, conn: ConnectionPort, session: Session) -> None:
        """A resumed session's subscriptions under today's rules: one now
        denied stops routing at once and its Unsubscribed is logged."""
        if not self.seams.authorizes:
            return
        events: list[Unsubscribed] = []
        for topic_filter, options in list(session.subs.items()):
            if self.seams.may_subscribe(conn, topic_filter, options.qos, "restored subscription"):
                continue
            self.routes.route(session, topic_filter, None)
            events.append(self._unsubscribed_event(session, topic_filter))
        if events:
            self.spawn(self._log_client_events(session, events))

    def unsubscribe(self, conn: ConnectionPort, request: UnsubscribeRequest) -> None:
        """Seam: apply an UNSUBSCRIBE and answer UNSUBACK. Routing stops here;
        the UNSUBACK waits for the log."""
        session = conn.session
        if session is None or conn.closed:
            return
        self.seams.hooks.run("client.unsubscribe", session.client_id, request.topic_filters)
        codes: list[int] = []
        events: list[Unsubscribed] = []
        undo: list[tuple[str, SubOptions | None]] = []
        for topic_filter in request.topic_filters:
            existed = topic_filter in session.subs
            if existed:
                events.append(self._unsubscribed_event(session, topic_filter))
                undo.append((topic_filter, self.routes.route(session, topic_filter, None)))
            codes.append(
                ReasonCode.SUCCESS if existed else ReasonCode.NO_SUBSCRIPTION_EXISTED
            )
        self.spawn(self._unsubscribed(conn, session, request.packet_id, codes, events, undo))

    def _unsubscribed_event(self, session: Session, topic_filter: str) -> Unsubscribed:
        return Unsubscribed(
            client_id=session.client_id, version=0, node=self.node_id, ts_ms=0, filter=topic_filter
        )

    async def _unsubscribed(
        self,
        conn: ConnectionPort,
        session: Session,
        packet_id: int,
        codes: list[int],
        events: list[Unsubscribed],
        undo: list[tuple[str, SubOptions | None]],
    ) -> None:
        logged = not events or await self._log_client_events(session, events)
        if not logged:
            self.routes.undo(session, undo)
            if conn.channel.protocol_level < 5:
                conn.close()  # a 3.x UNSUBACK cannot say it failed
                return
            codes = [V5_UNSUBACK_FAILURE] * len(codes)
        if conn.closed:
            return
        conn.carry_out(conn.channel.unsubscribed(packet_id, codes))
        for event in events if logged else ():
            self.seams.hooks.run("session.unsubscribed", session.client_id, event.filter)
        conn.resume_processing()

    async def _log_client_events(
        self, session: Session, events: list[Subscribed] | list[Unsubscribed]
    ) -> bool:
        """Version, append and apply one client's events; False if the log (or
        the session store) could not take them: then nothing was applied."""
        client_id = session.client_id
        epoch = session.epoch
        try:
            stamped: list[Event] = []
            ts_ms = now_ms()
            for unstamped in events:
                version = await self.store.next_version(client_id, epoch)
                stamped.append(dataclasses.replace(unstamped, version=version, ts_ms=ts_ms))
            await asyncio.gather(*(self.logstate.append(e) for e in stamped))
        except (SessionError, EventLogError) as exc:
            log.warning("%d events of %s not logged: %s", len(events), client_id, exc)
            return False
        for event in stamped:
            self.logstate.apply(event)
        return True
