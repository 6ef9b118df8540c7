"""What a bench run is, as plain data: its configuration (`RunConfig`: the
broker, QoS, sizes, pacing) and its plan (`Plan`: which publishers send how
many messages to which topic, which subscribers expect them).

Both the scenarios that make and run plans (bench.scenarios) and the
cluster probe that waits for a plan's routes (bench.crossnode) read these;
neither runs the other's code through them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench import wire

PERSISTENT_EXPIRY_S = 3600
"""MQTT 5 session expiry of `--persistent` sessions (3.1.1 has none: clean 0 is enough)."""


@dataclass(frozen=True, slots=True)
class RunConfig:
    host: str
    port: int
    qos: int
    messages: int
    duration: float
    payload_size: int = 32
    window: int = 64
    version: int = wire.MQTT_311
    rate: float = 2000.0
    split: bool = False
    drain: float = 1.0
    connect_timeout: float = 10.0
    broker_pid: int | None = None
    persistent: bool = False
    cleanup: bool = True
    sub_port: int | None = None  # subscribers on another node of a cluster (bench.crossnode)

    def port_for(self, role: str) -> int:
        """Subscribers ("s<n>") connect to `sub_port` when set, everyone else to `port`."""
        return self.sub_port if self.sub_port and role.startswith("s") else self.port

    def client_id(self, plan: Plan, role: str) -> str:
        """Random per run; with `persistent`, fixed per scenario and role (e.g. "p3", "s0")."""
        if self.persistent:
            return f"wb-{plan.scenario}-{role}"
        return f"wb-{plan.run_id}-{role}"

    @property
    def session(self) -> dict[str, Any]:
        """`open_client` arguments for this run's sessions (persistent: clean 0, 1 h expiry)."""
        if self.persistent:
            return {"clean": False, "session_expiry_s": PERSISTENT_EXPIRY_S}
        return {}

    @property
    def broker(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class PublisherSpec:
    number: int
    topic: str
    count: int


@dataclass(frozen=True, slots=True)
class SubscriberSpec:
    topic_filter: str
    publishers: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    scenario: str
    run_id: str
    publishers: tuple[PublisherSpec, ...]
    subscribers: tuple[SubscriberSpec, ...]
    paced: bool = False

    @property
    def per_publisher(self) -> int:
        return max((p.count for p in self.publishers), default=0)
