"""`weir streams verify`: the drift check between the log, the state store and the nodes.

Theory of operation. The log is the source of truth (DESIGN 2): a full
replay of it into a `ClusterView` is the reference, and two kinds of copy
are compared with it, the state store (the Spark job's projection, loaded
the way a starting node loads it) and each live node's view.

Copies are compared at the same log positions, or their differences would
be mere lag:

1. Ask first: a fresh nonce under the request key, so the nodes (which
   look once a second) answer while the log is replayed.
2. Replay the whole log to partition EOF with a consumer of our own
   (read-only: nothing is appended), noting where it ended.
3. Wait, at most --timeout, until the store's offsets and each node's
   dump are exactly there. A copy ahead of the replay means the log grew:
   read on to its new end (every copy must then match that). A node that
   answered but is behind is asked again with a new nonce.
4. Compare what there is: sessions, subscriptions with their options,
   retained messages (digests), and for the store also its routes
   (filter -> node -> count), for a node also its routing trie. A copy
   that never reached the replay's end is reported as lagging (and still
   compared); a node with no answer as not answering.

On a cluster that keeps changing, a node's own acknowledged events can be
in its view before its positions cover them, and the store's state can be
newer than the offsets it records; both show up as differences that a
second run no longer reports. Run it on a settled cluster, or twice.

Progress on stderr while the log is replayed: a bar in a terminal, else
one line when done (`replayed N events in S s`).

Exit codes: 0 no difference, 1 differences (each printed on one line,
grouped by source, then a summary line), 2 bad arguments or Redis / Kafka
unreachable (one line on stderr).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import click
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from services.cli import CONTEXT, Command, Progress, Step, fail, run
from services.cluster.membership import RedisMembership
from services.config import load
from services.config.flags import given, settings_flags, some
from services.config.redisurl import is_cluster_url
from services.embedded import endpoints
from services.event.kafka import KafkaEventLog, KafkaSettings
from services.event.schema import Event, topic_names
from services.node.bootstrap import load_snapshot
from services.state import drift
from services.state.live import DumpMeta, LiveState, Positions
from services.state.records import ViewRecords, view_records
from services.state.redis import RedisStateStore
from services.state.view import ClusterView
from services.store.redis import connect

log = logging.getLogger("weir.verify")

PROG: Final = "weir streams verify"
EXIT_OK, EXIT_DIFFERENCES, EXIT_ERROR = 0, 1, 2
DEFAULT_TIMEOUT_S: Final = 30.0  # the store trails the log by a batch (~1 s) when it keeps up
CONNECT_TIMEOUT_S: Final = 5.0  # a reachable Redis or Kafka answers well within this
TICK_S: Final = 0.2  # how often the copies' positions are read while waiting for them
REQUEST_TTL_S: Final = 120.0  # the request outlives a check by at most this much
PROGRESS_EVERY: Final = 1000  # events replayed between two updates of the progress bar
STORE = "state store"


class VerifyError(Exception):
    """The check could not run; the message is one line."""


@dataclass(frozen=True, slots=True)
class Config:
    redis_url: str
    bootstrap: str
    topic_prefix: str
    timeout_s: float


@click.command(
    "verify", cls=Command, context_settings=CONTEXT,
    help="Compare the state store and every live node's state with a full replay of the "
    "event log; print every difference (exit 1 if any).",
)  # fmt: skip
@click.option("--config", help="TOML config file (default: $WEIR_CONFIG)")
@settings_flags(some("redis_url", "kafka_bootstrap", "kafka_topic_prefix", "data_dir"),
                aliases={"kafka_topic_prefix": "--topic-prefix"})  # fmt: skip
@click.option(
    "--timeout", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_TIMEOUT_S,
    help="seconds to wait for the store and the nodes to reach the log's end "
    f"(default {DEFAULT_TIMEOUT_S:g})",
)  # fmt: skip
@click.option("-v", "--verbose", is_flag=True, help="show the clients' warnings")
def command(config: str | None, timeout: float, verbose: bool, **flags: Any) -> int:
    settings = load({"config": config, **given(flags)})
    if settings.redis_url is None and settings.kafka_bootstrap is None:
        # Neither named: the weir up running on the data dir (its embedded default).
        redis_url, kafka, prefix = endpoints.backends(settings.data_dir, "weir streams verify", 2)
        cfg = Config(redis_url, kafka, prefix, timeout)
        return _check(cfg, verbose)
    if settings.redis_url is None or settings.kafka_bootstrap is None:
        fail(
            "needs the cluster's Redis and Kafka: --redis URL (or WEIR_REDIS_URL) and "
            "--kafka HOST:PORT (or WEIR_KAFKA_BOOTSTRAP), or neither for the weir up "
            "running on --data-dir"
        )
    assert settings.redis_url is not None and settings.kafka_bootstrap is not None
    cfg = Config(settings.redis_url, settings.kafka_bootstrap, settings.kafka_topic_prefix,
                 timeout)  # fmt: skip
    return _check(cfg, verbose)


@dataclass(slots=True)
class Report:
    groups: dict[str, list[str]] = field(default_factory=dict)  # source -> lines
    events: int = 0
    nodes: list[str] = field(default_factory=list)

    @property
    def differences(self) -> int:
        return sum(len(lines) for lines in self.groups.values())

    def lines(self) -> list[str]:
        return [f"{source}: {line}" for source, lines in self.groups.items() for line in lines]

    def summary(self) -> str:
        nodes = f"{len(self.nodes)} live node{'s' if len(self.nodes) != 1 else ''}"
        if self.nodes:
            nodes += " (" + ", ".join(self.nodes) + ")"
        if not self.differences:
            return (
                f"{PROG}: no differences between the log ({self.events} events), "
                f"the state store and {nodes}"
            )
        per = ", ".join(f"{s} {len(ls)}" for s, ls in self.groups.items() if ls)
        return (
            f"{PROG}: {self.differences} difference{'s' if self.differences != 1 else ''} "
            f"({per}); the log: {self.events} events; {nodes}"
        )


class _Replay:
    """The reference: the log folded into a view, read on as the log grows."""

    def __init__(self, events: KafkaEventLog, step: Step | None = None) -> None:
        self.events = events
        self.view = ClusterView()
        self.nodes = drift.SessionNodes()
        self.count = 0
        self.end: Positions = {}
        self.step = step  # the progress shown while the log is read
        self._applied = 0

    def _apply(self, event: Event) -> None:
        self.nodes.see(event)
        self.view.apply(event)
        self._applied += 1
        if self.step is not None and self._applied % PROGRESS_EVERY == 0:
            self.step.advance(PROGRESS_EVERY)

    async def read_on(self) -> None:
        self.count += await self.events.replay(self._apply)
        self.end = self.events.positions()


async def _reach(client: aioredis.Redis, cfg: Config) -> None:
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            await client.ping()
    except (OSError, TimeoutError, RedisError) as exc:
        raise VerifyError(
            f"cannot reach Redis at {cfg.redis_url}: {exc or type(exc).__name__}"
        ) from None
    missing = await asyncio.to_thread(_missing_topics, cfg)
    if missing:
        raise VerifyError(
            f"no event log at {cfg.bootstrap} under prefix {cfg.topic_prefix!r}: "
            f"{', '.join(missing)} missing"
        )


def _missing_topics(cfg: Config) -> list[str]:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    settings: dict[str, Any] = {"bootstrap.servers": cfg.bootstrap, "logger": log}
    admin = AdminClient(settings)
    try:
        held = admin.list_topics(timeout=CONNECT_TIMEOUT_S).topics
    except KafkaException as exc:
        raise VerifyError(f"cannot reach Kafka at {cfg.bootstrap}: {exc.args[0]}") from None
    return [t for t in topic_names(cfg.topic_prefix) if t not in held]


async def verify(cfg: Config) -> Report:
    """Run the check; raises VerifyError when Redis or Kafka cannot be used."""
    client = (
        connect(cfg.redis_url, CONNECT_TIMEOUT_S)  # the store's keys share one hash tag
        if is_cluster_url(cfg.redis_url)
        else aioredis.Redis.from_url(
            cfg.redis_url, socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=30.0
        )
    )
    events = KafkaEventLog(KafkaSettings(bootstrap=cfg.bootstrap, topic_prefix=cfg.topic_prefix))
    try:
        await _reach(client, cfg)
        return await _verify(cfg, client, events)
    finally:
        await events.close()
        await client.aclose()


async def _verify(cfg: Config, client: aioredis.Redis, events: KafkaEventLog) -> Report:
    store = RedisStateStore(client, cfg.topic_prefix)
    live = LiveState(client, cfg.topic_prefix)
    report = Report(nodes=sorted(await RedisMembership(client).live_nodes()))
    nonces = [uuid.uuid4().hex]
    await live.ask(nonces[-1], cfg.timeout_s + REQUEST_TTL_S)
    started = asyncio.get_running_loop().time()
    with Progress(PROG).step("replaying the log (events)") as step:
        replay = _Replay(events, step)
        await replay.read_on()
        took = asyncio.get_running_loop().time() - started
        step.say(f"replayed {replay.count:,} events in {took:.1f} s")
    replay.step = None  # reading on (the log grew) is quick: no more progress
    loop = asyncio.get_running_loop()
    deadline = loop.time() + cfg.timeout_s
    while True:
        store_at = await store.offsets()
        metas = {n: await live.meta(n) for n in report.nodes}
        ours = {n: m for n, m in metas.items() if m is not None and m.nonce in nonces}
        copies = [store_at, *(m.positions for m in ours.values())]
        if any(drift.records_behind(replay.end, at) for at in copies):
            await replay.read_on()  # the log grew past the replay: read on to its new end
        if drift.in_step(store_at, replay.end) and all(
            n in ours and drift.in_step(ours[n].positions, replay.end) for n in report.nodes
        ):
            break
        if loop.time() >= deadline:
            break
        if any(
            m.nonce == nonces[-1] and not drift.in_step(m.positions, replay.end)
            for m in ours.values()
        ):
            nonces.append(uuid.uuid4().hex)  # answered, but not at the replay's end: again
            await live.ask(nonces[-1], cfg.timeout_s + REQUEST_TTL_S)
        await asyncio.sleep(TICK_S)
    report.events = replay.count
    report.groups[STORE] = await _store_differences(store, store_at, replay)
    for node in report.nodes:
        report.groups[f"node {node}"] = await _node_differences(
            live, node, ours.get(node), nonces, replay, cfg.timeout_s
        )
    return report


async def _store_differences(
    store: RedisStateStore, store_at: Positions, replay: _Replay
) -> list[str]:
    lines = drift.position_differences(store_at, replay.end)
    snapshot = await store.load()
    view = ClusterView()
    if snapshot is not None:
        load_snapshot(view, view.apply, snapshot)
        if snapshot.bad:
            lines.append(f"{snapshot.bad} entries could not be read")
    want = view_records(replay.view)
    lines += drift.view_differences("store", view_records(view), want)
    expected = drift.expected_routes(want.subscriptions, replay.nodes)
    lines += drift.route_differences("store", await store.routes(), expected)
    return lines


async def _node_differences(
    live: LiveState,
    node: str,
    meta: DumpMeta | None,
    nonces: list[str],
    replay: _Replay,
    timeout_s: float,
) -> list[str]:
    dump = await live.read(node) if meta is not None else None
    if dump is None or dump.nonce not in nonces:
        return [f"did not answer within {timeout_s:g} s"]
    lines = drift.position_differences(dump.positions, replay.end)
    want = view_records(replay.view)
    lines += drift.view_differences(
        "node",
        ViewRecords(dump.sessions, dump.subscriptions, dump.retained),
        want,
    )
    lines += drift.table_differences(dump.table, want.subscriptions)
    return lines


def _quiet_logs(verbose: bool) -> None:
    """The Kafka client logs every refused connection; the CLI says it once."""
    if not logging.getLogger().handlers:
        level = logging.WARNING if verbose else logging.CRITICAL
        logging.basicConfig(level=level, format="weir: %(name)s: %(message)s")


def main(argv: Sequence[str]) -> int:
    return run(command, argv, PROG)


def _check(cfg: Config, verbose: bool) -> int:
    _quiet_logs(verbose)
    try:
        report = asyncio.run(verify(cfg))
    except VerifyError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # one line, never a traceback: name what failed
        print(f"{PROG}: {type(exc).__name__}: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    for line in report.lines():
        print(line)
    print(report.summary())
    return EXIT_DIFFERENCES if report.differences else EXIT_OK


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0][:300] if lines else "(no message)"
