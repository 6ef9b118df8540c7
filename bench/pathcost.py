"""The node's CPU per message on its own path, without sockets: what the metrics
and plugins add to QoS 0 fan-in and QoS 1 pairs (the overheads of issue 18).

    python -m bench.pathcost [--rounds 9] [--messages 100000] [--plugins 5]

Each child process builds a node's broker in process (`--backend memory`, the
real `Connection` on a transport that keeps what is written, uvloop), connects
the clients of `weir bench`'s scenario (fan-in: 8 publishers, one subscriber
on `+`; pairs: 100 publisher/subscriber pairs, QoS 1, every PUBLISH to a
subscriber acknowledged), feeds the publishers' PUBLISH frames in chunks of
CHUNK as a socket read would, runs the loop until the subscribers have them
all, and times it in process CPU (`time.process_time`) after a warm-up. The
variants, each in a child of its own per round, alternating:

- `base`: this tree as `weir up` runs it (metrics counted);
- `recorder_off`: `bench.recorder_off`'s build (every counting statement
  removed), the baseline of "metrics on vs off";
- `plugins`: `base` with `bench.noop_plugin` (`--plugins` no-op callbacks on
  message.publish and on message.delivered);
- `env`, with `--env NAME=VALUE` (repeatable): `base` with those environment
  variables, e.g. `--env PYTHONMALLOC=malloc` for the C library's allocator
  instead of Python's (README, "Memory after departures"); its ratio to
  `base` is `env_vs_base`.

Without the socket calls and the loop's I/O, a message costs less here than in
a live node while an overhead costs the same, so a ratio here is a bound on
the one a live node shows (a live node's ratio is nearer 1). The figure is
each variant's best round (noise only adds time) and the median. Prints a
line per run and one JSON object with the ratios on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ("fan-in", "pairs")
VARIANTS = ("base", "recorder_off", "plugins")
FAN_IN_PUBLISHERS = 8  # as bench.scenarios
PAIRS = 100
CHUNK = 16  # PUBLISH frames per data_received, per publisher
PAYLOAD = b"p" * 32  # weir bench's default size
LEVEL = 4  # MQTT 3.1.1, weir bench's default
TURNS = 10_000  # loop turns a chunk may take before the run is called stuck


async def _settle(done: Callable[[], bool], what: str) -> None:
    for _ in range(TURNS):
        if done():
            return
        await asyncio.sleep(0)
    raise RuntimeError(f"pathcost: {what} did not arrive in {TURNS} loop turns")


class _Transport:
    """What a node's `Connection` writes to, kept; enough of asyncio's transport for it."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.protocol: Any = None
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data

    def close(self) -> None:
        self.closed = True

    abort = close

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    resume_reading = pause_reading

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default


class _Node:
    """A broker as `weir up --backend memory` builds it, its clients on `_Transport`s."""

    def __init__(self, plugins: int) -> None:
        from dataclasses import replace

        from services.broker.seams import Seams
        from services.broker.timers import TimerWheel
        from services.config import load
        from services.hooks.api import Hooks
        from services.node.app import build_services
        from services.node.node import broker_for

        hooks = Hooks()
        if plugins:
            from bench.noop_plugin import NoopCallbacks

            NoopCallbacks({"count": plugins}).register(hooks)
        settings = replace(load({}, env={}), node_id="bench")
        # no authorizer, no admission: what is timed is the message path itself
        services = replace(build_services(settings), seams=Seams(hooks=hooks))
        loop = asyncio.get_running_loop()
        self.broker = broker_for(settings, services, loop, TimerWheel(loop))

    async def client(self, client_id: str) -> tuple[Any, _Transport]:
        from services.listener.connection import Connection
        from services.mqtt import codec
        from services.mqtt.packets import Connect

        conn = Connection(self.broker)
        transport = _Transport()
        transport.protocol = conn
        conn.connection_made(transport)  # type: ignore[arg-type]
        conn.data_received(codec.encode(Connect(client_id, protocol_level=LEVEL), LEVEL))
        await _settle(lambda: transport.data[:1] == b"\x20", f"{client_id}'s CONNACK")
        transport.data.clear()
        return conn, transport

    async def subscriber(self, client_id: str, topic_filter: str, qos: int) -> _Transport:
        from services.mqtt import codec
        from services.mqtt.packets import Subscribe, Subscription

        conn, transport = await self.client(client_id)
        conn.data_received(codec.encode(Subscribe(1, (Subscription(topic_filter, qos),)), LEVEL))
        await _settle(lambda: transport.data[:1] == b"\x90", f"{client_id}'s SUBACK")
        transport.data.clear()
        return transport


