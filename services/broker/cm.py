"""The connection manager: connections, sessions and their ends, wills, resume.

Theory of operation. `connection_made` / `connection_lost` keep the registry
(and its limit). `open_session` claims the client's session in the session
store under a new epoch (a takeover on this node detaches the old
connection first; one on another node is kicked there, `remote`), logs
SessionOpened and only then answers CONNACK, restores a resumed session's
subscriptions from the log's view, resends its unacknowledged messages
within the client's Receive Maximum [MQTT-3.3.4-7] and lets deliveries flow.
A reconnect on this node first waits for its previous connection's end.
When a connection ends (`connection_ended`) its session is released with its
expiry (0: discarded now) and SessionClosed logged; an expiring offline
session ends on a timer (`ports.Expiries`) and its expiry is logged exactly
once (`expiry`). A session that cannot open is refused in one place
(`Refused`: one log line, 0x88). Wills are stored with the session and published
once cluster-wide (`wills`): at once or after their delay, unless the session
resumes first. Output is flushed once per loop turn (`mark_dirty`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from services.broker.delivery import Delivery
from services.broker.dispatch import Dispatch
from services.broker.logstate import LogState
from services.broker.ports import ConnectionPort, Expiries, Session, SubOptions, now_ms
from services.broker.remote import Remote
from services.broker.routes import Routes, taken_over
from services.broker.seams import Seams, about
from services.broker.shared import hand_over_left
from services.broker.wills import Wills
from services.event.api import EventLogError
from services.event.schema import Event, SessionClosed, SessionOpened
from services.mqtt.actions import OpenSession
from services.mqtt.packets import ReasonCode, Will
from services.queue.api import Inflight, QueueStore
from services.session.api import Claim, Fenced, SessionError, SessionStore, StoreUnavailable
from services.tasks import Bounded

log = logging.getLogger("weir.cm")

NEVER_EXPIRES = 0xFFFFFFFF  # MQTT 5 session expiry meaning "never"
FENCED = "this node is fenced: its cluster heartbeat is not being stored"
ENDING_WAIT_S = 5.0  # a reconnect waits this long at most for its previous connection's end
ENDS_AT_ONCE = 256  # session ends of lost connections under way at once (`tasks.Bounded`)


class Refused(Exception):
    """A session that cannot open: its CONNECT is refused 0x88 (server
    unavailable) after the log line `line` % (client id, `cause`) and `undo`."""

    def __init__(
        self, line: str, cause: Exception, undo: Callable[[], object] | None = None
    ) -> None:
        super().__init__(line)
        self.line = line
        self.cause = cause
        self.undo = undo


class ConnectionManager:
    def __init__(
        self,
        *,
        node_id: str,
        max_connections: int,
        routes: Routes,
        dispatch: Dispatch,
        remote: Remote,
        delivery: Delivery,
        logstate: LogState,
        store: SessionStore,
        queue: QueueStore,
        loop: asyncio.AbstractEventLoop,
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
        seams: Seams,
        wills: Wills,
        expiries: Expiries,
        recheck: Callable[[ConnectionPort, Session], None],
    ) -> None:
        self.node_id = node_id
        self.max_connections = max_connections
        self.routes = routes
        self.dispatch = dispatch
        self.remote = remote
        self.delivery = delivery
        self.logstate = logstate
        self.store = store
        self.queue = queue
        self.loop = loop
        self.spawn = spawn
        self.seams = seams
        self.wills = wills
        self.expiries = expiries
        self.recheck = recheck  # a resumed session's subscriptions, under today's ACL
        self.connections: set[ConnectionPort] = set()
        self._dirty: list[ConnectionPort] = []
        self._flush_scheduled = False
        self._no_connections: asyncio.Event | None = None
        self._resend: dict[ConnectionPort, list[Inflight]] = {}  # newest last: pop() is next
        self._resending: set[ConnectionPort] = set()
        self._ending: dict[str, asyncio.Task[Any]] = {}  # client -> its session's end_session
        self.ends = Bounded(ENDS_AT_ONCE)  # the others wait their turn
        self.fenced = False  # the cluster fenced this node (`fence`): no session opens

    def mark_dirty(self, conn: ConnectionPort) -> None:
        self._dirty.append(conn)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush_all)

    def _flush_all(self) -> None:
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, []
        for conn in dirty:
            conn.flush()

    def connection_made(self, conn: ConnectionPort) -> bool:
        if len(self.connections) >= self.max_connections:
            self.seams.metrics.connections_refused["max_connections"] += 1
            return False
        self.connections.add(conn)
        self.seams.metrics.connected()
        return True

    def connection_lost(self, conn: ConnectionPort) -> None:
        if conn in self.connections:
            self.connections.remove(conn)
            self.seams.metrics.disconnected()
        if not self.connections and self._no_connections is not None:
            self._no_connections.set()

    async def wait_no_connections(self, timeout_s: float) -> bool:
        """Wait until every connection is gone; False if the timeout passed first."""
        if not self.connections:
            return True
        if self._no_connections is None or self._no_connections.is_set():
            self._no_connections = asyncio.Event()  # every wait until it is set shares it
        try:
            await asyncio.wait_for(self._no_connections.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def open_session(self, conn: ConnectionPort, action: OpenSession) -> None:
        try:
            await self._open(conn, action)
        except Refused as refused:
            log.warning(refused.line, action.client_id, refused.cause, extra=about(conn.client))
            if refused.undo is not None:
                refused.undo()
            conn.carry_out(
                conn.channel.session_opened(False, set(), ReasonCode.SERVER_UNAVAILABLE)
            )
            conn.resume_processing()

    async def _open(self, conn: ConnectionPort, action: OpenSession) -> None:
        """The steps of a session's opening (see the module docstring); a step
        that cannot be taken raises `Refused`."""
        client_id = action.client_id
        if self.fenced:
            raise Refused("session of %s not opened: %s", StoreUnavailable(FENCED))
        conn.max_outgoing_packet = action.connect.properties.maximum_packet_size
        ending = self._ending.get(client_id)
        if ending is not None:  # the previous connection's end comes first
            await asyncio.wait({ending}, timeout=ENDING_WAIT_S)
        self.seams.hooks.run("client.connect", client_id, conn.client)
        known = self.logstate.view.session(client_id) is not None  # may have a stored will
        self._take_over_here(client_id, conn)
        claim = await self._claim(action)
        self.remote.kick_previous(client_id, claim.previous_node, claim.epoch)
        fresh = action.clean_start or not claim.session_present
        await self._log_opened(conn, action, claim, fresh)
        session = self._claimed(conn, action, claim)
        if conn.closed:
            self.spawn(self.end_session(session, session.epoch, conn_gone=True))
            return
        self.routes.attach(session, conn)
        conn.session = session
        if claim.session_present:
            self.recheck(conn, session)
        incoming = await self._incoming(conn, session, claim)
        may_have_will = known or claim.session_present or claim.previous_node is not None
        try:  # a will that cannot be stored refuses the CONNECT
            token = await self.wills.connection_opened(conn, action, fresh, may_have_will)
        except SessionError as exc:
            raise Refused("will of %s not stored: %s", exc, self._unopen(conn, session)) from None
        conn.will_token = token
        self._connack(conn, client_id, claim.session_present, incoming)
        await self._resume(conn, session, claim.epoch)

    def _take_over_here(self, client_id: str, conn: ConnectionPort) -> None:
        """A takeover on this node: the old connection is detached and told first."""
        old = self.routes.sessions.get(client_id)
        if old is not None and old.conn is not None and old.conn is not conn:
            self.routes.take_over(old)
            self.seams.hooks.run("session.takenover", client_id)
            self.seams.metrics.sessions_takenover += 1

    async def _claim(self, action: OpenSession) -> Claim:
        try:
            return await self.store.claim(
                action.client_id, self.node_id, action.clean_start, action.session_expiry_s
            )
        except SessionError as exc:
            raise Refused("session claim failed for %s: %s", exc) from None

    async def _log_opened(self, conn: ConnectionPort, action: OpenSession, claim: Claim,
                          fresh: bool) -> None:  # fmt: skip
        """SessionOpened, in the log before the CONNACK; if it cannot be, the
        claim is let go again."""
        client_id = action.client_id
        try:
            version = await self.store.next_version(client_id, claim.epoch)
            await self.logstate.append_and_apply(
                SessionOpened(
                    client_id=client_id,
                    version=version,
                    node=self.node_id,
                    ts_ms=now_ms(),
                    epoch=claim.epoch,
                    clean_start=fresh,
                    expiry_s=action.session_expiry_s,
                    protocol=conn.channel.protocol_level,
                    username=conn.client.username if conn.client else action.connect.username,
                )
            )
        except (SessionError, EventLogError) as exc:
            expiry_s = action.session_expiry_s

            def undo() -> None:
                self.spawn(self._release_unlogged(client_id, claim.epoch, expiry_s))

            raise Refused("session of %s not opened: %s", exc, undo) from None

    def _claimed(self, conn: ConnectionPort, action: OpenSession, claim: Claim) -> Session:
        """The local session on its new claim (a fresh one unless it resumes)."""
        client_id = action.client_id
        session = self.routes.sessions.get(client_id)
        if session is not None and session.conn is not None and session.conn is not conn:
            # Another connection claimed it while we waited; it wins only if newer.
            self.routes.detach(session)
        if session is None or not claim.session_present:
            if session is not None:
                self.seams.session_discarded(client_id)
                self.routes.drop_subscriptions(session)
            session = Session(client_id)
            self.routes.sessions[client_id] = session
            self.routes.invalidate_plans()
        session.durable = action.session_expiry_s > 0 or claim.session_present
        if claim.session_present and not session.subs:
            logged = self.logstate.view.subscriptions(client_id)
            self.routes.restore(session, {
                f: SubOptions.of(o.qos, o.no_local, o.retain_as_published, o.subscription_id)
                for f, o in logged.items()
            })
        self.expiries.cancel(session)
        self.routes.renew(session, claim.epoch)
        session.expiry_s = action.session_expiry_s
        self.delivery.reset_backlog(session)
        return session

    async def _incoming(self, conn: ConnectionPort, session: Session, claim: Claim) -> set[int]:
        """A resumed session's incoming QoS 2 ids (Fenced, or the store gone: refused)."""
        if not claim.session_present:
            return set()
        try:
            return await self.queue.incoming_ids(session.client_id, claim.epoch)
        except SessionError as exc:
            undo = self._unopen(conn, session)
            raise Refused("session of %s not resumed: %s", exc, undo) from None

    def _unopen(self, conn: ConnectionPort, session: Session) -> Callable[[], None]:
        """The undo of a session opened but refused before its CONNACK: it ends
        as if its connection had gone (released with its expiry, its end logged)."""

        def undo() -> None:
            if session.conn is conn:
                self.routes.detach(session)
                self._end(session, self.end_session(session, session.epoch, conn_gone=True))
            conn.session = None

        return undo

    def _connack(self, conn: ConnectionPort, client_id: str, present: bool,
                 incoming: set[int]) -> None:  # fmt: skip
        conn.carry_out(conn.channel.session_opened(present, incoming))
        if present:
            opened = "session.resumed"
            self.seams.metrics.sessions_resumed += 1
        else:
            opened = "session.created"
            self.seams.metrics.sessions_created += 1
        hooks = self.seams.hooks
        hooks.run("client.connack", client_id, 0)
        hooks.run(opened, client_id)
        hooks.run("client.connected", client_id, conn.client)

    async def _resume(self, conn: ConnectionPort, session: Session, epoch: int) -> None:
        """After CONNACK: resend the inflight, then let deliveries flow."""
        try:
            pending = await self.queue.pending(session.client_id, epoch)
        except Fenced:  # taken over elsewhere since the claim, before its kick came
            if session.conn is conn:
                taken_over(conn)
            return
        except SessionError as exc:  # after CONNACK: close; the client resumes later
            log.warning("inflight of %s not resent: %s", session.client_id, exc,
                        extra=about(conn.client))  # fmt: skip
            conn.close()
            return
        if session.conn is not conn:
            return
        if pending:
            self._resend[conn] = list(reversed(pending))
            self._resend_some(conn)
        self.routes.open_deliveries(session)
        conn.resume_processing()
        self.delivery.kick(session)

    async def _release_unlogged(self, client_id: str, epoch: int, expiry_s: int) -> None:
        """A claim whose SessionOpened the log refused: let it go again."""
        with contextlib.suppress(SessionError):
            await self.store.release(client_id, epoch, expiry_s)

    async def _log_session_end(self, event: Event) -> None:
        self.logstate.apply(event)
        await self.logstate.append_until_logged(event, f"end of session {event.key}")

    def connection_ended(
        self,
        conn: ConnectionPort,
        will: Will | None,
        will_delay_s: int,
        session_expiry_s: int | None = None,
    ) -> None:
        """The connection closed (normally, by error, or taken over). `will` None:
        a normal DISCONNECT, whose will is discarded before the session ends
        (`Wills.discard_before`), so no survivor can publish it."""
        self._resend.pop(conn, None)
        self.seams.hooks.run("client.disconnected", conn.channel.client_id, conn.client)
        session = conn.session
        if session is not None and session_expiry_s is not None:
            session.expiry_s = session_expiry_s
        conn.session = None
        expiry_s = 0
        client_id = conn.channel.client_id
        token = conn.will_token
        discard = token is not None and client_id is not None and will is None
        if session is not None and session.conn is conn:
            self.routes.detach(session)
            expiry_s = session.expiry_s
            end = self.end_session(session, session.epoch, conn_gone=True)
            if discard and token is not None:
                end = self.wills.discard_before(session.client_id, token, end)
                discard = False
            self._end(session, end)
        elif session is not None:
            # Taken over on this node: the session lives on, so a delayed will
            # waits; open_session cancels it or, on a clean start, sends it now.
            expiry_s = session.expiry_s
        if token is None or client_id is None:
            return
        if discard:
            self.spawn(self.wills.discard(client_id, token))
        elif will is not None:
            self.wills.ended(client_id, token, min(will_delay_s, expiry_s))

    def _end(self, session: Session, end: Coroutine[Any, Any, None]) -> None:
        """Run a session's end in its turn; a reconnect of its client waits for it."""
        ending = self.spawn(self.ends.run(end))
        self._ending[session.client_id] = ending
        ending.add_done_callback(functools.partial(self._ended, session.client_id))

    def _ended(self, client_id: str, task: asyncio.Task[Any]) -> None:
        if self._ending.get(client_id) is task:
            del self._ending[client_id]

    async def end_session(self, session: Session, epoch: int, conn_gone: bool) -> None:
        """Seam: a connection left its session (release) or the session ended."""
        client_id = session.client_id
        if session.conn is not None or session.epoch != epoch:
            return
        expiry_s = session.expiry_s if conn_gone else 0
        if self._moved_away(client_id):
            # Taken over on another node (the log says so): the session lives on
            # there, so neither its end nor its routes are ours to drop.
            with contextlib.suppress(SessionError):
                await self.store.release(client_id, epoch, expiry_s)
                if expiry_s == 0:
                    await self.queue.discard(client_id, epoch)
            return
        closed: Event | None = None
        try:
            closed = SessionClosed(
                client_id=client_id,
                version=await self.store.next_version(client_id, epoch),
                node=self.node_id,
                ts_ms=now_ms(),
                reason="normal",
                expiry_s=expiry_s,
            )
        except Fenced:
            return
        except SessionError as exc:
            log.warning("end of session %s not logged: %s", client_id, exc)
        if session.conn is not None or session.epoch != epoch:
            return
        if expiry_s == 0:
            await self._redistribute_shared(session)
            self.routes.drop(session)
            self.seams.hooks.run("session.terminated", client_id, "normal")
        if closed is not None:
            self.spawn(self._log_session_end(closed))
        try:
            await self.store.release(client_id, epoch, expiry_s)
            if expiry_s == 0:
                await self.queue.discard(client_id, epoch)
        except Fenced:
            return
        except SessionError:
            log.exception("session release failed for %s", client_id)
            return
        if expiry_s and expiry_s < NEVER_EXPIRES and session.conn is None:
            self.expiries.later(session, expiry_s, epoch)

    def _moved_away(self, client_id: str) -> bool:
        entry = self.logstate.view.session(client_id)
        return entry is not None and entry.online and entry.node != self.node_id

    async def _redistribute_shared(self, session: Session) -> None:
        """A leaving clean member's unacknowledged shared copies go to other members."""
        shared, metrics = self.dispatch.shared, self.seams.metrics
        await hand_over_left(shared, self.queue, session.client_id, session.epoch, metrics)

    def acked(self, conn: ConnectionPort, packet_id: int) -> None:
        session = conn.session
        if session is not None:
            self.delivery.acked(session, packet_id)
            self.seams.hooks.run("message.acked", session.client_id, packet_id)
        if conn in self._resend:
            self._resend_some(conn)

    def _resend_some(self, conn: ConnectionPort) -> None:
        """Resend a resumed session's unacknowledged messages (DUP) or PUBRELs
        within the client's Receive Maximum; the rest wait for acks, and the
        queue behind them waits too [MQTT-3.3.4-7]."""
        backlog = self._resend.get(conn)
        if backlog is None or conn in self._resending:
            return
        self._resending.add(conn)
        try:
            now = now_ms()
            channel = conn.channel
            while backlog and channel.send_quota > 0 and not conn.closed:
                item = backlog.pop()
                if item.released:
                    conn.carry_out(channel.resend_pubrel(item.packet_id))
                else:
                    conn.carry_out(channel.deliver(item.message, item.packet_id, True, now))
        finally:
            self._resending.discard(conn)
        if not backlog or conn.closed:
            self._resend.pop(conn, None)

    def received(self, conn: ConnectionPort, packet_id: int) -> None:
        if conn.session is not None:
            self.delivery.received(conn.session, packet_id)

    def released(self, conn: ConnectionPort, packet_id: int) -> None:
        if conn.session is not None:
            self.delivery.released(conn.session, packet_id)

    # -- shutdown -----------------------------------------------------------------

    def fence(self, fenced: bool) -> None:
        """The cluster fenced this node (its heartbeat is not being stored): every
        client is disconnected and CONNECTs are refused 0x88 (server
        unavailable) until it is unfenced, so nothing is acknowledged that a
        survivor may take over meanwhile. DISCONNECT has no 0x88: a 5.0 client
        gets 0x9C use another server (another node of the cluster)."""
        self.fenced = fenced
        if fenced:
            self.disconnect_all(ReasonCode.USE_ANOTHER_SERVER)

    def disconnect_all(self, reason_code: int, reference: str | None = None) -> None:
        for conn in list(self.connections):
            if not conn.closed:
                conn.carry_out(conn.channel.server_disconnect(reason_code, reference))
                conn.close()

    def close(self) -> None:
        self.wills.close()
        self.expiries.stop(self.routes.sessions.values())
