"""MQTT.js 5 bursts of QoS 1 against Weir's embedded default and a stock Mosquitto.

    .venv/bin/python -m bench.mqttjs_burst [--count 10000] [--burst 1000]

Starts `weir up --mqtt-port P --ws-port off --data-dir TMP` (Redis and the
embedded Kafka, as a user runs it), runs bench/mqttjs_burst.mjs against it,
stops it; then the same against `/usr/sbin/mosquitto -p P2` with its default
configuration (which drops QoS 1 messages for a subscriber more than 1,000
behind: max_queued_messages). Prints one line per broker and the ratio;
exits 1 unless Weir delivered everything with no failed PUBACK and no
disconnect. Issue 24: Weir
disconnected this client with 0x93 past the Receive Maximum (1.1 s for 200
messages, against 12 ms for Mosquitto). Needs scripts/setup.sh (MQTT.js in
tests/interop/js) and loopback only.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.mosquitto import MOSQUITTO, _accepting
from services.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).with_suffix(".mjs")
START_S = 60.0  # weir up starts redis-server and the embedded Kafka first


@contextmanager
def _running(args: list[str], port: int) -> Iterator[None]:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + START_S
        while not _accepting(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise SystemExit(f"{args[0]} did not start on {port}: {err.strip()[-400:]}")
            time.sleep(0.05)
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _run(port: int, count: int, burst: int) -> dict[str, Any]:
    out = subprocess.run(
        ["node", str(SCRIPT), f"mqtt://127.0.0.1:{port}", str(count), str(burst)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if out.returncode:
        raise SystemExit(f"mqttjs_burst.mjs failed: {out.stderr.strip()[-400:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--burst", type=int, default=1_000)
    args = parser.parse_args(argv)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="weir-mqttjs-") as data:
        port = free_port()
        weir = [str(ROOT / ".venv/bin/weir"), "up", "--mqtt-port", str(port)]
        with _running([*weir, "--ws-port", "off", "--http-port", "0", "--data-dir", data], port):
            results["weir"] = _run(port, args.count, args.burst)
    port = free_port()
    with _running([MOSQUITTO, "-p", str(port)], port):
        results["mosquitto"] = _run(port, args.count, args.burst)
    for name, r in results.items():
        print(
            f"{name:<10} {r['seconds']:7.3f} s  received {r['received']}/{args.count}  "
            f"failed {r['failed']}  disconnects {r['disconnects']}  reconnects {r['reconnects']}"
        )
    ratio = results["weir"]["seconds"] / results["mosquitto"]["seconds"]
    print(f"weir / mosquitto: {ratio:.2f}x")
    ours = results["weir"]
    ok = ours["received"] == args.count and not ours["failed"] and not ours["disconnects"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
