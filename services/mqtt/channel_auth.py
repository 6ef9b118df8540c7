"""MQTT 5 enhanced authentication (4.12): the AUTH exchange of one connection.

Theory of operation. A CONNECT with an Authentication Method, on a node that
authenticates clients, puts the channel in AUTHENTICATING and starts an
`EnhancedAuth`; every Authentication Data the client sends becomes an
`AuthExchange` action, and the node answers either "go on"
(`Channel.auth_continue`: AUTH 0x18 with the server's data, then the client's
next AUTH 0x18) or "done" (`Channel.authenticated`: the session opens and the
CONNACK carries the method and the server's last data, or a refusing CONNACK).
Re-authentication (4.12.1) is the same exchange started by AUTH 0x19 while
connected; it ends with AUTH 0x00 or, refused, DISCONNECT (the channel's).
Meanwhile the client's other packets go on as usual.

What the client may send, and what is a protocol error (0x82: a refusing
CONNACK before the CONNACK, DISCONNECT after):
- AUTH without the connection's method, or with another one; AUTH on a
  connection whose CONNECT named no method (the channel: no `EnhancedAuth`);
- AUTH while the node works on the last step, or when no AUTH is awaited;
- reason codes: 0x19 only to start a re-authentication, 0x18 only to answer
  the server's AUTH 0x18; never 0x00.
Before the CONNACK only AUTH and DISCONNECT may arrive (MQTT-3.1.2-30); the
exchange must end within the connect timeout (the channel's CONNECT timer),
and a re-authentication within as long again (`REAUTH_TIMER`), else the
connection ends (DISCONNECT 0x87 after the CONNACK).
"""

from __future__ import annotations

from dataclasses import replace

from services.mqtt.actions import Action, AuthExchange, Send
from services.mqtt.errors import ProtocolError
from services.mqtt.packets import Auth, Properties, ReasonCode

RC = ReasonCode
REAUTH_TIMER = "reauth"


class EnhancedAuth:
    def __init__(self, method: str, client_id: str, username: str | None) -> None:
        self.method = method
        self.client_id = client_id
        self.username = username
        self.context: object = None
        self.waiting = False  # the node works on a step: an AUTH now is a protocol error
        self.expecting = False  # we sent AUTH 0x18: the client's AUTH 0x18 is awaited
        self.reauth = False  # a re-authentication is under way
        self.last: bytes | None = None  # the server's final data, for the CONNACK

    def step(self, data: bytes | None) -> AuthExchange:
        self.waiting = True
        return AuthExchange(
            self.client_id, self.username, self.method, data, self.context, self.reauth
        )

    def on_auth(self, packet: Auth, connected: bool) -> list[Action]:
        """The client's AUTH: the next step for the node, or a ProtocolError."""
        method = packet.properties.authentication_method
        if method != self.method:
            raise ProtocolError(f"AUTH with method {method!r}, the connection's is {self.method!r}")
        code = packet.reason_code
        if self.waiting:
            raise ProtocolError("AUTH before the server answered the last one")
        if self.expecting and code == RC.CONTINUE_AUTHENTICATION:
            self.expecting = False
            return [self.step(packet.properties.authentication_data)]
        if connected and not self.reauth and code == RC.REAUTHENTICATE:
            self.reauth = True
            self.context = None
            return [self.step(packet.properties.authentication_data)]
        raise ProtocolError(f"AUTH 0x{code:02X} not expected now")

    def challenge(self, data: bytes | None, context: object) -> list[Action]:
        """The node goes on: AUTH 0x18 with its data."""
        if not self.waiting:
            return []
        self.waiting = False
        self.expecting = True
        self.context = context
        return [Send(Auth(RC.CONTINUE_AUTHENTICATION, self.properties(data)))]

    def finish(self, data: bytes | None) -> bool:
        """The node ended the exchange; False if it was not asked (a stale answer)."""
        if not self.waiting:
            return False
        self.waiting = self.expecting = self.reauth = False
        self.context = None
        self.last = data
        return True

    def properties(self, data: bytes | None) -> Properties:
        return Properties(authentication_method=self.method, authentication_data=data)

    def connack(self, props: Properties) -> Properties:
        """The CONNACK's properties with the method and the server's last data."""
        return replace(props, authentication_method=self.method, authentication_data=self.last)