Step = Callable[[], Awaitable[int]]


async def fan_in(node: _Node) -> Step:
    """8 publishers, QoS 0, one subscriber on `bench/+/x`: a step is a chunk from each."""
    from services.mqtt import codec
    from services.mqtt.packets import Publish

    sub = await node.subscriber("sub", "bench/+/x", 0)
    pubs = []
    for i in range(FAN_IN_PUBLISHERS):
        conn, _ = await node.client(f"pub{i}")
        pubs.append((conn, codec.encode(Publish(f"bench/{i}/x", PAYLOAD), LEVEL) * CHUNK))
    size = len(pubs[0][1]) // CHUNK  # a copy out is the frame in (3.1.1, QoS 0)
    expected = FAN_IN_PUBLISHERS * CHUNK * size

    async def step() -> int:
        for conn, chunk in pubs:
            conn.data_received(chunk)
        await _settle(lambda: len(sub.data) >= expected, "the fan-in copies")
        if len(sub.data) != expected:
            raise RuntimeError(f"pathcost: {len(sub.data)} bytes out, {expected} expected")
        sub.data.clear()
        return FAN_IN_PUBLISHERS * CHUNK

    return step


async def pairs(node: _Node) -> Step:
    """100 pairs, QoS 1: a step is a chunk from each publisher, each copy acknowledged."""
    from services.mqtt import codec
    from services.mqtt.packets import Publish

    lanes = []
    for i in range(PAIRS):
        topic = f"bench/p{i}"
        sub = await node.subscriber(f"s{i}", topic, 1)
        conn, pub = await node.client(f"p{i}")
        chunk = b"".join(codec.encode(Publish(topic, PAYLOAD, qos=1, packet_id=k + 1), LEVEL)
                         for k in range(CHUNK))  # fmt: skip
        size = len(chunk) // CHUNK  # the copy to the subscriber: same size, its own id
        lanes.append((conn, pub, sub, chunk, size, 2 + 2 + len(topic)))
    acked = 4 * CHUNK  # a 3.1.1 PUBACK is 4 bytes

    def arrived() -> bool:
        return all(len(s.data) >= size * CHUNK and len(p.data) >= acked
                   for _, p, s, _, size, _ in lanes)  # fmt: skip

    async def step() -> int:
        for conn, pub, _, chunk, _, _ in lanes:
            pub.data.clear()
            conn.data_received(chunk)
        await _settle(arrived, "the pairs' copies and PUBACKs")
        for _, _, sub, _, size, at in lanes:
            data = bytes(sub.data)
            sub.data.clear()
            if len(data) != size * CHUNK:
                raise RuntimeError(f"pathcost: {len(data)} bytes to a subscriber, not {size*CHUNK}")
            ids = (data[k + at : k + at + 2] for k in range(0, len(data), size))
            sub.protocol.data_received(b"".join(b"\x40\x02" + i for i in ids))
        return PAIRS * CHUNK

    return step


