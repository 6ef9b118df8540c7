"""Server-side limits a channel enforces and announces, as plain values.

Settings are read elsewhere (one settings module, at the edge) and turned
into one `ChannelConfig` per listener; the channel never reads the
environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import final

NEVER_EXPIRE = 0xFFFFFFFF
"""Session Expiry Interval meaning "never" (MQTT 5 section 3.1.2.11.2)."""


@final
class InboundCounts:
    """The PUBLISHes the channels of one node routed and their payload bytes,
    per QoS: counted where each becomes a `Route` (compiled, an add of native
    integers, which the message path needs: a Python list item increment cost
    a QoS 0 message about 2.5% of its CPU), taken by the node's metrics."""

    def __init__(self) -> None:
        self.messages0 = self.messages1 = self.messages2 = 0
        self.bytes0 = self.bytes1 = self.bytes2 = 0

    def add(self, qos: int, size: int) -> None:
        if qos == 0:
            self.messages0 += 1
            self.bytes0 += size
        elif qos == 1:
            self.messages1 += 1
            self.bytes1 += size
        else:
            self.messages2 += 1
            self.bytes2 += size

    def take(self) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """(messages, bytes) per QoS since the last take."""
        taken = ((self.messages0, self.messages1, self.messages2),
                 (self.bytes0, self.bytes1, self.bytes2))  # fmt: skip
        self.messages0 = self.messages1 = self.messages2 = 0
        self.bytes0 = self.bytes1 = self.bytes2 = 0
        return taken


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    receive_maximum: int = 32
    """Unacknowledged incoming QoS 1/2 PUBLISHes a 5.0 client may have (CONNACK).
    Past it the node stops reading the client until its acks go out (flow
    control), unless `strict_receive_maximum`."""
    strict_receive_maximum: bool = False
    """Disconnect a 5.0 client past the Receive Maximum (DISCONNECT 0x93, which the
    spec allows). Off by default: MQTT.js 5 does not hold back to it, Mosquitto
    does not disconnect for it and EMQX counts only QoS 2 awaiting PUBREL."""
    max_awaiting_rel: int = 100
    """Incoming QoS 2 messages a 5.0 client may leave awaiting PUBREL (0: no bound;
    EMQX's max_awaiting_rel and its default). A new one past it is refused with
    PUBREC 0x97 Quota exceeded and not routed. 3.x clients, which cannot be told,
    are bounded only by the packet id space."""
    max_packet_size: int = 1 << 20
    """Bytes; announced in the 5.0 CONNACK (the codec enforces it on input)."""
    topic_alias_maximum: int = 65535
    """Topic aliases a 5.0 client may set on its PUBLISHes (0 disables them)."""
    server_keep_alive: int | None = None
    """Seconds; when set, replaces a 5.0 client's keep alive (Server Keep Alive)."""
    max_keep_alive: int = 65535
    """Seconds; a larger 5.0 keep alive is lowered to this and announced, a larger
    3.x one is refused (CONNACK 2, identifier rejected, as Mosquitto: 3.x has no
    way to be told). 0, no keep alive, stays allowed."""
    max_qos: int = 2
    retain_available: bool = True
    wildcard_subscriptions: bool = True
    shared_subscriptions: bool = True
    subscription_identifiers: bool = True
    max_session_expiry_s: int = NEVER_EXPIRE
    """Upper bound on any session's expiry; a 5.0 client is told when it is lowered."""
    assign_client_id_prefix: str = "weir-"
    max_client_id_length: int = 65535
    """Characters; longer ids are refused (CONNACK 0x85 / 0x02)."""
    inflight_window_3x: int = 32
    """Outgoing QoS 1/2 window for 3.x clients, which cannot announce a Receive Maximum."""
    max_inflight: int = 0
    """When set, the outgoing QoS 1/2 window of every client: 3.x clients get it,
    5.0 clients the smaller of it and their Receive Maximum."""
    max_subscriptions: int = 0
    """Topic filters one client may hold (0: no limit); a new one past it gets
    SUBACK 0x97 Quota Exceeded (3.x: 0x80) and the others go on."""
    outbound_topic_aliases: bool = True
    """Use topic aliases on PUBLISHes to 5.0 clients that allow them."""
    max_topic_filters: int = 1024
    """Topic filters in one SUBSCRIBE or UNSUBSCRIBE; more: Quota Exceeded (0x97),
    the connection ends. The spec sets no bound, but each filter costs the node ~35 us
    of its loop: a 1 MiB SUBSCRIBE of 60,000 held every other client for 1.4 s."""
    max_packets_before_connack: int = 1000
    """Packets a client may pipeline after CONNECT while its session is being opened."""
    authenticate: bool = False
    """Ask the node to authenticate each valid CONNECT (`Authenticate`) before
    its session is opened."""
    connect_timeout_s: float = 10.0
    """Seconds a new network connection may take to send CONNECT (MQTT 5 3.1.4:
    the server SHOULD close it otherwise); 0 disables the limit."""
    received: InboundCounts = field(default_factory=InboundCounts, compare=False)
    """Where every channel of this config counts what it routes (the node's
    metrics hold the same object)."""
