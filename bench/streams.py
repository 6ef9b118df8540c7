"""Spark benchmarks: the state-store job's fold rate, lag and memory; node start from it.

    python -m bench.streams [--events 1000000] [--clients 100000] [--lag-s 60]

One run, on an embedded Tansu broker and a redis-server started here:
1. produce the replay benchmark's fleet workload (bench.replay: per client a
   SessionOpened, its Subscribed events, a SessionClosed keeping the session);
2. start a `weir up` node on it with an empty state store: time to ready by
   full replay (after an untimed start on an empty log that leaves the
   node's bytecode compiled for all the starts: `warm_up`);
3. fold the log with `python -m streams run state --available-now`: events
   per second over the fold (from the job's "folding" line to its "up to
   date" line, so the JVM's start is reported apart), and the peak memory
   of the job's whole process tree (driver, JVM, Python workers);
4. produce a tail (1% more clients' events), start another node: time to
   ready from the state store plus the tail (every node start waits until
   Redis runs no AOF rewrite, which the fold's writes may have set off);
   with `--starts N` (N > 1), then N more rounds of the two starts on the
   same log and store (the full replay with the store's keys renamed away),
   alternating, and the medians and their ratio (the fold runs once);
5. lag: the job running with a 1 s trigger while a producer writes
   `--lag-rate` events/s, 10 s of warm-up then `--lag-s` seconds measured,
   each 100 ms a probe (a retained event); the lag of a probe is from its produce to its
   appearance in the state store (polled every 20 ms): p50, p99, max.
Prints one JSON line, then a summary on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import redis
from confluent_kafka import Producer

from bench.replay import (
    _give_redis_session,
    client_name,
    fleet_events,
    make_topics,
    produce,
    start_node,
)
from services.embedded.kafka import EmbeddedKafka
from services.embedded.redis_server import RedisServer
from services.event.schema import Event, RetainedSet, Subscribed, encode
from services.ports import free_port
from services.state.keys import state_keys

JOB_TIMEOUT_S = 1800.0
NODE_READY_TIMEOUT_S = 600.0
RSS_SAMPLE_S = 0.25
PROBE_EVERY_S = 0.1
PROBE_TIMEOUT_S = 60.0
WARMUP_S = 10.0  # seconds of load before probes count
WATCH_S = 0.02  # how often the store is polled for probes: the lag's resolution
REDIS_SETTLE_S = 60.0  # longest wait for Redis's background AOF rewrite before a node start
FOLDED = re.compile(r"read and folded in ([\d.]+) s")
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def tree_rss_mib(session: int) -> float:
    """Resident memory of every process in session `session`, MiB: the job
    starts one (start_new_session), and its JVM and Python workers stay in it."""
    total = 0
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == session:
                total += proc.memory_info().rss
        except (OSError, psutil.Error):  # gone since the listing, or not ours to inspect
            continue
    return total / 2**20


def job(
    bootstrap: str, url: str, prefix: str, data: Path, *extra: str
) -> tuple[subprocess.Popen[bytes], Path]:
    log = data / f"job-{uuid.uuid4().hex[:6]}.log"
    args = ["--kafka", bootstrap, "--redis", url, "--kafka-topic-prefix", prefix]
    args += ["--data-dir", str(data), *extra]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streams", "run", "state", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, log


def stamp_of(log: Path, needle: str) -> float:
    import datetime

    for line in log.read_text(errors="replace").splitlines():
        if needle in line and (found := STAMP.match(line)):
            when = datetime.datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S,%f")
            return when.timestamp()
    raise RuntimeError(f"no {needle!r} line in {log}")


def fold(bootstrap: str, url: str, prefix: str, data: Path, records: int) -> dict[str, Any]:
    started = time.monotonic()
    proc, log = job(bootstrap, url, prefix, data, "--available-now")
    peak = 0.0
    while proc.poll() is None:
        peak = max(peak, tree_rss_mib(proc.pid))
        if time.monotonic() - started > JOB_TIMEOUT_S:
            os.killpg(proc.pid, signal.SIGKILL)
            raise RuntimeError("fold job timed out")
        time.sleep(RSS_SAMPLE_S)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"fold job exit {proc.returncode}: {log.read_text()[-3000:]}")
    fold_s = stamp_of(log, "the state store is up to date") - stamp_of(log, "folding what")
    return {
        "fold_records": records,
        "fold_s": round(fold_s, 2),
        "fold_events_per_s": round(records / fold_s),
        "job_wall_s": round(wall, 2),
        "job_peak_mib": round(peak),
    }


def warm_up(url: str, bootstrap: str, data: Path) -> None:
    """One untimed node start on an empty log, with bytecode kept (in `data`)
    for every process started from here on. Where PYTHONDONTWRITEBYTECODE is
    set and nothing was compiled before (as here), each node start compiled
    Weir and redis-py again, about 0.25 s of every start, the same for both
    and part of neither: a deployed node has its bytecode."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(data / "pycache")
    prefix = f"warmup{uuid.uuid4().hex[:8]}."
    make_topics(bootstrap, prefix, 8)
    node_ready(url, bootstrap, prefix, data / "warmup")


