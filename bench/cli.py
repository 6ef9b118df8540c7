"""`weir bench SCENARIO`: measure an MQTT broker, optionally against a peer.

Prints one JSON line per run on stdout; with `--vs` (or `--spawn-mosquitto`)
the runs alternate between the two brokers and a last line gives the median
ratios, ours / peer. Bad arguments exit 2 with one line on stderr; a broker
that cannot be reached exits 1 with one line.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import uvloop

from bench import compared, profile, wire
from bench.errors import BenchError, UsageError
from bench.idle import PER_WORKER_MAX, IdleConfig, raise_nofile_limit, run_idle
from bench.mosquitto import MOSQUITTO, spawn_mosquitto
from bench.plan import RunConfig
from bench.proc import find_listener_pid, is_local
from bench.redisstats import figures, snapshot
from bench.report import Result, comparison
from bench.scenarios import FAN_OUT_SUBSCRIBERS, SCENARIOS, plan_for, run_plan
from bench.scrape import timed_gets
from bench.soak import RUNNERS, EmbeddedConfig
from bench.suback import DEFAULT_COUNT as SUBACK_COUNT
from bench.suback import SubackConfig, run_suback
from services.cli import CONTEXT
from services.cli import run as run_command

DEFAULT_MESSAGES = {"fan-in": 400_000, "fan-out": 4_000, "pairs": 400_000}
"""Messages published per run; fan-out delivers 100 times as many."""
MAX_DELIVERIES = 10_000_000
"""Each delivery the subscribers expect takes a byte to track; each run's worth
of messages is encoded up front. Both bounds keep one run under ~1 GiB."""
MAX_ENCODED_BYTES = 1 << 30
MAX_PAYLOAD = 1 << 20
"""Bytes; far above what a benchmark needs, below most brokers' packet limits."""
PACKET_OVERHEAD = 64
"""Bytes per PUBLISH beyond --size, at most: header, topic, packet id, payload header."""
SPLIT_BY_DEFAULT = frozenset({"fan-out"})
"""Scenarios whose publishers run in their own process unless --no-split. Measured
against Mosquitto 2.0.11 on the 2-core box: a second process doubles fan-out at
QoS 1 (the lone publisher waits behind 100 busy subscribers in a shared loop)
but costs fan-in and pairs 10-35% (three busy processes on two cores)."""
LATENCY_SECONDS = 5
"""The latency scenario's default run: `--rate` messages per second for this long."""


EPILOG = """scenarios:
  fan-in   8 publishers -> 1 subscriber on bench/<run>/+/x
  fan-out  1 publisher -> 100 subscribers
  pairs    100 publisher/subscriber pairs on distinct topics
  latency  1 publisher at --rate msg/s -> 1 subscriber; p50/p99/p99.9 in ms
  suback   1 client subscribes to new filters one at a time (each SUBACK awaited):
           SUBACK latency p50/p99 in ms, subscriptions/s (--messages: how many)
  idle     --connections idle connections from 127.0.0.2-250; connect rate and
           the broker's RSS per connection (VmRSS of --broker-pid, or of the
           process found listening on --port); --username/--password or
           --jwt-secret connect with credentials (connects/s with authentication);
           --scrape URL times GET /metrics while they are all connected

The embedded default's own (each starts weir up on a free port and a data dir;
--host/--port do not apply; RSS of weir up, redis-server and Tansu from /proc):
  soak      --sessions persistent sessions, then --cycles lives of new client ids
            (connect, subscribe, disconnect), a persistent one back every 10th;
            a JSON line of RSS, disk and store size every --sample lives; stops at
            --cycles or --max-seconds; then the restart's start-to-ready time
  restart   --sessions persistent sessions, stop, time the next start-to-ready
  footprint idle RSS of the whole embedded default after --duration s at rest

Publishers send as fast as the broker takes (QoS 1: at most --window unacked
each); msg/s = received / (last receive - first send).

--persistent: every client connects with clean session 0 (5.0: clean start 0,
session expiry 1 h) under a fixed id (wb-<scenario>-p<n> / -s<n>), so QoS 1/2
deliveries go through the broker's durable queues; afterwards each id
reconnects clean and disconnects (unless --no-cleanup). --redis-url URL reads
that Redis's INFO commandstats/stats before and after: Redis commands and Lua
calls per delivered message."""


