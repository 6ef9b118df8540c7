"""The node's seams for authentication and authorization, hooks, metrics and bridges.

Theory of operation. The composition root gives the broker one `Seams`: an
authenticator and an authorizer (`services.auth.api`; `AllowAll` by
default), the hook chain (`services.hooks.api`; empty by default) and a
node's figures (`services.metrics.registry.Metrics`). The
broker's parts call them here and only here:

- `authenticate`: the channel's `Authenticate` action (asked only when an
  authenticator other than `AllowAll` is configured); the decision (then the
  client.authenticate hook's) opens the session or refuses the CONNECT; a
  refusal is one log line (reason code, client id, user name, peer, and the
  backend or hook that refused) and one count (`authentication_failure`, and
  `connections_refused["not_authorized"]` for a CONNECT; a client let in counts
  `authentication_success`);
- `auth_exchange`: the channel's `AuthExchange` (MQTT 5 enhanced
  authentication, `enhanced`: SCRAM when a backend holds SCRAM credentials;
  None: every Authentication Method is refused 0x8C). Each step goes to the
  enhanced authenticator and its answer back to the channel; the last one
  passes the client.authenticate hook as above, and a client it lets in
  takes the user name it proved (`conn.client`, for the ACL and the log).
  A refusal, re-authentication's too, is logged and counted as above;
- `connected` / `disconnected`: an authorizer with state per connection
  (the ACL) reads what it needs once per connection, before the session opens;
- `may_publish` / `may_subscribe`: per PUBLISH topic and SUBSCRIBE filter;
  with `AllowAll` no call is made at all (the hot path stays as it was), nor
  per PUBLISH when the authorizer says no publish can be refused;
- `may_receive_retained`, `may_publish_will`, and `may_subscribe` again for
  each subscription a resumed session brings back: the same rules applied
  where a message or a subscription reaches a client by another way.
Every refusal is one log line (client id, user name, peer, what and the rule
that refused) and one count (`authorization_deny[action]`; an allowed one
counts `authorization_allow[action]`, only when the authorizer was asked).

- `admit`: before authentication, the admission (`services.auth.admission`:
  bans, flapping, connection rates; None: everyone) may refuse a CONNECT
  with its reason code, logged and counted the same way; an admitted client
  gets its read budget (per-client rates), whose pauses are counted
  (`connections_read_paused`) and logged once per connection;
- `start` / `stop`: the admission's ban table follows Redis while the node runs;
- `egress`: the data bridges (`services.bridge.api`), which dispatch hands
  each PUBLISH its node received from a client (None: no bridge configured);
- `Kicks`: a ban new to this node disconnects the connected clients it
  covers. The ban table tells it (it is built first and given to the table
  as its `on_added`), and it knows the connected clients from `connected` /
  `disconnected`, so neither the table nor the broker is handed the other.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from services.auth.admission import Admission
from services.auth.api import (
    Action,
    AllowAll,
    AuthAnswer,
    Authenticator,
    Authorizer,
    ClientInfo,
    ClosingAuthenticator,
    ConnectionAuthorizer,
    Decision,
    EnhancedAuthenticator,
)
from services.auth.banned import Ban, covers
from services.auth.limits import Budget
from services.bridge.api import Egress
from services.broker.ports import ConnectionPort
from services.config import Limits
from services.hooks.api import Hooks
from services.hooks.plugins import Plugins
from services.logs import Gate, client_fields
from services.metrics.registry import Metrics
from services.mqtt.actions import Authenticate, AuthExchange
from services.mqtt.packets import Message, ReasonCode

log = logging.getLogger("weir.auth")
clients_log = logging.getLogger("weir.clients")  # a client's comings and goings (info)
CONNECTED, DISCONNECTED = Gate(), Gate()  # their lines: one per window each


def about(client: ClientInfo | None, client_id: str | None = None) -> dict[str, Any]:
    """`extra` for a log line about `client` (JSON fields, services.logs); only
    its id when it has not authenticated yet."""
    if client is None:
        return client_fields(client_id)
    return client_fields(client.client_id, client.username, client.peer)

IDENTITIES = 100_000  # who each recent client id was, for its will; past it: start over


class Kicks:
    """The connected clients a ban new to this node disconnects (5.0:
    DISCONNECT 0x98 administrative action), logged and counted."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._connected: set[ConnectionPort] = set()  # from `Seams.connected` to `disconnected`

    def watch(self, conn: ConnectionPort) -> None:
        self._connected.add(conn)

    def forget(self, conn: ConnectionPort) -> None:
        self._connected.discard(conn)

    def banned(self, ban: Ban) -> None:
        for conn in list(self._connected):
            client = conn.client
            if client is None or conn.closed or conn.session is None:
                continue  # not connected yet: admission (before its CONNACK) decides
            if covers(ban, client.client_id, client.username, client.peer):
                self.kicked(client, ban)
                conn.carry_out(conn.channel.server_disconnect(ReasonCode.ADMINISTRATIVE_ACTION))
                conn.close()

    def kicked(self, client: ClientInfo, ban: Ban) -> None:
        self.metrics.connections_kicked_banned += 1
        log.warning(
            "disconnected: client %s, user %s, peer %s, by banned: %s",
            client.client_id, client.username, client.peer, ban.describe(), extra=about(client),
        )  # fmt: skip


