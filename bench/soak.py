"""The embedded default's own scenarios (issue 19): soak, restart, footprint.

Theory of operation. Each starts the real `weir up` (the embedded default,
bench.embedded.Up) on a data dir and a free port, so `--host`/`--port` do
not apply; every figure is of all its processes (weir up, redis-server,
Tansu), read from /proc.

- `soak`: `sessions` persistent sessions are made first (clean session 0,
  each subscribed to its own filter); then `cycles` client lives of
  ever-new client ids (connect clean, subscribe to an own filter,
  disconnect), `concurrency` at a time, and every PERSISTENT_EVERY-th life
  one persistent session also comes back (in turn: it must find its
  session). Every `sample` lives a checkpoint line: RSS per process and
  summed, the data dir's size, the store's entries, lives/s. It stops at
  `cycles` or `max_seconds`, whichever comes first; then `weir up` is
  stopped (SIGINT) and started again on the data dir: the start-to-ready
  time, and the memory after it. Bounded means the checkpoints level off:
  the view and the store forget ended clients past 100,000 and the log is
  cut every 100,000 appends (services.node.logcut), so look past 200k.
- `restart`: `sessions` persistent sessions, then a stop (SIGINT) and the
  start-to-ready time of the next start (it re-seeds the log with them all);
  a sample of them then finds its session.
- `footprint`: the idle memory of the whole embedded default, after
  `duration` seconds of rest (and its start-to-ready time).

Each prints JSON lines (checkpoints, then the run's `Result`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop

from bench.embedded import Up, life, weigh
from bench.errors import BenchError
from bench.report import Result

SCENARIOS = ("soak", "restart", "footprint")
PERSISTENT_EVERY = 10
"""In the soak, one persistent session comes back per this many new-client lives."""
RESUMED_SAMPLE = 100
"""Persistent sessions a run reconnects after the restart to check they were kept."""
FILTERS_PER_PERSISTENT = 3
"""A returning persistent session subscribes to one of its this many filters (the
store keeps each: a session's subscriptions grow to this, not with the run)."""


@dataclass(frozen=True, slots=True)
class EmbeddedConfig:
    cycles: int = 1_000_000
    sessions: int = 10_000
    sample: int = 100_000
    concurrency: int = 20
    max_seconds: float = 4 * 3600.0
    duration: float = 10.0  # footprint: seconds of rest before weighing
    data_dir: str | None = None  # default: a new temporary directory, removed after


def _free_port() -> int:
    from services.ports import free_port

    return free_port()


def _emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def _result(scenario: str, up: Up, elapsed: float, extra: dict[str, Any]) -> Result:
    return Result(
        scenario=scenario, qos=1, broker=f"weir up (embedded) 127.0.0.1:{up.port}", sent=0,
        expected=0, received=0, loss=0, duplicates=0, msg_per_s=0.0,
        duration_s=round(elapsed, 3), extra=extra,
    )  # fmt: skip


async def _gated(count: int, concurrency: int, one: Callable[[int], Any]) -> list[Any]:
    gate = asyncio.Semaphore(concurrency)

    async def run(i: int) -> Any:
        async with gate:
            return await one(i)

    return await asyncio.gather(*(run(i) for i in range(count)))


MAKE_TRIES = 5
MAKE_BACKOFF_S = 2.0
"""A session the broker refused or cut while being made is made again, after
a pause (a busy machine's Redis timeout, or a node fenced for a late
heartbeat, must not end a 100,000-session run at 74,000)."""


def make_sessions(port: int, count: int, concurrency: int) -> None:
    """`count` persistent sessions bench-p-<j>, each subscribed to bench/p/<j>/0."""

    async def one(j: int) -> bool:
        for _ in range(MAKE_TRIES - 1):
            with contextlib.suppress(BenchError):
                return await life(port, f"bench-p-{j}", False, f"bench/p/{j}/0")
            await asyncio.sleep(MAKE_BACKOFF_S)  # a retry's pause, not a wait for an event
        return await life(port, f"bench-p-{j}", False, f"bench/p/{j}/0")

    uvloop.run(_gated(count, concurrency, one))


def resumed(port: int, sessions: int) -> int:
    """How many of a sample of the persistent sessions found their session."""
    step = max(1, sessions // RESUMED_SAMPLE)

    async def one(k: int) -> bool:
        j = k * step
        return await life(port, f"bench-p-{j}", False, f"bench/p/{j}/0")

    return sum(uvloop.run(_gated(min(sessions, RESUMED_SAMPLE), 10, one)))


@dataclass(slots=True)
class Lives:
    """What a stretch of the soak's lives came to."""

    ran: int = 0
    lost: int = 0  # persistent sessions that came back and found no session
    failed: int = 0  # lives the broker refused or cut (a busy machine's Redis timeouts)
    first_failure: str = ""

    def add(self, other: Lives) -> None:
        self.ran += other.ran
        self.lost += other.lost
        self.failed += other.failed
        self.first_failure = self.first_failure or other.first_failure


MAX_FAILED_SHARE = 0.01
"""A soak goes on past failed lives (one refusal in a million must not end an
hours-long run) and counts them; past this share of its lives it stops."""


def _cycles(
    port: int, start: int, count: int, sessions: int, concurrency: int, deadline: float
) -> Lives:
    """Lives start..start+count, none begun after `deadline` (monotonic)."""
    lives = Lives()

    async def one(k: int) -> None:
        if time.monotonic() > deadline:
            return
        i = start + k
        lives.ran += 1
        try:
            await life(port, f"bench-n-{i}", True, f"bench/n/{i}")
            if sessions and i % PERSISTENT_EVERY == 0:
                j = (i // PERSISTENT_EVERY) % sessions
                found = await life(port, f"bench-p-{j}", False,
                                   f"bench/p/{j}/{i % FILTERS_PER_PERSISTENT}")  # fmt: skip
                lives.lost += not found
        except BenchError as exc:
            lives.failed += 1
            lives.first_failure = lives.first_failure or str(exc)

    uvloop.run(_gated(count, concurrency, one))
    return lives


class _DataDir:
    """The run's data dir: the given one, or a temporary one removed after."""

    def __init__(self, given: str | None) -> None:
        self.temporary = given is None
        self.root = Path(given or tempfile.mkdtemp(prefix="weir-bench-"))
        self.data = self.root / "data"

    def __enter__(self) -> Path:
        return self.data

    def __exit__(self, *exc: object) -> None:
        if self.temporary:
            shutil.rmtree(self.root, ignore_errors=True)


def run_soak(cfg: EmbeddedConfig) -> Result:
    began = time.monotonic()
    with _DataDir(cfg.data_dir) as data:
        port = _free_port()
        up = Up(data, port)
        try:
            first_ready = up.ready_s
            curve: list[dict[str, Any]] = []

            def checkpoint(**where: Any) -> None:
                elapsed = round(time.monotonic() - began, 1)
                curve.append({"scenario": "soak", **where, "elapsed_s": elapsed, **weigh(up)})
                _emit(curve[-1])

            checkpoint(lives=0, phase="idle")
            make_sessions(port, cfg.sessions, cfg.concurrency)
            checkpoint(lives=0, phase="sessions made")
            lives, cycling = Lives(), time.monotonic()
            deadline = began + cfg.max_seconds
            while lives.ran < cfg.cycles and time.monotonic() < deadline:
                step = min(cfg.sample, cfg.cycles - lives.ran)
                lives.add(_cycles(port, lives.ran, step, cfg.sessions, cfg.concurrency, deadline))
                rate = round(lives.ran / (time.monotonic() - cycling), 1)
                checkpoint(lives=lives.ran, lives_per_s=rate, failed=lives.failed)
                if lives.failed > MAX_FAILED_SHARE * lives.ran:
                    break
            up.stop()
            up = Up(data, port)
            after = weigh(up)
            kept = resumed(port, cfg.sessions) if cfg.sessions else 0
        finally:
            up.stop()
    extra = {
        "cycles": lives.ran, "sessions": cfg.sessions, "stopped_early": lives.ran < cfg.cycles,
        "failed_lives": lives.failed, "first_failure": lives.first_failure,
        "first_start_to_ready_s": round(first_ready, 2),
        "restart_to_ready_s": round(up.ready_s, 2), "restart_cpu_s": round(up.ready_cpu_s, 2),
        "after_restart": after,
        "sessions_lost_while_running": lives.lost,
        "sessions_kept_of_sample": [kept, min(cfg.sessions, RESUMED_SAMPLE)],
        "curve": curve,
    }  # fmt: skip
    return _result("soak", up, time.monotonic() - began, extra)


def run_restart(cfg: EmbeddedConfig) -> Result:
    began = time.monotonic()
    with _DataDir(cfg.data_dir) as data:
        port = _free_port()
        up = Up(data, port)
        try:
            first_ready, first_cpu = up.ready_s, up.ready_cpu_s
            made = time.monotonic()
            make_sessions(port, cfg.sessions, cfg.concurrency)
            made_s = time.monotonic() - made
            before = weigh(up)
            up.stop()
            up = Up(data, port)
            after = weigh(up)
            kept = resumed(port, cfg.sessions)
        finally:
            up.stop()
    if kept < min(cfg.sessions, RESUMED_SAMPLE):
        raise BenchError(f"after the restart only {kept} of a sample of sessions were kept")
    extra = {
        "sessions": cfg.sessions, "sessions_per_s": round(cfg.sessions / made_s, 1),
        "empty_start_to_ready_s": round(first_ready, 2),
        "start_to_ready_s": round(up.ready_s, 2), "start_cpu_s": round(up.ready_cpu_s, 2),
        "empty_start_cpu_s": round(first_cpu, 2), "before_stop": before, "after_start": after,
    }  # fmt: skip
    return _result("restart", up, time.monotonic() - began, extra)


def run_footprint(cfg: EmbeddedConfig) -> Result:
    began = time.monotonic()
    with _DataDir(cfg.data_dir) as data:
        up = Up(data, _free_port())
        try:
            time.sleep(cfg.duration)  # at rest: what the idle broker holds, not its start
            idle = weigh(up)
        finally:
            up.stop()
    extra = {"start_to_ready_s": round(up.ready_s, 2), "start_cpu_s": round(up.ready_cpu_s, 2),
             "rested_s": cfg.duration, **idle}
    return _result("footprint", up, time.monotonic() - began, extra)


RUNNERS: dict[str, Callable[[EmbeddedConfig], Result]] = {
    "soak": run_soak, "restart": run_restart, "footprint": run_footprint,
}  # fmt: skip
