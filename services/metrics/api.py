"""The metrics recorder the node counts events through.

`Recorder` is what the node calls: named counters (`inc`) and gauges
(`set`), with the names in `COUNTERS` / `GAUGES` so an exporter ($SYS,
Prometheus) knows them all in advance. `NullRecorder` drops everything (the
default); `MemoryRecorder` keeps the values, for tests and a future $SYS
publisher. An unknown name is a ValueError naming it.
"""

from __future__ import annotations

from typing import Final, Protocol

COUNTERS: Final = (
    "connections.accepted",
    "connections.refused",  # past limits.max_connections
    "listeners.refused_address",  # peers a listener's allow/deny CIDRs refused at accept
    "listeners.refused_full",  # CONNECTs past a listener's max_connections
    "listeners.tls_failed",  # TLS handshakes that failed (bad certificate, old TLS, timeout)
    "sessions.created",
    "sessions.resumed",
    "sessions.expired",
    "messages.refused",  # QoS 1/2 copies a full queue refused (publisher not acknowledged)
    "messages.dropped",  # by a queue's overflow policy (QoS 0 first)
    "shared.redispatch_failed",  # a leaving shared member's copies the store could not give
    "messages.qos0_dropped",  # QoS 0 to a subscriber that could not keep up
    "authentication.denied",  # CONNECTs the authentication chain (or its hook) refused
    "authorization.publish_denied",  # publishes and wills the authorizer refused
    "authorization.subscribe_denied",  # filters, retained deliveries, restored subscriptions
    "connections.banned",  # CONNECTs a ban refused (0x8A; 3.x: 5)
    "connections.flapping",  # CONNECTs one too many within the flapping window (client banned)
    "connections.rate_limited",  # CONNECTs over a connection rate (0x9F; 3.x: 3)
    "connections.kicked_banned",  # connected clients a new ban disconnected (0x98)
    "connections.read_paused",  # pauses of a client's reading for its message / byte rate
    "subscriptions.quota_exceeded",  # filters past limits.max_subscriptions (0x97; 3.x: 0x80)
)
GAUGES: Final = ("connections.current",)


class Recorder(Protocol):
    def inc(self, name: str, n: int = 1) -> None:
        """Add `n` to the counter `name` (one of COUNTERS)."""
        ...

    def set(self, name: str, value: float) -> None:
        """Set the gauge `name` (one of GAUGES)."""
        ...


class NullRecorder:
    def inc(self, name: str, n: int = 1) -> None:
        return None

    def set(self, name: str, value: float) -> None:
        return None


class MemoryRecorder:
    def __init__(self) -> None:
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.gauges: dict[str, float] = dict.fromkeys(GAUGES, 0.0)

    def inc(self, name: str, n: int = 1) -> None:
        if name not in self.counters:
            raise ValueError(f"unknown counter {name!r}")
        self.counters[name] += n

    def set(self, name: str, value: float) -> None:
        if name not in self.gauges:
            raise ValueError(f"unknown gauge {name!r}")
        self.gauges[name] = value