@dataclass(frozen=True)
class Seams:
    authenticator: Authenticator = field(default_factory=AllowAll)
    authorizer: Authorizer = field(default_factory=AllowAll)
    hooks: Hooks = field(default_factory=Hooks)  # callbacks come and go; the chain stays
    metrics: Metrics = field(default_factory=Metrics)
    admission: Admission | None = None  # bans, flapping, rates (None: everyone may connect)
    enhanced: EnhancedAuthenticator | None = None  # MQTT 5 Authentication Methods (SCRAM)
    kicks: Kicks | None = None  # what a new ban disconnects (with `admission`'s ban table)
    plugins: Plugins | None = None  # the loaded plugins (the management API starts, stops them)
    egress: Egress | None = None  # data bridges (services.bridge): None, nothing bridged
    authenticates: bool = field(init=False)  # CONNECTs wait for the authenticator
    authorizes: bool = field(init=False)  # PUBLISH / SUBSCRIBE ask the authorizer
    acl: ConnectionAuthorizer | None = field(init=False)  # the authorizer, if it has state
    _identities: dict[str, ClientInfo] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "authenticates", not isinstance(self.authenticator, AllowAll))
        object.__setattr__(self, "authorizes", not isinstance(self.authorizer, AllowAll))
        acl = self.authorizer if isinstance(self.authorizer, ConnectionAuthorizer) else None
        object.__setattr__(self, "acl", acl)

    async def authenticate(self, conn: ConnectionPort, action: Authenticate) -> None:
        info = conn.client_info(action.client_id, action.username)
        conn.client = info
        decision = self._decided(await self.authenticator.authenticate(info, action.password), info)
        if not conn.closed:
            conn.carry_out(conn.channel.authenticated(decision.ok, decision.reason_code))

    def _decided(self, decision: Decision, info: ClientInfo, what: str = "connect") -> Decision:
        """The decision the client.authenticate hook leaves; a refusal logged and counted."""
        hooked: Decision = self.hooks.fold("client.authenticate", decision, info)
        if hooked.ok:
            self.metrics.authentication_success += 1
        else:
            by = decision.by if hooked == decision else "the client.authenticate hook"
            self.metrics.authentication_failure += 1
            if what == "connect":
                self.metrics.connections_refused["not_authorized"] += 1
            log.warning("%s refused 0x%02X: client %s, user %s, peer %s, by %s",
                        what, hooked.reason_code, info.client_id, info.username, info.peer or "?",
                        by or "the authenticator", extra=about(info))  # fmt: skip
        return hooked

    def claimed_user(self, action: AuthExchange) -> str | None:
        enhanced = self.enhanced
        return enhanced.claimed_user(action.method, action.data) if enhanced else None

    async def auth_exchange(self, conn: ConnectionPort, action: AuthExchange) -> None:
        """One step of an enhanced authentication (see the module docstring)."""
        info = conn.client if action.reauth and conn.client else None
        info = info or conn.client_info(action.client_id, action.username)
        enhanced = self.enhanced
        if enhanced is None or action.method not in enhanced.methods:
            why = f"enhanced authentication: method {action.method!r} is not supported"
            answer = AuthAnswer(Decision(False, 0x8C, why))
        else:
            answer = await enhanced.step(info, action.method, action.data, action.context)
        if conn.closed:
            return
        if answer.decision is None:
            conn.carry_out(conn.channel.auth_continue(answer.data, answer.context))
            if not action.reauth:  # the CONNECT's exchange held reading for its answer
                conn.resume_processing()
            return
        if answer.decision.ok and answer.username is not None and not action.reauth:
            info = conn.client_info(action.client_id, answer.username)
        conn.client = info
        decision = self._decided(answer.decision, info, "re-auth" if action.reauth else "connect")
        conn.carry_out(conn.channel.authenticated(decision.ok, decision.reason_code, answer.data))

    async def start(self) -> None:
        if self.admission is not None:
            await self.admission.start()

    async def stop(self) -> None:
        if self.admission is not None:
            await self.admission.stop()

    async def admit(self, conn: ConnectionPort, client_id: str, username: str | None) -> int:
        """0 if this CONNECT may go on to authentication, else the reason code it
        is refused with (logged and counted here)."""
        admission = self.admission
        if admission is None:
            return 0
        client = conn.client_info(client_id, username)
        refusal = await admission.admit(client, client.listener or "mqtt")
        if refusal is None:
            conn.budget = admission.budget(client_id, self._paused)
            return 0
        self.metrics.connections_refused[refusal.reason] += 1
        log.warning(
            "connect refused: client %s, user %s, peer %s, by %s",
            client_id, username, conn.peer, refusal.rule, extra=about(client),
        )  # fmt: skip
        return refusal.reason_code

    def _paused(self, budget: Budget, rule: str) -> None:
        self.metrics.connections_read_paused += 1
        if budget.paused == 1:
            log.info(
                "client %s over its read rate (%s): reading paused until its window "
                "refills (logged once per connection)", budget.client_id, rule,
            )  # fmt: skip

    async def connected(self, conn: ConnectionPort) -> None:
        """Before the session opens: the authorizer reads what it needs for this
        client, and a ban new to this node may disconnect it from now on."""
        client = conn.client
        if client is not None and clients_log.isEnabledFor(logging.INFO) and CONNECTED.due():
            clients_log.info("client %s connected%s", client.client_id, CONNECTED.held(),
                             extra=about(client))  # fmt: skip
        if self.kicks is not None and client is not None and not conn.closed:
            self.kicks.watch(conn)
        if self.acl is None or client is None:
            return
        if len(self._identities) >= IDENTITIES:
            self._identities.clear()
        self._identities[client.client_id] = client
        await self.acl.connected(client)
        if conn.closed:  # it went while its rules were read
            self.acl.disconnected(client)

    def disconnected(self, conn: ConnectionPort) -> None:
        if conn.client is not None:
            client = conn.client
            if clients_log.isEnabledFor(logging.INFO) and DISCONNECTED.due():
                clients_log.info("client %s disconnected%s", client.client_id,
                                 DISCONNECTED.held(), extra=about(client))  # fmt: skip
            # Its identity is kept for its will; a connection that stored none
            # leaves nothing to publish later (a will of an earlier connection
            # was sent or cancelled when this one opened its session). Kept,
            # every client id ever seen stayed until IDENTITIES: 35 MiB.
            if conn.will_token is None and self._identities.get(client.client_id) is client:
                del self._identities[client.client_id]
        if self.kicks is not None:
            self.kicks.forget(conn)
        if self.acl is not None and conn.client is not None:
            self.acl.disconnected(conn.client)

    def session_discarded(self, client_id: str) -> None:
        """A Clean Start ended the session here: hooks told, counted."""
        self.hooks.run("session.discarded", client_id)
        self.metrics.sessions_discarded += 1
        self.hooks.run("session.terminated", client_id, "discarded")

    async def close(self) -> None:
        """The node stopped: the authenticator lets go of its connections (a webhook's),
        async hook callbacks still running are cancelled."""
        await self.hooks.close()
        if isinstance(self.authenticator, ClosingAuthenticator):
            await self.authenticator.aclose()

    def reload(self) -> None:
        """SIGHUP: the authorizer reads its rules again."""
        if self.acl is not None:
            self.acl.reload()

    def may_publish(self, conn: ConnectionPort, topic: str, qos: int, retain: bool) -> bool:
        return self._check(conn.client, Action.PUBLISH, topic, qos, retain, "publish")

    def may_subscribe(
        self, conn: ConnectionPort, topic_filter: str, qos: int, what: str = "subscribe"
    ) -> bool:
        return self._check(conn.client, Action.SUBSCRIBE, topic_filter, qos, False, what)

    def may_receive_retained(self, conn: ConnectionPort, message: Message) -> bool:
        """A retained message matched a new subscription: may the client
        subscribe to its very topic? (`a/#` may be allowed, `a/secret` not)."""
        if not self.authorizes:
            return True
        check = self._check
        return check(conn.client, Action.SUBSCRIBE, message.topic, message.qos, False, "retained")

    async def may_publish_will(
        self, message: Message, username: str | None = None, peer: str = ""
    ) -> bool:
        """A will about to go out: may its client publish it now? Asked as the
        connection that set it (`username`, `peer`, stored with the will): as
        it last connected here if that is the same user and address (its
        listener and certificate too), else with what the will store kept,
        so a survivor or a restarted node decides as for the live client."""
        sender = message.sender
        client = self._identities.get(sender)
        if client is None or (client.username, client.peer) != (username, peer):
            client = ClientInfo(sender, username, peer, 0)
        acl = self.acl
        added = acl is not None and await acl.connected(client)  # unless still connected
        try:
            return self._check(
                client, Action.PUBLISH, message.topic, message.qos, message.retain, "will"
            )
        finally:
            if added and acl is not None:
                acl.disconnected(client)

    def _check(
        self,
        client: ClientInfo | None,
        action: Action,
        topic: str,
        qos: int,
        retain: bool,
        what: str,
    ) -> bool:
        """The authorizer's answer, then the client.check_acl hook's (which may
        change it); a refusal is logged and counted."""
        if client is None:
            return True
        allowed = not self.authorizes or self.authorizer.allowed(client, action, topic, qos, retain)
        by = "the authorizer"
        if not allowed and self.acl is not None:
            by = self.acl.rule(client, action, topic, qos, retain)
        if self.hooks.has("client.check_acl"):
            hooked = bool(self.hooks.fold("client.check_acl", allowed, client, action, topic))
            if hooked != allowed:
                by = "the client.check_acl hook"
            allowed = hooked
        if allowed:
            self.metrics.authorization_allow[action.value] += 1
        else:
            self.metrics.authorization_deny[action.value] += 1
            log.warning(
                "%s %s denied: client %s, user %s, peer %s, by %s",
                what, topic, client.client_id, client.username, client.peer or "?", by,
                extra=about(client),
            )  # fmt: skip
        return allowed

    @property
    def checks_publish(self) -> bool:
        """Whether some publish can be refused (by the authorizer or a hook)."""
        acl = self.acl
        asks = self.authorizes and (acl is None or acl.publish_checked)
        return asks or self.hooks.checks_acl


