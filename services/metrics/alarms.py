"""Alarms: conditions a node raises and clears, as EMQX's alarm list.

Theory of operation. An alarm has a name, unique while it is active
(`node_down/<peer>` names one per peer), a message, details and the times
it was activated and deactivated. `Alarms` keeps the active ones and the
last `HISTORY` deactivated ones. Activating an active alarm or deactivating
one that is not active does nothing, so a check can state a condition at
every turn. Each change is counted (`alarms_activated`, `alarms_active`)
and published to `$SYS/brokers/<node>/alarms/activate` or `.../deactivate`
as a JSON object, not retained (as EMQX: an alarm is an event; the list of
active ones is what the management API will answer).

`Watch.check`, every `ALARM_CHECK_S`, states each condition:

    high_connections           connections >= connections_high of --max-connections
                               (cleared below connections_low)
    high_process_memory_usage  resident memory >= memory_high of the machine's memory
                               (cleared below memory_low)
    eventloop_lag              the event loop ran a timer >= lag_high_s late
                               (cleared below lag_low_s)
    eventlog_unavailable       an event log append failed since the last check
    redis_unavailable          a Redis call failed since the last check
    node_down/<peer>           membership saw the peer dead (cleared when it rejoins)
    session_queue_full         a persistent session's full queue refused a message
                               since the last check (details: which clients)
    bridge_down/<bridge>       the data bridge's state is kafka_down (cleared when it
                               runs again)
    bridge_dropped/<bridge>    the data bridge dropped records since the last check
                               (out: never produced; in: skipped)

The failure alarms follow the failures: raised at the first check after one,
cleared at the first check with none. The levels have a gap between raise
and clear so a figure hovering at the mark does not raise and clear by turns.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from services.metrics.process import ProcessFigures, read_process
from services.metrics.registry import Metrics, Refresh
from services.metrics.systopics import Publish, sys_prefix

log = logging.getLogger("weir.alarms")

HISTORY: Final = 1000  # deactivated alarms kept (EMQX keeps them for a day)
ALARM_CHECK_S: Final = 5.0  # a condition shows within this; each check costs a few syscalls
NAMED_CLIENTS: Final = 20  # clients named in session_queue_full's details; the rest counted


@dataclass(frozen=True, slots=True)
class Alarm:
    name: str
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)
    activated_at: float = 0.0  # seconds since the epoch
    deactivated_at: float | None = None

    def to_json(self, node: str) -> bytes:
        return json.dumps(
            {
                "name": self.name,
                "message": self.message,
                "details": dict(self.details),
                "node": node,
                "activated_at": self.activated_at,
                "deactivated_at": self.deactivated_at,
            },
            sort_keys=True,
        ).encode()


class Alarms:
    """The active alarms and the recent past ones (see the module docstring)."""

    def __init__(
        self,
        metrics: Metrics,
        node: str,
        publish: Publish,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.metrics = metrics
        self.node = node
        self.publish = publish
        self.clock = clock
        self.active: dict[str, Alarm] = {}
        self.history: collections.deque[Alarm] = collections.deque(maxlen=HISTORY)
        self._topic = sys_prefix(node) + "alarms/"

    def activate(self, name: str, message: str, details: Mapping[str, Any] | None = None) -> bool:
        """Raise `name`; False if it was already active (nothing changes then)."""
        if name in self.active:
            return False
        alarm = Alarm(name, message, details or {}, self.clock())
        self.active[name] = alarm
        self.metrics.alarms_activated += 1
        self.metrics.alarms_active = len(self.active)
        log.warning("alarm %s activated: %s", name, message)
        self._announce("activate", alarm)
        return True

    def deactivate(self, name: str) -> bool:
        """Clear `name`; False if it was not active."""
        alarm = self.active.pop(name, None)
        if alarm is None:
            return False
        past = replace(alarm, deactivated_at=self.clock())
        self.history.append(past)
        self.metrics.alarms_active = len(self.active)
        log.warning("alarm %s deactivated", name)
        self._announce("deactivate", past)
        return True

    def _announce(self, what: str, alarm: Alarm) -> None:
        try:
            self.publish(self._topic + what, alarm.to_json(self.node), False)
        except Exception:  # the alarm stands in the list even if the broker could not route it
            log.exception("publishing alarm %s failed", alarm.name)


@dataclass(frozen=True, slots=True)
class Thresholds:
    connections_high: float = 0.9  # share of --max-connections
    connections_low: float = 0.8
    # Share of the machine's memory in this process: past half, a second node,
    # Redis and Kafka on the same machine (the embedded default) are squeezed.
    memory_high: float = 0.5
    memory_low: float = 0.45
    lag_high_s: float = 1.0  # a client's timers (keepalive, retries) run a second late
    lag_low_s: float = 0.5


DEFAULT_THRESHOLDS: Final = Thresholds()


class Watch:
    """States the conditions of the module docstring to `alarms` at each check."""

    def __init__(
        self,
        metrics: Metrics,
        alarms: Alarms,
        max_connections: int,
        thresholds: Thresholds = DEFAULT_THRESHOLDS,
        process: Callable[[], ProcessFigures] = read_process,
        check_s: float = ALARM_CHECK_S,
        refresh: Refresh | None = None,
    ) -> None:
        self.metrics = metrics
        self.refresh = refresh
        self.alarms = alarms
        self.max_connections = max_connections
        self.thresholds = thresholds
        self.process = process
        self.check_s = check_s
        self._seen = (metrics.eventlog_produce_failures, metrics.redis_failures)
        self._bridges_dropped: dict[str, int] = {}  # per bridge, at the last check
        self._handle: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._handle = loop.call_later(self.check_s, self._timer, loop)

    def _timer(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            self.check()
        except Exception:  # the next check tries again
            log.exception("alarm check failed")
        self._handle = loop.call_later(self.check_s, self._timer, loop)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def check(self) -> None:
        m, t = self.metrics, self.thresholds
        if self.refresh is not None:
            self.refresh(m)
        limit = self.max_connections
        self._level(
            "high_connections", m.connections / limit if limit else 0.0,
            t.connections_high, t.connections_low,
            f"{m.connections} connections of at most {limit}", {"connections": m.connections,
                                                                "max_connections": limit},
        )  # fmt: skip
        p = self.process()
        share = p.rss_bytes / p.memory_total_bytes if p.memory_total_bytes else 0.0
        self._level(
            "high_process_memory_usage", share, t.memory_high, t.memory_low,
            f"resident memory {p.rss_bytes} bytes, {share:.0%} of the machine's",
            {"rss_bytes": p.rss_bytes, "memory_total_bytes": p.memory_total_bytes},
        )  # fmt: skip
        lag = m.eventloop_lag_seconds
        self._level(
            "eventloop_lag", lag, t.lag_high_s, t.lag_low_s,
            f"the event loop ran {lag:.3f} s late", {"lag_seconds": lag},
        )  # fmt: skip
        eventlog, redis = m.eventlog_produce_failures, m.redis_failures
        self._failing("eventlog_unavailable", "event log appends", eventlog - self._seen[0])
        self._failing("redis_unavailable", "Redis calls", redis - self._seen[1])
        self._seen = (eventlog, redis)
        self._nodes_down(m.dead_nodes)
        self._queues_full(m.full_queues)
        self._bridges(m)

    def _level(
        self, name: str, value: float, high: float, low: float, message: str,
        details: Mapping[str, Any],
    ) -> None:  # fmt: skip
        if value >= high:
            self.alarms.activate(name, message, details)
        elif value < low:
            self.alarms.deactivate(name)

    def _failing(self, name: str, what: str, failures: int) -> None:
        if failures > 0:
            self.alarms.activate(name, f"{failures} {what} failed", {"failures": failures})
        else:
            self.alarms.deactivate(name)

    def _nodes_down(self, dead: set[str]) -> None:
        for node in sorted(dead):
            self.alarms.activate(f"node_down/{node}", f"node {node} is dead", {"node": node})
        for name in [n for n in self.alarms.active if n.startswith("node_down/")]:
            if name.removeprefix("node_down/") not in dead:
                self.alarms.deactivate(name)

    def _bridges(self, m: Metrics) -> None:
        for bridge in m.bridges:
            down, dropped_name = f"bridge_down/{bridge.name}", f"bridge_dropped/{bridge.name}"
            if bridge.state == "kafka_down":
                self.alarms.activate(down, f"data bridge {bridge.name} cannot reach Kafka",
                                     {"bridge": bridge.name, "direction": bridge.direction})
            else:
                self.alarms.deactivate(down)
            dropped = bridge.figures.get("dropped", 0)
            new = dropped - self._bridges_dropped.get(bridge.name, 0)
            self._bridges_dropped[bridge.name] = dropped
            if new > 0:
                self.alarms.activate(
                    dropped_name, f"data bridge {bridge.name} dropped {new} records",
                    {"bridge": bridge.name, "direction": bridge.direction, "dropped": new},
                )  # fmt: skip
            else:
                self.alarms.deactivate(dropped_name)

    def _queues_full(self, clients: set[str]) -> None:
        if not clients:
            self.alarms.deactivate("session_queue_full")
            return
        named = sorted(clients)[:NAMED_CLIENTS]
        self.alarms.activate(
            "session_queue_full",
            f"the queue of {len(clients)} persistent session(s) is full",
            {"clients": named, "count": len(clients)},
        )
        clients.clear()