def redis_settled(url: str) -> None:
    """Wait (bounded) until Redis runs no AOF rewrite: after the fold's writes
    it may fork one, a core's worth of work for seconds, which a node start
    timed meanwhile would pay (the full replay, timed before the fold, does not)."""
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + REDIS_SETTLE_S
    try:
        while time.monotonic() < deadline:
            info = client.info("persistence")
            if not (info.get("aof_rewrite_in_progress") or info.get("aof_rewrite_scheduled")):
                return
            time.sleep(0.1)
    finally:
        client.close()


def node_ready(url: str, bootstrap: str, prefix: str, data: Path) -> tuple[float, str]:
    """Seconds from process start to the ready line, and the node's start log."""
    redis_settled(url)
    proc, ready_s, err = start_node(url, bootstrap, prefix, free_port(), data)
    try:
        return ready_s, "".join(err).strip()
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def rounds(url: str, bootstrap: str, prefix: str, data: Path, n: int) -> dict[str, Any]:
    """n rounds of (full replay, state store + tail) node starts on one log and store:
    for the replay, the store's keys are renamed away (and back after)."""
    store = redis.Redis.from_url(url)
    keys = list(state_keys(prefix).values())
    replay: list[float] = []
    from_store: list[float] = []
    for i in range(n):
        for key in keys:
            if store.exists(key):
                store.rename(key, key + ":away")
        try:
            replay.append(node_ready(url, bootstrap, prefix, data / f"r{i}")[0])
        finally:
            for key in keys:
                if store.exists(key + ":away"):
                    store.rename(key + ":away", key)
        from_store.append(node_ready(url, bootstrap, prefix, data / f"s{i}")[0])
    store.close()
    median_replay, median_store = statistics.median(replay), statistics.median(from_store)
    return {
        "rounds": n,
        "rounds_full_replay_s": [round(t, 2) for t in replay],
        "rounds_from_store_s": [round(t, 2) for t in from_store],
        "rounds_median_full_replay_s": round(median_replay, 2),
        "rounds_median_from_store_s": round(median_store, 2),
        "rounds_median_speedup": round(median_replay / median_store, 2),
    }


def tail_events(clients: int, first: int) -> Iterator[Event]:
    ts = int(time.time() * 1000)
    for c in range(first, first + clients):
        for i in range(10):
            yield Subscribed(
                client_id=client_name(c), version=2 + i, node="bench", ts_ms=ts,
                filter=f"tail/{c}/{i}", qos=1,
            )  # fmt: skip


