"""`weir bench suback`: how long a SUBSCRIBE waits for its SUBACK.

One client subscribes to new filters one after another (`bench/sub/<run>/<n>`,
QoS 1, each SUBACK awaited before the next SUBSCRIBE) until `count` are
made or `duration` is up, and unsubscribes nothing: every SUBSCRIBE is a
new subscription, which Weir logs (a Kafka append) before it answers. The
latency is SUBSCRIBE sent -> SUBACK read, per subscription; msg_per_s is
subscriptions per second. The client disconnects clean at the end, so its
subscriptions go with it.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

import uvloop

from bench import wire
from bench.client import open_client, subscribe
from bench.report import Result, latency_of

DEFAULT_COUNT = 2000  # subscriptions per run, at most


@dataclass(frozen=True, slots=True)
class SubackConfig:
    host: str
    port: int
    count: int = DEFAULT_COUNT
    duration: float = 10.0
    version: int = wire.MQTT_311


async def _run(cfg: SubackConfig) -> Result:
    run_id = secrets.token_hex(3)
    client = await open_client(cfg.host, cfg.port, f"wb-suback-{run_id}", version=cfg.version)
    samples: list[int] = []
    began = time.monotonic()
    try:
        while len(samples) < cfg.count and time.monotonic() - began < cfg.duration:
            sent = time.monotonic_ns()
            await subscribe(client, f"bench/sub/{run_id}/{len(samples)}", 1)
            samples.append(time.monotonic_ns() - sent)
    finally:
        client.close()
    elapsed = time.monotonic() - began
    return Result(
        scenario="suback", qos=1, broker=f"{cfg.host}:{cfg.port}", sent=len(samples),
        expected=len(samples), received=len(samples), loss=0, duplicates=0,
        msg_per_s=round(len(samples) / elapsed, 1) if elapsed > 0 else 0.0,
        duration_s=round(elapsed, 3), latency=latency_of(samples),
    )  # fmt: skip


def run_suback(cfg: SubackConfig) -> Result:
    return uvloop.run(_run(cfg))
