"""The node's figures: plain integers the hot path bumps, declared once each.

Theory of operation. `Metrics` is one object per node whose fields are the
metric families. A part that counts holds the object and adds to a field:

    metrics.connections_accepted += 1
    metrics.messages_received[qos] += 1
    metrics.messages_dropped["queue_full"] += n

That is an attribute (or a dict item) increment and nothing else: no lock
(one event loop owns the object), no prometheus-client call, no name
lookup in a table. prometheus-client sees the figures only when /metrics is
scraped: `services.metrics.collector` reads every field then, and $SYS and
the alarms read them on their own timers.

The per-message counts (messages and payload bytes received and sent, per
QoS) go one step further. Those sent: the parts that bump them once per
message hold `metrics.tally`, a plain list, and add at fixed slots (`SENT +
qos`, `SENT_BYTES + qos`): a list item increment on a local, without the two
attribute loads and the dict of the family. Those received are counted by
the channels themselves (`metrics.received`, the `InboundCounts` of the node's
`ChannelConfig`: native integers in the compiled core). `fold` moves both
into their families; every reader calls it first (through
`MetricsService.figures`, the `refresh` each reader has).

Each field is declared once, here, with `counter(...)` or `gauge(...)`:
its Prometheus name is `weir_<field>` (counters get `_total`), its help
text and, for a labelled family, the one label and every value it takes.
A labelled family is a dict with exactly those keys, made at start, so a
misspelt reason is a KeyError in the test that first takes that path, and
the exposition shows every series (at 0) before anything happened. A gauge
that only the owner of a structure knows (sessions held, subscriptions,
retained messages) is filled at read time by the `refresh` function the
reader was given, not kept up to date on the hot path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from services.mqtt.channel_config import InboundCounts

PREFIX: Final = "weir_"
QOS: Final = (0, 1, 2)

# Why a message a node took in went nowhere (EMQX's messages.dropped.*).
DROP_REASONS: Final = (
    "no_subscribers",  # PUBLISH that matched no subscription
    "queue_full",  # a session's queue was full (its overflow policy dropped one)
    "qos0_slow_subscriber",  # QoS 0 to a subscriber whose socket buffer was full
    "expired",  # Message Expiry Interval passed before delivery (sent, or queued)
    "acl",  # the authorizer refused the PUBLISH (or a retained delivery)
    "too_large",  # larger than the receiver's Maximum Packet Size
    "cluster_link",  # QoS 0 copies for clients on a peer whose link buffer was full
)
# Why a connection was refused before it had a session.
REFUSE_REASONS: Final = (
    "max_connections",  # the node's limit (CONNACK 0x97; 3.x: 3)
    "listener_full",  # a listener's own max_connections
    "address",  # a listener's allow/deny CIDR rules, at accept
    "tls",  # the TLS handshake failed
    "banned",  # a ban (0x8A; 3.x: 5)
    "flapping",  # one CONNECT too many in the flapping window
    "rate_limited",  # over a connection rate (0x9F; 3.x: 3)
    "not_authorized",  # the authentication chain (or its hook) said no
)
ACTIONS: Final = ("publish", "subscribe")
# Why the management API refused a request's key (services.api.keys).
API_KEY_REFUSALS: Final = (
    "missing",  # no Authorization header, or not a Basic key:secret one
    "unknown",  # no such key: never made, or revoked
    "wrong_secret",  # the key exists; its secret is not the one sent
)

# Slots of `Metrics.tally` (each + qos): the per-message counts, folded by `Metrics.fold`.
SENT: Final = 0
SENT_BYTES: Final = 3
_TALLIED: Final = ((SENT, "messages_sent"), (SENT_BYTES, "messages_sent_bytes"))

Kind = Literal["counter", "gauge"]

# Per data bridge (`services.bridge`), labelled by bridge name and direction
# (out: MQTT -> Kafka, in: Kafka -> MQTT): `weir_bridge_<figure>`. The bridges
# keep these as plain integers of their own; the node copies them into
# `Metrics.bridges` only when the figures are read (`Refresh`).
BRIDGE_FIGURES: Final[dict[str, tuple[Kind, str]]] = {
    "records": ("counter", "out: records Kafka acknowledged; in: records published into "
                "MQTT and routed"),
    "bytes": ("counter", "out: key + value bytes acknowledged; in: payload bytes routed"),
    "failures": ("counter", "out: records Kafka did not take in time; in: publishes that "
                 "failed (retried)"),
    "dropped": ("counter", "out: records never produced (buffer full, producer replaced); "
                "in: records with no valid MQTT topic, skipped"),
    "buffered_records": ("gauge", "out: records waiting for Kafka's acknowledgement; in: "
                         "records published and not yet routed"),
    "buffered_bytes": ("gauge", "bytes of the buffered records"),
    "latency_us_total": ("counter", "out (sync): microseconds from produce to Kafka's "
                         "acknowledgement, summed over the records"),
    "latency_us_max": ("gauge", "out (sync): the longest produce-to-acknowledgement, "
                       "microseconds"),
    "lag": ("gauge", "in: records in the assigned partitions past the committed offsets"),
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class BridgeFigures:
    """One data bridge's figures as the node read them (`BRIDGE_FIGURES`)."""

    name: str
    direction: str  # out | in
    state: str  # running | kafka_down | stopped
    figures: dict[str, int]