class _Checked(click.ParamType):  # type: ignore[type-arg]
    """A click type from a converter whose ValueError says what is wrong."""

    def __init__(self, name: str, convert: Callable[[str], Any]) -> None:
        self.name, self._convert = name, convert

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self._convert(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _positive_int(text: str) -> int:
    if not text.lstrip("-").isdigit() or int(text) <= 0:
        raise ValueError(f"must be positive, not {text}")
    return int(text)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise ValueError(f"must be a positive number, not {text}")
    return value


MAX_PORT = 65535


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) <= MAX_PORT:
        raise ValueError(f"not a TCP port: {text}")
    return int(text)


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT, not {text!r}")
    return host, _port(port)


POSITIVE = _Checked("N", _positive_int)
SECONDS = _Checked("X", _positive_float)
PORT = _Checked("PORT", _port)


@click.command("bench", context_settings=CONTEXT, help=__doc__.splitlines()[0], epilog=EPILOG)
@click.argument("scenario", type=click.Choice((*SCENARIOS, "idle", "suback", *RUNNERS)),
                metavar="SCENARIO")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=PORT, default=1883, show_default=True)
@click.option("--sub-port", type=PORT, help="subscribers connect here, publishers to --port: two "
              "nodes of one cluster (the run first waits until the subscribers' routes reach "
              "the --port node)")  # fmt: skip
@click.option("--ports", type=POSITIVE, default=1, help="idle: spread the connections over this "
              "many consecutive ports from --port (the nodes of weir up --nodes N)")  # fmt: skip
@click.option("--qos", type=click.Choice(("0", "1")), default="0", show_default=True)
@click.option("--messages", type=POSITIVE, help="messages published, at most")
@click.option("--duration", type=SECONDS, default=10.0, help="seconds of publishing, at most "
              "(then at most 5 s more for messages in flight)")  # fmt: skip
@click.option("--size", type=int, default=32, help="payload bytes (at least 14 used)")
@click.option("--window", type=POSITIVE, default=64, help="QoS 1 unacked/publisher")
@click.option("--rate", type=SECONDS, default=2000.0, help="latency: msg/s")
@click.option("--mqtt", type=click.Choice(("3.1.1", "5")), default="3.1.1", show_default=True)
@click.option("--split/--no-split", default=None,
              help="publishers in a second process (default: only for fan-out, where it helps)")
@click.option("--drain", type=SECONDS, default=1.0, help="quiet seconds to end")
@click.option("--persistent", is_flag=True, help="clean session 0, fixed client ids")
@click.option("--cleanup/--no-cleanup", default=True,
              help="with --persistent: discard the sessions after the run (default: yes)")
@click.option("--redis-url", help="the broker's Redis: count its commands per message")
@click.option("--connections", type=POSITIVE, default=1000, help="idle: how many")
@click.option("--workers", type=POSITIVE, help="idle: generator processes")
@click.option("--broker-pid", type=POSITIVE, help="for RSS and CPU (default: found)")
@click.option("--username", help="idle: connect with this user name ({i}: the connection's index)")
@click.option("--password", help="idle: and this password ({i} as in --username)")
@click.option("--jwt-secret",
              help="idle: the password is an HS256 JWT signed with this secret (sub: --username)")
@click.option("--scrape", multiple=True, metavar="URL", help="idle: once every connection is "
              "open, GET this URL (a node's /metrics; repeat for each node) --scrapes times: "
              "p50/p99/max ms")  # fmt: skip
@click.option("--scrapes", type=POSITIVE, default=20, show_default=True)
@click.option("--vs", type=_Checked("HOST:PORT", _address), help="peer broker to compare")
@click.option("--rounds", type=POSITIVE, default=3, help="with --vs: rounds, A,B then B,A in turn")
@click.option("--spawn-mosquitto", is_flag=True, help=f"run {MOSQUITTO} as the --vs peer")
@click.option("--report-dir", type=click.Path(file_okay=False, path_type=Path),
              help="with a peer: also write the compared figures here as a Markdown table "
              "and a PNG bar chart (<scenario>-qos<n>-<UTC time>.md/.png)")  # fmt: skip
@click.option("--profile", is_flag=True, help="record our broker (--broker-pid, or the "
              "process on --port) with py-spy for the run: a flame graph SVG in "
              "bench/profiles/<scenario>-<UTC time>.svg")  # fmt: skip