def lag(bootstrap: str, url: str, data: Path, seconds: float, rate: int) -> dict[str, Any]:
    prefix = f"lag{uuid.uuid4().hex[:8]}."
    make_topics(bootstrap, prefix, 8)
    store = redis.Redis.from_url(url)
    retained = "{" + prefix + "state}:retained"
    producer = Producer(
        {"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "linger.ms": 5}
    )

    def send(event: Event) -> None:
        suffix, key, value = encode(event)
        producer.produce(prefix + suffix, key=key.encode(), value=value)

    (data / "lag").mkdir()
    proc, log = job(bootstrap, url, prefix, data / "lag", "--trigger-s", "1")
    try:
        warm = RetainedSet(topic="lag/warm", version=1, node="b", ts_ms=0, payload=b"w", qos=0)
        send(warm)
        producer.flush(10)
        deadline = time.monotonic() + 300
        while not store.hexists(retained, "lag/warm"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"lag job not folding: {log.read_text()[-3000:]}")
            time.sleep(0.05)
        sent: dict[str, float] = {}
        lags: list[float] = []
        done = threading.Event()

        def watch() -> None:  # one HMGET per 20 ms for every outstanding probe
            while not done.is_set() or sent:
                waiting = list(sent.items())
                if waiting:
                    found = store.hmget(retained, [topic for topic, _ in waiting])
                    now = time.monotonic()
                    for (topic, at), value in zip(waiting, found, strict=True):
                        if value is not None:
                            lags.append(now - at)
                            del sent[topic]
                        elif now - at > PROBE_TIMEOUT_S:
                            raise RuntimeError(f"probe {topic} never reached the store")
                time.sleep(WATCH_S)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        started = time.monotonic()
        n = probes = 0
        per_probe = max(1, int(rate * PROBE_EVERY_S))
        measured = started + WARMUP_S  # the same load before it, unmeasured: the JVM's JIT
        while time.monotonic() - started < WARMUP_S + seconds:
            for _ in range(per_probe):
                n += 1
                c = n % 50_000
                send(
                    Subscribed(
                        client_id=f"lag-{c}", version=n, node="b", ts_ms=0, filter=f"l/{n}", qos=1
                    )
                )
            probes += 1
            topic = f"lag/{probes}"
            send(RetainedSet(topic=topic, version=1, node="b", ts_ms=0, payload=b"p", qos=0))
            producer.flush(5)
            if time.monotonic() >= measured:
                sent[topic] = time.monotonic()
            time.sleep(max(0.0, started + probes * PROBE_EVERY_S - time.monotonic()))
        done.set()
        watcher.join(PROBE_TIMEOUT_S + 5)
        lags.sort()
        if not lags:
            raise RuntimeError("no probe reached the store")
        folds = sorted(float(m[1]) for m in FOLDED.finditer(log.read_text(errors="replace")))
        return {
            "lag_batches": len(folds),
            "lag_batch_fold_p50_s": folds[len(folds) // 2] if folds else None,
            "lag_batch_fold_max_s": folds[-1] if folds else None,
            "lag_warmup_s": WARMUP_S,
            "lag_probes": len(lags),
            "lag_events": n,
            "lag_rate": round(n / (WARMUP_S + seconds)),
            "lag_p50_s": round(lags[len(lags) // 2], 2),
            "lag_p99_s": round(lags[min(len(lags) - 1, int(len(lags) * 0.99))], 2),
            "lag_max_s": round(lags[-1], 2),
        }
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.streams", description=__doc__)
    p.add_argument("--events", type=int, default=1_000_000, help="Subscribed events")
    p.add_argument("--clients", type=int, default=100_000)
    p.add_argument("--lag-s", type=float, default=60.0, help="0: skip the lag run")
    p.add_argument("--lag-rate", type=int, default=2000, help="events/s during the lag run")
    p.add_argument("--lag-only", action="store_true", help="only the lag run")
    p.add_argument(
        "--starts", type=int, default=1, help="N > 1: N more rounds of both node starts (medians)"
    )
    args = p.parse_args(argv)
    result: dict[str, Any] = {"events": args.events, "clients": args.clients}
    with tempfile.TemporaryDirectory(prefix="weir-bench-streams-") as tmp:
        data = Path(tmp)
        server = RedisServer(data / "redis").start()
        kafka = EmbeddedKafka().start()
        try:
            if args.lag_only:
                result.update(lag(kafka.bootstrap, server.url, data, args.lag_s, args.lag_rate))
                print(json.dumps(result), flush=True)
                return 0
            warm_up(server.url, kafka.bootstrap, data)
            result["bytecode"] = "kept: an untimed node start compiled it first"
            prefix = f"bench{uuid.uuid4().hex[:8]}."
            make_topics(kafka.bootstrap, prefix, 8)
            produce_s, records = produce(
                kafka.bootstrap, prefix, fleet_events(args.events, args.clients)
            )
            asyncio.run(_give_redis_session(server.url, client_name(args.clients // 2)))
            result["records"] = records
            result["produce_s"] = round(produce_s, 2)
            ready, said = node_ready(server.url, kafka.bootstrap, prefix, data / "n1")
            result["ready_full_replay_s"] = round(ready, 2)
            result["full_replay_log"] = said
            result.update(fold(kafka.bootstrap, server.url, prefix, data, records))
            tail = max(1, args.clients // 100)
            _, more = produce(kafka.bootstrap, prefix, tail_events(tail, args.clients))
            result["tail_records"] = more
            ready, said = node_ready(server.url, kafka.bootstrap, prefix, data / "n2")
            result["ready_from_store_s"] = round(ready, 2)
            result["from_store_log"] = said
            result["ready_speedup"] = round(
                result["ready_full_replay_s"] / result["ready_from_store_s"], 2
            )
            if args.starts > 1:
                result.update(rounds(server.url, kafka.bootstrap, prefix, data, args.starts))
            if args.lag_s > 0:
                result.update(lag(kafka.bootstrap, server.url, data, args.lag_s, args.lag_rate))
        finally:
            kafka.stop()
            server.stop()
    print(json.dumps(result), flush=True)
    print(
        f"fold: {result['fold_records']:,} events in {result['fold_s']} s = "
        f"{result['fold_events_per_s']:,}/s (job wall {result['job_wall_s']} s, peak "
        f"{result['job_peak_mib']} MiB); ready: full replay {result['ready_full_replay_s']} s, "
        f"state store + tail {result['ready_from_store_s']} s ({result['ready_speedup']}x)"
        + (
            f"; medians of {result['rounds']} rounds: full replay "
            f"{result['rounds_median_full_replay_s']} s, state store + tail "
            f"{result['rounds_median_from_store_s']} s ({result['rounds_median_speedup']}x)"
            if "rounds" in result
            else ""
        )
        + (
            f"; lag at {result['lag_rate']}/s with a 1 s trigger: p50 {result['lag_p50_s']} s, "
            f"p99 {result['lag_p99_s']} s, max {result['lag_max_s']} s"
            if "lag_p50_s" in result
            else ""
        ),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