@dataclass(frozen=True, slots=True)
class Family:
    """How one field of `Metrics` is shown: `weir_<field>` and its help."""

    field: str
    kind: Kind
    help: str
    label: str | None = None
    values: tuple[Any, ...] = ()

    @property
    def name(self) -> str:
        return PREFIX + self.field


def counter(help: str, label: str | None = None, values: tuple[Any, ...] = ()) -> Any:
    """Declare a counter field: an int, or a dict of ints per label value."""
    return _declare("counter", help, label, values)


def gauge(help: str, label: str | None = None, values: tuple[Any, ...] = ()) -> Any:
    """Declare a gauge field: a number (int or float), or a dict of them per label value."""
    return _declare("gauge", help, label, values)


def _declare(kind: Kind, help: str, label: str | None, values: tuple[Any, ...]) -> Any:
    meta = {"kind": kind, "help": help, "label": label, "values": values}
    if label is None:
        return field(default=0, metadata=meta)
    return field(default_factory=lambda: dict.fromkeys(values, 0), metadata=meta)


@dataclass(slots=True, eq=False)
class Metrics:
    """Every figure of one node (see the module docstring)."""

    # Connections (the asyncio edge and the connection manager).
    connections: int = gauge("client connections open now (TCP, TLS or WebSocket)")
    connections_max: int = gauge("the most connections open at once since the node started")
    connections_accepted: int = counter("client connections accepted (within the limits)")
    connections_closed: int = counter("accepted connections that ended, for any reason")
    connections_refused: dict[str, int] = counter(
        "connections refused before a session, by reason", "reason", REFUSE_REASONS
    )
    connections_kicked_banned: int = counter("connected clients a new ban disconnected (0x98)")
    connections_read_paused: int = counter(
        "pauses of a client's reading for its message or byte rate"
    )
    # Sessions.
    sessions: int = gauge("sessions this node holds (connected, or offline and persistent)")
    sessions_created: int = counter("sessions created (no earlier session taken up)")
    sessions_resumed: int = counter("sessions resumed by a reconnect (Clean Start 0)")
    sessions_takenover: int = counter("sessions another connection took over")
    sessions_expired: int = counter("persistent sessions whose expiry interval ran out")
    sessions_discarded: int = counter("sessions a Clean Start CONNECT discarded")
    shared_redispatch_failed: int = counter(
        "times a leaving shared member's unacknowledged copies could not be handed on "
        "(the store failed): those copies are lost with the session"
    )
    # Subscriptions and retained messages.
    subscriptions: int = gauge("subscriptions of this node's sessions")
    subscriptions_quota_exceeded: int = counter(
        "filters refused past the per-client limit (0x97; 3.x: 0x80)"
    )
    retained: int = gauge("retained messages (the cluster's, as this node knows them)")
    # Messages: application messages (PUBLISH) by QoS; payload bytes beside them.
    messages_received: dict[int, int] = counter("PUBLISHes received from clients", "qos", QOS)
    messages_sent: dict[int, int] = counter("PUBLISHes sent to clients", "qos", QOS)
    messages_received_bytes: dict[int, int] = counter(
        "payload bytes of the PUBLISHes received", "qos", QOS
    )
    messages_sent_bytes: dict[int, int] = counter("payload bytes of the PUBLISHes sent", "qos", QOS)
    messages_dropped: dict[str, int] = counter(
        "messages (or copies for one subscriber) that went nowhere, by reason",
        "reason",
        DROP_REASONS,
    )
    messages_refused: int = counter(
        "QoS 1/2 copies a full persistent queue refused (the publisher was not acknowledged)"
    )
    # MQTT bytes, every packet (over WebSocket: what the frames carry; TLS: decrypted).
    bytes_received: int = counter("MQTT bytes read from client connections")
    bytes_sent: int = counter("MQTT bytes written to client connections")
    # Authentication and authorization.
    authentication_success: int = counter("CONNECTs (and re-authentications) let in")
    authentication_failure: int = counter("CONNECTs (and re-authentications) refused")
    authorization_allow: dict[str, int] = counter(
        "PUBLISH topics and SUBSCRIBE filters the authorizer allowed", "action", ACTIONS
    )
    authorization_deny: dict[str, int] = counter(
        "PUBLISH topics and SUBSCRIBE filters the authorizer refused", "action", ACTIONS
    )
    # The management API (services.api).
    api_unauthorized: dict[str, int] = counter(
        "API requests refused with 401 for their key, by reason", "reason", API_KEY_REFUSALS
    )
    # The cluster and the backends.
    nodes_live: int = gauge("cluster nodes alive, this one included")
    eventlog_produce_failures: int = counter("event log appends that failed (Kafka)")
    redis_failures: int = counter("Redis calls that failed (unreachable, timed out)")
    # The node's event loop (services.metrics.process.LagMonitor).
    eventloop_lag_seconds: float = gauge(
        "the most the event loop ran a timer late in the last 10 s, seconds"
    )
    # Alarms (services.metrics.alarms).
    alarms_active: int = gauge("alarms active now")
    alarms_activated: int = counter("alarms raised")
    # What the alarms watch (services.metrics.alarms.Watch) reads beside the
    # figures; not shown as families. Written only when the condition changes.
    dead_nodes: set[str] = field(default_factory=set)  # peers seen dead, until they rejoin
    full_queues: set[str] = field(default_factory=set)  # clients whose full queue refused
    # a message since the watch last looked (it empties the set)
    bridges: list[BridgeFigures] = field(default_factory=list)  # filled by `Refresh`
    # The per-message counts not yet folded into their families (module docstring).
    tally: list[int] = field(default_factory=lambda: [0] * 6)
    received: InboundCounts = field(default_factory=InboundCounts)

    def fold(self) -> None:
        """Move the per-message counts into their families (before any read)."""
        tally = self.tally
        for slot, name in _TALLIED:
            family = getattr(self, name)
            for qos in QOS:
                family[qos] += tally[slot + qos]
        tally[:] = [0] * len(tally)
        messages, size = self.received.take()
        for qos in QOS:
            self.messages_received[qos] += messages[qos]
            self.messages_received_bytes[qos] += size[qos]

    def connected(self) -> None:
        """A connection was accepted: count it and keep the high-water mark."""
        self.connections_accepted += 1
        self.connections += 1
        self.connections_max = max(self.connections_max, self.connections)

    def disconnected(self) -> None:
        """An accepted connection ended."""
        self.connections_closed += 1
        self.connections -= 1


FAMILIES: Final = tuple(
    Family(f.name, **f.metadata)
    for f in dataclasses.fields(Metrics)
    if "kind" in f.metadata
)


Refresh = Callable[[Metrics], None]  # fills the gauges its owner knows, before a read


def samples(metrics: Metrics) -> Iterator[tuple[Family, Any]]:
    """Each family with its current value (a number, or a dict per label value)."""
    for family in FAMILIES:
        yield family, getattr(metrics, family.field)


def total(value: int | dict[Any, int]) -> int:
    """A counter's value summed over its labels."""
    return sum(value.values()) if isinstance(value, dict) else value
