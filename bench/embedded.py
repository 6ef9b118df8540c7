"""The embedded default under test: a `weir up` we start, its processes weighed.

`Up` runs the real `weir up` (no --redis / --kafka: its own redis-server and
Tansu) on a data dir and a free port and times its start to the ready line;
`weigh` reads the resident memory of every process of it (weir up, and the
redis-server and Tansu it started: /proc), the data dir's size on disk and
the state store's entries. `life` is one client's life over a raw MQTT
3.1.1 socket: CONNECT, SUBSCRIBE, DISCONNECT (the scenarios of bench.soak
run many at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.errors import BenchError

READY_S = 600.0
"""The longest a start may take: a start with 100,000 sessions re-seeds them all."""
STOP_S = 120.0
PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 1024 * 1024
NODE_ID = "bench"
READY_LINE = f"weir: node {NODE_ID} ready"


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
CONNACK, SUBACK = 2, 9


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


async def life(port: int, client_id: str, clean: bool, filter_: str) -> bool:
    """Connect, subscribe to `filter_`, disconnect; whether the broker had a
    session for `client_id` (CONNACK's session present)."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        raise BenchError(f"{client_id}: cannot connect to port {port}: {exc}") from None
    try:
        writer.write(connect_packet(client_id, clean))
        kind, body = await _packet(reader)
        if kind != CONNACK or body[1] != 0:
            raise BenchError(f"{client_id}: refused, CONNACK {body.hex()}")
        writer.write(subscribe_packet(filter_))
        while kind != SUBACK:  # a persistent session may get queued messages first
            kind, _ = await _packet(reader)
        writer.write(DISCONNECT)
        await writer.drain()
        return bool(body[0] & 1)
    except (OSError, asyncio.IncompleteReadError) as exc:
        raise BenchError(f"{client_id}: the broker closed the connection: {exc!r}") from None
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds `pid` has used (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


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
    """`weir up`, the embedded default, on `data` and `port`; output appended
    to `<data>-up.log` beside the data dir."""

    def __init__(self, data: Path, port: int) -> None:
        data.parent.mkdir(parents=True, exist_ok=True)
        self.data = data
        self.port = port
        self.out = data.parent / f"{data.name}-up.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("WEIR_")}
        # --http-port 0: never 18083, which a node of another run may hold
        args = ["--mqtt-port", str(port), "--ws-port", "off", "--http-port", "0"]
        args += ["--data-dir", str(data)]
        started = time.monotonic()
        with self.out.open("ab") as out:
            self.offset = out.tell()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "services", "up", "--node-id", NODE_ID, *args],
                stdout=out, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        while READY_LINE not in self.text():
            if self.proc.poll() is not None or time.monotonic() - started > READY_S:
                self.stop()
                raise BenchError(f"weir up did not start: {self.text()[-300:].strip()}")
            time.sleep(0.05)
        self.ready_s = time.monotonic() - started
        # CPU to ready of every process of it: on a shared machine the wall
        # time says how busy the others were, this what the start itself costs.
        self.ready_cpu_s = sum(self.cpu_s().values())
        found = re.search(r"redis (redis://\S+),", self.text())
        if found is None:
            raise BenchError(f"weir up named no Redis: {self.text()[-300:].strip()}")
        self.redis_url = found[1]

    def text(self) -> str:
        with self.out.open("rb") as f:
            f.seek(self.offset)
            return f.read().decode(errors="replace")

    def memory_kib(self) -> dict[str, int]:
        out = {"weir up": rss_kib(self.proc.pid)}
        for name, pid in children(self.proc.pid).items():
            out[name] = rss_kib(pid)
        return out

    def cpu_s(self) -> dict[str, float]:
        out = {"weir up": cpu_s(self.proc.pid)}
        for name, pid in children(self.proc.pid).items():
            out[name] = cpu_s(pid)
        return out

    def stop(self) -> None:
        """SIGINT, as Ctrl-C: the node stops, then its Kafka and redis-server."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def store_entries(redis_url: str) -> tuple[int, int, int]:
    """The state store's sessions and subscribed clients, and Redis's used memory (KiB)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        tag = "{weir.state}:"
        used = int(client.info("memory")["used_memory"]) // 1024
        return int(client.hlen(tag + "sessions")), int(client.hlen(tag + "subs")), used
    finally:
        client.close()


def weigh(up: Up) -> dict[str, Any]:
    """Every process's RSS (MiB), their sum, the data dir's size and the store's entries."""
    memory = up.memory_kib()
    sessions, subs, used = store_entries(up.redis_url)
    return {
        "rss_mib": {name: round(kib / 1024, 1) for name, kib in sorted(memory.items())},
        "rss_sum_mib": round(sum(memory.values()) / 1024, 1),
        "disk_mib": round(disk_kib(up.data) / 1024, 1),
        "store_sessions": sessions,
        "store_subscribed_clients": subs,
        "redis_used_mib": round(used / 1024, 1),
    }
