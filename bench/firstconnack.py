"""Time to the first CONNACK after a start, against the ones after it.

    python -m bench.firstconnack [--runs 5] [--persistent]

Each run starts a fresh `weir up` (the embedded default: its own
redis-server and Kafka, in a temporary data directory) on a free port,
connects one MQTT 3.1.1 client the moment the "ready" line appears, then a
second client once the first has its CONNACK, and prints how long each
waited from its CONNECT to its CONNACK (ms). The first one pays for
whatever the node left cold at start (the event log's producer and its
connections, the Redis pool); the second one shows the warm figure.
`--persistent` connects with clean session 0 (the session goes to Redis).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import wire

READY = re.compile(r"ready, mqtt on [^ ]+:(\d+)")
START_TIMEOUT_S = 60.0  # a cold start on the shared 2-core box takes 5-15 s


def start_node(data_dir: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEIR_")}
    return subprocess.Popen(
        [sys.executable, "-m", "services", "up", "--host", "127.0.0.1", "--mqtt-port", "0",
         "--ws-port", "off", "--http-port", "0", "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip


def wait_ready(node: subprocess.Popen[str]) -> int:
    """The MQTT port from the ready line; the rest of the output is drained."""
    assert node.stdout is not None
    for line in node.stdout:
        found = READY.search(line)
        if found:
            threading.Thread(target=node.stdout.read, daemon=True).start()
            return int(found.group(1))
    node.wait()
    raise RuntimeError(f"weir up exited {node.returncode} before it was ready")


async def connack_ms(port: int, client_id: str, persistent: bool) -> float:
    """Milliseconds from sending CONNECT to reading CONNACK (return code 0 asserted)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        parser = wire.FrameParser()
        began = time.perf_counter()
        writer.write(wire.connect(client_id, clean=not persistent))
        while not (frames := parser.feed(await reader.read(65536))):
            pass
        took = (time.perf_counter() - began) * 1000
        first, body = frames[0]
        if first >> 4 != 2 or body[1] != 0:
            raise RuntimeError(f"expected CONNACK 0, got {first:#x} {body!r}")
        writer.write(wire.DISCONNECT_PACKET)
        await writer.drain()
        return took
    finally:
        writer.close()


def one_run(persistent: bool) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="weir-bench-connack-") as tmp:
        node = start_node(Path(tmp))
        try:
            port = wait_ready(node)

            async def both() -> tuple[float, float]:
                first = await connack_ms(port, "first", persistent)
                return first, await connack_ms(port, "second", persistent)

            return asyncio.run(both())
        finally:
            node.send_signal(signal.SIGTERM)
            try:
                node.wait(timeout=30)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--persistent", action="store_true", help="clean session 0")
    args = parser.parse_args()
    firsts: list[float] = []
    seconds: list[float] = []
    for i in range(args.runs):
        first, second = one_run(args.persistent)
        firsts.append(first)
        seconds.append(second)
        print(f"run {i + 1}: first CONNACK {first:7.1f} ms, second {second:6.1f} ms", flush=True)
    print(
        f"median of {args.runs}: first {statistics.median(firsts):.1f} ms, "
        f"second {statistics.median(seconds):.1f} ms",
        flush=True,
    )


if __name__ == "__main__":
    main()
