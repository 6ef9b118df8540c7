"""The message scenarios: fan-in, fan-out, pairs and latency.

Theory of operation: a scenario is a `Plan`, plain data saying which
publishers send how many messages to which topic and which subscribers expect
them. Running a plan: the subscribers connect and subscribe (SUBACK awaited),
the publishers connect and encode their whole run, then all publishers start
at once and publish until done or `duration` is up. Afterwards the run waits
for the messages still on their way until every expected one is in, nothing
has arrived for `drain` seconds, or DRAIN_MAX_S have passed.

With `split`, the publishers run in a child process (its own event loop and
core) and the subscribers in this one; the two meet over a pipe: "ready",
"go", then the child's `PublishOutcome`. Timestamps are CLOCK_MONOTONIC, one
clock for every process, so latency holds across the split. The garbage
collector is off while a run measures (runs are bounded, and reference
counting frees what they drop), so no collection pause lands in a sample.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import uvloop

from bench import crossnode, wire
from bench.client import BenchClient, PacedPublisher, Publisher, Tally, open_client, subscribe
from bench.errors import BenchError, BrokerUnavailable
from bench.pipe import receive
from bench.plan import Plan, PublisherSpec, RunConfig, SubscriberSpec
from bench.proc import cpu_seconds, find_listener_pid, is_local
from bench.report import Result, latency_of
from services.cli import Progress, Step

SCENARIOS = ("fan-in", "fan-out", "pairs", "latency")
FAN_IN_PUBLISHERS = 8
FAN_OUT_SUBSCRIBERS = 100
PAIRS = 100
PUBLISHER_PROCESS = "the publisher process"
PROGRESS_TICK_S = 0.5  # how often the progress bar counts the messages received
DRAIN_MAX_S = 5.0
"""The longest a run waits for messages after publishing stopped: a slow broker
still delivers its backlog, a broker that lost messages cannot stall the run."""
CONNECTS_IN_FLIGHT = 50
"""Clients connecting (and subscribing) at once. A broker may serve each persistent
CONNECT/SUBSCRIBE with a store call; 200 at once can exhaust its store's connection
pool (redis-py's default is 100) and measure that instead of the message path."""
PROGRESS_POLL_S = 0.02
"""How often the drain phase looks at the counters; the timing itself comes
from the receive timestamps, so this only bounds how late the run notices."""


@dataclass(frozen=True, slots=True)
class PublishOutcome:
    sent: dict[int, int]
    acked: int
    first_ns: int
    last_ns: int
    cpu_s: float = 0.0
    dropped: int = 0
    """Publisher connections the broker closed before the run ended."""
    acked_by: dict[int, int] = field(default_factory=dict)
    """PUBACKs per publisher number. The broker acknowledges a publisher's PUBLISHes
    in the order they arrived (MQTT 3.1.1 and 5.0, 4.6), so these are exactly its
    first `acked_by[n]` sequence numbers."""


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def plan_for(scenario: str, messages: int, run_id: str | None = None) -> Plan:
    """The plan of `scenario` publishing `messages` messages in all."""
    run = run_id or secrets.token_hex(4)
    root = f"bench/{run}"
    if scenario == "fan-in":
        counts = _split(messages, FAN_IN_PUBLISHERS)
        pubs = tuple(PublisherSpec(i, f"{root}/{i}/x", n) for i, n in enumerate(counts))
        wildcard = SubscriberSpec(f"{root}/+/x", tuple(range(FAN_IN_PUBLISHERS)))
        return Plan(scenario, run, pubs, (wildcard,))
    if scenario == "fan-out":
        subs = tuple(SubscriberSpec(f"{root}/fan", (0,)) for _ in range(FAN_OUT_SUBSCRIBERS))
        return Plan(scenario, run, (PublisherSpec(0, f"{root}/fan", messages),), subs)
    if scenario == "pairs":
        counts = _split(messages, PAIRS)
        pubs = tuple(PublisherSpec(i, f"{root}/p{i}", n) for i, n in enumerate(counts))
        subs = tuple(SubscriberSpec(f"{root}/p{i}", (i,)) for i in range(PAIRS))
        return Plan(scenario, run, pubs, subs)
    if scenario == "latency":
        one = PublisherSpec(0, f"{root}/lat", messages)
        return Plan(scenario, run, (one,), (SubscriberSpec(f"{root}/lat", (0,)),), paced=True)
    raise BenchError(f"unknown scenario {scenario!r}")


AnyPublisher = Publisher | PacedPublisher


async def connect_publishers(cfg: RunConfig, plan: Plan) -> list[AnyPublisher]:
    gate = asyncio.Semaphore(CONNECTS_IN_FLIGHT)

    async def one(spec: PublisherSpec) -> AnyPublisher:
        async with gate:
            return await _publisher(spec)

    async def _publisher(spec: PublisherSpec) -> AnyPublisher:
        client = await open_client(
            cfg.host,
            cfg.port,
            cfg.client_id(plan, f"p{spec.number}"),
            version=cfg.version,
            wait_s=cfg.connect_timeout,
            **cfg.session,
        )
        if plan.paced:
            return PacedPublisher(
                client,
                spec.topic,
                spec.number,
                spec.count,
                rate=cfg.rate,
                qos=cfg.qos,
                payload_size=cfg.payload_size,
            )
        batch = wire.publish_batch(
            spec.topic,
            spec.number,
            0,
            spec.count,
            qos=cfg.qos,
            payload_size=cfg.payload_size,
            version=cfg.version,
        )
        return Publisher(client, batch, qos=cfg.qos, window=cfg.window)

    return list(await asyncio.gather(*(one(spec) for spec in plan.publishers)))


async def publish_all(
    publishers: Sequence[AnyPublisher], plan: Plan, duration: float
) -> PublishOutcome:
    deadline = asyncio.get_running_loop().time() + duration
    cpu_before = time.process_time()
    await asyncio.gather(*(p.run(deadline) for p in publishers))
    return PublishOutcome(
        cpu_s=time.process_time() - cpu_before,
        dropped=sum(p.client.closed.done() for p in publishers),
        sent={spec.number: p.sent for spec, p in zip(plan.publishers, publishers, strict=True)},
        acked=sum(p.acked for p in publishers),
        acked_by={
            spec.number: p.acked for spec, p in zip(plan.publishers, publishers, strict=True)
        },
        first_ns=min(p.first_ns for p in publishers),
        last_ns=max(p.last_ns for p in publishers),
    )


async def connect_subscribers(
    cfg: RunConfig, plan: Plan
) -> list[tuple[BenchClient, Tally, SubscriberSpec]]:
    per_publisher = plan.per_publisher
    gate = asyncio.Semaphore(CONNECTS_IN_FLIGHT)

    async def one(i: int, spec: SubscriberSpec) -> tuple[BenchClient, Tally, SubscriberSpec]:
        async with gate:
            return await _subscriber(i, spec)

    async def _subscriber(
        i: int, spec: SubscriberSpec
    ) -> tuple[BenchClient, Tally, SubscriberSpec]:
        tally = Tally(spec.publishers, per_publisher, latency=plan.paced)
        client = await open_client(
            cfg.host,
            cfg.port_for(f"s{i}"),
            cfg.client_id(plan, f"s{i}"),
            version=cfg.version,
            tally=tally,
            wait_s=cfg.connect_timeout,
            **cfg.session,
        )
        await subscribe(client, spec.topic_filter, cfg.qos, wait_s=cfg.connect_timeout)
        return client, tally, spec

    return list(await asyncio.gather(*(one(i, s) for i, s in enumerate(plan.subscribers))))


async def _drain(tallies: list[Tally], expected: int, quiet: float) -> None:
    """Wait until all `expected` messages are in, none came for `quiet` seconds,
    or DRAIN_MAX_S have passed."""
    hard_stop = time.monotonic() + max(quiet, DRAIN_MAX_S)
    last_seen, last_change = -1, time.monotonic()
    while (now := time.monotonic()) < hard_stop:
        unique = sum(t.unique for t in tallies)
        if unique >= expected:
            return
        if unique != last_seen:
            last_seen, last_change = unique, now
        elif now - last_change > quiet:
            return
        await asyncio.sleep(PROGRESS_POLL_S)


def _close(clients: Sequence[BenchClient]) -> None:
    for client in clients:
        client.close()


async def discard_sessions(cfg: RunConfig, plan: Plan) -> int:
    """Connect every persistent client id of `plan` with a clean session, then
    disconnect, so the broker forgets the sessions; returns how many it took."""
    roles = [f"p{spec.number}" for spec in plan.publishers]
    roles += [f"s{i}" for i in range(len(plan.subscribers))]

    gate = asyncio.Semaphore(CONNECTS_IN_FLIGHT)

    async def one(role: str) -> bool:
        async with gate:
            return await _discard(role)

    async def _discard(role: str) -> bool:
        try:
            client = await open_client(
                cfg.host,
                cfg.port_for(role),
                cfg.client_id(plan, role),
                version=cfg.version,
                wait_s=cfg.connect_timeout,
            )
        except BrokerUnavailable:
            return False
        client.write(wire.DISCONNECT_PACKET)
        client.close()
        return True

    return sum(await asyncio.gather(*(one(role) for role in roles)))


async def run_plan(cfg: RunConfig, plan: Plan) -> Result:
    """Run `plan` against the broker of `cfg` and say what happened."""
    broker_pid = cfg.broker_pid or (find_listener_pid(cfg.port) if is_local(cfg.host) else None)
    load_before = round(os.getloadavg()[0], 2)
    subscribers = await connect_subscribers(cfg, plan)
    routes = await crossnode.wait_for_routes(cfg, plan, [(t, s) for _, t, s in subscribers])
    gc.collect()
    gc.disable()
    tallies = [tally for _, tally, _ in subscribers]
    try:
        with Progress("weir bench").step("messages received") as step:
            watch = asyncio.create_task(_watch(tallies, step))
            try:
                if cfg.split:
                    cpu = _CpuMeter(broker_pid)
                    outcome = await _publish_in_child(cfg, plan)
                else:
                    publishers = await connect_publishers(cfg, plan)
                    cpu = _CpuMeter(broker_pid)
                    try:
                        outcome = await publish_all(publishers, plan, cfg.duration)
                    finally:
                        _close([p.client for p in publishers])
                expected = sum(outcome.sent[n] for _, _, spec in subscribers
                               for n in spec.publishers)  # fmt: skip
                step.set_total(expected)  # the bar's end, while the last ones arrive
                await _drain(tallies, expected, cfg.drain)
            finally:
                watch.cancel()
        duration = (time.monotonic_ns() - outcome.first_ns) / 1e9
        received = sum(t.received for t in tallies)
        usage = cpu.usage(duration, outcome.cpu_s if cfg.split else 0.0, received)
        dropped = outcome.dropped + sum(client.closed.done() for client, _, _ in subscribers)
    finally:
        _close([client for client, _, _ in subscribers])
        gc.enable()
    result = _result(cfg, plan, outcome, tallies, expected, duration)
    result.extra.update(usage)
    result.extra.update(routes)
    result.extra["load_avg_1m"] = load_before
    if cfg.persistent:
        result.extra["persistent"] = True
        if cfg.cleanup:
            result.extra["sessions_discarded"] = await discard_sessions(cfg, plan)
    if dropped:
        result.extra["connections_dropped"] = dropped
    return result


async def _watch(tallies: Sequence[Tally], step: Step) -> None:
    """The messages received so far, shown every PROGRESS_TICK_S (a sum of
    counters the subscribers keep anyway: nothing added to the hot path)."""
    shown = 0
    while True:
        await asyncio.sleep(PROGRESS_TICK_S)
        now = sum(t.received for t in tallies)
        step.advance(now - shown)
        shown = now


class _CpuMeter:
    """CPU used by the broker and by this generator since construction.

    Reported in cores (CPU seconds / wall seconds) and in microseconds per
    delivered message: when the generator's cost per message is well below the
    broker's, the generator is not what limits the run.
    """

    def __init__(self, broker_pid: int | None) -> None:
        self.broker_pid = broker_pid
        self.broker_start = cpu_seconds(broker_pid) if broker_pid else None
        self.own_start = time.process_time()

    def usage(self, wall_s: float, child_cpu_s: float, messages: int) -> dict[str, float]:
        spent = {"generator": time.process_time() - self.own_start + child_cpu_s}
        if self.broker_pid and self.broker_start is not None:
            now = cpu_seconds(self.broker_pid)
            if now is not None:
                spent["broker"] = now - self.broker_start
        report: dict[str, float] = {}
        for who, seconds in spent.items():
            if wall_s > 0:
                report[f"{who}_cpu"] = round(seconds / wall_s, 2)
            if messages:
                report[f"{who}_cpu_us_per_msg"] = round(seconds / messages * 1e6, 2)
        return report


def acked_lost(tallies: Sequence[Tally], acked_by: dict[int, int]) -> int:
    """(subscriber, publisher, seq) the broker acknowledged but never delivered.

    A publisher's first `acked_by[n]` messages are the acknowledged ones (PUBACKs
    come in PUBLISH order), so this counts the holes below that mark in each
    tally; unacknowledged messages still belong to the client and are not lost.
    """
    return sum(tally.missing_below(acked_by) for tally in tallies)


def _result(
    cfg: RunConfig,
    plan: Plan,
    outcome: PublishOutcome,
    tallies: list[Tally],
    expected: int,
    duration: float,
) -> Result:
    unique = sum(t.unique for t in tallies)
    received = sum(t.received for t in tallies)
    last_rx = max((t.last_ns for t in tallies), default=0)
    elapsed_s = (last_rx - outcome.first_ns) / 1e9 if last_rx > outcome.first_ns else 0.0
    samples = [s for t in tallies for s in (t.latencies_ns or ())]
    extra: dict[str, Any] = {
        "publishers": len(plan.publishers),
        "subscribers": len(plan.subscribers),
        "payload_bytes": max(cfg.payload_size, wire.PAYLOAD.size),
        "mqtt": "5" if cfg.version == wire.MQTT_5 else "3.1.1",
        "split": cfg.split,
        "measured_s": round(elapsed_s, 4),
    }
    if cfg.qos:
        extra["acked"] = outcome.acked
        extra["unacked"] = sum(outcome.sent.values()) - outcome.acked
        extra["acked_lost"] = acked_lost(tallies, outcome.acked_by)
        extra["window"] = cfg.window
    if plan.paced:
        extra["rate"] = cfg.rate
    unexpected = sum(t.unexpected for t in tallies)
    if unexpected:
        extra["unexpected"] = unexpected
    return Result(
        scenario=plan.scenario,
        qos=cfg.qos,
        broker=cfg.broker,
        sent=sum(outcome.sent.values()),
        expected=expected,
        received=received,
        loss=max(0, expected - unique),
        duplicates=received - unique,
        msg_per_s=round(received / elapsed_s, 1) if elapsed_s else 0.0,
        duration_s=round(duration, 3),
        latency=latency_of(samples),
        extra=extra,
    )


async def _publish_in_child(cfg: RunConfig, plan: Plan) -> PublishOutcome:
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=_publisher_process, args=(cfg, plan, theirs), daemon=True)
    child.start()
    theirs.close()
    try:
        message = await receive(ours, cfg.connect_timeout + 10, PUBLISHER_PROCESS)
        if message[0] != "ready":
            raise BrokerUnavailable(f"publisher process: {message[1]}")
        ours.send(("go",))
        message = await receive(ours, cfg.duration + cfg.connect_timeout, PUBLISHER_PROCESS)
        if message[0] != "done":
            raise BenchError(f"publisher process: {message[1]}")
        outcome: PublishOutcome = message[1]
        return outcome
    finally:
        ours.close()
        child.join(timeout=5)
        if child.is_alive():
            child.kill()
            child.join()


def _publisher_process(cfg: RunConfig, plan: Plan, conn: Connection) -> None:
    uvloop.run(_publisher_side(cfg, plan, conn))


async def _publisher_side(cfg: RunConfig, plan: Plan, conn: Connection) -> None:
    gc.disable()
    try:
        publishers = await connect_publishers(cfg, plan)
    except BenchError as exc:
        conn.send(("error", str(exc)))
        return
    try:
        conn.send(("ready",))
        await receive(conn, cfg.connect_timeout + 30, "the parent process")
        conn.send(("done", await publish_all(publishers, plan, cfg.duration)))
    except BenchError as exc:
        conn.send(("error", str(exc)))
    finally:
        _close([p.client for p in publishers])
