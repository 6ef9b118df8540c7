"""Node kill chaos: SIGKILL the node under QoS 1/2 load, lose nothing.

A real redis-server (durable profile: appendfsync always) and a private
embedded Kafka, the node as a subprocess on them. A persistent QoS 2
publisher at 1,000 msg/s whose payloads are sequence numbers, and on its
topic six persistent subscribers:

- online: a 3.1.1 QoS 1 and a 3.1.1 QoS 2 subscriber that stay connected
  (reconnecting after each kill);
- offline: a 3.1.1 (clean_session=0) and a 5.0 (Clean Start 0 on reconnect,
  Session Expiry Interval 3600) subscriber at QoS 1 and at QoS 2 that
  SUBSCRIBE once and then come and go (online for a random while, away with
  DISCONNECT or a bare socket close, offline for a random while) and never
  subscribe again: what was published while they were away can only reach
  them from the broker's stored queue.

The node is SIGKILLed and restarted on the same port, Redis and Kafka, KILLS
times (seeded; the seed is printed, WEIR_CHAOS_SEED replays the schedule).
Every other kill is "gated": the schedule waits until every offline
subscriber is away, lets messages pile up in their queues, kills, and lets
them back only a while after the node is ready again; the others come at
random moments. Then: nothing missing for any subscriber; QoS 1 duplicates
all carry DUP=1; each QoS 2 subscriber's application saw each message
exactly once; no reconnect found its session gone.

At every kill, and again once the restarted node is ready, the test reads
each subscriber's stored state from Redis (queue hash `{c:<id>}:q`, inflight
hash `{c:<id>}:f`) and counts the messages that the publisher had got PUBREC
for but that are neither stored nor delivered: that tells a message never
stored (gap at the kill) from one the restart removed (gap after restart);
it also lists order inversions in each stored queue. The figures also count
order violations per subscriber (a non-DUP delivery below an earlier one on
the same connection) and how many of them the publisher's own resends
explain; they are reported, not asserted. The run ends when every
subscriber has everything or, if something is lost, when all are connected
and Redis has held nothing for any of them for DRAINED_FOR_S.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from services.embedded.kafka import EmbeddedKafka
from services.embedded.redis_server import RedisServer
from services.ports import free_port
from services.queue.redis import RedisQueueStore
from services.session.redis import client_keys, connect
from services.store.serial import loads
from tests.chaos.clients import (
    OfflineSubscriber,
    Publisher,
    Subscriber,
    until_complete_or_drained,
)
from tests.chaos.harness import (
    LEVEL,
    LEVEL_5,
    NodeProcess,
)

# serial: the run loads both cores against a deadline, so scripts/test.sh runs it
# alone, after the xdist workers (tests/support/parallel.py)
pytestmark = [
    pytest.mark.slow, pytest.mark.serial, pytest.mark.redis, pytest.mark.kafka,
    pytest.mark.timeout(300),
]  # fmt: skip

TOTAL = 20_000  # messages: 20 s of publishing at RATE
RATE = 1000.0  # msg/s while connected
KILLS = 8  # even-numbered ones gated (all offline subscribers away), the others at random
KILL_GAP_S = (1.0, 3.0)  # a random kill comes this long after the node is ready again
AWAY_BEFORE_KILL_S = (0.5, 2.0)  # gated kill: messages pile up this long before it
AWAY_AFTER_READY_S = (0.2, 1.0)  # gated kill: and this long after the node is back
DRAINED_FOR_S = 3.0  # nothing stored for anyone this long, all connected: nothing more comes
ONLINE_S = (0.5, 1.5)  # an offline subscriber's online window
OFFLINE_S = (1.0, 3.0)  # an offline subscriber's offline window (longer when gated)
READY_TIMEOUT_S = 30.0
RUN_DEADLINE_S = 200.0  # publishing, kills and catching up, all together
TOPIC = "chaos/seq"
QUEUE_LIMITS = [
    pytest.param(2 * TOTAL, id="roomy-queues"),
    pytest.param(1000, id="default-bound"),
]
"""Per-client queue bounds the test runs with. Above the whole run, nothing is ever
full: the kills alone are tested. At the default bound (1000) the offline
subscribers' queues fill up while they are away: a full queue refuses the message
(the 3.1.1 publisher gets no PUBREC, is disconnected and resends later), so the
same assertions hold: nothing acknowledged is missing. (Before the refusal, the
overflow policy dropped the oldest acknowledged messages of each offline window.)"""


@dataclass
class KillRecord:
    at: float  # monotonic
    gated: bool
    away: list[str]  # offline subscribers away at the kill
    restart_s: float = 0.0
    gap_at_kill: dict[str, list[int]] = field(default_factory=dict)  # acked, not stored/delivered
    gap_after_restart: dict[str, list[int]] = field(default_factory=dict)
    stored_at_kill: dict[str, int] = field(default_factory=dict)  # queue + inflight messages
    # (seq, a higher seq queued before it) in the stored queue's own order at the kill
    queue_inversions: dict[str, list[tuple[int, int]]] = field(default_factory=dict)


def _subscribers(rng: random.Random) -> tuple[list[Subscriber], list[OfflineSubscriber]]:
    online = [Subscriber("chaos-sub-q1", TOPIC, 1), Subscriber("chaos-sub-q2", TOPIC, 2)]
    gate = asyncio.Event()
    gate.set()
    settle = asyncio.Event()
    offline = [
        OfflineSubscriber(
            f"chaos-off-{'v5' if level == LEVEL_5 else 'v311'}-q{qos}",
            TOPIC,
            qos,
            level=level,
            rng=random.Random(rng.getrandbits(64)),
            online_s=ONLINE_S,
            offline_s=OFFLINE_S,
            gate=gate,
            settle=settle,
        )
        for level in (LEVEL, LEVEL_5)
        for qos in (1, 2)
    ]
    return online, offline


@pytest.mark.parametrize("queue_limit", QUEUE_LIMITS)
async def test_sigkill_loses_nothing(
    tmp_path: Path, durable_redis: RedisServer, private_kafka: EmbeddedKafka, queue_limit: int
) -> None:
    seed = int(os.environ.get("WEIR_CHAOS_SEED", random.randrange(1 << 32)))
    print(f"\nchaos seed {seed} (WEIR_CHAOS_SEED={seed} replays the kill schedule)")
    rng = random.Random(seed)
    port = free_port()
    config = tmp_path / "weir.toml"
    config.write_text(f"[limits]\nqueue_limit = {queue_limit}\n")
    print(f"queue_limit {queue_limit}")
    node = NodeProcess(
        [
            "--config", str(config),
            "--host", "127.0.0.1",
            "--redis", durable_redis.url,
            "--kafka", private_kafka.bootstrap,
            "--mqtt-port", str(port),
            "--ws-port", "off",
            "--node-id", "n1",
            "--data-dir", str(tmp_path / "node"),
        ],
        port,
        tmp_path / "node.log",
    )  # fmt: skip
    online, offline = _subscribers(rng)
    subs = [*online, *offline]
    node.start()
    try:
        await _run(node, rng, seed, online, offline, durable_redis.url)
    finally:
        queue = RedisQueueStore.from_url(durable_redis.url)
        drops = {s.client_id: await queue.drops(s.client_id) for s in subs}
        await queue.close()
        print(f"queue overflow drops in Redis: {drops}")
        print(f"node log {node.log_path}, warnings/errors: {node.warnings()}")
        node.stop()


async def _run(
    node: NodeProcess,
    rng: random.Random,
    seed: int,
    online: list[Subscriber],
    offline: list[OfflineSubscriber],
    redis_url: str,
) -> None:
    await node.wait_ready(READY_TIMEOUT_S)
    began = time.monotonic()
    deadline = began + RUN_DEADLINE_S
    subs: list[Subscriber] = [*online, *offline]
    gate, settle = offline[0].gate, offline[0].settle
    pub = Publisher("chaos-pub", TOPIC, TOTAL, RATE)
    tasks = [asyncio.create_task(s.run(node.port, deadline)) for s in subs]
    redis = connect(redis_url)
    kills: list[KillRecord] = []
    publisher: asyncio.Task[None] | None = None
    try:
        await _until(lambda: all(s.subscribed for s in subs), 10.0, "SUBACKs")
        publisher = asyncio.create_task(pub.run(node.port, deadline))
        for i in range(KILLS):
            gated = i % 2 == 0
            if gated:
                gate.clear()
                await _until(lambda: all(s.offline for s in offline), 10.0, "all offline away")
                await asyncio.sleep(rng.uniform(*AWAY_BEFORE_KILL_S))  # the scenario: queues grow
            else:
                await asyncio.sleep(rng.uniform(*KILL_GAP_S))  # the random moment itself
            record = KillRecord(
                time.monotonic(), gated, [s.client_id for s in offline if s.offline]
            )
            node.kill()
            kills.append(record)
            record.gap_at_kill, record.stored_at_kill, record.queue_inversions = await _gaps(
                redis, pub, subs
            )
            node.start()
            record.restart_s = await node.wait_ready(READY_TIMEOUT_S)
            record.gap_after_restart, _, _ = await _gaps(redis, pub, subs)
            if gated:
                await asyncio.sleep(rng.uniform(*AWAY_AFTER_READY_S))  # queues grow on the new node
                gate.set()
        await asyncio.wait_for(publisher, max(0.0, deadline - time.monotonic()))
        settle.set()
        await until_complete_or_drained(
            redis,
            lambda: not any(s.missing(TOTAL) for s in subs),
            subs,
            [s.client_id for s in subs],
            deadline,
            DRAINED_FOR_S,
        )
    finally:
        gate.set()
        settle.set()
        for s in subs:
            s.stop.set()
        if publisher is not None:
            publisher.cancel()
        results = await asyncio.gather(
            *tasks, *([publisher] if publisher else []), return_exceptions=True
        )
        await redis.aclose()
        _report(seed, began, pub, online, offline, kills)
        errors = [r for r in results if isinstance(r, Exception)]
        if errors:
            print(f"client errors: {errors!r}\nnode log tail:\n{node.log_tail()}")
        trace = os.environ.get("WEIR_CHAOS_TRACE")
        if trace:
            Path(trace).write_text(repr({s.client_id: s.trace for s in subs}))
    assert len(kills) >= 6
    assert pub.done
    for s in offline:
        away = sum(1 for k in kills if s.client_id in k.away)
        assert away * 2 >= len(kills), f"{s.client_id}: only {away} kills while it was away"
        assert s.subscribes == 1
    for s in subs:
        assert s.missing(TOTAL) == [], f"{s.name}: {len(s.missing(TOTAL))} missing"
        assert s.sessions_lost == 0, f"{s.name}: session lost"
        if s.qos == 1:
            assert [q for q, dup in s.duplicates() if not dup] == [], f"{s.name}: DUP=0 dups"
        else:
            assert s.duplicates() == [], f"{s.name}: QoS 2 delivered a message twice"
            assert len(s.delivered) == TOTAL
    assert pub.sessions_lost == 0


async def _gaps(
    redis: aioredis.Redis, pub: Publisher, subs: list[Subscriber]
) -> tuple[dict[str, list[int]], dict[str, int], dict[str, list[tuple[int, int]]]]:
    """Per subscriber: the messages the publisher got PUBREC for that are neither in
    the subscriber's stored queue / inflight window nor delivered to it, how many
    messages are stored for it, and the order inversions of its stored queue. Acked
    first, stored next, delivered last, so a message moving meanwhile is never counted."""
    acked = set(pub.acked_at)
    gaps: dict[str, list[int]] = {}
    stored_counts: dict[str, int] = {}
    inversions: dict[str, list[tuple[int, int]]] = {}
    for s in subs:
        stored, inversions[s.client_id] = await _stored(redis, s.client_id)
        stored_counts[s.client_id] = len(stored)
        gaps[s.client_id] = sorted(acked - stored - s.seen)
    return gaps, stored_counts, inversions


async def _stored(redis: aioredis.Redis, client_id: str) -> tuple[set[int], list[tuple[int, int]]]:
    """The sequence numbers in the client's queue hash (field: the queue position the
    enqueue script gave it) and inflight hash; and, in queue position order, each
    queued seq below one queued before it, with the highest before it."""
    keys = client_keys(client_id)
    queue = await redis.hgetall(keys[1])
    inflight = await redis.hvals(keys[4])
    by_position = sorted(
        (int(pos), int(loads(blob).payload))
        for pos, blob in queue.items()
        if isinstance(blob, bytes)
    )
    inversions = []
    high = -1
    for _, seq in by_position:
        if seq < high:
            inversions.append((seq, high))
        high = max(high, seq)
    seqs = {seq for _, seq in by_position}
    seqs.update(int(loads(b).payload) for b in inflight if isinstance(b, bytes))
    return seqs, inversions


def _short(client_id: str) -> str:
    return client_id.removeprefix("chaos-")


def _ranges(seqs: list[int]) -> str:
    out: list[str] = []
    start = prev = None
    for seq in sorted(seqs):
        if prev is not None and seq == prev + 1:
            prev = seq
            continue
        if start is not None:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = seq
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(out) if out else "-"


def _report(
    seed: int,
    began: float,
    pub: Publisher,
    online: list[Subscriber],
    offline: list[OfflineSubscriber],
    kills: list[KillRecord],
) -> None:
    resent = pub.resent_seqs
    lines = [
        f"=== chaos figures, seed {seed} (WEIR_CHAOS_SEED={seed}) ===",
        f"messages {TOTAL}, kills {len(kills)} ({sum(k.gated for k in kills)} gated); "
        f"restart-to-ready s: {', '.join(f'{k.restart_s:.2f}' for k in kills)}",
        "kills at s (g: gated): "
        + ", ".join(f"{k.at - began:.1f}{'g' if k.gated else ''}" for k in kills),
        f"publisher: connects {pub.connects}, completed {pub.completed}, resent PUBLISH "
        f"{pub.resent_publish}, resent PUBREL {pub.resent_pubrel}, sessions lost "
        f"{pub.sessions_lost}",
        f"{'subscriber':<30} {'deliv':>6} {'miss':>5} {'dups':>5} {'DUP=0':>5} "
        f"{'order':>5} {'o-res':>5} {'conns':>5} {'lost':>4}  offline cycles",
    ]
    for s in [*online, *offline]:
        dups = s.duplicates()
        order = s.order_violations()
        extra = ""
        if isinstance(s, OfflineSubscriber):
            away = sum(1 for k in kills if s.client_id in k.away)
            extra = (
                f"  windows {len(s.offline_windows)}, left with DISCONNECT "
                f"{s.left_with_disconnect} / close {s.left_with_close}, kills while away {away}"
            )
        lines.append(
            f"{s.name:<30} {len(s.delivered):>6} {len(s.missing(TOTAL)):>5} {len(dups):>5} "
            f"{sum(1 for _, d in dups if not d):>5} {len(order):>5} "
            f"{sum(1 for _, q, _ in order if q in resent):>5} {s.connects:>5} "
            f"{s.sessions_lost:>4}{extra}"
        )
    lines.append(
        "(dups: deliveries of a seq seen before; DUP=0: of those without DUP=1; order: "
        "non-DUP deliveries below an earlier seq on the same connection; o-res: of those, "
        "seqs the publisher resent after a reconnect; QoS 2 DUP PUBLISH suppressed: "
        + ", ".join(
            f"{s.client_id} {s.dup_publishes_suppressed}" for s in online + offline if s.qos == 2
        )
        + ")"
    )
    lines.append(
        "QoS 2 duplicates resent under the same packet id with DUP=1 after this client's "
        "PUBCOMP: "
        + ", ".join(
            f"{s.client_id} {_resent_after_pubcomp(s)}" for s in online + offline if s.qos == 2
        )
    )
    lines.append(
        "Redis at each kill: stored = queue + inflight messages per subscriber (* away); "
        "gap = PUBREC'd but neither stored nor delivered, right after the kill / once "
        "the restarted node is ready:"
    )
    for n, k in enumerate(kills):
        stored = ", ".join(
            f"{_short(s.client_id)}{'*' if s.client_id in k.away else ''} "
            f"{k.stored_at_kill.get(s.client_id, 0)}"
            for s in [*online, *offline]
        )
        at = sum(len(v) for v in k.gap_at_kill.values())
        after = sum(len(v) for v in k.gap_after_restart.values())
        lines.append(
            f"  kill {n + 1} at {k.at - began:.1f}s{' gated' if k.gated else ''}: "
            f"stored {stored}; gap {at} / {after}"
        )
        for s in [*online, *offline]:
            inv = k.queue_inversions.get(s.client_id, [])
            if inv:
                lines.append(
                    f"    {s.client_id}: stored queue order inversions "
                    + ", ".join(f"{q} after {h}" for q, h in inv[:8])
                    + (f" (+{len(inv) - 8})" if len(inv) > 8 else "")
                )
            gap_at = k.gap_at_kill.get(s.client_id, [])
            gap_after = k.gap_after_restart.get(s.client_id, [])
            if gap_at or gap_after:
                lines.append(
                    f"    {s.client_id}: gap at kill {_ranges(gap_at)}; "
                    f"after restart {_ranges(gap_after)}"
                )
    for s in [*online, *offline]:
        odd = [(c, q, h) for c, q, h in s.order_violations() if q not in resent]
        if odd:
            lines.append(
                f"{s.client_id} order violations not from publisher resends: "
                + ", ".join(
                    f"{q} after {h} (conn {c}, PUBREC'd {pub.acked_at.get(q, began) - began:.2f}s)"
                    for c, q, h in odd[:8]
                )
            )
    for s in [*online, *offline]:
        missing = s.missing(TOTAL)
        if not missing:
            continue
        acked = [pub.acked_at[m] - began for m in missing if m in pub.acked_at]
        lines.append(
            f"{s.client_id} missing {len(missing)}: {_ranges(missing)}; PUBREC'd between "
            f"{min(acked, default=0):.1f}s and {max(acked, default=0):.1f}s; of them resent "
            f"by the publisher with DUP=1 after a reconnect: {len(set(missing) & resent)}"
        )
        if isinstance(s, OfflineSubscriber):
            lines.append(
                "  offline windows s: "
                + ", ".join(f"{a - began:.1f}-{b - began:.1f}" for a, b in s.offline_windows)
            )
    print("\n".join(lines))


def _resent_after_pubcomp(sub: Subscriber) -> int:
    first: dict[int, int] = {}
    count = 0
    for seq, pid, dup, _ in sub.trace:
        if seq in first and first[seq] == pid and dup:
            count += 1
        first.setdefault(seq, pid)
    return count


async def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
