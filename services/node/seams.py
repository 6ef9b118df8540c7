"""The node's seams for authentication and authorization, hooks and metrics.

Theory of operation. The composition root gives the broker one `Seams`: an
authenticator and an authorizer (`services.auth.api`; `AllowAll` by
default), the hook chain (`services.hooks.api`; empty by default) and a
metrics recorder (`services.metrics.api`; `NullRecorder` by default). The
broker's parts call them here and only here:

- `authenticate`: the channel's `Authenticate` action (asked only when an
  authenticator other than `AllowAll` is configured); the decision opens the
  session or refuses the CONNECT;
- `may_publish` / `may_subscribe`: per PUBLISH topic and SUBSCRIBE filter;
  with `AllowAll` no call is made at all (the hot path stays as it was).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.auth.api import Action, AllowAll, Authenticator, Authorizer, ClientInfo
from services.hooks.api import Hooks
from services.metrics.api import NullRecorder, Recorder
from services.mqtt.actions import Authenticate
from services.node.ports import ConnectionPort


@dataclass(frozen=True)
class Seams:
    authenticator: Authenticator = field(default_factory=AllowAll)
    authorizer: Authorizer = field(default_factory=AllowAll)
    hooks: Hooks = field(default_factory=Hooks)  # callbacks come and go; the chain stays
    metrics: Recorder = field(default_factory=NullRecorder)
    authenticates: bool = field(init=False)  # CONNECTs wait for the authenticator
    authorizes: bool = field(init=False)  # PUBLISH / SUBSCRIBE ask the authorizer

    def __post_init__(self) -> None:
        object.__setattr__(self, "authenticates", not isinstance(self.authenticator, AllowAll))
        object.__setattr__(self, "authorizes", not isinstance(self.authorizer, AllowAll))

    async def authenticate(self, conn: ConnectionPort, action: Authenticate) -> None:
        info = ClientInfo(action.client_id, action.username, conn.peer, conn.channel.protocol_level)
        conn.client = info
        decision = await self.authenticator.authenticate(info, action.password)
        decision = self.hooks.fold("client.authenticate", decision, info)
        if not conn.closed:
            conn.carry_out(conn.channel.authenticated(decision.ok, decision.reason_code))

    def may_publish(self, conn: ConnectionPort, topic: str, qos: int, retain: bool) -> bool:
        return self._check(conn, Action.PUBLISH, topic, qos, retain)

    def may_subscribe(self, conn: ConnectionPort, topic_filter: str, qos: int) -> bool:
        return self._check(conn, Action.SUBSCRIBE, topic_filter, qos, False)

    def _check(self, conn: ConnectionPort, action: Action, topic: str, qos: int, retain: bool) -> (
        bool
    ):
        """The authorizer's answer, then the client.check_acl hook's (which may change it)."""
        client = conn.client
        if client is None:
            return True
        allowed = not self.authorizes or self.authorizer.allowed(client, action, topic, qos, retain)
        if self.hooks.has("client.check_acl"):
            allowed = bool(self.hooks.fold("client.check_acl", allowed, client, action, topic))
        return allowed

    @property
    def gates_publish(self) -> bool:
        """Whether a PUBLISH needs the authorizer or a hook (else: one flag check)."""
        hooks = self.hooks
        return self.authorizes or hooks.has("message.publish") or hooks.has("client.check_acl")