async def _measure(scenario: str, messages: int, plugins: int) -> float:
    node = _Node(plugins)
    step = await (fan_in if scenario == "fan-in" else pairs)(node)
    await _run_steps(step, messages // 10)
    return await _timed(step, messages)


async def _run_steps(step: Step, messages: int) -> int:
    sent = 0
    while sent < messages:
        sent += await step()
    return sent


async def _timed(step: Step, messages: int) -> float:
    """CPU us per message over at least `messages` of `step`."""
    began = time.process_time()
    sent = await _run_steps(step, messages)
    return (time.process_time() - began) / sent * 1e6


def child(scenario: str, messages: int, plugins: int) -> float:
    import uvloop

    return uvloop.run(_measure(scenario, messages, plugins))


async def _serve(scenario: str, warm: int, plugins: int) -> None:
    """A child of an interleaved run: warm up, say so, then time one slice per
    line read from stdin (its count of messages), answering with the cost."""
    node = _Node(plugins)
    step = await (fan_in if scenario == "fan-in" else pairs)(node)
    await _run_steps(step, warm)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:  # blocking on the loop is fine: between slices nothing is due
        print(json.dumps({"us_per_msg": await _timed(step, int(line))}), flush=True)


def _env(variant: str, build: Path, extra: dict[str, str]) -> dict[str, str]:
    """The child's import path: this tree's services, or the recorder-off build's
    (PYTHONSAFEPATH: the current directory's services/ never comes first); the
    `env` variant's own variables."""
    paths = [str(build), str(ROOT)] if variant == "recorder_off" else [str(ROOT)]
    own = extra if variant == "env" else {}
    return {**os.environ, **own, "PYTHONSAFEPATH": "1", "PYTHONPATH": os.pathsep.join(paths)}


def variants(extra: dict[str, str]) -> tuple[str, ...]:
    return (*VARIANTS, "env") if extra else VARIANTS


def _run(variant: str, scenario: str, messages: int, plugins: int, build: Path,
         extra: dict[str, str]) -> float:  # fmt: skip
    command = [sys.executable, "-m", "bench.pathcost", "--child", scenario,
               "--messages", str(messages),
               "--plugins", str(plugins if variant == "plugins" else 0)]  # fmt: skip
    done = subprocess.run(command, env=_env(variant, build, extra), capture_output=True, text=True,
                          check=False, timeout=600)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"pathcost: the {variant} child failed: {done.stderr.strip()[-400:]}")
    cost: float = json.loads(done.stdout.splitlines()[-1])["us_per_msg"]
    return cost


def _interleaved(scenario: str, slices: int, messages: int, plugins: int,
                 build: Path, extra: dict[str, str]) -> dict[str, list[float]]:
    """One child per variant, all alive at once, taking turns slice by slice
    (in every order in turn): the machine's swings fall on all three alike.
    A process has a bias of its own (its memory layout: two children of one
    tree differed by 2% over 400 slices), so a run needs several rounds."""
    children: dict[str, subprocess.Popen[str]] = {}
    try:
        for variant in variants(extra):
            command = [sys.executable, "-m", "bench.pathcost", "--serve", scenario,
                       "--messages", str(messages),
                       "--plugins", str(plugins if variant == "plugins" else 0)]  # fmt: skip
            children[variant] = subprocess.Popen(
                command, env=_env(variant, build, extra), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, text=True)  # fmt: skip
        for variant, proc in children.items():
            _answer(variant, proc)  # ready
        costs: dict[str, list[float]] = {v: [] for v in variants(extra)}
        orders = list(itertools.permutations(variants(extra)))  # who goes first, after whom
        for index in range(slices):
            for variant in orders[index % len(orders)]:
                proc = children[variant]
                assert proc.stdin is not None
                proc.stdin.write(f"{messages}\n")
                proc.stdin.flush()
                costs[variant].append(_answer(variant, proc)["us_per_msg"])
        return costs
    finally:
        for proc in children.values():
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=60)


def _answer(variant: str, proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"pathcost: the {variant} child ended (exit {proc.wait()})")
    answer: dict[str, Any] = json.loads(line)
    return answer


