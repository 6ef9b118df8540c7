"""Persistent QoS 1 pairs on one Redis vs a 3-primary Redis Cluster, with and
without `--redis-wait 1`, in one run.

    python -m bench.rediscompare [--rounds 3] [--messages 100000] [--setups ...]

Theory of operation. Every setup gets its own backends and one `weir up`
node, all started first and kept up for the whole run (they share one
embedded Kafka); then `weir bench pairs --persistent --qos 1` runs against
each node in turn, `--rounds` times, so a slow minute of the machine hits
every setup alike. Setups:

- `one`: one redis-server (the embedded default's AOF profile);
- `one-wait1`: the same with a replica (`replicaof`) and `--redis-wait 1`;
- `cluster`: a local Redis Cluster, 3 primaries and 3 replicas
  (services/embedded/redis_cluster.py), `redis+cluster://`;
- `cluster-wait1`: another such cluster with `--redis-wait 1`.

Each bench result line is printed as it comes with `setup` and `round`
added; the last line gives per setup the median msg/s and its ratio to
`one`. One Redis's lines also carry Redis commands per message (the bench's
`--redis-url`; a cluster's are spread over 3 primaries and not counted).
A quiet machine only: the figures are CPU-bound.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from services.embedded.kafka import EmbeddedKafka
from services.embedded.redis_cluster import LocalRedisCluster
from services.embedded.redis_server import RedisServer
from services.ports import free_port

SETUPS = ("one", "one-wait1", "cluster", "cluster-wait1")
READY_TIMEOUT_S = 60.0
DEFAULT_MESSAGES = 100_000
DEFAULT_ROUNDS = 3


def _log(text: str) -> None:
    print(f"rediscompare: {text}", file=sys.stderr, flush=True)


class Setup:
    def __init__(self, name: str, data: Path, kafka: str, weir: str) -> None:
        self.name = name
        self.services: list[Any] = []
        self.count_url: str | None = None  # the bench's --redis-url (one Redis only)
        if name.startswith("cluster"):
            cluster = LocalRedisCluster(data / name).start()
            self.services.append(cluster)
            url = cluster.url
        else:
            primary = RedisServer(data / name / "primary").start()
            self.services.append(primary)
            url = self.count_url = primary.url
            if name.endswith("wait1"):
                line = f"replicaof 127.0.0.1 {primary.port}"
                self.services.append(RedisServer(data / name / "replica", extra=(line,)).start())
        self.port = free_port()
        args = [weir, "up", "--host", "127.0.0.1", "--mqtt-port", str(self.port),
                "--ws-port", "off", "--http-port", "0", "--node-id", name, "--data-dir",
                str(data / name / "node"), "--redis", url, "--kafka", kafka]  # fmt: skip
        if name.endswith("wait1"):
            args += ["--redis-wait", "1"]
        self.log = data / f"{name}.log"
        with self.log.open("wb") as out:
            self.node = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if self.node.poll() is not None:
                raise SystemExit(f"rediscompare: {self.name}: {self.log.read_text()[-400:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"rediscompare: {self.name} not ready") from None
                time.sleep(0.2)

    def stop(self) -> None:
        if self.node.poll() is None:
            self.node.terminate()
            try:
                self.node.wait(30)
            except subprocess.TimeoutExpired:
                self.node.kill()
        for service in reversed(self.services):
            service.stop()


def _bench(weir: str, setup: Setup, messages: int) -> dict[str, Any]:
    args = [weir, "bench", "pairs", "--persistent", "--qos", "1", "--port", str(setup.port),
            "--messages", str(messages)]  # fmt: skip
    if setup.count_url:
        args += ["--redis-url", setup.count_url]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"rediscompare: {setup.name}: weir bench: {done.stderr.strip()[-400:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main(argv: list[str] | None = None) -> None:
    doc = (__doc__ or "").split("\n")[0]
    parser = argparse.ArgumentParser(prog="python -m bench.rediscompare", description=doc)
    parser.add_argument("--weir", default=str(Path(sys.executable).parent / "weir"))
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--messages", type=int, default=DEFAULT_MESSAGES)
    parser.add_argument("--setups", default=",".join(SETUPS),
                        help=f"comma-separated, of {', '.join(SETUPS)}")  # fmt: skip
    args = parser.parse_args(argv)
    names = [n for n in args.setups.split(",") if n]
    if not names or any(n not in SETUPS for n in names):
        parser.error(f"--setups: of {', '.join(SETUPS)}")
    if args.rounds < 1 or args.messages < 1:
        parser.error("--rounds and --messages must be positive")
    data = Path(tempfile.mkdtemp(prefix="weir-rediscompare-"))
    kafka = EmbeddedKafka().start()
    setups: list[Setup] = []
    rates: dict[str, list[float]] = {n: [] for n in names}
    try:
        for name in names:
            _log(f"starting {name}")
            setups.append(Setup(name, data, kafka.bootstrap, args.weir))
        for setup in setups:
            setup.wait_ready()
        for round_ in range(1, args.rounds + 1):
            for setup in setups:
                result = _bench(args.weir, setup, args.messages)
                result.update(setup=setup.name, round=round_)
                rates[setup.name].append(float(result.get("msg_per_s", 0)))
                print(json.dumps(result), flush=True)
    finally:
        for setup in setups:
            setup.stop()
        kafka.stop()
    medians = {n: statistics.median(r) for n, r in rates.items() if r}
    base = medians.get("one")
    summary = {n: {"median_msg_per_s": round(m), "vs_one": round(m / base, 3) if base else None}
               for n, m in medians.items()}  # fmt: skip
    print(json.dumps({"scenario": "rediscompare", "messages": args.messages,
                      "rounds": args.rounds, "setups": summary}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
