"""What a channel asks its node to do: small frozen values, no behaviour.

Theory of operation: the node feeds a `Channel` decoded packets, timer
firings and the results of work it did for the channel; every call returns a
list of actions that the node carries out in order. The node answers the
actions that need an answer through the channel's explicit methods:

- `Authenticate` -> `channel.authenticated(ok, reason_code)` (then OpenSession)
- `AuthExchange` -> `channel.auth_continue(data, context)` (AUTH 0x18 follows),
  or `channel.authenticated(ok, reason_code, data)` when the exchange ends
- `OpenSession`  -> `channel.session_opened(...)` (CONNACK follows)
- `Route` with a token -> `channel.routed(token, ok)` (PUBACK / PUBREC follow)
- `SubscribeRequest` -> `channel.subscribed(packet_id, codes)` (SUBACK)
- `UnsubscribeRequest` -> `channel.unsubscribed(packet_id, codes)` (UNSUBACK)
- `Received` -> `channel.resend_pubrel(packet_id)` once the store holds the
  message as released (PUBREL follows)

Everything else is fire-and-forget for the node.
"""

from __future__ import annotations

from services.mqtt.packets import Connect, Packet, Subscription, Will
from services.mqtt.route import Route as Route  # noqa: PLC0414  # re-exported: compiled, see there
from services.mqtt.values import value


@value
class Send:
    """Encode and write this packet to the connection."""

    packet: Packet


@value
class Close:
    """Close the connection after writing everything sent before.

    `will` is the will message to publish (after `will_delay_s`, cancelled if
    the session resumes first), or None when the close is normal or the will
    was already dealt with. `reason` is for logs and the disconnected event.
    The channel emits `reason` as one of the event schema's close reasons
    ("normal", "keepalive", "takenover", "kicked", "error") and clamps
    `will_delay_s` to the session expiry (a session that ends now publishes
    its will now).
    """

    reason: str
    will: Will | None = None
    will_delay_s: int = 0
    detail: str = ""
    """Free text for logs: what exactly ended the connection."""
    session_expiry_s: int | None = None
    """A new session expiry the client set in its DISCONNECT (5.0); None: unchanged."""


@value
class Authenticate:
    """CONNECT was valid and the node authenticates clients: may this one in?
    Answer with `channel.authenticated(ok, reason_code)`."""

    client_id: str
    username: str | None
    password: bytes | None


@value
class AuthExchange:
    """MQTT 5 enhanced authentication (4.12): the client sent Authentication
    Data for `method` (in CONNECT, or an AUTH). `context` is what the node's
    last `auth_continue` gave (None: the exchange's first data); `reauth`:
    the client is connected and re-authenticating (AUTH 0x19 started it).
    Answer with `channel.auth_continue` or `channel.authenticated`."""

    client_id: str
    username: str | None  # the CONNECT's User Name
    method: str
    data: bytes | None
    context: object = None
    reauth: bool = False


@value
class OpenSession:
    """CONNECT was valid: claim the session for `client_id` (maybe assigned).

    `session_expiry_s`: 0 for a clean session that ends with the connection,
    0xFFFFFFFF for never; a 3.1.1 clean_session=0 maps to never.
    """

    connect: Connect
    client_id: str
    clean_start: bool
    session_expiry_s: int


@value
class SubscribeRequest:
    packet_id: int
    subscriptions: tuple[Subscription, ...]
    subscription_id: int | None = None


@value
class UnsubscribeRequest:
    packet_id: int
    topic_filters: tuple[str, ...]


@value
class Acked:
    """The client finished an outgoing message: PUBACK (QoS 1) or PUBCOMP (QoS 2)."""

    packet_id: int


@value
class Received:
    """The client sent PUBREC for an outgoing QoS 2 message: store it as released,
    then call `channel.resend_pubrel(packet_id)` (the PUBREL must not go out
    before the store has it, or a crash would resend a completed message)."""

    packet_id: int


@value
class Released:
    """The client sent PUBREL: forget the incoming QoS 2 packet id."""

    packet_id: int


@value
class StartTimer:
    name: str
    delay_s: float


@value
class CancelTimer:
    name: str


@value
class Dropped:
    """A message for this client went unsent: `reason` is "expired" (its
    Message Expiry Interval passed before delivery started) or "too_large"
    (past the client's Maximum Packet Size). For the node's count."""

    reason: str


Action = (
    Send
    | Close
    | Authenticate
    | AuthExchange
    | OpenSession
    | Route
    | SubscribeRequest
    | UnsubscribeRequest
    | Acked
    | Received
    | Released
    | StartTimer
    | CancelTimer
    | Dropped
)