def summary(scenario: str, costs: dict[str, list[float]]) -> dict[str, Any]:
    """Each variant's best, median and mean CPU us per message, and the two
    speed ratios the issue names (as msg/s would give them: cost before / cost
    after) of the best runs, the medians, and paired: the median of the ratios
    of runs made side by side (the same round or slice cycle)."""
    best = {v: min(c) for v, c in costs.items()}
    median = {v: statistics.median(c) for v, c in costs.items()}

    def ratio(before: str, after: str) -> dict[str, float]:
        pairs = [b / a for b, a in zip(costs[before], costs[after], strict=False)]
        return {"best": round(best[before] / best[after], 3),
                "median": round(median[before] / median[after], 3),
                "paired": round(statistics.median(pairs), 3)}  # fmt: skip

    return {
        "scenario": scenario,
        "us_per_msg": {v: {"best": round(best[v], 3), "median": round(median[v], 3),
                           "mean": round(statistics.fmean(c), 3)}
                       for v, c in costs.items()},
        "metrics_on_vs_off": ratio("recorder_off", "base"),
        "plugins_vs_none": ratio("base", "plugins"),
        **({"env_vs_base": ratio("base", "env")} if "env" in costs else {}),
    }


def _round(scenario: str, index: int, args: argparse.Namespace, build: Path,
           costs: dict[str, list[float]]) -> None:  # fmt: skip
    """One child per variant, one after the other (each goes first in turn)."""
    names = variants(args.env)
    for variant in names[index % len(names) :] + names[: index % len(names)]:
        cost = _run(variant, scenario, args.messages, args.plugins, build, args.env)
        costs[variant].append(cost)
        line = {"scenario": scenario, "round": index + 1, "variant": variant,
                "us_per_msg": round(cost, 3)}  # fmt: skip
        print(json.dumps(line), flush=True)


def _sliced_round(scenario: str, index: int, args: argparse.Namespace, build: Path,
                  costs: dict[str, list[float]]) -> None:  # fmt: skip
    """Fresh children taking turns `--slices` times (`_interleaved`)."""
    sliced = _interleaved(scenario, args.slices, args.messages, args.plugins, build, args.env)
    for variant, more in sliced.items():
        costs[variant] += more
    print(json.dumps({"scenario": scenario, "round": index + 1, **summary(scenario, sliced)}),
          flush=True)  # fmt: skip


def _variable(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pathcost",
                                     description=__doc__.splitlines()[0])  # fmt: skip
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--messages", type=int, default=100_000, help="timed, per run")
    parser.add_argument("--plugins", type=int, default=5, help="no-op callbacks per point")
    parser.add_argument("--scenario", choices=SCENARIOS, action="append")
    parser.add_argument("--slices", type=int, default=0,
                        help="interleaved: per round, this many slices of --messages each")
    parser.add_argument("--env", type=_variable, action="append", default=[],
                        help="NAME=VALUE: a fourth variant, base with these variables")
    parser.add_argument("--child", choices=SCENARIOS, help=argparse.SUPPRESS)
    parser.add_argument("--serve", choices=SCENARIOS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.env = dict(args.env)
    if args.rounds < 1 or args.messages < 1 or args.plugins < 0 or args.slices < 0:
        parser.error("--rounds and --messages must be positive, --plugins and --slices at least 0")
    if args.serve:
        import uvloop

        uvloop.run(_serve(args.serve, args.messages, args.plugins))
        return 0
    if args.child:
        cost = child(args.child, args.messages, args.plugins)
        print(json.dumps({"us_per_msg": cost}))
        return 0
    from bench import recorder_off

    with tempfile.TemporaryDirectory(prefix="weir-pathcost-") as out:
        build = Path(out)
        if recorder_off.build(build) == 0:
            print("pathcost: the recorder-off build removed nothing", file=sys.stderr)
            return 1
        for scenario in args.scenario or SCENARIOS:
            costs: dict[str, list[float]] = {v: [] for v in variants(args.env)}
            for index in range(args.rounds):
                if args.slices:
                    _sliced_round(scenario, index, args, build, costs)
                else:
                    _round(scenario, index, args, build, costs)
            print(json.dumps(summary(scenario, costs)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
