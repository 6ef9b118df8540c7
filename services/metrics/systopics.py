"""`$SYS/brokers/<node>/...`: the node's figures as retained MQTT messages.

Theory of operation. Every `interval_s` (`--sys-interval`, 10 s by
default; 0: never) `SysTopics` reads the figures and hands each topic whose
value changed since it last did to the `publish` function it was given,
retained, so a client that subscribes later gets the current value at
once (Mosquitto publishes only what changed too). The layout is EMQX's
per-node tree with Mosquitto's names:

    $SYS/brokers/<node>/version                 Weir's version (once, at start)
    $SYS/brokers/<node>/uptime                  seconds since the node started
    $SYS/brokers/<node>/clients/connected       connections open now
    $SYS/brokers/<node>/clients/maximum         the most open at once since start
    $SYS/brokers/<node>/sessions/count          sessions held (connected or offline)
    $SYS/brokers/<node>/messages/received       PUBLISHes received, every QoS
    $SYS/brokers/<node>/messages/sent           PUBLISHes sent, every QoS
    $SYS/brokers/<node>/messages/dropped        messages that went nowhere, every reason
    $SYS/brokers/<node>/bytes/received          bytes read from clients
    $SYS/brokers/<node>/bytes/sent              bytes written to clients
    $SYS/brokers/<node>/subscriptions/count     subscriptions of this node's sessions
    $SYS/brokers/<node>/retained/count          retained messages
    $SYS/brokers/<node>/load/<figure>/1min|5min|15min

`load/...` are Mosquitto's: for connections, messages/received,
messages/sent, messages/dropped, bytes/received and bytes/sent, the rate
per minute over the last interval, averaged exponentially over 1, 5 and 15
minutes (as a Unix load average), two decimals. Payloads are UTF-8 text.
The alarms publish under the same prefix (`services.metrics.alarms`).

Client events (EMQX's, off by default: `--sys-client-events`): when a client's
session opens (its CONNACK went out) and when its connection ends,
`ClientEvents` publishes one JSON message, QoS 0, not retained, on

    $SYS/brokers/<node>/clients/<client id>/connected
        {"clientid", "username", "ipaddress", "peername" (host:port),
         "proto_name", "proto_ver", "listener", "keepalive",
         "expiry_interval", "connected_at", "ts"}
    $SYS/brokers/<node>/clients/<client id>/disconnected
        {"clientid", "username", "ipaddress", "peername", "proto_name",
         "proto_ver", "listener", "disconnected_at", "ts"}

(times in milliseconds since the epoch). The node hangs `connected` and
`disconnected` on the client.connected and client.disconnected hook points.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any, Final, Protocol

from services.metrics.registry import Metrics, Refresh, total

log = logging.getLogger("weir.metrics")

Publish = Callable[[str, bytes, bool], None]  # topic, payload, retain: a broker-made message

SYS_INTERVAL_S: Final = 10.0  # Mosquitto's and EMQX's default
LOAD_PERIODS: Final = ((1, "1min"), (5, "5min"), (15, "15min"))  # minutes, topic level


def sys_prefix(node: str) -> str:
    return f"$SYS/brokers/{node}/"


def counts(m: Metrics) -> dict[str, int]:
    """The figures published as they are, by topic under the node's prefix."""
    return {
        "clients/connected": m.connections,
        "clients/maximum": m.connections_max,
        "sessions/count": m.sessions,
        "messages/received": total(m.messages_received),
        "messages/sent": total(m.messages_sent),
        "messages/dropped": total(m.messages_dropped),
        "bytes/received": m.bytes_received,
        "bytes/sent": m.bytes_sent,
        "subscriptions/count": m.subscriptions,
        "retained/count": m.retained,
    }


LOADED: Final = (  # the figures with a load/ average: each a running total
    "messages/received", "messages/sent", "messages/dropped", "bytes/received", "bytes/sent",
)  # fmt: skip


