"""Subscribers on another node of a cluster than the publishers (`--sub-port`).

Theory of operation. In a Weir cluster a subscription made on node B
reaches node A through the event log (100-200 ms with the embedded Kafka,
DESIGN 11), so a run that published on A at once would count its first
messages as lost and measure the log, not delivery. Before the run
measures, a probe client on A therefore publishes QoS 0 probes on the
topics the subscribers expect, every PROBE_EVERY_S, until every subscriber
has had one (its route exists). Then one more probe per topic is a barrier:
once each subscriber has it, no earlier probe is still on its way (one
connection, one topic, in order). A probe names publisher PROBE_PUBLISHER,
which no plan uses, so a tally counts it as unexpected and never as a
message; the tallies' counts are reset after the barrier. Subscribers that
get nothing within ROUTE_WAIT_S mean the two ports are not one cluster:
an error, not a result.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from bench import wire
from bench.client import Tally, open_client
from bench.errors import BenchError
from bench.plan import Plan, RunConfig, SubscriberSpec

PROBE_PUBLISHER = 0xFFFF
"""Publisher numbers are 0..99 in every plan."""
ROUTE_WAIT_S = 30.0
"""A cluster's subscription reaches the other nodes in well under a second here;
30 s covers a node still replaying the log."""
PROBE_EVERY_S = 0.05


async def wait_for_routes(
    cfg: RunConfig, plan: Plan, subscribers: Sequence[tuple[Tally, SubscriberSpec]]
) -> dict[str, Any]:
    """Probe from `cfg.port` until every subscriber is reachable; what to report.
    Nothing to do (an empty dict) unless the subscribers are on another port."""
    if not cfg.sub_port or cfg.sub_port == cfg.port:
        return {}
    start = time.monotonic()
    topic_of = {p.number: p.topic for p in plan.publishers}
    targets = [(tally, topic_of[spec.publishers[0]]) for tally, spec in subscribers]
    probe = wire.PAYLOAD.pack(PROBE_PUBLISHER, 0, 0)
    client = await open_client(
        cfg.host, cfg.port, cfg.client_id(plan, "probe"), version=cfg.version,
        wait_s=cfg.connect_timeout,
    )  # fmt: skip

    async def until_each_has_more_than(seen: list[int], resend: bool) -> None:
        """Probe the topics of subscribers with no more than `seen` probes, once
        or (`resend`) every PROBE_EVERY_S, until each has more."""
        sent = False
        while True:
            behind = {topic for (tally, topic), n in zip(targets, seen, strict=True)
                      if tally.unexpected <= n}  # fmt: skip
            if not behind:
                return
            if time.monotonic() - start > ROUTE_WAIT_S:
                raise BenchError(
                    f"subscribers on port {cfg.sub_port} got no probe published on port "
                    f"{cfg.port} in {ROUTE_WAIT_S:.0f} s (are both nodes of one cluster?)"
                )
            if resend or not sent:
                client.write(b"".join(wire.publish(t, probe, qos=0, version=cfg.version)
                                      for t in sorted(behind)))  # fmt: skip
                sent = True
            await asyncio.sleep(PROBE_EVERY_S)

    try:
        await until_each_has_more_than([0] * len(targets), resend=True)  # the routes
        await until_each_has_more_than([t.unexpected for t, _ in targets], resend=False)
    finally:
        client.close()
    for tally, _ in targets:
        tally.unexpected = 0
    return {"sub_port": cfg.sub_port, "route_wait_s": round(time.monotonic() - start, 3)}
