"""A long run of the embedded default, weighed as it goes (issue 19).

Theory of operation. Starts the real `weir up` (the embedded default: its own
redis-server and Tansu) on a data dir, weighs it idle, then runs `cycles`
client lives over raw MQTT 3.1.1 sockets, `concurrency` at a time: each is a
new client id that connects (clean), subscribes to its own filter and
disconnects, and every `persistent_every`-th one is also one of `persistent`
fixed persistent sessions that reconnects, subscribes to one of a few
filters and goes offline again. Every `sample` lives it prints the resident
memory of every embedded process (weir up, redis-server, Tansu: /proc), the
data dir's size on disk and the state store's entries. At the end it stops
`weir up` (SIGINT), starts it again on the same data dir and prints the
start-to-ready time and the idle memory after the restart.

    python -m bench.soak --cycles 20000 --persistent 200 --data-dir /tmp/soak

What it shows: where memory and disk grow with the run (per client life)
and where they stop growing (the view's and the store's bound on ended
clients, ClusterView rule 4, is 100,000: reach it with --cycles above that).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

READY_S = 120.0
STOP_S = 60.0
PAGE = os.sysconf("SC_PAGE_SIZE")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _string(text: str) -> bytes:
    raw = text.encode()
    return len(raw).to_bytes(2, "big") + raw


def connect_packet(client_id: str, clean: bool) -> bytes:
    body = _string("MQTT") + bytes([4, 0x02 if clean else 0x00]) + (60).to_bytes(2, "big")
    body += _string(client_id)
    return b"\x10" + _varint(len(body)) + body


def subscribe_packet(filter_: str, qos: int = 1) -> bytes:
    body = (1).to_bytes(2, "big") + _string(filter_) + bytes([qos])
    return b"\x82" + _varint(len(body)) + body


DISCONNECT = b"\xe0\x00"


async def _packet(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    first = (await reader.readexactly(1))[0]
    length, shift = 0, 0
    while True:
        byte = (await reader.readexactly(1))[0]
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return first >> 4, await reader.readexactly(length)


async def life(port: int, client_id: str, clean: bool, filter_: str) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(connect_packet(client_id, clean))
        kind, body = await _packet(reader)
        if kind != 2 or body[1] != 0:
            raise RuntimeError(f"{client_id}: CONNACK {body.hex()}")
        writer.write(subscribe_packet(filter_))
        while True:  # a persistent session may get queued messages first
            kind, body = await _packet(reader)
            if kind == 9:
                break
        writer.write(DISCONNECT)
        await writer.drain()
    finally:
        writer.close()
        await writer.wait_closed()


def rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE // 1024
    except OSError:
        return 0


def children(pid: int) -> dict[str, int]:
    """name -> pid of the processes `pid` started (redis-server, tansu)."""
    out: dict[str, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out["tansu" if "tansu" in name or "broker" in name else name] = int(entry)
    return out


def disk_kib(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total // 1024


class Up:
    def __init__(self, data: Path, port: int) -> None:
        data.parent.mkdir(parents=True, exist_ok=True)
        self.out = data.parent / f"{data.name}-up.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("WEIR_")}
        args = ["--mqtt-port", str(port), "--ws-port", "off", "--data-dir", str(data)]
        started = time.monotonic()
        with self.out.open("ab") as out:
            self.offset = out.tell()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "services", "up", "--node-id", "soak", *args],
                stdout=out, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        while "weir: node soak ready" not in self.text():
            if self.proc.poll() is not None or time.monotonic() - started > READY_S:
                raise SystemExit(f"weir up did not start: {self.text()[-500:]}")
            time.sleep(0.05)
        self.ready_s = time.monotonic() - started
        found = re.search(r"redis (redis://\S+),", self.text())
        assert found
        self.redis_url = found[1]

    def text(self) -> str:
        with self.out.open("rb") as f:
            f.seek(self.offset)
            return f.read().decode(errors="replace")

    def memory(self) -> dict[str, int]:
        out = {"weir up": rss_kib(self.proc.pid)}
        for name, pid in children(self.proc.pid).items():
            out[name] = rss_kib(pid)
        return out

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(STOP_S)


def store_entries(redis_url: str) -> tuple[int, int, int]:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        tag = "{weir.state}:"
        used = int(client.info("memory")["used_memory"]) // 1024
        return client.hlen(tag + "sessions"), client.hlen(tag + "subs"), used
    finally:
        client.close()


def line(label: str, up: Up, data: Path) -> str:
    mem = up.memory()
    sessions, subs, used = store_entries(up.redis_url)
    procs = ", ".join(f"{name} {kib / 1024:.1f}" for name, kib in sorted(mem.items()))
    return (
        f"{label:>14}: RSS MiB {procs} (sum {sum(mem.values()) / 1024:.1f}); "
        f"disk {disk_kib(data) / 1024:.1f} MiB; store sessions {sessions}, subs {subs}, "
        f"redis used {used / 1024:.1f} MiB"
    )


async def run_cycles(port: int, start: int, count: int, persistent: int, every: int,
                     concurrency: int) -> None:  # fmt: skip
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            await life(port, f"soak-n-{i}", True, f"soak/n/{i}")
            if persistent and i % every == 0:
                j = (i // every) % persistent
                await life(port, f"soak-p-{j}", False, f"soak/p/{j}/{i % 3}")

    await asyncio.gather(*(one(i) for i in range(start, start + count)))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    p.add_argument("--cycles", type=int, default=20_000, help="client lives (new client ids)")
    p.add_argument("--persistent", type=int, default=200, help="fixed persistent sessions")
    p.add_argument("--persistent-every", type=int, default=10, help="a persistent life per N")
    p.add_argument("--sample", type=int, default=5_000, help="weigh every N lives")
    p.add_argument("--concurrency", type=int, default=20)
    p.add_argument("--port", type=int, default=0, help="MQTT port (0: a free one)")
    p.add_argument("--data-dir", help="default: a new temporary directory, removed after")
    args = p.parse_args(argv)
    if args.cycles < 1 or args.sample < 1 or args.concurrency < 1 or args.persistent_every < 1:
        p.error("--cycles, --sample, --concurrency and --persistent-every must be positive")
    temp = args.data_dir is None
    data = Path(args.data_dir or tempfile.mkdtemp(prefix="weir-soak-")) / "data"
    port = args.port
    if port == 0:
        from services.embedded.redis_server import free_port

        port = free_port()
    up = Up(data, port)
    try:
        print(f"start-to-ready {up.ready_s:.2f} s", flush=True)
        print(line("idle", up, data), flush=True)
        began = time.monotonic()
        done = 0
        while done < args.cycles:
            step = min(args.sample, args.cycles - done)
            asyncio.run(run_cycles(port, done, step, args.persistent, args.persistent_every,
                                   args.concurrency))  # fmt: skip
            done += step
            rate = done / (time.monotonic() - began)
            print(line(f"{done} lives", up, data) + f"; {rate:.0f} lives/s", flush=True)
        up.stop()
        up = Up(data, port)
        print(f"restart: start-to-ready {up.ready_s:.2f} s", flush=True)
        print(line("idle, restarted", up, data), flush=True)
    finally:
        up.stop()
        if temp:
            shutil.rmtree(data.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
