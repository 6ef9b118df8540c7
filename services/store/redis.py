"""Redis plumbing the session and queue stores share.

Keys of one client share the hash tag `{c:<client id>}` so every script
touches a single slot (valid on Redis Cluster); `client_keys` lists them in
the order every script expects. Every call is bounded (`bounded`) and any
failure to get an answer (connection refused, reset, timeout, Redis loading)
becomes `StoreUnavailable`; redis-py reconnects on the next call, so a store
recovers by itself when Redis returns. Scripts are registered once
(`load_script`); redis-py re-loads them when Redis answers NOSCRIPT.

No automatic resend: redis-py's retry is off, because resending a script
whose answer was lost (timeout, reset) could run it twice (an enqueue twice
is a duplicate delivery). Such a call raises StoreUnavailable and its outcome
is unknown; the caller decides. Dead pooled connections (after a Redis
restart) are still replaced transparently when they are checked out.

`UNANSWERED.count` is how many calls of this process got no answer; the
node's metrics read it (`weir_redis_failures_total`, the redis_unavailable
alarm). It is the process's: a process runs one node (tests run several
and then read the sum).

Redis Cluster: a URL `redis+cluster://host:port[,host:port...]` makes
`connect` return redis-py's cluster client (`is_cluster` tells which one a
store got). Every script touches one client's keys, one hash slot; the few
calls that span slots (a node's index beside a client's keys, a batch of
many clients) are split by the stores when `is_cluster`, and only then, so
a single Redis pays no extra round trip. Scripts in a cluster pipeline are
not re-registered on NOSCRIPT (a replica promoted by a failover has none),
so on a cluster the stores run them one by one.

Scripts in a pipeline go as EVALSHA alone (`pipelined`): redis-py's own
pipeline asks Redis SCRIPT EXISTS first, a round trip of its own per
pipeline (5,596 of them beside 13,316 script calls in 5 s of persistent
QoS 1 pairs). A script Redis does not have (after a restart or SCRIPT
FLUSH) did not run; it is loaded and run again.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Sequence
from importlib import resources
from typing import Any, Final, TypeVar, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, PipelineCommand, RedisCluster
from redis.asyncio.connection import Connection, parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import AskError, ClusterDownError, MovedError, NoScriptError, RedisError

from services.config.redisurl import cluster_nodes, is_cluster_url
from services.store.errors import StoreUnavailable
from services.store.packing import packed

POOL_CONNECTIONS = 64  # concurrent calls per process; more only queue on one Redis thread
DEFAULT_TIMEOUT_S = 2.0  # per call; a healthy local Redis answers in well under 1 ms
FENCED = -1
# An expired session's message-state keys outlive its session hash this long,
# so the node that logs the expiry can hand a shared member's copies over
# (services/queue/scripts/leftovers.lua); enqueue_take.lua has the same figure.
LEFTOVER_GRACE_MS = 60_000

T = TypeVar("T")

_POOL_OPTIONS: dict[str, Any] = {}
try:  # redis-py >= 7: "auto" maintenance notifications skip the pool's dead-connection check
    from redis.maint_notifications import MaintNotificationsConfig

    _POOL_OPTIONS["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
except ImportError:  # pragma: no cover - older redis-py has no such mode
    pass

# s session hash; q queue hash; o queue order; z QoS 0 seqs; f inflight hash;
# fo inflight order; x released ids; r incoming QoS 2 ids
KEY_SUFFIXES = ("s", "q", "o", "z", "f", "fo", "x", "r")


@functools.lru_cache(maxsize=8192)  # about 4 MB at most
def client_keys(client_id: str) -> tuple[bytes, ...]:
    tag = ("{c:" + client_id + "}:").encode()
    return tuple(tag + suffix.encode() for suffix in KEY_SUFFIXES)


# Connections per cluster primary. A cluster node's pool fails a call past its
# limit instead of making it wait (redis-py has no blocking pool there), so
# the limit sits well above the single-Redis pool's: a burst queues on Redis.
CLUSTER_NODE_CONNECTIONS = 512


def is_cluster(client: object) -> bool:
    return isinstance(client, RedisCluster)


def connect(url: str, timeout: float = DEFAULT_TIMEOUT_S) -> aioredis.Redis:
    """A client on `url`: a Redis Cluster client for `redis+cluster://`, else
    a client on one Redis. The cluster client answers every command the
    stores send, so it is typed as the one-Redis client they are written
    against; `is_cluster` tells them apart where the calls must differ.

    One Redis: a client whose pool makes a call wait for a free connection (bounded by
    `timeout`) instead of failing: redis-py's default pool raises at once past
    its limit, which a burst of persistent sessions reaches. The client owns
    its pool: `aclose` closes the pool's connections too (a client made on a
    pool it was given leaves them open)."""
    if is_cluster_url(url):
        return cast(aioredis.Redis, _connect_cluster(url, timeout))
    options: dict[str, Any] = dict(
        max_connections=POOL_CONNECTIONS,
        timeout=timeout,
        # calls are bounded by `bounded`; a socket timeout costs 2 tasks a call, and
        # with redis-py 8's default one a task cancelled mid-call often goes on
        # as if it had not been (tests/contract/test_cancellation.py)
        socket_timeout=None,
        socket_connect_timeout=timeout,
        health_check_interval=0,
        retry=Retry(NoBackoff(), 0),  # never resend a script whose answer was lost
        **_POOL_OPTIONS,
    )
    options.update(parse_url(url))  # as `from_url` does: the URL's options win
    options["connection_class"] = packed(options.get("connection_class", Connection))
    pool = aioredis.BlockingConnectionPool(**options)  # hiredis packs the commands
    return aioredis.Redis.from_pool(pool)  # decode_responses: the pool's (False)


class _Cluster(RedisCluster):
    """redis-py's cluster client, made to read the slot map before a first
    call picks its node: left to itself, the calls of a burst on a fresh
    client pick a seed node's connection that reading the map then closes
    ("Connection closed by server"; 5 of 10 concurrent first calls failed)."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if self._initialize:
            await self.initialize()
        return await super().execute_command(*args, **kwargs)