class Loads:
    """Per-minute rates averaged over 1, 5 and 15 minutes (Mosquitto's sys_tree.c)."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self._last: dict[str, int] = {}

    def update(self, totals: dict[str, int], elapsed_s: float) -> None:
        """Fold the totals now, `elapsed_s` after the last update; the first
        update (or one with no time passed) only notes where the totals start."""
        for figure, now in totals.items():
            last = self._last.get(figure)
            self._last[figure] = now
            for minutes, level in LOAD_PERIODS:
                key = f"load/{figure}/{level}"
                if last is None or elapsed_s <= 0:
                    self.values.setdefault(key, 0.0)
                    continue
                rate = (now - last) * 60.0 / elapsed_s
                decay = math.exp(-elapsed_s / (60.0 * minutes))
                self.values[key] = rate + decay * (self.values[key] - rate)


class SysTopics:
    """Publishes the node's $SYS tree every `interval_s` (see the module docstring)."""

    def __init__(
        self,
        metrics: Metrics,
        node: str,
        version: str,
        publish: Publish,
        interval_s: float = SYS_INTERVAL_S,
        refresh: Refresh | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self.prefix = sys_prefix(node)
        self.version = version
        self.publish = publish
        self.interval_s = interval_s
        self.refresh = refresh
        self.clock = clock
        self.loads = Loads()
        self._started = clock()
        self._last_tick = self._started
        self._sent: dict[str, bytes] = {}
        self._handle: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Publish the tree now, then every interval; nothing when the interval is 0."""
        if self.interval_s <= 0:
            return
        self._started = self._last_tick = self.clock()
        self._timer(loop)

    def _timer(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            self.tick()
        except Exception:  # a failed tick must not end $SYS; the next one tries again
            log.exception("$SYS publish failed")
        self._handle = loop.call_later(self.interval_s, self._timer, loop)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def figures(self) -> dict[str, str]:
        """Every topic (under the prefix) and its payload now; updates the loads."""
        m = self.metrics
        if self.refresh is not None:
            self.refresh(m)
        now = self.clock()
        values = counts(m)
        self.loads.update(
            {**{f: values[f] for f in LOADED}, "connections": m.connections_accepted},
            now - self._last_tick,
        )
        self._last_tick = now
        out = {"version": self.version, "uptime": str(int(now - self._started))}
        out.update((topic, str(value)) for topic, value in values.items())
        out.update((topic, f"{value:.2f}") for topic, value in self.loads.values.items())
        return out

    def tick(self) -> int:
        """Publish what changed since the last tick; returns how many topics."""
        changed = 0
        for topic, text in self.figures().items():
            payload = text.encode()
            if self._sent.get(topic) != payload:
                self.publish(self.prefix + topic, payload, True)
                self._sent[topic] = payload  # after: a failed one is tried again next tick
                changed += 1
        return changed


class Client(Protocol):
    """What a client event tells of the client (`services.auth.api.ClientInfo`)."""

    @property
    def username(self) -> str | None: ...
    @property
    def peer(self) -> str: ...
    @property
    def protocol_level(self) -> int: ...
    @property
    def listener(self) -> str: ...


Details = Callable[[str], dict[str, Any]]  # client id -> its keepalive and expiry_interval
PROTO_NAMES: Final = {3: "MQIsdp", 4: "MQTT", 5: "MQTT"}


class ClientEvents:
    """$SYS/brokers/<node>/clients/<id>/connected|disconnected (see the module
    docstring); `details` adds what the session knows to a connected event."""

    def __init__(
        self,
        node: str,
        publish: Publish,
        details: Details,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.prefix = sys_prefix(node) + "clients/"
        self.publish = publish
        self.details = details
        self.wall_ms = wall_ms

    def connected(self, client_id: str, client: Client | None) -> None:
        now = self.wall_ms()
        body = {**self._who(client_id, client), **self.details(client_id), "connected_at": now}
        self._send(client_id, "connected", body, now)

    def disconnected(self, client_id: str | None, client: Client | None) -> None:
        if client_id is None:  # it never got as far as a CONNECT
            return
        now = self.wall_ms()
        self._send(client_id, "disconnected", {**self._who(client_id, client),
                                               "disconnected_at": now}, now)  # fmt: skip

    def _send(self, client_id: str, what: str, body: dict[str, Any], now: int) -> None:
        body["ts"] = now
        self.publish(f"{self.prefix}{client_id}/{what}", json.dumps(body).encode(), False)

    @staticmethod
    def _who(client_id: str, client: Client | None) -> dict[str, Any]:
        if client is None:
            return {"clientid": client_id}
        host = client.peer.rpartition(":")[0]
        return {
            "clientid": client_id, "username": client.username,
            "ipaddress": host.strip("[]") or client.peer, "peername": client.peer,
            "proto_name": PROTO_NAMES.get(client.protocol_level, "MQTT"),
            "proto_ver": client.protocol_level, "listener": client.listener,
        }  # fmt: skip