def admitting(seams: Seams, limits: Limits, redis: Any = None) -> Seams:
    """`seams` with the admission `limits` asks for: bans in `redis` when given
    (else in memory), and the rate and flapping windows too with
    `rate_storage = "redis"`. A ban new to the node is counted in `seams.metrics`
    (choose the recorder first)."""
    from services.auth.banned import BanStore, MemoryBans, RedisBans
    from services.auth.limits import ClientRates, ConnectRates, Flapping, storage

    store = storage(limits.rate_storage, redis)
    flapping = Flapping(
        limits.flapping_max_connects, limits.flapping_max_connects_ip,
        limits.flapping_window_s, limits.flapping_ban_s, store,
    ) if limits.flapping else None  # fmt: skip
    rates = ConnectRates(limits.max_conn_rate, limits.max_conn_rate_per_ip, store) if (
        limits.max_conn_rate or limits.max_conn_rate_per_ip
    ) else None  # fmt: skip
    client_rates = ClientRates(limits.client_msg_rate, limits.client_byte_rate) if (
        limits.client_msg_rate or limits.client_byte_rate
    ) else None  # fmt: skip
    kicks = Kicks(seams.metrics)
    bans: BanStore = (
        RedisBans(redis, on_added=kicks.banned) if redis is not None else MemoryBans(kicks.banned)
    )
    admission = Admission(bans, flapping, rates, client_rates)
    return dataclasses.replace(seams, admission=admission, kicks=kicks)