def _connect_cluster(url: str, timeout: float) -> RedisCluster:
    nodes, user, password = cluster_nodes(url)
    return _Cluster(
        startup_nodes=[ClusterNode(host, port) for host, port in nodes],
        username=user,
        password=password,
        max_connections=CLUSTER_NODE_CONNECTIONS,
        socket_timeout=None,  # as above: `bounded` bounds each call
        socket_connect_timeout=timeout,
        # No resend of a call whose answer was lost (see the module's
        # docstring). MOVED/ASK redirects are followed still: the command did
        # not run where it was refused. A failover costs the calls in flight
        # and the next one to the dead primary; that one's failure makes the
        # client re-read the slot map, so the call after it finds the new one.
        retry=Retry(NoBackoff(), 0),
        **_POOL_OPTIONS,
    )


def load_script(client: aioredis.Redis, package: str, name: str) -> AsyncScript:
    source = resources.files(package).joinpath("scripts", name).read_text()
    return client.register_script(source)


class Tally:
    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


UNANSWERED: Final = Tally()


async def run_script(
    script: AsyncScript, keys: Sequence[bytes], args: list[Any], limit_s: float, replicas: int = 0
) -> Any:
    """One script call, bounded. With `replicas` > 0 (`--redis-wait`), WAIT
    follows it on the same connection (WAIT covers that connection's writes
    only, so script and WAIT go as one pipeline): the answer comes once that
    many replicas have the write, so what is acknowledged after it survives
    a failover to one of them. Fewer replicas within half the bound raise
    StoreUnavailable: the write is on the primary only, its fate unknown, as
    for a lost answer."""
    if replicas <= 0:
        return await bounded(script(keys=keys, args=args), limit_s)
    client = script.registered_client
    if isinstance(client, RedisCluster):
        result, copies = await bounded(_waited_on_cluster(client, script, keys, args, replicas,
                                                          limit_s), limit_s)  # fmt: skip
    else:
        result, copies = await bounded(_waited(script, keys, args, replicas, limit_s), limit_s)
    if int(copies) < replicas:
        UNANSWERED.count += 1
        raise StoreUnavailable(
            f"redis WAIT: {copies} of {replicas} replicas took the write within {limit_s / 2} s"
        )
    return result


