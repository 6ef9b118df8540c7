"""Start and stop a real `redis-server` on a free loopback port.

Used by the test fixtures and by `weir up`. Profiles:

- "default": appendonly yes, appendfsync everysec. A Redis process crash
  loses nothing acknowledged (the AOF is written to the OS on every command);
  a machine crash or power loss can lose about the last second of writes.
- "durable": appendonly yes, appendfsync always. Every write is fsynced
  before Redis answers, so an acknowledged write survives a machine crash,
  at the cost of an fsync per write (much lower throughput on slow disks).

Neither profile protects against losing the data directory itself; that
needs replicas (a real deployment's concern).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from services.embedded.process import child_options
from services.ports import free_port

PROFILES = {
    "default": ("appendonly yes", "appendfsync everysec"),
    "durable": ("appendonly yes", "appendfsync always"),
}
START_TIMEOUT_S = 10.0  # a fresh redis-server is ready in milliseconds; AOF replay may take longer
STOP_TIMEOUT_S = 10.0


class RedisServerError(RuntimeError):
    """redis-server is missing or did not start."""


@dataclass
class RedisServer:
    data_dir: Path
    profile: str = "default"
    port: int = 0  # 0: pick a free port at start (kept across restarts)
    host: str = "127.0.0.1"
    process: subprocess.Popen[bytes] | None = None
    extra: tuple[str, ...] = ()  # more redis.conf lines (a cluster node's: redis_cluster.py)

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def _config(self) -> str:
        lines = [
            f"bind {self.host}",
            f"port {self.port}",
            f"dir {self.data_dir}",
            "save ''",
            "protected-mode yes",
            "daemonize no",
            "logfile redis.log",
            *PROFILES[self.profile],
            *self.extra,
        ]
        return "\n".join(lines) + "\n"

    def start(self) -> RedisServer:
        self.launch()
        self.wait_ready()
        return self

    def launch(self) -> None:
        """Start the process without waiting for it (PR_SET_PDEATHSIG on the
        main thread); `wait_ready` then waits for it to load its data."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisServerError(
                "redis-server not found on PATH: install Redis 7 (apt install redis-server)"
            )
        if self.profile not in PROFILES:
            raise RedisServerError(f"unknown redis profile {self.profile!r}: {sorted(PROFILES)}")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.port == 0:
            self.port = free_port()
        conf = self.data_dir / "redis.conf"
        conf.write_text(self._config())
        self.process = subprocess.Popen(
            [binary, str(conf)],
            cwd=self.data_dir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            **child_options(),  # no redis-server outlives a killed run
        )

    def wait_ready(self) -> None:
        """Until it answers PING; raises, stopped, if it never does. While it
        loads its data it answers -LOADING, and is waited for as long as it
        does (a large AOF on a busy machine can take longer than the bound)."""
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = self.data_dir / "redis.log"
                tail = log.read_text()[-500:] if log.exists() else ""
                raise RedisServerError(
                    f"redis-server exited with {self.process.returncode}: {tail}"
                )
            answer = self._ping()
            if answer.startswith(b"+PONG"):
                return
            if answer.startswith(b"-LOADING"):
                deadline = time.monotonic() + START_TIMEOUT_S
            time.sleep(0.01)
        self.stop()
        raise RedisServerError(f"redis-server not ready on port {self.port} in {START_TIMEOUT_S}s")

    def _ping(self) -> bytes:
        """Its answer to PING (b"" when it does not answer)."""
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64)
        except OSError:
            return b""

    def stop(self) -> None:
        """Terminate (SIGTERM: Redis flushes its AOF) and wait for the process."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)

    def kill(self) -> None:
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.stop()
