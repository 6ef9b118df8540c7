"""A throwaway Mosquitto on a free loopback port, as the peer to compare with.

The config raises the limits that make a default Mosquitto drop messages
under load, so a comparison measures speed, not Mosquitto's default policy:
`MOSQUITTO_CONFIG` below says which and to what.
"""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.errors import BrokerUnavailable
from services.ports import free_port

MOSQUITTO = "/usr/sbin/mosquitto"
START_TIMEOUT_S = 10.0
MOSQUITTO_CONFIG = """\
listener {port} 127.0.0.1
allow_anonymous true
persistence false
max_inflight_messages 1000
max_queued_messages 1000000
max_queued_bytes 0
max_connections -1
set_tcp_nodelay true
log_dest none
"""
"""max_inflight_messages 1000 (default 20), max_queued_messages 1,000,000
(default 1000), max_queued_bytes 0 (no limit), TCP_NODELAY on."""


def _accepting(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@contextmanager
def spawn_mosquitto(executable: str = MOSQUITTO) -> Iterator[tuple[int, int]]:
    """Run Mosquitto for the duration of the block; yields (port, pid)."""
    with tempfile.TemporaryDirectory(prefix="weir-bench-") as tmp:
        port = free_port()
        conf = Path(tmp) / "mosquitto.conf"
        conf.write_text(MOSQUITTO_CONFIG.format(port=port))
        try:
            proc = subprocess.Popen(
                [executable, "-c", str(conf)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        except OSError as exc:
            raise BrokerUnavailable(f"cannot start {executable}: {exc}") from exc
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not _accepting(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                    raise BrokerUnavailable(f"mosquitto did not start on {port}: {err.strip()}")
                time.sleep(0.02)
            yield port, proc.pid
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