@click.option("--cycles", type=POSITIVE, default=1_000_000, show_default=True,
              help="soak: client lives of new client ids")
@click.option("--sessions", type=POSITIVE, help="soak, restart: persistent sessions "
              "(default: soak 10,000, restart 100,000)")  # fmt: skip
@click.option("--sample", type=POSITIVE, default=100_000, show_default=True,
              help="soak: a checkpoint line every N lives")
@click.option("--concurrency", type=POSITIVE, default=20, show_default=True,
              help="soak, restart: client lives at once")
@click.option("--max-seconds", type=SECONDS, default=4 * 3600.0, show_default=True,
              help="soak: stop cycling after this long")
@click.option("--data-dir", help="soak, restart, footprint: weir up's data dir (default: a "
              "temporary one, removed after)")  # fmt: skip
def command(**options: Any) -> int:
    args = SimpleNamespace(**options)
    args.qos = int(options["qos"])
    try:
        _validate(args)
        run(args)
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None
    except BenchError as exc:
        print(f"weir bench: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def parse_args(argv: Sequence[str]) -> SimpleNamespace:
    """The options of `weir bench ARGV` as `run` takes them (tests)."""
    args = SimpleNamespace(**command.make_context("weir bench", list(argv)).params)
    args.qos = int(args.qos)
    return args


Runner = tuple[str, int, int | None]


DEFAULT_SESSIONS = {"soak": 10_000, "restart": 100_000}


def _run_once(args: SimpleNamespace, host: str, port: int, pid: int | None) -> Result:
    version = wire.MQTT_5 if args.mqtt == "5" else wire.MQTT_311
    if args.scenario in RUNNERS:
        embedded = EmbeddedConfig(
            cycles=args.cycles, sessions=args.sessions or DEFAULT_SESSIONS.get(args.scenario, 0),
            sample=args.sample, concurrency=args.concurrency, max_seconds=args.max_seconds,
            duration=args.duration, data_dir=args.data_dir,
        )  # fmt: skip
        return RUNNERS[args.scenario](embedded)
    if args.scenario == "suback":
        count = args.messages or SUBACK_COUNT
        return run_suback(SubackConfig(host, port, count, args.duration, version))
    if args.scenario == "idle":
        workers = args.workers or math.ceil(args.connections / PER_WORKER_MAX)
        idle = IdleConfig(
            host,
            port,
            args.connections,
            workers=workers,
            duration=args.duration,
            version=version,
            broker_pid=pid,
            ports=args.ports,  # not with a peer (_validate)
            username=args.username,
            password=args.password,
            jwt_secret=args.jwt_secret,
        )
        urls, count = list(args.scrape), args.scrapes
        return run_idle(idle, (lambda: {"scrape": timed_gets(urls, count)}) if urls else None)
    messages = args.messages or DEFAULT_MESSAGES.get(
        args.scenario, int(args.rate * LATENCY_SECONDS)
    )
    cfg = RunConfig(
        host,
        port,
        args.qos,
        messages,
        args.duration,
        payload_size=args.size,
        window=args.window,
        version=version,
        rate=args.rate,
        split=args.scenario in SPLIT_BY_DEFAULT if args.split is None else args.split,
        drain=args.drain,
        broker_pid=pid,
        persistent=args.persistent,
        cleanup=args.cleanup,
        sub_port=args.sub_port,  # not with a peer (_validate)
    )
    redis_url = args.redis_url if (host, port) == (args.host, args.port) else None
    before = snapshot(redis_url) if redis_url else None
    result = uvloop.run(run_plan(cfg, plan_for(args.scenario, messages)))
    if redis_url and before is not None:
        result.extra.update(figures(before, snapshot(redis_url), result.received))
    return result


@contextlib.contextmanager
def _peer(args: SimpleNamespace) -> Iterator[Runner | None]:
    if args.spawn_mosquitto:
        with spawn_mosquitto() as (port, pid):
            yield "127.0.0.1", port, pid
    elif args.vs:
        yield args.vs[0], args.vs[1], None
    else:
        yield None


def _validate(args: SimpleNamespace) -> None:
    if args.scenario in RUNNERS and (args.vs or args.spawn_mosquitto or args.profile):
        raise UsageError(f"{args.scenario} starts its own weir up: no --vs, "
                         "--spawn-mosquitto or --profile")  # fmt: skip
    if args.report_dir and not (args.vs or args.spawn_mosquitto):
        raise UsageError("--report-dir writes a comparison: give --vs or --spawn-mosquitto")
    if args.profile and not is_local(args.host):
        raise UsageError("--profile attaches to a broker on this machine (--host 127.0.0.1)")
    if args.vs and args.spawn_mosquitto:
        raise UsageError("--vs and --spawn-mosquitto both name the peer; give one")
    if args.workers and args.connections > args.workers * PER_WORKER_MAX:
        raise UsageError(
            f"--connections {args.connections} needs --workers >= "
            f"{math.ceil(args.connections / PER_WORKER_MAX)} ({PER_WORKER_MAX} per process)"
        )
    if args.scenario != "idle" and (args.username or args.password or args.jwt_secret):
        raise UsageError("--username, --password and --jwt-secret apply to idle")
    if args.password and args.jwt_secret:
        raise UsageError("--password and --jwt-secret both give the password; give one")
    if args.scenario == "idle" and (args.persistent or args.redis_url or args.sub_port):
        raise UsageError(
            "--persistent, --redis-url and --sub-port apply to the message scenarios, not idle"
        )
    if args.scrape and (args.scenario != "idle" or args.vs or args.spawn_mosquitto):
        raise UsageError("--scrape applies to idle, on our broker (no --vs)")
    if args.ports > 1 and args.scenario != "idle":
        raise UsageError("--ports applies to idle; the message scenarios take --sub-port")
    if args.port + args.ports - 1 > MAX_PORT:
        raise UsageError(f"--ports {args.ports} from --port {args.port} passes port {MAX_PORT}")
    if (args.sub_port or args.ports > 1) and (args.vs or args.spawn_mosquitto):
        raise UsageError("--sub-port and --ports measure a cluster; --vs compares one broker")
    if not 0 <= args.size <= MAX_PAYLOAD:
        raise UsageError(f"--size must be 0..{MAX_PAYLOAD}, not {args.size}")
    if args.messages:
        fan = FAN_OUT_SUBSCRIBERS if args.scenario == "fan-out" else 1
        if args.messages * fan > MAX_DELIVERIES:
            raise UsageError(
                f"--messages {args.messages} means more than {MAX_DELIVERIES} deliveries"
            )
        if args.messages * (args.size + PACKET_OVERHEAD) > MAX_ENCODED_BYTES:
            raise UsageError(f"--messages x --size is more than {MAX_ENCODED_BYTES >> 20} MiB")


def _profiled(args: SimpleNamespace, now: datetime) -> contextlib.AbstractContextManager[object]:
    if not args.profile:
        return contextlib.nullcontext()
    pid = args.broker_pid or find_listener_pid(args.port)
    if pid is None:
        raise BenchError(f"--profile: no process of ours listens on port {args.port}; "
                         "give --broker-pid")  # fmt: skip
    return profile.profiling(pid, profile.svg_path(args.scenario, now))


def run(args: SimpleNamespace) -> list[Result]:
    raise_nofile_limit()
    now = datetime.now(UTC)
    with _profiled(args, now) as svg:
        results = _run_all(args, now)
    if svg is not None:
        print(f"weir bench: flame graph in {svg}", file=sys.stderr, flush=True)
    return results


def _run_all(args: SimpleNamespace, now: datetime) -> list[Result]:
    ours: Runner = (args.host, args.port, args.broker_pid)
    with _peer(args) as peer:
        if peer is None:
            result = _run_once(args, *ours)
            print(result.line(), flush=True)
            return [result]
        mine: list[Result] = []
        theirs: list[Result] = []
        for index in range(args.rounds):
            order = ((ours, mine), (peer, theirs))
            for target, results in order if index % 2 == 0 else order[::-1]:
                result = _run_once(args, *target)
                print(result.line(), flush=True)
                results.append(result)
        print(json.dumps(comparison(mine, theirs)), flush=True)
        if args.report_dir is not None:
            written = compared.write(args.report_dir, (mine, theirs), now)
            print(f"weir bench: wrote {', '.join(map(str, written))}", file=sys.stderr, flush=True)
        return mine + theirs


def main(argv: Sequence[str]) -> int:
    return run_command(command, argv, "weir bench")