Call = tuple[AsyncScript, Sequence[bytes], Sequence[Any]]


async def pipelined(client: aioredis.Redis, calls: Sequence[Call], limit_s: float) -> list[Any]:
    """The scripts' answers, in one round trip on one Redis (not a cluster).
    NoScriptError stands for a script Redis did not have (its scripts were
    flushed: a restart): that call did not run, the others did, so a call
    after it ran before it. The caller runs those again (redis-py's call
    loads the script) as its calls' order requires. Another error is raised
    (as redis-py's pipeline raises it: the calls after it ran)."""
    return await bounded(_pipelined(client, calls), limit_s)


async def _pipelined(client: aioredis.Redis, calls: Sequence[Call]) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for script, keys, args in calls:
        pipe.evalsha(script.sha, len(keys), *keys, *args)
    answers = await pipe.execute(raise_on_error=False)
    for answer in answers:
        if isinstance(answer, Exception) and not isinstance(answer, NoScriptError):
            raise answer
    return answers


async def _waited(
    script: AsyncScript, keys: Sequence[bytes], args: list[Any], replicas: int, limit_s: float
) -> tuple[Any, Any]:
    """Script and WAIT in one round trip (EVALSHA alone, as in `pipelined`);
    NOSCRIPT: the script did not run, so it is loaded and both go again."""
    client = script.registered_client
    wait_ms = max(1, int(limit_s * 500))  # half the call's bound
    for _ in range(2):
        pipe = client.pipeline(transaction=False)
        pipe.evalsha(script.sha, len(keys), *keys, *args)
        pipe.wait(replicas, wait_ms)
        result, copies = await pipe.execute(raise_on_error=False)
        if isinstance(result, NoScriptError):
            await client.script_load(script.script)
            continue
        for answer in (result, copies):
            if isinstance(answer, Exception):
                raise answer
        return result, copies
    raise NoScriptError("script not loaded")


async def _waited_on_cluster(
    client: RedisCluster, script: AsyncScript, keys: Sequence[bytes], args: list[Any],
    replicas: int, limit_s: float,
) -> tuple[Any, Any]:  # fmt: skip
    """Script and WAIT on one connection to the primary of the keys' slot (the
    cluster client's own WAIT goes to every node, on other connections).
    NOSCRIPT (a primary that a failover promoted has no scripts): load it there
    and send both again, the script did not run. MOVED (a failover the
    client's slot map does not know yet): the map is read again and the call
    fails, its script not run."""
    if client._initialize:
        await client.initialize()
    node = client.get_node_from_key(keys[0].decode())
    if node is None:
        raise ClusterDownError(f"no primary serves the slot of {keys[0]!r}")
    wait_ms = max(1, int(limit_s * 500))  # half the call's bound
    for _ in range(2):
        commands = [
            PipelineCommand(0, "EVALSHA", script.sha, len(keys), *keys, *args),
            PipelineCommand(1, "WAIT", replicas, wait_ms),
        ]
        await node.execute_pipeline(commands)
        result, copies = commands[0].result, commands[1].result
        if isinstance(result, NoScriptError):
            await node.execute_command("SCRIPT", "LOAD", script.script)
            continue
        if isinstance(result, MovedError | AskError | ClusterDownError):
            await client.nodes_manager.initialize()
            raise result
        for answer in (result, copies):
            if isinstance(answer, Exception):
                raise answer
        return result, copies
    raise NoScriptError("script not loaded on its primary")


async def bounded(call: Awaitable[T], limit_s: float) -> T:
    """Await one Redis call; any failure to answer becomes StoreUnavailable."""
    try:
        async with asyncio.timeout(limit_s):  # no task per call, unlike wait_for
            return await call
    except (RedisError, OSError, TimeoutError) as exc:
        UNANSWERED.count += 1
        raise StoreUnavailable(f"redis did not answer: {type(exc).__name__}: {exc}") from exc
